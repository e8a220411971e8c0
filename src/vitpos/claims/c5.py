"""C5 (RoPE): ablating the rotations of the primary rebuilding head reduces accuracy more than any other head."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vitpos.claims import text as tx
from vitpos.claims.base import Condition, Headline, RuleClaim
from vitpos.claims.inputs import ClaimInputs
from vitpos.claims.intervals import FAILS, Outcome, all_positive, bounds
from vitpos.claims.rules import Threshold, Thresholds
from vitpos.claims.verdict import Number
from vitpos.results.rope_heads import RopeHeadsResult, closest_rival

THRESHOLDS = (
    Threshold(name="C5.min_margin", claim="C5", value=0.0, unit="points",
              meaning="ablating the primary rebuilding head drops top-1 more than ablating any other head by more "
              "than this (every paired margin's interval above it)", sweep=(0.0, 1.0, 2.0, 5.0, 10.0)),
)

RULE = """  C5 (RoPE) the primary rebuilding head has the largest top-1 drop of all heads: for every other
            head, the interval of drop(primary) - drop(head) (paired bootstrap over the same
            top-1 images, `primary_margin_ci95`) lies above C5.min_margin; fails if one lies below it.
            The verdict rests on the identity ablation (the head's rotations removed; numbers
            `ablation`); the same rule under the counterfactual ablations (rope_heads
            `c5_ablations`: swap, shift, jitter, rescale, mean output) is reported as
            `outcome_under_ablation`, not read by the verdict."""


def c5_outcome(margins: list[list[list[float] | None]], floor: float = 0.0) -> Outcome:
    """C5 from the paired margins drop(primary) - drop(head) (`primary_margin_ci95`, None at the
    primary): holds when every other head's interval lies above `floor`, fails when one lies below."""
    return all_positive([iv for row in margins for m in row if (iv := bounds(None, m)) is not None], floor)


def _largest(rh: RopeHeadsResult, t: Thresholds) -> tuple[Outcome, dict[str, Number]]:
    margins = rh.primary_margin_ci95
    if rh.primary_rebuilding_head is None or margins is None:
        return FAILS, {"primary_head": None}
    closest = closest_rival(margins)
    return c5_outcome(margins, t["C5.min_margin"]), {"primary_head": list(rh.primary_rebuilding_head),
                                                     "C5.min_margin": t["C5.min_margin"],
                                 "closest_rival_margin": None if closest is None else list(closest[1])}


CONDITIONS: tuple[Condition[RopeHeadsResult], ...] = (
    Condition("largest", "every other head's paired margin drop(primary) - drop(head) lies above C5.min_margin",
              _largest),
)


def _ablation_numbers(rh: RopeHeadsResult) -> dict[str, Any]:
    """Which ablation C5's verdict rests on ('identity': the head's rotations removed) and C5's
    outcome under each ablation rope_heads measured (`c5_ablations`; absent in older results)."""
    out: dict[str, Any] = {"ablation": rh.c5_rests_on or "identity"}
    if rh.c5_ablations is not None:
        out["outcome_under_ablation"] = {k: v.outcome for k, v in rh.c5_ablations.items()}
    return out


def _describe(spec: str, rh: RopeHeadsResult) -> tuple[dict[str, Any], str]:
    prim, rank = rh.primary_rebuilding_head, rh.primary_head_drop_rank
    drop = rh.drop_points[prim[0]][prim[1]] if prim else None
    cis = rh.drop_ci95
    big = rh.largest_drop_head
    n_heads = len(rh.layers) * rh.num_heads
    n_late = (len(rh.layers) - rh.restore_from) * rh.num_heads
    closest = closest_rival(rh.primary_margin_ci95)
    rival = "" if closest is None else (f"; closest rival {tx.head(closest[0])}: margin {tx.ci(closest[1])} pts")
    nums = {"primary_head": prim, "primary_drop_points": drop,
            "primary_drop_ci95": cis[prim[0]][prim[1]] if cis and prim else None,
            "drop_rank": rank, "largest_drop_head": big,
            "drop_rank_among_layers_ge_R": rh.primary_head_drop_rank_after_R,
            "largest_drop_points": rh.drop_points[big[0]][big[1]],
            "largest_drop_ci95": cis[big[0]][big[1]] if cis else None,
            "closest_rival_head": None if closest is None else closest[0],
            "closest_rival_margin_ci95": None if closest is None else closest[1], "n_heads": n_heads,
            **_ablation_numbers(rh)}
    text = (f"{spec}: primary rebuilding head {tx.head(prim)} drops top-1 by {tx.f(drop, 1)} pts"
            f"{'' if not (cis and prim) else ' ' + tx.ci(cis[prim[0]][prim[1]])}, rank {tx.rank(rank)} of "
            f"{n_heads} (largest: L{big[0]}H{big[1]}, {rh.drop_points[big[0]][big[1]]:.1f} pts){rival}; "
            f"rank {tx.rank(rh.primary_head_drop_rank_after_R)} among the {n_late} heads of layers >= "
            f"R={rh.restore_from}")
    return nums, text


class C5(RuleClaim[RopeHeadsResult]):
    id = "C5"
    text = "RoPE: ablating the rotations of the primary rebuilding head reduces accuracy more than any other head."
    scheme = "rope"
    rule = RULE
    rule_conditions = CONDITIONS
    thresholds = THRESHOLDS
    headline = Headline(number="primary_drop_points", label="top-1 drop ablating the primary rebuilding head",
                        unit="points", parts=("primary_drop_points",), how="one", range=(-100.0, 100.0),
                        cis=("primary_drop_ci95",))

    def view(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs]) -> RopeHeadsResult | None:
        return model.rope_heads

    def describe(self, spec: str, x: RopeHeadsResult, t: Thresholds) -> tuple[dict[str, Any], str]:
        return _describe(spec, x)

    def gist(self, t: Thresholds) -> str:
        return "ablating the primary rebuilding head drops top-1 more than ablating any other head (paired margins)"

    def headline_gap(self, numbers: Mapping[str, Any]) -> str | None:
        if numbers.get("primary_head") is None:
            return "no head has a defined rebuilding score (recovery undefined), so there is no primary head to ablate"
        return None


CLAIM = C5()
