"""E6-E7 (C4, C5): which heads are axis-specialised, which rebuild position, which matter for accuracy.

Per (layer, head):
  axis_index  S = (A_row - A_col) / (A_row + A_col) in [-1, 1], A_a = mean over patch queries of
              KL(attention clean || attention with axis a removed for this head only)
              (+1: the head's pattern depends on row offsets only; -1: column only; |S| >= 0.5 = specialised),
              with axis_index_ci95: bootstrap over the attention images (A_row and A_col of each head
              recomputed on each resample of images)
  rebuild_score  in the restore setting (axis removed in layers < R, restored from R on), the fall
              in mean recovery Rec over layers >= R when this head's rotation stays removed too
              (0 for heads in layers < R, whose rotation is removed anyway: reported as null)
  drop_points  100 x (top-1 intact - top-1 with all of this head's rotations removed), with
              drop_ci95: paired bootstrap over the top-1 images (the same images intact and ablated)
primary_rebuilding_head = argmax rebuild_score. Issue 29: how often it would be chosen again
(`selection_frequency`, bootstrap over the probe images; `restore_sweep` at other R), S measured in
the restore condition (`axis_index_restore`) signed to the axis it carries, the |S| null from
relabelled rotary pairs (`axis_index_null_threshold`), and its share of the recovery.
primary_margin_ci95[layer][head]: interval of drop(primary) - drop(head), paired over the same
images (null for the primary itself); C5 holds when every margin's interval lies above 0
(analysis/stats.py, docs/methods.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch

from vitpos.analysis.stats import accuracy_interval
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.experiments import rope_heads_section
from vitpos.experiments.base import Done, Experiment, Figure, SplitSizes, StageInput, StagePlan
from vitpos.experiments.checks import check_probe_images, images_of
from vitpos.experiments.common import AXIS_SETS, check_restore_points, require_rope, sample_interval
from vitpos.experiments.rope_heads_ablation import (
    C5_RESTS_ON,
    HeadDrops,
    c5_heads,
    c5_heads_rule,
    c5_under_ablations,
    head_drops,
)
from vitpos.experiments.rope_heads_analysis import (
    NULL_SENSITIVITY,
    RestoreAxisIndex,
    axis_index,
    restore_axis_index,
    selection_frequency,
)
from vitpos.experiments.rope_heads_plan import RopeHeadsSettings, plan_rope_heads, sweep_points
from vitpos.experiments.rope_heads_rebuild import (
    HeadsWork,
    PrimaryAxis,
    Rebuild,
    heads_work,
    measure_rebuild,
    primary_axis,
    rebuild_sweep,
)
from vitpos.models.surface import ModelSurface
from vitpos.progress import progress_bar
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.rope_heads import SPECIALISED, C5Ablation, RopeHeadsResult

AXES = ("row", "col", "both")


def run_rope_heads(surface: ModelSurface, data: str = "shapes", axis: str = "both", restore_from: int | None = None,
                   n_probe_images: int = 500, n_top1_images: int = 2000, n_attn_images: int = 64,
                   split: str = "test", seed: int = 0, out: str | Path | None = None,
                   progress: bool = False, shared_prefix: bool = True,
                   top1_screen: int | None = None, sweep_restore: list[int] | None = None,
                   c5_ablation_heads: int | None = None) -> RopeHeadsResult:
    """shared_prefix (default): every per-head intervention in layer l runs only blocks >= l from
    the stream it shares with a reference condition, and the rebuild probes of layers R..l-1 (fits
    on activations identical to the plain restore condition's) are copied from it: the same
    numbers as shared_prefix=False, which reruns every condition from the input.

    top1_screen (adaptive top-1, off by default): every head's drop on the first ~`top1_screen`
    images, the remaining top-1 images only for the heads still in the race (`in_the_race`: the
    leader, heads whose interval reaches its lower end, the primary rebuilding head). The drops
    and intervals of the others rest on the screen's images (`top1_images_per_head`).

    sweep_restore: further restore points at which the primary rebuilding head is chosen again
    (`rebuild_sweep`, `restore_sweep` in the result, beside R's own point); None or []: none.

    c5_ablation_heads: C5 under the counterfactual ablations (`c5_under_ablations`) on every head
    (None) or on the primary and the top `c5_ablation_heads` heads by the identity drop."""
    require_rope(surface)
    if axis not in AXES:
        raise VitposError(f"unknown --axis {axis!r}; use row, col or both")
    if restore_from is not None:
        check_restore_points(surface, [restore_from], "--restore-from")
    if sweep_restore:
        check_restore_points(surface, list(sweep_restore), "sweep_restore")
    work = heads_work(surface.depth, surface.num_heads, restore_from, sweep_restore)
    axes = AXIS_SETS[axis]
    probe_set = dataset_for(surface, data, split, limit=n_probe_images)
    top1_set = dataset_for(surface, data, split, limit=n_top1_images)
    surface.check_classifier(top1_set.info, data_name(data))  # before any work: the drops are top-1
    attn_images = next(iter(dataset_for(surface, data, split, limit=n_attn_images).batches(n_attn_images)))[0]
    with progress_bar(enabled=progress) as bar:
        task = bar.add_task("rope-heads", total=4 + len(work.heads) + len(work.rebuild))

        def tick(description: str | None) -> None:
            if description is None:
                bar.update(task, advance=1)
            else:
                bar.update(task, advance=1, description=description)

        S, kl = axis_index(surface, attn_images, shared_prefix)
        S_ci = kl.pop("ci95")
        tick("rope-heads: baseline probes")
        rb = measure_rebuild(surface, probe_set, axes, work, seed, shared_prefix, tick)
        sweep = {str(work.R): {"recovery_restore": rb.recovery, "rebuild_score": rb.score,
                               "primary": None if rb.primary is None else list(rb.primary),
                               "selection_frequency": selection_frequency(rb.score_samples)}}
        if work.sweep:
            sweep.update(rebuild_sweep(surface, probe_set, axes, work.sweep, seed=seed))
        # where it rebuilds: S in the restore condition, its null, the axis the primary carries
        restore_S = restore_axis_index(surface, attn_images, axes, work.R, seed=seed)
        measured = head_drops(surface, top1_set, shared_prefix, on_head=lambda li, h: tick(
            f"rope-heads: ablate L{li}H{h}"), screen=top1_screen, keep=[rb.primary] if rb.primary else [])
        c5 = c5_under_ablations(
            surface, top1_set, measured, rb.primary, c5_heads(measured, rb.primary, c5_ablation_heads), seed=seed,
            shared_prefix=shared_prefix)
        tick("rope-heads: C5 under counterfactual ablations")
    result = _heads_result(surface, data_name(data), axis, work, len(probe_set), len(top1_set), S, S_ci, kl, rb,
                           sweep, restore_S, primary_axis(rb, restore_S, axes), measured, c5, c5_ablation_heads)
    if out is not None:
        RopeHeadsExperiment().write(result, out)
    return result


def _heads_result(surface: ModelSurface, data: str, axis: str, work: HeadsWork, n_probe: int, n_top1: int,
                  S: list[list[float]], S_ci: Any, kl: dict, rb: Rebuild, sweep: dict[str, Any],
                  restore_S: RestoreAxisIndex, pa: PrimaryAxis, measured: HeadDrops, c5: dict[str, C5Ablation],
                  c5_ablation_heads: int | None) -> RopeHeadsResult:
    """The result of run_rope_heads from its measurements: the drops ranked, the primary's place."""
    L, Hh, R, primary, top = surface.depth, surface.num_heads, work.R, rb.primary, rb.top
    drops = measured.drops()
    order = sorted(((drops[li][h], li, h) for li, h in work.heads), reverse=True)
    largest = order[0][1:]
    rank = None if primary is None else 1 + [o[1:] for o in order].index(primary)
    order_late = [o for o in order if o[1] >= R]  # heads that can rebuild (layers >= R) only
    rank_late = None if primary is None else 1 + [o[1:] for o in order_late].index(primary)
    freq = sweep[str(R)]["selection_frequency"]
    null_q = ({f"{q:g}": float(torch.quantile(torch.tensor(restore_S.null, dtype=torch.float64), q))
               for q in NULL_SENSITIVITY} if restore_S.null else None)
    return RopeHeadsResult.model_validate({
        "model": surface.spec, "data": data, "axis": axis, "layers": list(range(L)), "num_heads": Hh,
        "restore_from": R, "baseline_top1": measured.base_top1,
        "baseline_top1_ci95": accuracy_interval(measured.clean), "n_top1_images": n_top1,
        "top1_screen_images": measured.screened,
        "top1_images_per_head": None if measured.measured is None else measured.counts(),
        "n_probe_images": n_probe, "recovery_restore": rb.recovery,
        "recovery_restore_ci95": sample_interval(rb.recovery_samples),
        "rebuild_score_ci95": rb.score_ci95, "mean_ablate_score_ci95": rb.mean_ablate_ci95,
        "axis_index": S, "axis_index_ci95": S_ci, "kl": kl, "rebuild_score": rb.score, "drop_points": drops,
        "drop_ci95": measured.drop_intervals(),
        "mean_ablate_score": rb.mean_ablate, "top_heads": {m: [list(x) for x in v] for m, v in top.items()},
        "top_heads_overlap": len(set(top["rebuild"]) & set(top["mean_ablate"])),
        "direct_effect_score": rb.direct, "direct_effect_ci95": rb.direct_ci95,
        "top_heads_agreement": {f"{m1}~{m2}": len(set(top[m1]) & set(top[m2]))
                                for i, m1 in enumerate(top) for m2 in list(top)[i + 1:]},
        "top_heads_recovery_fraction": rb.explained,
        "primary_margin_ci95": None if primary is None else measured.margin_intervals(primary),
        "primary_rebuilding_head": None if primary is None else list(primary),
        "primary_head_drop_rank": rank, "largest_drop_head": list(largest),
        "primary_head_drop_rank_after_R": rank_late,
        "largest_drop_head_after_R": list(order_late[0][1:]) if order_late else None,
        "primary_is_largest_drop": primary is not None and tuple(primary) == tuple(largest),
        "specialised_heads": [[li, h] for li, h in work.heads if abs(S[li][h]) >= SPECIALISED],
        "rebuild_score_axis": rb.score_axis, "selection_frequency": freq,
        "primary_selection_frequency": None if primary is None or freq is None else freq.get(
            f"L{primary[0]}H{primary[1]}", 0.0),
        "axis_index_restore": restore_S.S, "axis_index_restore_ci95": restore_S.ci95,
        "axis_index_null_threshold": restore_S.threshold, "axis_index_null_n": len(restore_S.null),
        "axis_index_null_quantiles": null_q, "primary_axis": pa.carried, "primary_axis_index_matched": pa.matched,
        "primary_axis_index_matched_ci95": pa.matched_ci95, "primary_recovery_share": pa.share,
        "primary_recovery_share_ci95": pa.share_ci95, "top_heads_recovery_fraction_ci95": rb.explained_ci95,
        "restore_sweep": {k: sweep[k] for k in sorted(sweep, key=int)},
        "c5_ablations": c5, "c5_rests_on": C5_RESTS_ON, "c5_ablation_heads_rule": c5_heads_rule(c5_ablation_heads),
    })


class RopeHeadsExperiment(Experiment[RopeHeadsResult, RopeHeadsSettings]):
    name = "rope_heads"
    version = 3  # 2: issue 29 (c5_ablations: C5 under counterfactual ablations); 3: an undefined fall is null, not NaN
    title = "RoPE per-head roles and ablation (C4, C5)"
    claims = ("C4", "C5")
    result_type = RopeHeadsResult
    settings_type = RopeHeadsSettings
    scheme = "rope"

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done],
                       quick: bool) -> RopeHeadsSettings:
        s = cast(RopeHeadsSettings, self.settings_of(config))
        R = s.restore_from if s.restore_from is not None else max(1, surface.depth // 2)
        return s.updated(sweep_restore=sweep_points(surface.depth, R, s.sweep_restore, quick))

    def check(self, settings: RopeHeadsSettings, surface: ModelSurface, data: str, sizes: SplitSizes | None) -> None:
        if settings.restore_from is not None:
            check_restore_points(surface, [settings.restore_from], "rope_heads.restore_from")
        check_probe_images(images_of(sizes, "test", settings.probe_images), "rope_heads.probe_images")

    def plan(self, settings: RopeHeadsSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        return plan_rope_heads(settings, surface, sizes)

    def run_stage(self, surface: ModelSurface, stage: StageInput[RopeHeadsSettings]) -> RopeHeadsResult:
        s = stage.settings
        return run_rope_heads(surface, data=stage.data, axis=s.axis, restore_from=s.restore_from,
                              n_probe_images=s.probe_images, n_top1_images=s.top1_images,
                              n_attn_images=s.attn_images, seed=stage.seed,
                              top1_screen=s.top1_screen_images, sweep_restore=s.sweep_restore,
                              c5_ablation_heads=s.c5_ablation_heads)

    def figures(self, result: RopeHeadsResult) -> list[Figure]:
        from vitpos import plots  # matplotlib is imported when a figure is drawn, not with the experiment

        return [Figure("rope_heads", "axis index, rebuilding score and top-1 drop per head",
                       lambda r, p: plots.plot_rope_heads(r, p))]

    def section(self, result: RopeHeadsResult, claims: ClaimRules) -> str:
        return rope_heads_section.section(result)

    def summary(self, result: RopeHeadsResult, claim: str) -> str:
        return rope_heads_section.summary(result)
