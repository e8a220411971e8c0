"""The report shows every permuted set beside its matched control, intervals, and `inconclusive`."""

from __future__ import annotations

from vitpos.experiments import ape_permute_section, evaluation_section
from vitpos.report.html import _CSS, _badge
from vitpos.results.ape_permute import ApePermuteResult
from vitpos.results.evaluation import EvalResult


def _v(drop, ci, n, note=None) -> dict:
    return {"top1": 0.9 - drop / 100, "top1_std": 0.0, "drop_points": drop, "drop_std": 0.0, "per_seed_top1": [0.5],
            "n_features": n, "per_group": {}, "drop_ci95": ci, "activation_mass": 1.0, "note": note}


def ape_doc() -> ApePermuteResult:
    return ApePermuteResult.model_validate({
            "model": "m", "layer": 1, "site": "resid_post", "data": "shapes", "n_images": 300, "seeds": [0],
            "baseline_top1": 0.9, "baseline_top1_ci95": [0.86, 0.93], "baseline_per_group": {},
            "variants": ["all", "row_only", "col_only", "all_positional", "random_features", "mean_ablate",
                         "pos_embed_shuffle"],
            "controls": {"all_positional": "random_all_positional", "all": "random_features", "row_only": "random_row",
                         "col_only": "random_col"},
            "feature_counts": {"row": 2, "col": 3, "mixed": 40},
            "all": _v(3.0, [1.0, 5.0], 5), "row_only": _v(1.0, [0.0, 2.0], 2), "col_only": _v(2.0, [1.0, 3.0], 3),
            "all_positional": _v(20.0, [15.25, 24.75], 45), "random_features": _v(0.5, [0.0, 1.0], 5),
            "random_row": _v(0.0, [0.0, 0.0], 2), "random_col": {"skipped": "no live non-positional latents"},
            "random_all_positional": _v(1.0, [0.0, 2.0], 30, note="only 30 live non-positional latents"),
            "mean_ablate": _v(4.0, [2.0, 6.0], 5), "pos_embed_shuffle": _v(70.0, [65.0, 75.0], None)})


def test_ape_section_pairs_each_set_with_its_control():
    html = ape_permute_section.section(ape_doc())
    pairs = html.split("each permuted set beside its matched random control", 1)[1].split("every variant", 1)[0]
    rows = pairs.split("<tr>")[2:]
    assert [r.split("</td>")[0].removeprefix("<td>") for r in rows] == [
        "all positional (row+col+mixed)", "row+col", "row only", "col only"]
    assert "random_all_positional" in rows[0] and "[15.2, 24.8]" in rows[0] and "only 30 live" in rows[0]
    assert "skipped: no live non-positional latents" in rows[3]
    assert "random_row" in html.split("every variant", 1)[1]  # the controls are listed among the variants too
    assert "[86.0%, 93.0%]" in html
    assert "control 1.0 pts [0.0, 2.0]" in ape_permute_section.summary(ape_doc())


def test_eval_interval_and_inconclusive_badge():
    ev = EvalResult(top1=1.0, n=500, per_class={}, per_group={}, top1_ci95=[0.9924, 1.0])
    assert "95% Wilson interval [99.2%, 100.0%]" in evaluation_section.section(ev)
    assert _badge("inconclusive") == '<span class="badge inconclusive">inconclusive</span>'
    assert ".badge.inconclusive{" in _CSS


def test_heads_section_says_which_drops_rest_on_the_adaptive_screen():
    from test_report import rope_heads_result

    from vitpos.experiments.rope_heads_section import section as _sec_heads

    doc = rope_heads_result().model_copy(update={"n_top1_images": 2000})
    assert "adaptive" not in _sec_heads(doc)  # every head on every image: nothing to say
    html = _sec_heads(doc.model_copy(update={"top1_screen_images": 256,
                                             "top1_images_per_head": [[256, 2000], [2000, 256]]}))
    assert "every head on the first 256" in html and "2 of 4 heads still in the race on all 2000" in html


def test_rope_sections_show_the_c3_c4_intervals():
    """C3's removal fractions, C4's median Rec and the primary head's S with their intervals, where a
    result has them; a result written before them renders as before."""
    from test_report import rope_axis_doc, rope_heads_doc

    from vitpos.experiments.rope_axis_section import section as _sec_axis
    from vitpos.experiments.rope_axis_section import summary as _summary_axis
    from vitpos.experiments.rope_heads_section import section as _sec_heads
    from vitpos.results.rope_axis import RopeAxisResult
    from vitpos.results.rope_heads import RopeHeadsResult

    old = RopeAxisResult.model_validate(rope_axis_doc())
    assert "removed of its own axis" not in _sec_axis(old) and "of above-chance" not in _summary_axis(old, "C3")
    doc = rope_axis_doc()
    doc["removal"] = {"no_row": {"removed": 0.95, "removed_ci95": [0.9, 0.99], "kept": 1.1, "kept_ci95": [1.0, 1.2],
                                 "removed_layers": [0, 1], "kept_layers": [0, 1]},
                      "no_col": {"removed": 0.8, "removed_ci95": [0.6, 0.95], "kept": 0.9, "kept_ci95": [0.8, 1.0],
                                 "removed_layers": [0, 1], "kept_layers": [0, 1]}}
    doc["median_recovery"] = {a: {"median_rec": 0.5, "median_rec_ci95": [0.31, 0.69], "restore_points": [1, 2]}
                              for a in ("row", "col")}
    for per_r in doc["recovery"].values():
        for r in per_r.values():
            r["mean_rec_ci95"] = [0.42, 0.58]
    doc = RopeAxisResult.model_validate(doc)
    sec = _sec_axis(doc)
    assert "95.0% [90.0%, 99.0%]" in sec and "col: 110.0% [100.0%, 120.0%]" in sec and "80.0% [60.0%, 95.0%]" in sec
    assert "0.50 [0.42, 0.58]" in sec and "median over R (C4)" in sec and "0.50 [0.31, 0.69]" in sec
    assert "95.0% [90.0%, 99.0%] of above-chance row decodability removed" in _summary_axis(doc, "C3")
    assert "R=1: 0.50 [0.42, 0.58]" in _summary_axis(doc, "C4")
    assert "median over R 0.50 [0.31, 0.69]" in _summary_axis(doc, "C4")
    heads = rope_heads_doc()
    assert "its axis index S (+1 row, −1 col)</td><td>-0.60</td>" in _sec_heads(RopeHeadsResult.model_validate(heads))
    heads["axis_index_ci95"] = [[[v - 0.1, v + 0.05] for v in row] for row in heads["axis_index"]]
    assert "-0.60 [-0.70, -0.55]" in _sec_heads(RopeHeadsResult.model_validate(heads))
