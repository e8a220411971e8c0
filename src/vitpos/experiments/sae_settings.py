"""The sae stage's settings: the `sae:` config section (`SAESettings`, also the `vitpos sae` command's
options) and what the stage runs with once its layer is chosen (`SAEStageSettings`).

Their own module, so that the SAE grid (`sae_seeds`) and the sae stage (`sae_run`) read one typed
object without importing each other."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from vitpos.experiments.common import CAUSAL_ON_RUN_DATA, SAESite

# the keys the stage's settings (its cache key) hold only when set: the stage keys, and the caches, of
# runs that do not use them are those from before the keys existed
SWEEP_DEFAULTS: dict[str, Any] = {"data": None, "seeds": 1, "expansions": None, "high_norm": None}
LAYER_FROM_PROBES = "max min(row, col) probe accuracy"


class SAESettings(SAESite):
    """`sae:` in the run config (`layer` and `site`: `SAESite`)."""

    # eval_images 1000: the quick run keeps the held-out size it had when the full default was 1000 (its
    # numbers are the golden files, written per CPU family; the full default fell to 500 in issue 48)
    QUICK = {"images": 400, "epochs": 2, "expansion": 4, "eval_images": 1000}
    arch: Literal["topk", "batchtopk", "relu"] = "topk"
    k: int = Field(default=32, ge=1, description="active latents per token for topk / batchtopk")
    expansion: int = Field(default=8, ge=1, le=256, description="latents = expansion x width")
    # 2000 / 500 (4000 / 1000 before issue 48): three SAE seeds instead of one in the default run's 30 minutes
    images: int = Field(default=2000, ge=1, description="training images (their patch tokens)")
    eval_images: int = Field(default=500, ge=2,
                             description="held-out test images: metrics, feature scores, causal check")
    epochs: int = Field(default=4, ge=1, le=1000)
    lr: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                             description="Adam learning rate; None = 2e-3, ∝ 1/√F above 768 latents "
                             "(vitpos.sae.train.default_lr)")
    data: str | None = Field(default=None, description="images the SAE trains and is scored on (its C1 causal check "
                             "too); None = the run's data. e.g. natural, for a model whose labelled task is fashion")
    seeds: int = Field(default=1, ge=1, description="SAE seeds (run seed, +1, ...): > 1 adds the sweep and its seed "
                       "stability to sae.json; C1 / C2 read the run seed's SAE")
    expansions: list[Annotated[int, Field(ge=1)]] | None = Field(
        default=None, min_length=1, description="dictionary sizes of the sweep (x width); None = [expansion]")
    high_norm: float | None = Field(default=None, gt=1, allow_inf_nan=False,
                                    description="leave patch tokens above this x the median patch-token norm out of "
                                    "SAE training (high-norm artifact tokens); None = keep every patch token")
    stability: bool = Field(default=True, description="also train the SAE with seed + 1: the seed-stability number")
    claim_seeds: int = Field(default=3, ge=1, le=20, description="SAE training seeds C1 and C2 read (run seed, +1, "
                             "...): each extra seed's SAE types its own latents, gets its own causal check and "
                             "permutation, and the intervals cover seeds x images (seed + 1 reuses the stability "
                             "SAE)")
    include_special: bool = Field(default=False, description="train on high-norm outlier patch tokens too")
    browse: bool = Field(default=True, description="write the latent browser page (linked from report.html)")

    def stage(self, layer: int | None) -> SAEStageSettings:
        """These settings as the stage runs them: at `layer` (None: still to be chosen by the probes)."""
        given = self.layer is not None
        return SAEStageSettings.model_validate({
            **{k: getattr(self, k) for k in type(self).model_fields}, "layer": self.layer if given else layer,
            "layer_choice": "given" if given else LAYER_FROM_PROBES,
            # C1's causal check reads the run's labelled data when the SAE reads other images (keyed apart)
            "causal_data": CAUSAL_ON_RUN_DATA if self.data is not None else None})


class SAEStageSettings(SAESettings):
    """The sae stage's settings: the section, its layer (given or chosen by the probes) and how it was chosen."""

    layer_choice: str
    causal_data: str | None = None

    @model_serializer(mode="wrap")
    def _keyed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        doc = handler(self)
        return {k: v for k, v in doc.items()
                if not (k in SWEEP_DEFAULTS and v == SWEEP_DEFAULTS[k]) and not (k == "causal_data" and v is None)}
