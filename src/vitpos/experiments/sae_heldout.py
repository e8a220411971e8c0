"""The SAE stage's held-out part (`evaluate_sae`): metrics, feature scores, the splice's effect on the
logits, the eta2 null (`eta2_null`), each latent's RMS code (`code_rms`), and the causal check on the
held-out capture (`sae_causal`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vitpos.analysis.forward import forward_batches
from vitpos.analysis.kept import Keep
from vitpos.analysis.probes import probe_sample
from vitpos.data.resolve import data_name
from vitpos.experiments.common import SWEEP_TRAIN_TOKENS, capture_condition, sae_edit, sweep_batch
from vitpos.experiments.sae_causal import Readout, RemovalImages, causal_check
from vitpos.hooks import edit
from vitpos.models.surface import ModelSurface, Site
from vitpos.results.sae_run import Eta2Count, Eta2Null, NullThresholds
from vitpos.sae import SAE, FeatureScores, sae_metrics, score_features


def sae_doc_from_held(surface: ModelSurface, sae: SAE, s: Site, eval_set, *, seed: int = 0) -> dict[str, Any]:
    """What the claims and ape_permute read of an SAE result, for an SAE that is given (not trained
    here, e.g. a planted one): `evaluate_sae` on `eval_set` with class logits."""
    held = evaluate_sae(surface, sae, s, eval_set, seed=seed, logits=True)
    sc = held.scores
    return {"model": surface.spec, "layer": s.layer, "site": s.name, "data": data_name(eval_set), **held.metrics,
            "top1": held.top1, "top1_spliced": held.top1_spliced, "row_features": sc.row_features,
            "col_features": sc.col_features, "mixed_features": sc.mixed_features,
            "n_row_features": len(sc.row_features), "n_col_features": len(sc.col_features),
            "n_mixed_features": len(sc.mixed_features), "thresholds": vars(sc.thresholds), "causal": held.causal,
            "eta2_null": held.eta2_null}


@dataclass(frozen=True)
class HeldOut:
    """What run_sae measures on the held-out images: SAE metrics, feature scores, the splice's
    effect on the logits (None without class logits) and the causal check (None at the last layer)."""

    metrics: dict[str, float]
    scores: FeatureScores
    logit_kl: float | None
    top1: float | None
    top1_spliced: float | None
    top1_change_points: float | None
    causal: dict | None
    eta2_null: Eta2Null | None = None
    other_metrics: list[dict[str, float]] = field(default_factory=list)  # sae_metrics of each of `others`


def evaluate_sae(surface: ModelSurface, sae: SAE, s: Site, eval_set, *, seed: int, logits: bool,
                 batch_size: int | None = None, outlier_threshold: float | None = None,
                 others: list[SAE] | tuple[SAE, ...] = (), causal_set=None, with_splice: bool = True,
                 keep: dict[str, RemovalImages] | None = None) -> HeldOut:
    """Held-out metrics, feature scores, splice (when `logits`: the outputs are class logits) and
    causal check of `sae` at site `s` on `eval_set`, `batch_size` images per forward and per SAE batch
    (default `sweep_batch`: 256 on 8x8 grids, a fixed patch-token budget on larger ones; fewer lower
    the transient memory of a batch, the numbers move in the last bits). `outlier_threshold`: the splice
    leaves patch tokens of a larger norm as they are (the SAE was not trained on them). `others`:
    further SAEs of the same site whose held-out metrics are measured too (HeldOut.other_metrics).
    `causal_set`: the causal check reads these (labelled) images instead of `eval_set`, captured apart.
    `with_splice=False`: the reconstruction is not spliced in (logit_kl, top1_spliced None; an extra SAE seed's
    check, issue 48). `keep` (a dict, filled): the causal check's per-image effects (`causal_check`).

    Memory: the capture keeps what is read: the SAE site whole, streamed through an on-disk store in
    256-image batches, and at later layers only the clean probes' sampled tokens and val / test
    images; nothing grows with layers x images x grid."""
    batch_size = sweep_batch(surface, batch_size)
    later = list(range(s.layer + 1, surface.depth)) if s.layer is not None else []
    sample, kept, labels, clean_logits = _capture_held(surface, s, eval_set, later, seed, logits, batch_size)
    with kept:
        metrics = sae_metrics(sae, lambda: (a.reshape(-1, a.shape[-1])
                                            for a in kept.iter_images(str(s), batch_size)))
        per: int = batch_size
        other_metrics = [sae_metrics(o, lambda: (a.reshape(-1, a.shape[-1])
                                                 for a in kept.iter_images(str(s), per))) for o in others]
        scores = score_features(sae, kept.iter_images(str(s), batch_size), surface.grid)
        null = eta2_null(sae, kept.iter_images(str(s), batch_size), surface.grid, scores, seed=seed)
        rms, sizes = code_rms(sae, kept.iter_images(str(s), batch_size), scores)
        kl = top1 = top1_spliced = change = None
        clean_correct = None
        if logits and not with_splice:
            clean_correct = clean_logits.argmax(-1) == labels
            top1 = float(clean_correct.float().mean())
        elif logits:
            # splice the reconstruction in (patch tokens only): how much does the model notice?
            base_logp = clean_logits.log_softmax(-1)
            splice = sae_edit(surface, sae, lambda x, z: keep_outliers(x, sae.decode(z), outlier_threshold))
            with edit(surface, {s: splice}):
                spliced_logits = torch.cat([o for _, _, o in forward_batches(surface, eval_set, batch_size)])
            preds = spliced_logits.argmax(-1)
            kl = float((base_logp.exp() * (base_logp - spliced_logits.log_softmax(-1))).sum(-1).mean())
            clean_correct = clean_logits.argmax(-1) == labels
            top1 = float(clean_correct.float().mean())
            top1_spliced = float((preds == labels).float().mean())
            change = 100 * (top1_spliced - top1)
        if not later:
            causal = None
        elif causal_set is None:
            causal = causal_check(surface, sae, s, eval_set, kept, sample, later, scores, batch_size,
                                  readout=Readout(labels, clean_correct, rms, sizes), keep=keep)
        else:
            causal = _causal_check_on(surface, sae, s, causal_set, later, scores, batch_size, seed, keep)
    return HeldOut(metrics, scores, kl, top1, top1_spliced, change, causal, null, other_metrics)


def _capture_held(surface: ModelSurface, s: Site, dataset, later: list[int], seed: int, logits: bool,
                  batch_size: int):
    """The held-out capture: site `s` whole, at each later layer a probe sample's tokens; with labels and logits."""
    sample = probe_sample(len(dataset), surface.num_patches, seed=seed, max_train_tokens=SWEEP_TRAIN_TOKENS)
    keep = {s: Keep.whole(range(len(dataset))), **{Site(i, "resid_post"): Keep.probe(sample) for i in later}}
    kept, labels, clean_logits, _ = capture_condition(surface, dataset, None, keep, check_classifier=logits,
                                                      batch_size=batch_size)
    return sample, kept, labels, clean_logits


def _causal_check_on(surface: ModelSurface, sae: SAE, s: Site, dataset, later: list[int], scores, batch_size: int,
                     seed: int, keep: dict[str, RemovalImages] | None = None) -> dict:
    """causal_check on other images than the SAE's held-out set (labelled ones): their own capture,
    probe sample, labels and RMS codes (the controls are matched where the removal happens)."""
    logits = surface.classifier_problem(dataset.info, dataset.info.name) is None
    sample, kept, labels, clean_logits = _capture_held(surface, s, dataset, later, seed, logits, batch_size)
    with kept:
        rms, sizes = code_rms(sae, kept.iter_images(str(s), batch_size), scores)
        correct = clean_logits.argmax(-1) == labels if logits else None
        out = causal_check(surface, sae, s, dataset, kept, sample, later, scores, batch_size,
                           readout=Readout(labels, correct, rms, sizes), keep=keep)
    return {**out, "data": dataset.info.name}


def keep_outliers(x: torch.Tensor, recon: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """The reconstruction, except at tokens of norm > threshold, which keep x (None: none kept).
    Without such tokens it is `recon` itself, so a model without outliers splices bit-identically."""
    if threshold is None:
        return recon
    out = x.float().norm(dim=-1) > threshold
    if not bool(out.any()):
        return recon
    return torch.where(out.unsqueeze(-1), x.to(recon.dtype), recon)


ETA2_GRID = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)  # thresholds whose admitted feature counts are reported


NULL_QUANTILE = 0.99  # the null-derived threshold: this quantile of the live latents' null eta2


@torch.no_grad()
def eta2_null(sae: SAE, batches, grid: tuple[int, int], scores: FeatureScores, seed: int = 0,
              quantile: float = NULL_QUANTILE) -> Eta2Null:
    """eta2 of every latent with the patch positions shuffled within each image (a fresh random
    permutation per image: position carries nothing, content and sample size stay), its `quantile`
    over live latents per statistic as the null-derived threshold, and how many features each
    threshold admits on the real scores (row / col / mixed under FeatureThresholds with min_eta2 =
    min_eta2_pos = t, the other settings kept), on `ETA2_GRID` and at the null thresholds."""
    g = torch.Generator().manual_seed(50_000 + seed)

    def shuffled():
        for a in batches:
            perm = torch.stack([torch.randperm(a.shape[1], generator=g) for _ in range(a.shape[0])])
            yield torch.gather(a, 1, perm.unsqueeze(-1).expand_as(a))

    null = score_features(sae, shuffled(), grid, scores.thresholds)
    live = scores.fire_rate >= scores.thresholds.min_fire_rate
    stats: dict[str, float | None] = {}
    for stat in ("row", "col", "pos"):
        v = getattr(null, f"eta2_{stat}")[live]
        stats[f"null_{stat}_q"] = float(torch.quantile(v.double(), quantile)) if v.numel() else None
        stats[f"null_{stat}_max"] = float(v.max()) if v.numel() else None
    # the conjunction typing's statistic under the same shuffle, over the latents it can type (issue 47 item 3)
    conj = null.eta2_pos_fired[scores.fire_images >= scores.thresholds.min_conj_images]
    conj_q = float(torch.quantile(conj.double(), quantile)) if conj.numel() else None
    conj_max = float(conj.max()) if conj.numel() else None

    def counts(t_axis: float, t_pos: float) -> dict[str, int]:
        probe = FeatureScores(scores.grid, scores.n_images, scores.eta2_row, scores.eta2_col, scores.eta2_pos,
                              scores.fire_rate, scores.cell_means, scores.fire_images, scores.eta2_pos_fired)
        probe.classify(replace(scores.thresholds, min_eta2=t_axis, min_eta2_pos=t_pos))
        return {"row": len(probe.row_features), "col": len(probe.col_features), "mixed": len(probe.mixed_features)}

    t_axis = max(stats["null_row_q"] or 0.0, stats["null_col_q"] or 0.0)
    t_pos = stats["null_pos_q"] or 0.0
    used = scores.thresholds
    return Eta2Null(quantile=quantile, n_live=int(live.sum()), **stats, null_conj_q=conj_q, null_conj_max=conj_max,
                    admitted=[Eta2Count(threshold=t, **counts(t, t)) for t in ETA2_GRID],
                    null_thresholds=NullThresholds(min_eta2=t_axis, min_eta2_pos=t_pos, **counts(t_axis, t_pos)),
                    used_above_null=bool(used.min_eta2 >= t_axis and used.min_eta2_pos >= t_pos))


@torch.no_grad()
def code_rms(sae: SAE, batches, scores: FeatureScores) -> tuple[torch.Tensor, dict[str, float]]:
    """(F,) RMS of each latent's code over the held-out patch tokens (decoder rows are unit-norm, so
    the size of what removing it subtracts), and the mean ||sum_f z_f d_f|| of the row and col sets."""
    sq, n = None, 0
    norms = {"row": 0.0, "col": 0.0}
    sets = {"row": scores.row_features, "col": scores.col_features}
    for a in batches:
        z = sae.encode(a)
        zz = z.double().pow(2).sum((0, 1))
        sq = zz if sq is None else sq + zz
        n += z.shape[0] * z.shape[1]
        for k, ids in sets.items():
            if ids:
                norms[k] += float(sae.feature_contribution(z, ids).norm(dim=-1).sum())
    rms = (sq / max(n, 1)).sqrt().float() if sq is not None else torch.zeros(sae.d_sae)
    return rms, {k: v / max(n, 1) for k, v in norms.items()}


HELD_OUT_PASSES = 3  # evaluate_sae's held-out capture and spliced forward, and the special-token report's
