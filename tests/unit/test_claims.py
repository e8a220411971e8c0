"""Verdict rules on constructed results: holds / fails / inconclusive per model, and their aggregation."""

from __future__ import annotations

import pytest

from vitpos.study.claims import (
    CONTROL_FACTOR,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    MIN_DROP,
    SELECTIVE,
    aggregate,
    all_of,
    at_least,
    bounds,
    exceeds,
    largest,
    summarise,
)


def test_three_valued_conditions():
    assert at_least((0.7, 0.9), 0.6) == HOLDS
    assert at_least((0.3, 0.5), 0.6) == FAILS
    assert at_least((0.5, 0.7), 0.6) == INCONCLUSIVE
    assert at_least(None, 0.6) == FAILS
    assert at_least(bounds(0.6), 0.6) == HOLDS  # no interval: the point decides, as the old rules did
    assert exceeds((21, 30), (0, 10), 2) == HOLDS  # 21 > 2 x 10
    assert exceeds((21, 30), (0, 10.5), 2) == INCONCLUSIVE  # 2 x 10.5 = 21 lies inside [21, 30]
    assert exceeds((1, 3), (2, 4), 2) == FAILS
    assert exceeds((1, 3), None) == INCONCLUSIVE
    assert largest((5, 6), [(1, 2), (3, 4.9)]) == HOLDS
    assert largest((5, 6), [(6.5, 7)]) == FAILS
    assert largest((5, 6), [(5.5, 7)]) == INCONCLUSIVE
    assert all_of(HOLDS, INCONCLUSIVE) == INCONCLUSIVE and all_of(INCONCLUSIVE, FAILS) == FAILS
    assert all_of(HOLDS, HOLDS) == HOLDS


def test_aggregation_over_models():
    assert aggregate([]) == "not applicable"
    assert aggregate([HOLDS, HOLDS]) == "supported"
    assert aggregate([HOLDS, FAILS]) == aggregate([HOLDS, INCONCLUSIVE]) == "partly supported"
    assert aggregate([FAILS, FAILS]) == aggregate([FAILS, INCONCLUSIVE]) == "not supported"
    assert aggregate([INCONCLUSIVE, INCONCLUSIVE]) == "inconclusive"


# ---------------------------------------------------------------- C1
def sae(row_ci, col_ci, n_row=3, n_col=2) -> dict:
    def eff(ci):
        return {"selectivity": sum(ci) / 2, "selectivity_ci95": list(ci)}
    return {"layer": 1, "n_row_features": n_row, "n_col_features": n_col, "fvu": 0.2,
            "causal": {"ablate_row": eff(row_ci), "ablate_col": eff(col_ci)}}


def claim(models: dict, cid: str) -> dict:
    return next(c for c in summarise(models).model_dump()["claims"] if c["id"] == cid)


@pytest.mark.parametrize("row_ci, col_ci, n_col, result", [
    ((0.7, 0.9), (0.65, 0.95), 2, HOLDS),
    ((0.2, 0.5), (0.65, 0.95), 2, FAILS),
    ((0.5, 0.8), (0.65, 0.95), 2, INCONCLUSIVE),  # SELECTIVE = 0.6 lies inside the row interval
    ((0.7, 0.9), (0.65, 0.95), 0, FAILS),  # no col features
])
def test_c1_per_model_result(row_ci, col_ci, n_col, result):
    assert SELECTIVE == 0.6
    c = claim({"m": {"sae": sae(row_ci, col_ci, n_col=n_col)}}, "C1")
    assert c["numbers"]["m"]["result"] == result
    assert c["numbers"]["m"]["holds"] is (result == HOLDS)
    assert c["verdict"] == {HOLDS: "supported", FAILS: "not supported", INCONCLUSIVE: "inconclusive"}[result]
    assert f"[{row_ci[0]:.2f}, {row_ci[1]:.2f}]" in c["evidence"]  # the interval is in the console's evidence


# ---------------------------------------------------------------- C2
def variant(drop, ci=None, n: int | None = 10, note=None) -> dict:
    return {"top1": 0.9 - drop / 100, "top1_std": 0.0, "drop_points": drop, "drop_std": 0.0, "per_seed_top1": [0.5],
            "n_features": n, "per_group": {}, "drop_ci95": list(ci) if ci else None, "activation_mass": 1.0,
            "note": note}


def ape(treated, control, row_col=(0.0, (0.0, 0.0))) -> dict:
    doc = {"variants": [], "baseline_top1": 0.9, "all": variant(row_col[0], row_col[1]),
           "random_features": variant(0.0, (0.0, 0.0)), "pos_embed_shuffle": variant(70.0, (65, 75), n=None)}
    doc["all_positional"] = variant(*treated, n=40)
    doc["random_all_positional"] = {"skipped": "no live non-positional latents"} if control is None \
        else variant(*control, n=40)
    return doc


@pytest.mark.parametrize("treated, control, result", [
    ((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0)), HOLDS),
    ((4.0, (2.0, 6.0)), (1.0, (0.0, 2.0)), FAILS),  # below MIN_DROP
    ((12.0, (8.0, 16.0)), (1.0, (0.0, 2.0)), INCONCLUSIVE),  # MIN_DROP = 10 inside the interval
    ((20.0, (15.0, 25.0)), (9.0, (6.0, 12.0)), INCONCLUSIVE),  # 2 x control overlaps the drop
    ((20.0, (15.0, 25.0)), (14.0, (13.0, 15.0)), FAILS),  # the control drops as much: no more than 2x it
    ((20.0, (15.0, 25.0)), None, INCONCLUSIVE),  # no control to compare with
    ((20.0, None), (1.0, None), HOLDS),  # results without intervals: the points decide
])
def test_c2_reads_the_all_positional_set_against_its_control(treated, control, result):
    assert (MIN_DROP, CONTROL_FACTOR) == (10.0, 2.0)
    c = claim({"m": {"ape_permute": ape(treated, control, row_col=(30.0, (25.0, 35.0)))}}, "C2")
    nums = c["numbers"]["m"]
    assert nums["result"] == result
    assert nums["all_positional_drop"] == treated[0] and nums["drop_points"] == 30.0  # row+col: reported only
    assert "all positional (row+col+mixed) (40)" in c["evidence"] and "row+col (10)" in c["evidence"]


def test_c2_row_col_alone_does_not_decide():
    doc = ape((2.0, (1.0, 3.0)), (0.0, (0.0, 0.0)), row_col=(30.0, (25.0, 35.0)))
    assert claim({"m": {"ape_permute": doc}}, "C2")["verdict"] == "not supported"


def test_verdict_aggregates_models_with_inconclusive():
    held = {"ape_permute": ape((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0)))}
    unsure = {"ape_permute": ape((12.0, (8.0, 16.0)), (1.0, (0.0, 2.0)))}
    failed = {"ape_permute": ape((4.0, (2.0, 6.0)), (1.0, (0.0, 2.0)))}
    assert claim({"a": held, "b": unsure}, "C2")["verdict"] == "partly supported"
    assert claim({"a": unsure, "b": unsure}, "C2")["verdict"] == "inconclusive"
    assert claim({"a": failed, "b": unsure}, "C2")["verdict"] == "not supported"
    assert claim({"a": held}, "C3")["verdict"] == "not applicable"


# ---------------------------------------------------------------- C5
def heads(drops, primary, cis=None) -> dict:
    L, H = len(drops), len(drops[0])
    order = sorted(((d, lyr, h) for lyr, row in enumerate(drops) for h, d in enumerate(row)), reverse=True)
    doc = {"layers": list(range(L)), "num_heads": H, "restore_from": 1, "drop_points": drops,
           "primary_rebuilding_head": primary, "largest_drop_head": list(order[0][1:]),
           "primary_head_drop_rank": 1 + [list(o[1:]) for o in order].index(primary),
           "primary_head_drop_rank_after_R": None, "primary_is_largest_drop": list(order[0][1:]) == primary}
    if cis is not None:
        doc["drop_ci95"] = cis
    return doc


def test_c5_points_now_and_intervals_when_measured():
    drops = [[1.0, 2.0], [9.0, 3.0]]
    assert claim({"m": {"rope_heads": heads(drops, [1, 0])}}, "C5")["numbers"]["m"]["result"] == HOLDS
    assert claim({"m": {"rope_heads": heads(drops, [1, 1])}}, "C5")["numbers"]["m"]["result"] == FAILS
    narrow = [[[d - 0.5, d + 0.5] for d in row] for row in drops]
    wide = [[[d - 4, d + 4] for d in row] for row in drops]
    assert claim({"m": {"rope_heads": heads(drops, [1, 0], narrow)}}, "C5")["numbers"]["m"]["result"] == HOLDS
    assert claim({"m": {"rope_heads": heads(drops, [1, 1], narrow)}}, "C5")["numbers"]["m"]["result"] == FAILS
    assert claim({"m": {"rope_heads": heads(drops, [1, 0], wide)}}, "C5")["verdict"] == "inconclusive"


@pytest.mark.parametrize("margins, result", [
    ([[[0.5, 2.0], None], [[0.1, 0.4], [3.0, 5.0]]], HOLDS),  # every paired margin above 0
    ([[[0.5, 2.0], None], [[-0.1, 0.4], [3.0, 5.0]]], INCONCLUSIVE),  # one straddles 0
    ([[[0.5, 2.0], None], [[-0.9, -0.2], [3.0, 5.0]]], FAILS),  # another head drops more, surely
])
def test_c5_reads_the_paired_margins_first(margins, result):
    """Margins decide even where the marginal drop intervals overlap (they would say inconclusive),
    and the closest rival is named."""
    drops = [[1.0, 2.0], [1.5, 0.0]]
    wide = [[[d - 4, d + 4] for d in row] for row in drops]
    doc = heads(drops, [0, 1], wide)
    doc["primary_margin_ci95"] = margins
    c = claim({"m": {"rope_heads": doc}}, "C5")
    assert c["numbers"]["m"]["result"] == result
    assert c["numbers"]["m"]["closest_rival_head"] == [1, 0]


def test_seeds_of_a_family_are_counted_and_averaged():
    """`NAME`, `NAME-seed1`, `NAME-seed2` form one family: the claim states on how many seeds it
    holds and the mean of its headline number (C1: the smaller selectivity) with a t interval;
    a family with one seed gets no summary, another family is kept apart."""
    from vitpos.analysis.stats import seed_interval
    from vitpos.study.claims import model_family

    assert model_family("builtin:ape-seed2") == model_family("builtin:ape") == "builtin:ape"
    models = {"builtin:ape": {"sae": sae((0.7, 0.9), (0.65, 0.95))},  # holds, min selectivity 0.8
              "builtin:ape-seed1": {"sae": sae((0.5, 0.8), (0.65, 0.95))},  # inconclusive, 0.65
              "builtin:ape-seed2": {"sae": sae((0.7, 0.9), (0.9, 1.0))},  # holds, 0.8
              "other:ape": {"sae": sae((0.7, 0.9), (0.65, 0.95))}}
    c = claim(models, "C1")
    fam = c["seeds"]["builtin:ape"]
    assert fam["models"] == ["builtin:ape", "builtin:ape-seed1", "builtin:ape-seed2"]
    assert fam["holds"] == 2 and fam["results"] == [HOLDS, INCONCLUSIVE, HOLDS]
    assert fam["values"] == pytest.approx([0.8, 0.65, 0.8])
    mean, ci = seed_interval([0.8, 0.65, 0.8])
    assert fam["mean"] == pytest.approx(mean) and fam["ci95"] == pytest.approx(ci)
    assert "other:ape" not in c["seeds"]
    assert c["verdict"] == "partly supported"
    assert "holds on 2 of 3 seeds" in c["evidence"]
