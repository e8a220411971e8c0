"""The SAE layer as a sweep, not a pick (issue 28): SAE + C1 + C2 at every layer, and a rule over the curve.

`choose_sae_layer` takes the layer maximising min(row, col) probe accuracy, which is 1.00 at every
layer of an APE model, so the layer is decided by float noise. Here each layer of `sweep_layers`
gets its own SAE (`run_sae`) and permutation (`run_ape_permute`), and the per-layer C1 / C2 results
come from the claims' own per-model rules (`study.claims`), so the curve is read with the rules of
the verdicts.

Which layer, with selection accounted for: the layer where position matters most for behaviour is
the one with the largest all-positional permutation drop. Its choice is bootstrapped (images
resampled, the same resample for every layer: the layers are measured on the same images), giving
each layer's selection frequency; the **plausible layers** are those chosen in >= PLAUSIBLE of the
resamples. The claim over the curve is then read at every plausible layer: it holds when it holds
at all of them, fails when it fails at all of them, and is inconclusive otherwise (the verdict would
depend on an unstable choice of layer).

Layers: every layer but the last (which has no downstream layer for the causal check) when that is
at most `max_layers`; on deeper models `max_layers` evenly spaced ones from 0 to depth - 2 (the
subset is recorded in the result).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from vitpos.analysis.stats import N_BOOT
from vitpos.experiments.ape_permute import ApePermuteResult
from vitpos.experiments.base import SplitSizes, StagePlan
from vitpos.experiments.common import SAESite
from vitpos.experiments.sae_run import GivenSAEResult
from vitpos.experiments.sae_settings import SAESettings
from vitpos.models.surface import ModelSurface

PLAUSIBLE = 0.05  # a layer chosen in at least this fraction of the bootstrap resamples is a plausible choice


def sweep_layers(depth: int, max_layers: int = 8) -> list[int]:
    """Every layer 0..depth-2, or `max_layers` evenly spaced ones on deeper models."""
    last = depth - 2
    if last < 0:
        return []
    if last + 1 <= max_layers:
        return list(range(last + 1))
    step = last / (max_layers - 1)
    return sorted({round(i * step) for i in range(max_layers)})


class LayerPoint(BaseModel):
    """One layer of the sweep: the SAE's features and the numbers and results C1 and C2 read."""

    layer: int
    fvu: float
    n_row: int
    n_col: int
    n_mixed: int
    c1: str  # holds / fails / inconclusive under the C1 rule at this layer
    c2: str
    c1_numbers: dict[str, Any]
    c2_numbers: dict[str, Any]
    all_positional_drop: float | None
    all_positional_drop_ci95: list[float] | None
    swap_null_drop: float | None
    selection_frequency: float  # how often the bootstrap picks this layer as the largest drop
    # what C1 and C2 read at this layer, typed, so the claims re-read the curve with their own rules
    # (None: a sweep written without them; the claims then read `c1` / `c2` as they were)
    sae: GivenSAEResult | None = None
    permute: ApePermuteResult | None = None


class SweepClaim(BaseModel):
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
    c1: SweepClaim
    c2: SweepClaim


def _over(results: Mapping[int, str], plausible: list[int]) -> SweepClaim:
    from vitpos.study.claims import FAILS, HOLDS, INCONCLUSIVE

    per = {str(layer): results[layer] for layer in plausible}
    vals = list(per.values())
    if vals and all(v == HOLDS for v in vals):
        res = HOLDS
    elif vals and all(v == FAILS for v in vals):
        res = FAILS
    else:
        res = INCONCLUSIVE if vals else FAILS
    return SweepClaim(result=res, per_plausible_layer=per)


def selection_frequency(drops: torch.Tensor, n_boot: int = N_BOOT, seed: int = 0) -> torch.Tensor:
    """drops (layers, images): per-image drop (clean correct - intervened correct) at each layer, on
    the same images. (layers,) fraction of image resamples in which each layer has the largest mean
    (layers tied for it share the resample equally)."""
    L, n = drops.shape
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(n, (n_boot, n), generator=g)
    means = drops.double()[:, idx].mean(-1)  # (layers, n_boot)
    top = means >= means.max(0).values - 1e-12  # layers tied for the largest share the resample: no tie-break
    return (top / top.sum(0)).sum(1) / n_boot


def layer_rule(depth: int, layers: list[int]) -> str:
    """How the swept layers were chosen, in words."""
    return (f"every layer 0..{depth - 2}" if layers == list(range(depth - 1))
            else f"{len(layers)} evenly spaced layers of 0..{depth - 2}")


def run_sae_sweep(surface: ModelSurface, data: Any, layers: list[int] | None = None, *, sae_kw: Mapping | None = None,
                  permute_images: int = 500, seeds: tuple[int, ...] = (0,), out: str | Path | None = None,
                  max_layers: int = 8, sae_data: Any = None, progress: bool = False) -> SAESweepResult:
    """Train an SAE at each layer and measure C1 (its causal check) and C2 (the permutation) there.

    `sae_kw`: keyword arguments of `run_sae` (k, expansion, n_train_images, ...). Each layer's SAE
    lives under out/L<layer>/ (reused when the same run is found there). `sae_data`: the images the
    SAEs train and are scored on (None: `data`), as the sae stage's `sae.data`; C1's causal check and the
    permutation (C2) read `data`."""
    from vitpos.data.resolve import data_name
    from vitpos.experiments.ape_permute import run_ape_permute
    from vitpos.experiments.sae_run import run_sae
    from vitpos.study.claims import _c1, _c2

    layers = sweep_layers(surface.depth, max_layers) if layers is None else list(layers)
    rule = layer_rule(surface.depth, layers)
    c1s, c2s, docs, per_image = {}, {}, {}, []
    for layer in layers:
        lo = Path(out) / f"L{layer}" if out is not None else None
        res, sae = run_sae(surface, layer, data=data if sae_data is None else sae_data, out=lo, progress=progress,
                           causal_data=data, **dict(sae_kw or {}))
        correct: dict[str, torch.Tensor] = {}
        ap = run_ape_permute(surface, sae, res.to_json(), data=data, n_images=permute_images, seeds=seeds,
                             keep_correct=correct, progress=progress)
        c1s[layer], c2s[layer] = _c1(surface.spec, res), _c2(surface.spec, ap)
        docs[layer] = (res, ap)
        if "all_positional" in correct:
            per_image.append(correct["baseline"].float() - correct["all_positional"].float().mean(0))
        else:
            per_image.append(torch.zeros_like(correct["baseline"], dtype=torch.float32))
    freq = selection_frequency(torch.stack(per_image)) if per_image else torch.zeros(0)
    drops = [None if (v := docs[layer][1].variant("all_positional")) is None else v.drop_points for layer in layers]
    known = [(d, i) for i, d in enumerate(drops) if isinstance(d, (int, float))]
    selected = layers[max(known)[1]] if known else None
    plausible = [layer for i, layer in enumerate(layers) if float(freq[i]) >= PLAUSIBLE]
    points = []
    for i, layer in enumerate(layers):
        res, ap = docs[layer]
        allpos, swap = ap.variant("all_positional"), ap.variant("swap_all_positional")
        points.append(LayerPoint(
            layer=layer, fvu=res.fvu, n_row=res.n_row_features, n_col=res.n_col_features,
            n_mixed=res.n_mixed_features, c1=c1s[layer].result, c2=c2s[layer].result,
            c1_numbers=c1s[layer].numbers, c2_numbers=c2s[layer].numbers,
            all_positional_drop=None if allpos is None else allpos.drop_points,
            all_positional_drop_ci95=None if allpos is None else allpos.drop_ci95,
            swap_null_drop=None if swap is None else swap.drop_points, selection_frequency=float(freq[i]),
            sae=GivenSAEResult.model_validate(res.to_json()), permute=ap))
    return SAESweepResult(model=surface.spec, data=data_name(data), layers=layers, layer_rule=rule, points=points,
                          selected_layer=selected, plausible_layers=plausible,
                          c1=_over({k: v.result for k, v in c1s.items()}, plausible),
                          c2=_over({k: v.result for k, v in c2s.items()}, plausible))


def plan_sae_sweep(surface: ModelSurface, sizes: SplitSizes, layers: list[int], sae_settings: SAESettings,
                   permute_images: int, seeds: int) -> StagePlan:
    """What run_sae_sweep computes over `layers`: at each, run_sae (as the sae stage counts it, without
    the latent browser and the seed-stability SAE, which the sweep does not run) and run_ape_permute
    (its upper bound: every variant has features). sae_settings: each layer's SAE's sizes (images,
    eval_images, epochs, expansion)."""
    from vitpos.experiments.ape_permute import ApePermuteStageSettings, plan_ape_permute
    from vitpos.experiments.sae_run import SAEExperiment

    plan = StagePlan()
    every_layer = sae_settings.updated(site="resid_post", browse=False, stability=False)
    for layer in layers:
        plan = plan + SAEExperiment().plan(every_layer.stage(layer), surface, sizes)
        permute = ApePermuteStageSettings(images=permute_images, seeds=seeds, sae=SAESite(layer=layer))
        plan = plan + plan_ape_permute(permute, surface, sizes)
    return StagePlan(plan.forwards, plan.blocks, plan.fits, plan.fit_work, plan.sae_tokens, plan.sae_work,
                     f"{len(layers)} layers x (an SAE, its causal check, the permutation); upper bound: every "
                     "feature set found at every layer")


__all__ = ["PLAUSIBLE", "LayerPoint", "SAESweepResult", "SweepClaim", "layer_rule", "plan_sae_sweep", "run_sae_sweep",
           "selection_frequency", "sweep_layers"]
