"""The SAE layer as a sweep, not a pick (issue 28): SAE + C1 + C2 at every site, and a rule over the curve.

Sites (issue 47): position enters an APE model at the embedding, and by the output of block 0 the prefix
token may already have read it, beyond the reach of an edit of the patch tokens; so the sweep starts at
the embedding (`resid_pre` of block 0, the APE-added tokens; key "embed", out/embed/) and then takes every
swept block output (`resid_post`, key "L<layer>", out/L<layer>/). The embedding is one more site to the
selection below: its drop enters the bootstrap like any layer's.

`choose_sae_layer` takes the layer maximising min(row, col) probe accuracy, which is 1.00 at every
layer of an APE model, so the layer is decided by float noise. Here each layer of `sweep_layers`
gets its own SAE (`run_sae`) and permutation (`run_ape_permute`); each point keeps the typed results
C1 and C2 read there, and the claims (`vitpos.claims.c1`, `c2`) read the curve with the rules of the
verdicts: the sweep itself decides nothing.

Which layer, with selection accounted for: the layer where position matters most for behaviour is
the one with the largest all-positional permutation drop. Its choice is bootstrapped (images
resampled, the same resample for every layer: the layers are measured on the same images), giving
each layer's selection frequency; the **plausible layers** are those chosen in >= PLAUSIBLE of the
resamples. The claim over the curve is then read at every plausible layer: it holds when it holds
at all of them, fails when it fails at all of them, and is inconclusive otherwise (the verdict would
depend on an unstable choice of layer).

Held out (issue 47 item 4): choosing the site by the drop the verdict then reads is selection on the
outcome. The permutation images (the first `permute_images` of the test split) are split by
`held_out_halves` (a permutation seeded with the run seed: half A its first n // 2, half B the rest).
Half A selects: at each site only the all-positional permutation runs on it (`SELECTION_VARIANTS`, the
drop that selects), and the bootstrap above resamples half A's images. Half B is read: the full
permutation (every variant, control, null, the position budget, and at a plausible site the extra SAE
seeds' permutations) runs on it, so every permutation number C2 reads at a site comes from images that
did not choose it. The image total is the same as before the split; half A's run is one variant.

Layers: every layer but the last (which has no downstream layer for the causal check) when that is
at most `max_layers`; on deeper models `max_layers` evenly spaced ones from 0 to depth - 2 (the
subset is recorded in the result).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitpos.analysis.stats import N_BOOT
from vitpos.data.base import Selection
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.experiments.base import SplitSizes, StagePlan
from vitpos.experiments.sae_settings import SAESettings, SAEStageSettings
from vitpos.models.surface import ModelSurface
from vitpos.results.ape_permute import ApePermuteResult, PermuteSeedPool, position_budget
from vitpos.results.sae_layers import EMBED, PLAUSIBLE, HeldOutSplit, LayerPoint, SAESweepResult, site_key
from vitpos.results.sae_run import GivenSAEResult, SAEResult
from vitpos.sae import SAE

# (the sae stage's settings at one layer, model, split sizes) -> the sae stage's plan there
PlanSAE = Callable[[SAEStageSettings, ModelSurface, SplitSizes], StagePlan]
# (layer, site, images, seeds, model, split sizes, SAE seeds, variants (None: every one)) -> the ape_permute
# stage's plan for that site's SAE
PlanPermute = Callable[[int, str, int, int, ModelSurface, SplitSizes, int, tuple[str, ...] | None], StagePlan]
# (model, SAE folder, its sae.json, the run seed's permutation and per-image correctness, data, images,
# permutation seeds, progress) -> the permutation pooled over the SAE seeds (`ape_permute.permute_seed_pool`)
PoolPermute = Callable[[ModelSurface, Path, Mapping, ApePermuteResult, Mapping[str, torch.Tensor], Any, int,
                        tuple[int, ...], bool], PermuteSeedPool]
CLAIM_SEEDS_DIR = "claim_seeds"  # a plausible site's SAEs of every claim seed: out/<site>/claim_seeds/
SELECTION_VARIANTS = ("all_positional",)  # what runs on half A: the drop that selects the site
HALVES_RULE = ("the first n test images permuted by torch.randperm (generator seeded with the split seed): "
               "half A its first n // 2, half B the rest")


@dataclass(frozen=True)
class LayerMeasures:
    """What the sweep runs at each layer: the sae and ape_permute experiments' run functions and plans.

    Handed in by the registry (`vitpos.experiments.registry.LAYER_MEASURES`), which imports every
    experiment: the sweep composes two experiments without importing either (an experiment never
    imports another)."""

    run_sae: Callable[..., tuple[SAEResult, SAE]]  # `run_sae`'s keywords (the sweep's `sae_kw` among them)
    run_ape_permute: Callable[..., ApePermuteResult]
    plan_sae: PlanSAE
    plan_ape_permute: PlanPermute  # the registry builds the stage's settings (the sweep cannot import them)
    permute_seed_pool: PoolPermute  # issue 48: C2 over the SAE seeds at a plausible site


def sweep_layers(depth: int, max_layers: int = 8) -> list[int]:
    """Every layer 0..depth-2, or `max_layers` evenly spaced ones on deeper models."""
    last = depth - 2
    if last < 0:
        return []
    if last + 1 <= max_layers:
        return list(range(last + 1))
    step = last / (max_layers - 1)
    return sorted({round(i * step) for i in range(max_layers)})


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


def held_out_halves(n: int, seed: int) -> tuple[list[int], list[int]]:
    """Images 0..n-1 in two disjoint halves by `HALVES_RULE`, each sorted: (A: selection, B: verdict)."""
    if n < 2:
        raise VitposError(f"the layer sweep splits its permutation images in two halves and has {n}; set "
                          "sae_layers.permute_images to at least 2 (and give the test split as many)")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return sorted(perm[: n // 2].tolist()), sorted(perm[n // 2:].tolist())


def layer_rule(depth: int, layers: list[int], embed: bool = False) -> str:
    """How the swept sites were chosen, in words."""
    outputs = (f"every block output 0..{depth - 2}" if layers == list(range(depth - 1))
               else f"{len(layers)} evenly spaced block outputs of 0..{depth - 2}")
    return f"the embedding, then {outputs}" if embed else outputs


def sweep_sites(layers: list[int], embed: bool) -> list[tuple[int, str]]:
    """(layer, site) of every swept point in order: resid_pre of block 0 (the embedding) first when
    `embed`, then each block output."""
    return ([(0, "resid_pre")] if embed else []) + [(layer, "resid_post") for layer in layers]


def run_sae_sweep(surface: ModelSurface, data: Any, measures: LayerMeasures, layers: list[int] | None = None, *,
                  sae_kw: Mapping | None = None, permute_images: int = 500, seeds: tuple[int, ...] = (0,),
                  out: str | Path | None = None, max_layers: int = 8, sae_data: Any = None,
                  progress: bool = False, embed: bool = True, claim_seeds: int = 1,
                  split_seed: int = 0) -> SAESweepResult:
    """Train an SAE at each site and measure C1 (its causal check) and C2 (the permutation) there.

    Sites: the embedding (resid_pre of block 0) when `embed`, then the output of each of `layers`.
    `sae_kw`: keyword arguments of `run_sae` (k, expansion, n_train_images, ...). Each site's SAE lives
    under out/embed/ or out/L<layer>/ (reused when the same run is found there). `sae_data`: the images
    the SAEs train and are scored on (None: `data`), as the sae stage's `sae.data`; C1's causal check and
    the permutation (C2) read `data`. `claim_seeds` > 1 (issue 48): at every plausible site (selected in
    >= PLAUSIBLE of the resamples) the SAE is trained again with its extra seeds (`run_sae`'s claim_seeds,
    under out/<site>/claim_seeds/; the run seed's SAE is the same SAE, trained again) and each extra seed
    gets its own causal check and permutation: the point's `sae` and `permute` then carry `seed_pool`, so
    C1 and C2 read intervals over SAE seeds x images there. Other sites keep one SAE seed.

    Held out (issue 47 item 4): the first `permute_images` test images of `data` are split by
    `held_out_halves(n, split_seed)`; half A runs only `SELECTION_VARIANTS` and its per-image drops give
    `selection_frequency` (and `selected_site`), half B runs the full permutation the claims read."""
    layers = sweep_layers(surface.depth, max_layers) if layers is None else list(layers)
    rule = layer_rule(surface.depth, layers, embed)
    sites = sweep_sites(layers, embed)
    images = dataset_for(surface, data, "test", limit=permute_images)  # what run_ape_permute took before the split
    ids_a, ids_b = held_out_halves(len(images), split_seed)
    half_a, half_b = Selection(images, ids_a), Selection(images, ids_b)
    docs, per_image, corrects, chose = [], [], [], []
    for layer, site in sites:
        lo = Path(out) / site_key(layer, site) if out is not None else None
        res, sae = measures.run_sae(surface, layer, site=site, data=data if sae_data is None else sae_data, out=lo,
                                    progress=progress, causal_data=data, **dict(sae_kw or {}))
        picked: dict[str, torch.Tensor] = {}
        sel = measures.run_ape_permute(surface, sae, res.to_json(), data=half_a, n_images=len(ids_a), seeds=seeds,
                                       keep_correct=picked, progress=progress, variants=SELECTION_VARIANTS)
        correct: dict[str, torch.Tensor] = {}
        ap = measures.run_ape_permute(surface, sae, res.to_json(), data=half_b, n_images=len(ids_b), seeds=seeds,
                                      keep_correct=correct, progress=progress)
        docs.append((res, ap.model_copy(update={"data": data_name(data)})))  # the run's data, not the half's
        corrects.append(correct)
        chose.append(sel.variant("all_positional"))
        per_image.append(selection_drops(picked))
    freq = selection_frequency(torch.stack(per_image)) if per_image else torch.zeros(0)
    points = []
    for i, ((layer, site), (res, ap)) in enumerate(zip(sites, docs, strict=True)):
        allpos, swap, picking = ap.variant("all_positional"), ap.variant("swap_all_positional"), chose[i]
        points.append(LayerPoint(
            layer=layer, site=site, fvu=res.fvu, n_row=res.n_row_features, n_col=res.n_col_features,
            n_mixed=res.n_mixed_features,
            all_positional_drop=None if allpos is None else allpos.drop_points,
            all_positional_drop_ci95=None if allpos is None else allpos.drop_ci95,
            swap_null_drop=None if swap is None else swap.drop_points, selection_frequency=float(freq[i]),
            selection_drop=None if picking is None else picking.drop_points,
            selection_drop_ci95=None if picking is None else picking.drop_ci95,
            all_positional_budget=position_budget(ap, "all_positional"),
            sae=GivenSAEResult.model_validate(res.to_json()), permute=ap))
    if claim_seeds > 1:
        for i, ((layer, site), (_, ap)) in enumerate(zip(sites, docs, strict=True)):
            if points[i].selection_frequency < PLAUSIBLE:
                continue
            lo = Path(out) / site_key(layer, site) / CLAIM_SEEDS_DIR if out is not None else None
            res, _ = measures.run_sae(surface, layer, site=site, data=data if sae_data is None else sae_data, out=lo,
                                      progress=progress, causal_data=data, claim_seeds=claim_seeds,
                                      **dict(sae_kw or {}))
            if res.seed_pool is None or lo is None:
                continue
            # the run seed's permutation is the one measured above (its SAE is the same SAE, trained again)
            pool = measures.permute_seed_pool(surface, lo, res.to_json(), ap, corrects[i], half_b, len(ids_b),
                                              seeds, progress)  # on half B, as the run seed's permutation
            points[i] = points[i].model_copy(update={"sae": GivenSAEResult.model_validate(res.to_json()),
                                                     "permute": ap.model_copy(update={"seed_pool": pool})})
    known = [(p.selection_drop, i) for i, p in enumerate(points) if p.selection_drop is not None]
    selected = points[max(known)[1]].key if known else None
    plausible = [p.key for p in points if p.selection_frequency >= PLAUSIBLE]
    split = HeldOutSplit(rule=HALVES_RULE, seed=split_seed, n_images=len(images), selection=ids_a, verdict=ids_b)
    return SAESweepResult(model=surface.spec, data=data_name(data), layers=layers, layer_rule=rule, points=points,
                          selected_site=selected, plausible_sites=plausible, held_out=split)


def selection_drops(correct: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """(images,) per-image all-positional drop (clean correct - permuted correct, mean over permutation seeds)
    from run_ape_permute's `keep_correct`; zeros where the site has no positional latent (nothing moved)."""
    base = correct["baseline"].float()
    return base - correct["all_positional"].float().mean(0) if "all_positional" in correct else torch.zeros_like(base)


def plan_sae_sweep(surface: ModelSurface, sizes: SplitSizes, layers: list[int], sae_settings: SAESettings,
                   permute_images: int, seeds: int, measures: LayerMeasures, embed: bool = True,
                   claim_seeds: int = 1) -> StagePlan:
    """What run_sae_sweep computes over its sites (the embedding when `embed`, then the outputs of
    `layers`): at each, run_sae (as the sae stage counts it, without the latent browser and the
    seed-stability SAE, which the sweep does not run) and run_ape_permute on each half of the permutation
    images (`held_out_halves`: half A `SELECTION_VARIANTS` only, half B every variant; its upper bound: every
    variant has features). sae_settings: each site's SAE's sizes (images, eval_images, epochs, expansion)."""
    plan = StagePlan()
    sites = sweep_sites(layers, embed)
    n = sizes.n("test", permute_images)
    n_a, n_b = n // 2, n - n // 2
    for layer, site in sites:
        at = sae_settings.updated(site=site, browse=False, stability=False, claim_seeds=1)  # one SAE seed a site
        plan = plan + measures.plan_sae(at.stage(layer), surface, sizes)
        plan = plan + measures.plan_ape_permute(layer, site, n_a, seeds, surface, sizes, 1, SELECTION_VARIANTS)
        plan = plan + measures.plan_ape_permute(layer, site, n_b, seeds, surface, sizes, 1, None)
    where = f"{len(sites)} sites" + (f" (the embedding and {len(layers)} block outputs)" if embed else "")
    note = (f"{where} x (an SAE, its causal check, the all-positional permutation on half A's {n_a} images that "
            f"selects, every permutation variant on half B's {n_b} that the claims read); upper bound: every feature "
            "set found at every site")
    if claim_seeds > 1 and sites:  # issue 48: the SAE seeds at the plausible site(s), counted at the middle one
        layer, site = sites[len(sites) // 2]
        at = sae_settings.updated(site=site, browse=False, stability=False, claim_seeds=claim_seeds)
        sae = measures.plan_sae(at.stage(layer), surface, sizes)
        full = measures.plan_ape_permute(layer, site, n_b, seeds, surface, sizes, claim_seeds, None)
        one = measures.plan_ape_permute(layer, site, n_b, seeds, surface, sizes, 1, None)
        extra = sae + StagePlan(full.forwards - one.forwards, full.blocks - one.blocks)
        plan = plan + extra
        note += (f"; plus {claim_seeds} SAE seeds at one plausible site (known once the sweep ran; each further one "
                 f"adds the same): the run seed's SAE again and {claim_seeds - 1} more, each a causal check, and "
                 f"{claim_seeds - 1} extra permutations: +{extra.sae_tokens:,} SAE tokens, +{extra.forwards:,} "
                 f"forwards, +{extra.blocks:,} block evaluations")
    return StagePlan(plan.forwards, plan.blocks, plan.fits, plan.fit_work, plan.sae_tokens, plan.sae_work, note)


__all__ = ["EMBED", "HALVES_RULE", "PLAUSIBLE", "SELECTION_VARIANTS", "LayerMeasures", "held_out_halves", "layer_rule",
           "plan_sae_sweep", "run_sae_sweep", "selection_drops", "selection_frequency", "sweep_layers", "sweep_sites"]
