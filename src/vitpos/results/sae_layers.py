"""The SAE layer as a sweep: C1 and C2 per layer and the claims over the plausible layers
(`vitpos.experiments.sae_layers` measures it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from vitpos.results.ape_permute import ApePermuteResult
from vitpos.results.base import Result
from vitpos.results.sae_run import GivenSAEResult

PLAUSIBLE = 0.05  # a layer chosen in at least this fraction of the bootstrap resamples is a plausible choice


class LayerPoint(BaseModel):
    """One layer of the sweep: the SAE's features and the typed results C1 and C2 read there."""

    layer: int
    fvu: float
    n_row: int
    n_col: int
    n_mixed: int
    all_positional_drop: float | None
    all_positional_drop_ci95: list[float] | None
    swap_null_drop: float | None
    selection_frequency: float  # how often the bootstrap picks this layer as the largest drop
    # what C1 and C2 read at this layer, typed: the claims read the curve with their own rules
    # (None: a sweep written without them; the claims then read `c1` / `c2` as they were)
    sae: GivenSAEResult | None = None
    permute: ApePermuteResult | None = None
    # sweeps written before the claims read the curve themselves: C1 / C2's result (holds / fails /
    # inconclusive) and numbers at this layer as the sweep recorded them; None / {} in newer ones
    c1: str | None = None
    c2: str | None = None
    c1_numbers: dict[str, Any] = Field(default_factory=dict)
    c2_numbers: dict[str, Any] = Field(default_factory=dict)


class SweepClaim(BaseModel):
    """A claim over the plausible layers as sweeps written before the claims read the curve recorded it."""

    result: str  # holds / fails / inconclusive over the plausible layers
    per_plausible_layer: dict[str, str]


class SAESweepResult(BaseModel):
    model: str
    data: str
    layers: list[int]
    layer_rule: str
    points: list[LayerPoint]
    selected_layer: int | None  # the point argmax of the all-positional drop
    plausible_layers: list[int]
    # older sweeps only (see LayerPoint.c1): the claims over the plausible layers; the claims read them now
    c1: SweepClaim | None = None
    c2: SweepClaim | None = None


class SAELayersResult(SAESweepResult, Result):
    """The per-layer curve: one point per swept layer (its SAE's features, C1 and C2 there, the typed
    results they read), the selection frequency of each layer and the claims over the plausible ones
    (the sweep's fields), with the sizes each layer was measured with."""

    # the sizes each layer was measured with
    sae_images: int
    sae_eval_images: int
    sae_epochs: int
    sae_expansion: int
    sae_k: int
    permute_images: int
    seeds: list[int]
    sae_high_norm: float | None = None  # the outlier rule's factor (the sae stage's `high_norm`; None: OUTLIER_K)

    def point(self, layer: int) -> LayerPoint | None:
        return next((p for p in self.points if p.layer == layer), None)
