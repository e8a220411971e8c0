"""docs/usage.md's layout block names the tree as it is: every top-level package and module of
src/vitpos, and every module inside each package (it had drifted: browse/, validation/, zoo.py,
lists.py and four of study/'s files were missing while it named files that had moved)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "vitpos"


def layout_block() -> list[str]:
    text = (ROOT / "docs" / "usage.md").read_text()
    section = text.split("\n## Layout", 1)[1]
    block = section.split("```", 2)[1]
    lines = block.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == "src/vitpos/")
    out = []
    for ln in lines[start + 1:]:
        if ln and not ln.startswith(" "):
            break  # tests/, benchmarks/: outside src/vitpos
        out.append(ln)
    return out


def entries(lines: list[str]) -> dict[str, str]:
    """Top-level entry (a `name/` folder or `name.py` module) -> the text describing it."""
    found: dict[str, str] = {}
    current: list[str] = []
    for ln in lines:
        head = re.match(r"^  (\S.*?)(?:\s{2,}|$)(.*)$", ln)
        if head and not ln.startswith("   "):
            names = head.group(1).split() + (head.group(2).split() if not head.group(1).endswith("/") else [])
            tops = [n for n in names if re.fullmatch(r"[a-z_]+(/|\.py)", n)]
            current = tops
            for n in tops:
                found[n] = ""
            rest = ln
        else:
            rest = ln
        for n in current:
            found[n] += " " + rest
    return found


def actual() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in sorted(SRC.iterdir()):
        if p.name.startswith(("_", ".")):
            continue
        if p.is_dir() and any(p.glob("*.py")):
            out[p.name + "/"] = sorted(q.stem if q.is_file() else q.name for q in p.iterdir()
                                       if (q.suffix == ".py" and not q.name.startswith("_"))
                                       or (q.is_dir() and any(q.glob("*.py"))))
        elif p.suffix == ".py":
            out[p.name] = []
    return out


def test_layout_names_every_package_and_module():
    doc = entries(layout_block())
    tree = actual()
    assert set(doc) == set(tree), (f"layout names {sorted(set(doc) - set(tree))} that do not exist and lacks "
                                   f"{sorted(set(tree) - set(doc))}")
    missing = {top: [m for m in mods if not re.search(rf"\b{re.escape(m)}\b", doc[top])] for top, mods in tree.items()}
    missing = {k: v for k, v in missing.items() if v}
    assert not missing, f"docs/usage.md's layout lacks these modules: {missing}"


def test_parser_sees_a_real_layout():
    doc = entries(layout_block())
    assert {"models/", "experiments/", "cli.py"} <= set(doc)  # a parser that found nothing would pass vacuously
    assert "surface" in doc["models/"]


def test_readme_first_screen_is_a_guide():
    """The README's first 60 lines hold both set-up commands, the library example and the claims table,
    and no commit hash or load average sits above its results section (issue 45)."""
    text = (ROOT / "README.md").read_text()
    head = "\n".join(text.splitlines()[:60])
    for needed in (".venv/bin/vitpos run --out vitpos-out", ".venv/bin/python -m pytest -q",
                   "from vitpos.hooks import capture", "| C1 ", "| C5 "):
        assert needed in head, f"README's first 60 lines lack {needed!r}"
    above = text.split("## Results in five lines", 1)[0]
    assert not re.search(r"\b[0-9a-f]{7}\b", above) and "load average" not in above.lower()
