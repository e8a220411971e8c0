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
Issue 29 (what C3 and C4 read now):
  count_matched[a][R]  the clean model's gain over the same layers and the rebuilt share
              B(l) = 1 - (P_clean(l) - P_restore(l)) / (P_clean(R-1) - P_off(R-1)) (`results.common.CountMatched`);
              median_rebuilt_share[a] its median over R (C4)
  removal_floored[no_<a>]  C3's fractions above each layer's content floor max(chance, P_no_both)
  readouts    linear and MLP probes of row / col and of pairwise offsets Δrow / Δcol under baseline,
              no_row, no_col, no_both (`analysis.readout`), with removal fractions
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, cast

import torch
from pydantic import Field

from vitpos.analysis.probes import DEFAULT_L2_GRID
from vitpos.analysis.stats import bootstrap_means
from vitpos.data.resolve import data_name, dataset_for
from vitpos.experiments import rope_axis_section
from vitpos.experiments.base import Done, Experiment, Figure, Settings, SplitSizes, StageInput, StagePlan
from vitpos.experiments.checks import check_probe_images, images_of
from vitpos.experiments.common import (
    SWEEP_TRAIN_TOKENS,
    advance,
    check_restore_points,
    condition_context,
    condition_rebuilt_share,
    condition_recovery_samples,
    probe_condition,
    require_rope,
    sample_interval,
    sweep_batch,
)
from vitpos.hooks import capture
from vitpos.models.surface import AXES, Axis, ModelSurface, Site
from vitpos.progress import progress_bar
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.common import MIN_GAP
from vitpos.results.rope_axis import (
    MIN_ABOVE_CHANCE,
    ReadoutRemoval,
    Readouts,
    RopeAxisResult,
    above_chance_layers,
    floored_kept,
    kept_fraction,
    median_rebuilt_share,
    median_recovery,
)


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


def _defined(x: float) -> float | None:
    """An undefined median (no restore point with a value) is null in rope_axis.json, never NaN."""
    return x if math.isfinite(x) else None


def median_samples(samples: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """Per resample the median over restore points (statistics.median's: the mean of the two
    middle values for an even count) of paired bootstrap samples; None if any is missing."""
    if not samples or any(s is None for s in samples):
        return None
    stacked = torch.stack([s for s in samples if s is not None])  # (restore points, n_boot)
    ordered, k = stacked.sort(dim=0).values, stacked.shape[0]
    mid = ordered[k // 2] if k % 2 else (ordered[k // 2 - 1] + ordered[k // 2]) / 2
    return mid.masked_fill(stacked.isnan().any(0), float("nan"))  # an undefined Rec: an undefined median


def schedule(Rs: list[int], shared_prefix: bool) -> list[tuple[str, tuple[Axis, ...], int | None]]:
    """The conditions after the baseline, in the order run_rope_axis runs them (and plan_rope_axis
    counts them): (name, axes removed, R: the first layer whose rotations come back, None: never)."""
    plan: list[tuple[str, tuple[Axis, ...], int | None]] = [
        ("no_row", ("row",), None), ("no_col", ("col",), None), ("no_both", ("row", "col"), None),
        *((f"restore_{a}_R{R}", (a,), R) for a in AXES for R in Rs)]
    if shared_prefix:  # each axis' restore conditions right after their no_<axis>: one stored stream at a time
        plan = [p for a in AXES for p in plan if p[1] == (a,)] + [p for p in plan if len(p[1]) == 2]
    return plan


def run_rope_axis(surface: ModelSurface, data: str = "shapes", n_images: int = 1000, split: str = "test",
                  seed: int = 0, restore_points: list[int] | None = None, out: str | Path | None = None,
                  progress: bool = False, shared_prefix: bool = True, batch_size: int | None = None,
                  readout_images: int = 0, readout_layer_list: list[int] | None = None) -> RopeAxisResult:
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
    done, fitted = probe_conditions(surface, dataset, Rs, shared_prefix, seed, batch_size, progress)
    conditions = {name: done[name] for name in sorted(done, key=_order(Rs))}
    rec, medians, matched, shares = recoveries(conditions, fitted, Rs, layers)
    H, W = surface.grid
    chance = {"row": 1 / H, "col": 1 / W}
    result = RopeAxisResult.model_validate({
        "model": surface.spec, "data": data_name(data), "split": split, "n_images": len(dataset), "site": "resid_post",
        "layers": layers, "chance_row": chance["row"], "chance_col": chance["col"],
        "rope": surface.rope_axis_map().to_json(), "conditions": conditions, "recovery": rec, "min_gap": MIN_GAP,
        "removal": {f"no_{a}": axis_removal(conditions, fitted, a, chance, layers) for a in ("row", "col")},
        "median_recovery": medians, "count_matched": matched, "median_rebuilt_share": shares,
        "removal_floored": {f"no_{a}": floored_removal(conditions, fitted, a, chance, layers) for a in ("row", "col")},
        "content_floor": {a: [max(chance[a], f) for f in conditions["no_both"][f"{a}_acc"]] for a in ("row", "col")},
        "readouts": None if not readout_images else run_readouts(
            surface, dataset, readout_layers(surface.depth, readout_layer_list, False), readout_images, seed,
            batch_size)})
    if out is not None:
        RopeAxisExperiment().write(result, out)
    return result


def probe_conditions(surface: ModelSurface, dataset, Rs: list[int], shared_prefix: bool, seed: int,
                     batch_size: int | None, progress: bool) -> tuple[dict[str, dict], dict[str, dict]]:
    """The baseline, then every condition of `schedule(Rs, shared_prefix)` probed: each one's result
    doc (with its axis and restore point) and its fitted probes ({layer: ProbeResult}: per-image
    accuracies for the intervals), by name."""
    done: dict[str, dict] = {}
    fitted: dict[str, dict] = {}
    plan = schedule(Rs, shared_prefix)
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
    return done, fitted


def recoveries(conditions: Mapping[str, Mapping[str, Any]], fitted: Mapping[str, Mapping[int, Any]], Rs: list[int],
               layers: list[int]) -> tuple[dict[str, dict], dict[str, dict], dict[str, dict], dict[str, dict]]:
    """Per axis and restore point the recovery and the count-matched rebuilt share, and per axis
    their medians over the restore points with paired intervals (C4): recovery, median_recovery,
    count_matched, median_rebuilt_share as the result holds them."""
    rec: dict[str, dict] = {"row": {}, "col": {}}
    medians: dict[str, dict] = {}
    matched: dict[str, dict] = {"row": {}, "col": {}}
    shares: dict[str, dict] = {}
    for a in ("row", "col"):
        samples, share_samples = [], []
        for R in Rs:
            rec[a][str(R)], rs = condition_recovery_samples(conditions, fitted, a, f"restore_{a}_R{R}", R, layers)
            if rec[a][str(R)]["mean_rec"] is not None:
                samples.append(rs)
            matched[a][str(R)], bs = condition_rebuilt_share(conditions, fitted, a, f"restore_{a}_R{R}", R, layers)
            if matched[a][str(R)]["mean_share"] is not None:
                share_samples.append(bs)
        medians[a] = {"median_rec": _defined(median_recovery(rec[a])),
                      "median_rec_ci95": sample_interval(median_samples(samples)),
                      "restore_points": [R for R in Rs if rec[a][str(R)]["mean_rec"] is not None]}
        shares[a] = {"median_share": _defined(median_rebuilt_share(matched[a])),
                     "median_share_ci95": sample_interval(median_samples(share_samples)),
                     "restore_points": [R for R in Rs if matched[a][str(R)]["mean_share"] is not None]}
    return rec, medians, matched, shares


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


def floored_removal(conditions: Mapping[str, Mapping[str, Any]], fitted: Mapping[str, Mapping[int, Any]], axis: str,
                    chance: Mapping[str, float], layers: Sequence[int]) -> dict:
    """`FlooredRemoval` of condition no_<axis>: the floor of each layer is max(chance, no_both's
    accuracy there); intervals resample the probes' test images jointly for the baseline, the
    condition and no_both (paired)."""
    other = "col" if axis == "row" else "row"
    out: dict[str, Any] = {}
    for a, key in ((axis, "removed"), (other, "kept")):
        base = conditions["baseline"][f"{a}_acc"]
        floor = [max(chance[a], f) for f in conditions["no_both"][f"{a}_acc"]]
        point, used = floored_kept(base, conditions[f"no_{axis}"][f"{a}_acc"], floor)
        samples = None
        cols = [fits[layers[i]].per_image_acc(a) for i in used
                for fits in (fitted["baseline"], fitted[f"no_{axis}"], fitted["no_both"])]
        if used and all(c is not None for c in cols):
            boot = bootstrap_means(torch.stack(cols, dim=1)).reshape(-1, len(used), 3)
            b, c, f = boot.unbind(-1)
            f = f.clamp_min(chance[a])
            samples = ((c - f) / (b - f)).mean(-1)
        if key == "removed":
            point = None if point is None else 1 - point
            samples = None if samples is None else 1 - samples
        out[key], out[f"{key}_ci95"] = point, sample_interval(samples)
        out[f"{key}_layers"] = [layers[i] for i in used]
    out["interaction"] = out["kept_ci95"] is not None and out["kept_ci95"][0] > 1
    return out


READOUT_CONDITIONS: dict[str, tuple[Axis, ...]] = {"baseline": (), "no_row": ("row",), "no_col": ("col",),
                                                   "no_both": ("row", "col")}


@torch.no_grad()
def run_readouts(surface: ModelSurface, dataset, layers: list[int], n_images: int, seed: int = 0,
                 batch_size: int | None = None) -> Readouts:
    """`Readouts` on the first n_images of `dataset`: per condition one forward capturing the patch
    tokens of `layers`, then the read-outs of each layer."""
    from vitpos.analysis import readout

    data = dataset.subset(n_images)
    npt = surface.num_prefix_tokens
    dev = next(surface.model.parameters()).device
    sites = [Site(layer, "resid_post") for layer in layers]
    acc: dict[str, dict[str, dict[str, dict[str, torch.Tensor]]]] = {}
    for name, axes in READOUT_CONDITIONS.items():
        context = condition_context(surface, axes) if axes else None
        with (context() if context else nullcontext()), capture(surface, sites, tokens=slice(npt, None)) as c:
            for x, _ in data.batches(sweep_batch(surface, batch_size)):
                surface(x.to(dev))
        acc[name] = {str(layer): readout.readouts(c[str(site)], surface.grid, seed=seed)
                     for layer, site in zip(layers, sites, strict=True)}
    chance = readout.chance(surface.grid, seed)
    n_test = len(next(iter(next(iter(acc["baseline"].values())).values()))["row"])
    removal = {f"no_{axis}": {kind: readout_removal(acc, axis, kind, chance, layers) for kind in readout.KINDS}
               for axis in AXES}
    accuracy = {name: {lay: {kind: {t: float(v.mean()) for t, v in per.items()} for kind, per in kinds.items()}
                       for lay, kinds in by_layer.items()} for name, by_layer in acc.items()}
    return Readouts(layers=layers, n_images=len(data), n_test_images=n_test, chance=chance, accuracy=accuracy,
                    removal=removal)


def readout_removal(acc: Mapping[str, Any], axis: str, kind: str, chance: Mapping[str, float],
                    layers: Sequence[int]) -> ReadoutRemoval:
    """`ReadoutRemoval` of condition no_<axis> for read-out `kind`, against the baseline."""
    other = "col" if axis == "row" else "row"
    entry: dict[str, list[float] | float | None] = {}
    for key, target in (("removed", axis), ("kept", other), ("removed_pair", "d" + axis), ("kept_pair", "d" + other)):
        point, samples = _readout_kept(acc, f"no_{axis}", kind, target, chance[target], layers)
        if key.startswith("removed"):
            point = None if point is None else 1 - point
            samples = None if samples is None else 1 - samples
        entry[key], entry[f"{key}_ci95"] = point, sample_interval(samples)
    return ReadoutRemoval.model_validate(entry)


def _readout_kept(acc: Mapping[str, Any], cond: str, kind: str, target: str, chance: float,
                  layers: Sequence[int]) -> tuple[float | None, torch.Tensor | None]:
    """`kept_fraction` of a read-out over `layers` (those >= MIN_ABOVE_CHANCE above chance in the
    baseline), with paired bootstrap samples over the read-outs' test images."""
    base = [acc["baseline"][str(layer)][kind][target] for layer in layers]
    cnd = [acc[cond][str(layer)][kind][target] for layer in layers]
    used = [i for i, b in enumerate(base) if float(b.mean()) - chance >= MIN_ABOVE_CHANCE]
    if not used:
        return None, None
    point = sum((float(cnd[i].mean()) - chance) / (float(base[i].mean()) - chance) for i in used) / len(used)
    boot = bootstrap_means(torch.stack([x for i in used for x in (base[i], cnd[i])], dim=1)).reshape(-1, len(used), 2)
    b, c = boot.unbind(-1)
    return point, ((c - chance) / (b - chance)).mean(-1)


def readout_layers(depth: int, layers: list[int] | None, quick: bool) -> list[int]:
    """The read-outs' layers: `layers` if given, else the middle and last layer (the last under --quick)."""
    if layers is not None:
        return sorted(set(layers))
    return [depth - 1] if quick else sorted({depth // 2, depth - 1})


def plan_rope_axis(settings: RopeAxisSettings, surface: ModelSurface, sizes: SplitSizes,
                   shared_prefix: bool = True) -> StagePlan:
    """What run_rope_axis(n_images=settings.images, restore_points=settings.restore) computes,
    walking its `schedule`. Refits under a condition search at most 2 L2 values (the baseline's row
    and column choices)."""
    n, L, N = sizes.n("test", settings.images), surface.depth, surface.num_patches
    Rs = sorted(set(settings.restore)) if settings.restore else list(range(1, L))

    def fits(count: int, l2_values: int = 2) -> StagePlan:
        return StagePlan.probe_fits(count, n, N, SWEEP_TRAIN_TOKENS, l2_values)

    plan = StagePlan.full(n, L) + fits(L, len(DEFAULT_L2_GRID))  # the baseline
    at: dict[str, int] = {}  # axis -> the layer no_<axis>'s kept stream is at
    for _, axes, R in schedule(Rs, shared_prefix):
        if not shared_prefix or len(axes) == 2 or R is None:  # from the input
            plan += StagePlan.full(n, L) + fits(L)
            if shared_prefix and R is None and Rs:
                at[axes[0]] = Rs[0]
            continue
        if R > at[axes[0]]:  # no_<axis>'s stream moved on to R, then blocks >= R; layers < R copied
            plan += StagePlan(blocks=n * (R - at[axes[0]]))
            at[axes[0]] = R
        plan += StagePlan(blocks=n * (L - R)) + fits(L - R)
    return plan + readout_plan(settings, L, sizes)


def readout_plan(settings: RopeAxisSettings, L: int, sizes: SplitSizes) -> StagePlan:
    """The read-outs' four full forwards (their small probe fits are not counted)."""
    n_r = min(settings.readout_images or 0, sizes.n("test", settings.images))
    if not n_r:
        return StagePlan()
    return StagePlan.full(n_r, L, len(READOUT_CONDITIONS)) + StagePlan(
        note=f"read-outs: {8 * len(READOUT_CONDITIONS)} small probe fits per layer, not counted")


def _order(Rs: list[int]):
    names = ["baseline", "no_row", "no_col", "no_both"] + [f"restore_{a}_R{R}" for a in ("row", "col") for R in Rs]
    return names.index


class RopeAxisSettings(Settings):
    """`rope_axis:` in the run config."""

    QUICK = {"images": 200, "readout_images": 48, "restore": None}  # restore: the middle layer, filled per model
    images: int = Field(default=500, ge=2)  # 1000 before issue 48's time budget
    restore: list[int] | None = Field(default=None, min_length=1, description="None = every layer 1..depth-1")
    readout_images: int = Field(default=128, ge=0, description="images of the MLP and relative-position read-outs "
                                "(issue 29); 0 = none")
    readout_layers: list[int] | None = Field(default=None, description="layers of the read-outs; None = the middle and "
                                             "last layer (the last only under --quick)")


class RopeAxisExperiment(Experiment[RopeAxisResult, RopeAxisSettings]):
    name = "rope_axis"
    version = 1
    title = "RoPE axis removal and restoring (C3, C4)"
    claims = ("C3", "C4")
    result_type = RopeAxisResult
    settings_type = RopeAxisSettings
    scheme = "rope"

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done],
                       quick: bool) -> RopeAxisSettings:
        s = cast(RopeAxisSettings, self.settings_of(config))
        restore = s.restore
        if restore is None and quick:
            restore = [max(1, surface.depth // 2)]
        return s.updated(restore=restore, readout_layers=readout_layers(surface.depth, s.readout_layers, quick))

    def check(self, settings: RopeAxisSettings, surface: ModelSurface, data: str, sizes: SplitSizes | None) -> None:
        if settings.restore is not None:
            check_restore_points(surface, list(settings.restore), "rope_axis.restore")
        check_probe_images(images_of(sizes, "test", settings.images), "rope_axis.images")

    def plan(self, settings: RopeAxisSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        return plan_rope_axis(settings, surface, sizes)

    def run_stage(self, surface: ModelSurface, stage: StageInput[RopeAxisSettings]) -> RopeAxisResult:
        s = stage.settings
        return run_rope_axis(surface, data=stage.data, n_images=s.images, restore_points=s.restore,
                             seed=stage.seed, readout_images=s.readout_images,
                             readout_layer_list=s.readout_layers)

    def figures(self, result: RopeAxisResult) -> list[Figure]:
        from vitpos import plots  # matplotlib is imported when a figure is drawn, not with the experiment

        figs = [Figure("rope_axis", "probe accuracy per layer under each condition",
                       lambda r, p: plots.plot_rope_axis(r, p))]
        if result.recovery:
            figs.append(Figure("rope_recovery", "recovery Rec(l) after restoring from R",
                               lambda r, p: plots.plot_recovery(r, p)))
        return figs

    def section(self, result: RopeAxisResult, claims: ClaimRules) -> str:
        return rope_axis_section.section(result)

    def summary(self, result: RopeAxisResult, claim: str) -> str:
        return rope_axis_section.summary(result, claim)
