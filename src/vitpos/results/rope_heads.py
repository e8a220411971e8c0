"""E5 (C5)'s per-head result, and the readers the claims and the report use on it
(`vitpos.experiments.rope_heads` measures it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from vitpos.results.base import Result

SPECIALISED = 0.5  # |S| at or above which a head is axis-specialised


class C5Ablation(BaseModel):
    """C5 under one ablation of a head (`c5_ablations`): per measured head ([layer, head] in `heads`)
    the top-1 drop with a paired bootstrap interval, and the margin drop(primary) - drop(head) with
    its paired interval (None at the primary). outcome: C5's rule on these margins (holds: every
    interval above 0; fails: one below 0; else inconclusive; fails without a primary rebuilding head,
    when the drops are still measured but there are no margins)."""

    model_config = ConfigDict(extra="forbid")
    description: str
    heads: list[list[int]]
    n_images: int
    drop_points: list[float]
    drop_ci95: list[list[float]]
    margin_ci95: list[list[float] | None]
    primary_drop_rank: int | None  # among the measured heads (1 = largest); None without a primary
    largest_drop_head: list[int]
    outcome: Literal["holds", "fails", "inconclusive"]


class RopeHeadsResult(Result):
    """Per-head matrices are indexed [layer][head] over `layers` x `num_heads`."""

    model: str
    data: str
    axis: str
    layers: list[int]
    num_heads: int
    restore_from: int
    baseline_top1: float
    baseline_top1_ci95: list[float]  # Wilson 95 % interval
    n_top1_images: int
    # adaptive top-1 (None: every head on every image): the screen's images, and per head how many of
    # the first top-1 images its drop and intervals rest on (the screen's, or all for heads in the race)
    top1_screen_images: int | None = None
    top1_images_per_head: list[list[int]] | None = None
    n_probe_images: int
    recovery_restore: float
    axis_index: list[list[float]]
    # bootstrap over the attention images, [layer][head] -> [lo, hi] (None in results written before it)
    axis_index_ci95: list[list[list[float]]] | None = None
    kl: dict[str, list[list[float]]]
    rebuild_score: list[list[float | None]]  # None for heads in layers < R
    # paired bootstrap over the probes' test images (None in results written before the intervals)
    recovery_restore_ci95: list[float] | None = None
    rebuild_score_ci95: list[list[list[float] | None]] | None = None
    mean_ablate_score_ci95: list[list[list[float] | None]] | None = None
    # cross-check: the fall in Rec when the head's output (blocks.L.z, patch tokens) is replaced by
    # its mean under the restore condition
    mean_ablate_score: list[list[float | None]]
    top_heads: dict[str, list[list[int]]] | None = None  # TOP_K heads by each method
    top_heads_overlap: int | None = None  # heads in both the rebuild and the mean_ablate top lists
    # (iii) direct effect under the restore condition: the head's output through the output projection,
    # read by the layer's clean axis probe (logit of the true coordinate minus the mean logit); None before R
    direct_effect_score: list[list[float | None]] | None = None
    direct_effect_ci95: list[list[list[float] | None]] | None = None  # bootstrap over the probe images
    top_heads_agreement: dict[str, int] | None = None  # "a~b": heads in both methods' top lists
    top_heads_recovery_fraction: dict[str, float | None] | None = None  # fall in Rec / Rec, top heads jointly
    drop_points: list[list[float]]
    drop_ci95: list[list[list[float]]]  # [layer][head] -> [lo, hi] points
    # drop(primary) - drop(head), points (None without a primary rebuilding head)
    primary_margin_ci95: list[list[list[float] | None]] | None
    primary_rebuilding_head: list[int] | None
    primary_head_drop_rank: int | None
    largest_drop_head: list[int]
    primary_head_drop_rank_after_R: int | None
    largest_drop_head_after_R: list[int] | None
    primary_is_largest_drop: bool
    specialised_heads: list[list[int]]
    # issue 29 (None in results written before it): the fall in each axis' mean Rec per head; how often
    # each head would be primary over paired bootstrap resamples of the probe images ("L<l>H<h>" -> share)
    rebuild_score_axis: dict[str, list[list[float | None]]] | None = None
    selection_frequency: dict[str, float] | None = None
    primary_selection_frequency: float | None = None
    # S measured in the restore condition (layers >= R), with the null of relabelled rotary pairs
    axis_index_restore: list[list[float | None]] | None = None
    axis_index_restore_ci95: list[list[list[float] | None]] | None = None
    axis_index_null_threshold: float | None = None  # NULL_QUANTILE of the null |S|
    axis_index_null_n: int | None = None
    axis_index_null_quantiles: dict[str, float] | None = None  # sensitivity: the threshold at other quantiles
    primary_axis: str | None = None  # the axis whose recovery the primary head carries (its larger fall)
    primary_axis_index_matched: float | None = None  # restore-condition S, + for row, signed to primary_axis
    primary_axis_index_matched_ci95: list[float] | None = None
    primary_recovery_share: float | None = None  # the primary's fall in Rec / Rec
    primary_recovery_share_ci95: list[float] | None = None
    top_heads_recovery_fraction_ci95: dict[str, list[float] | None] | None = None
    restore_sweep: dict[str, SweepPoint] | None = None  # str(R) -> the primary chosen at R (R's own included)
    # C5 under each ablation of a head (None in results written before them or without a primary):
    # 'identity' (rotations removed: the drops above, every head), 'swap', 'shift', 'jitter', 'rescale'
    # (the head's rotations recomputed from edited coordinates) and 'mean_output' (its output mean-ablated),
    # on the heads `c5_ablation_heads_rule` names; c5_rests_on: the ablation C5's verdict reads
    c5_ablations: dict[str, C5Ablation] | None = None
    c5_ablation_heads_rule: str | None = None
    c5_rests_on: str | None = None


def closest_rival(margins: Any) -> tuple[list[int], list[float]] | None:
    """([layer, head], margin) of the other head whose margin drop(primary) - drop(head) has the
    lowest lower end (a `primary_margin_ci95` grid, as results.json holds it); None without one."""
    found = [([li, h], m) for li, row in enumerate(margins or []) for h, m in enumerate(row or [])
             if isinstance(m, list) and len(m) == 2]
    return min(found, key=lambda hm: hm[1][0]) if found else None


class SweepPoint(BaseModel):
    """The primary rebuilding head chosen at one restore point R: every head's fall in mean Rec
    when its rotations stay removed (heads of layers >= R), the head with the largest fall, and
    how often each head would be chosen over paired bootstrap resamples of the probe images."""

    recovery_restore: float
    rebuild_score: list[list[float | None]]
    primary: list[int] | None
    selection_frequency: dict[str, float] | None = None
