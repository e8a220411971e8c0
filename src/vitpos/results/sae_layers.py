"""The SAE layer as a sweep: C1 and C2 per site and the claims over the plausible sites
(`vitpos.experiments.sae_layers` measures it).

Sites (issue 47): the embedding (`resid_pre` of block 0: the APE-added tokens, where position enters;
key "embed") first, then every swept block output (`resid_post`; key "L<layer>"). Sweeps written before
it swept block outputs only: their points load with site resid_post, their `plausible_layers` /
`selected_layer` as `plausible_sites` / `selected_site`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from vitpos.results.ape_permute import ApePermuteResult, PositionBudget
from vitpos.results.base import Result
from vitpos.results.sae_run import GivenSAEResult

PLAUSIBLE = 0.05  # a layer chosen in at least this fraction of the bootstrap resamples is a plausible choice


EMBED = "embed"  # the key of the embedding site: resid_pre of block 0


def site_key(layer: int, site: str) -> str:
    """A swept site's key: "embed" for resid_pre of block 0, "L<layer>" for a block output, else both."""
    if site == "resid_pre" and layer == 0:
        return EMBED
    return f"L{layer}" if site == "resid_post" else f"L{layer}.{site}"


class LayerPoint(BaseModel):
    """One site of the sweep: the SAE's features and the typed results C1 and C2 read there."""

    layer: int  # the block whose `site` the SAE encodes (0 with resid_pre: the embedding)
    site: str = "resid_post"  # sweeps before issue 47 had block outputs only
    fvu: float
    n_row: int
    n_col: int
    n_mixed: int
    all_positional_drop: float | None
    all_positional_drop_ci95: list[float] | None
    swap_null_drop: float | None
    selection_frequency: float  # how often the bootstrap picks this site as the largest drop
    # the all-positional permutation's share of the APE-table shuffle's effect (None: a sweep before issue 47;
    # every edit's: `permute.position_budget`)
    all_positional_budget: PositionBudget | None = None
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

    @property
    def key(self) -> str:
        """"embed" or "L<layer>": what the report, the selection and the claims call this site."""
        return site_key(self.layer, self.site)


class SweepClaim(BaseModel):
    """A claim over the plausible layers as sweeps written before the claims read the curve recorded it."""

    result: str  # holds / fails / inconclusive over the plausible layers
    per_plausible_layer: dict[str, str]


class SAESweepResult(BaseModel):
    model: str
    data: str
    layers: list[int]  # the block outputs swept (the embedding, when swept, is the first point)
    layer_rule: str
    points: list[LayerPoint]
    selected_site: str | None  # the point argmax of the all-positional drop (a point's `key`)
    plausible_sites: list[str]  # the points' keys
    # older sweeps only (see LayerPoint.c1): the claims over the plausible layers; the claims read them now
    c1: SweepClaim | None = None
    c2: SweepClaim | None = None

    @model_validator(mode="before")
    @classmethod
    def _older_sweep(cls, doc: Any) -> Any:
        """A sweep written before issue 47 (block outputs only) names its choices by layer: as site keys."""
        if isinstance(doc, dict) and "plausible_layers" in doc and "plausible_sites" not in doc:
            doc = dict(doc)
            doc["plausible_sites"] = [site_key(int(x), "resid_post") for x in doc.pop("plausible_layers")]
            sel = doc.pop("selected_layer", None)
            doc["selected_site"] = None if sel is None else site_key(int(sel), "resid_post")
        return doc

    @property
    def sites(self) -> list[str]:
        """The swept sites' keys in sweep order (the embedding first where it was swept)."""
        return [p.key for p in self.points]


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

    def point(self, key: str) -> LayerPoint | None:
        """The point of site `key` ("embed", "L<layer>")."""
        return next((p for p in self.points if p.key == key), None)
