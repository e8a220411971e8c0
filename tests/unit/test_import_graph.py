"""The package's import graph, read from the source: no cycle and no import against the layering.

Every `import` and `from ... import` counts, wherever it stands: at module level, inside a function
(a deferred import) or under `if TYPE_CHECKING:`; a deferred import hides a cycle from Python, not
from this test. Relative imports are resolved; `from pkg import name` is an edge to `pkg.name` when
that is a module, else to `pkg`.

Layers, bottom up: models, hooks, rope, data, analysis, sae (the bottom layer); results (typed
experiment results and their pure readers); plots (figures of results); experiments (each measures
one result; what several share lives in base / common); claims and study above them; validation
and report on top. `FORBIDDEN` lists the directions that must not occur.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "src"

# source package -> packages it must not import (directly, at any depth of the source file)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "vitpos.models": ("vitpos.experiments", "vitpos.study", "vitpos.claims", "vitpos.validation", "vitpos.report",
                      "vitpos.plots"),
    "vitpos.plots": ("vitpos.experiments", "vitpos.study", "vitpos.claims", "vitpos.validation", "vitpos.report"),
    "vitpos.results": ("vitpos.experiments", "vitpos.plots", "vitpos.study", "vitpos.claims", "vitpos.validation",
                       "vitpos.report"),
    "vitpos.experiments": ("vitpos.study", "vitpos.claims", "vitpos.validation", "vitpos.report"),
    # the shared rendering helpers every experiment's section uses: nothing above the results layer
    "vitpos.report.format": ("vitpos.experiments", "vitpos.study", "vitpos.claims", "vitpos.validation",
                             "vitpos.plots", "vitpos.report.html", "vitpos.report.sections"),
    "vitpos.claims": ("vitpos.experiments", "vitpos.plots", "vitpos.study", "vitpos.validation", "vitpos.report"),
}
# exceptions to `FORBIDDEN`: an experiment renders its report section with report.format's helpers
ALLOWED: dict[str, tuple[str, ...]] = {"vitpos.experiments": ("vitpos.report.format",)}
# modules of vitpos.experiments that are not an experiment: any experiment may import them
# (checks: what the stages would refuse, shared by their `check`s and `vitpos run --plan`; sae_settings: the
# sae stage's settings, which sae_run, sae_seeds and sae_layers all read)
SHARED_EXPERIMENT_MODULES = frozenset({"vitpos.experiments", "vitpos.experiments.base", "vitpos.experiments.common",
                                       "vitpos.experiments.checks", "vitpos.experiments.sae_settings"})
REGISTRY = "vitpos.experiments.registry"  # lists every experiment: it imports them all
# helper modules that belong to one experiment (imported by it alone, counted as part of it)
EXPERIMENT_OF = {"vitpos.experiments.sae_seeds": "vitpos.experiments.sae_run",
                 "vitpos.experiments.sae_sweep": "vitpos.experiments.sae_layers",
                 # a large experiment's helper modules, split by job (issue 45)
                 **{f"vitpos.experiments.rope_heads_{m}": "vitpos.experiments.rope_heads"
                    for m in ("analysis", "ablation", "rebuild", "plan")},
                 **{f"vitpos.experiments.sae_{m}": "vitpos.experiments.sae_run"
                    for m in ("store", "heldout", "causal")},
                 "vitpos.experiments.ape_permute_variants": "vitpos.experiments.ape_permute",
                 # each experiment's report section and summary line (`Experiment.section` / `summary`)
                 **{f"vitpos.experiments.{m}_section": f"vitpos.experiments.{m}"
                    for m in ("evaluation", "probe", "sae_run", "ape_permute", "rope_axis", "rope_heads",
                              "rope_prefix", "rope_freq", "extrapolate", "sae_layers")}}

Graph = dict[str, set[str]]


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `root` (a folder holding packages)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: Mapping[str, Path]) -> str | None:
    """The longest known module that `name` is or lies in (None: outside the tree, e.g. torch)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path) -> Graph:
    """module -> the modules of the same tree it imports, from every Import / ImportFrom node of its
    source, at any depth (function bodies and `if TYPE_CHECKING:` included)."""
    known = modules(root)
    graph: Graph = {m: set() for m in known}
    for mod, path in known.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_resolve(a.name, known) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, base] if base else parts)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.append(full if full in known else _resolve(base, known))
            graph[mod].update(t for t in targets if t is not None and t != mod)
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return sorted(found)


def _in(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


def forbidden_edges(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """'a -> b (rule)' for each edge against `FORBIDDEN` or between two experiments."""
    bad = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            for src, targets in FORBIDDEN.items():
                allowed = ALLOWED.get(src, ())
                if _in(a, src) and any(_in(b, t) for t in targets) and not any(_in(b, t) for t in allowed):
                    bad.append(f"{a} -> {b} ({src} must not import {', '.join(targets)})")
            if (_in(a, "vitpos.experiments") and _in(b, "vitpos.experiments") and a != REGISTRY
                    and b not in SHARED_EXPERIMENT_MODULES
                    and EXPERIMENT_OF.get(a, a) != EXPERIMENT_OF.get(b, b)):
                bad.append(f"{a} -> {b} (an experiment imports another; share through experiments/common.py)")
    return bad


def _describe(graph: Mapping[str, Iterable[str]], comp: list[str]) -> str:
    inside = set(comp)
    return "\n".join(f"  {m} -> {sorted(set(graph[m]) & inside)}" for m in comp)


def test_the_package_has_no_import_cycle_deferred_imports_counted():
    graph = import_graph(PACKAGE_ROOT)
    assert sum(len(v) for v in graph.values()) > 300, "the parser found too few imports to judge the graph"
    found = cycles(graph)
    assert not found, "import cycles (deferred and TYPE_CHECKING imports counted):\n" + "\n".join(
        _describe(graph, c) for c in found)


def test_no_import_goes_against_the_layers():
    graph = import_graph(PACKAGE_ROOT)
    bad = forbidden_edges(graph)
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_a_cycle_through_a_function_body_import_is_found(tmp_path):
    """The builder on a synthetic package: a cycle closed by an import inside a function, a relative
    import and a TYPE_CHECKING import, and a forbidden direction, are all seen."""
    pkg = tmp_path / "vitpos"
    (pkg / "models").mkdir(parents=True)
    (pkg / "experiments").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "experiments" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from vitpos import b\n")
    (pkg / "b.py").write_text("def f():\n    from vitpos.a import x\n    return x\n")
    (pkg / "models" / "m.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from ..experiments.e import R\n")
    (pkg / "experiments" / "e.py").write_text("import torch\nfrom . import f\n")
    (pkg / "experiments" / "f.py").write_text("")
    graph = import_graph(tmp_path)
    assert graph["vitpos.a"] == {"vitpos.b"} and graph["vitpos.b"] == {"vitpos.a"}
    assert graph["vitpos.models.m"] == {"vitpos.experiments.e"}
    assert graph["vitpos.experiments.e"] == {"vitpos.experiments.f"}
    assert cycles(graph) == [["vitpos.a", "vitpos.b"]]
    bad = forbidden_edges(graph)
    assert any(e.startswith("vitpos.models.m -> vitpos.experiments.e ") for e in bad)
    assert any(e.startswith("vitpos.experiments.e -> vitpos.experiments.f ") for e in bad)


def test_experiments_may_use_report_format_and_nothing_else_of_the_report():
    """An experiment's section imports report.format (allowed); report.html is above it, and
    report.format must not reach back up to the experiments."""
    graph = {"vitpos.experiments.e_section": {"vitpos.report.format", "vitpos.report.html"},
             "vitpos.report.format": {"vitpos.results.base", "vitpos.experiments.base"}}
    bad = forbidden_edges(graph)
    assert not any(b.startswith("vitpos.experiments.e_section -> vitpos.report.format ") for b in bad)
    assert any(b.startswith("vitpos.experiments.e_section -> vitpos.report.html ") for b in bad)
    assert any(b.startswith("vitpos.report.format -> vitpos.experiments.base ") for b in bad)
    assert not any(b.startswith("vitpos.report.format -> vitpos.results.base ") for b in bad)
