"""The report renders typed results: every experiment's result type, from real runs, renders its
section and figures; a section that raises fails the render (nothing is masked as 'could not
render'); a measurement a result lacks is a one-line reason."""

from __future__ import annotations

import copy
import re

import pytest

from conftest import APE, GOLDEN, ROPE, XSS, make_results, tiny_own, toy_set
from vitpos.experiments.base import Experiment
from vitpos.experiments.registry import BY_NAME, EXPERIMENTS
from vitpos.report import sections
from vitpos.report.html import render_report
from vitpos.results.base import Result, Skipped
from vitpos.results.rope_heads import RopeHeadsResult
from vitpos.study.results import StudyResults, figure_key

EXTRA = "tiny:rope-mixed"  # the golden quick run has no rope_freq / extrapolate: a tiny model runs them
EXTRA_APE = "tiny:ape"  # ... nor sae_layers (off under --quick): a tiny APE model runs its sweep


@pytest.fixture(scope="module")
def every_result() -> dict:
    """make_results() (the golden quick run's results) plus a tiny RoPE model's rope_freq and
    extrapolate results and a tiny APE model's layer sweep, so that every registered experiment has a
    real result in one file."""
    from vitpos.experiments.extrapolate import run_extrapolate
    from vitpos.experiments.registry import LAYER_MEASURES
    from vitpos.experiments.rope_freq import run_rope_freq
    from vitpos.experiments.sae_sweep import run_sae_sweep
    from vitpos.results.sae_layers import SAELayersResult

    s = tiny_own("rope-mixed")
    results = make_results()
    entry = {"describe": s.describe(), "data": "toy", "not_applicable": {}}
    entry["rope_freq"] = run_rope_freq(s, toy_set(40), n_images=40, bands=2).to_json()
    entry["extrapolate"] = run_extrapolate(s, toy_set(32), n_images=32).to_json()
    results["models"][EXTRA] = entry
    a = tiny_own("ape")
    kw = dict(k=4, expansion=2, n_train_images=64, n_eval_images=32, epochs=1, batch_tokens=256, buffer_tokens=512)
    sweep = run_sae_sweep(a, toy_set(64), LAYER_MEASURES, sae_kw=kw, permute_images=32)
    layers = SAELayersResult(**dict(sweep), sae_images=64, sae_eval_images=32, sae_epochs=1, sae_expansion=2, sae_k=4,
                             permute_images=32, seeds=[0])
    results["models"][EXTRA_APE] = {"describe": a.describe(), "data": "toy", "not_applicable": {},
                                    "sae_layers": layers.to_json()}
    return results


def test_every_experiment_renders_its_section_and_figures(every_result, tmp_path):
    from vitpos.study.run import draw_figures

    typed = StudyResults.from_json(copy.deepcopy(every_result))
    have = {name for m in typed.models.values() for name, r in m.results.items() if isinstance(r, Result)}
    assert have == {exp.name for exp in EXPERIMENTS}  # each result type is rendered below
    assert all(type(exp).section is not Experiment.section for exp in EXPERIMENTS)  # each has a section of its own
    figs = draw_figures(typed, tmp_path, log=pytest.fail)  # every declared figure draws from the typed result
    page = render_report(typed.model_copy(update={"figures": figs}), tmp_path).read_text(encoding="utf-8")
    assert "could not render" not in page and "could not summarise" not in page
    for spec, entry in typed.models.items():
        for exp in EXPERIMENTS:
            result = entry.results.get(exp.name)
            if not isinstance(result, Result):
                continue
            body = exp.section(result, sections.CLAIM_RULES)
            assert body is not None
            assert "<table" in body and body in page, (spec, exp.name)
            for fig in exp.figures(result):
                assert figure_key(spec, fig.name) in figs, (spec, fig.name)
    assert page.count('src="data:image/png;base64,') == len(figs)


def test_a_section_that_raises_fails_the_render(monkeypatch, tmp_path):
    """A section reading a field its result does not have (a renamed field) raises out of
    render_report instead of turning into a 'could not render' line."""

    def renamed(r: RopeHeadsResult) -> str:
        return str(r.primary_head)  # type: ignore[attr-defined]  # as if `primary_rebuilding_head` were renamed

    monkeypatch.setattr(BY_NAME["rope_heads"], "section", lambda r, claims: renamed(r))
    with pytest.raises(AttributeError, match="primary_head"):
        render_report(make_results(), tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_summary_line_that_raises_fails_the_render(monkeypatch, tmp_path):
    results = make_results()
    both = copy.deepcopy(results["models"][ROPE])  # a RoPE model whose scheme also names APE: its summary
    both["describe"]["scheme"] = "rope+ape"        # lines fill the APE claims' RoPE column
    results["models"]["both"] = both

    def boom(r, claim):
        raise KeyError("renamed")

    monkeypatch.setattr(BY_NAME["rope_axis"], "summary", boom)
    with pytest.raises(KeyError, match="renamed"):
        render_report(results, tmp_path)


def test_an_absent_measurement_is_one_line(tmp_path):
    """Not applicable, skipped and not run each render as one reason line; a result without an
    optional measurement renders without its rows."""
    results = make_results()
    results["models"][APE]["ape_permute"] = {"skipped": "no <positional> features"}
    results["models"][ROPE]["rope_prefix"] = None
    heads = results["models"][ROPE]["rope_heads"]
    heads["top_heads"] = None
    page = render_report(results, tmp_path).read_text(encoding="utf-8")
    text = re.sub(r"<[^>]+>", "", page)
    assert "not applicable: no &lt;positional&gt; features" in text
    assert text.count("not applicable: no result in this run") >= 1
    assert "top heads by fall in recovery" not in text
    typed = StudyResults.from_json(results)
    assert isinstance(typed.models[APE].results["ape_permute"], Skipped)
    assert sections.reason(typed.models[XSS], "probe") == "no patches & <no> grid"
    assert sections.reason(typed.models[ROPE], "rope_prefix") == "no result in this run"


def test_old_results_render_with_their_numbers(tmp_path):
    """The golden results.json (written by an earlier vitpos) renders with the numbers it holds."""
    page = render_report(copy.deepcopy(GOLDEN), tmp_path).read_text(encoding="utf-8")
    ev = GOLDEN["models"]["builtin:rope-mixed"]["eval"]
    assert f"test top-1 <b>{100 * ev['top1']:.1f}%</b>" in page
    rec = GOLDEN["models"]["builtin:rope-axial"]["rope_axis"]["recovery"]["row"]
    assert all(f"{v['mean_rec']:.2f}" in page for v in rec.values() if v["mean_rec"] is not None)


def test_an_experiment_without_a_section_shows_its_fields(monkeypatch, tmp_path):
    monkeypatch.setattr(BY_NAME["eval"], "section", lambda r, claims: None)  # as if it had none
    page = render_report(make_results(), tmp_path).read_text(encoding="utf-8")
    top1 = GOLDEN["models"]["builtin:ape"]["eval"]["top1"]
    assert f"<tr><td>top1</td><td>{top1:.4g}</td></tr>" in page


def test_the_sae_section_shows_the_seed_grid_and_both_high_norm_rules():
    """The measured DINOv2 run (docs/measured): the sae stage's seeds x sizes and their matching reach the
    report (they were in results.json only, while the one stability line read 1.4 % matched), and the
    held-out outlier share (at the report's 5x) is not labelled as the training's rule (4x there)."""
    import html
    import json
    from pathlib import Path

    from vitpos.experiments import sae_run_section
    from vitpos.results.sae_run import SAEResult

    doc = json.loads((Path(__file__).resolve().parents[2] / "docs" / "measured" / "dinov2-tiles.results.json")
                     .read_text())
    raw = next(m["sae"] for m in doc["models"].values() if "sae" in m)
    text = html.unescape(re.sub(r"<[^>]+>", "|", sae_run_section.section(SAEResult.model_validate(raw))))
    grid = raw["sweep"]
    assert grid["runs"] and grid["stability"]
    for run in grid["runs"]:
        counts = f"{run['n_row_features']} / {run['n_col_features']} / {run['n_mixed_features']}"
        seed = f"{run['seed']} *" if run["main"] else str(run["seed"])
        row = f"|{seed}||×{run['expansion']} ({run['d_sae']})||{run['fvu']:.3f}||{run['l0']:.1f}|"
        assert row in text and text.split(row, 1)[1].split("||", 2)[1] == counts, run
    for m in grid["stability"]:
        assert f"|{m['seeds'][0]} vs {m['seeds'][1]}||{m['d_sae']}|" in text
        assert f"|{100 * m['row_agreement']:.1f}%||{100 * m['col_agreement']:.1f}%|" in text
    factor, k = raw["training"]["high_norm_factor"], raw["special_tokens"]["k"]
    assert factor != k  # the case the labels must tell apart
    assert f"held-out patch tokens with norm > {k:g}× median" in text
    assert f"norm > {factor:g}× the median training-token norm" in text
    assert f"{k:g}× median) at this layer" not in text
