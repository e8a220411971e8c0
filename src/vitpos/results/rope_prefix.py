"""Recovery with the prefix route open and blocked (`vitpos.experiments.rope_prefix` measures it)."""

from __future__ import annotations

from pydantic import BaseModel

from vitpos.results.common import AxisSweepResult, ProbedCondition, Recovery


class Condition(ProbedCondition):
    prefix_blocked_from: int | None  # first layer whose patch queries cannot see the prefix; None: never


class PrefixRecovery(BaseModel):
    """Recovery of one axis after R with the prefix route open and blocked from R (same references)."""

    open: Recovery
    blocked: Recovery


class RopePrefixResult(AxisSweepResult):
    num_prefix_tokens: int
    block_from: int
    restore_from: int
    prefix_attention: list[float]  # per layer: clean patch queries' mean attention mass on the prefix keys
    attn_images: int
    conditions: dict[str, Condition]
    recovery: dict[str, PrefixRecovery]  # axis -> recovery after restore_from
    min_gap: float
