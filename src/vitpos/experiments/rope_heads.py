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

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar, cast

import torch
from pydantic import Field

from vitpos.analysis.forward import predict
from vitpos.analysis.probes import DEFAULT_L2_GRID, position_labels
from vitpos.analysis.stats import LEVEL, accuracy_interval, bootstrap_means, percentile_interval, scaled
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.experiments import rope_heads_section
from vitpos.experiments.base import Done, Experiment, Figure, Settings, SplitSizes, StageInput, StagePlan
from vitpos.experiments.checks import check_probe_images, images_of
from vitpos.experiments.common import (
    AXIS_SETS,
    SWEEP_TRAIN_TOKENS,
    ContextFactory,
    Start,
    advance,
    check_restore_points,
    condition_context,
    probe_condition,
    recovery,
    recovery_samples,
    require_rope,
    sample_interval,
    sweep_batch,
)
from vitpos.hooks import capture, edit, head_means, mean_ablate_heads, observe, remove_rope, rope_coordinates
from vitpos.models.surface import Axis, ModelSurface, Site
from vitpos.progress import progress_bar
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.rope_heads import SPECIALISED, C5Ablation, RopeHeadsResult
from vitpos.rope import CoordEdit, remove_axial_channels
from vitpos.runtime.device import trimmed

EPS = 1e-12
AXES = ("row", "col", "both")
T = TypeVar("T")


def _kl_rows(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) along the last axis (attention distributions)."""
    return (p * (torch.log(p + EPS) - torch.log(q + EPS))).sum(-1)


@torch.no_grad()
def axis_index(surface: ModelSurface, images: torch.Tensor,
               shared_prefix: bool = True) -> tuple[list[list[float]], dict]:
    """Behavioural axis specialisation of every head from attention patterns.

    shared_prefix: a head's axis removed in layer l changes nothing before l, so its pattern needs
    block l only, run from the clean resid_pre of l (computed once, block by block); False: a
    full forward per (layer, head, axis)."""
    npt = surface.num_prefix_tokens
    L, Hh = surface.depth, surface.num_heads
    with capture(surface, "attn_pattern") as c:
        surface(images)
    clean = {li: c[str(Site(li, "attn_pattern"))] for li in range(L)}
    A = {a: torch.zeros(L, Hh) for a in ("row", "col")}
    per_image = torch.zeros(len(images), L, Hh, 2, dtype=torch.float64)  # A_row, A_col of each image
    x = surface.embed_tokens(images) if shared_prefix else None
    for li in range(L):
        for h in range(Hh):
            for a in ("row", "col"):
                with remove_rope(surface, {a: [h]}, layers=[li]), capture(surface, [Site(li, "attn_pattern")]) as c2:
                    if x is None:
                        surface(images)
                    else:
                        surface.run_blocks(x, li, li + 1)
                p = clean[li][:, h, npt:]  # patch queries
                q = c2[str(Site(li, "attn_pattern"))][:, h, npt:]
                kl = _kl_rows(p, q)  # (images, patch queries)
                A[a][li, h] = kl.mean()
                per_image[:, li, h, ("row", "col").index(a)] = kl.double().mean(-1)
        if x is not None and li + 1 < L:
            x = surface.run_blocks(x, li, li + 1)  # the clean stream, fused attention as in the full forwards
    S = (A["row"] - A["col"]) / (A["row"] + A["col"] + EPS)
    return S.tolist(), {"kl_row": A["row"].tolist(), "kl_col": A["col"].tolist(),
                        "ci95": axis_index_intervals(per_image)}


NULL_SPLITS = 16  # random row/col relabellings of each head's rotary pairs for the |S| null
NULL_QUANTILE = 0.95  # |S| threshold: this quantile of the null |S| over heads and relabellings
NULL_SENSITIVITY = (0.5, 0.8, 0.9, 0.95, 0.99)  # quantiles reported: the threshold's sensitivity


@contextmanager
def _pairs_off(surface: ModelSurface, layer: int, head: int, pairs: list[int]) -> Iterator[None]:
    """Identity rotation on these rotary pairs of one head in one layer (every other channel kept)."""
    chans = surface.rope_axis_map().pair_channels(pairs)
    H = surface.num_heads

    def pre(m, args, kwargs):
        base = kwargs.get("rope")
        if base is None:
            return None
        out = (base if base.ndim == 3 else base.unsqueeze(0)).expand(H, *base.shape[-2:]).clone()
        out[head] = remove_axial_channels(out[head], chans)
        return args, {**kwargs, "rope": out}

    handle = surface.block(layer).register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def null_split(surface: ModelSurface, layer: int, head: int) -> tuple[list[int], int]:
    """A head's rotary pairs and how many a relabelled 'row' set holds: axial, its row and column
    pairs with as many in the first set as the row has; mixed (every pair turns with both axes),
    all pairs, half in each set."""
    amap = surface.rope_axis_map()
    if amap.kind == "mixed":
        n = amap.head_dim // 2
        return list(range(n)), n // 2
    rows = amap.axis_pairs("row", layer, head)[0]
    return rows + amap.axis_pairs("col", layer, head)[0], len(rows)


class RestoreAxisIndex(NamedTuple):
    S: list[list[float | None]]  # [layer][head], None for layers < R
    ci95: list[list[list[float] | None]]
    null: list[float]  # |S| of every head (layers >= R, some attention moved) under relabelled pairs
    threshold: float | None  # NULL_QUANTILE of `null`


@torch.no_grad()
def restore_axis_index(surface: ModelSurface, images: torch.Tensor, axes: tuple[Axis, ...], R: int,
                       n_null: int = NULL_SPLITS, seed: int = 0) -> RestoreAxisIndex:
    """S of every head of layers >= R measured where it rebuilds: on the restore condition's stream
    (`axes` removed in layers < R), A_a = mean KL(attention restored || attention with axis a also
    removed for this head only). Its null: the same S with the head's rotary pairs relabelled at
    random (`null_split`: a random set as large as the row's as 'row', the rest as 'col'), n_null
    relabellings per head; the threshold is the NULL_QUANTILE of |S| over every head and
    relabelling (heads whose attention no removal moves are left out: S is 0 / 0 there)."""
    npt, L, Hh = surface.num_prefix_tokens, surface.depth, surface.num_heads
    x = surface.embed_tokens(images)
    with condition_context(surface, axes, R)():
        x = surface.run_blocks(x, 0, R)
    S: list[list[float | None]] = [[None] * Hh for _ in range(L)]
    ci: list[list[list[float] | None]] = [[None] * Hh for _ in range(L)]
    null: list[float] = []
    g = torch.Generator().manual_seed(seed)

    def kl_of(li: int, p: torch.Tensor, h: int, context) -> torch.Tensor:
        with context, capture(surface, [Site(li, "attn_pattern")]) as c:
            surface.run_blocks(x, li, li + 1)
        return _kl_rows(p, c[str(Site(li, "attn_pattern"))][:, h, npt:]).double().mean(-1)  # (images,)

    for li in range(R, L):
        with capture(surface, [Site(li, "attn_pattern")]) as c:
            surface.run_blocks(x, li, li + 1)
        pattern = c[str(Site(li, "attn_pattern"))]
        per_image = torch.zeros(len(images), 1, Hh, 2, dtype=torch.float64)
        for h in range(Hh):
            p = pattern[:, h, npt:]
            for ai, a in enumerate(("row", "col")):
                per_image[:, 0, h, ai] = kl_of(li, p, h, remove_rope(surface, {a: [h]}, layers=[li]))
            a_row, a_col = per_image[:, 0, h].mean(0).tolist()
            S[li][h] = (a_row - a_col) / (a_row + a_col + EPS)
            pairs, n_first = null_split(surface, li, h)
            for _ in range(n_null):
                order = torch.randperm(len(pairs), generator=g).tolist()
                first, second = [pairs[i] for i in order[:n_first]], [pairs[i] for i in order[n_first:]]
                a1 = float(kl_of(li, p, h, _pairs_off(surface, li, h, first)).mean())
                a2 = float(kl_of(li, p, h, _pairs_off(surface, li, h, second)).mean())
                if a1 + a2 > EPS:
                    null.append(abs(a1 - a2) / (a1 + a2 + EPS))
        ci[li] = list(axis_index_intervals(per_image)[0])
        x = surface.run_blocks(x, li, li + 1)
    threshold = float(torch.quantile(torch.tensor(null, dtype=torch.float64), NULL_QUANTILE)) if null else None
    return RestoreAxisIndex(S, ci, null, threshold)


def selection_frequency(scores: Mapping[tuple[int, int], torch.Tensor | None]) -> dict[str, float] | None:
    """How often each head is the argmax over paired bootstrap samples of the heads' scores
    ({(layer, head): (n_boot,)}; the same image resamples for every head), as {"L<l>H<h>": share},
    heads never chosen left out; None without samples for every head."""
    if not scores or any(v is None for v in scores.values()):
        return None
    heads = list(scores)
    stacked = torch.stack([scores[k] for k in heads])  # type: ignore[misc]
    winners = stacked.nan_to_num(float("-inf")).argmax(0)
    counts = torch.bincount(winners, minlength=len(heads)).double() / stacked.shape[1]
    return {f"L{heads[i][0]}H{heads[i][1]}": float(c) for i, c in enumerate(counts) if c > 0}


def axis_index_intervals(per_image: torch.Tensor, level: float = LEVEL) -> list[list[list[float]]]:
    """Bootstrap interval of every head's S over the attention images: per image and head the
    mean KL over patch queries for each axis (images, L, H, 2); each resample of images gives
    A_row and A_col per head (one set of resamples for all heads) and so S."""
    n, L, H, _ = per_image.shape
    boot = bootstrap_means(per_image.reshape(n, -1)).reshape(-1, L * H, 2)
    a_row, a_col = boot.unbind(-1)
    cols = _column_intervals((a_row - a_col) / (a_row + a_col + EPS), level, factor=1.0)
    return _grid(cols, L, H)


def _ablate(surface: ModelSurface, layer: int, head: int):
    return remove_rope(surface, {"row": [head], "col": [head]}, layers=[layer])


class HeadDrops(NamedTuple):
    """Per-image top-1 correctness: intact (n,) and with each head's rotations removed (L, H, n).

    measured: (L, H) images per head, always the first ones (adaptive top-1: a head out of the race
    after the screen has only the screen's images; its other entries are meaningless); None: all n.
    screened: images in the adaptive top-1 screen (every head saw them); None: no screen ran."""

    clean: torch.Tensor
    ablated: torch.Tensor
    measured: torch.Tensor | None = None
    screened: int | None = None

    @property
    def base_top1(self) -> float:
        return float(self.clean.float().mean())

    def counts(self) -> list[list[int]]:
        L, H, n = self.ablated.shape
        return [[n] * H for _ in range(L)] if self.measured is None else self.measured.tolist()

    def drops(self) -> list[list[float]]:
        """100 x (top-1 intact - top-1 ablated) per [layer][head], on the images the head was measured on."""
        return [[100.0 * (float(self.clean[:m].float().mean()) - float(row[:m].float().mean()))
                 for row, m in zip(layer, ms, strict=True)]
                for layer, ms in zip(self.ablated, self.counts(), strict=True)]

    def _grouped(self, per_image: torch.Tensor, level: float) -> list[list[float] | None]:
        """Column intervals of a (n, L*H) per-image difference, each column over its head's first m
        images; one set of resamples per m (heads measured on the same images stay paired)."""
        flat_m = [m for ms in self.counts() for m in ms]
        out: list[list[float] | None] = [None] * len(flat_m)
        for m in sorted(set(flat_m)):
            cols = [i for i, mi in enumerate(flat_m) if mi == m]
            for i, iv in zip(cols, _column_intervals(bootstrap_means(per_image[:m, cols]), level), strict=True):
                out[i] = iv
        return out

    def drop_intervals(self, level: float = LEVEL) -> list[list[list[float]]]:
        """Paired bootstrap interval of each head's drop (points): one set of image resamples for
        every head (every head measured on as many images), each resample's drop recomputed on the
        same images intact and ablated."""
        L, H, n = self.ablated.shape
        per_image = (self.clean.double().unsqueeze(0) - self.ablated.double().reshape(L * H, n)).T  # (n, L*H)
        return _grid(self._grouped(per_image, level), L, H)

    def raced(self, cut: int, keep: Iterable[tuple[int, int]] = ()) -> HeadDrops:
        """What the adaptive race measures, from these exhaustive results: every head on the first `cut`
        images, the rest only for the heads `in_the_race` after them (with `keep`)."""
        L, H, n = self.ablated.shape
        if cut >= n:
            return self
        race = in_the_race(HeadDrops(self.clean[:cut], self.ablated[..., :cut]), keep)
        measured = torch.tensor([[n if (li, h) in race else cut for h in range(H)] for li in range(L)])
        return HeadDrops(self.clean, self.ablated, measured, cut)

    def margin_intervals(self, primary: tuple[int, int], level: float = LEVEL) -> list[list[list[float] | None]]:
        """Interval of drop(primary) - drop(head) per head (points; None at the primary): per
        image that is correct_ablated(head) - correct_ablated(primary), the intact run cancels; over
        the images both were measured on (the primary always stays in the race)."""
        L, H, n = self.ablated.shape
        flat = self.ablated.double().reshape(L * H, n)
        per_image = (flat - flat[primary[0] * H + primary[1]]).T  # (n, L*H)
        grid: list[list[list[float] | None]] = list(_grid(self._grouped(per_image, level), L, H))
        grid[primary[0]][primary[1]] = None
        return grid


def in_the_race(screen: HeadDrops, keep: Iterable[tuple[int, int]] = (), level: float = LEVEL) -> set[tuple[int, int]]:
    """Adaptive top-1: after the screen, the heads still worth the remaining images: the leader
    (largest drop), every head whose drop interval reaches the leader's lower end (it could still be
    the largest), and `keep` (the primary rebuilding head, whose margins C5 reads)."""
    drops, ivs = screen.drops(), screen.drop_intervals(level)
    L, H = len(drops), len(drops[0])
    lead = max((drops[li][h], li, h) for li in range(L) for h in range(H))
    floor = ivs[lead[1]][lead[2]][0]
    return {(li, h) for li in range(L) for h in range(H) if ivs[li][h][1] >= floor} | {(k[0], k[1]) for k in keep}


def _column_intervals(samples: torch.Tensor, level: float, factor: float = 100.0) -> list[list[float]]:
    out = []
    for col in samples.T:
        iv = scaled(percentile_interval(col, level), factor)
        assert iv is not None  # means of 0/1 values are finite
        out.append(iv)
    return out


def _grid(flat: list, L: int, H: int) -> list[list]:
    return [flat[li * H:(li + 1) * H] for li in range(L)]


@torch.no_grad()
def head_drops(surface: ModelSurface, dataset, shared_prefix: bool = True, batch_size: int | None = None,
               on_head: Callable[[int, int], None] | None = None, screen: int | None = None,
               keep: Iterable[tuple[int, int]] = ()) -> HeadDrops:
    """Per-image top-1 correctness intact and with all of a head's rotations removed, per head.

    shared_prefix: per batch, the clean stream is computed once, block by block, and each head of
    layer l runs blocks >= l from it; False: a full forward of the data per head.
    screen (adaptive top-1): every head on the first batches up to >= `screen` images, the rest only
    for the heads `in_the_race` (with `keep`); None: every head on every image. Both paths give the
    same numbers (the unshared one measures everything, then forgets what the race dropped)."""
    L, Hh = surface.depth, surface.num_heads
    batch_size = sweep_batch(surface, batch_size)
    if not shared_prefix:
        preds, labels = predict(surface, dataset, batch_size)
        ablated_rows = []
        for li in range(L):
            for h in range(Hh):
                p, y = predict(surface, dataset, batch_size, context=lambda li=li, h=h: _ablate(surface, li, h))
                ablated_rows.append(p == y)
                if on_head:
                    on_head(li, h)
        full = HeadDrops(preds == labels, torch.stack(ablated_rows).reshape(L, Hh, -1))
        return full.raced(screen_cut(len(labels), batch_size, screen), keep)
    surface.check_classifier(dataset.info)  # as predict: the drops are top-1
    dev = surface.device
    ablated: dict[tuple[int, int], list[torch.Tensor]] = {(li, h): [] for li in range(L) for h in range(Hh)}
    clean, labels = [], []
    cut = screen_cut(len(dataset), batch_size, screen)
    race: set[tuple[int, int]] | None = None  # None: every head runs
    seen = 0
    for x, y in trimmed(dataset.batches(batch_size)):  # 24+ forwards a batch: hand freed memory back
        if race is None and seen >= cut:
            y_seen = torch.cat(labels)
            race = in_the_race(HeadDrops(torch.cat(clean) == y_seen, torch.stack(
                [torch.cat(ablated[li, h]) == y_seen for li in range(L) for h in range(Hh)]).reshape(L, Hh, -1)), keep)
        t = surface.embed_tokens(x.to(dev, non_blocking=True))
        for li in range(L):
            for h in range(Hh):
                if race is not None and (li, h) not in race:
                    ablated[li, h].append(torch.zeros_like(y, dtype=torch.long) - 1)  # not measured: never correct
                    continue
                with _ablate(surface, li, h):
                    ablated[li, h].append(surface.forward_from(li, t).argmax(-1).cpu())
            t = surface.run_blocks(t, li, li + 1)
        clean.append(surface.head_from(t).argmax(-1).cpu())
        labels.append(y)
        seen += len(y)
    y_all = torch.cat(labels)
    rows = []
    for li in range(L):
        for h in range(Hh):
            rows.append(torch.cat(ablated[li, h]) == y_all)
            if on_head:
                on_head(li, h)
    measured = None if race is None else torch.tensor(
        [[len(y_all) if (li, h) in race else cut for h in range(Hh)] for li in range(L)])
    return HeadDrops(torch.cat(clean) == y_all, torch.stack(rows).reshape(L, Hh, -1), measured,
                     None if race is None else cut)


RACE_GUESS = 2  # heads the plan assumes stay in the adaptive top-1 race (the leader and the primary)


def screen_cut(n: int, batch_size: int, screen: int | None) -> int:
    """Images in the adaptive top-1 screen: whole batches, the first that reach `screen` (n: no screen,
    which `screen` None or 0 asks for)."""
    if not screen or screen >= n:
        return n
    return min(n, -(-max(1, screen) // batch_size) * batch_size)


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
    """The restore points of the R sweep besides R: `sweep` if given, else every valid R (1..L-1),
    or under --quick the next one (R + 1, else R - 1: the cheapest point, fewest heads after it)."""
    if sweep is None:
        sweep = ([R + 1] if R + 1 <= L - 1 else [R - 1]) if quick else list(range(1, L))
    return sorted({r for r in sweep if 1 <= r <= L - 1} - {R})


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
    """[layer][head] of `values` ({(layer, head): value}), None where a head has none."""
    return [[values.get((li, h)) for h in range(Hh)] for li in range(L)]


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
    probe_images: int = Field(default=500, ge=2)
    top1_images: int = Field(default=2000, ge=1)
    attn_images: int = Field(default=64, ge=1)
    # 500 (issue 33): on the zoo's seed-0 RoPE members the race names the same largest head and gives
    # C5 the same outcome as the exhaustive sweep for every head as primary (scripts/compare_top1_screen.py,
    # tests/unit/test_top1_screen_zoo.py), and saves most of the identity sweep's time.
    top1_screen_images: int | None = Field(
        default=500, ge=0, description="adaptive top-1: every head on this many images (whole batches), the rest "
        "only for the heads still in the race; 0 or None = every head on every image")
    sweep_restore: list[int] | None = Field(
        default=None, description="restore points R at which the primary rebuilding head is chosen again (issue 29); "
        "None = every valid R (1..depth-1) in a full run, restore_from + 1 under --quick")
    # 8, not every head: the five side ablations were 71 % of the stage's block evaluations on the zoo
    # (24 heads); the verdict rests on the identity sweep, which still covers every head.
    c5_ablation_heads: int | None = Field(
        default=8, ge=1, description="C5 under the counterfactual ablations (swap, shift, jitter, rescale, "
        "mean output) on the primary and this many top heads by the identity drop; None = every head")


class RopeHeadsExperiment(Experiment[RopeHeadsResult, RopeHeadsSettings]):
    name = "rope_heads"
    version = 2  # 2: issue 29 (c5_ablations: C5 under counterfactual ablations)
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


# --- C5 under counterfactual ablations (issue 29, item 4) -------------------------------------------------
# Removing a head's rotations (the identity rotation) puts every key at offset 0: off-distribution. The same
# ranking under other ablations of the head says whether C5's outcome is about the head's role or about that
# shock: its rotations recomputed from another patch's coordinates (swap), from coordinates shifted by half
# the grid (shift: a relative encoding cannot see it between patches, only against the unrotated prefix
# tokens; a near-null control), jittered per patch (jitter), rescaled as DINOv3's augmentation does
# (rescale), and its output replaced by its mean (mean_output). C5's verdict rests on 'identity'.

C5_RESTS_ON = "identity"
C5_ABLATIONS = ("identity", "swap", "shift", "jitter", "rescale", "mean_output")
C5_JITTER = 0.5  # patches (std, per patch and axis)
C5_RESCALE = 2.0  # DINOv3's rescale_coords default: coordinates x [1/2, 2]; here the far end, x 2


def c5_coord_edits(grid: tuple[int, int], seed: int = 0) -> dict[str, CoordEdit]:
    """The coordinate ablations of C5, on both axes of the head's rotations."""
    H, W = grid
    return {"swap": CoordEdit("swap", seed=seed), "shift": CoordEdit("shift", offset=(H / 2, W / 2)),
            "jitter": CoordEdit("jitter", sigma=C5_JITTER, seed=seed),
            "rescale": CoordEdit("rescale", factor=C5_RESCALE)}


def c5_heads(measured: HeadDrops, primary: tuple[int, int] | None, k: int | None) -> list[tuple[int, int]]:
    """The heads C5 is measured on under the other ablations: every head (k None), else the top k
    by the identity drop and the primary, in (layer, head) order."""
    L, H, _ = measured.ablated.shape
    if k is None:
        return [(li, h) for li in range(L) for h in range(H)]
    drops = measured.drops()
    top = sorted(((drops[li][h], li, h) for li in range(L) for h in range(H)), reverse=True)[:max(0, k)]
    return sorted({(li, h) for _, li, h in top} | ({primary} if primary else set()))


def c5_heads_rule(k: int | None) -> str:
    return ("every head" if k is None else
            f"the primary and the top {k} heads by the identity drop (the others not measured under the other "
            "ablations)")


def _c5_entry(description: str, heads: list[tuple[int, int]], clean: torch.Tensor, ablated: torch.Tensor,
              primary: tuple[int, int] | None, level: float = LEVEL) -> C5Ablation:
    """Drops, paired intervals and C5's margins over `heads` from per-image correctness: clean (n,),
    ablated (k, n) in the order of `heads`."""
    c, a = clean.double(), ablated.double()
    drop_iv = _column_intervals(bootstrap_means((c.unsqueeze(0) - a).T), level)
    drops = [100.0 * (float(c.mean()) - float(row.mean())) for row in a]
    # ties broken as run_rope_heads ranks (largest (drop, layer, head) first), so the identity entry's rank
    # is `primary_head_drop_rank`
    order = sorted(range(len(heads)), key=lambda i: (drops[i], heads[i]), reverse=True)
    p = None if primary is None else heads.index(primary)
    margins: list[list[float] | None] = [None] * len(heads)
    if p is not None:
        margins = [None if i == p else iv for i, iv in enumerate(
            _column_intervals(bootstrap_means((a - a[p]).T), level))]
    others = [iv for iv in margins if iv is not None]
    outcome: Literal["holds", "fails", "inconclusive"] = (
        "fails" if p is None or any(iv[1] < 0 for iv in others)
        else "holds" if all(iv[0] > 0 for iv in others) else "inconclusive")
    return C5Ablation(description=description, heads=[list(h) for h in heads], n_images=int(c.numel()),
                      drop_points=drops, drop_ci95=drop_iv, margin_ci95=margins,
                      primary_drop_rank=None if p is None else 1 + order.index(p),
                      largest_drop_head=list(heads[order[0]]), outcome=outcome)


@torch.no_grad()
def c5_under_ablations(surface: ModelSurface, dataset, measured: HeadDrops, primary: tuple[int, int] | None,
                       heads: list[tuple[int, int]], seed: int = 0, shared_prefix: bool = True,
                       batch_size: int | None = None) -> dict[str, C5Ablation]:
    """C5 under each ablation (C5_ABLATIONS): 'identity' from the identity sweep (`measured`, every
    head, today's numbers), the others measured on `heads` over all of `dataset`'s images (the
    same images as the sweep, paired). mean_output: the head's output at patch tokens replaced by
    its mean over these images (`hooks.head_means`, one clean pass).

    shared_prefix: per batch the clean stream is computed once, block by block (up to the last
    layer of `heads`), and each ablated head of layer l runs blocks >= l from it; False: a full
    forward per head and ablation."""
    L, Hh, n = measured.ablated.shape
    counts = measured.counts()
    # adaptive top-1: only the heads measured on every image (the race, with the primary) are paired here
    ident_heads = [(li, h) for li in range(L) for h in range(Hh) if counts[li][h] == n or (li, h) == primary]
    out: dict[str, C5Ablation] = {"identity": _c5_entry(
        "rotations removed (identity rotation: every key at offset 0)", ident_heads, measured.clean,
        torch.stack([measured.ablated[li, h] for li, h in ident_heads]), primary)}
    batch_size = sweep_batch(surface, batch_size)
    dev = next(surface.model.parameters()).device
    means = head_means(surface, (x for x, _ in dataset.batches(batch_size)), sorted({li for li, _ in heads}))
    edits = c5_coord_edits(surface.grid, seed) if coordinate_edits(surface) else {}

    def context(kind: str, li: int, h: int):
        if kind == "mean_output":
            return mean_ablate_heads(surface, {li: [h]}, means)
        return rope_coordinates(surface, edits[kind], layers=[li], heads=[h])

    kinds = [*edits, "mean_output"]
    rows: dict[tuple[str, int, int], list[torch.Tensor]] = {(k, li, h): [] for k in kinds for li, h in heads}
    labels = []
    if shared_prefix:
        last = max(li for li, _ in heads)
        for x, y in trimmed(dataset.batches(batch_size)):
            t = surface.embed_tokens(x.to(dev, non_blocking=True))
            for li in range(last + 1):
                for kind in kinds:
                    for lh in heads:
                        if lh[0] == li:
                            with context(kind, lh[0], lh[1]):
                                rows[kind, lh[0], lh[1]].append(surface.forward_from(li, t).argmax(-1).cpu())
                if li < last:
                    t = surface.run_blocks(t, li, li + 1)
            labels.append(y)
        y_all = torch.cat(labels)
        correct = {key: torch.cat(v) == y_all for key, v in rows.items()}
    else:
        correct = {}
        for kind in kinds:
            for li, h in heads:
                p, y_all = predict(surface, dataset, batch_size, context=lambda k=kind, li=li, h=h: context(k, li, h))
                correct[kind, li, h] = p == y_all
    clean = measured.clean
    descriptions = {k: f"rotations recomputed: {e.describe()}" for k, e in edits.items()}
    descriptions["mean_output"] = "output (patch tokens) replaced by its mean over the images"
    for kind in kinds:
        out[kind] = _c5_entry(descriptions[kind], heads, clean,
                              torch.stack([correct[kind, li, h] for li, h in heads]), primary)
    return out


def coordinate_edits(surface: ModelSurface) -> bool:
    """Whether the family recomputes its rotations from edited coordinates (timm RoPE families and
    vitpos' own); the others (Hugging Face DINOv3) get the mean-output ablation only."""
    try:
        surface.rope_coords()
    except VitposError:
        return False
    return True


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
