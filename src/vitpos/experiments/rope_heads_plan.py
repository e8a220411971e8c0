"""rope_heads' settings and plan arithmetic: what run_rope_heads computes (`plan_rope_heads`), walking
the same `heads_work`, and its parts (`sweep_plan`, `restore_index_plan`, `plan_c5_ablations`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vitpos.analysis.probes import DEFAULT_L2_GRID
from vitpos.experiments.base import Settings, SplitSizes, StagePlan
from vitpos.experiments.common import SWEEP_TRAIN_TOKENS, sweep_batch
from vitpos.experiments.rope_heads_ablation import C5_ABLATIONS, RACE_GUESS, coordinate_edits, screen_cut
from vitpos.experiments.rope_heads_analysis import NULL_SPLITS
from vitpos.experiments.rope_heads_rebuild import REBUILD_KINDS, TOP_METHODS, heads_work
from vitpos.models.surface import ModelSurface


def sweep_plan(n_p: int, L: int, Hh: int, N: int, Rs: list[int]) -> StagePlan:
    """What `rebuild_sweep` runs: clean and off over every block, fits over layers >= min(Rs); per R
    the restore condition (full forward), its stream moved on layer by layer, and per later head
    blocks >= its layer with fits of the layers >= that block."""
    if not Rs:
        return StagePlan()
    fitted = L - min(Rs)

    def fits(count: int, l2_values: int = 2) -> StagePlan:
        return StagePlan.probe_fits(count, n_p, N, SWEEP_TRAIN_TOKENS, l2_values)

    plan = StagePlan.full(n_p, L, 2) + fits(fitted, len(DEFAULT_L2_GRID)) + fits(fitted)
    for R in Rs:
        tails = sum(L - li for li in range(R, L))
        plan += (StagePlan.full(n_p, L) + fits(fitted) + StagePlan(blocks=n_p * ((L - 1 - R) + Hh * tails))
                 + fits(Hh * tails))
    return plan


def sweep_points(L: int, R: int, sweep: list[int] | None, quick: bool) -> list[int]:
    """The restore points of the R sweep besides R: `sweep` if given, else R's neighbours R - 1 and R + 1
    (every valid R before issue 48: 70 % of the stage's probe fits, for a number no claim reads; the run's
    30-min budget), or under --quick the next one (R + 1, else R - 1: the cheapest point, fewest heads after it)."""
    if sweep is None:
        sweep = ([R + 1] if R + 1 <= L - 1 else [R - 1]) if quick else [R - 1, R + 1]
    return sorted({r for r in sweep if 1 <= r <= L - 1} - {R})


def plan_rope_heads(settings: RopeHeadsSettings, surface: ModelSurface, sizes: SplitSizes,
                    shared_prefix: bool = True) -> StagePlan:
    """What run_rope_heads computes with the study's settings (axis, restore_from, probe_images,
    top1_images, attn_images, sweep_restore), walking the same `heads_work`. Refits under a
    condition search at most 2 L2 values."""
    L, Hh, N = surface.depth, surface.num_heads, surface.num_patches
    work = heads_work(L, Hh, settings.restore_from, settings.sweep_restore)
    R, later = work.R, work.later
    n_a = sizes.n("test", settings.attn_images)
    n_p = sizes.n("test", settings.probe_images)
    n_t = sizes.n("test", settings.top1_images)

    def fits(count: int, l2_values: int = 2) -> StagePlan:
        return StagePlan.probe_fits(count, n_p, N, SWEEP_TRAIN_TOKENS, l2_values)

    # clean / off / restored references
    probes = StagePlan.full(n_p, L, 3) + fits(len(later), len(DEFAULT_L2_GRID)) + fits(2 * len(later))
    # the restore statistics (z means, direct effects) and the joint top-k conditions
    joint = 1 + len(TOP_METHODS)
    tail = (restore_index_plan(n_a, L, Hh, R) + sweep_plan(n_p, L, Hh, N, work.sweep)
              + plan_c5_ablations(settings, surface, sizes, shared_prefix))
    if not shared_prefix:  # every condition a full forward, each rebuild condition fitting every later layer
        conditions = len(REBUILD_KINDS) * len(work.rebuild) + len(TOP_METHODS)
        return (StagePlan.full(n_a, L, 1 + 2 * len(work.heads)) + probes
                + StagePlan.full(n_p, L, conditions + 1) + fits(conditions * len(later))
                + StagePlan.full(n_t, L, 1 + len(work.heads)) + tail)
    # axis index: clean patterns, then per layer one block per head and removed axis from the clean stream
    attn = StagePlan.full(n_a, L) + StagePlan(forwards=n_a, blocks=n_a * (2 * len(work.heads) + L - 1))
    # rebuild: the restore stream moved on to each head's layer l, then per kind blocks >= l fitting layers >= l;
    # the statistics and the joint conditions run blocks >= R from the restore stream
    rebuild, at = StagePlan(blocks=n_p * joint * (L - R)) + fits(len(TOP_METHODS) * len(later)), R
    for li, _ in work.rebuild:
        rebuild += StagePlan(blocks=n_p * (li - at))
        at = li
        for _ in REBUILD_KINDS:
            rebuild += StagePlan(blocks=n_p * (L - li)) + fits(L - li)
    # top-1 drops: per batch one clean pass, block by block, and blocks >= l per head of layer l
    n_s = screen_cut(n_t, sweep_batch(surface), settings.top1_screen_images)
    drops = StagePlan(forwards=n_t, blocks=n_s * (L + sum(L - li for li, _ in work.heads)))
    if n_s < n_t:  # adaptive top-1: after the screen, the clean pass and the heads in the race
        drops += StagePlan(blocks=(n_t - n_s) * (L + RACE_GUESS * L),
                           note=f"adaptive top-1: after the screen counted for {RACE_GUESS} heads of layer 0 in the "
                                "race (data-dependent)")
    return attn + probes + rebuild + drops + tail


def restore_index_plan(n_images: int, L: int, Hh: int, R: int, n_null: int = NULL_SPLITS) -> StagePlan:
    """What `restore_axis_index` runs: the restore stream to R, then per later layer the restored
    pattern, two axis removals and 2 x n_null relabelled removals per head (single blocks), and
    the step to the next layer."""
    later = L - R
    return StagePlan(forwards=n_images, blocks=n_images * (R + later * (2 + Hh * (2 + 2 * n_null))))


class RopeHeadsSettings(Settings):
    """`rope_heads:` in the run config."""

    QUICK = {"probe_images": 150, "top1_images": 300, "attn_images": 16, "c5_ablation_heads": 5}
    axis: Literal["row", "col", "both"] = "both"
    restore_from: int | None = Field(default=None, ge=1, description="None = depth // 2")
    # 300 / 1000 (500 / 2000 before issue 48): the default run inside its 30-min budget on 2 cores
    probe_images: int = Field(default=300, ge=2)
    top1_images: int = Field(default=1000, ge=1)
    attn_images: int = Field(default=64, ge=1)
    # 500 (issue 33): on the zoo's seed-0 RoPE members the race names the same largest head and gives
    # C5 the same outcome as the exhaustive sweep for every head as primary (scripts/compare_top1_screen.py,
    # tests/unit/test_top1_screen_zoo.py), and saves most of the identity sweep's time.
    top1_screen_images: int | None = Field(
        default=500, ge=0, description="adaptive top-1: every head on this many images (whole batches), the rest "
        "only for the heads still in the race; 0 or None = every head on every image")
    sweep_restore: list[int] | None = Field(
        default=None, description="restore points R at which the primary rebuilding head is chosen again (issue 29); "
        "None = restore_from - 1 and + 1 in a full run, restore_from + 1 under --quick")
    # 4, not every head: the five side ablations were 71 % of the stage's block evaluations on the zoo
    # (24 heads; 8 before issue 48's time budget); the verdict rests on the identity sweep, which covers every head.
    c5_ablation_heads: int | None = Field(
        default=4, ge=1, description="C5 under the counterfactual ablations (swap, shift, jitter, rescale, "
        "mean output) on the primary and this many top heads by the identity drop; None = every head")


def plan_c5_ablations(settings: RopeHeadsSettings, surface: ModelSurface, sizes: SplitSizes,
                      shared_prefix: bool = True) -> StagePlan:
    """What c5_under_ablations computes: a clean pass for the head means, then per ablated head and
    ablation blocks >= its layer (shared prefix; the clean stream advanced to the last layer) or a
    full forward. Top-k heads are data-dependent: counted as in layer 0 (an upper bound) with a note."""
    L, Hh = surface.depth, surface.num_heads
    n_t = sizes.n("test", settings.top1_images)
    kinds = len(C5_ABLATIONS) - 1 if coordinate_edits(surface) else 1  # mean_output only without coordinates
    k = settings.c5_ablation_heads
    means = StagePlan.full(n_t, L)
    if k is None or k + 1 >= L * Hh:  # every head (a top k that covers them all is every head too)
        if not shared_prefix:
            return means + StagePlan.full(n_t, L, kinds * L * Hh)
        return means + StagePlan(forwards=n_t, blocks=n_t * ((L - 1) + kinds * Hh * L * (L + 1) // 2))
    count = min(L * Hh, k + 1)
    note = f"C5 ablations: {count} heads counted as in layer 0 (the top {k} and the primary; data-dependent)"
    if not shared_prefix:
        return means + StagePlan(forwards=n_t * kinds * count, blocks=n_t * L * kinds * count, note=note)
    return means + StagePlan(forwards=n_t, blocks=n_t * ((L - 1) + kinds * count * L), note=note)
