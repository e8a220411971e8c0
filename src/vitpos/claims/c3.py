"""C3 (RoPE): disabling the row (column) rotations removes decodable row (column) information independently."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vitpos.claims import text as tx
from vitpos.claims.base import Condition, Headline, RuleClaim
from vitpos.claims.inputs import ClaimInputs, matched_none
from vitpos.claims.intervals import Interval, Outcome, all_of, as_list, at_least, at_most, bounds, known
from vitpos.claims.rules import Threshold, Thresholds
from vitpos.claims.verdict import Number
from vitpos.results.common import ProbedCondition
from vitpos.results.probe import ProbeSiteResult
from vitpos.results.rope_axis import MIN_ABOVE_CHANCE as MIN_ABOVE_CHANCE
from vitpos.results.rope_axis import RopeAxisResult, floored_kept, kept_fraction

FRACTIONS = (0.5, 0.6, 0.7, 0.8, 0.9)  # sweep of a share-of-decodability threshold
THRESHOLDS = (
    Threshold(name="C3.min_removed", claim="C3", value=0.7, unit="fraction",
              meaning="removing an axis' rotations removes at least this share of its decodability above the "
              "content floor (linear probe, and the MLP probe where measured), for both axes", sweep=FRACTIONS),
    Threshold(name="C3.min_kept", claim="C3", value=0.7, unit="fraction",
              meaning="... while the other axis keeps at least this share of its own", sweep=FRACTIONS),
    Threshold(name="C3.max_kept", claim="C3", value=1.3, unit="fraction",
              meaning="... and at most this share: an axis that gains when the other goes interacts with it "
              "(not independent)", sweep=(1.1, 1.2, 1.3, 1.5, 2.0)),
)
MIN_REMOVED, MIN_KEPT, MAX_KEPT = (t.value for t in THRESHOLDS)  # the rule's values, for text and older readers

RULE = """  C3 (RoPE) removing an axis removes >= C3.min_removed of its decodability above each layer's
            content floor while the other axis keeps >= C3.min_kept of its own, for both axes: the
            fractions mean over layers of (base - off) / (base - floor) (retrained probes, layers
            whose baseline is >= MIN_ABOVE_CHANCE above the floor), the floor of a layer = the same
            model's no_both accuracy there (no rotations: what content alone gives), never below
            chance; each fraction's interval (paired bootstrap over the probes' test images,
            rope_axis `removal_floored`) lies at or above its threshold, fails if one lies below;
            and a small MLP probe (rope_axis `readouts`) finds the axis removed too (its removed
            fraction's interval >= C3.min_removed). Kept is two-sided: an interval wholly above
            C3.max_kept is an interaction (the other axis gains when this one goes) and fails
            independence; one that reaches above it is undecided. No layer above its floor on an
            axis (the rotations add no decodable position to what content and any APE give, e.g.
            an APE carries it) is its own outcome, "no rotary position", and fails.
            Reported beside it: the fractions above chance, the floor from the matched `none`
            model's probes, and the relative-offset (Δrow, Δcol) read-outs. Results written before
            the floors read the fractions above chance."""

PAIRS = (("row", "col"), ("col", "row"))  # (the axis removed, the other axis)


def _acc(cond: ProbedCondition | ProbeSiteResult, axis: str) -> list[float]:
    return cond.row_acc if axis == "row" else cond.col_acc


@dataclass(frozen=True)
class View:
    """C3's numbers of one model (`nums`, as the summary records them) and the intervals its
    conditions read (`ivs`, by number key); `floors`: the floored fractions were measured (else the
    older fractions above chance decide); `mlp_readout`: the MLP read-out was measured."""

    axis: RopeAxisResult
    nums: dict[str, Any] = field(default_factory=dict)
    ivs: dict[str, Interval | None] = field(default_factory=dict)
    floors: bool = False
    mlp_readout: bool = False

    def removed_key(self, a: str) -> str:
        return f"no_{a}_{a}_removed" + ("_floored" if self.floors else "")

    def kept_key(self, a: str, b: str) -> str:
        return f"no_{a}_{b}_kept" + ("_floored" if self.floors else "")


def view(ra: RopeAxisResult, none_probe: ProbeSiteResult | None = None) -> View:
    c = ra.conditions
    base = c["baseline"]
    chance = {"row": ra.chance_row, "col": ra.chance_col}
    removal = ra.removal or {}
    floored = ra.removal_floored  # issue 29: per-layer content floors; None in older results
    mlp = (ra.readouts.removal if ra.readouts is not None else None) or None
    nums: dict[str, Any] = {}
    ivs: dict[str, Interval | None] = {}
    for a, b in PAIRS:
        off = c[f"no_{a}"]
        kept_own = kept_fraction(_acc(base, a), _acc(off, a), chance[a])
        kept_other = kept_fraction(_acc(base, b), _acc(off, b), chance[b])
        removed = None if kept_own is None else 1 - kept_own
        measured = removal.get(f"no_{a}")
        rm, kp = f"no_{a}_{a}_removed", f"no_{a}_{b}_kept"
        nums[rm] = removed
        nums[kp] = kept_other
        nums[f"no_{a}_top1"] = off.top1
        nums[f"{rm}_ci95"] = None if measured is None else measured.removed_ci95
        nums[f"{kp}_ci95"] = None if measured is None else measured.kept_ci95
        ivs[rm] = None if removed is None else bounds(removed, nums[f"{rm}_ci95"])
        ivs[kp] = None if kept_other is None else bounds(kept_other, nums[f"{kp}_ci95"])
        if floored is None:  # results before the floors: fractions above chance
            continue
        fl = floored.get(f"no_{a}")
        for num, (point, ci) in ((f"{rm}_floored", (None, None) if fl is None else (fl.removed, fl.removed_ci95)),
                                 (f"{kp}_floored", (None, None) if fl is None else (fl.kept, fl.kept_ci95))):
            nums[num], nums[f"{num}_ci95"] = point, ci
            ivs[num] = None if point is None else bounds(point, ci)
        nums[f"{kp}_interaction"] = bool(fl is not None and fl.interaction)
        if mlp is not None:  # the MLP probe must find the axis removed too (not only linearly hidden)
            m = (mlp.get(f"no_{a}") or {}).get("mlp")
            fracs = [(None, None)] * 4 if m is None else m.fractions()
            for num, (point, ci) in zip((f"{rm}_mlp", f"{kp}_mlp", f"{rm}_pair_mlp", f"{kp}_pair_mlp"), fracs,
                                        strict=True):
                nums[num], nums[f"{num}_ci95"] = point, ci
                ivs[num] = None if point is None else bounds(point, ci)
        if none_probe is not None and len(_acc(none_probe, a)) == len(_acc(base, a)):
            # reported beside the rule: the floor from the matched `none` model's probes, layer by layer
            floor = [max(chance[a], f) for f in _acc(none_probe, a)]
            kept_none, _ = floored_kept(_acc(base, a), _acc(off, a), floor)
            nums[f"{rm}_none_floor"] = None if kept_none is None else 1 - kept_none
    return View(ra, nums, ivs, floored is not None, floored is not None and mlp is not None)


def _per_axis(v: View, key: Callable[[str, str], str], threshold: float, name: str,
              test: Callable[[Interval | None, float], Outcome] = at_least) -> tuple[Outcome, dict[str, Number]]:
    keys = [key(a, b) for a, b in PAIRS]
    nums: dict[str, Number] = {name: threshold, **{k: as_list(v.ivs.get(k)) for k in keys}}
    return all_of(*(test(v.ivs.get(k), threshold) for k in keys)), nums


def _rotary_position(v: View, t: Thresholds) -> tuple[Outcome, dict[str, Number]]:
    """Both axes' removed fractions are defined: some layer's baseline decodes the axis above its floor
    (else the rotations carry no position of their own on that axis: every fraction reads nothing)."""
    missing = [a for a, _ in PAIRS if v.nums.get(v.removed_key(a)) is None]
    return known(not missing), {"no_rotary_position": ", ".join(missing) if missing else None}


def _mlp_removed(v: View, t: Thresholds) -> tuple[Outcome, dict[str, Number]] | None:
    if not v.mlp_readout:
        return None
    return _per_axis(v, lambda a, b: f"no_{a}_{a}_removed_mlp", t["C3.min_removed"], "C3.min_removed")


CONDITIONS: tuple[Condition[View], ...] = (
    Condition("rotary_position", "some layer decodes each axis above its content floor (else: no rotary position)",
              _rotary_position, precondition=True),
    Condition("removed", "removing an axis removes >= C3.min_removed of its decodability above the content floor",
              lambda v, t: _per_axis(v, lambda a, b: v.removed_key(a), t["C3.min_removed"], "C3.min_removed")),
    Condition("kept", "... while the other axis keeps >= C3.min_kept of its own",
              lambda v, t: _per_axis(v, v.kept_key, t["C3.min_kept"], "C3.min_kept")),
    Condition("not_interacting", "... and at most C3.max_kept of its own (more: the axes interact)",
              lambda v, t: _per_axis(v, v.kept_key, t["C3.max_kept"], "C3.max_kept", at_most)),
    Condition("mlp_removed", "an MLP probe finds >= C3.min_removed of the axis removed too (where measured)",
              _mlp_removed),
)


def _text(spec: str, v: View, t: Thresholds) -> str:
    min_removed, min_kept, max_kept = t["C3.min_removed"], t["C3.min_kept"], t["C3.max_kept"]
    nums, ivs, top1 = v.nums, v.ivs, v.axis.conditions["baseline"].top1

    def frac(key: str) -> str:
        x = ivs.get(key)
        return tx.pc(nums.get(key)) + ("" if x is None or x[0] == x[1] else f" [{tx.pc(x[0])}, {tx.pc(x[1])}]")

    text = (f"{spec}: no_row removes {frac('no_row_row_removed')} of above-chance row decodability, "
            f"col keeps {frac('no_row_col_kept')}; no_col removes {frac('no_col_col_removed')} of col, "
            f"row keeps {frac('no_col_row_kept')}")
    if not v.floors:
        text += f" (needs >= {tx.pc(min_removed)} removed and {tx.pc(min_kept)}-{tx.pc(max_kept)} kept"
    else:
        text += ("; above each layer's content floor (the model's no_both accuracy): no_row removes "
                 f"{frac('no_row_row_removed_floored')} of row, col keeps {frac('no_row_col_kept_floored')}"
                 f"{' (an interaction: above 100%)' if nums.get('no_row_col_kept_interaction') else ''}; no_col "
                 f"removes {frac('no_col_col_removed_floored')} of col, row keeps {frac('no_col_row_kept_floored')}"
                 f"{' (an interaction: above 100%)' if nums.get('no_col_row_kept_interaction') else ''}")
        if v.mlp_readout:
            text += (f"; an MLP probe finds {frac('no_row_row_removed_mlp')} of row and "
                     f"{frac('no_col_col_removed_mlp')} of col removed (relative offsets: Δrow "
                     f"{frac('no_row_row_removed_pair_mlp')}, Δcol {frac('no_col_col_removed_pair_mlp')} removed)")
        if "no_row_row_removed_none_floor" in nums:
            text += ("; against the matched none model's floor: row "
                     f"{tx.pc(nums.get('no_row_row_removed_none_floor'))}, col "
                     f"{tx.pc(nums.get('no_col_col_removed_none_floor'))} removed")
        by_mlp = " and by the MLP probe" if v.mlp_readout else ""
        text += (f" (needs >= {tx.pc(min_removed)} removed above the floor{by_mlp}, {tx.pc(min_kept)}-"
                 f"{tx.pc(max_kept)} kept")
    return text + (f"; top-1 {tx.f(top1)} -> no_row {tx.f(nums['no_row_top1'])}, no_col "
                   f"{tx.f(nums['no_col_top1'])})")


class C3(RuleClaim[View]):
    id = "C3"
    text = "RoPE: disabling the row (column) rotations removes decodable row (column) information independently."
    scheme = "rope"
    rule = RULE
    rule_conditions = CONDITIONS
    thresholds = THRESHOLDS
    headline = Headline(number="min_removed",
                        label="smaller share of its own axis' above-chance decodability an axis' removal removes",
                        unit="fraction", parts=("no_row_row_removed", "no_col_col_removed"), how="min")

    def view(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs]) -> View | None:
        return None if model.rope_axis is None else view(model.rope_axis, matched_none(spec, models))

    def describe(self, spec: str, x: View, t: Thresholds) -> tuple[dict[str, Any], str]:
        return x.nums, _text(spec, x, t)

    def gist(self, t: Thresholds) -> str:
        return (f"removing an axis' rotations removes >= {tx.pc(t['C3.min_removed'])} of its decodability above the "
                f"content floor while the other axis keeps {tx.pc(t['C3.min_kept'])}-{tx.pc(t['C3.max_kept'])}")


CLAIM = C3()
