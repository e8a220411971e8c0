"""C2 (APE): permuting the positional features across patches drops top-1 by 24-31 points."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vitpos.claims import text as tx
from vitpos.claims.base import Condition, Headline, ModelClaim, RuleClaim
from vitpos.claims.c1 import PLAUSIBLE_SWEEP
from vitpos.claims.inputs import ClaimInputs, none_top1
from vitpos.claims.intervals import (
    FAILS,
    INCONCLUSIVE,
    Interval,
    Outcome,
    as_list,
    at_least,
    bounds,
    exceeds,
    known,
    outcome,
)
from vitpos.claims.layers import AtLayer, layer_reader, over_curve
from vitpos.claims.rules import FACTORS, Threshold, Thresholds
from vitpos.claims.verdict import Number
from vitpos.results.ape_permute import (
    MIN_SHUFFLE_DROP,
    ApePermuteResult,
    PositionBudget,
    VariantResult,
    position_budget,
    read_budget,
    shuffle_undefined,
)
from vitpos.results.sae_layers import PLAUSIBLE, LayerPoint

THRESHOLDS = (
    Threshold(name="C2.min_drop", claim="C2", value=10.0, unit="points",
              meaning="permuting all positional features drops top-1 by at least this",
              sweep=(0.0, 5.0, 10.0, 15.0, 20.0, 24.0, 31.0)),
    Threshold(name="C2.null_factor", claim="C2", value=2.0, unit="x",
              meaning="... and by more than this times the same-position cross-image swap of that set",
              sweep=FACTORS),
    Threshold(name="C2.min_budget_share", claim="C2", value=0.5, unit="fraction",
              meaning="... and that drop is at least this share of the APE-table shuffle's drop on the same images "
              "(the position budget, pooled over the SAE seeds: the SAE's positional latents carry the position "
              "the model reads)", sweep=(0.0, 0.25, 0.5, 0.75, 1.0)),
    Threshold(name="C2.norm_factor", claim="C2", value=1.0, unit="x",
              meaning="... and more than this times the edit-norm-matched control's drop (as many non-positional "
              "latents, matched on the size of the edit their permutation makes)", sweep=FACTORS),
    Threshold(name="C2.plausible_layer", claim="C2", value=PLAUSIBLE, unit="fraction",
              meaning="with the layer sweep (sae_layers): as C1.plausible_layer, for C2", sweep=PLAUSIBLE_SWEEP,
              needs="sae_layers"),
    Threshold(name="C2.study_low", claim="C2", value=24.0, unit="points", source="study",
              meaning="low end of the study's range (stated, not required)", sweep=(24.0,)),
    Threshold(name="C2.study_high", claim="C2", value=31.0, unit="points", source="study",
              meaning="high end of the study's range (stated, not required)", sweep=(31.0,)),
)

RULE = """  C2 (APE)  permuting ALL positional features (row + col + mixed: every live latent with
            eta2_pos >= min_eta2_pos) drops top-1 by >= C2.min_drop points, and the drop's
            interval lies above C2.null_factor x
            that of the same-position cross-image swap of the same set (another image's codes at
            the same patch: content moves, position stays, so it is null by construction for
            positional features); without that null the claim is inconclusive. The drop must also be
            >= C2.min_budget_share of the APE-table shuffle's drop on the same images (the position
            budget: the share of the position the model reads that the SAE's positional latents
            carry; its interval at or above the share, one reaching below it undecided, an undefined
            share undecided), and its interval must lie above C2.norm_factor x that of the
            edit-norm-matched control (as many non-positional latents, matched on the size of the
            edit their permutation makes: where moving content moves the label, moving positional
            latents proves nothing about position). Precondition `ape_shuffle`: shuffling the APE
            table itself costs top-1 (>= MIN_SHUFFLE_DROP = 2 points, its interval above 0: where a
            share of it is defined), else the model reads no position from it and there is none to
            find (fails, and the budget with it). Both drops are the
            mean over the sae stage's SAE training seeds (sae.claim_seeds: each seed's SAE types
            and permutes its own latents; permutation seeds averaged per image), their intervals a
            hierarchical bootstrap (SAE seeds, then images within each seed, the drop and its null
            on the same resample); the claim must hold on this pooled interval, each SAE seed's
            drop is reported beside it, not required (one SAE seed: the paired bootstrap over
            images); the budget is pooled the same way (the ratio of the pooled drops, its interval
            that of the ratio over the same resamples); the norm-matched control is measured on the
            run seed's SAE only, so above_norm_control compares the run seed's SAE's drop with it.
            Results written before the budget (or the norm control) are read without that condition.
            Reported beside it, not in the rule: the count/mass-matched random control (not a null
            on a spatial task), the crossed design (row features moved by whole
            columns, col features by whole rows: ~0 for real row / col features), each edit's
            norm, the drop per class group and as a fraction of the position gain (clean minus
            the `none` model's top-1 on the same data, where one ran), and whether the drop falls
            in the study's 24-31 (ImageNet's range: stated, not required). Where the layer sweep
            ran, read over its plausible layers as C1 (C2.plausible_layer): they are chosen on half A
            of the sweep's permutation images and every number above is read on half B (disjoint,
            drawn by the run seed), so the drop that chooses a layer is not the drop read there;
            sweeps written before the split chose and read on the same images and say so. The
            ape_permute stage's single layer beside it."""

SETS = (("all_positional", "random_all_positional", "all positional (row+col+mixed)"),
        ("all", "random_features", "row+col"), ("row_only", "random_row", "row only"),
        ("col_only", "random_col", "col only"))  # permuted set, its control, label; the first decides C2
NULLS = ("swap_all_positional", "crossed", "norm_all_positional")


def _drop(v: VariantResult | None) -> Interval | None:
    return None if v is None else bounds(v.drop_points, v.drop_ci95)


def _points(v: VariantResult | None) -> float | None:
    return None if v is None else v.drop_points


def _pooled(ap: ApePermuteResult, name: str) -> Interval | None:
    """`name`'s drop as C2 reads it: pooled over the SAE seeds where there are several, else the one SAE's."""
    read = ap.drop_as_read(name)
    return None if read is None else bounds(*read)


def _shuffle(v: VariantResult | None) -> tuple[float, Interval] | None:
    """The APE-table shuffle's drop and its interval (its point where it has none)."""
    iv = None if v is None else bounds(v.drop_points, v.drop_ci95)
    return None if v is None or iv is None else (v.drop_points, iv)


def _n(v: VariantResult | None) -> str:
    return "n/a" if v is None or v.n_features is None else str(v.n_features)


@dataclass(frozen=True)
class View:
    """What C2's conditions read of one permutation result: the all-positional drop and its
    same-position swap null (points, pooled over the SAE seeds where there are several), its position
    budget (`budget_pooled`: pooled so too), the drops the edit-norm-matched control is compared on
    (`norm_treated`, `norm`: the run seed's SAE's where the control was measured on it alone), the
    APE-table shuffle's drop, and the `none` model's top-1 for the position gain (reported)."""

    permute: ApePermuteResult
    treated: Interval | None
    null: Interval | None
    none_top1: float | None = None
    budget: PositionBudget | None = None  # None: a result written before the position budget
    budget_pooled: bool = False
    norm_treated: Interval | None = None
    norm: Interval | None = None
    norm_measured: bool = False  # the result has the norm-matched control (measured or skipped)
    norm_pooled: bool = False
    shuffle: tuple[float, Interval] | None = None  # the APE-table shuffle's drop and interval (None: not measured)

    @classmethod
    def of(cls, ap: ApePermuteResult, none_top1: float | None = None) -> View:
        budget, budget_pooled = read_budget(ap, "all_positional")
        # the norm-matched control pooled over the SAE seeds where it was; else both sides are the run seed's SAE's
        norm_pooled = ap.pooled("norm_all_positional") is not None
        treated = _pooled(ap, "all_positional")
        return cls(ap, treated, _pooled(ap, "swap_all_positional"), none_top1,
                   None if ap.position_budget is None else budget, budget_pooled,
                   treated if norm_pooled else _drop(ap.variant("all_positional")),
                   _pooled(ap, "norm_all_positional") if norm_pooled else _drop(ap.variant("norm_all_positional")),
                   ap.outcome("norm_all_positional") is not None, norm_pooled,
                   _shuffle(ap.variant("pos_embed_shuffle")))

    def position_read(self) -> bool:
        """The precondition: shuffling the APE table costs top-1, >= MIN_SHUFFLE_DROP points with its interval
        above 0 (`shuffle_undefined`: the model reads position from its APE table, and a share of it is defined)."""
        return self.shuffle is not None and shuffle_undefined(self.shuffle[0], as_list(self.shuffle[1])) is None


def _ape_shuffle(v: View, t: Thresholds) -> tuple[Outcome, dict[str, Number]]:
    return known(v.position_read()), {"ape_shuffle_drop": None if v.shuffle is None else as_list(v.shuffle[1]),
                                      "min_shuffle_drop": MIN_SHUFFLE_DROP}


def _budget(v: View, t: Thresholds) -> tuple[Outcome, dict[str, Number]] | None:
    """The position budget reaches C2.min_budget_share (None: a result written before it); where the APE
    shuffle costs ~nothing it fails with the precondition (no effect to take a share of), an otherwise
    undefined share is undecided."""
    b = v.budget
    if b is None:
        return None
    share = None if b.share is None else bounds(b.share, b.share_ci95)
    nums: dict[str, Number] = {"all_positional_budget": as_list(share), "budget_pooled": v.budget_pooled,
                               "C2.min_budget_share": t["C2.min_budget_share"], "budget_undefined": b.undefined}
    if not v.position_read():
        return FAILS, nums
    return (INCONCLUSIVE if share is None else at_least(share, t["C2.min_budget_share"])), nums


def _above_norm(v: View, t: Thresholds) -> tuple[Outcome, dict[str, Number]] | None:
    """The drop exceeds C2.norm_factor x the edit-norm-matched control's (None: a result without that control;
    skipped: undecided)."""
    if not v.norm_measured:
        return None
    # how well the control is matched, beside its drop: too few non-positional latents and it moves every one
    # (its note says so), with an edit of another size than the positional set's
    control, treated = v.permute.variant("norm_all_positional"), v.permute.variant("all_positional")
    return (exceeds(v.norm_treated, v.norm, t["C2.norm_factor"]),
            {"norm_compared_drop": as_list(v.norm_treated), "norm_control_drop": as_list(v.norm),
             "norm_read_on": "pooled SAE seeds" if v.norm_pooled or v.permute.seed_pool is None
             else "the run seed's SAE", "C2.norm_factor": t["C2.norm_factor"],
             "norm_control_note": None if control is None else control.note,
             "norm_control_edit_norm": None if control is None else control.edit_norm,
             "all_positional_edit_norm": None if treated is None else treated.edit_norm})


CONDITIONS: tuple[Condition[View], ...] = (
    Condition("ape_shuffle", "shuffling the APE table costs top-1 (>= MIN_SHUFFLE_DROP points, interval above 0; "
              "else no read position to find)",
              _ape_shuffle, precondition=True),
    Condition("min_drop", "permuting all positional features drops top-1 by >= C2.min_drop points",
              lambda v, t: (at_least(v.treated, t["C2.min_drop"]),
                            {"all_positional_drop": as_list(v.treated), "C2.min_drop": t["C2.min_drop"]})),
    Condition("above_null", "... by more than C2.null_factor x the same-position swap (no null: undecided)",
              lambda v, t: (exceeds(v.treated, v.null, t["C2.null_factor"]),
                            {"all_positional_drop": as_list(v.treated), "swap_null_drop": as_list(v.null),
                             "C2.null_factor": t["C2.null_factor"]})),
    Condition("budget", "... by >= C2.min_budget_share of the APE-table shuffle's drop (the position budget)",
              _budget),
    Condition("above_norm_control", "... by more than C2.norm_factor x the edit-norm-matched control", _above_norm),
)


def _describe(spec: str, v: View, t: Thresholds) -> tuple[dict[str, Any], str]:
    ap = v.permute
    allpos_v, control_v = ap.variant("all_positional"), ap.variant("random_all_positional")
    treated, control = v.treated, _pooled(ap, "random_all_positional")
    nulls = {n: ap.variant(n) for n in NULLS}
    null = v.null
    pool = ap.seed_pool

    def point(name: str) -> float | None:  # pooled over the SAE seeds where there are several
        read = ap.drop_as_read(name)
        return None if read is None else read[0]

    def seeds_of(name: str) -> str:
        p = ap.pooled(name)
        return "" if p is None else f" (per SAE seed {p.seeds_text()})"

    allpos, allpos0 = point("all_positional"), _points(allpos_v)  # pooled (what the rule reads), the run seed's
    in_range = allpos is not None and t["C2.study_low"] <= allpos <= t["C2.study_high"]
    in_range0 = allpos0 is not None and t["C2.study_low"] <= allpos0 <= t["C2.study_high"]
    control0, null0 = _drop(control_v), _drop(nulls["swap_all_positional"])
    pe = _points(ap.variant("pos_embed_shuffle"))
    note = None if control_v is None else control_v.note
    clean = ap.baseline_top1
    gain = None if v.none_top1 is None or clean is None else 100 * (clean - v.none_top1)
    frac = None if gain is None or allpos is None or gain <= 0 else allpos / gain
    parts = []
    for kept, ctrl_name, label in SETS:
        k, c = ap.variant(kept), ap.variant(ctrl_name)
        parts.append(f"{label} ({_n(k)}): {tx.f(point(kept), 1)}{tx.iv(_pooled(ap, kept), 1)}{seeds_of(kept)} pts "
                     f"vs its control ({_n(c)}) {tx.f(point(ctrl_name), 1)}{tx.iv(_pooled(ap, ctrl_name), 1)}")
    null_text = "; ".join(f"{n} {tx.f(point(n), 1)}{tx.iv(_pooled(ap, n), 1)}{seeds_of(n)}" for n in nulls)
    crossed, norm = nulls["crossed"], nulls["norm_all_positional"]
    # the keys results.json had before issue 48 are the run seed's SAE's; "_pooled": what the rule reads, pooled
    # over the SAE seeds (the run seed's where there is one)
    nums = {"drop_points": _points(ap.variant("all")), "random_control_drop": _points(ap.variant("random_features")),
            "pos_embed_shuffle_drop": pe, "all_positional_drop": allpos0, "in_study_range": in_range0,
            "all_positional_drop_ci95": as_list(_drop(allpos_v)),
            "all_positional_control_drop": _points(control_v), "all_positional_control_drop_ci95": as_list(control0),
            "n_all_positional": None if allpos_v is None else allpos_v.n_features,
            "n_control": None if control_v is None else control_v.n_features, "control_note": note,
            "swap_null_drop": _points(nulls["swap_all_positional"]), "swap_null_drop_ci95": as_list(null0),
            "all_positional_drop_pooled": allpos, "all_positional_drop_pooled_ci95": as_list(treated),
            "in_study_range_pooled": in_range,
            "all_positional_control_drop_pooled": point("random_all_positional"),
            "all_positional_control_drop_pooled_ci95": as_list(control),
            "swap_null_drop_pooled": point("swap_all_positional"), "swap_null_drop_pooled_ci95": as_list(null),
            "crossed_drop": _points(crossed), "crossed_drop_ci95": None if crossed is None else crossed.drop_ci95,
            "norm_control_drop": _points(norm), "norm_control_drop_ci95": None if norm is None else norm.drop_ci95,
            "all_positional_edit_norm": None if allpos_v is None else allpos_v.edit_norm,
            "norm_control_edit_norm": None if norm is None else norm.edit_norm,
            "all_positional_drop_per_group": {} if allpos_v is None else {
                g: x.drop_points for g, x in allpos_v.per_group.items()},
            "position_gain_points": gain, "drop_fraction_of_position_gain": frac,
            "n_sae_seeds": 1 if pool is None else len(pool.sae_seeds),
            "sae_seeds": None if pool is None else list(pool.sae_seeds),
            "interval_sources": ["images"] if pool is None else list(pool.interval_sources)}
    if pool is not None:  # each SAE seed's own drop and set size beside the pooled one (reported, not required)
        for name, p in pool.variants.items():
            nums[f"{name}_drop_per_sae_seed"] = list(p.per_seed)
        nums["n_all_positional_per_sae_seed"] = list(pool.variants["all_positional"].per_seed_n_features) \
            if "all_positional" in pool.variants else None
    budget = position_budget(ap, "all_positional")  # the run seed's SAE's (the key results.json had before)
    read, budget_pooled = read_budget(ap, "all_positional")  # what the rule reads: pooled where it was
    nums.update({"all_positional_budget": budget.share, "all_positional_budget_ci95": budget.share_ci95,
                 "all_positional_budget_undefined": budget.undefined,
                 "all_positional_budget_pooled": read.share, "all_positional_budget_pooled_ci95": read.share_ci95,
                 "ape_shuffle_drop": pe})
    b_ci = read.share_ci95
    budget_text = (f"; it reproduces {tx.pc(read.share)}" + ("" if b_ci is None else f" [{tx.pc(b_ci[0])}, "
                   f"{tx.pc(b_ci[1])}]") + " of the APE-table shuffle's drop (position budget"
                   + (", pooled over the SAE seeds)" if budget_pooled else ")")
                   if read.share is not None else f"; position budget undefined ({read.undefined})")
    norm_point = point("norm_all_positional") if v.norm_pooled else _points(norm)
    norm_text = ("" if v.norm is None else
                 f"; the edit-norm-matched control costs {tx.f(norm_point, 1)}{tx.iv(v.norm, 1)} against "
                 f"{tx.f(allpos if v.norm_pooled else allpos0, 1)}{tx.iv(v.norm_treated, 1)} for the all-positional "
                 "set" + ("" if v.norm_pooled or pool is None else " (both the run seed's SAE's: the control was "
                          "measured on it alone)"))
    where = "" if pool is None else (f" (C2's sets pooled over {len(pool.sae_seeds)} SAE seeds, intervals over SAE "
                                     "seeds x images; the rest: SAE seed 0's)")
    text = (f"{spec}: top-1 drop when permuting{where} " + "; ".join(parts) + f"; nulls: {null_text}"
            + f"; shuffled APE table {tx.f(pe, 1)}"
            + (f" (control: {note})" if note else "") + budget_text + norm_text
            + ("" if frac is None or gain is None else f"; the all-positional drop is {frac:.0%} of the position gain "
               f"({gain:.1f} pts over the none model)")
            + f"; C2 reads the all-positional set (needs the APE shuffle to cost top-1, a drop "
              f">= {t['C2.min_drop']:g}, > {t['C2.null_factor']:g}x its same-position swap, a position budget >= "
              f"{tx.pc(t['C2.min_budget_share'])} and > {t['C2.norm_factor']:g}x the edit-norm-matched control)"
            f"{', within' if in_range else ', outside'} the study's "
            f"{t['C2.study_low']:g}-{t['C2.study_high']:g}")
    return nums, text


class C2(RuleClaim[View]):
    id = "C2"
    text = "APE: permuting the positional features across patches drops top-1 by 24-31 points."
    scheme = "ape"
    rule = RULE
    thresholds = THRESHOLDS
    rule_conditions = CONDITIONS
    # the part is the pooled drop the rule reads (issue 48; one SAE seed: the run seed's own)
    headline = Headline(number="all_positional_drop", label="top-1 drop permuting all positional features",
                        unit="points", parts=("all_positional_drop_pooled",), how="one", range=(-100.0, 100.0),
                        threshold="C2.min_drop", legacy_parts=("all_positional_drop",))

    def view(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs]) -> View | None:
        return None if model.ape_permute is None else View.of(model.ape_permute, none_top1(models, model.data, spec))

    def describe(self, spec: str, x: View, t: Thresholds) -> tuple[dict[str, Any], str]:
        return _describe(spec, x, t)

    def at(self, spec: str, ap: ApePermuteResult, t: Thresholds | None = None,
           none_top1: float | None = None) -> ModelClaim:
        """C2 of one permutation result (the ape_permute stage's, or one layer's of the sweep)."""
        return self.read_view(spec, View.of(ap, none_top1), self.defaults() if t is None else t)

    def at_layer(self, spec: str, p: LayerPoint, t: Thresholds | None = None) -> ModelClaim:
        """C2 at one swept layer, from the typed results measured there (a point written without them:
        the result the sweep recorded then)."""
        if p.permute is not None:
            return self.at(spec, p.permute, t)
        return ModelClaim(outcome(p.c2), dict(p.c2_numbers))

    def _layer(self, spec: str, t: Thresholds) -> AtLayer:
        return layer_reader(self.at_layer, spec, t)

    def read(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs],
             t: Thresholds) -> ModelClaim | None:
        """Over the layer sweep where it ran, else at the ape_permute stage's layer (None: neither ran)."""
        x = self.view(spec, model, models)
        single = None if x is None else self.read_view(spec, x, t)
        if model.sae_layers is None:
            return single
        return over_curve(spec, single, model.sae_layers, self._layer(spec, t), t, "C2.plausible_layer",
                          "ape_permute")

    def gist(self, t: Thresholds) -> str:
        return (f"permuting all positional features drops top-1 by >= {t['C2.min_drop']:g} pts, > "
                f"{t['C2.null_factor']:g}x the same-position swap and > {t['C2.norm_factor']:g}x the edit-norm-matched "
                f"control, and reproduces >= {tx.pc(t['C2.min_budget_share'])} of the APE-table shuffle's drop "
                "(position budget)")

    def headline_gap(self, numbers: Mapping[str, Any]) -> str | None:
        return "its SAE has no positional features to permute" if numbers.get("n_all_positional") == 0 else None


CLAIM = C2()
