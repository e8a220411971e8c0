"""One axis removed per frequency band and layer window (`vitpos.experiments.rope_freq` measures it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from vitpos.results.base import Result


class BandInfo(BaseModel):
    """One band of an axis' frequencies: its rotary pairs per head and their frequency range
    (radians per patch along the axis; over every layer and head for mixed RoPE)."""

    name: str
    index: int | None  # None: every band (the axis removed)
    pairs: int
    freq_min: float
    freq_max: float


class Condition(BaseModel):
    """Probe accuracies at the probed layers and top-1 with one axis removed in one band and window."""

    axis: str | None  # None: the clean model
    band: str | None
    window: list[int] | None  # [start, stop)
    row_acc: list[float]  # retrained probes, per probed layer
    col_acc: list[float]
    row_acc_orig_probe: list[float]  # the clean model's probes
    col_acc_orig_probe: list[float]
    top1: float
    top1_ci95: list[float]
    top1_drop_points: float | None  # 100 x (clean - this); None for the clean model
    top1_drop_ci95: list[float] | None  # points; paired bootstrap over the same images
    axis_drop_points: list[float] | None  # per probed layer: 100 x (clean - this), the removed axis' retrained probe
    axis_drop_ci95: list[list[float]] | None  # points; paired bootstrap over the probe test images
    share: list[float | None] | None  # axis drop / the whole axis' drop in the window; None where < MIN_GAP


class BandSplit(BaseModel):
    """High band vs low band of one axis in one window, at the final probed layer."""

    axis: str
    window: list[int]
    layer: int
    high_minus_low_axis_drop_points: float  # > 0: removing the high band costs more of the axis' decodability
    high_minus_low_axis_drop_ci95: list[float]  # points, paired over the probe test images
    high_minus_low_top1_drop_points: float
    high_minus_low_top1_drop_ci95: list[float]  # points, paired over the images
    position_in: Literal["high", "low", "unresolved"]  # the band whose removal costs more position (interval off 0)


class RopeFreqResult(Result):
    model: str
    data: str
    split: str
    n_images: int
    n_probe_test_images: int
    site: str
    layers: list[int]  # probed layers
    windows: list[list[int]]
    bands: int
    rope_kind: str
    chance_row: float
    chance_col: float
    band_info: dict[str, list[BandInfo]]  # axis -> its bands, lowest first, then `all`
    conditions: dict[str, Condition]
    splits: list[BandSplit]
    min_gap: float
