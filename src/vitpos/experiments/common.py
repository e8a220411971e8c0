"""What several experiments share: hook contexts for RoPE conditions, probing under a condition,
recovery, SAE edits and configs. Experiments import this module and the layers below, never each other."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from pydantic import Field

from vitpos.analysis.forward import accuracy_report, forward_batches
from vitpos.analysis.kept import Keep, KeptTokens, TokenKeeper
from vitpos.analysis.probes import ProbeTokens, fit_probe_tokens, probe_sample, rows_in
from vitpos.analysis.stats import accuracy_interval, bootstrap_means, percentile_interval
from vitpos.errors import VitposError
from vitpos.experiments.base import Settings
from vitpos.hooks import capture, remove_rope
from vitpos.models.surface import Axis, ModelSurface, Site
from vitpos.results.common import MIN_GAP
from vitpos.sae import SAEConfig

SWEEP_TRAIN_TOKENS = 8000  # position-balanced training tokens per probe in the sweeps (speed)
BATCH = 256  # images per forward in the sweeps on grids of up to 8x8 patches (the shipped models)
BATCH_PATCH_TOKENS = BATCH * 64  # patch tokens per forward: larger grids get fewer images per batch
ContextFactory = Callable[[], AbstractContextManager]
# an --axis value -> the rotary axes it removes
AXIS_SETS: dict[str, tuple[Axis, ...]] = {"row": ("row",), "col": ("col",), "both": ("row", "col")}
RemoveSpec = dict[Axis, list[int] | None]  # remove_rope's axis -> heads (None: all heads)


def sweep_batch(surface: ModelSurface, batch_size: int | None = None) -> int:
    """Images per forward: `batch_size` when given, else as many patch tokens as 256 images of an
    8x8 grid (at least 8 images). A batch's transient memory (activations, attention, SAE codes)
    then does not grow with the grid: 83 images at ViT-S/16 224 px, where 256 took +2 GiB; the
    shipped 8x8 models keep 256, so their numbers are unchanged."""
    if batch_size is not None:
        return batch_size
    return max(8, min(BATCH, BATCH_PATCH_TOKENS // max(1, surface.num_patches)))


def require_rope(surface: ModelSurface) -> None:
    if not surface.has_rope:
        raise VitposError(
            f"{surface.spec} has no rotary embedding (scheme {surface.scheme}); RoPE tests need a RoPE model "
            "(builtin:rope-axial, builtin:rope-mixed, timm:vit_*_rope_*, eva02_*, *_dinov3) — use ape-permute for "
            "APE models"
        )


def require_ape(surface: ModelSurface) -> None:
    if not surface.has_ape:
        raise VitposError(
            f"{surface.spec} has no absolute position embedding (scheme {surface.scheme}); ape-permute needs an APE "
            "model — for RoPE models use `vitpos intervene rope-axis` / `rope-heads`"
        )


def check_restore_points(surface: ModelSurface, points: list[int], flag: str = "--restore") -> None:
    """R is the first layer whose rotations come back: 1..depth-1 (R = 0 is the clean model)."""
    bad = [R for R in points if not 1 <= R <= surface.depth - 1]
    if bad:
        raise VitposError(f"{flag} {','.join(map(str, bad))}: restore points must lie in 1..{surface.depth - 1} for "
                          f"{surface.spec} (depth {surface.depth}; R is the first layer whose rotations come back)")
    twice = sorted({R for R in points if points.count(R) > 1})
    if twice:
        raise VitposError(f"{flag} names R={twice[0]} twice; give each restore point once, e.g. {flag} 1,2")


def condition_context(surface: ModelSurface, axes: tuple[Axis, ...], before: int | None = None,
                      extra: dict[int, dict[Axis, list[int]]] | None = None
                      ) -> Callable[[], AbstractContextManager]:
    """Factory for a hook context removing `axes` in layers < before (all layers if None),
    plus per-layer extra removals {layer: {axis: heads}}."""

    def make():
        es = ExitStack()
        if axes:
            layers = range(surface.depth) if before is None else range(before)
            if len(layers):
                es.enter_context(remove_rope(surface, cast(RemoveSpec, dict.fromkeys(axes)), layers=layers))
        for layer, remove in (extra or {}).items():
            es.enter_context(remove_rope(surface, cast(RemoveSpec, remove), layers=[layer]))
        return es
    return make


class SAESite(Settings):
    """Where an SAE reads: the part of the sae stage's settings (`SAESettings` subclasses it) that the
    experiments reading its SAE (ape_permute) need, without importing the sae experiment."""

    layer: int | None = Field(default=None, ge=0, description="block index whose site the SAE encodes (0..depth-1); "
                              "None = chosen from the probe results")
    site: Literal["resid_post", "resid_pre", "attn_out", "mlp_out"] = "resid_post"


@dataclass(frozen=True)
class Start:
    """Every image's residual stream at the input of block `layer` under one condition, (n, T, D)
    in dataset order (with its labels): a forward from here runs only blocks >= layer, and gives
    the very floats a full forward under that condition would (same batches, same modules)."""

    layer: int
    tokens: torch.Tensor
    labels: torch.Tensor

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(tokens, labels) in the batches `dataset.batches(batch_size)` yields images in."""
        for i in range(0, len(self.labels), batch_size):
            yield self.tokens[i:i + batch_size], self.labels[i:i + batch_size]


def advance(surface: ModelSurface, start: Start, layer: int, context: ContextFactory | None = None,
            batch_size: int | None = None, *, in_place: bool = False) -> Start:
    """`start` moved on to the input of block `layer` under a hook context (the blocks in between
    run as in a full forward under that context). The stream is every token of every image at one
    layer, so the result is written batch by batch into one tensor of its size; in_place=True
    writes it over `start`'s own tensor (each batch is read before it is overwritten), for callers
    that drop `start`: no second copy of the stream is held."""
    if layer < start.layer:
        raise VitposError(f"cannot move a residual stream at layer {start.layer} back to layer {layer}")
    dev = surface.device
    tokens = start.tokens if in_place else torch.empty_like(start.tokens)
    i = 0
    with context() if context else nullcontext():
        for t, _ in start.batches(sweep_batch(surface, batch_size)):
            tokens[i:i + len(t)] = surface.run_blocks(t.to(dev), start.layer, layer).to(tokens.device)
            i += len(t)
    return Start(layer, tokens, start.labels)


def capture_condition(surface: ModelSurface, dataset, context: ContextFactory | None, keep: Mapping[Site, Keep], *,
                      start: Start | None = None, keep_pre: int | None = None, batch_size: int | None = None,
                      check_classifier: bool = True) -> tuple[KeptTokens, torch.Tensor, torch.Tensor, Start | None]:
    """What `keep` names of each site's patch tokens (`vitpos.analysis.kept`: nothing more is held),
    labels and logits, under a hook context, optionally run from a stored residual stream (`start`:
    only blocks >= start.layer run) and optionally keeping every token of `blocks.<keep_pre>.resid_pre`
    as a Start for later partial forwards. check_classifier=False: the logits are the raw outputs."""
    sites = list(keep)
    if start is not None and any(s.layer is None or s.layer < start.layer for s in sites):
        raise VitposError(f"a forward from layer {start.layer} cannot capture {', '.join(map(str, sites))}")
    npt = surface.num_prefix_tokens
    dev = surface.device
    batch_size = sweep_batch(surface, batch_size)
    pre_sites = [Site(keep_pre, "resid_pre")] if keep_pre is not None else []
    keeper = TokenKeeper({str(s): k for s, k in keep.items()}, surface.grid)
    labels, logits = [], []
    try:
        with ExitStack() as es:
            if context is not None:
                es.enter_context(context())
            es.enter_context(capture(surface, sites, tokens=slice(npt, None), sink=keeper))
            pre = es.enter_context(capture(surface, pre_sites))
            if start is None:
                for _, y, out in forward_batches(surface, dataset, batch_size, check_classifier=check_classifier):
                    labels.append(y)
                    logits.append(out)
            else:
                if check_classifier:  # as forward_batches: the logits give the top-1
                    surface.check_classifier(dataset.info)
                for t, y in start.batches(batch_size):
                    labels.append(y)
                    logits.append(surface.forward_from(start.layer, t.to(dev)))
            labels_t = torch.cat(labels)
            kept_start = Start(keep_pre, pre[str(pre_sites[0])], labels_t) if keep_pre is not None else None
    except BaseException:
        keeper.abort()
        raise
    return keeper.finish(), labels_t, torch.cat(logits), kept_start


PROBE_KEYS = ("row_acc", "col_acc", "row_acc_orig_probe", "col_acc_orig_probe", "row_acc_ci95", "col_acc_ci95")


def _base_test(base_probes: Mapping[int, Any] | None, layer: int) -> torch.Tensor | None:
    """The baseline probes' test images of `layer` (None without them)."""
    if base_probes is None or layer not in base_probes:
        return None
    return torch.as_tensor(base_probes[layer].test_image_ids, dtype=torch.long)


def _fit_layer(surface: ModelSurface, sample, kept: KeptTokens, keep: Mapping[Site, Keep], layer: int,
               base_probes: Mapping[int, Any] | None) -> tuple[dict[str, Any], Any]:
    """One layer of `probe_condition`: its probes retrained on the kept tokens (with the baseline's
    L2 choices when given) and its entries of PROBE_KEYS (the baseline's probes read on the
    baseline's test images; without them the retrained accuracies), and the fit."""
    site = Site(layer, "resid_post")
    rows = keep[site].images
    whole = kept.images(str(site))  # this layer's val / test images (and the base probes' test images)
    kw = {}
    if base_probes is not None and layer in base_probes:
        kw["l2_grid"] = tuple(sorted({base_probes[layer].l2_row, base_probes[layer].l2_col}))
    toks = ProbeTokens.from_whole(sample, kept.tokens(str(site)), whole, rows)
    res = fit_probe_tokens(toks, surface.grid, control=False, **kw)
    del toks
    entry: dict[str, Any] = {"row_acc": res.row_acc, "col_acc": res.col_acc, "row_acc_ci95": res.acc_ci95("row"),
                             "col_acc_ci95": res.acc_ci95("col")}
    test = _base_test(base_probes, layer)
    if base_probes is not None and test is not None:
        feats = whole[rows_in(rows, test)]
        entry["row_acc_orig_probe"] = base_probes[layer].row_probe.accuracy(feats)
        entry["col_acc_orig_probe"] = base_probes[layer].col_probe.accuracy(feats)
    else:
        entry["row_acc_orig_probe"], entry["col_acc_orig_probe"] = res.row_acc, res.col_acc
    return entry, res


def probe_condition(surface: ModelSurface, dataset, context, base_probes=None, seed: int = 0,
                    layers: list[int] | None = None, max_train_tokens: int | None = SWEEP_TRAIN_TOKENS, *,
                    start: Start | None = None, reuse: Mapping[str, Any] | None = None,
                    keep_pre: int | None = None, batch_size: int | None = None, per_image: bool = False) -> dict:
    """Retrained and original-probe accuracies per layer, and top-1, under one hook context.

    result["correct"]: per-image top-1 correctness (n,), in dataset order. per_image: also
    result["per_image"][layer] = {"row": (n_test,), "col": ...}, each probe test image's share of
    tokens the retrained probe gets right, in the split's test order (the same images for every
    condition on the same data and seed): paired intervals of accuracy differences.

    With base_probes (the baseline's fits), each layer's retrained probes reuse the baseline's
    chosen L2 strengths instead of searching the grid again: same probe family, far cheaper.

    Shared prefix: with `start` the forward runs from a stored residual stream of an earlier
    condition that agrees with this one before start.layer; layers below it hold that condition's
    activations exactly, so their entries (fits on identical features) are copied from `reuse`,
    that condition's probe_condition result over the same `layers`. `keep_pre` adds
    result["start"], the Start of this condition at that layer. `batch_size`: images per forward.

    Memory: the capture keeps only what the fits read (the probe sample is drawn from the seed
    before the forward; its val / test images go through an on-disk store, one layer loaded at a
    time), the same floats as a full capture, so the same numbers."""
    layers = list(range(surface.depth)) if layers is None else layers
    first = 0 if start is None else start.layer
    fitted = [layer for layer in layers if layer >= first]
    copied = [layer for layer in layers if layer < first]
    if copied and (reuse is None or list(reuse["layers"]) != layers):
        raise VitposError(f"layers {copied} lie before the start layer {first}: pass the result they are shared with "
                          "(reuse=, over the same layers)")
    n_images = len(start.labels) if start is not None else len(dataset)
    sample = probe_sample(n_images, surface.num_patches, seed=seed, max_train_tokens=max_train_tokens)
    keep = {Site(layer, "resid_post"): Keep.probe(sample, _base_test(base_probes, layer)) for layer in fitted}
    kept, labels, logits, kept_start = capture_condition(surface, dataset, context, keep, start=start,
                                                         keep_pre=keep_pre, batch_size=batch_size)
    doc: dict = {k: [] for k in PROBE_KEYS}
    probes = {}
    images: dict[int, dict[str, torch.Tensor]] = {}
    with kept:
        for i, layer in enumerate(layers):
            if layer < first:  # a fit on identical activations: `reuse`'s
                assert reuse is not None
                entry = {k: reuse["doc"][k][i] for k in PROBE_KEYS}
                probes[layer] = reuse["probes"][layer]
                if per_image:
                    images[layer] = reuse["per_image"][layer]
            else:
                entry, res = _fit_layer(surface, sample, kept, keep, layer, base_probes)
                probes[layer] = res
                if per_image:  # the per-image accuracies row_acc / col_acc average (ProbeResult.per_image_acc)
                    images[layer] = {a: acc for a in ("row", "col") if (acc := res.per_image_acc(a)) is not None}
            for k in PROBE_KEYS:
                doc[k].append(entry[k])
    rep = accuracy_report(logits.argmax(-1), labels, dataset.info)
    correct = logits.argmax(-1).cpu() == labels.cpu()
    doc["top1"] = rep["top1"]
    doc["top1_ci95"] = accuracy_interval(correct)
    doc["per_group"] = rep["per_group"]
    out = {"doc": doc, "probes": probes, "layers": list(layers), "correct": correct}
    if per_image:
        out["per_image"] = images
    if kept_start is not None:
        out["start"] = kept_start
    return out


def recovery(clean: list[float], off: list[float], restored: list[float], R: int, layers: list[int]) -> dict:
    """Rec(l) = (P_restore - P_off) / (P_clean - P_off) for l >= R where the gap is >= MIN_GAP."""
    rec = []
    for i, layer in enumerate(layers):
        gap = clean[i] - off[i]
        rec.append(None if layer < R or gap < MIN_GAP else (restored[i] - off[i]) / gap)
    vals = [r for r in rec if r is not None]
    return {"layers": layers, "rec": rec, "mean_rec": (sum(vals) / len(vals)) if vals else None}


def recovery_samples(clean: Mapping[int, Any], off: Mapping[int, Any], restored: Mapping[int, Any], axis: str,
                     rec: Mapping[str, Any]) -> torch.Tensor | None:
    """(n_boot,) bootstrap samples of `rec`'s mean Rec for one axis, over the layers its point
    estimate averages, resampling the probes' test images: every condition's probes are tested on
    the same images (one probe sample per seed), and bootstrap_means draws the same resamples for
    the same number of images, so samples of two conditions are paired. None without per-image
    accuracies or without a layer to average."""
    used = [layer for layer, r in zip(rec["layers"], rec["rec"], strict=True) if r is not None]
    if not used:
        return None
    cols = [probes[layer].per_image_acc(axis) for layer in used for probes in (clean, off, restored)]
    if any(c is None for c in cols):
        return None
    boot = bootstrap_means(torch.stack(cols, dim=1)).reshape(-1, len(used), 3)  # (n_boot, layers, [c, o, r])
    c, o, r = boot.unbind(-1)
    return ((r - o) / (c - o)).mean(-1)


def rebuilt_share(clean: list[float], off: list[float], restored: list[float], R: int, layers: list[int]) -> dict:
    """`CountMatched` of one restore point from per-layer accuracies over `layers` (which must hold
    R - 1 for a defined share)."""
    n = len(layers)
    out: dict[str, Any] = {"layers": layers, "deficit": None, "clean_gain": [None] * n, "restore_gain": [None] * n,
                           "share": [None] * n, "mean_share": None}
    if R - 1 not in layers:
        return out
    j = layers.index(R - 1)
    deficit = clean[j] - off[j]
    out["deficit"] = deficit
    for i, layer in enumerate(layers):
        if layer >= R:
            out["clean_gain"][i] = clean[i] - clean[j]
            out["restore_gain"][i] = restored[i] - off[j]
            if deficit >= MIN_GAP:
                out["share"][i] = 1 - (clean[i] - restored[i]) / deficit
    vals = [b for b in out["share"] if b is not None]
    out["mean_share"] = sum(vals) / len(vals) if vals else None
    return out


def rebuilt_share_samples(clean: Mapping[int, Any], off: Mapping[int, Any], restored: Mapping[int, Any], axis: str,
                          share: Mapping[str, Any], R: int) -> torch.Tensor | None:
    """(n_boot,) paired bootstrap samples of `share`'s mean rebuilt share (as `recovery_samples`)."""
    used = [layer for layer, b in zip(share["layers"], share["share"], strict=True) if b is not None]
    if not used:
        return None
    cols = [fits[layer].per_image_acc(axis) for layer in [R - 1, *used] for fits in (clean, off, restored)]
    if any(c is None for c in cols):
        return None
    boot = bootstrap_means(torch.stack(cols, dim=1)).reshape(-1, 1 + len(used), 3)  # (n_boot, layers, [c, o, r])
    c, o, r = boot.unbind(-1)
    deficit = (c[:, :1] - o[:, :1])
    return (1 - (c[:, 1:] - r[:, 1:]) / deficit).mean(-1)


def condition_rebuilt_share(conditions: Mapping[str, Mapping[str, Any]], fitted: Mapping[str, Mapping[int, Any]],
                            axis: str, restored: str, R: int, layers: list[int]) -> tuple[dict, torch.Tensor | None]:
    """`rebuilt_share` of condition `restored` against `baseline` and `no_<axis>`, with its paired
    bootstrap interval, and the samples it was read from."""
    b = rebuilt_share(conditions["baseline"][f"{axis}_acc"], conditions[f"no_{axis}"][f"{axis}_acc"],
                      conditions[restored][f"{axis}_acc"], R, layers)
    samples = rebuilt_share_samples(fitted["baseline"], fitted[f"no_{axis}"], fitted[restored], axis, b, R)
    b["mean_share_ci95"] = sample_interval(samples)
    return b, samples


def sample_interval(samples: torch.Tensor | None) -> list[float] | None:
    return None if samples is None else percentile_interval(samples)


def condition_recovery(conditions: Mapping[str, Mapping[str, Any]], fitted: Mapping[str, Mapping[int, Any]],
                       axis: str, restored: str, R: int, layers: list[int]) -> dict:
    """`recovery` of condition `restored` against `baseline` and `no_<axis>` (the probed conditions'
    docs and fitted probes, by name), with mean Rec's paired bootstrap interval."""
    return condition_recovery_samples(conditions, fitted, axis, restored, R, layers)[0]


def condition_recovery_samples(conditions: Mapping[str, Mapping[str, Any]], fitted: Mapping[str, Mapping[int, Any]],
                               axis: str, restored: str, R: int,
                               layers: list[int]) -> tuple[dict, torch.Tensor | None]:
    """`condition_recovery` and the bootstrap samples its interval was read from (`recovery_samples`)."""
    r = recovery(conditions["baseline"][f"{axis}_acc"], conditions[f"no_{axis}"][f"{axis}_acc"],
                 conditions[restored][f"{axis}_acc"], R, layers)
    samples = recovery_samples(fitted["baseline"], fitted[f"no_{axis}"], fitted[restored], axis, r)
    r["mean_rec_ci95"] = sample_interval(samples)
    return r, samples


def sae_edit(surface: ModelSurface, sae, fn):
    """Edit patch tokens x (B, N, D) at the SAE's site with fn(x, z) -> new x; prefix tokens untouched."""
    npt = surface.num_prefix_tokens

    def edit_fn(t: torch.Tensor) -> torch.Tensor:
        x = t[:, npt:]
        new = fn(x, sae.encode(x))
        return torch.cat([t[:, :npt], new.to(t.dtype)], dim=1)
    return edit_fn


def sae_config(surface: ModelSurface, arch: str, k: int, expansion: int, seed: int = 0) -> SAEConfig:
    """The SAE's config on this model, or one VitposError (e.g. k above the dictionary size)."""
    if arch != "relu" and k > expansion * surface.width:
        raise VitposError(f"SAE k={k} exceeds the dictionary size {expansion * surface.width} (expansion {expansion} x "
                          f"width {surface.width} of {surface.spec}); use a smaller k or a larger expansion")
    return SAEConfig.parse({"arch": arch, "d_in": surface.width, "expansion": expansion, "k": k, "seed": seed})


# the sae stage's `causal_data` when its SAEs train on other images than the run's: C1's causal check
# reads the run's labelled data (the sae and sae_layers stages key their caches by it)
CAUSAL_ON_RUN_DATA = "the run's data"
