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

from vitpos import plots
from vitpos.analysis.probes import DEFAULT_L2_GRID
from vitpos.data.resolve import data_name, dataset_for
from vitpos.experiments.base import Done, Experiment, Figure, Result, SplitSizes, StageInput, StagePlan
from vitpos.experiments.common import (
    MIN_GAP,
    SWEEP_TRAIN_TOKENS,
    ProbedCondition,
    Recovery,
    advance,
    check_restore_points,
    condition_context,
    condition_recovery,
    probe_condition,
    require_rope,
)
from vitpos.models.surface import AXES, Axis, ModelSurface
from vitpos.progress import progress_bar

Condition = ProbedCondition  # (the name results and plots know it by)


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
                  progress: bool = False, shared_prefix: bool = True, batch_size: int | None = None) -> RopeAxisResult:
    """shared_prefix (default): restore_<axis>_R<k> agrees with no_<axis> before layer k, so it runs
    only blocks >= k from no_<axis>'s residual stream at k and copies no_<axis>'s fits of layers < k
    (the same numbers, fewer forwards and fits); False: every condition from the input.
    batch_size: images per forward (default `sweep_batch`: 256 on 8x8 grids, a fixed patch-token
    budget on larger ones; fewer lower the transient memory of a batch)."""
    require_rope(surface)
    dataset = dataset_for(surface, data, split, limit=n_images)
    layers = list(range(surface.depth))
    if restore_points is not None:
        check_restore_points(surface, list(restore_points))
    Rs = list(range(1, surface.depth)) if restore_points is None else sorted(set(restore_points))
    plan: list[tuple[str, tuple[Axis, ...], int | None]] = [
        ("no_row", ("row",), None), ("no_col", ("col",), None), ("no_both", ("row", "col"), None),
        *((f"restore_{a}_R{R}", (a,), R) for a in AXES for R in Rs)]
    if shared_prefix:  # each axis' restore conditions right after their no_<axis>: one stored stream at a time
        plan = [p for a in AXES for p in plan if p[1] == (a,)] + [p for p in plan if len(p[1]) == 2]
    done: dict[str, dict] = {}
    fitted: dict[str, dict] = {}  # condition -> {layer: ProbeResult}: per-image accuracies for the intervals
    with progress_bar(enabled=progress) as bar:
        task = bar.add_task("rope-axis conditions", total=len(plan) + 1)
        base = probe_condition(surface, dataset, None, seed=seed, batch_size=batch_size)
        base_probes = base["probes"]
        done["baseline"] = {**base["doc"], "axis": None, "restore_from": None}
        fitted["baseline"] = base_probes
        bar.update(task, advance=1)
        no_axis: dict[str, dict] = {}  # axis -> no_<axis>'s probe_condition result, with its stream at min(Rs)
        for name, axes, R in plan:
            axis = axes[0] if len(axes) == 1 else "both"
            if not shared_prefix or axis == "both":
                res = probe_condition(surface, dataset, condition_context(surface, axes, R), base_probes, seed=seed,
                                      batch_size=batch_size)
            elif R is None:
                for earlier in no_axis.values():  # the other axis' restores are done: free its stream
                    earlier.pop("start", None)
                res = no_axis[axis] = probe_condition(surface, dataset, condition_context(surface, axes), base_probes,
                                                  seed=seed, keep_pre=Rs[0] if Rs else None, batch_size=batch_size)
            else:
                start = no_axis[axis]["start"]
                if R > start.layer:  # no_<axis>'s blocks start.layer..R-1, as its full forward ran them
                    start = no_axis[axis]["start"] = advance(surface, start, R, condition_context(surface, axes),
                                                             batch_size, in_place=True)  # the old stream is dropped
                res = probe_condition(surface, dataset, None, base_probes, seed=seed, start=start, reuse=no_axis[axis],
                                      batch_size=batch_size)
            done[name] = {**res["doc"], "axis": axis, "restore_from": R}
            fitted[name] = res["probes"]
            bar.update(task, advance=1, description=f"rope-axis {name}")
    no_axis.clear()
    conditions = {name: done[name] for name in sorted(done, key=_order(Rs))}
    rec: dict[str, dict] = {"row": {}, "col": {}}
    for a in ("row", "col"):
        for R in Rs:
            rec[a][str(R)] = condition_recovery(conditions, fitted, a, f"restore_{a}_R{R}", R, layers)
    H, W = surface.grid
    result = RopeAxisResult.model_validate({
        "model": surface.spec, "data": data_name(data), "split": split, "n_images": len(dataset), "site": "resid_post",
        "layers": layers, "chance_row": 1 / H, "chance_col": 1 / W, "rope": surface.rope_axis_map().to_json(),
        "conditions": conditions, "recovery": rec, "min_gap": MIN_GAP})
    if out is not None:
        RopeAxisExperiment().write(result, out)
    return result


def plan_rope_axis(settings: Mapping[str, Any], surface: ModelSurface, sizes: SplitSizes,
                   shared_prefix: bool = True) -> StagePlan:
    """What run_rope_axis(n_images=settings['images'], restore_points=settings['restore']) computes.
    Refits under a condition search at most 2 L2 values (the baseline's row and column choices)."""
    n, L, N = sizes.n("test", settings["images"]), surface.depth, surface.num_patches
    Rs = sorted(set(settings["restore"])) if settings.get("restore") else list(range(1, L))

    def fits(count: int, l2_values: int = 2) -> StagePlan:
        return StagePlan.probe_fits(count, n, N, SWEEP_TRAIN_TOKENS, l2_values)

    plan = StagePlan.full(n, L) + fits(L, len(DEFAULT_L2_GRID)) + StagePlan.full(n, L, 3) + fits(3 * L)
    if not shared_prefix or not Rs:
        return plan + StagePlan.full(n, L, 2 * len(Rs)) + fits(2 * len(Rs) * L)
    # per axis: no_<axis>'s stream moved from min(Rs) to each R, then blocks >= R; layers < R copied
    tail = sum(L - R for R in Rs)
    return plan + StagePlan(blocks=2 * n * ((Rs[-1] - Rs[0]) + tail)) + fits(2 * tail)


def _order(Rs: list[int]):
    names = ["baseline", "no_row", "no_col", "no_both"] + [f"restore_{a}_R{R}" for a in ("row", "col") for R in Rs]
    return names.index


class RopeAxisExperiment(Experiment[RopeAxisResult]):
    name = "rope_axis"
    title = "RoPE axis removal and restoring (C3, C4)"
    claims = ("C3", "C4")
    result_type = RopeAxisResult
    scheme = "rope"

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done], quick: bool) -> dict:
        restore = config.rope_axis.restore
        if restore is None and quick:
            restore = [max(1, surface.depth // 2)]
        return {**config.rope_axis.model_dump(), "restore": restore}

    def plan(self, settings: Mapping[str, Any], surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        return plan_rope_axis(settings, surface, sizes)

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
