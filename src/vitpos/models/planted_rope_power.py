"""Planted RoPE models with power (issue 46): each planted-false case below passes every condition
of its claim's rule but one, so that condition alone decides it (METHODS.md, Power; the table's
`ValidationTable.power()` counts them). Built after rules version 4 was frozen (hash
bfb33fb5b1333858): held out, no rule was tuned on them.

They reuse the exact edits of `vitpos.models.planted_rope` (inert, one-axis, silent) on the same
tiny own RoPE ViT, on its near-constant images unless a case says otherwise. R = the last block.

The cases (claim, planted truth, the one condition that decides it):
  C3 false  row in rings (`mlp_removed`): C3-true's model on images whose patches carry their row
            in content a linear probe cannot read: a pattern of radius RING_AMP * (row + 1) at a
            random angle in a fixed 2D pixel plane (concentric rings, every ring centred on the
            same point). Removing the row rotations leaves the row in the content: linearly it is
            gone (no_row's linear row accuracy ~ the no_both floor's: removed ~ 100 % above the
            floor), but the MLP probe reads the ring's radius, so it finds the row kept
  C4 false  complete rebuild (`partial`): the one-axis rebuilders of C4-true written
            COMPLETE_SCALE / REBUILD_SCALE = 16 times as strongly: once restored they put back all
            the position the clean model has at the last layer, on both axes (the clean probes
            saturate, so the restored ones do too): the rebuilt share B = 1, not partial. The
            rebuilders are still one-axis heads (S = +-1 exactly) and each carries its axis'
            whole recovery (share ~ 50 % of the mean over the two axes)
  C4 false  redundant rebuilders (`head_share`): 4 heads per layer (head_dim 16); the last
            block's heads are two row-only and two col-only heads at REBUILD_SCALE: the rebuild
            is partial and specialised (S = +-1 exactly), but its row part is shared by two heads
            (and the col part by two others), so keeping one head's rotations off removes only the
            part of the rebuild that head writes, a small share of the mean recovery over both axes
"""

from __future__ import annotations

import torch

from vitpos.data.base import TensorImageDataset
from vitpos.models.planted_rope import GRID_PX, PATCH, REBUILD_SCALE, _eva, dataset, make_one_axis, planted_surface
from vitpos.models.spec import OwnSurface

COMPLETE_SCALE = 4.0  # the rebuilders' output scale of the complete rebuild (C4-true's: REBUILD_SCALE)
RING_AMP = 0.05  # pixel amplitude step of the rings: row r's ring has radius RING_AMP * (r + 1)
REDUNDANT_HEADS = 4  # heads per layer of the redundant rebuilders' model: two copies per axis in the last block


def c4_complete() -> OwnSurface:
    """C4-true's model with its one-axis rebuilders at COMPLETE_SCALE: a complete rebuild."""
    s = planted_surface("rope-axial", depth=3)
    last = s.depth - 1
    make_one_axis(s, last, 0, "row")
    make_one_axis(s, last, 1, "col")
    with torch.no_grad():
        _eva(s).blocks[last].attn.proj.weight.mul_(COMPLETE_SCALE)
    return s


def c4_redundant() -> OwnSurface:
    """REDUNDANT_HEADS heads per layer; in the last block the first half row-only, the second half
    col-only, all at REBUILD_SCALE: a partial, specialised rebuild that no one head carries."""
    s = planted_surface("rope-axial", depth=3, heads=REDUNDANT_HEADS)
    last = s.depth - 1
    for h in range(REDUNDANT_HEADS):
        make_one_axis(s, last, h, "row" if h < REDUNDANT_HEADS // 2 else "col")
    with torch.no_grad():
        _eva(s).blocks[last].attn.proj.weight.mul_(REBUILD_SCALE)
    return s


def ring_images(n: int, seed: int = 0, amp: float = RING_AMP, noise: float = 0.03) -> torch.Tensor:
    """uint8 images: one fixed pattern per patch (at mid grey, away from clamping) plus, per patch
    of row r, amp * (r + 1) * (cos t P1 + sin t P2) with t uniform per patch and image (P1, P2 two
    fixed orthogonal pixel patterns), plus a little noise. Each row's content is a ring around the
    same centre: its mean carries no row, its radius all of it."""
    side = GRID_PX // PATCH
    g0 = torch.Generator().manual_seed(0)  # the same patterns for every seed
    patch = torch.rand(3, PATCH, PATCH, generator=g0)
    p1, p2 = torch.randn(2, 3, PATCH, PATCH, generator=g0)
    p2 = p2 - (p2 * p1).sum() / (p1 * p1).sum() * p1
    p1, p2 = p1 / p1.abs().max(), p2 / p2.abs().max()
    g = torch.Generator().manual_seed(seed)
    t = 2 * torch.pi * torch.rand(n, side, side, generator=g)[..., None, None, None]  # (n, rows, cols, 1, 1, 1)
    radius = amp * torch.arange(1, side + 1, dtype=torch.float).view(1, side, 1, 1, 1, 1)
    ring = radius * (t.cos() * p1 + t.sin() * p2)  # (n, rows, cols, 3, P, P)
    ring = ring.permute(0, 3, 1, 4, 2, 5).reshape(n, 3, GRID_PX, GRID_PX)
    base = (0.3 + 0.4 * patch).repeat(1, side, side)
    x = (base + ring + noise * torch.rand(n, 3, GRID_PX, GRID_PX, generator=g)).clamp(0, 1)
    return (x * 255).to(torch.uint8)


def ring_data(s: OwnSurface) -> TensorImageDataset:
    return dataset(ring_images(240))
