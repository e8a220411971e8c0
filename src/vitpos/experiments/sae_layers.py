"""The SAE layer as a sweep, a stage of `vitpos run` (issue 28): an SAE, C1 and C2 at every layer.

Since issue 47 the sweep starts where position enters: the embedding (`resid_pre` of block 0, the
APE-added tokens; `sae_layers.embed`, on by default), then every swept block output; each point says
its site, and the embedding is one more site to the selection of the plausible sites.

The sae and ape_permute stages measure C1 and C2 at one layer, the one `choose_sae_layer` picks
(max of min(row, col) probe accuracy: 1.00 at every layer of an APE model, so a float tie-break).
This stage runs `run_sae_sweep` (`experiments/sae_sweep.py`): at every layer but the last (on
models deeper than `max_layers` + 1, `max_layers` evenly spaced ones) an SAE of its own, its
causal check (C1) and the permutation of its positional features (C2), each read by the claims'
per-model rules; the bootstrap selection frequency of the largest all-positional drop gives the
plausible layers, and the claims read C1 and C2 over them (`vitpos.claims`): a claim holds for the
model when it holds at every plausible layer, fails when it fails at all of them, and is
inconclusive otherwise. The single-layer readings stay reported beside it. The site is not chosen on
the outcome (issue 47 item 4): the permutation images are split in two halves seeded with the run seed;
half A's all-positional drops choose the plausible sites, half B gives every permutation number read
there (`sae_sweep.held_out_halves`; the result's `held_out` names both).

Each layer's SAE is smaller than the sae stage's (`SAELayersSettings`: sized so that the 4 APE
models of the default zoo add about 5 minutes to `vitpos run` on 2 idle cores; a config can set the sae
stage's sizes, as configs/dinov2-tiles.yaml does), trained on resid_post with the sae stage's architecture
(TopK), images (`sae.data`) and high-norm rule (`sae.high_norm`); `--quick` turns the stage off (not
applicable, with the reason), so the quick run's results are those of the single layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from vitpos.errors import VitposError
from vitpos.experiments import sae_layers_section
from vitpos.experiments.base import Done, Experiment, Figure, Settings, SplitSizes, StageInput, StagePlan
from vitpos.experiments.common import CAUSAL_ON_RUN_DATA
from vitpos.experiments.sae_settings import SAESettings
from vitpos.experiments.sae_sweep import LayerMeasures, plan_sae_sweep, run_sae_sweep, sweep_layers
from vitpos.models.surface import ModelSurface
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.sae_layers import SAELayersResult

SWEEP_BATCH_TOKENS = 4096  # run_sae's training batch (the sae stage's)


class SAELayersSettings(Settings):
    """`sae_layers:` in the run config (one SAE per swept layer: these are its sizes)."""

    QUICK = {"enabled": False}
    enabled: bool = Field(default=True, description="run the sweep (--quick turns it off: not applicable)")
    embed: bool = Field(default=True, description="start at the embedding (resid_pre of block 0, where the APE "
                        "enters) before the block outputs")
    max_layers: int = Field(default=8, ge=2, description="layers swept at most: every layer but the last when that "
                            "is no more, else this many evenly spaced ones from 0 to depth - 2")
    # 500 / 300 / 300 (1000 / 400 / 400 before issue 48): the default run's 30-min budget with 3 SAE seeds
    images: int = Field(default=500, ge=1, description="SAE training images per layer (train split)")
    eval_images: int = Field(default=300, ge=2, description="held-out test images per layer: feature scores and "
                             "C1's causal check (its intervals)")
    epochs: int = Field(default=2, ge=1, le=1000)
    expansion: int = Field(default=4, ge=1, le=256)
    k: int = Field(default=32, ge=1)
    permute_images: int = Field(default=300, ge=2, description="test images of each layer's permutation, split "
                                "in two halves: half A (n // 2) selects the plausible layers by the bootstrap, half "
                                "B (the rest) is what C2 reads there")
    seeds: int = Field(default=1, ge=1, le=100, description="permutation seeds per layer")


class SAELayersStageSettings(SAELayersSettings):
    """The stage's settings: the section (less `enabled`), the swept layers, and the sae stage's data and
    high-norm rule, which apply to every layer's SAE (in the cache key only when set, so the keys of runs
    without them stay as they were)."""

    layers: list[int]
    sae_data: str | None = None  # the sae stage's images for its SAEs (None: the run's data)
    causal_data: str | None = None
    high_norm: float | None = None
    claim_seeds: int = 1  # the sae stage's SAE seeds, at every plausible site (issue 48)

    @model_serializer(mode="wrap")
    def _keyed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items()
                if k != "enabled" and not (k in ("sae_data", "causal_data", "high_norm") and v is None)}


class SAELayersExperiment(Experiment[SAELayersResult, SAELayersStageSettings]):
    name = "sae_layers"
    # 2 (issue 47): the embedding site first, the position budget; older sweeps are recomputed; 3 (issue 48): the
    # sae stage's SAE seeds (sae.claim_seeds) at every plausible site, C1 / C2 pooled over them there; 4 (issue 47
    # item 2): the position budget pooled over those SAE seeds too, which C2 (rules version 7) reads at each site;
    # 5 (issue 47 item 4): the permutation images in two halves, the site chosen on half A and read on half B
    version = 5
    title = "The SAE layer as a sweep (C1, C2 per site, from the embedding)"
    claims = ("C1", "C2")
    result_type = SAELayersResult
    settings_type = SAELayersSettings
    scheme = "ape"  # as ape_permute: a model with a learned / explicit APE

    def __init__(self, measures: LayerMeasures):
        self.measures = measures  # the sae and ape_permute run functions, handed in by the registry

    def disabled(self, config: Any) -> str | None:
        if cast(SAELayersSettings, self.settings_of(config)).enabled:
            return None
        return ("not run: sae_layers.enabled is false (--quick turns it off); C1 and C2 read the single SAE layer "
                "of the sae stage")

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done],
                       quick: bool) -> SAELayersStageSettings:
        s = cast(SAELayersSettings, self.settings_of(config))
        sae = cast(SAESettings, config.section("sae"))
        # the sae stage's high-norm rule (DINOv2's artifact tokens) applies to every layer's SAE
        return SAELayersStageSettings.model_validate({
            **{k: getattr(s, k) for k in type(s).model_fields}, "layers": sweep_layers(surface.depth, s.max_layers),
            "sae_data": sae.data, "causal_data": None if sae.data is None else CAUSAL_ON_RUN_DATA,
            "high_norm": sae.high_norm, "claim_seeds": sae.claim_seeds})

    def check(self, settings: SAELayersStageSettings, surface: ModelSurface, data: str,
              sizes: SplitSizes | None) -> None:
        from vitpos.experiments.common import sae_config

        if not settings.layers:
            raise VitposError(f"sae_layers: {surface.spec} has depth {surface.depth}, no layer with a later one to "
                              "read the causal check; set sae_layers.enabled: false")
        sae_config(surface, "topk", settings.k, settings.expansion)
        n = settings.images
        if sizes is not None:
            try:
                n = sizes.n("train", n)
            except ValueError:
                pass
        if n * surface.num_patches < SWEEP_BATCH_TOKENS:
            need = -(-SWEEP_BATCH_TOKENS // surface.num_patches)
            raise VitposError(f"sae_layers.images {n} give {n * surface.num_patches} patch tokens, fewer than one SAE "
                              f"batch ({SWEEP_BATCH_TOKENS}); set sae_layers.images to at least {need}")

    def plan(self, settings: SAELayersStageSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        # each layer's SAE as the sae stage would count it, at these sizes
        sae = SAESettings(images=settings.images, eval_images=settings.eval_images, epochs=settings.epochs,
                          expansion=settings.expansion)
        return plan_sae_sweep(surface, sizes, list(settings.layers), sae, settings.permute_images, settings.seeds,
                              self.measures, embed=settings.embed, claim_seeds=settings.claim_seeds)

    def run_stage(self, surface: ModelSurface, stage: StageInput[SAELayersStageSettings]) -> SAELayersResult:
        s = stage.settings
        kw = {"k": s.k, "expansion": s.expansion, "n_train_images": s.images,
              "n_eval_images": s.eval_images, "epochs": s.epochs, "seed": stage.seed, "keep_acts": False,
              "high_norm": s.high_norm}
        seeds = tuple(range(s.seeds))
        sweep = run_sae_sweep(surface, stage.data, self.measures, list(s.layers), sae_kw=kw,
                              permute_images=s.permute_images, seeds=seeds, out=stage.out, sae_data=s.sae_data,
                              progress=stage.progress, embed=s.embed, claim_seeds=s.claim_seeds,
                              split_seed=stage.seed)
        return SAELayersResult(
            **dict(sweep), sae_images=s.images, sae_eval_images=s.eval_images,
            sae_epochs=s.epochs, sae_expansion=s.expansion, sae_k=s.k, permute_images=s.permute_images,
            seeds=list(seeds), sae_high_norm=s.high_norm)

    def figures(self, result: SAELayersResult) -> list[Figure]:
        from vitpos import plots  # matplotlib is imported when a figure is drawn, not with the experiment

        return [Figure("sae_layers", "C1 and C2 per SAE site (the embedding first), with their controls, the "
                       "position budget, and how often each site is the largest all-positional drop",
                       lambda r, p: plots.plot_sae_layers(r, p))]

    def section(self, result: SAELayersResult, claims: ClaimRules) -> str:
        return sae_layers_section.section(result, claims)

    def summary(self, result: SAELayersResult, claim: str) -> str:
        return sae_layers_section.summary(result)


__all__ = ["SAELayersExperiment", "SAELayersSettings", "SAELayersStageSettings"]
