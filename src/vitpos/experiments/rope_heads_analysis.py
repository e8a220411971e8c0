"""rope_heads' attention analysis (C4): each head's axis index S from attention patterns, S where
it rebuilds (the restore condition) with its null from relabelled rotary pairs, bootstrap intervals,
and how often a head would be chosen again (`selection_frequency`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import NamedTuple

import torch

from vitpos.analysis.stats import LEVEL, bootstrap_means, percentile_interval, scaled
from vitpos.experiments.common import condition_context
from vitpos.hooks import capture, remove_rope
from vitpos.models.surface import Axis, ModelSurface, Site
from vitpos.rope import remove_axial_channels

EPS = 1e-12


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


def _column_intervals(samples: torch.Tensor, level: float, factor: float = 100.0) -> list[list[float]]:
    out = []
    for col in samples.T:
        iv = scaled(percentile_interval(col, level), factor)
        assert iv is not None  # means of 0/1 values are finite
        out.append(iv)
    return out


def _grid(flat: list, L: int, H: int) -> list[list]:
    return [flat[li * H:(li + 1) * H] for li in range(L)]
