"""The report outside the test process: rendered by a fresh interpreter from another working
directory (relative --out), and opened in headless chromium (skipped when chromium is absent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import make_results
from vitpos.report.sections import PNG_MAGIC
from vitpos.study.results import StudyResults
from vitpos.study.run import draw_figures


@pytest.mark.slow
def test_relative_out_from_another_directory_inlines_every_figure(tmp_path):
    """`vitpos run --out rel` (README command 1): figures are recorded relative to OUT and found."""
    cwd = tmp_path / "work"
    (cwd / "rel").mkdir(parents=True)
    results = make_results()
    results["figures"] = draw_figures(StudyResults.from_json(results), cwd / "rel")
    (cwd / "rel" / "results.json").write_text(json.dumps(results))
    code = ("import json, sys; from vitpos.report.html import render_report; "
            "render_report(json.load(open('rel/results.json')), 'rel')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = (cwd / "rel" / "report.html").read_text()
    assert "figure missing" not in page
    # headline + APE probe, ape_permute + RoPE probe, rope_axis, recovery, rope_heads, rope_prefix
    assert page.count('src="data:image/png;base64,') == len(results["figures"]) == 8


@pytest.mark.slow
def test_report_in_headless_chromium(rendered, tmp_path):
    """The page as a reader's browser shows it: every figure decoded, no console errors, a real screenshot."""
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium)")
    _, figs, _, out = rendered
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--enable-logging=stderr", "--v=0", "--window-size=1280,2400"]
    url = (out / "report.html").resolve().as_uri()
    shot = tmp_path / "shot.png"
    proc = subprocess.run([*flags, f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console[:5]
    assert shot.read_bytes().startswith(PNG_MAGIC) and shot.stat().st_size > 100_000
    # the DOM after load: every <img> decoded to its real size, nothing reads "figure missing"
    probe = ("<script>window.onload=()=>{document.title=[...document.images].filter(i=>i.naturalWidth>100)"
             ".length+'/'+document.images.length}</script>")
    page = (out / "report.html").read_text().replace("</body>", probe + "</body>")
    (tmp_path / "probe.html").write_text(page)
    dom = subprocess.run([*flags, "--dump-dom", (tmp_path / "probe.html").as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert f"<title>{len(figs)}/{len(figs)}</title>" in dom
    assert "figure missing" not in dom
