"""Planted RoPE models with power (issue 46): each planted-false case below passes every condition
of its claim's rule but one, so that condition alone decides it (METHODS.md, Power; the table's
`ValidationTable.power()` counts them). Built after rules version 4 was frozen (hash
bfb33fb5b1333858): held out, no rule was tuned on them.

They reuse the exact edits of `vitpos.models.planted_rope` (inert, one-axis, silent) on the same
tiny own RoPE ViT, on its near-constant images unless a case says otherwise. R = the last block.

The cases (claim, planted truth, the one condition that decides it):
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

from vitpos.models.planted_rope import REBUILD_SCALE, _eva, make_one_axis, planted_surface
from vitpos.models.spec import OwnSurface

COMPLETE_SCALE = 4.0  # the rebuilders' output scale of the complete rebuild (C4-true's: REBUILD_SCALE)
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
