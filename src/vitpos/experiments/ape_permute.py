"""E3 (C2): permute APE's positional features across patches and measure top-1.

Per image, a permutation pi of patch positions; with F the chosen SAE latents,
    x'_n = x_n + sum_{f in F} (z_{pi(n), f} - z_{n, f}) d_f
at the SAE's site: only the span of F's decoder directions changes, the SAE error term and
prefix tokens are untouched, and the identity permutation is an exact no-op.
Variants: all (row+col features, random pi), row_only (row features, pi shuffles whole rows),
col_only (col features, pi shuffles whole columns), all_positional (row + col + mixed
positional latents, random pi: every latent whose activation depends on position; C2 is judged on
this set), random_features (as many live non-positional latents, matched in activation mass,
random pi), mean_ablate (F replaced by its mean over patches), pos_embed_shuffle (the input APE
table itself permuted: SAE-free).

Matched controls, one per permuted set (`CONTROLS`): all_positional -> random_all_positional,
all -> random_features, row_only -> random_row, col_only -> random_col. Each control moves
as many live latents that are not positional (not row, col or mixed), each drawn among the
`pool` candidates closest in mean activation to one permuted latent, with the same permutations
as its set (same seed, same kind: whole rows, whole columns or any). Where fewer such latents exist
than the set has, the control moves all of them (the largest matched set) and says so in its
`note` and `n_features`. Each new control draws from its own generator, so adding them moved no
number of the older variants. (random_features, older, excludes only row+col latents from its
candidates, so it may draw mixed ones; it is kept as it was for comparability.)

Nulls by construction (`NULLS`, issue 28), each with its own generators (no older number moves):
  swap_all_positional  the same-position cross-image swap: at every patch the all-positional set's
                       codes are replaced by another image's codes at the same patch (the images of
                       a batch are rotated by a random offset): content moves, position stays. Pure
                       positional latents make it a no-op; C2 reads it as its null.
  crossed              row features permuted by whole columns and col features by whole rows: each
                       token keeps its row code and its column code, so real row / col features cost
                       ~nothing (the check that they are what they are called).
  norm_all_positional  as random_all_positional, but each latent matched on the size of the edit a
                       permutation makes of it (its within-image spread of z, `feature_spread_of`), not
                       on its mean activation.
Every SAE variant also records `edit_norm`: the mean over patch tokens of ||x' - x|| (and
`edit_rel`, that over the mean ||x||), measured on the first MASS_IMAGES images with fresh draws.

Issue 47, each with the all-positional set's permutations (no older number moves):
  subspace_positional  each patch's component in the span of the all-positional set's decoder directions
                       (rank `subspace_rank`) permuted across patches: the whole token where it spans D.
  subspace_error       only the SAE error term's component in that span permuted.
The position budget (`position_budget`): each edit of BUDGET_VARIANTS as a share of the APE-table shuffle's
effect on the same images, drop(edit) / drop(shuffle), with the paired-bootstrap interval of the ratio; None
with the reason where the shuffle costs ~nothing (`shuffle_undefined`).

Issue 47 item 3 (CONJ_VARIANTS, reported: C2's rule still reads all_positional), from the sae stage's
`conj_features` (latents whose position shows within their content, `vitpos.sae.features`):
  conj_positional              the conjunction-inclusive positional set (positional ∪ conjunction) permuted with
                               the all-positional set's permutations (same seed); its drop, interval and position
                               budget are reported beside the all-positional set's (and pooled over the SAE seeds).
  norm_conj_positional         its edit-norm-matched control, drawn from live latents in NEITHER set.
  norm_all_positional_no_conj  the all-positional set's edit-norm-matched control drawn from latents in neither
                               set: norm_all_positional (C2 reads it) may draw conjunction latents, this may not.
Each is skipped, with the reason, where the SAE has no conjunction latents (or its sae.json no typing of them).
Prefix tokens (CLS, registers) are
never edited (`prefix_tokens`, `prefix_edited`; what that means at the site: `prefix_scope`).

Uncertainty (analysis/stats.py): `drop_ci95` of every variant is a paired bootstrap over images
of (clean correct - intervened correct, averaged over seeds per image), in points;
`baseline_top1_ci95` is the Wilson interval of the clean top-1. Per-image correctness stays in
memory and is not written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, SerializeAsAny

from vitpos.analysis.forward import accuracy_report
from vitpos.analysis.stats import (
    accuracy_interval,
    hierarchical_means,
    paired_bootstrap_diff,
    paired_ratio_interval,
    percentile_interval,
    pooled_mean,
    scaled,
)
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.experiments import ape_permute_section
from vitpos.experiments.ape_permute_variants import (
    MASS_IMAGES,
    FeatureSets,
    PatchEdit,
    PermuteRun,
    SiteEdits,
    code_stats,
    edit_sizes,
    permute_runs,
    shuffle_pe,
    site_edits,
    site_tokens,
    subspace_basis,
)
from vitpos.experiments.base import Done, Experiment, Figure, Settings, SplitSizes, StageInput, StagePlan
from vitpos.experiments.common import SAESite, require_ape, sae_edit, sweep_batch
from vitpos.experiments.sae_settings import SAESettings
from vitpos.hooks import edit
from vitpos.io import artifact_path
from vitpos.models.surface import ModelSurface, Site
from vitpos.progress import progress_bar
from vitpos.results.ape_permute import (
    ALL_VARIANTS,
    BUDGET_VARIANTS,
    CONJ_VARIANTS,
    CONTROLS,
    NULLS,
    SEED_VARIANTS,
    VARIANTS,
    ApePermuteResult,
    PermuteSeedPool,
    PooledDrop,
    PositionBudget,
    shuffle_undefined,
)
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.sae_run import INTERVAL_SOURCES, SAESeedPool
from vitpos.runtime.device import trimmed
from vitpos.sae import SAE


def check_sae_matches(surface: ModelSurface, sae_doc: Mapping) -> None:
    """An SAE is only meaningful on the model (and weights) whose activations it was trained on."""
    model = sae_doc.get("model")
    if model is not None and model != surface.spec:
        raise VitposError(f"the SAE was trained on {model!r}, not {surface.spec!r}; train one on this model with "
                          f"`vitpos sae --model {surface.spec} ...` or pass --model {model}")
    weights = (sae_doc.get("run") or {}).get("weights")
    if weights is not None and weights != surface.weights_digest():
        raise VitposError(f"the SAE was trained on other weights of {surface.spec} (digest {weights}, now "
                          f"{surface.weights_digest()}); retrain it with `vitpos sae --model {surface.spec} ...`")


def check_sae_weights(surface: ModelSurface, sae: SAE, sae_doc: Mapping) -> None:
    """The SAE's weights file must belong to this model (the digest it carries), fit its width, and
    hold every feature sae.json names."""
    fix = f"retrain it with `vitpos sae --model {surface.spec} ...`"
    if sae.model_weights is not None and sae.model_weights != surface.weights_digest():
        raise VitposError(f"the SAE weights were trained on model weights {sae.model_weights}, not on {surface.spec} "
                          f"(weights digest {surface.weights_digest()}); {fix}")
    if sae.cfg.d_in != surface.width:
        raise VitposError(f"the SAE reads {sae.cfg.d_in}-wide activations but {surface.spec} is {surface.width} wide; "
                          f"{fix}")
    if not 0 <= int(sae_doc["layer"]) < surface.depth:
        raise VitposError(f"sae.json's layer {sae_doc['layer']} is outside 0..{surface.depth - 1} of {surface.spec}; "
                          f"{fix}")
    named = [*sae_doc["row_features"], *sae_doc["col_features"], *sae_doc.get("mixed_features", []),
             *(sae_doc.get("conj_features") or [])]
    if any(not 0 <= int(f) < sae.cfg.d_sae for f in named):
        raise VitposError(f"sae.json names features beyond the SAE's {sae.cfg.d_sae} latents: the description and "
                          f"the weights belong to different SAEs; {fix}")


def _start_after(site: Site) -> int | None:
    """The block a forward resumes from once `site` is edited (its input is the edited stream), or
    None where the site sits inside a block (then every variant runs the whole model)."""
    if site.layer is None:
        return None
    return {"resid_pre": site.layer, "resid_post": site.layer + 1}.get(site.name)


@dataclass(frozen=True)
class Predictions:
    """What the forwards of run_ape_permute give: the labels, the clean predictions and each run's."""

    labels: torch.Tensor  # (images,)
    baseline: torch.Tensor  # (images,)
    runs: dict[tuple[str, int], torch.Tensor]  # (variant, seed) -> (images,)


def forward_runs(surface: ModelSurface, sae: SAE, site: Site, dataset, fns: Mapping[tuple[str, int], PatchEdit],
                 runs: Sequence[PermuteRun], shared_prefix: bool, progress: bool) -> Predictions:
    """The clean forward and every run's, batch by batch: the site runs in `fns` (from the clean stream
    at the site when `shared_prefix`), then the input runs of `runs` (the APE-table shuffle)."""
    resume = _start_after(site) if shared_prefix else None
    npt, dev = surface.num_prefix_tokens, surface.device
    pe = surface.patch_pos_embed()
    inputs = {(r.variant, r.seed): shuffle_pe(surface, pe, r.seed) for r in runs if r.at_input}
    preds: dict[tuple[str, int], list[torch.Tensor]] = {k: [] for k in [*fns, *inputs]}
    base_preds, label_parts = [], []
    with progress_bar(enabled=progress) as bar, torch.no_grad():
        task = bar.add_task("ape-permute", total=len(dataset))
        for x, y in trimmed(dataset.batches(sweep_batch(surface))):  # a forward per variant: hand freed memory back
            x = x.to(dev)
            label_parts.append(y)
            if resume is not None:  # the clean stream at the site and its codes, shared by every SAE variant
                t = surface.run_blocks(surface.embed_tokens(x), 0, resume)
                base_preds.append(surface.forward_from(resume, t).argmax(-1).cpu())
                xp = t[:, npt:]
                z = sae.encode(xp)
                for key, fn in fns.items():
                    new = torch.cat([t[:, :npt], fn(xp, z).to(t.dtype)], dim=1)
                    preds[key].append(surface.forward_from(resume, new).argmax(-1).cpu())
            else:
                base_preds.append(surface(x).argmax(-1).cpu())
                for key, fn in fns.items():
                    with edit(surface, {site: sae_edit(surface, sae, fn)}):
                        preds[key].append(surface(x).argmax(-1).cpu())
            for key, shuffle in inputs.items():
                with edit(surface, {Site(None, "embed"): shuffle}):
                    preds[key].append(surface(x).argmax(-1).cpu())
            bar.update(task, advance=len(y))
    return Predictions(torch.cat(label_parts), torch.cat(base_preds), {k: torch.cat(v) for k, v in preds.items()})


def run_ape_permute(surface: ModelSurface, sae: SAE, sae_doc: Mapping, data: str = "shapes", n_images: int = 2000,
                    seeds: tuple[int, ...] = (0, 1, 2), split: str = "test", out: str | Path | None = None,
                    progress: bool = False, shared_prefix: bool = True,
                    keep_correct: dict[str, torch.Tensor] | None = None,
                    variants: Sequence[str] | None = None) -> ApePermuteResult:
    """`sae_doc`: the SAE's sae.json (layer, site and the row / col / mixed feature lists).

    shared_prefix (default): per batch the clean stream up to the SAE's site and its SAE codes are
    computed once, and every variant runs only the blocks after the site; shared_prefix=False runs
    each variant as a full forward with a hook at the site. The numbers are the same (each variant
    keeps its own generator across batches, so the permutations drawn are too); mean ablation is
    deterministic, so it runs once and counts for every seed. `keep_correct` (a dict, filled): the
    per-image correctness, "baseline" (images,) and each variant run (seeds, images), e.g. for a
    paired bootstrap across layers (`sae_sweep`). `variants`: run only these site variants (None: every
    one; an extra SAE seed's permutation runs `SEED_VARIANTS`); the others are skipped as "not run"."""
    require_ape(surface)
    check_sae_matches(surface, sae_doc)
    check_sae_weights(surface, sae, sae_doc)
    site = Site(int(sae_doc["layer"]), sae_doc.get("site", "resid_post"))
    dataset = dataset_for(surface, data, split, limit=n_images)
    surface.check_classifier(dataset.info, data_name(data))  # before any work: every number here is a top-1
    mass_acts = site_tokens(surface, site, dataset)  # one capture for the codes' statistics and the edit sizes
    st = code_stats(sae, mass_acts)
    feats = FeatureSets(sae, surface.grid, list(sae_doc["row_features"]), list(sae_doc["col_features"]),
                        list(sae_doc.get("mixed_features", [])), st.mean_code, st.fire >= 0.005, st.spread,
                        list(sae_doc.get("conj_features") or []), sae_doc.get("conj_features") is not None)
    runs = [r for r in permute_runs(seeds) if variants is None or r.variant in variants]  # plan_ape_permute counts it
    edits = site_edits(feats, runs)
    sizes = edit_sizes(feats, edits, mass_acts, seeds[0])
    del mass_acts
    preds = forward_runs(surface, sae, site, dataset, edits.fns, runs, shared_prefix, progress)
    result = permute_result(surface, site, data, dataset, seeds, feats, edits, sizes, preds, keep_correct)
    if out is not None:
        ApePermuteExperiment().write(result, out)
    return result


def permute_result(surface: ModelSurface, site: Site, data, dataset, seeds: tuple[int, ...], feats: FeatureSets,
                   edits: SiteEdits, sizes: Mapping[str, tuple[float, float]], preds: Predictions,
                   keep_correct: dict[str, torch.Tensor] | None) -> ApePermuteResult:
    """Top-1 per variant (mean and spread over seeds, per class group, paired interval over images)
    beside the clean top-1; `keep_correct` gets the per-image correctness."""
    info, labels = dataset.info, preds.labels
    base = accuracy_report(preds.baseline, labels, info)
    base_correct = preds.baseline == labels
    if keep_correct is not None:
        keep_correct["baseline"] = base_correct
    row, col = feats.row, feats.col
    doc: dict[str, Any] = {
        "model": surface.spec, "layer": site.layer, "site": site.name, "data": data_name(data),
        "n_images": len(dataset), "seeds": list(seeds), "baseline_top1": base["top1"],
        "baseline_per_group": base["per_group"], "baseline_top1_ci95": accuracy_interval(base_correct),
        "variants": list(VARIANTS), "controls": dict(CONTROLS), "nulls": dict(NULLS),
        "feature_counts": {"row": len(row), "col": len(col), "mixed": len(feats.mixed),
                           **({"conj": len(feats.conj)} if feats.conj_typed else {})},
        # the edits move patch tokens only (`forward_runs`): what that means for the prefix, `prefix_scope`
        "prefix_tokens": surface.num_prefix_tokens, "prefix_edited": False,
        "subspace_rank": subspace_basis(feats.sae, feats.positional).shape[1] if feats.positional else None}
    per_image: dict[str, torch.Tensor] = {}  # variant -> (seeds, images) correctness, for the position budget
    n_feats = {"all": len(row + col), "row_only": len(row), "col_only": len(col),
               "all_positional": len(feats.positional), "random_features": len(row + col),
               "mean_ablate": len(row + col), "pos_embed_shuffle": None}
    for v in ALL_VARIANTS:
        if v in CONJ_VARIANTS and not feats.conj_typed:  # an SAE without the typing: not measured, not "skipped"
            continue
        # mean ablation: one run for every seed
        keys = [k for k in ((v, seeds[0]) if v == "mean_ablate" else (v, seed) for seed in seeds) if k in preds.runs]
        if not keys:
            doc[v] = {"skipped": edits.skipped.get(v, "not run")}
            continue
        runs = [(accuracy_report(preds.runs[k], labels, info), preds.runs[k] == labels) for k in keys]
        t = torch.tensor([r["top1"] for r, _ in runs])
        groups = {}
        for gname in base["per_group"]:
            gt = torch.tensor([r["per_group"][gname] for r, _ in runs])
            groups[gname] = {"top1": float(gt.mean()),
                             "drop_points": 100 * (base["per_group"][gname] - float(gt.mean()))}
        correct = torch.stack([c for _, c in runs]).float()  # (seeds, images)
        per_image[v] = correct
        if keep_correct is not None:
            keep_correct[v] = correct.bool()
        masses = [feats.mass(edits.moved[k][0]) for k in keys if k in edits.moved]
        doc[v] = {"top1": float(t.mean()), "top1_std": float(t.std()) if len(t) > 1 else 0.0,
                  "drop_points": 100 * (base["top1"] - float(t.mean())),
                  "drop_std": 100 * float(t.std()) if len(t) > 1 else 0.0,
                  "per_seed_top1": t.tolist(), "per_group": groups,
                  "n_features": n_feats[v] if v in n_feats else len(edits.moved[keys[-1]][0]),
                  "drop_ci95": scaled(paired_bootstrap_diff(base_correct.float(), correct), 100.0),
                  "activation_mass": sum(masses) / len(masses) if masses else None,
                  "note": edits.notes.get(v),
                  **({"edit_norm": sizes[v][0], "edit_rel": sizes[v][1]} if v in sizes else {})}
    shuffle = doc["pos_embed_shuffle"]
    doc["position_budget"] = {
        v: budget_of(base_correct, per_image[v], per_image.get("pos_embed_shuffle"), doc[v]["drop_points"],
                     shuffle.get("drop_points"), shuffle.get("drop_ci95"))
        for v in BUDGET_VARIANTS if v in per_image}
    return ApePermuteResult.model_validate(doc)


def run_ape_permute_seeds(surface: ModelSurface, folder: Path, sae_doc: Mapping, data: str, n_images: int,
                          seeds: tuple[int, ...], progress: bool = False,
                          out: str | Path | None = None) -> ApePermuteResult:
    """run_ape_permute on the SAE in `folder` (its sae.json `sae_doc`) and, where the sae stage trained
    extra SAE seeds (`seed_pool`), their permutations pooled (`permute_seed_pool`) as `seed_pool`."""
    pooled = bool((sae_doc.get("seed_pool") or {}).get("runs"))
    correct: dict[str, torch.Tensor] | None = {} if pooled else None
    result = run_ape_permute(surface, SAE.load(folder), sae_doc, data=data, n_images=n_images, seeds=seeds,
                             progress=progress, keep_correct=correct)
    if correct is not None:
        pool = permute_seed_pool(surface, folder, sae_doc, result, correct, data, n_images, seeds, progress)
        result = result.model_copy(update={"seed_pool": pool})
    if out is not None:
        ApePermuteExperiment().write(result, out)
    return result


def permute_seed_pool(surface: ModelSurface, folder: Path, sae_doc: Mapping, main: ApePermuteResult,
                      main_correct: Mapping[str, torch.Tensor], data: str, n_images: int, seeds: tuple[int, ...],
                      progress: bool = False) -> PermuteSeedPool:
    """C2 over the SAE seeds (issue 48): every extra seed of the sae stage (`seed_pool` of its sae.json; its
    weights under `folder`) permutes its own positional latents (`SEED_VARIANTS`, same images, same
    permutation seeds); each variant's per-image drop (clean correct - permuted correct, mean over the
    permutation seeds; a seed without the set: 0) is pooled with the run seed's (`main`, `main_correct`:
    its own run) by the hierarchical bootstrap, every variant of a seed on one image resample (paired)."""
    pool = SAESeedPool.model_validate(sae_doc["seed_pool"])
    corrects: list[Mapping[str, torch.Tensor]] = [main_correct]
    results = [main]
    for r in pool.runs:
        doc = {"model": sae_doc.get("model"), "run": sae_doc.get("run"), "layer": sae_doc["layer"],
               "site": sae_doc.get("site", "resid_post"), "row_features": r.row_features,
               "col_features": r.col_features, "mixed_features": r.mixed_features,
               **({} if r.conj_features is None else {"conj_features": r.conj_features})}
        c: dict[str, torch.Tensor] = {}
        results.append(run_ape_permute(surface, SAE.load(folder / r.dir), doc, data=data, n_images=n_images,
                                       seeds=seeds, progress=progress, keep_correct=c, variants=SEED_VARIANTS))
        corrects.append(c)
    base = main_correct["baseline"].double()
    # the APE-table shuffle (SAE-free: the run seed's, the same for every SAE seed) as a last column, so each
    # seed's edits and the shuffle share that seed's image draws and the position budget is a paired ratio
    shuffled = main_correct.get("pos_embed_shuffle")
    shuffle_drop = torch.zeros_like(base) if shuffled is None else base - shuffled.double().mean(0)
    groups = [torch.stack([base - c[v].double().mean(0) if v in c else torch.zeros_like(base)
                           for v in SEED_VARIANTS] + [shuffle_drop], 1) for c in corrects]
    draws, point = hierarchical_means(groups), pooled_mean(groups)
    out = {}
    for i, v in enumerate(SEED_VARIANTS):
        out[v] = PooledDrop(drop_points=100 * float(point[i]),
                            drop_ci95=scaled(percentile_interval(draws[:, i]), 100.0),
                            per_seed=[100 * float(g[:, i].mean()) for g in groups],
                            per_seed_n_features=[0 if (x := res.variant(v)) is None or x.n_features is None
                                                 else x.n_features for res in results])
    sh = main.variant("pos_embed_shuffle")
    why = shuffle_undefined(None if sh is None else sh.drop_points, None if sh is None else sh.drop_ci95)
    if why is None and shuffled is None:
        why = "the APE-table shuffle's per-image correctness was not kept"
    budget = {v: pooled_budget(draws[:, i], draws[:, -1], out[v].drop_points, None if sh is None else sh.drop_points,
                               why) for i, v in enumerate(SEED_VARIANTS) if v in BUDGET_VARIANTS}
    # an SAE without the conjunction typing (sae.json before it) has no conjunction set to pool: left out, not 0
    untyped = [v for v in SEED_VARIANTS if v in CONJ_VARIANTS and main.outcome(v) is None]
    return PermuteSeedPool(sae_seeds=list(pool.seeds), interval_sources=list(INTERVAL_SOURCES),
                           variants={k: x for k, x in out.items() if k not in untyped},
                           budget={k: x for k, x in budget.items() if k not in untyped})


def pooled_budget(edit_draws: torch.Tensor, shuffle_draws: torch.Tensor, edit_drop: float,
                  shuffle_drop: float | None, undefined: str | None) -> PositionBudget:
    """An edit's position budget pooled over the SAE seeds: its pooled drop over the APE-table shuffle's (points
    over points), the interval that of the ratio over the hierarchical resamples (seeds, then images; the
    shuffle's drop on each seed's own image draws); None with the reason `undefined` (`shuffle_undefined`)."""
    if undefined is not None or shuffle_drop is None:
        return _no_budget(edit_drop, shuffle_drop, undefined)
    ratio = torch.where(shuffle_draws > 0, edit_draws / shuffle_draws.clamp_min(1e-300), torch.nan)
    return PositionBudget(share=edit_drop / shuffle_drop, share_ci95=percentile_interval(ratio), edit_drop=edit_drop,
                          shuffle_drop=shuffle_drop)


def _no_budget(edit_drop: float, shuffle_drop: float | None, why: str | None) -> PositionBudget:
    """An undefined budget (no ratio over ~0), with its reason."""
    return PositionBudget(share=None, edit_drop=edit_drop, shuffle_drop=shuffle_drop,
                          undefined=why or "the APE-table shuffle was not measured")


def budget_of(base_correct: torch.Tensor, edit_correct: torch.Tensor, shuffle_correct: torch.Tensor | None,
              edit_drop: float, shuffle_drop: float | None, shuffle_ci95: list[float] | None) -> PositionBudget:
    """An edit's share of the APE-table shuffle's effect on the same images: drop(edit) / drop(shuffle) (their
    drops in points, as the result reports them), with the paired-bootstrap interval of the ratio of the mean
    per-image drops (seeds averaged per image; the same resamples for every edit). None with the reason where
    the shuffle costs ~nothing (`shuffle_undefined`): never a ratio over ~0."""
    why = shuffle_undefined(shuffle_drop, shuffle_ci95)
    if why is not None or shuffle_correct is None or shuffle_drop is None:
        return _no_budget(edit_drop, shuffle_drop, why)
    base = base_correct.float()
    return PositionBudget(share=edit_drop / shuffle_drop, edit_drop=edit_drop, shuffle_drop=shuffle_drop,
                          share_ci95=paired_ratio_interval(base - edit_correct.float(), base - shuffle_correct.float()))


def plan_ape_permute(settings: ApePermuteStageSettings, surface: ModelSurface, sizes: SplitSizes,
                     shared_prefix: bool = True, variants: Sequence[str] | None = None) -> StagePlan:
    """What run_ape_permute computes: an upper bound (a variant without features is skipped; the
    SAE layer, when the probes are still to choose it, is counted at layer 0, where every run after the
    shared prefix goes through the most blocks: counted at depth // 2, DINOv2-S/14's permutation at
    layer 0 took 2.3x its estimate). `variants`: as run_ape_permute's (None: every one)."""
    n, L, seeds = sizes.n("test", settings.images), surface.depth, settings.seeds
    chosen = settings.sae.layer  # None: the probes have not chosen it yet
    layer = 0 if chosen is None else chosen
    resume = _start_after(Site(layer, settings.sae.site)) if shared_prefix else None
    runs = [r for r in permute_runs(range(seeds)) if variants is None or r.variant in variants]  # as run_ape_permute
    plan = _permute_plan(runs, n, L, resume)
    note = "upper bound: every variant has features" + ("; the SAE layer, still to be chosen, counted at 0"
                                                         if chosen is None else "")
    sae = settings.sae
    n_extra = sae.claim_seeds - 1 if isinstance(sae, SAESettings) else 0
    if n_extra:  # issue 48: each extra SAE seed permutes its own latents, SEED_VARIANTS only
        per = _permute_plan([r for r in runs if r.variant in SEED_VARIANTS], n, L, resume)
        plan = plan + StagePlan(per.forwards * n_extra, per.blocks * n_extra)
        note += (f"; plus {n_extra} extra SAE seed(s) x ({len(SEED_VARIANTS)} variants x {seeds} permutation "
                 f"seed(s) + the baseline on {n} images, and a {min(MASS_IMAGES, n)}-image capture): "
                 f"+{per.forwards * n_extra:,} forwards, +{per.blocks * n_extra:,} block evaluations")
    return plan + StagePlan(note=note)


def _permute_plan(runs: Sequence[PermuteRun], n: int, L: int, resume: int | None) -> StagePlan:
    """One run_ape_permute over `runs` on n images: the mass capture, the input runs (the APE-table shuffle:
    a full forward each), then the baseline and the site runs (after the shared prefix when `resume`)."""
    at_site = sum(1 for r in runs if not r.at_input)
    # one capture of the mass images (codes' statistics, edit sizes), then the input runs (the APE-table
    # shuffle: a full forward, it edits the input)
    plan = StagePlan.full(min(MASS_IMAGES, n), L, 1) + StagePlan.full(n, L, len(runs) - at_site)
    if resume is None:
        return plan + StagePlan.full(n, L, 1 + at_site)
    # the clean prefix once, then the blocks after the site for the baseline and every site run
    return plan + StagePlan(forwards=n, blocks=n * resume) + StagePlan(blocks=n * (L - resume) * (1 + at_site))


class ApePermuteSettings(Settings):
    """`ape_permute:` in the run config."""

    QUICK = {"images": 300, "seeds": 1}
    # 1000 images x 2 permutation seeds (2000 x 3 before issue 48): each of the 3 SAE seeds permutes its own
    # latents, and their spread, not the images, sets the pooled interval; the default run keeps its 30-min budget
    images: int = Field(default=1000, ge=1)
    seeds: int = Field(default=2, ge=1, le=100)


class ApePermuteStageSettings(ApePermuteSettings):
    """The stage's settings: the section and the sae stage's settings (the SAE it permutes: its key is
    this stage's too; serialised as the sae stage's own, all of its fields)."""

    sae: SerializeAsAny[SAESite]


def _sae_site(sae: Settings) -> SAESite:
    if not isinstance(sae, SAESite):
        raise TypeError(f"ape_permute reads the sae stage's settings, got {type(sae).__name__}")
    return sae


class ApePermuteExperiment(Experiment[ApePermuteResult, ApePermuteStageSettings]):
    name = "ape_permute"
    # 2 (issue 28): the nulls by construction and each variant's edit size; 3 (issue 47): the positional
    # subspace variants, the position budget, the prefix tokens (no older number moves); 4 (issue 48): every
    # extra SAE seed's own permutation, pooled (`seed_pool`; the run seed's numbers do not move); 5 (issue 47 item 2):
    # the position budget pooled over the SAE seeds (`seed_pool.budget`), which C2's rule (version 7) reads; 6 (issue 47
    # item 3): the conjunction-inclusive positional set and the edit-norm-matched controls drawn outside it
    # (CONJ_VARIANTS; own streams: no older number moves)
    version = 6
    title = "APE positional-feature permutation (C2)"
    claims = ("C2",)
    result_type = ApePermuteResult
    settings_type = ApePermuteSettings
    scheme = "ape"
    requires = ("sae",)

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done],
                       quick: bool) -> ApePermuteStageSettings:
        return self._with_sae(config, prior["sae"].settings)

    def plan_settings(self, config, surface: ModelSurface, planned: Mapping[str, Settings],
                      quick: bool) -> ApePermuteStageSettings:
        return self._with_sae(config, planned["sae"])

    def _with_sae(self, config, sae: Settings) -> ApePermuteStageSettings:
        s = self.settings_of(config)
        return ApePermuteStageSettings.model_validate({**{k: getattr(s, k) for k in type(s).model_fields},
                                                       "sae": _sae_site(sae)})

    def plan(self, settings: ApePermuteStageSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        return plan_ape_permute(settings, surface, sizes)

    def run_stage(self, surface: ModelSurface, stage: StageInput[ApePermuteStageSettings]) -> ApePermuteResult:
        sae_doc = stage.prior["sae"].result.to_json()
        s = stage.settings
        return run_ape_permute_seeds(surface, artifact_path(stage.root, sae_doc["sae_dir"]), sae_doc, data=stage.data,
                                     n_images=s.images, seeds=tuple(range(s.seeds)), progress=stage.progress)

    def figures(self, result: ApePermuteResult) -> list[Figure]:
        from vitpos import plots  # matplotlib is imported when a figure is drawn, not with the experiment

        return [Figure("ape_permute", "top-1 drop per permuted feature set, with controls",
                       lambda r, p: plots.plot_ape_permute(r, p))]

    def section(self, result: ApePermuteResult, claims: ClaimRules) -> str:
        return ape_permute_section.section(result)

    def summary(self, result: ApePermuteResult, claim: str) -> str:
        return ape_permute_section.summary(result)

