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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from vitpos import plots
from vitpos.data.resolve import data_name, dataset_for
from vitpos.experiments.base import Done, Experiment, Figure, Result, StageInput
from vitpos.experiments.common import (
    MIN_GAP,
    check_restore_points,
    condition_context,
    probe_condition,
    recovery,
    require_rope,
)
from vitpos.models.surface import AXES, Axis, ModelSurface
from vitpos.progress import progress_bar


class Condition(BaseModel):
    """Probe accuracies per layer (retrained and clean-probe) and top-1 under one condition."""

    row_acc: list[float]
    col_acc: list[float]
    row_acc_orig_probe: list[float]
    col_acc_orig_probe: list[float]
    top1: float
    per_group: dict[str, float]
    axis: str | None  # row | col | both; None for the baseline
    restore_from: int | None


class Recovery(BaseModel):
    layers: list[int]
    rec: list[float | None]  # per layer; None before R or where nothing was removed
    mean_rec: float | None


class RopeAxisResult(Result):
    model: str
    data: str
    split: str
    n_images: int
    site: str
    layers: list[int]
    chance_row: float
    chance_col: float
    rope: dict[str, Any]  # the model's RopeAxisMap.to_json(): kind, layout, channels
    conditions: dict[str, Condition]
    recovery: dict[str, dict[str, Recovery]]  # axis -> str(R) -> recovery
    min_gap: float


def run_rope_axis(surface: ModelSurface, data: str = "shapes", n_images: int = 1000, split: str = "test",
                  seed: int = 0, restore_points: list[int] | None = None, out: str | Path | None = None,
                  progress: bool = False) -> RopeAxisResult:
    require_rope(surface)
    dataset = dataset_for(surface, data, split, limit=n_images)
    layers = list(range(surface.depth))
    if restore_points is not None:
        check_restore_points(surface, list(restore_points))
    Rs = list(range(1, surface.depth)) if restore_points is None else sorted(set(restore_points))
    plan: list[tuple[str, tuple[Axis, ...], int | None]] = [
        ("no_row", ("row",), None), ("no_col", ("col",), None), ("no_both", ("row", "col"), None),
        *((f"restore_{a}_R{R}", (a,), R) for a in AXES for R in Rs)]
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
    result = RopeAxisResult.model_validate({
        "model": surface.spec, "data": data_name(data), "split": split, "n_images": len(dataset), "site": "resid_post",
        "layers": layers, "chance_row": 1 / H, "chance_col": 1 / W, "rope": surface.rope_axis_map().to_json(),
        "conditions": conditions, "recovery": rec, "min_gap": MIN_GAP})
    if out is not None:
        RopeAxisExperiment().write(result, out)
    return result


class RopeAxisExperiment(Experiment[RopeAxisResult]):
    name = "rope_axis"
    title = "RoPE axis removal and restoring (C3, C4)"
    claims = ("C3", "C4")
    result_type = RopeAxisResult

    def applies_to(self, surface: ModelSurface) -> str | None:
        return None if surface.has_rope else f"no rotary embedding (scheme {surface.scheme})"

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done], quick: bool) -> dict:
        restore = config.rope_axis.restore
        if restore is None and quick:
            restore = [max(1, surface.depth // 2)]
        return {**config.rope_axis.model_dump(), "restore": restore}

    def run_stage(self, surface: ModelSurface, stage: StageInput) -> RopeAxisResult:
        s = stage.settings
        return run_rope_axis(surface, data=stage.data, n_images=s["images"], restore_points=s["restore"],
                             seed=stage.seed)

    def figures(self, result: RopeAxisResult) -> list[Figure]:
        figs = [Figure("rope_axis", "probe accuracy per layer under each condition",
                       lambda r, p: plots.plot_rope_axis(r.to_json(), p))]
        if result.recovery:
            figs.append(Figure("rope_recovery", "recovery Rec(l) after restoring from R",
                               lambda r, p: plots.plot_recovery(r.to_json(), p)))
        return figs
