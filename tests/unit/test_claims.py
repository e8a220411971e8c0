"""Verdict rules on constructed results: holds / fails / inconclusive per model, and their aggregation."""

from __future__ import annotations

import copy

import pytest

from conftest import GOLDEN
from vitpos.claims.inputs import ClaimInputs
from vitpos.claims.intervals import FAILS, HOLDS, INCONCLUSIVE, aggregate, all_of, at_least, bounds, exceeds, largest
from vitpos.claims.registry import rule_set
from vitpos.claims.summary import summarise
from vitpos.claims.verdict import FamilyHeadline
from vitpos.results.ape_permute import ApePermuteResult
from vitpos.results.evaluation import EvalResult
from vitpos.results.rope_axis import RopeAxisResult
from vitpos.results.rope_heads import RopeHeadsResult
from vitpos.results.sae_run import SAEResult

SELECTIVE, MIN_DROP, CONTROL_FACTOR = (rule_set().values()[k] for k in ("C1.selective", "C2.min_drop",
                                                                          "C2.null_factor"))

# Claims read typed results: each constructed result below is the JSON of the fields a test sets, laid
# over a real result of the golden quick run (for the fields the rule does not read) and validated into
# the experiment's result class; the rule tiers a test does not construct are switched off (None).
_APE, _ROPE = GOLDEN["models"]["builtin:ape"], GOLDEN["models"]["builtin:rope-axial"]
BASES = {
    "sae": (SAEResult, _APE["sae"], {"eta2_null": None, "seed_pool": None}),
    "ape_permute": (ApePermuteResult, _APE["ape_permute"],
                    {k: None for k in ("random_row", "random_col", "crossed", "norm_all_positional", "nulls",
                                       "seed_pool")}),
    "rope_axis": (RopeAxisResult, _ROPE["rope_axis"],
                  {k: None for k in ("removal", "median_recovery", "count_matched", "median_rebuilt_share",
                                     "removal_floored", "content_floor", "readouts")}),
    "rope_heads": (RopeHeadsResult, _ROPE["rope_heads"],
                   {k: None for k in ("axis_index_null_threshold", "c5_ablations", "top_heads")}),
    "eval": (EvalResult, _APE["eval"], {}),
}


def inputs(model: dict) -> ClaimInputs:
    """A model's constructed results ({experiment: its JSON}, plus scheme / data) as the claims read them."""
    typed = {}
    for k, v in model.items():
        if k in BASES:
            cls, base, off = BASES[k]
            v = cls.model_validate({**copy.deepcopy(base), **off, **v})
        typed[k] = v
    return ClaimInputs(**typed)


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
def sae(row_ci, col_ci, n_row=3, n_col=2, own=(0.3, (0.25, 0.35)), ctrl=(0.01, (0.0, 0.02)),
        top1=(20.0, (15.0, 25.0))) -> dict:
    """An sae result whose selectivities are as given; by default each set's own-axis probe drop
    (fractions), its control's and its top-1 drop (points) clear the issue-28 conditions."""
    def eff(kind, ci, drop, top):
        out = {"row_acc": [0.5], "col_acc": [0.5], "row_drop": 0.0, "col_drop": 0.0, "row_drop_ci95": [0.0, 0.0],
               "col_drop_ci95": [0.0, 0.0], "selectivity": sum(ci) / 2, "selectivity_ci95": list(ci)}
        if drop is not None:
            out.update({f"{kind}_drop": drop[0], f"{kind}_drop_ci95": list(drop[1])})
        if top is not None:
            out.update({"top1_drop": top[0], "top1_drop_ci95": list(top[1])})
        return out
    causal = {"layers": [1, 2], "clean_row_acc": [0.9], "clean_col_acc": [0.9],
              "ablate_row": eff("row", row_ci, own, top1), "ablate_col": eff("col", col_ci, own, top1)}
    if ctrl is not None:
        causal.update({"control_row": {**eff("row", (0.5, 0.5), ctrl, (1.0, (0.0, 2.0))), "features": [7]},
                       "control_col": {**eff("col", (0.5, 0.5), ctrl, (1.0, (0.0, 2.0))), "features": [8]}})
    return {"layer": 1, "n_row_features": n_row, "n_col_features": n_col, "fvu": 0.2, "causal": causal}


def claim(models: dict, cid: str) -> dict:
    """The claim's summary as results.json holds it, with `text`: everything it says in words."""
    c = next(c for c in summarise({spec: inputs(m) for spec, m in models.items()}).claims if c.id == cid)
    return {**c.model_dump(), "text": c.text()}


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
    assert f"[{row_ci[0]:.2f}, {row_ci[1]:.2f}]" in c["text"]  # the interval is in the console's evidence


@pytest.mark.parametrize("kw, result", [
    ({}, HOLDS),
    ({"own": (0.006, (0.004, 0.008))}, FAILS),  # 0.6 points: below the 5-point floor (the quick run's row set)
    ({"own": (0.05, (0.03, 0.07))}, INCONCLUSIVE),  # the floor lies inside the interval
    ({"ctrl": (0.3, (0.25, 0.35))}, FAILS),  # a random removal lowers the probe as much
    ({"ctrl": None}, INCONCLUSIVE),  # no control measured
    ({"top1": (0.0, (0.0, 0.0))}, FAILS),  # the model does not use them (planted pos_unused)
    ({"top1": None}, INCONCLUSIVE),  # no top-1 (a headless model without a head)
])
def test_c1_needs_a_floor_a_control_and_a_top1_drop(kw, result):
    c = claim({"m": {"sae": sae((0.7, 0.9), (0.65, 0.95), **kw)}}, "C1")
    nums = c["numbers"]["m"]
    assert nums["result"] == result
    assert "row_probe_drop" in nums and "row_top1_drop" in nums and "row_control_probe_drop" in nums


def test_rules_are_versioned_hashed_and_each_threshold_has_a_curve():
    RULES = rule_set()
    s = summarise({"m": inputs({"sae": sae((0.7, 0.9), (0.65, 0.95))})})
    assert s.rules_version == RULES.version and s.rules_hash == RULES.digest() and len(s.rules_hash or "") == 16
    c1 = next(c for c in s.claims if c.id == "C1")
    curves = {x.threshold: x for x in c1.sensitivity or []}
    # every threshold of C1 but those that read the layer sweep, which this model has not (test_sweep_* below)
    assert set(curves) == {t.name for t in RULES.of("C1") if t.needs is None}
    floor = curves["C1.min_top1_drop"]  # top-1 drop [15, 25]: holds up to 10, undecided at 20, fails at 30
    assert [p.verdict for p in floor.curve] == ["supported"] * 5 + ["inconclusive", "not supported"]
    assert not floor.stable and floor.value == 5.0
    other = RULES.model_copy(update={"version": RULES.version + 1})
    assert other.digest() != RULES.digest()


# ---------------------------------------------------------------- C2
def variant(drop, ci=None, n: int | None = 10, note=None) -> dict:
    return {"top1": 0.9 - drop / 100, "top1_std": 0.0, "drop_points": drop, "drop_std": 0.0, "per_seed_top1": [0.5],
            "n_features": n, "per_group": {}, "drop_ci95": list(ci) if ci else None, "activation_mass": 1.0,
            "note": note}


def ape(treated, null, row_col=(0.0, (0.0, 0.0)), random=(1.0, (0.0, 2.0))) -> dict:
    """An ape_permute result: the all-positional drop, its same-position swap null (None: not
    measured) and its count/mass-matched random control (reported, not read)."""
    doc = {"variants": [], "baseline_top1": 0.9, "all": variant(row_col[0], row_col[1]),
           "random_features": variant(0.0, (0.0, 0.0)), "pos_embed_shuffle": variant(70.0, (65, 75), n=None)}
    doc["all_positional"] = variant(*treated, n=40)
    doc["random_all_positional"] = variant(*random, n=40)
    doc["swap_all_positional"] = {"skipped": "no features"} if null is None else variant(*null, n=40)
    return doc


@pytest.mark.parametrize("treated, null, result", [
    ((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0)), HOLDS),
    ((4.0, (2.0, 6.0)), (1.0, (0.0, 2.0)), FAILS),  # below MIN_DROP
    ((12.0, (8.0, 16.0)), (1.0, (0.0, 2.0)), INCONCLUSIVE),  # MIN_DROP = 10 inside the interval
    ((20.0, (15.0, 25.0)), (9.0, (6.0, 12.0)), INCONCLUSIVE),  # 2 x null overlaps the drop
    ((20.0, (15.0, 25.0)), (14.0, (13.0, 15.0)), FAILS),  # the swap drops as much: content, not position
    ((20.0, (15.0, 25.0)), None, INCONCLUSIVE),  # no null to compare with
    ((20.0, None), (1.0, None), HOLDS),  # results without intervals: the points decide
])
def test_c2_reads_the_all_positional_set_against_its_null(treated, null, result):
    assert (MIN_DROP, CONTROL_FACTOR) == (10.0, 2.0)
    c = claim({"m": {"ape_permute": ape(treated, null, row_col=(30.0, (25.0, 35.0)))}}, "C2")
    nums = c["numbers"]["m"]
    assert nums["result"] == result
    assert nums["all_positional_drop"] == treated[0] and nums["drop_points"] == 30.0  # row+col: reported only
    assert "all positional (row+col+mixed) (40)" in c["text"] and "row+col (10)" in c["text"]


def test_c2_a_random_control_that_moves_the_label_does_not_decide():
    """On a spatial task permuting content latents moves the label too (the issue's 62.6 vs 62.5): it is
    reported, and the swap null decides."""
    doc = ape((60.0, (55.0, 65.0)), (0.5, (0.0, 1.0)), random=(60.0, (55.0, 65.0)))
    c = claim({"m": {"ape_permute": doc}}, "C2")
    assert c["verdict"] == "supported" and c["numbers"]["m"]["all_positional_control_drop"] == 60.0


def test_c2_states_the_drop_as_a_fraction_of_the_position_gain():
    models = {"ape": {"data": "shapes", "scheme": "ape", "ape_permute": ape((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0)))},
              "none": {"data": "shapes", "scheme": "none", "eval": {"top1": 0.5}}}
    nums = claim(models, "C2")["numbers"]["ape"]
    assert nums["position_gain_points"] == pytest.approx(40.0) and nums["drop_fraction_of_position_gain"] == 0.5


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
    """A rope_heads result with these drops; drop intervals `cis` (default: the points) and paired
    margins drop(primary) - drop(head) as points."""
    L, H = len(drops), len(drops[0])
    order = sorted(((d, lyr, h) for lyr, row in enumerate(drops) for h, d in enumerate(row)), reverse=True)
    top = drops[primary[0]][primary[1]]
    return {"layers": list(range(L)), "num_heads": H, "restore_from": 1, "drop_points": drops,
            "primary_rebuilding_head": primary, "largest_drop_head": list(order[0][1:]),
            "primary_head_drop_rank": 1 + [list(o[1:]) for o in order].index(primary),
            "primary_head_drop_rank_after_R": None, "primary_is_largest_drop": list(order[0][1:]) == primary,
            "drop_ci95": cis if cis is not None else [[[d, d] for d in row] for row in drops],
            "primary_margin_ci95": [[None if [lyr, h] == primary else [top - d, top - d] for h, d in enumerate(row)]
                                    for lyr, row in enumerate(drops)]}


def test_c5_the_paired_margins_decide_not_the_marginal_intervals():
    drops = [[1.0, 2.0], [9.0, 3.0]]
    assert claim({"m": {"rope_heads": heads(drops, [1, 0])}}, "C5")["numbers"]["m"]["result"] == HOLDS
    assert claim({"m": {"rope_heads": heads(drops, [1, 1])}}, "C5")["numbers"]["m"]["result"] == FAILS
    wide = [[[d - 4, d + 4] for d in row] for row in drops]  # overlapping drop intervals: the margins decide
    c = claim({"m": {"rope_heads": heads(drops, [1, 0], wide)}}, "C5")
    assert c["numbers"]["m"]["result"] == HOLDS and c["numbers"]["m"]["primary_drop_ci95"] == [5.0, 13.0]
    doc = heads(drops, [1, 0])
    doc["primary_rebuilding_head"], doc["primary_margin_ci95"] = None, None  # no primary head: nothing holds
    assert claim({"m": {"rope_heads": doc}}, "C5")["numbers"]["m"]["result"] == FAILS


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
    from vitpos.claims.inputs import model_family

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
    heads = {h["family"]: h for h in c["headlines"]}  # the family's headline: the seeds' mean and t interval
    assert list(heads) == ["builtin:ape", "other:ape"]
    assert heads["builtin:ape"]["value"] == pytest.approx(mean) and heads["builtin:ape"]["ci95"] == pytest.approx(ci)
    assert heads["builtin:ape"]["holds"] == 2 and heads["builtin:ape"]["models"] == fam["models"]
    assert heads["other:ape"]["models"] == ["other:ape"] and heads["other:ape"]["value"] == pytest.approx(0.8)


def test_the_summary_carries_typed_pieces_per_model_family():
    """Two seeds of one family fold into one headline: 'holds on 2/2 seeds', the mean of the seeds'
    all-positional drops with their Student-t interval; a family of one model gets that model's own
    number and interval; the verdict, one sentence, and each model's reading (folded in the report)."""
    from vitpos.analysis.stats import seed_interval
    from vitpos.claims.verdict import ClaimVerdict

    held = ape((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0)))
    held2 = ape((22.0, (18.0, 26.0)), (1.0, (0.0, 2.0)))
    unsure = ape((12.0, (8.0, 16.0)), (1.0, (0.0, 2.0)))
    s = summarise({"builtin:ape": inputs({"ape_permute": held}), "builtin:ape-seed1": inputs({"ape_permute": held2}),
                   "timm:vit<b>": inputs({"ape_permute": unsure})})
    c2 = next(c for c in s.claims if c.id == "C2")
    assert c2.verdict == "partly supported"
    two, one = c2.headlines
    mean, ci = seed_interval([20.0, 22.0])
    # two seeds: a t-interval with one degree of freedom, wide enough to straddle C2.min_drop (FAMILY_RULE)
    family = f"family inconclusive (2/2 seeds hold; seed interval [{ci[0]:.3g}, {ci[1]:.3g}] straddles C2.min_drop 10)"
    assert (two.family, two.models, two.holds, two.seeds_text()) == (
        "builtin:ape", ["builtin:ape", "builtin:ape-seed1"], 2, f"holds on 2/2 seeds; {family}")
    assert two.value == pytest.approx(mean) and two.ci95 == pytest.approx(ci) and two.number == "all_positional_drop"
    # each model's number from one SAE seed (issue 48); the family's interval is over the model seeds
    assert two.sae_seeds == 1 and two.interval_sources == ["model_seeds"]
    assert two.text() == (f"builtin:ape: {mean:.1f} [{ci[0]:.1f}, {ci[1]:.1f}] pts (1 SAE seed), holds on 2/2 seeds; "
                          f"{family}")
    # one model: the family's headline is the model's own number and interval
    assert one.family == "timm:vit<b>" and one.seeds_text() == "inconclusive"
    assert one.value == c2.numbers["timm:vit<b>"]["all_positional_drop"] == 12.0
    assert one.ci95 == c2.numbers["timm:vit<b>"]["all_positional_drop_ci95"] == [8.0, 16.0]
    assert c2.sentence.startswith("Holds on 2 of 3 APE models (inconclusive on 1)") and c2.sentence.count(".") <= 2
    assert set(c2.details) == {"builtin:ape", "builtin:ape-seed1", "timm:vit<b>"}
    assert c2.details["timm:vit<b>"].startswith("timm:vit<b>: top-1 drop when permuting")
    # it round-trips through results.json, without the older prose field
    doc = c2.model_dump(mode="json")
    assert "evidence" not in doc and ClaimVerdict.model_validate(doc) == c2
    # C1 (the smaller of two selectivities): its interval on one model is the ends' minima
    c1 = claim({"m": {"sae": sae((0.7, 0.9), (0.65, 0.95))}}, "C1")
    assert c1["headlines"][0]["value"] == pytest.approx(0.8) and c1["headlines"][0]["ci95"] == [0.65, 0.9]
    none = claim({}, "C3")
    assert none["headlines"] == [] and none["sentence"] == "No RoPE model was run."


def test_results_written_before_the_typed_pieces_keep_their_evidence():
    """An older results.json's claims (one `evidence` string, no pieces) load as they are."""
    from vitpos.claims.verdict import ClaimVerdict

    old = copy.deepcopy(GOLDEN["summary"]["claims"][1])
    assert "evidence" in old and "headlines" not in old
    c = ClaimVerdict.model_validate(old)
    assert c.text() == old["evidence"] and c.headlines == []
    assert c.model_dump(mode="json")["evidence"] == old["evidence"]


# ---------------------------------------------------------------- C3, C4
def axis_doc(removed=(0.9, 0.9), kept=(1.0, 1.0), removal=None, recs=(0.5, 0.5), median=None) -> dict:
    """A rope_axis result whose fractions come out as given: chance 0.25, baseline 0.75 at both
    layers (0.5 above chance), and a third layer too close to chance to count. removal / median:
    the measured intervals (None: undefined intervals, the points decide)."""
    def acc(frac):
        return [0.25 + 0.5 * frac, 0.25 + 0.5 * frac, 0.27]

    def cond(row, col, top1, axis=None):
        return {"row_acc": row, "col_acc": col, "row_acc_orig_probe": row, "col_acc_orig_probe": col, "top1": top1,
                "per_group": {}, "axis": axis, "restore_from": None}

    def rec(x):
        return {"layers": [0, 1, 2], "rec": [None, None, x], "mean_rec": x}

    base = cond([0.75, 0.75, 0.27], [0.75, 0.75, 0.27], 0.9)
    doc = {"chance_row": 0.25, "chance_col": 0.25, "layers": [0, 1, 2],
           "conditions": {"baseline": base,
                          "no_row": cond(acc(1 - removed[0]), acc(kept[0]), 0.5, "row"),
                          "no_col": cond(acc(kept[1]), acc(1 - removed[1]), 0.6, "col")},
           "recovery": {"row": {"2": rec(recs[0])}, "col": {"2": rec(recs[1])}}}
    doc["removal"] = {f"no_{a}": {"removed": removed[i], "kept": kept[i], "removed_layers": [0, 1],
                                  "removed_ci95": None if removal is None else list(removal[i][0]),
                                  "kept_ci95": None if removal is None else list(removal[i][1]),
                                  "kept_layers": [0, 1]} for i, a in enumerate(("row", "col"))}
    doc["median_recovery"] = {a: {"median_rec": recs[i], "median_rec_ci95": None if median is None else list(median[i]),
                                  "restore_points": [2]} for i, a in enumerate(("row", "col"))}
    return doc


SURE = ((0.85, 0.95), (0.9, 1.1))  # removed, kept intervals wholly on the rule's side


@pytest.mark.parametrize("removal, result", [
    (None, HOLDS),  # undefined intervals: the point values decide
    ((SURE, SURE), HOLDS),
    ((((0.6, 0.95), (0.9, 1.1)), SURE), INCONCLUSIVE),  # MIN_REMOVED = 0.7 inside no_row's removed interval
    ((SURE, ((0.85, 0.95), (0.65, 1.1))), INCONCLUSIVE),  # MIN_KEPT = 0.7 inside no_col's kept interval
    ((((0.3, 0.6), (0.9, 1.1)), SURE), FAILS),  # surely removes < 0.7 (the point says 0.9: the interval decides)
    ((SURE, ((0.85, 0.95), (0.3, 0.5))), FAILS),
])
def test_c3_reads_the_removal_intervals(removal, result):
    values = rule_set().values()
    assert (values["C3.min_removed"], values["C3.min_kept"]) == (0.7, 0.7)
    c = claim({"m": {"rope_axis": axis_doc(removal=removal)}}, "C3")
    nums = c["numbers"]["m"]
    assert nums["result"] == result
    assert nums["no_row_row_removed"] == pytest.approx(0.9) and nums["no_col_row_kept"] == pytest.approx(1.0)
    if removal is not None:
        assert nums["no_row_row_removed_ci95"] == list(removal[0][0]) and nums["no_col_row_kept_ci95"] == list(
            removal[1][1])
        assert f"[{100 * removal[0][0][0]:.0f}%, {100 * removal[0][0][1]:.0f}%]" in c["text"]


@pytest.mark.parametrize("removed, kept, result", [
    ((0.9, 0.8), (0.9, 1.2), HOLDS), ((0.6, 0.9), (1.0, 1.0), FAILS), ((0.9, 0.9), (0.69, 1.0), FAILS)])
def test_c3_without_intervals_keeps_the_point_rule(removed, kept, result):
    """Undefined intervals: the point-value verdicts (the layer too close to chance is left out, so
    the fractions are the constructed ones)."""
    nums = claim({"m": {"rope_axis": axis_doc(removed, kept)}}, "C3")["numbers"]["m"]
    assert nums["result"] == result
    assert nums["no_col_col_removed"] == pytest.approx(removed[1]) and nums["no_row_col_kept"] == pytest.approx(kept[0])
    assert nums["no_row_row_removed_ci95"] is None


def rope_heads_doc(S: float, S_ci=None) -> dict:
    """S_ci None: the primary head's |S| interval is the point [S, S]."""
    doc = heads([[1.0, 2.0], [9.0, 3.0]], [1, 0])
    doc["axis_index"] = [[0.0, 0.1], [S, 0.2]]
    doc["specialised_heads"] = [[1, 0]] if abs(S) >= 0.5 else []
    doc["axis_index_ci95"] = [[[-0.1, 0.1], [0.0, 0.2]], [list(S_ci) if S_ci is not None else [S, S], [0.1, 0.3]]]
    return doc


@pytest.mark.parametrize("recs, median, S, S_ci, result", [
    ((0.5, 0.4), None, 0.7, None, HOLDS),  # point intervals: the points decide
    ((0.5, 1.2), None, 0.7, None, FAILS),
    ((0.5, 0.4), None, 0.3, None, FAILS),
    ((0.5, 0.4), ((0.3, 0.7), (0.2, 0.6)), 0.7, (0.6, 0.8), HOLDS),
    ((0.5, 0.4), ((0.3, 0.7), (0.2, 0.6)), -0.7, (-0.8, -0.6), HOLDS),  # |S|: a column-specialised head counts
    ((0.5, 0.9), ((0.3, 0.7), (0.8, 1.05)), 0.7, (0.6, 0.8), INCONCLUSIVE),  # 1 inside the col interval
    ((0.1, 0.4), ((-0.05, 0.3), (0.2, 0.6)), 0.7, (0.6, 0.8), INCONCLUSIVE),  # 0 inside the row interval
    ((0.5, 1.2), ((0.3, 0.7), (1.0, 1.4)), 0.7, (0.6, 0.8), FAILS),  # surely no partial col recovery
    ((0.5, 0.4), ((0.3, 0.7), (0.2, 0.6)), 0.6, (0.4, 0.8), INCONCLUSIVE),  # 0.5 inside the |S| interval
    ((0.5, 0.4), ((0.3, 0.7), (0.2, 0.6)), -0.1, (-0.6, 0.3), INCONCLUSIVE),  # |S| in [0, 0.6]
    ((0.5, 0.4), ((0.3, 0.7), (0.2, 0.6)), 0.3, (0.1, 0.45), FAILS),  # surely not specialised
])
def test_c4_reads_the_recovery_and_axis_index_intervals(recs, median, S, S_ci, result):
    ra = axis_doc(recs=recs, median=median)
    c = claim({"m": {"rope_axis": ra, "rope_heads": rope_heads_doc(S, S_ci)}}, "C4")
    nums = c["numbers"]["m"]
    assert nums["result"] == result
    assert nums["median_recovery_row"] == recs[0] and nums["primary_axis_index"] == S
    assert nums["primary_axis_index_ci95"] == ([S, S] if S_ci is None else list(S_ci))
    assert nums["median_recovery_col_ci95"] == (None if median is None else list(median[1]))
    if S_ci is not None:
        assert f"[{S_ci[0]:.2f}, {S_ci[1]:.2f}]" in c["text"]


def test_c4_without_a_recovery_fails():
    ra = axis_doc()
    ra["recovery"]["row"]["2"]["mean_rec"] = None  # nothing to recover at any R: an undefined median
    assert claim({"m": {"rope_axis": ra, "rope_heads": rope_heads_doc(0.7)}}, "C4")["numbers"]["m"]["result"] == FAILS


def test_an_undefined_headline_says_why():
    """A model whose headline number cannot be computed says why beside its 'n/a' (the report showed
    'n/a, fails' with no reason): C4 with nothing removed to recover on either axis."""
    ra = axis_doc()
    for axis in ("row", "col"):
        for point in ra["recovery"][axis].values():
            point["mean_rec"] = None
    c = claim({"m": {"rope_axis": ra, "rope_heads": rope_heads_doc(0.7)}}, "C4")
    (head,) = c["headlines"]
    assert head["value"] is None and "nothing to recover" in head["why_undefined"]
    from vitpos.claims.verdict import FamilyHeadline
    assert FamilyHeadline.model_validate(head).value_text().startswith("n/a (removing the rotations")


def test_inside_and_magnitude():
    from vitpos.claims.intervals import inside, magnitude

    assert inside((0.2, 0.8), 0, 1) == HOLDS and inside((0.0, 0.8), 0, 1) == INCONCLUSIVE
    assert inside((-0.3, 0.0), 0, 1) == FAILS and inside((1.0, 1.3), 0, 1) == FAILS
    assert inside(None, 0, 1) == FAILS and inside((float("nan"), float("nan")), 0, 1) == FAILS
    assert magnitude((0.2, 0.4)) == (0.2, 0.4) and magnitude((-0.4, -0.2)) == (0.2, 0.4)
    assert magnitude((-0.6, 0.3)) == (0.0, 0.6) and magnitude(None) is None


def test_rules_are_data_and_survive_python_OO():
    """The rules the summary records come from data, not from a docstring (python -OO strips those):
    one rule per claim, each naming its claim and thresholds, the same text with and without -OO."""
    import subprocess
    import sys

    from vitpos.claims.registry import BY_ID, CLAIMS
    from vitpos.claims.summary import rules_text

    assert [c.id for c in CLAIMS] == ["C1", "C2", "C3", "C4", "C5"]
    assert all(c.rule.lstrip().startswith(f"{c.id} (") for c in CLAIMS)
    assert "C2.min_drop" in BY_ID["C2"].rule and "C1.selective" in BY_ID["C1"].rule
    assert "C1.min_top1_drop = 5 points" in rules_text()  # the rule set's values are part of the text
    code = ("import vitpos.claims.summary as c; assert c.__doc__ is None; "
            "import sys; sys.stdout.write(c.summarise({}).rules)")
    proc = subprocess.run([sys.executable, "-OO", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == rules_text() == summarise({}).rules
    assert all(c.rule in proc.stdout for c in CLAIMS)


def test_a_number_that_cannot_be_right_prints_as_na():
    """NaN (e.g. Rec when removing the rotations removed nothing) and None never print as 'nan' / 'None'."""
    import numpy as np

    from vitpos.claims import text

    assert text.f(float("nan")) == "n/a" and text.f(None) == "n/a" and text.f(np.float32(0.5)) == "0.50"
    assert text.iv((float("nan"), float("nan"))) == "" and text.iv((0.1, 0.2)) == " [0.10, 0.20]"
    assert text.pc(float("inf")) == "n/a" and text.pc(0.25) == "25%"
    assert text.pc_iv((0.1, float("nan"))) == ""


# ---------------------------------------------------------------- C1 / C2 over the layer sweep (sae_layers)
HOLD_SAE, FAIL_SAE = sae((0.7, 0.9), (0.65, 0.95)), sae((0.2, 0.5), (0.65, 0.95))
HOLD_APE, FAIL_APE = ape((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0))), ape((4.0, (2.0, 6.0)), (1.0, (0.0, 2.0)))


def layer_sweep(per_layer: list[tuple[dict, dict]], freq: list[float]):
    """A sae_layers result: at layer i the SAE result and the ape_permute result per_layer[i] (constructed
    as above) and selection frequency freq[i]. The results each point recorded (`c1`, `c2`) are set to
    'fails' on purpose: the claims re-read the typed results with their own rules."""
    from vitpos.results.sae_layers import LayerPoint, SAELayersResult, SweepClaim
    from vitpos.results.sae_run import GivenSAEResult

    points = []
    for i, ((sae_doc, ape_doc), f) in enumerate(zip(per_layer, freq, strict=True)):
        m = inputs({"sae": {**sae_doc, "layer": i}, "ape_permute": ape_doc})
        assert m.sae is not None and m.ape_permute is not None
        points.append(LayerPoint(layer=i, fvu=0.2, n_row=3, n_col=2, n_mixed=0, c1=FAILS, c2=FAILS, c1_numbers={},
                                 c2_numbers={}, all_positional_drop=None, all_positional_drop_ci95=None,
                                 swap_null_drop=None, selection_frequency=f,
                                 sae=GivenSAEResult.model_validate(m.sae.to_json()), permute=m.ape_permute))
    over = SweepClaim(result=FAILS, per_plausible_layer={})
    n = len(points)
    return SAELayersResult(model="m", data="toy", layers=list(range(n)), layer_rule=f"every layer 0..{n - 1}",
                           points=points, selected_layer=0, plausible_layers=[], c1=over, c2=over, sae_images=8,
                           sae_eval_images=8, sae_epochs=1, sae_expansion=2, sae_k=4, permute_images=8, seeds=[0])


def swept(single: tuple[dict, dict], per_layer: list[tuple[dict, dict]], freq: list[float]) -> ClaimInputs:
    base = inputs({"sae": single[0], "ape_permute": single[1]})
    return ClaimInputs(sae=base.sae, ape_permute=base.ape_permute, sae_layers=layer_sweep(per_layer, freq))


def sweep_claim(m: ClaimInputs, cid: str):
    return next(c for c in summarise({"m": m}).claims if c.id == cid)


def test_sweep_the_claims_hold_when_they_hold_at_every_plausible_layer():
    """Layers 0 and 1 plausible (60 %, 38 %), both hold; layer 2 fails but is chosen in 2 % of the
    resamples (< 5 %): supported, though the single layer (the sae stage's) fails."""
    m = swept((FAIL_SAE, FAIL_APE), [(HOLD_SAE, HOLD_APE), (HOLD_SAE, HOLD_APE), (FAIL_SAE, FAIL_APE)],
              [0.6, 0.38, 0.02])
    for cid in ("C1", "C2"):
        c = sweep_claim(m, cid)
        nums = c.numbers["m"]
        assert c.verdict == "supported" and nums["result"] == HOLDS
        assert nums["plausible_sites"] == ["L0", "L1"]
        assert nums["per_site_result"] == {"L0": HOLDS, "L1": HOLDS, "L2": FAILS}
        assert nums["single_layer_result"] == FAILS  # the single-layer reading, beside it
        text = c.details["m"]
        assert "plausible sites" in text and "L0 (selected in 60%): holds" in text and "L1 (selected in 38%)" in text
        assert "Single layer" in text
    c1 = sweep_claim(m, "C1")
    assert {x.threshold for x in c1.sensitivity or []} >= {"C1.plausible_layer"}  # its curve, with the sweep
    # the plausible share at 0.01 takes layer 2 in: the claim is then inconclusive
    curve = next(x for x in c1.sensitivity or [] if x.threshold == "C1.plausible_layer").curve
    assert curve[0].value == 0.01 and curve[0].verdict == "inconclusive" and curve[1].verdict == "supported"


def test_sweep_the_headline_is_the_number_the_verdict_read():
    """Read over the sweep, the headline is the plausible (selected) site's number, not the single layer's:
    the single layer fails at 4.0 pts, L0 holds at 20.0: C2's headline is 20.0 read at L0, with the single
    layer's numbers kept beside it (the report's table once printed the single layer's number next to the
    sweep's verdict)."""
    from vitpos.claims.registry import BY_ID
    from vitpos.claims.summary import headline_interval, headline_value

    m = swept((FAIL_SAE, FAIL_APE), [(HOLD_SAE, HOLD_APE), (FAIL_SAE, FAIL_APE)], [0.97, 0.03])
    nums = sweep_claim(m, "C2").numbers["m"]
    assert nums["headline_site"] == "L0" and nums["result"] == HOLDS
    assert headline_value(BY_ID["C2"], nums) == 20.0 and headline_interval(BY_ID["C2"], nums) == [15.0, 25.0]
    assert headline_value(BY_ID["C2"], nums["single_layer_numbers"]) == 4.0
    # with the other site plausible instead, its number is the headline
    m = swept((HOLD_SAE, HOLD_APE), [(HOLD_SAE, HOLD_APE), (FAIL_SAE, FAIL_APE)], [0.03, 0.97])
    nums = sweep_claim(m, "C2").numbers["m"]
    assert nums["headline_site"] == "L1" and headline_value(BY_ID["C2"], nums) == 4.0
    headline = sweep_claim(m, "C2").headlines[0]
    assert headline.site == "L1" and "at L1" in headline.value_text()  # the table says where the number is from


def test_sweep_the_claims_are_inconclusive_when_they_hold_at_some_plausible_layers_only():
    m = swept((HOLD_SAE, HOLD_APE), [(HOLD_SAE, HOLD_APE), (FAIL_SAE, FAIL_APE), (HOLD_SAE, HOLD_APE)],
              [0.5, 0.3, 0.2])
    for cid in ("C1", "C2"):
        c = sweep_claim(m, cid)
        assert c.numbers["m"]["result"] == INCONCLUSIVE and c.verdict == "inconclusive"
        assert c.numbers["m"]["single_layer_result"] == HOLDS
    m = swept((HOLD_SAE, HOLD_APE), [(FAIL_SAE, FAIL_APE), (FAIL_SAE, FAIL_APE)], [0.7, 0.3])
    assert sweep_claim(m, "C1").numbers["m"]["result"] == FAILS  # fails at every plausible layer


def test_sweep_less_results_read_as_before():
    """No sae_layers result (quick runs, results written before it): the single layer decides, the numbers
    and text are the version-2 reading's and no curve needs the sweep."""
    plain = inputs({"sae": HOLD_SAE, "ape_permute": FAIL_APE})
    for cid, want in (("C1", HOLDS), ("C2", FAILS)):
        c = sweep_claim(plain, cid)
        assert c.numbers["m"]["result"] == want and "read_over" not in c.numbers["m"]
        assert "plausible" not in c.details["m"]
        assert not any(x.threshold.endswith("plausible_layer") for x in c.sensitivity or [])


def test_the_position_gain_reads_the_none_model_of_the_same_seed():
    """C2's drop as a fraction of the position gain (clean minus `none` top-1) takes the `none` model of
    the model's own training seed where it ran (the zoo's `none` seeds differ by up to 9 points)."""
    from types import SimpleNamespace
    from typing import Any, cast

    from vitpos.claims.inputs import none_top1, seed_of

    def run(scheme: str, top1: float) -> Any:
        return SimpleNamespace(scheme=scheme, data="pairs", eval=SimpleNamespace(top1=top1))

    models = cast(Any, {"builtin:pairs-none": run("none", 0.721), "builtin:pairs-none-seed1": run("none", 0.710),
                        "builtin:pairs-ape-seed1": run("ape", 1.0), "builtin:pairs-ape-seed2": run("ape", 1.0)})
    assert [seed_of(s) for s in models] == [0, 1, 1, 2]
    assert none_top1(models, "pairs", "builtin:pairs-ape-seed1") == 0.710
    assert none_top1(models, "pairs", "builtin:pairs-ape") == 0.721
    assert none_top1(models, "pairs", "builtin:pairs-ape-seed2") == 0.721  # no seed-2 none ran: the first
    assert none_top1(models, "shapes", "builtin:pairs-ape-seed1") is None  # none on other data does not count


def test_c3s_none_floor_is_the_none_model_of_the_same_data_and_seed_whatever_the_name():
    """C3's floor reads the `none` model's probes: found by scheme, data and seed, so the hybrid
    `pairs-rope-mixed-ape` gets `pairs-none` (a name rule looked for a `pairs-none-ape` that no zoo has)."""
    from types import SimpleNamespace
    from typing import Any, cast

    from vitpos.claims.inputs import matched_none

    def run(scheme: str, probe: str | None) -> Any:
        return SimpleNamespace(scheme=scheme, data="pairs", probe=probe)

    models = cast(Any, {"builtin:pairs-none": run("none", "none-0"), "builtin:pairs-none-seed1": run("none", "none-1"),
                        "builtin:shapes-none-seed2": SimpleNamespace(scheme="none", data="shapes", probe="other"),
                        "builtin:pairs-rope-mixed-ape-seed1": run("rope-mixed", None),
                        "builtin:pairs-rope-axial": run("rope", None),
                        "builtin:pairs-rope-axial-seed2": run("rope", None)})
    assert matched_none("builtin:pairs-rope-mixed-ape-seed1", models) == "none-1"
    assert matched_none("builtin:pairs-rope-axial", models) == "none-0"
    assert matched_none("builtin:pairs-rope-axial-seed2", models) == "none-0"  # no pairs seed-2 none: the first


def test_a_seed_interval_stays_inside_the_range_its_number_can_take():
    """A Student-t interval over two seeds is wide; a selectivity lies in [-1, 1] and a top-1 drop in
    [-100, 100] points, so the family's interval is cut there (the zoo's `ape` C1 gave [-3.14, 4.39])."""
    from vitpos.claims.base import ModelClaim
    from vitpos.claims.registry import BY_ID
    from vitpos.claims.summary import seed_summaries

    def c1(sel: float) -> ModelClaim:
        return ModelClaim(result=HOLDS, numbers={"row_selectivity_pooled": sel, "col_selectivity_pooled": 1.0})

    s = seed_summaries(BY_ID["C1"], [("builtin:pairs-ape", c1(0.33)), ("builtin:pairs-ape-seed1", c1(0.92))])
    ci = s["builtin:pairs-ape"].ci95
    assert ci is not None and ci == [-1.0, 1.0] and s["builtin:pairs-ape"].mean == pytest.approx(0.625)
    s = seed_summaries(BY_ID["C1"], [("builtin:pairs-ape", c1(0.50)), ("builtin:pairs-ape-seed1", c1(0.52))])
    ci = s["builtin:pairs-ape"].ci95
    assert ci is not None and ci == pytest.approx([0.51 - 0.127062, 0.51 + 0.127062], abs=1e-5)  # inside: untouched


def test_a_family_holds_only_when_every_seed_holds_and_the_seed_interval_clears_the_threshold():
    """FAMILY_RULE (issue 48): the seeds' interval of the headline number is read against the threshold
    the rule holds it to (C2: C2.min_drop = 10 pts); a family whose seeds all hold but whose interval
    straddles it is inconclusive, one whose interval lies below it fails whatever its seeds say."""
    from vitpos.claims.base import ModelClaim
    from vitpos.claims.registry import BY_ID
    from vitpos.claims.summary import seed_summaries

    t = rule_set().values()
    assert t["C2.min_drop"] == 10.0

    def family(*pts: tuple[str, float]) -> str | None:
        found = [(f"builtin:ape{'' if i == 0 else f'-seed{i}'}",
                  ModelClaim(result=r, numbers={"all_positional_drop_pooled": d})) for i, (r, d) in enumerate(pts)]
        return seed_summaries(BY_ID["C2"], found, t)["builtin:ape"].family_result

    assert family((HOLDS, 30.0), (HOLDS, 31.0), (HOLDS, 29.5)) == HOLDS  # interval ~[28.6, 31.4]
    assert family((HOLDS, 11.0), (HOLDS, 30.0), (HOLDS, 12.0)) == INCONCLUSIVE  # every seed holds, wide interval
    assert family((HOLDS, 30.0), (FAILS, 2.0), (HOLDS, 29.0)) == INCONCLUSIVE
    assert family((HOLDS, 5.0), (HOLDS, 6.0), (HOLDS, 5.5)) == FAILS  # interval below 10 (seeds' own intervals aside)
    assert family((FAILS, 30.0), (FAILS, 31.0)) == FAILS
    two = [(spec, ModelClaim(result=HOLDS, numbers={"all_positional_drop_pooled": d}))
           for spec, d in (("builtin:ape", 30.0), ("builtin:ape-seed1", 31.0))]
    assert seed_summaries(BY_ID["C2"], two)["builtin:ape"].family_result is None  # no thresholds: no family result


def test_a_family_without_one_headline_threshold_reads_its_seeds_verdicts():
    from vitpos.claims.registry import BY_ID
    from vitpos.claims.summary import family_result

    assert BY_ID["C5"].headline.threshold is None
    t = rule_set().values()
    assert family_result(BY_ID["C5"], [HOLDS, HOLDS], [1.0, 9.0], t)[0] == HOLDS
    assert family_result(BY_ID["C5"], [HOLDS, FAILS], [1.0, 9.0], t)[0] == INCONCLUSIVE
    assert family_result(BY_ID["C5"], [FAILS, FAILS], [1.0, 9.0], t)[0] == FAILS
    for c in BY_ID.values():  # a named threshold is one of the claim's own, so the rule can read it
        assert c.headline.threshold is None or c.headline.threshold in t and c.headline.threshold.startswith(c.id)


def test_rules_hash_every_claims_thresholds_and_each_one_moves_its_verdict():
    """C3-C5's thresholds are in the hashed rule set (version 4), and each is read by its rule: moving
    one across the measured interval moves the verdict (a threshold nothing reads would leave it)."""
    rules = rule_set()
    from vitpos.claims.rules import CHANGES, VERSION

    assert rules.version == VERSION == max(CHANGES) and sorted(CHANGES) == list(range(1, VERSION + 1))
    names = {t.name for t in rules.thresholds}
    assert {"C3.min_removed", "C3.min_kept", "C3.max_kept", "C4.min_head_share", "C5.min_margin"} <= names
    for name in ("C3.min_removed", "C3.min_kept", "C3.max_kept"):
        moved = rules.model_copy(update={"thresholds": tuple(
            t.model_copy(update={"value": 0.8}) if t.name == name else t for t in rules.thresholds)})
        assert moved.digest() != rules.digest()
    from vitpos.claims.c3 import CLAIM as C3

    m = inputs({"rope_axis": axis_doc(removal=(SURE, SURE))})
    x = C3.view("m", m, {"m": m})
    assert x is not None
    at = {**rules.values()}
    assert C3.read_view("m", x, at).result == HOLDS  # removed [0.85, 0.95], kept [0.9, 1.1]
    assert C3.read_view("m", x, {**at, "C3.min_removed": 0.9}).result == INCONCLUSIVE
    assert C3.read_view("m", x, {**at, "C3.min_removed": 0.96}).result == FAILS
    assert C3.read_view("m", x, {**at, "C3.min_kept": 1.2}).result == FAILS
    assert C3.read_view("m", x, {**at, "C3.max_kept": 1.0}).result == INCONCLUSIVE  # kept [0.9, 1.1] reaches above
    assert C3.read_view("m", x, {**at, "C3.max_kept": 0.85}).result == FAILS  # wholly above: an interaction


def test_c2_reads_the_position_budget():
    """Rules version 7 (issue 47 item 2): the all-positional set's share of the APE-table shuffle's drop must
    reach C2.min_budget_share (0.5): 0.29 [0.21, 0.36] fails, [0.45, 0.9] is undecided, [0.55, 0.9] holds; a
    result written before the budget is read without the condition, and says why it has none."""
    base = ape((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0)))

    def budget(share, ci) -> dict:
        return {**base, "position_budget": {"all_positional": {"share": share, "share_ci95": list(ci),
                                                               "edit_drop": 20.0, "shuffle_drop": 70.0}}}
    assert rule_set().values()["C2.min_budget_share"] == 0.5
    s = summarise({"a": inputs({"ape_permute": budget(0.29, (0.21, 0.36))}), "b": inputs({"ape_permute": base}),
                   "c": inputs({"ape_permute": budget(0.7, (0.45, 0.9))}),
                   "d": inputs({"ape_permute": budget(0.7, (0.55, 0.9))})})
    c2 = next(c for c in s.claims if c.id == "C2")
    a, b = c2.numbers["a"], c2.numbers["b"]
    assert (a["all_positional_budget"], a["all_positional_budget_ci95"]) == (0.29, [0.21, 0.36])
    assert "reproduces 29% [21%, 36%] of the APE-table shuffle's drop" in c2.details["a"]
    assert b["all_positional_budget"] is None and "before the position budget" in b["all_positional_budget_undefined"]
    assert "position budget undefined" in c2.details["b"]
    assert [c2.numbers[m]["result"] for m in "abcd"] == [FAILS, HOLDS, INCONCLUSIVE, HOLDS]
    names = {m: {r.name: r.outcome for r in c2.conditions[m]} for m in "abcd"}
    assert names["a"]["budget"] == FAILS and "budget" not in names["b"]
    assert "position budget >= 50%" in c2.details["a"]


def test_c2_an_undefined_budget_is_undecided_and_a_free_ape_shuffle_fails_the_precondition():
    """A defined shuffle with an undefined share (e.g. the set was skipped) leaves the budget undecided; an APE
    shuffle that costs ~nothing fails the precondition `ape_shuffle`, and the budget with it."""
    doc = {**ape((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0))),
           "position_budget": {"all_positional": {"share": None, "undefined": "all_positional was not run"}}}
    c = claim({"m": {"ape_permute": doc}}, "C2")
    conds = {r["name"]: r["outcome"] for r in c["conditions"]["m"]}
    assert conds["budget"] == INCONCLUSIVE and conds["ape_shuffle"] == HOLDS
    assert c["numbers"]["m"]["result"] == INCONCLUSIVE
    free = {**doc, "pos_embed_shuffle": variant(1.0, (0.0, 2.0), n=None)}
    c = claim({"m": {"ape_permute": free}}, "C2")
    conds = {r["name"]: r["outcome"] for r in c["conditions"]["m"]}
    assert conds["ape_shuffle"] == FAILS and conds["budget"] == FAILS and c["numbers"]["m"]["result"] == FAILS


@pytest.mark.parametrize("norm, result", [
    ((5.0, (2.0, 8.0)), HOLDS), ((18.0, (14.0, 22.0)), INCONCLUSIVE), ((40.0, (30.0, 50.0)), FAILS)])
def test_c2_beats_the_edit_norm_matched_control(norm, result):
    """The all-positional drop (20 [15, 25]) must lie above C2.norm_factor (1) x the norm-matched control's."""
    doc = {**ape((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0))), "norm_all_positional": variant(*norm, n=40)}
    c = claim({"m": {"ape_permute": doc}}, "C2")
    conds = {r["name"]: r for r in c["conditions"]["m"]}
    assert conds["above_norm_control"]["outcome"] == result and c["numbers"]["m"]["result"] == result
    assert conds["above_norm_control"]["numbers"]["norm_control_drop"] == list(norm[1])
    assert "edit-norm-matched control costs" in c["text"]


def test_c2_says_when_the_norm_control_could_not_be_matched():
    """Issue 47: with fewer non-positional latents than the positional set the control moves every one (its note)
    and its edit is another size: the condition's numbers carry both, beside the drops it compared."""
    unmatched = {**variant(58.7, (53.0, 64.0), n=82, note="only 82 live non-positional latents for a set of 152: "
                           "the control moves all 82"), "edit_norm": 1.25}
    doc = {**ape((49.0, (43.3, 55.0)), (10.7, (7.3, 14.3))), "norm_all_positional": unmatched}
    doc["all_positional"] = {**doc["all_positional"], "edit_norm": 2.99}
    conds = {r["name"]: r for r in claim({"m": {"ape_permute": doc}}, "C2")["conditions"]["m"]}
    nums = conds["above_norm_control"]["numbers"]
    assert conds["above_norm_control"]["outcome"] == INCONCLUSIVE  # 49 [43, 55] vs 58.7 [53, 64], as measured
    assert "moves all 82" in nums["norm_control_note"]
    assert (nums["norm_control_edit_norm"], nums["all_positional_edit_norm"]) == (1.25, 2.99)


def test_c3_says_no_rotary_position_where_no_layer_decodes_an_axis_above_its_floor():
    """An axis whose baseline is at chance everywhere (the rotations add nothing decodable) gives no
    fraction to read: C3 fails on its precondition `rotary_position`, naming the axis, and on every
    condition that reads the missing fraction (never on a made-up number)."""
    from vitpos.claims.c3 import CLAIM as C3

    doc = axis_doc(removal=(SURE, SURE))
    for cond in doc["conditions"].values():
        cond["col_acc"] = [0.25, 0.25, 0.25]
        cond["col_acc_orig_probe"] = [0.25, 0.25, 0.25]
    m = inputs({"rope_axis": doc})
    x = C3.view("m", m, {"m": m})
    assert x is not None
    got = C3.read_view("m", x, rule_set().values())
    readings = {r.name: r for r in got.conditions}
    assert got.result == FAILS and readings["rotary_position"].outcome == FAILS
    assert readings["rotary_position"].numbers["no_rotary_position"] == "col"
    both = inputs({"rope_axis": axis_doc(removal=(SURE, SURE))})
    y = C3.view("m", both, {"m": both})
    assert y is not None
    ok = C3.read_view("m", y, rule_set().values())
    assert ok.result == HOLDS and {r.name: r.outcome for r in ok.conditions}["rotary_position"] == HOLDS


# ---------------------------------------------------------------- SAE seeds (issue 48)
def pooled_effect(kind: str, sel_ci, per_sel=(0.8, 0.5, 0.9), drop=(0.3, (0.25, 0.35)), top1=(20.0, (15.0, 25.0))):
    other = "col" if kind == "row" else "row"
    return {f"{kind}_drop": drop[0], f"{kind}_drop_ci95": list(drop[1]), f"{other}_drop": 0.0,
            f"{other}_drop_ci95": [0.0, 0.0], "selectivity": sum(sel_ci) / 2, "selectivity_ci95": list(sel_ci),
            "top1_drop": top1[0], "top1_drop_ci95": list(top1[1]), "per_seed_row_drop": [drop[0]] * 3,
            "per_seed_col_drop": [0.0] * 3, "per_seed_selectivity": list(per_sel), "per_seed_top1_drop": [top1[0]] * 3}


def seed_pool(row_sel_ci, col_sel_ci=(0.65, 0.95)) -> dict:
    run = {"dir": "seeds/seed1", "fvu": 0.2, "row_features": [1], "col_features": [2], "mixed_features": [],
           "n_row_features": 1, "n_col_features": 1, "n_mixed_features": 0, "causal": None}
    ctrl = {"drop": (0.01, (0.0, 0.02)), "top1": (1.0, (0.0, 2.0))}
    return {"seeds": [0, 1, 2], "interval_sources": ["images", "sae_seeds"],
            "runs": [{**run, "seed": 1}, {**run, "seed": 2}],
            "ablate_row": pooled_effect("row", row_sel_ci), "ablate_col": pooled_effect("col", col_sel_ci),
            "control_row": pooled_effect("row", (0.5, 0.5), **ctrl), "control_col": pooled_effect("col", (0.5, 0.5),
                                                                                                   **ctrl)}


def test_c1_reads_the_interval_pooled_over_sae_seeds_and_reports_each_seed():
    """Seed 0's own removal holds ([0.7, 0.9]); pooled over 3 SAE seeds the row set's selectivity interval
    straddles C1.selective, so the model is inconclusive: the rule reads the pooled interval. Each seed's
    value is reported beside it, and the headline says its SAE seeds and what its interval covers."""
    alone = claim({"m": {"sae": sae((0.7, 0.9), (0.65, 0.95))}}, "C1")
    assert alone["numbers"]["m"]["result"] == HOLDS and alone["numbers"]["m"]["n_sae_seeds"] == 1
    assert alone["headlines"][0]["interval_sources"] == ["images"]
    doc = {**sae((0.7, 0.9), (0.65, 0.95)), "seed_pool": seed_pool((0.45, 0.85))}
    c = claim({"m": {"sae": doc}}, "C1")
    nums = c["numbers"]["m"]
    assert nums["result"] == INCONCLUSIVE and nums["row_selectivity_pooled_ci95"] == [0.45, 0.85]
    assert nums["row_selectivity_ci95"] == [0.7, 0.9]  # the run seed's own, under the keys it always had
    assert nums["row_selectivity_per_sae_seed"] == [0.8, 0.5, 0.9] and nums["n_sae_seeds"] == 3
    assert nums["interval_sources"] == ["images", "sae_seeds"] and nums["n_row_per_sae_seed"] == [3, 1, 1]
    head = c["headlines"][0]
    assert head["sae_seeds"] == 3 and head["interval_sources"] == ["images", "sae_seeds"]
    assert FamilyHeadline.model_validate(head).value_text().endswith("(3 SAE seeds)")
    assert "pooled over 3 SAE seeds" in c["text"] and "per SAE seed 0.80 / 0.50 / 0.90" in c["text"]
    pooled_ok = {**doc, "seed_pool": seed_pool((0.7, 0.85))}
    assert claim({"m": {"sae": pooled_ok}}, "C1")["numbers"]["m"]["result"] == HOLDS


def test_c2_reads_the_drop_and_null_pooled_over_sae_seeds():
    """Seed 0's all-positional drop clears its null; pooled over the SAE seeds the null rises to half the
    drop: C2 reads the pooled pair (fails), reporting each seed's drops."""
    doc = ape((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0)))
    assert claim({"m": {"ape_permute": doc}}, "C2")["numbers"]["m"]["result"] == HOLDS

    def pooled(drop, ci, per):
        return {"drop_points": drop, "drop_ci95": list(ci), "per_seed": list(per), "per_seed_n_features": [40, 30, 35]}
    doc["seed_pool"] = {"sae_seeds": [0, 1, 2], "interval_sources": ["images", "sae_seeds"], "variants": {
        "all_positional": pooled(15.0, (12.0, 18.0), (20.0, 10.0, 15.0)),
        "swap_all_positional": pooled(11.0, (10.0, 12.0), (1.0, 16.0, 16.0))}}
    c = claim({"m": {"ape_permute": doc}}, "C2")
    nums = c["numbers"]["m"]
    assert nums["result"] == FAILS and nums["all_positional_drop_pooled"] == 15.0
    assert nums["all_positional_drop_pooled_ci95"] == [12.0, 18.0]
    assert nums["swap_null_drop_pooled_ci95"] == [10.0, 12.0]
    assert nums["all_positional_drop"] == 20.0 and nums["swap_null_drop"] == 1.0  # the run seed's own
    assert nums["all_positional_drop_per_sae_seed"] == [20.0, 10.0, 15.0] and nums["n_sae_seeds"] == 3
    assert nums["n_all_positional_per_sae_seed"] == [40, 30, 35]
    assert c["headlines"][0]["sae_seeds"] == 3 and "pooled over 3 SAE seeds" in c["text"]


def test_c2_reads_the_budget_pooled_over_sae_seeds_and_the_norm_control_on_the_run_seed():
    """The run seed's budget holds (0.9 [0.8, 1.0]); pooled over the SAE seeds it is 0.4 [0.3, 0.45]: C2 reads the
    pooled one (fails). The norm-matched control exists for the run seed's SAE alone: it is compared with the
    run seed's drop (20 [15, 25], not the pooled 40 [35, 45]) and the text says so."""
    def pooled(drop, ci):
        return {"drop_points": drop, "drop_ci95": list(ci), "per_seed": [drop] * 3, "per_seed_n_features": [40] * 3}
    doc = {**ape((20.0, (15.0, 25.0)), (1.0, (0.0, 2.0))), "norm_all_positional": variant(22.0, (18.0, 26.0), n=40),
           "position_budget": {"all_positional": {"share": 0.9, "share_ci95": [0.8, 1.0]}}}
    doc["seed_pool"] = {"sae_seeds": [0, 1, 2], "interval_sources": ["images", "sae_seeds"], "variants": {
        "all_positional": pooled(40.0, (35.0, 45.0)), "swap_all_positional": pooled(1.0, (0.0, 2.0))},
        "budget": {"all_positional": {"share": 0.4, "share_ci95": [0.3, 0.45]}}}
    c = claim({"m": {"ape_permute": doc}}, "C2")
    conds = {r["name"]: r for r in c["conditions"]["m"]}
    assert conds["budget"]["outcome"] == FAILS and conds["budget"]["numbers"]["budget_pooled"] is True
    assert conds["above_norm_control"]["outcome"] == INCONCLUSIVE  # 20 [15, 25] vs 22 [18, 26]
    assert conds["above_norm_control"]["numbers"]["norm_compared_drop"] == [15.0, 25.0]
    assert "the run seed's SAE" in conds["above_norm_control"]["numbers"]["norm_read_on"]
    nums = c["numbers"]["m"]
    assert nums["all_positional_budget"] == 0.9 and nums["all_positional_budget_pooled"] == 0.4
    assert "pooled over the SAE seeds" in c["text"] and "measured on it alone" in c["text"]
