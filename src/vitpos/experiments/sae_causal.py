"""C1's causal check (`causal_check`): the row (col) features subtracted at the SAE's site, position
re-read downstream by the clean probes, with matched random-latent controls, top-1 under each removal
and paired-bootstrap intervals of the drops and the selectivity (`selectivity_intervals`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vitpos.analysis.kept import Keep, KeptTokens
from vitpos.analysis.probes import ProbeSample, ProbeTokens, fit_probe_tokens, rows_in
from vitpos.analysis.stats import (
    bootstrap_means,
    hierarchical_interval,
    hierarchical_means,
    paired_bootstrap_diff,
    percentile_interval,
    pooled_mean,
    scaled,
)
from vitpos.experiments.common import capture_condition, sae_edit, sweep_batch
from vitpos.hooks import edit
from vitpos.models.surface import Site
from vitpos.results.sae_run import AblationEffect, CausalCheck, PooledEffect
from vitpos.sae import SAE
from vitpos.sae.controls import matched_control


@dataclass(frozen=True)
class Readout:
    """What the causal check needs beside the probes: held-out labels, the clean per-image
    correctness (None without class logits), each latent's RMS code and the sets' edit norms."""

    labels: torch.Tensor
    clean_correct: torch.Tensor | None
    rms: torch.Tensor
    edit_norms: dict[str, float]


@dataclass(frozen=True)
class RemovalImages:
    """One removal's per-image effects, kept in memory for pooling over SAE seeds (issue 48): `probe`
    (probe test images, 2) the clean minus removed token accuracy, mean over the later layers, row then
    col; `top1` (images,) clean minus removed correctness (None without class logits). A set without
    latents removes nothing: zeros."""

    probe: torch.Tensor
    top1: torch.Tensor | None


CONTROL_STREAM = 70_000  # + seed: the removal controls' own generator


# causal_check's removal passes (a held-out forward each), in order: each set's features, then each set's
# matched random removal (only with a Readout); a set without features skips its passes
REMOVALS = (("ablate", "row"), ("ablate", "col"), ("control", "row"), ("control", "col"))


def causal_check(surface, sae, site, dataset, clean: KeptTokens, sample: ProbeSample, later, scores,
                 batch_size: int | None = None, readout: Readout | None = None,
                 keep: dict[str, RemovalImages] | None = None) -> dict:
    """Subtract row (col) features at the SAE site; clean probes read position at later layers.

    `clean`: the held-out capture, keeping at each later layer what a probe of `sample` reads; the
    ablated forwards keep only the probes' test images. One layer's images are loaded at a time.
    With `readout` (issue 28): each removal's top-1 (overall, per class group, paired interval) and
    edit norm, and per set a matched random-latent removal (`control_row`, `control_col`) measured
    the same way; their draws come from their own generator, so the older numbers do not move.
    `keep` (a dict, filled): each removal's per-image effects by its key (`ablate_row`, ...), for the
    pooled check over SAE seeds (`pool_causal`)."""
    keys = {layer: str(Site(layer, "resid_post")) for layer in later}
    probes = {}
    clean_per_layer = []
    test = sample.split.test  # one split for every layer (same ids, same seed)
    for layer in later:
        rows = clean.keep[keys[layer]].images
        whole = clean.images(keys[layer])
        probes[layer] = fit_probe_tokens(ProbeTokens.from_whole(sample, clean.tokens(keys[layer]), whole, rows),
                                         surface.grid, control=False)
        clean_per_layer.append(_layer_image_accuracy(probes[layer], whole[rows_in(rows, test)]))
        del whole
    out = {"layers": later, "clean_row_acc": [probes[layer].row_acc for layer in later],
           "clean_col_acc": [probes[layer].col_acc for layer in later]}
    clean_per_image = _stack_layers(clean_per_layer)
    seed = sample.seed
    positional = scores.row_features + scores.col_features + scores.mixed_features

    def remove(ids: list[int]) -> dict:
        fn = sae_edit(surface, sae, lambda x, z, ids=ids: x - sae.feature_contribution(z, ids))
        keep = {Site(layer, "resid_post"): Keep.whole(test) for layer in later}
        acts, _, logits, _ = capture_condition(surface, dataset, lambda fn=fn: edit(surface, {site: fn}), keep,
                                               check_classifier=False, batch_size=batch_size)
        row, col, ablated_per_layer = [], [], []
        with acts:
            for layer in later:
                feats = acts.images(keys[layer])[rows_in(keep[Site(layer, "resid_post")].images, test)]
                row.append(probes[layer].row_probe.accuracy(feats))
                col.append(probes[layer].col_probe.accuracy(feats))
                ablated_per_layer.append(_layer_image_accuracy(probes[layer], feats))
                del feats
        return {"row": row, "col": col, "per_image": _stack_layers(ablated_per_layer), "logits": logits}

    def kept(name: str, r: dict | None) -> None:
        if keep is None:
            return
        labels = None if readout is None or readout.clean_correct is None else readout.labels
        if r is None:  # nothing removed: no drop on any image
            keep[name] = RemovalImages(torch.zeros(clean_per_image["row"].shape[1], 2, dtype=torch.float64),
                                       None if labels is None else torch.zeros(len(labels), dtype=torch.float64))
            return
        d = torch.stack([(clean_per_image[a].double() - r["per_image"][a].double()).mean(0) for a in ("row", "col")], 1)
        top1 = None
        if labels is not None and readout is not None and readout.clean_correct is not None:
            top1 = readout.clean_correct.double() - (r["logits"].argmax(-1) == labels).double()
        keep[name] = RemovalImages(d, top1)

    def effect(kind: str, r: dict) -> dict:
        row, col = r["row"], r["col"]
        d_row = sum(c - a for c, a in zip(out["clean_row_acc"], row, strict=True)) / len(later)
        d_col = sum(c - a for c, a in zip(out["clean_col_acc"], col, strict=True)) / len(later)
        mine, other = (d_row, d_col) if kind == "row" else (d_col, d_row)
        denom = abs(mine) + abs(other)
        return {"row_acc": row, "col_acc": col, "row_drop": d_row, "col_drop": d_col,
                "selectivity": mine / denom if denom > 1e-9 else None,
                **selectivity_intervals(clean_per_image, r["per_image"], kind, seed)}

    for what, kind in REMOVALS:
        if what == "control" and readout is None:
            continue
        ids = scores.row_features if kind == "row" else scores.col_features
        if not ids:
            out[f"{what}_{kind}"] = {"skipped": f"no {kind} features"}
            kept(f"{what}_{kind}", None)
            continue
        if what == "ablate":
            r = remove(ids)
            kept(f"ablate_{kind}", r)
            out[f"ablate_{kind}"] = {**effect(kind, r), **_behaviour(r["logits"], readout, dataset.info, len(ids),
                                                                     readout.edit_norms.get(kind) if readout else None)}
            continue
        assert readout is not None
        live = scores.fire_rate >= scores.thresholds.min_fire_rate
        g = torch.Generator().manual_seed(CONTROL_STREAM + (0 if kind == "row" else 1) + 10 * seed)
        ctrl, note = matched_control(readout.rms, ids, positional, live, g, what="RMS code")
        if not ctrl:
            out[f"control_{kind}"] = {"skipped": note or "no live non-positional latents"}
            kept(f"control_{kind}", None)
            continue
        r = remove(ctrl)
        kept(f"control_{kind}", r)
        size = _edit_norm(surface, sae, clean, site, ctrl, batch_size)
        out[f"control_{kind}"] = {**effect(kind, r), **_behaviour(r["logits"], readout, dataset.info, len(ctrl), size),
                                  "features": ctrl, "note": note}
    if readout is not None and readout.clean_correct is not None:
        out["clean_top1"] = float(readout.clean_correct.float().mean())
    return out


POOL_BOOT_SEED = 0  # the hierarchical bootstrap's generator (every removal the same: seed draws line up)


def _sel(own: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """own / (|own| + |other|) per resample; NaN (undefined, left out) where both drops are ~0."""
    denom = own.abs() + other.abs()
    return torch.where(denom > 1e-9, own / denom.clamp_min(1e-300), torch.full_like(own, float("nan")))


def pool_removal(name: str, kind: str, checks: Sequence[CausalCheck | None],
                 keeps: Sequence[Mapping[str, RemovalImages]]) -> PooledEffect | None:
    """Removal `name` (e.g. `ablate_row`, of the `kind` set) pooled over the SAE seeds whose causal checks
    are `checks` and per-image effects `keeps` (same order): the mean over seeds of each seed's mean drop
    and the hierarchical-bootstrap intervals (seeds, then images; a resample's selectivity from its pooled
    row and col drops). None where some seed did not measure it."""
    if not keeps or any(name not in k for k in keeps):
        return None
    probe = [k[name].probe for k in keeps]
    m = hierarchical_means(probe, seed=POOL_BOOT_SEED)  # (n_boot, 2): row, col
    point = pooled_mean(probe)
    own = 0 if kind == "row" else 1
    sel = _sel(point[own:own + 1], point[1 - own:2 - own])
    top1s = [k[name].top1 for k in keeps]
    known = [t for t in top1s if t is not None]
    top1 = top1_ci = None
    if known and len(known) == len(top1s):
        top1 = 100 * float(pooled_mean(known)[0])
        top1_ci = scaled(hierarchical_interval(known, seed=POOL_BOOT_SEED), 100.0)
    per: list[AblationEffect | None] = []
    for c in checks:
        e = None if c is None else (c.effect(kind) if name.startswith("ablate") else c.control(kind))
        per.append(e)
    return PooledEffect(
        row_drop=float(point[0]), col_drop=float(point[1]),
        selectivity=None if bool(sel.isnan()) else float(sel),
        row_drop_ci95=percentile_interval(m[:, 0]), col_drop_ci95=percentile_interval(m[:, 1]),
        selectivity_ci95=percentile_interval(_sel(m[:, own], m[:, 1 - own])), top1_drop=top1, top1_drop_ci95=top1_ci,
        per_seed_row_drop=[0.0 if e is None else e.row_drop for e in per],
        per_seed_col_drop=[0.0 if e is None else e.col_drop for e in per],
        per_seed_selectivity=[None if e is None else e.selectivity for e in per],
        per_seed_top1_drop=[(0.0 if top1 is not None else None) if e is None else e.top1_drop for e in per])


def pool_causal(checks: Sequence[CausalCheck | None],
                keeps: Sequence[Mapping[str, RemovalImages]]) -> dict[str, PooledEffect | None]:
    """Every removal of REMOVALS pooled over the SAE seeds (`pool_removal`), by its key."""
    return {f"{what}_{kind}": pool_removal(f"{what}_{kind}", kind, checks, keeps) for what, kind in REMOVALS}


def _behaviour(logits: torch.Tensor, readout: Readout | None, info, n: int, size: float | None) -> dict:
    """Top-1 under a removal beside the clean one: drop in points, its paired interval, per class group."""
    out: dict[str, Any] = {"n_features": n, "edit_norm": size}
    if readout is None or readout.clean_correct is None:
        return out
    preds = logits.argmax(-1)
    correct = preds == readout.labels
    clean = readout.clean_correct
    out["top1"] = float(correct.float().mean())
    out["top1_drop"] = 100 * float(clean.float().mean() - correct.float().mean())
    out["top1_drop_ci95"] = scaled(paired_bootstrap_diff(clean.float(), correct.float()), 100.0)
    groups = {}
    for gname, ids in info.class_groups.items():
        mask = torch.isin(readout.labels, torch.tensor(ids))
        if mask.any():
            groups[gname] = 100 * float(clean[mask].float().mean() - correct[mask].float().mean())
    out["per_group_drop"] = groups
    return out


@torch.no_grad()
def _edit_norm(surface, sae: SAE, clean: KeptTokens, site: Site, ids: list[int], batch_size: int | None) -> float:
    total, n = 0.0, 0
    for a in clean.iter_images(str(site), sweep_batch(surface, batch_size)):
        c = sae.feature_contribution(sae.encode(a), ids)
        total += float(c.norm(dim=-1).sum())
        n += c.shape[0] * c.shape[1]
    return total / max(n, 1)


def _layer_image_accuracy(probes, feats: torch.Tensor) -> dict[str, torch.Tensor]:
    """{"row", "col"} -> (images,) token accuracy of one layer's clean probes per image."""
    return {a: _image_accuracy(getattr(probes, f"{a}_probe"), feats) for a in ("row", "col")}


def _stack_layers(per_layer: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """{"row", "col"} -> (layers, images) from one {"row", "col"} -> (images,) per layer."""
    return {a: torch.stack([p[a] for p in per_layer]) for a in ("row", "col")}


def _image_accuracy(probe, feats: torch.Tensor) -> torch.Tensor:
    """(images,) fraction of each image's patch tokens whose position the probe reads correctly."""
    labels = probe.position_labels.to(feats.device)
    return (probe.predict(feats) == labels).float().mean(1).cpu()


def selectivity_intervals(clean: Mapping[str, torch.Tensor], ablated: Mapping[str, torch.Tensor], kind: str,
                          seed: int = 0) -> dict[str, list[float] | None]:
    """95 % paired-bootstrap intervals of the row / col probe drops and of the selectivity of
    ablating the `kind` features. clean / ablated: {"row", "col"} -> (layers, images) per-image
    token accuracies on the same images; an image's drop is its mean over layers of clean - ablated,
    and a resample's selectivity is own / (|own| + |other|) of its mean drops (resamples with both
    drops ~0 are undefined and left out)."""
    d = torch.stack([(clean[a].double() - ablated[a].double()).mean(0) for a in ("row", "col")], 1)  # (images, 2)
    m = bootstrap_means(d, seed=seed)
    mine, other = (m[:, 0], m[:, 1]) if kind == "row" else (m[:, 1], m[:, 0])
    sel = _sel(mine, other)
    return {"row_drop_ci95": percentile_interval(m[:, 0]), "col_drop_ci95": percentile_interval(m[:, 1]),
            "selectivity_ci95": percentile_interval(sel)}
