"""The prefix-token route: does absolute position re-enter a RoPE model through CLS and registers?

Prefix tokens are never rotated, so a patch query's score against a prefix key depends on the
patch's absolute position (its rotation), not on a relative offset: attention to the prefix can
write absolute position into every patch. The test blocks that route (`hooks.block_prefix`: each
patch query's attention to the prefix is set to 0 and renormalised over the patch keys, i.e. the
softmax over patch keys alone; prefix queries keep attending everywhere) and probes row and column
on resid_post patch tokens per layer, as rope_axis does, under:

  baseline                   the clean model
  block                      prefix blocked in layers >= block_from (0: all layers)
  no_<axis>                  that rotation axis removed in every layer (axis: row, col, both)
  no_<axis>_block            both at once
  restore_<axis>_R<R>        axis removed in layers < R, rotations back from R (axis: row, col)
  restore_<axis>_R<R>_block  the same with the prefix blocked from R on: the rebuilding layers
                             cannot read absolute position off the prefix keys

Recovery after R (METHODS): Rec(l) = (P_restore(l) - P_off(l)) / (P_clean(l) - P_off(l)) for
l >= R, P the retrained accuracy, clean = baseline and off = no_<axis> for both restore conditions
(so the two are on one scale: what blocking takes away is the prefix route's share); null where
P_clean - P_off < MIN_GAP. Also measured: the clean model's attention mass of patch queries on the
prefix per layer (how much there is to block).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from vitpos.analysis.probes import DEFAULT_L2_GRID
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.experiments import rope_prefix_section
from vitpos.experiments.base import Experiment, Figure, Settings, SplitSizes, StageInput, StagePlan
from vitpos.experiments.checks import check_probe_images, images_of
from vitpos.experiments.common import (
    AXIS_SETS,
    SWEEP_TRAIN_TOKENS,
    advance,
    check_restore_points,
    condition_context,
    condition_recovery,
    probe_condition,
    require_rope,
)
from vitpos.hooks import block_prefix, observe
from vitpos.models.surface import AXES, ModelSurface, Site
from vitpos.progress import progress_bar
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.common import MIN_GAP
from vitpos.results.rope_prefix import RopePrefixResult


@dataclass(frozen=True)
class Spec:
    """One condition: axes removed (in layers < restore_from, or all), prefix blocked from a layer."""

    name: str
    axis: str | None
    restore_from: int | None
    prefix_blocked_from: int | None

    def context(self, surface: ModelSurface) -> Callable[[], AbstractContextManager]:
        axes = AXIS_SETS[self.axis] if self.axis else ()
        rotations = condition_context(surface, axes, self.restore_from)

        def make() -> ExitStack:
            es = ExitStack()
            es.enter_context(rotations())
            if self.prefix_blocked_from is not None:
                es.enter_context(block_prefix(surface, range(self.prefix_blocked_from, surface.depth)))
            return es
        return make


def families(block_from: int, restore_from: int) -> list[tuple[Spec, list[tuple[Spec, int]]]]:
    """Every condition, as (parent, [(child, first layer where the child differs from the parent)]):
    a child agrees with its parent before that layer, so it can run from the parent's stream there."""
    R, B = restore_from, block_from
    out = [(Spec("baseline", None, None, None), [(Spec("block", None, None, B), B)])]
    for axis in ("row", "col", "both"):
        kids = [(Spec(f"no_{axis}_block", axis, None, B), B)]
        if axis != "both":
            kids += [(Spec(f"restore_{axis}_R{R}", axis, R, None), R),
                     (Spec(f"restore_{axis}_R{R}_block", axis, R, R), R)]
        out.append((Spec(f"no_{axis}", axis, None, None), kids))
    return out


def prefix_attention(surface: ModelSurface, images: torch.Tensor) -> list[float]:
    """Per layer, the mean over images, heads and patch queries of the attention on prefix keys
    (running sums: bounded memory whatever the model)."""
    npt, L = surface.num_prefix_tokens, surface.depth
    sums = [0.0] * L
    counts = [0] * L

    def add(layer: int) -> Callable[[torch.Tensor], None]:
        def fn(t: torch.Tensor) -> None:  # (B, h, T, T)
            mass = t[:, :, npt:, :npt].sum(-1).double()
            sums[layer] += float(mass.sum())
            counts[layer] += mass.numel()
        return fn

    dev = surface.device
    with observe(surface, {Site(layer, "attn_pattern"): add(layer) for layer in range(L)}):
        surface(images.to(dev))
    return [s / max(1, c) for s, c in zip(sums, counts, strict=True)]


def check_block_from(surface: ModelSurface, block_from: int, flag: str = "--block-from") -> None:
    if not 0 <= block_from <= surface.depth - 1:
        raise VitposError(f"{flag} {block_from}: the first blocked layer must lie in 0..{surface.depth - 1} for "
                          f"{surface.spec} (depth {surface.depth}; 0 blocks the prefix in every layer)")


def run_rope_prefix(surface: ModelSurface, data: str = "shapes", n_images: int = 500, restore_from: int | None = None,
                    block_from: int = 0, n_attn_images: int = 64, split: str = "test", seed: int = 0,
                    out: str | Path | None = None, progress: bool = False,
                    shared_prefix: bool = True) -> RopePrefixResult:
    """restore_from: R of the restore conditions, 1..depth-1 (None: depth // 2); block_from: first
    layer of the block conditions, 0..depth-1. shared_prefix (default): a condition that agrees with
    an earlier one before layer k runs only blocks >= k from that one's residual stream and copies
    its fits of layers < k (the same numbers, fewer forwards and fits); False: each from the input."""
    require_rope(surface)
    if surface.num_prefix_tokens == 0:
        raise VitposError(f"{surface.spec} has no prefix tokens (CLS or registers): there is no prefix route to block")
    L = surface.depth
    if restore_from is not None:
        check_restore_points(surface, [restore_from], "--restore-from")
    check_block_from(surface, block_from)
    R = restore_from if restore_from is not None else max(1, L // 2)
    layers = list(range(L))
    dataset = dataset_for(surface, data, split, limit=n_images)
    surface.check_classifier(dataset.info, data_name(data))  # before any work: every condition has a top-1
    attn_set = dataset_for(surface, data, split, limit=n_attn_images)
    plan = families(block_from, R)
    done: dict[str, dict] = {}
    fitted: dict[str, dict] = {}  # condition -> {layer: ProbeResult}: per-image accuracies for the intervals
    with progress_bar(enabled=progress) as bar:
        task = bar.add_task("rope-prefix", total=1 + sum(1 + len(kids) for _, kids in plan))
        mass = prefix_attention(surface, next(iter(attn_set.batches(len(attn_set))))[0])
        bar.update(task, advance=1)
        base_probes = None
        for parent, kids in plan:
            starts = sorted({k for _, k in kids if k > 0}) if shared_prefix else []
            res = probe_condition(surface, dataset, parent.context(surface), base_probes, seed=seed,
                                  keep_pre=starts[0] if starts else None)
            if base_probes is None:
                base_probes = res["probes"]
            done[parent.name] = _doc(res, parent)
            fitted[parent.name] = res["probes"]
            bar.update(task, advance=1, description=f"rope-prefix {parent.name}")
            for kid, k in sorted(kids, key=lambda x: x[1]):
                if not starts or k == 0:
                    kid_res = probe_condition(surface, dataset, kid.context(surface), base_probes, seed=seed)
                else:
                    if k > res["start"].layer:  # the parent's blocks up to k, as its full forward ran them
                        res["start"] = advance(surface, res["start"], k, parent.context(surface))
                    kid_res = probe_condition(surface, dataset, kid.context(surface), base_probes, seed=seed,
                                              start=res["start"], reuse=res)
                done[kid.name] = _doc(kid_res, kid)
                fitted[kid.name] = kid_res["probes"]
                bar.update(task, advance=1, description=f"rope-prefix {kid.name}")
            res.pop("start", None)  # free the stream before the next family
    conditions = {s.name: done[s.name] for parent, kids in plan for s in (parent, *(k for k, _ in kids))}
    rec = {}
    for a in AXES:
        rec[a] = {key: condition_recovery(conditions, fitted, a, name, R, layers)
                  for key, name in (("open", f"restore_{a}_R{R}"), ("blocked", f"restore_{a}_R{R}_block"))}
    H, W = surface.grid
    result = RopePrefixResult.model_validate({
        "model": surface.spec, "data": data_name(data), "split": split, "n_images": len(dataset), "site": "resid_post",
        "layers": layers, "chance_row": 1 / H, "chance_col": 1 / W, "num_prefix_tokens": surface.num_prefix_tokens,
        "block_from": block_from, "restore_from": R, "prefix_attention": mass, "attn_images": len(attn_set),
        "conditions": conditions, "recovery": rec, "min_gap": MIN_GAP})
    if out is not None:
        RopePrefixExperiment().write(result, out)
    return result


def _doc(res: Mapping[str, Any], spec: Spec) -> dict:
    return {**res["doc"], "axis": spec.axis, "restore_from": spec.restore_from,
            "prefix_blocked_from": spec.prefix_blocked_from}


def plan_rope_prefix(settings: RopePrefixSettings, surface: ModelSurface, sizes: SplitSizes,
                     shared_prefix: bool = True) -> StagePlan:
    """What run_rope_prefix(n_images=settings.images, restore_from=, block_from=, n_attn_images=)
    computes, walking the same condition families (`families`) in the same order. Refits under a
    condition search at most 2 L2 values (the baseline's row and column choices)."""
    n, L, N = sizes.n("test", settings.images), surface.depth, surface.num_patches
    n_a = sizes.n("test", settings.attn_images)
    R = settings.restore_from if settings.restore_from is not None else max(1, L // 2)

    def fits(count: int, l2_values: int = 2) -> StagePlan:
        return StagePlan.probe_fits(count, n, N, SWEEP_TRAIN_TOKENS, l2_values)

    plan = StagePlan.full(n_a, L)  # the clean prefix attention
    for i, (_, kids) in enumerate(families(settings.block_from, R)):
        plan += StagePlan.full(n, L) + fits(L, len(DEFAULT_L2_GRID) if i == 0 else 2)  # the parent, from the input
        starts = sorted({k for _, k in kids if k > 0}) if shared_prefix else []
        at = starts[0] if starts else 0  # the parent's stream is kept before this layer ...
        for _, k in sorted(kids, key=lambda x: x[1]):
            if not starts or k == 0:  # from the input
                plan += StagePlan.full(n, L) + fits(L)
                continue
            if k > at:  # ... and moved on to each later kid's first layer
                plan += StagePlan(blocks=n * (k - at))
                at = k
            plan += StagePlan(blocks=n * (L - k)) + fits(L - k)
    return plan


class RopePrefixSettings(Settings):
    """`rope_prefix:` in the run config."""

    QUICK = {"images": 150, "attn_images": 16}
    images: int = Field(default=300, ge=2, description="test-split images, split by image into probe train/test")
    restore_from: int | None = Field(default=None, ge=1, description="R of the restore conditions; None = depth // 2")
    block_from: int = Field(default=0, ge=0, description="first layer with patch -> prefix attention blocked")
    attn_images: int = Field(default=64, ge=1, description="images for the clean prefix attention mass")


class RopePrefixExperiment(Experiment[RopePrefixResult, RopePrefixSettings]):
    name = "rope_prefix"
    version = 1
    title = "RoPE prefix-token route: patch → CLS/register attention blocked"
    result_type = RopePrefixResult
    settings_type = RopePrefixSettings
    scheme = "rope"

    def applies_to(self, surface: ModelSurface) -> str | None:
        missing = super().applies_to(surface)
        if missing is not None:
            return missing
        return None if surface.num_prefix_tokens else "no prefix tokens (CLS or registers) to block"

    def check(self, settings: RopePrefixSettings, surface: ModelSurface, data: str, sizes: SplitSizes | None) -> None:
        if settings.restore_from is not None:
            check_restore_points(surface, [settings.restore_from], "rope_prefix.restore_from")
        check_block_from(surface, settings.block_from, "rope_prefix.block_from")
        check_probe_images(images_of(sizes, "test", settings.images), "rope_prefix.images")

    def plan(self, settings: RopePrefixSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        return plan_rope_prefix(settings, surface, sizes)

    def run_stage(self, surface: ModelSurface, stage: StageInput[RopePrefixSettings]) -> RopePrefixResult:
        s = stage.settings
        return run_rope_prefix(surface, data=stage.data, n_images=s.images, restore_from=s.restore_from,
                               block_from=s.block_from, n_attn_images=s.attn_images, seed=stage.seed)

    def figures(self, result: RopePrefixResult) -> list[Figure]:
        from vitpos import plots  # matplotlib is imported when a figure is drawn, not with the experiment

        return [Figure("rope_prefix", "probe accuracy per layer with patch → prefix attention blocked, and the "
                       "clean prefix attention mass", lambda r, p: plots.plot_rope_prefix(r, p))]

    def section(self, result: RopePrefixResult, claims: ClaimRules) -> str:
        return rope_prefix_section.section(result)

    def summary(self, result: RopePrefixResult, claim: str) -> str:
        return rope_prefix_section.summary(result)
