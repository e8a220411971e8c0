"""What several experiments share: hook contexts for RoPE conditions, probing under a condition,
recovery, SAE edits. Experiments import this module and the layers below, never each other."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack

import torch

from vitpos.analysis.forward import accuracy_report, capture_layers
from vitpos.analysis.probes import fit_position_probes
from vitpos.errors import VitposError
from vitpos.hooks import remove_rope
from vitpos.models.surface import Axis, ModelSurface, Site

MIN_GAP = 0.05  # accuracy gap below which recovery is not defined (nothing to recover)
SWEEP_TRAIN_TOKENS = 8000  # position-balanced training tokens per probe in the sweeps (speed)


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
                es.enter_context(remove_rope(surface, dict.fromkeys(axes), layers=layers))
        for layer, remove in (extra or {}).items():
            es.enter_context(remove_rope(surface, remove, layers=[layer]))
        return es
    return make


def probe_condition(surface: ModelSurface, dataset, context, base_probes=None, seed: int = 0,
                    layers: list[int] | None = None, max_train_tokens: int | None = SWEEP_TRAIN_TOKENS) -> dict:
    """Retrained and original-probe accuracies per layer, and top-1, under one hook context.

    With base_probes (the baseline's fits), each layer's retrained probes reuse the baseline's
    chosen L2 strengths instead of searching the grid again: same probe family, far cheaper."""
    layers = list(range(surface.depth)) if layers is None else layers
    sites = [Site(layer, "resid_post") for layer in layers]
    acts, labels, logits = capture_layers(surface, dataset, sites, context=context)
    doc: dict = {"row_acc": [], "col_acc": [], "row_acc_orig_probe": [], "col_acc_orig_probe": []}
    probes = {}
    for layer in layers:
        feats = acts[str(Site(layer, "resid_post"))]
        kw = {}
        if base_probes is not None and layer in base_probes:
            kw["l2_grid"] = tuple(sorted({base_probes[layer].l2_row, base_probes[layer].l2_col}))
        res = fit_position_probes(feats, surface.grid, seed=seed, control=False, max_train_tokens=max_train_tokens,
                                  **kw)
        probes[layer] = res
        doc["row_acc"].append(res.row_acc)
        doc["col_acc"].append(res.col_acc)
        if base_probes is not None:
            test = torch.as_tensor(base_probes[layer].test_image_ids)
            doc["row_acc_orig_probe"].append(base_probes[layer].row_probe.accuracy(feats[test]))
            doc["col_acc_orig_probe"].append(base_probes[layer].col_probe.accuracy(feats[test]))
        else:
            doc["row_acc_orig_probe"].append(res.row_acc)
            doc["col_acc_orig_probe"].append(res.col_acc)
    rep = accuracy_report(logits.argmax(-1), labels, dataset.info)
    doc["top1"] = rep["top1"]
    doc["per_group"] = rep["per_group"]
    return {"doc": doc, "probes": probes}


def recovery(clean: list[float], off: list[float], restored: list[float], R: int, layers: list[int]) -> dict:
    """Rec(l) = (P_restore - P_off) / (P_clean - P_off) for l >= R where the gap is >= MIN_GAP."""
    rec = []
    for i, layer in enumerate(layers):
        gap = clean[i] - off[i]
        rec.append(None if layer < R or gap < MIN_GAP else (restored[i] - off[i]) / gap)
    vals = [r for r in rec if r is not None]
    return {"layers": layers, "rec": rec, "mean_rec": (sum(vals) / len(vals)) if vals else None}


def sae_edit(surface: ModelSurface, sae, fn):
    """Edit patch tokens x (B, N, D) at the SAE's site with fn(x, z) -> new x; prefix tokens untouched."""
    npt = surface.num_prefix_tokens

    def edit_fn(t: torch.Tensor) -> torch.Tensor:
        x = t[:, npt:]
        new = fn(x, sae.encode(x))
        return torch.cat([t[:, :npt], new.to(t.dtype)], dim=1)
    return edit_fn
