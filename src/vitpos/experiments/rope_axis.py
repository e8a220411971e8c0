"""E4-E5 (C3, C4): remove RoPE's row or column rotations, watch position vanish, restore, watch it return.

Conditions (axis removed = that coordinate set to 0 in the rotation of q and k):
  baseline; no_row / no_col / no_both (in every layer); restore_<axis>_R<k> (removed in layers
  < k, restored from k on). Probes on resid_post patch tokens per layer, two ways:
  "decodable at all" = probes retrained on the condition's activations (row_acc, col_acc);
  "readable by the original probe" = the baseline's probes applied unchanged (*_orig_probe).
Recovery after R (METHODS): Rec(l) = (P_restore(l) - P_off(l)) / (P_clean(l) - P_off(l)) for
l >= R, with P the retrained accuracy; undefined (null) where P_clean - P_off < MIN_GAP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, ContextManager

import torch

from vitpos.analysis.forward import accuracy_report, capture_layers
from vitpos.analysis.probes import fit_position_probes
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.hooks import remove_rope
from vitpos.io import write_json
from vitpos.models.surface import ModelSurface, Site
from vitpos.progress import progress_bar

MIN_GAP = 0.05  # accuracy gap below which recovery is not defined (nothing to recover)


def require_rope(surface: ModelSurface) -> None:
    if not surface.has_rope:
        raise VitposError(
            f"{surface.spec} has no rotary embedding (scheme {surface.scheme}); RoPE tests need a RoPE model "
            "(builtin:rope-axial, builtin:rope-mixed, timm:vit_*_rope_*, eva02_*, *_dinov3) — use ape-permute for APE models"
        )


def condition_context(surface: ModelSurface, axes: tuple[str, ...], before: int | None = None,
                      extra: dict[int, dict[str, list[int]]] | None = None) -> Callable[[], ContextManager]:
    """Factory for a hook context removing `axes` in layers < before (all layers if None),
    plus per-layer extra removals {layer: {axis: heads}}."""
    from contextlib import ExitStack

    def make():
        es = ExitStack()
        if axes:
            layers = range(surface.depth) if before is None else range(before)
            if len(layers):
                es.enter_context(remove_rope(surface, {a: None for a in axes}, layers=layers))
        for layer, remove in (extra or {}).items():
            es.enter_context(remove_rope(surface, remove, layers=[layer]))
        return es
    return make


SWEEP_TRAIN_TOKENS = 8000  # position-balanced training tokens per probe in the sweeps (speed)


def probe_condition(surface: ModelSurface, dataset, context, base_probes=None, seed: int = 0,
                    layers: list[int] | None = None, max_train_tokens: int | None = SWEEP_TRAIN_TOKENS) -> dict:
    """Retrained and original-probe accuracies per layer, and top-1, under one hook context.

    With base_probes (the baseline's fits), each layer's retrained probes reuse the baseline's
    chosen L2 strengths instead of searching the grid again: same probe family, far cheaper."""
    layers = list(range(surface.depth)) if layers is None else layers
    sites = [Site(l, "resid_post") for l in layers]
    acts, labels, logits = capture_layers(surface, dataset, sites, context=context)
    doc = {"row_acc": [], "col_acc": [], "row_acc_orig_probe": [], "col_acc_orig_probe": []}
    probes = {}
    for l in layers:
        feats = acts[str(Site(l, "resid_post"))]
        kw = {}
        if base_probes is not None and l in base_probes:
            kw["l2_grid"] = tuple(sorted({base_probes[l].l2_row, base_probes[l].l2_col}))
        res = fit_position_probes(feats, surface.grid, seed=seed, control=False, max_train_tokens=max_train_tokens, **kw)
        probes[l] = res
        doc["row_acc"].append(res.row_acc)
        doc["col_acc"].append(res.col_acc)
        if base_probes is not None:
            test = torch.as_tensor(base_probes[l].test_image_ids)
            doc["row_acc_orig_probe"].append(base_probes[l].row_probe.accuracy(feats[test]))
            doc["col_acc_orig_probe"].append(base_probes[l].col_probe.accuracy(feats[test]))
        else:
            doc["row_acc_orig_probe"].append(res.row_acc)
            doc["col_acc_orig_probe"].append(res.col_acc)
    rep = accuracy_report(logits.argmax(-1), labels, dataset.info)
    doc["top1"] = rep["top1"]
    doc["per_group"] = rep["per_group"]
    return {"doc": doc, "probes": probes}


def recovery(clean: list[float], off: list[float], restored: list[float], R: int, layers: list[int]) -> dict:
    rec = []
    for i, l in enumerate(layers):
        gap = clean[i] - off[i]
        rec.append(None if l < R or gap < MIN_GAP else (restored[i] - off[i]) / gap)
    vals = [r for r in rec if r is not None]
    return {"layers": layers, "rec": rec, "mean_rec": (sum(vals) / len(vals)) if vals else None}


def run_rope_axis(surface: ModelSurface, data: str = "shapes", n_images: int = 1000, split: str = "test",
                  seed: int = 0, restore_points: list[int] | None = None, out: str | Path | None = None,
                  progress: bool = False) -> dict:
    require_rope(surface)
    dataset = dataset_for(surface, data, split, limit=n_images)
    layers = list(range(surface.depth))
    Rs = list(range(1, surface.depth)) if restore_points is None else sorted(set(restore_points))
    plan: list[tuple[str, tuple[str, ...], int | None]] = [
        ("no_row", ("row",), None), ("no_col", ("col",), None), ("no_both", ("row", "col"), None)]
    plan += [(f"restore_{a}_R{R}", (a,), R) for a in ("row", "col") for R in Rs]
    conditions: dict[str, dict] = {}
    with progress_bar(enabled=progress) as bar:
        task = bar.add_task("rope-axis conditions", total=len(plan) + 1)
        base = probe_condition(surface, dataset, None, seed=seed)
        base_probes = base["probes"]
        conditions["baseline"] = {**base["doc"], "axis": None, "restore_from": None}
        bar.update(task, advance=1)
        for name, axes, R in plan:
            res = probe_condition(surface, dataset, condition_context(surface, axes, R), base_probes, seed=seed)
            axis = axes[0] if len(axes) == 1 else "both"
            conditions[name] = {**res["doc"], "axis": axis, "restore_from": R}
            bar.update(task, advance=1, description=f"rope-axis {name}")
    rec: dict[str, dict] = {"row": {}, "col": {}}
    for a in ("row", "col"):
        clean = conditions["baseline"][f"{a}_acc"]
        off = conditions[f"no_{a}"][f"{a}_acc"]
        for R in Rs:
            rec[a][str(R)] = recovery(clean, off, conditions[f"restore_{a}_R{R}"][f"{a}_acc"], R, layers)
    H, W = surface.grid
    doc = {"model": surface.spec, "data": data_name(data), "split": split, "n_images": len(dataset), "site": "resid_post",
           "layers": layers, "chance_row": 1 / H, "chance_col": 1 / W, "rope": surface.rope_axis_map().to_json(),
           "conditions": conditions, "recovery": rec, "min_gap": MIN_GAP}
    if out is not None:
        out = Path(out)
        write_json(out / "rope_axis.json", doc)
        from vitpos.report.plots import plot_recovery, plot_rope_axis

        plot_rope_axis(doc, out / "rope_axis.png")
        plot_recovery(doc, out / "rope_recovery.png")
    return doc
