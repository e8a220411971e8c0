"""E4 (C3, C4)'s result, and the pure readers of C3's fractions and C4's medians that the claims
use on it (`vitpos.experiments.rope_axis` measures it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

from pydantic import BaseModel, ConfigDict

from vitpos.results.common import AxisSweepResult, CountMatched, ProbedCondition, Recovery

Condition = ProbedCondition  # (the name results and plots know it by)


MIN_ABOVE_CHANCE = 0.05  # a layer enters C3's fractions where its baseline accuracy is this far above chance


def above_chance_layers(base: Sequence[float], chance: float) -> list[int]:
    """Indices of the layers whose baseline accuracy is >= MIN_ABOVE_CHANCE above chance."""
    return [i for i, b in enumerate(base) if b - chance >= MIN_ABOVE_CHANCE]


def kept_fraction(base: Sequence[float], cond: Sequence[float], chance: float) -> float | None:
    """Mean over the above-chance layers of (cond - chance) / (base - chance): the share of the
    baseline's above-chance decodability a condition keeps (None without such a layer). C3's
    removed fraction is 1 - this for the removed axis, its kept fraction this for the other."""
    used = [i for i in above_chance_layers(base, chance) if i < len(cond)]
    if not used:
        return None
    vals = [(cond[i] - chance) / (base[i] - chance) for i in used]
    return sum(vals) / len(vals)


def median_recovery(per_r: Mapping[str, Mapping[str, Any]]) -> float:
    """Median over the restore points of mean Rec (those with one; NaN if none): C4's number."""
    return median([r["mean_rec"] for r in per_r.values() if r["mean_rec"] is not None] or [float("nan")])


def median_rebuilt_share(per_r: Mapping[str, Mapping[str, Any]]) -> float:
    """Median over the restore points of the mean rebuilt share (those with one; NaN if none):
    what C4 reads, against the count-matched reference (`CountMatched`)."""
    return median([r["mean_share"] for r in per_r.values() if r["mean_share"] is not None] or [float("nan")])


class AxisRemoval(BaseModel):
    """C3's fractions for one no_<axis> condition: of the removed axis' above-chance decodability
    the share removed, of the other axis' the share kept; each with its paired bootstrap interval."""

    removed: float | None
    removed_ci95: list[float] | None
    kept: float | None
    kept_ci95: list[float] | None
    removed_layers: list[int]  # the layers each fraction averages (baseline above chance)
    kept_layers: list[int]


class MedianRecovery(BaseModel):
    """C4's number for one axis: the median over restore points of mean Rec, with the median over
    restore points of each paired resample's mean Rec as its interval."""

    median_rec: float | None  # None: no restore point has a mean Rec (NaN in results written before)
    median_rec_ci95: list[float] | None
    restore_points: list[int]  # the Rs with a mean Rec


class MedianShare(BaseModel):
    """C4's count-matched number for one axis: the median over restore points of the mean rebuilt
    share (`CountMatched`), its interval the median over restore points of each paired resample's."""

    median_share: float | None  # None: no restore point has a mean share (NaN in results written before)
    median_share_ci95: list[float] | None = None
    restore_points: list[int]  # the Rs with a mean rebuilt share


class ReadoutRemoval(BaseModel):
    """C3's fractions of one no_<axis> condition for one read-out kind (linear or MLP), over the
    read-outs' layers: of the removed axis (and of its offset Δ<axis>) the share removed, of the
    other axis (and its offset) the share kept; each with its paired bootstrap interval."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    removed: float | None
    removed_ci95: list[float] | None
    kept: float | None
    kept_ci95: list[float] | None
    removed_pair: float | None
    removed_pair_ci95: list[float] | None
    kept_pair: float | None
    kept_pair_ci95: list[float] | None

    def fractions(self) -> list[tuple[float | None, list[float] | None]]:
        """(point, interval) of removed, kept, removed_pair, kept_pair, in that order."""
        return [(self.removed, self.removed_ci95), (self.kept, self.kept_ci95),
                (self.removed_pair, self.removed_pair_ci95), (self.kept_pair, self.kept_pair_ci95)]


class Readouts(BaseModel):
    """The MLP and relative-position read-outs (`vitpos.analysis.readout`) under baseline, no_row,
    no_col and no_both, at a few layers, on their own image split (the same test images under
    every condition); removal fractions as C3's, over these layers, with paired intervals."""

    layers: list[int]
    n_images: int
    n_test_images: int
    chance: dict[str, float]  # row, col, drow, dcol: majority-class rate
    accuracy: dict[str, dict[str, dict[str, dict[str, float]]]]  # condition -> str(layer) -> kind -> target
    removal: dict[str, dict[str, ReadoutRemoval]]  # no_<axis> -> kind (linear, mlp) -> fractions


class FlooredRemoval(BaseModel):
    """C3's fractions with a per-layer floor instead of chance: the content baseline of each layer,
    the same model's no_both accuracy (rotations gone: what content alone gives the probe there),
    never below chance. A layer enters where the baseline is >= MIN_ABOVE_CHANCE above its floor."""

    removed: float | None
    removed_ci95: list[float] | None = None
    kept: float | None
    kept_ci95: list[float] | None = None
    removed_layers: list[int]
    kept_layers: list[int]
    interaction: bool = False  # kept's interval lies above 1: the other axis gains when this one goes


class RopeAxisResult(AxisSweepResult):
    rope: dict[str, Any]  # the model's RopeAxisMap.to_json(): kind, layout, channels
    conditions: dict[str, Condition]
    recovery: dict[str, dict[str, Recovery]]  # axis -> str(R) -> recovery
    min_gap: float
    # C3 / C4 with intervals (None in results written before them)
    removal: dict[str, AxisRemoval] | None = None  # no_row / no_col -> fractions
    median_recovery: dict[str, MedianRecovery] | None = None  # row / col
    # count-matched reference (None in results written before it): axis -> str(R) -> CountMatched
    count_matched: dict[str, dict[str, CountMatched]] | None = None
    median_rebuilt_share: dict[str, MedianShare] | None = None  # row / col: what C4 reads
    # C3 calibrated (issue 29; None in results written before it): per-layer content floors, read-outs
    removal_floored: dict[str, FlooredRemoval] | None = None  # no_row / no_col
    content_floor: dict[str, list[float]] | None = None  # row / col: the floor per layer (no_both, >= chance)
    readouts: Readouts | None = None


def floored_kept(base: Sequence[float], cond: Sequence[float],
                 floor: Sequence[float]) -> tuple[float | None, list[int]]:
    """Mean over layers whose baseline is >= MIN_ABOVE_CHANCE above the floor of
    (cond - floor) / (base - floor), and those layers (None without one)."""
    used = [i for i, (b, f) in enumerate(zip(base, floor, strict=True)) if b - f >= MIN_ABOVE_CHANCE]
    if not used:
        return None, []
    return sum((cond[i] - floor[i]) / (base[i] - floor[i]) for i in used) / len(used), used
