"""E4-E5 (C3, C4): remove RoPE's row or column rotations, watch position vanish, restore, watch it return.

Conditions (axis removed = that coordinate set to 0 in the rotation of q and k):
  baseline; no_row / no_col / no_both (in every layer); restore_<axis>_R<k> (removed in layers
  < k, restored from k on). Probes on resid_post patch tokens per layer, two ways:
  "decodable at all" = probes retrained on the condition's activations (row_acc, col_acc);
  "readable by the original probe" = the baseline's probes applied unchanged (*_orig_probe).
Recovery after R (METHODS): Rec(l) = (P_restore(l) - P_off(l)) / (P_clean(l) - P_off(l)) for
l >= R, with P the retrained accuracy; undefined (null) where P_clean - P_off < MIN_GAP.
What C3 and C4 read, with paired bootstrap intervals over the probes' test images (the same
resamples for every condition):
  removal[no_<a>]  removed = 1 - kept_fraction(own axis a), kept = kept_fraction(other axis), where
              kept_fraction = mean over layers whose baseline is >= MIN_ABOVE_CHANCE above chance of
              (P_cond - chance) / (P_base - chance) (`kept_fraction`; claims.py reads the same function)
  median_recovery[a]  median over the restore points R of mean Rec (`median_recovery`), its interval
              the median over R of each resample's mean Rec
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

import torch
from pydantic import BaseModel

from vitpos import plots
from vitpos.analysis.probes import DEFAULT_L2_GRID
from vitpos.analysis.stats import bootstrap_means
from vitpos.data.resolve import data_name, dataset_for
from vitpos.experiments.base import Done, Experiment, Figure, SplitSizes, StageInput, StagePlan
from vitpos.experiments.common import (
    MIN_GAP,
    SWEEP_TRAIN_TOKENS,
    AxisSweepResult,
    ProbedCondition,
    Recovery,
    advance,
    check_restore_points,
    condition_context,
    condition_recovery_samples,
    probe_condition,
    require_rope,
    sample_interval,
)
from vitpos.models.surface import AXES, Axis, ModelSurface
from vitpos.progress import progress_bar

Condition = ProbedCondition  # (the name results and plots know it by)
MIN_ABOVE_CHANCE = 0.05  # a layer enters C3's fractions where its baseline accuracy is this far above chance


def above_chance_layers(base: Sequence[float], chance: float) -> list[int]:
    """Indices of the layers whose baseline accuracy is >= MIN_ABOVE_CHANCE above chance."""
    return [i for i, b in enumerate(base) if b - chance >= MIN_ABOVE_CHANCE]


def kept_fraction(base: Sequence[float], cond: Sequence[float], chance: float) -> float | None:
    """Mean over the above-chance layers of (cond - chance) / (base - chance): the share of the
    baseline's above-chance decodability a condition keeps (None without such a layer). C3's
    removed fraction is 1 - this for the removed axis, its kept fraction this for the other."""
    used = [i for i in above_chance_layers(base, chance) if i < len(cond)]
    if not used:
        return None
    vals = [(cond[i] - chance) / (base[i] - chance) for i in used]
    return sum(vals) / len(vals)


def kept_fraction_samples(base: Mapping[int, Any], cond: Mapping[int, Any], axis: str, base_acc: Sequence[float],
                          chance: float, layers: Sequence[int]) -> torch.Tensor | None:
    """(n_boot,) bootstrap samples of `kept_fraction` for one axis, over the layers its point value
    averages (chosen on the baseline's point accuracies), resampling the probes' test images: both
    conditions' per-image accuracies in one bootstrap, so every resample is paired. None without
    per-image accuracies or without a layer."""
    used = [layers[i] for i in above_chance_layers(base_acc, chance)]
    if not used:
        return None
    cols = [fits[layer].per_image_acc(axis) for layer in used for fits in (base, cond)]
    if any(c is None for c in cols):
        return None
    boot = bootstrap_means(torch.stack(cols, dim=1)).reshape(-1, len(used), 2)  # (n_boot, layers, [base, cond])
    b, c = boot.unbind(-1)
    return ((c - chance) / (b - chance)).mean(-1)


def median_recovery(per_r: Mapping[str, Mapping[str, Any]]) -> float:
    """Median over the restore points of mean Rec (those with one; NaN if none): C4's number."""
    return median([r["mean_rec"] for r in per_r.values() if r["mean_rec"] is not None] or [float("nan")])


def median_samples(samples: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """Per resample the median over restore points (statistics.median's: the mean of the two
    middle values for an even count) of paired bootstrap samples; None if any is missing."""
    if not samples or any(s is None for s in samples):
        return None
    stacked = torch.stack([s for s in samples if s is not None])  # (restore points, n_boot)
    ordered, k = stacked.sort(dim=0).values, stacked.shape[0]
    mid = ordered[k // 2] if k % 2 else (ordered[k // 2 - 1] + ordered[k // 2]) / 2
    return mid.masked_fill(stacked.isnan().any(0), float("nan"))  # an undefined Rec: an undefined median


class AxisRemoval(BaseModel):
    """C3's fractions for one no_<axis> condition: of the removed axis' above-chance decodability
    the share removed, of the other axis' the share kept; each with its paired bootstrap interval."""

    removed: float | None
    removed_ci95: list[float] | None
    kept: float | None
    kept_ci95: list[float] | None
    removed_layers: list[int]  # the layers each fraction averages (baseline above chance)
    kept_layers: list[int]


class MedianRecovery(BaseModel):
    """C4's number for one axis: the median over restore points of mean Rec, with the median over
    restore points of each paired resample's mean Rec as its interval."""

    median_rec: float
    median_rec_ci95: list[float] | None
    restore_points: list[int]  # the Rs with a mean Rec


class RopeAxisResult(AxisSweepResult):
    rope: dict[str, Any]  # the model's RopeAxisMap.to_json(): kind, layout, channels
    conditions: dict[str, Condition]
    recovery: dict[str, dict[str, Recovery]]  # axis -> str(R) -> recovery
    min_gap: float
    # C3 / C4 with intervals (None in results written before them)
    removal: dict[str, AxisRemoval] | None = None  # no_row / no_col -> fractions
    median_recovery: dict[str, MedianRecovery] | None = None  # row / col


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
    medians: dict[str, dict] = {}
    for a in ("row", "col"):
        samples = []
        for R in Rs:
            rec[a][str(R)], rs = condition_recovery_samples(conditions, fitted, a, f"restore_{a}_R{R}", R, layers)
            if rec[a][str(R)]["mean_rec"] is not None:
                samples.append(rs)
        medians[a] = {"median_rec": median_recovery(rec[a]),
                      "median_rec_ci95": sample_interval(median_samples(samples)),
                      "restore_points": [R for R in Rs if rec[a][str(R)]["mean_rec"] is not None]}
    H, W = surface.grid
    chance = {"row": 1 / H, "col": 1 / W}
    result = RopeAxisResult.model_validate({
        "model": surface.spec, "data": data_name(data), "split": split, "n_images": len(dataset), "site": "resid_post",
        "layers": layers, "chance_row": chance["row"], "chance_col": chance["col"],
        "rope": surface.rope_axis_map().to_json(), "conditions": conditions, "recovery": rec, "min_gap": MIN_GAP,
        "removal": {f"no_{a}": axis_removal(conditions, fitted, a, chance, layers) for a in ("row", "col")},
        "median_recovery": medians})
    if out is not None:
        RopeAxisExperiment().write(result, out)
    return result


def axis_removal(conditions: Mapping[str, Mapping[str, Any]], fitted: Mapping[str, Mapping[int, Any]], axis: str,
                 chance: Mapping[str, float], layers: Sequence[int]) -> dict:
    """C3's fractions of condition no_<axis> against the baseline (`AxisRemoval`)."""
    other = "col" if axis == "row" else "row"
    base, off = conditions["baseline"], conditions[f"no_{axis}"]
    out: dict[str, Any] = {}
    for a, key in ((axis, "removed"), (other, "kept")):
        point = kept_fraction(base[f"{a}_acc"], off[f"{a}_acc"], chance[a])
        samples = kept_fraction_samples(fitted["baseline"], fitted[f"no_{axis}"], a, base[f"{a}_acc"], chance[a],
                                        layers)
        if key == "removed":
            point = None if point is None else 1 - point
            samples = None if samples is None else 1 - samples
        out[key], out[f"{key}_ci95"] = point, sample_interval(samples)
        out[f"{key}_layers"] = [layers[i] for i in above_chance_layers(base[f"{a}_acc"], chance[a])]
    return out


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
    version = 1
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
