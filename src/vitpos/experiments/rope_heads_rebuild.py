"""rope_heads' rebuilding scores (C4): in the restore condition (axes removed in layers < R), the
fall in mean recovery per head of layers >= R (`measure_rebuild`, `RestoreCondition`), direct effects,
the top heads ablated jointly, the R sweep (`rebuild_sweep`) and the primary head's axis."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import Any, NamedTuple, TypeVar

import torch

from vitpos.analysis.probes import position_labels
from vitpos.analysis.stats import LEVEL, bootstrap_means
from vitpos.experiments.common import (
    ContextFactory,
    Start,
    advance,
    condition_context,
    probe_condition,
    recovery,
    recovery_samples,
    sample_interval,
    sweep_batch,
)
from vitpos.experiments.rope_heads_analysis import RestoreAxisIndex, _column_intervals, selection_frequency
from vitpos.hooks import edit, observe
from vitpos.models.surface import Axis, ModelSurface, Site

T = TypeVar("T")


TOP_K = 5


def _top(scores: list[list[float | None]], k: int) -> list[tuple[int, int]]:
    flat = [(v, li, h) for li, row in enumerate(scores) for h, v in enumerate(row) if v is not None and v == v]
    return [(li, h) for _, li, h in sorted(flat, reverse=True)[:k]]


def _stacked(*factories: ContextFactory) -> ContextFactory:
    def make():
        es = ExitStack()
        for f in factories:
            es.enter_context(f())
        return es
    return make


def _rotations_off(surface: ModelSurface, heads: Mapping[int, list[int]], axes: tuple[Axis, ...]) -> ContextFactory:
    """The rotations of these heads ({layer: heads}) removed on `axes`."""
    return condition_context(surface, (), extra={li: {a: list(hs) for a in axes} for li, hs in heads.items()})


def _mean_ablated(surface: ModelSurface, heads: Mapping[int, list[int]],
                  means: Mapping[int, torch.Tensor]) -> ContextFactory:
    """These heads' outputs (blocks.L.z at patch tokens) replaced by their mean over images and
    patches: whatever a head writes that depends on the image or the position is gone."""
    npt = surface.num_prefix_tokens

    def replace(li: int, hs: list[int]):
        def fn(z: torch.Tensor) -> torch.Tensor:
            z = z.clone()
            z[:, hs, npt:] = means[li][hs].to(z.dtype).unsqueeze(1)
            return z
        return fn

    return lambda: edit(surface, {Site(li, "z"): replace(li, list(hs)) for li, hs in heads.items()})


class Fall(NamedTuple):
    """The fall in mean Rec an intervention causes in the restore condition."""

    value: float
    ci95: list[float] | None
    samples: torch.Tensor | None  # (n_boot,) paired bootstrap samples of the fall
    by_axis: dict[str, float]  # the fall in each axis' mean Rec


def _share_interval(fall_samples: torch.Tensor | None, rec_samples: torch.Tensor | None) -> list[float] | None:
    """Interval of fall / Rec from paired samples of both."""
    if fall_samples is None or rec_samples is None:
        return None
    return sample_interval(fall_samples / rec_samples)


class RestoreStats(NamedTuple):
    """One pass of the probe images under the restore condition, over layers >= R."""

    z_means: dict[int, torch.Tensor]  # per layer (heads, d): blocks.L.z over images and patch tokens
    direct: torch.Tensor  # (images, layers, heads) per-image direct effect (logit units)


@torch.no_grad()
def _restore_stats(surface: ModelSurface, dataset, context: ContextFactory, start: Start | None,
                   layers: list[int], probes: Mapping[int, Any], axes: tuple[Axis, ...]) -> RestoreStats:
    """Mean of blocks.L.z over images and patch tokens per layer (running sums), and each head's
    direct effect: its output through its slice of the output projection (`head_projections`),
    read by the layer's clean axis probe (`direct_weight`: the probe's logits are linear in the
    residual stream, which is a sum of such outputs) as the logit of the true row (col) minus the
    mean logit, averaged over patch tokens and `axes`; per image. From the condition's stream at
    `start` when given."""
    npt = surface.num_prefix_tokens
    sums: dict[int, torch.Tensor] = {}
    count = [0]
    labels = {a: position_labels(surface.grid, a) for a in axes}
    # per layer and axis (h, d, K): the head's projection slice times the probe's raw weights
    read = {li: {a: torch.einsum("hdD,DK->hdK", surface.head_projections(li).float().cpu(),
                                 getattr(probes[li], f"{a}_probe").direct_weight()) for a in axes} for li in layers}
    direct: dict[int, list[torch.Tensor]] = {li: [] for li in layers}

    def add(li: int):
        def fn(z: torch.Tensor) -> None:
            zp = z[:, :, npt:].float().cpu()  # (B, h, N, d)
            part = zp.double().sum((0, 2))
            sums[li] = sums[li] + part if li in sums else part
            if li == layers[0]:
                count[0] += z.shape[0] * zp.shape[2]
            effect = torch.zeros(zp.shape[0], zp.shape[1], dtype=torch.float64)
            for a in axes:
                logits = torch.einsum("bhnd,hdk->bhnk", zp, read[li][a]).double()
                true = logits.gather(-1, labels[a].view(1, 1, -1, 1).expand(*logits.shape[:3], 1)).squeeze(-1)
                effect += (true - logits.mean(-1)).mean(-1)
            direct[li].append(effect / len(axes))
        return fn

    sites = {Site(li, "z"): add(li) for li in layers}
    dev = surface.device
    if start is None:
        with context(), observe(surface, sites):
            for x, _ in dataset.batches(sweep_batch(surface)):
                surface(x.to(dev))
    else:
        with observe(surface, sites):
            for t, _ in start.batches(sweep_batch(surface)):
                surface.forward_from(start.layer, t.to(dev))
    means = {li: (sums[li] / count[0]).float() for li in layers}
    return RestoreStats(means, torch.stack([torch.cat(direct[li]) for li in layers], dim=1))


@torch.no_grad()
def rebuild_sweep(surface: ModelSurface, probe_set, axes: tuple[Axis, ...], Rs: list[int],
                  seed: int = 0) -> dict[str, dict]:
    """`SweepPoint` at each R in Rs: clean and axis-off fits once over layers >= min(Rs), per R the
    restore condition (its stream kept at R) and, from it, each later head's rotations removed."""
    L, Hh = surface.depth, surface.num_heads
    layers = list(range(min(Rs), L))
    clean_fit = probe_condition(surface, probe_set, None, seed=seed, layers=layers)
    base = clean_fit["probes"]
    off_fit = probe_condition(surface, probe_set, condition_context(surface, axes), base, seed=seed, layers=layers)
    out: dict[str, dict] = {}
    for R in Rs:
        def mean_rec(fit: Mapping[str, Any], R: int = R) -> tuple[float, torch.Tensor | None]:
            vals, samples = [], []
            for a in axes:
                r = recovery(clean_fit["doc"][f"{a}_acc"], off_fit["doc"][f"{a}_acc"], fit["doc"][f"{a}_acc"], R,
                             layers)
                if r["mean_rec"] is not None:
                    vals.append(r["mean_rec"])
                    samples.append(recovery_samples(clean_fit["probes"], off_fit["probes"], fit["probes"], a, r))
            paired = torch.stack(samples).mean(0) if samples and all(x is not None for x in samples) else None
            return (sum(vals) / len(vals) if vals else float("nan")), paired

        restored = probe_condition(surface, probe_set, condition_context(surface, axes, R), base, seed=seed,
                                   layers=layers, keep_pre=R)
        rec, rec_samples = mean_rec(restored)
        start = restored.pop("start")
        scores: list[list[float | None]] = [[None] * Hh for _ in range(L)]
        samples: dict[tuple[int, int], torch.Tensor | None] = {}
        for li in range(R, L):
            if li > start.layer:
                start = advance(surface, start, li)
            for h in range(Hh):
                fit = probe_condition(surface, probe_set, _rotations_off(surface, {li: [h]}, axes), base, seed=seed,
                                      layers=layers, start=start, reuse=restored)
                value, s = mean_rec(fit)
                scores[li][h] = rec - value
                samples[li, h] = None if s is None or rec_samples is None else rec_samples - s
        flat = [(v, li, h) for li, row in enumerate(scores) for h, v in enumerate(row) if v is not None and v == v]
        best = max(flat) if flat else None
        out[str(R)] = {"recovery_restore": rec, "rebuild_score": scores,
                       "primary": None if best is None else [best[1], best[2]],
                       "selection_frequency": selection_frequency(samples)}
    return out


# the top-k lists; each list is also ablated jointly
TOP_METHODS: tuple[str, ...] = ("rebuild", "mean_ablate", "direct_effect")


# per head of layers >= R, one fall in mean Rec each: its rotations kept removed, its output mean-ablated
REBUILD_KINDS = ("rotations", "mean_output")


class HeadsWork(NamedTuple):
    """What run_rope_heads iterates and plan_rope_heads counts (`heads_work`)."""

    R: int  # the restore point: axes removed in layers < R
    heads: list[tuple[int, int]]  # every (layer, head): the axis index and the top-1 drops
    rebuild: list[tuple[int, int]]  # the heads of layers >= R, in order: one fall per REBUILD_KINDS
    sweep: list[int]  # further restore points of `rebuild_sweep` (R's own left out)

    @property
    def later(self) -> list[int]:
        """The layers >= R: the recovery probes' layers."""
        return sorted({li for li, _ in self.rebuild})


def heads_work(L: int, Hh: int, restore_from: int | None, sweep_restore: list[int] | None) -> HeadsWork:
    R = restore_from if restore_from is not None else max(1, L // 2)
    return HeadsWork(R, [(li, h) for li in range(L) for h in range(Hh)],
                     [(li, h) for li in range(R, L) for h in range(Hh)], sorted(set(sweep_restore or []) - {R}))


class RestoreCondition:
    """run_rope_heads' recovery references over the layers >= R: the clean model (its probes are the
    base probes), `axes` removed in every layer, and the restore condition (removed in layers < R;
    its stream at R kept as `start` when shared_prefix). `fall` measures an intervention against it."""

    def __init__(self, surface: ModelSurface, probe_set, axes: tuple[Axis, ...], work: HeadsWork, seed: int,
                 shared_prefix: bool):
        R = work.R
        self.surface, self.probe_set, self.axes, self.R, self.seed = surface, probe_set, axes, R, seed
        self.later = work.later
        self.clean = probe_condition(surface, probe_set, None, seed=seed, layers=self.later)
        self.base_probes = self.clean["probes"]
        self.off = probe_condition(surface, probe_set, condition_context(surface, axes), self.base_probes, seed=seed,
                                   layers=self.later)
        self.restored = probe_condition(surface, probe_set, condition_context(surface, axes, R), self.base_probes,
                                        seed=seed, layers=self.later, keep_pre=R if shared_prefix else None)
        self.rec, self.rec_samples, self.rec_axis = self.mean_rec(self.restored)
        self.start: Start | None = self.restored.pop("start", None)

    def mean_rec(self, fit: Mapping[str, Any]) -> tuple[float, torch.Tensor | None, dict[str, float]]:
        """Mean Rec over the axes with one, its bootstrap samples (paired across conditions), and
        each axis' mean Rec."""
        vals, samples, per_axis = [], [], {}
        for a in self.axes:
            r = recovery(self.clean["doc"][f"{a}_acc"], self.off["doc"][f"{a}_acc"], fit["doc"][f"{a}_acc"], self.R,
                         self.later)
            if r["mean_rec"] is not None:
                vals.append(r["mean_rec"])
                per_axis[a] = r["mean_rec"]
                samples.append(recovery_samples(self.clean["probes"], self.off["probes"], fit["probes"], a, r))
        paired = torch.stack(samples).mean(0) if samples and all(x is not None for x in samples) else None
        return (sum(vals) / len(vals) if vals else float("nan")), paired, per_axis

    def fall(self, intervention: ContextFactory, at: Start | None) -> Fall:
        """Fall in mean recovery when `intervention` (hooks on blocks >= R only) joins the restore
        condition: from a restore stream at or before its first hooked block, or from the input;
        with its paired bootstrap interval and samples, and the fall per axis."""
        if at is None:
            context = _stacked(condition_context(self.surface, self.axes, self.R), intervention)
            fit = probe_condition(self.surface, self.probe_set, context, self.base_probes, seed=self.seed,
                                  layers=self.later)
        else:
            fit = probe_condition(self.surface, self.probe_set, intervention, self.base_probes, seed=self.seed,
                                  layers=self.later, start=at, reuse=self.restored)
        value, samples, per_axis = self.mean_rec(fit)
        by_axis = {a: self.rec_axis[a] - v for a, v in per_axis.items() if a in self.rec_axis}
        if self.rec_samples is None or samples is None:
            return Fall(self.rec - value, None, None, by_axis)
        diff = self.rec_samples - samples
        return Fall(self.rec - value, sample_interval(diff), diff, by_axis)


def _intervention(surface: ModelSurface, kind: str, heads: Mapping[int, list[int]], axes: tuple[Axis, ...],
                  means: Mapping[int, torch.Tensor]) -> ContextFactory:
    """One of REBUILD_KINDS on these heads ({layer: heads})."""
    return _rotations_off(surface, heads, axes) if kind == "rotations" else _mean_ablated(surface, heads, means)


def _head_grid(L: int, Hh: int, values: Mapping[tuple[int, int], T]) -> list[list[T | None]]:
    """[layer][head] of `values` ({(layer, head): value}), None where a head has none or its value is
    undefined (a NaN fall: no axis had a recovery to fall from)."""
    def cell(v: T | None) -> T | None:
        return None if isinstance(v, float) and math.isnan(v) else v
    return [[cell(values.get((li, h))) for h in range(Hh)] for li in range(L)]


class Rebuild(NamedTuple):
    """The restore condition's numbers of run_rope_heads; per-head grids [layer][head], None before R."""

    recovery: float
    recovery_samples: torch.Tensor | None
    score: list[list[float | None]]  # the fall in mean Rec with the head's rotations kept removed
    score_ci95: list[list[list[float] | None]]
    score_samples: dict[tuple[int, int], torch.Tensor | None]
    score_axis: dict[str, list[list[float | None]]]
    mean_ablate: list[list[float | None]]  # ... with the head's output mean-ablated
    mean_ablate_ci95: list[list[list[float] | None]]
    direct: list[list[float | None]]
    direct_ci95: list[list[list[float] | None]]
    top: dict[str, list[tuple[int, int]]]  # TOP_METHODS -> the top heads
    explained: dict[str, float | None]  # the top heads' joint fall / Rec
    explained_ci95: dict[str, list[float] | None]
    primary: tuple[int, int] | None  # the largest fall


def measure_rebuild(surface: ModelSurface, probe_set, axes: tuple[Axis, ...], work: HeadsWork, seed: int,
                    shared_prefix: bool, tick: Callable[[str | None], None]) -> Rebuild:
    """The recovery references, then per head of layers >= R its falls (REBUILD_KINDS; from the restore
    stream moved on to the head's layer under shared_prefix), the direct effects, and the top heads
    of each method ablated jointly."""
    L, Hh = surface.depth, surface.num_heads
    rc = RestoreCondition(surface, probe_set, axes, work, seed, shared_prefix)
    tick(None)
    stats = _restore_stats(surface, probe_set, condition_context(surface, axes, work.R), rc.start, rc.later,
                           rc.base_probes, axes)
    falls: dict[tuple[int, int], dict[str, Fall]] = {}
    start = rc.start
    for li, h in work.rebuild:
        if start is not None and li > start.layer:  # the restore condition has no hooks from R on
            start = advance(surface, start, li)
        falls[li, h] = {kind: rc.fall(_intervention(surface, kind, {li: [h]}, axes, stats.z_means), start)
                        for kind in REBUILD_KINDS}
        tick(f"rope-heads: rebuild L{li}H{h}")
    del start
    rot = {k: f["rotations"] for k, f in falls.items()}
    score = _head_grid(L, Hh, {k: f.value for k, f in rot.items()})
    mean_abl = _head_grid(L, Hh, {k: f["mean_output"].value for k, f in falls.items()})
    direct, direct_ci = _direct_effects(stats, rc.later, L, Hh)
    k = min(TOP_K, len(work.rebuild))
    top = dict(zip(TOP_METHODS, (_top(score, k), _top(mean_abl, k), _top(direct, k)), strict=True))
    explained: dict[str, float | None] = {}
    explained_ci: dict[str, list[float] | None] = {}
    for method, heads in top.items():
        by_layer: dict[int, list[int]] = {}
        for li, h in heads:
            by_layer.setdefault(li, []).append(h)
        # rotation-removal heads lose their rotations, the others their output (mean-ablated)
        kind = "rotations" if method == "rebuild" else "mean_output"
        joint = rc.fall(_intervention(surface, kind, by_layer, axes, stats.z_means), rc.start)
        # no recovery: nothing to explain
        explained[method] = joint.value / rc.rec if rc.rec > 0 else None
        explained_ci[method] = _share_interval(joint.samples, rc.rec_samples) if rc.rec > 0 else None
    tick("rope-heads: top heads jointly")
    flat = [(f.value, li, h) for (li, h), f in rot.items() if f.value == f.value]  # NaN: no primary
    return Rebuild(rc.rec, rc.rec_samples, score, _head_grid(L, Hh, {k: f.ci95 for k, f in rot.items()}),
                   {k: f.samples for k, f in rot.items()},
                   {a: _head_grid(L, Hh, {k: f.by_axis[a] for k, f in rot.items() if a in f.by_axis}) for a in axes},
                   mean_abl, _head_grid(L, Hh, {k: f["mean_output"].ci95 for k, f in falls.items()}), direct,
                   direct_ci, top, explained, explained_ci, (max(flat)[1], max(flat)[2]) if flat else None)


def _direct_effects(stats: RestoreStats, later: list[int], L: int,
                    Hh: int) -> tuple[list[list[float | None]], list[list[list[float] | None]]]:
    """Each head's mean direct effect over the probe images and its bootstrap interval (None before R)."""
    direct_mean = stats.direct.mean(0)  # (later layers, heads)
    direct: list[list[float | None]] = [[None] * Hh for _ in range(L)]
    direct_ci: list[list[list[float] | None]] = [[None] * Hh for _ in range(L)]
    cis = _column_intervals(bootstrap_means(stats.direct.reshape(len(stats.direct), -1)), LEVEL, factor=1.0)
    for i, li in enumerate(later):
        direct[li] = [float(v) for v in direct_mean[i]]
        direct_ci[li] = list(cis[i * Hh:(i + 1) * Hh])
    return direct, direct_ci


class PrimaryAxis(NamedTuple):
    """The axis the primary rebuilding head carries (its larger fall), its restore-condition S
    signed to that axis, and its share of the recovery; all None without a primary."""

    carried: str | None = None
    matched: float | None = None
    matched_ci95: list[float] | None = None
    share: float | None = None
    share_ci95: list[float] | None = None


def primary_axis(rb: Rebuild, restore_S: RestoreAxisIndex, axes: tuple[Axis, ...]) -> PrimaryAxis:
    if rb.primary is None:
        return PrimaryAxis()
    pl, ph = rb.primary
    by = {a: v for a in axes if (v := rb.score_axis[a][pl][ph]) is not None}
    carried = axes[0] if len(axes) == 1 else (max(by, key=by.__getitem__) if by else None)
    matched = matched_ci = share = share_ci = None
    s_r, s_ci = restore_S.S[pl][ph], restore_S.ci95[pl][ph]
    if carried is not None and s_r is not None:
        sign = 1.0 if carried == "row" else -1.0
        matched = sign * s_r
        matched_ci = None if s_ci is None else sorted([sign * s_ci[0], sign * s_ci[1]])
    score = rb.score[pl][ph]
    if rb.recovery > 0 and score is not None:
        share = score / rb.recovery
        share_ci = _share_interval(rb.score_samples.get(rb.primary), rb.recovery_samples)
    return PrimaryAxis(carried, matched, matched_ci, share, share_ci)
