"""The SAE layer as a sweep: C1 and C2 per site and the claims over the plausible sites
(`vitpos.experiments.sae_layers` measures it).

Sites (issue 47): the embedding (`resid_pre` of block 0: the APE-added tokens, where position enters;
key "embed") first, then every swept block output (`resid_post`; key "L<layer>"). Sweeps written before
it swept block outputs only: their points load with site resid_post, their `plausible_layers` /
`selected_layer` as `plausible_sites` / `selected_site`.

Held out (issue 47 item 4): the site is not chosen on the images whose numbers the verdict reads. The
permutation images are split in two disjoint halves (`HeldOutSplit`): half A selects (each point's
`selection_frequency`, `selection_drop`), half B gives every number C1 and C2's permutation reads there
(`permute`, `all_positional_drop`, ...). Sweeps written before it (`held_out` None) chose and read on the
same images; they load as they were and say so."""

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
    selection_frequency: float  # how often the bootstrap (over half A's images) picks this site as the largest drop
    # the all-positional drop (points) that selects, on half A's images, and its paired-bootstrap interval (None:
    # a sweep before issue 47 item 4, which selected on `all_positional_drop`, the verdict's own images)
    selection_drop: float | None = None
    selection_drop_ci95: list[float] | None = None
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


class HeldOutSplit(BaseModel):
    """The sweep's permutation images in two disjoint halves: A selects the site, B is read at it."""

    rule: str  # the split in words
    seed: int  # the split's generator seed (the run seed)
    n_images: int  # the permutation images split: the first n_images of the test split (indices 0..n_images-1)
    selection: list[int]  # half A: chooses the plausible sites
    verdict: list[int]  # half B: every number the claims read at them

    @model_validator(mode="after")
    def _halves(self) -> HeldOutSplit:
        a, b = set(self.selection), set(self.verdict)
        if a & b or a | b != set(range(self.n_images)) or len(a) != len(self.selection) or len(b) != len(self.verdict):
            raise ValueError("the halves must be disjoint and cover the n_images permutation images, each once")
        return self

    def said(self, rule: bool = False) -> str:
        """'site chosen on half A (n images), read on half B (m images)', and how the halves were drawn."""
        how = f": {self.rule}, seed {self.seed}" if rule else ""
        return f"site chosen on half A ({len(self.selection)} images), read on half B ({len(self.verdict)} images){how}"


class SAESweepResult(BaseModel):
    model: str
    data: str
    layers: list[int]  # the block outputs swept (the embedding, when swept, is the first point)
    layer_rule: str
    points: list[LayerPoint]
    selected_site: str | None  # the point argmax of the selecting all-positional drop (half A's; a point's `key`)
    plausible_sites: list[str]  # the points' keys
    # which images selected the site and which are read at it (None: a sweep before issue 47 item 4, which
    # selected and read on the same images)
    held_out: HeldOutSplit | None = None
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

    def selection_said(self, rule: bool = False) -> str:
        """Which images chose the plausible sites and which the claims read there, in words (`rule`: and how the
        halves were drawn)."""
        if self.held_out is not None:
            return self.held_out.said(rule)
        return "site chosen and read on the same images (a sweep written before issue 47 item 4)"

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
