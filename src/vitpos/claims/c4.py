"""C4 (RoPE): once rotations are restored the information is partly rebuilt, in part by axis-specialised heads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vitpos.claims import text as tx
from vitpos.claims.base import Condition, Headline, ModelClaim, RuleClaim
from vitpos.claims.inputs import ClaimInputs, model_family
from vitpos.claims.intervals import Interval, Outcome, all_of, as_list, at_least, bounds, inside, magnitude
from vitpos.claims.rules import Threshold, Thresholds
from vitpos.claims.verdict import Number, SeedSummary
from vitpos.results.common import MIN_GAP, Recovery
from vitpos.results.rope_axis import RopeAxisResult
from vitpos.results.rope_axis import median_recovery as _median_recovery
from vitpos.results.rope_heads import SPECIALISED as SPECIALISED
from vitpos.results.rope_heads import RopeHeadsResult

# C4's threshold: a module constant, outside the hashed rule set until the next rules version
THRESHOLDS = (
    Threshold(name="C4.min_head_share", claim="C4", value=0.25, unit="fraction",
              meaning="the primary rebuilding head explains at least this share of the recovery (fall in Rec / Rec)",
              sweep=(0.1, 0.15, 0.25, 0.35, 0.5)),
)
AXES = ("row", "col")

RULE = """  C4 (RoPE) recovery after restoring is partial, against a count-matched reference: for both
            axes the interval of the median over restore points R of the mean rebuilt share
            B(l) = 1 - (P_clean(l) - P_restore(l)) / (P_clean(R-1) - P_off(R-1)), l >= R (the share
            of the deficit at R that the restored layers close beyond what the same layers add in
            the clean model; paired bootstrap, rope_axis `median_rebuilt_share`) lies inside (0, 1),
            fails if it lies wholly at or below 0 or at or above 1; and the primary rebuilding head
            is specialised on the axis it rebuilds, where it rebuilds: its axis index S measured in
            the restore condition, signed to the axis whose recovery it carries (+ row, - col;
            `primary_axis_index_matched`, bootstrap over the attention images), lies at or above
            the null threshold (the 0.95 quantile of |S| with each head's rotary pairs relabelled
            at random, `axis_index_null_threshold`), fails if below; and it explains at least
            C4.min_head_share of the recovery (its fall in Rec / Rec, paired bootstrap,
            `primary_recovery_share`). Results written before these fall back to median Rec inside
            (0, 1) and the clean-attention |S| >= 0.5. Reported beside the rule, not in it: median
            Rec, how often the primary head would be chosen again over image resamples
            (`selection_frequency`), the top-k heads' joint share with its interval, and whether
            mean-ablating head outputs ranks the same heads."""


def median_recovery(per_r: Mapping[str, Recovery]) -> float:
    """C4's median over restore points of mean Rec (rope_axis `median_recovery`) of typed recoveries."""
    return _median_recovery({r: {"mean_rec": x.mean_rec} for r, x in per_r.items()})


@dataclass(frozen=True)
class View:
    """What C4 reads of one model: its rope_axis and rope_heads results and the intervals of the
    recovery (count-matched share, or Rec in older results) and of the primary head's S and share."""

    axis: RopeAxisResult
    heads: RopeHeadsResult | None
    rec: dict[str, float | None]
    rec_ci: dict[str, list[float] | None]
    share: dict[str, tuple[float | None, list[float] | None]] | None  # None: before the count-matched reading
    prim: list[int] | None
    S: float | None
    S_ci: list[float] | None
    threshold: float | None  # the S null's threshold (None: before the restore-condition S)
    matched: float | None
    matched_iv: Interval | None
    head_share: float | None
    head_share_iv: Interval | None

    def recovered(self, a: str) -> Interval | None:
        if self.share is not None:
            return bounds(*self.share[a])
        return bounds(self.rec[a], self.rec_ci[a])


def view(ra: RopeAxisResult, rh: RopeHeadsResult | None) -> View:
    # None where no restore point has a mean Rec: an undefined number is null in results.json, not NaN
    rec = {a: m if tx.finite(m := median_recovery(ra.recovery[a])) else None for a in AXES}
    med = ra.median_recovery or {}
    rec_ci = {a: None if (m := med.get(a)) is None else m.median_rec_ci95 for a in AXES}
    shares = ra.median_rebuilt_share  # the count-matched reading (issue 29); None in older results
    share = None if shares is None else {
        a: (None, None) if (s := shares.get(a)) is None else (s.median_share, s.median_share_ci95) for a in AXES}
    prim, S, S_ci = None, None, None
    if rh is not None and rh.primary_rebuilding_head:
        prim = rh.primary_rebuilding_head
        S = rh.axis_index[prim[0]][prim[1]]
        cis = rh.axis_index_ci95
        S_ci = cis[prim[0]][prim[1]] if cis else None
    threshold = None if rh is None or rh.axis_index_null_threshold is None else float(rh.axis_index_null_threshold)
    matched = None if rh is None else rh.primary_axis_index_matched
    matched_iv = None if matched is None or rh is None else bounds(matched, rh.primary_axis_index_matched_ci95)
    head_share = None if rh is None else rh.primary_recovery_share
    head_share_iv = None if head_share is None or rh is None else bounds(head_share, rh.primary_recovery_share_ci95)
    return View(ra, rh, rec, rec_ci, share, prim, S, S_ci, threshold, matched, matched_iv, head_share, head_share_iv)


def _partial(v: View, t: Thresholds) -> tuple[Outcome, dict[str, Number]]:
    key = "median_rebuilt_share" if v.share is not None else "median_recovery"
    ivs = {a: v.recovered(a) for a in AXES}
    return all_of(*(inside(ivs[a], 0.0, 1.0) for a in AXES)), {f"{key}_{a}": as_list(ivs[a]) for a in AXES}


def _specialised(v: View, t: Thresholds) -> tuple[Outcome, dict[str, Number]]:
    if v.threshold is not None:
        return (at_least(v.matched_iv, v.threshold),
                {"primary_axis_index_matched": as_list(v.matched_iv), "axis_index_null_threshold": v.threshold})
    # results before the restore-condition S: |S| of clean attention against the round number
    S_iv = None if v.S is None else bounds(v.S, v.S_ci)
    return at_least(magnitude(S_iv), SPECIALISED), {"primary_axis_index_abs": as_list(magnitude(S_iv)),
                                                    "SPECIALISED": SPECIALISED}


def _head_share(v: View, t: Thresholds) -> tuple[Outcome, dict[str, Number]] | None:
    if v.threshold is None:  # results before the restore-condition S read no share
        return None
    return (at_least(v.head_share_iv, t["C4.min_head_share"]),
            {"primary_recovery_share": as_list(v.head_share_iv), "C4.min_head_share": t["C4.min_head_share"]})


CONDITIONS: tuple[Condition[View], ...] = (
    Condition("partial", "the count-matched rebuilt share (older results: median Rec) lies inside (0, 1) on both "
              "axes", _partial),
    Condition("specialised", "the primary rebuilding head's axis index where it rebuilds is at or above the null "
              "threshold (older results: clean-attention |S| >= 0.5)", _specialised),
    Condition("head_share", "the primary rebuilding head explains >= C4.min_head_share of the recovery", _head_share),
)


def _first_under(rh: RopeHeadsResult | None, prim: list[int] | None, method: str) -> bool | None:
    """Whether the primary rebuilding head also tops another method's ranking (None: not measured)."""
    top = None if rh is None else rh.top_heads
    if prim is None or not top or not top.get(method):
        return None
    return list(prim) == list(top[method][0])


def _describe(spec: str, v: View, t: Thresholds) -> tuple[dict[str, Any], str]:
    rh, rec, prim, S, S_ci, threshold = v.heads, v.rec, v.prim, v.S, v.S_ci, v.threshold
    rec_iv = {a: bounds(rec[a], v.rec_ci[a]) for a in AXES}
    share = v.share or {a: (None, None) for a in AXES}
    share_iv = {a: bounds(*share[a]) for a in AXES}
    S_iv = None if S is None else bounds(S, S_ci)
    matched, matched_iv, head_share, head_share_iv = v.matched, v.matched_iv, v.head_share, v.head_share_iv
    text = (f"{spec}: median recovery row {tx.f(rec['row'])}{tx.iv(rec_iv['row'])}, col "
            f"{tx.f(rec['col'])}{tx.iv(rec_iv['col'])}")
    if v.share is not None:
        text += (f"; count-matched rebuilt share row {tx.f(share['row'][0])}{tx.iv(share_iv['row'])}, "
                 f"col {tx.f(share['col'][0])}{tx.iv(share_iv['col'])} (needs inside (0, 1))")
    else:
        text += " (needs inside (0, 1))"
    if threshold is not None and rh is not None:
        text += (f"; primary rebuilding head {tx.head(prim)} (chosen in {tx.pc(rh.primary_selection_frequency)} of "
                 f"image resamples) carries {rh.primary_axis or 'n/a'}: its axis index where it rebuilds, signed to "
                 "that axis, "
                 f"{tx.f(matched)}{tx.iv(matched_iv)} (needs >= the null's {tx.f(threshold, 3)}), and it explains "
                 f"{tx.pc(head_share)}{tx.pc_iv(head_share_iv)} of the recovery "
                 f"(needs >= {tx.pc(t['C4.min_head_share'])}); "
                 f"clean-attention axis index {tx.f(S)}{tx.iv(S_iv)}")
    else:
        text += f"; primary rebuilding head {tx.head(prim)} axis index {tx.f(S)}{tx.iv(S_iv)} (needs |S| >= " \
                f"{SPECIALISED})"
    nums = {"median_recovery_row": rec["row"], "median_recovery_col": rec["col"], "primary_head": prim,
            "primary_axis_index": S,
            "n_specialised_heads": None if rh is None else len(rh.specialised_heads),
            # cross-check, reported beside the rule: the same heads under mean-ablation?
            "top_heads_overlap": None if rh is None else rh.top_heads_overlap,
            "primary_tops_mean_ablation": _first_under(rh, prim, "mean_ablate"),
            # and by its direct effect on the axis probes (iii); every pair of methods' top heads
            "primary_tops_direct_effect": _first_under(rh, prim, "direct_effect"),
            "top_heads_agreement": None if rh is None else rh.top_heads_agreement,
            "median_recovery_row_ci95": v.rec_ci["row"], "median_recovery_col_ci95": v.rec_ci["col"],
            "primary_axis_index_ci95": S_ci,
            # issue 29: what the rule reads now
            "median_rebuilt_share_row": share["row"][0], "median_rebuilt_share_col": share["col"][0],
            "median_rebuilt_share_row_ci95": share["row"][1], "median_rebuilt_share_col_ci95": share["col"][1],
            "primary_axis": None if rh is None else rh.primary_axis, "primary_axis_index_matched": matched,
            "primary_axis_index_matched_ci95": None if rh is None else rh.primary_axis_index_matched_ci95,
            "axis_index_null_threshold": None if rh is None else rh.axis_index_null_threshold,
            "primary_selection_frequency": None if rh is None else rh.primary_selection_frequency,
            "primary_recovery_share": head_share,
            "primary_recovery_share_ci95": None if rh is None else rh.primary_recovery_share_ci95}
    return nums, text


def primary_over_seeds(found: Sequence[tuple[str, ModelClaim]]) -> str:
    """How often each head is the primary rebuilding head over the trained seeds of a model family
    (issue 29: the selection's stability across seeds, beside its bootstrap over images)."""
    families: dict[str, list[ModelClaim]] = {}
    for spec, r in found:
        families.setdefault(model_family(spec), []).append(r)
    parts = []
    for fam, members in families.items():
        heads = [tx.head(r.numbers.get("primary_head")) for r in members]
        if len(heads) >= 2:
            counts = {h: heads.count(h) for h in dict.fromkeys(heads)}
            parts.append(f"{fam}: " + ", ".join(f"{h} on {n} of {len(heads)} seeds" for h, n in counts.items()))
    return "primary rebuilding head over seeds: " + "; ".join(parts)


class C4(RuleClaim[View]):
    id = "C4"
    text = "RoPE: once rotations are restored the information is partly rebuilt, in part by axis-specialised heads."
    scheme = "rope"
    rule = RULE
    rule_conditions = CONDITIONS
    thresholds = THRESHOLDS
    headline = Headline(number="mean_median_recovery", label="mean of the row and col median recovery after restoring",
                        unit="fraction", parts=("median_recovery_row", "median_recovery_col"), how="mean")

    def view(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs]) -> View | None:
        return None if model.rope_axis is None else view(model.rope_axis, model.rope_heads)

    def describe(self, spec: str, x: View, t: Thresholds) -> tuple[dict[str, Any], str]:
        return _describe(spec, x, t)

    def gist(self, t: Thresholds) -> str:
        return (f"restoring the rotations rebuilds part, not all, of the information, and the primary rebuilding "
                f"head is specialised on its axis and carries >= {tx.pc(t['C4.min_head_share'])} of the recovery")

    def headline_gap(self, numbers: Mapping[str, Any]) -> str | None:
        if numbers.get("median_recovery_row") is None and numbers.get("median_recovery_col") is None:
            return (f"removing the rotations lowers no layer's decodability by >= {100 * MIN_GAP:g} pts: nothing "
                    "to recover, recovery undefined")
        return None

    def notes(self, found: Sequence[tuple[str, ModelClaim]], seeds: Mapping[str, SeedSummary]) -> list[str]:
        return [primary_over_seeds(found)] if seeds else []


CLAIM = C4()
