"""Probes and top-1 at larger input grids (`vitpos.experiments.extrapolate` measures it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from vitpos.results.base import Result


class SizeResult(BaseModel):
    """Probes per layer and top-1 at one input size."""

    scale: float  # grid rows at this size / at the training size
    img_size: list[int]  # (H, W) px the model takes
    grid: list[int]
    data_px: int | None  # px shapes were generated at (32 at the training size); None: fixed images, resized
    row_acc: list[float]
    col_acc: list[float]
    chance_row: float
    chance_col: float
    row_skill: list[float]  # (acc - chance) / (1 - chance), comparable across grids
    col_skill: list[float]
    top1: float | None  # None: refused (see the result's top1_refused)
    top1_ci: list[float] | None  # Wilson 95% interval over images
    per_group: dict[str, float] | None


class ExtrapolateResult(Result):
    model: str
    data: str
    split: str
    n_images: int  # per size
    site: str
    layers: list[int]
    scheme: str
    ape: str | None  # how the APE table reaches the larger grid; None: no APE
    rope_grid: Literal["extended", "rescaled"] | None  # None: no RoPE
    top1_refused: str | None
    sizes: list[SizeResult]  # the training size first, then by scale
