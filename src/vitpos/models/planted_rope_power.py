"""Planted RoPE models with power (issue 46): each planted-false case below passes every condition
of its claim's rule but one, so that condition alone decides it (METHODS.md, Power; the table's
`ValidationTable.power()` counts them); a planted-true case here holds only through one defence
(the restore-condition S, the content floor), so the pipeline mutation that switches it off flips it. Built after rules
version 4 was frozen (hash bfb33fb5b1333858): held out, no rule was tuned on them.

They reuse the exact edits of `vitpos.models.planted_rope` (inert, one-axis, silent) on the same
tiny own RoPE ViT, on its near-constant images unless a case says otherwise. R = the last block.

The cases (claim, planted truth, the one condition that decides it):
  C3 false  entangled axes (`kept`): depth 2, block 1 silent; in block 0 head 0 is row-only and
            head 1 a gate: its keys are 0 on every patch and k_c on the class token (the key
            weights read a direction of the class token's normalised state orthogonal to every
            patch's), its query a constant q (no query weights), so its only score is the class
            token's, s(p) = G(row) + H(col) = (rotated q) . k_c, and its attention to the class
            token sigmoid(s(p) - ln 16) is its whole output's dependence on position. q is solved
            (least squares, exact to 1e-5) so that H spreads the columns over the sigmoid's slope
            and G = 0 on rows 1-3 but GATE_SCORE on row 0, whose rotation is the identity: there
            the class token takes all the attention (1 - ~e^-37, 1 in float32) and the head writes
            one vector whatever the column. Removing the row rotations makes every patch look like
            row 0 to the row channels: the gate shuts everywhere, so the columns go with the rows
            (no_row keeps ~0 of col above the floor), while removing the column rotations leaves
            the row-only head, so the rows stay (no_col keeps ~100 % of row)
  C3 false  interacting axes (`not_interacting`, rules version 5): the entangled case's gate
            inverted: G = 0 on rows 0-1 and GATE_SCORE on rows 2-3 (and 0 on every patch once the row
            rotations are removed: each then looks like row 0). The clean gate reads the columns on
            the top half only; removing the row rotations opens it everywhere, so the columns become
            decodable on every row: no_row keeps several times col's own decodability above the floor
            (an interaction, kept above C3.max_kept), while the removals stay near 100 % and no_col
            keeps ~100 % of row
  C3 false  row in rings (`mlp_removed`): C3-true's model on images whose patches carry their row
            in content a linear probe cannot read: a pattern of radius RING_AMP * (row + 1) at a
            random angle in a fixed 2D pixel plane (concentric rings, every ring centred on the
            same point). Removing the row rotations leaves the row in the content: linearly it is
            gone (no_row's linear row accuracy ~ the no_both floor's: removed ~ 100 % above the
            floor), but the MLP probe reads the ring's radius, so it finds the row kept
  C3 true   column in content (the content floor; rules version 5, built for the mutation "C3
            floor at chance", so a design case): depth 2, block 0 silent, block 1 C3-true's
            one-axis heads (head 0 row-only, head 1 col-only), on images whose patches carry their
            column weakly in content: a fixed pixel pattern times COL_AMP * (col - 1.5) plus
            COL_SPREAD times a standard normal per patch and image (a noisy linear code: a linear
            probe reads the column at ~0.42 against chance 0.25, content alone). Layer 0 is the
            embedding under every condition (block 0 is the identity), so there the baseline, no_col
            and the no_both floor decode the column alike from content: above its floor the layer
            has nothing of the rotations' and drops out, and the removed fraction reads layer 1,
            where the rotations add the rest (~1.0) and removing them leaves the content's ~0.4:
            ~100 % removed above the floor. Against chance layer 0 enters with 0 removed (content
            the rotations never carried), so the fraction is at most half: only the floor tells
            content from position that survives the removal. The MLP read-out (last layer only,
            against chance) finds ~90 % removed: the code is weak enough for it
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
  C4 false  weakly biased rebuilders (`specialised`, against the null threshold): C4-true's
            rebuilders, but each keeps its other axis' query and key channels, rescaled by
            WEAK_SCALES (row head, col head; the random init's row head already leans to the row,
            so its col channels are doubled) instead of zeroed: both read both axes and favour
            their own, so the primary's restore-condition S is ~0.63 (the col head's ~-0.71),
            above the round 0.5 but below the null threshold (~0.82: the relabelled-pair |S| of
            heads that read both axes); the rebuild is still partial and the primary carries
            enough of it
  C4 true   specialised only where it rebuilds (the restore-condition S): C4-true's rebuilders,
            but the row head's col query and key channels read the stream's deviation from the
            state it has in the restore condition (its original weights times HIDDEN_SCALE, bias
            minus those weights times the restore condition's mean normalised patch state). Where
            it rebuilds (rotations off before R: every patch near that state) they are ~0 and the
            head is row-only (S ~ 1 > the null threshold); in the clean run the stream carries the
            position layers 0-1 wrote, so they are large and its clean-attention S is ~0.6
"""

from __future__ import annotations

import math

import torch
from timm.layers.pos_embed_sincos import apply_rot_embed_cat

from vitpos.data.base import TensorImageDataset, to_float
from vitpos.hooks import remove_rope
from vitpos.models.planted_rope import (
    GRID_PX,
    PATCH,
    REBUILD_SCALE,
    _eva,
    _qk_rows,
    dataset,
    flat_images,
    make_one_axis,
    make_silent,
    planted_surface,
)
from vitpos.models.spec import OwnSurface

COMPLETE_SCALE = 4.0  # the rebuilders' output scale of the complete rebuild (C4-true's: REBUILD_SCALE)
GATE_SCORE = 40.0  # the gate head's class-token score where the row rotation is the identity (row 0)
GATE_SPREAD = 2.0  # the step of its class-token score from one column to the next
RING_AMP = 0.05  # pixel amplitude step of the rings: row r's ring has radius RING_AMP * (r + 1)
# column in content: the pixel step of the column code and the spread of its per-patch noise (a linear
# probe reads the column at ~0.42 from content alone: well above chance + MIN_ABOVE_CHANCE, weak for the MLP)
COL_AMP, COL_SPREAD = 0.015, 0.025
# the weakly biased rebuilders' other-axis query / key scale (row head, col head): chosen so that both
# restore-condition S lie inside (0.5, null threshold), S ~ 0.63 and -0.71 against a threshold ~0.82
WEAK_SCALES = (2.0, 0.55)
HIDDEN_SCALE = 3.0  # the hidden col channels' weight scale: clean-attention S ~0.6, restore-condition S ~0.998
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


@torch.no_grad()
def make_biased(surface: OwnSurface, layer: int, head: int, axis: str, scale: float) -> None:
    """The other axis' query and key channels of this head scaled by `scale` (0: `make_one_axis`,
    1: unchanged): its scores turn with both axes, the other one's part rescaled."""
    other = "col" if axis == "row" else "row"
    qkv = _eva(surface).blocks[layer].attn.qkv
    rows = _qk_rows(surface, head, surface.rope_axis_map().channels(other))  # type: ignore[arg-type]
    qkv.weight[rows] *= scale
    qkv.bias[rows] *= scale


def c4_weak() -> OwnSurface:
    """C4-true's model with rebuilders that keep a WEAK_SCALES share of their other axis' channels."""
    s = planted_surface("rope-axial", depth=3)
    last = s.depth - 1
    make_biased(s, last, 0, "row", WEAK_SCALES[0])
    make_biased(s, last, 1, "col", WEAK_SCALES[1])
    with torch.no_grad():
        _eva(s).blocks[last].attn.proj.weight.mul_(REBUILD_SCALE)
    return s


@torch.no_grad()
def make_hidden_axis(surface: OwnSurface, layer: int, head: int, axis: str, scale: float = HIDDEN_SCALE) -> None:
    """The other axis' query and key channels of this (unedited) head read only the stream's
    deviation from its restore-condition state: weights times `scale`, bias minus them times the
    mean normalised patch state entering `layer` with every rotation off before it (near-constant
    images: every patch is near that mean there, so these channels are ~0 where the head rebuilds)."""
    m = _eva(surface)
    x = to_float(flat_images(64))
    with remove_rope(surface, {"row": None, "col": None}, layers=range(layer)):
        state = m.blocks[layer].norm1(surface.run_blocks(surface.embed_tokens(x), 0, layer))
    mean = state[:, surface.num_prefix_tokens:].reshape(-1, surface.width).mean(0)
    other = "col" if axis == "row" else "row"
    qkv = m.blocks[layer].attn.qkv
    rows = _qk_rows(surface, head, surface.rope_axis_map().channels(other))  # type: ignore[arg-type]
    qkv.weight[rows] *= scale
    qkv.bias[rows] = -qkv.weight[rows] @ mean


def c4_hidden() -> OwnSurface:
    """C4-true's model whose row rebuilder reads the columns only through `make_hidden_axis`."""
    s = planted_surface("rope-axial", depth=3)
    last = s.depth - 1
    make_hidden_axis(s, last, 0, "row")
    make_one_axis(s, last, 1, "col")
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


def _scores(surface: OwnSurface, rope: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """(N, d): the attention score (SDPA's scale 1 / sqrt(d)) of each patch's query against an
    unrotated `key` when the query is the j-th unit vector, under rotary tensor `rope` (N, 2d):
    the score of any constant query q is this @ q."""
    d = surface.head_dim
    eye = torch.eye(d)
    return torch.stack([apply_rot_embed_cat(eye[j].expand(rope.shape[0], d), rope) @ key for j in range(d)], 1) \
        * d ** -0.5


@torch.no_grad()
def make_gate(surface: OwnSurface, layer: int, head: int, shut_on: str = "identity") -> None:
    """Head `head` of block `layer` (block 0: it reads the embedding) attends only to the class
    token, with score G(row) + H(col): G = GATE_SCORE where the row rotation is the identity (row 0,
    and every patch once the row rotations are removed), 0 on the other rows; H(col) steps by
    GATE_SPREAD around ln(patches), so that the gate's attention to the class token varies with the
    column except where G shuts it. shut_on="rotated": the gate inverted, G = 0 (open) on the top half of
    the rows, row 0 among them, and GATE_SCORE (shut) on the bottom half; once the row rotations are
    removed every patch looks like row 0 to the row channels, so the gate opens everywhere."""
    m = _eva(surface)
    d, D = surface.head_dim, surface.width
    rope = m.rope.get_embed()  # (N, 2d): every head's rotary tensor (axial RoPE: one for all)
    off = surface.rope_embed(layer, rope, {"row": None})
    off = off[head] if off.dim() == 3 else off
    amap = surface.rope_axis_map()
    rows, cols = amap.channels("row"), amap.channels("col")  # type: ignore[arg-type]
    key = torch.ones(d)
    clean, removed = _scores(surface, rope, key), _scores(surface, off, key)
    H, W = surface.grid
    col = torch.arange(H * W) % W
    shut = (rope - off).abs().amax(1) < 1e-6  # the patches whose row rotation is the identity
    a = torch.cat([clean[:, rows], removed[:1, rows]]).double()
    if shut_on not in ("identity", "rotated"):
        raise ValueError(f"shut_on must be 'identity' or 'rotated', not {shut_on!r}")
    # inverted: open on the top half of the rows (row 0, whose rotation is the identity, among them), shut below
    closed = shut if shut_on == "identity" else torch.arange(H * W) // W >= H // 2
    removed_g = GATE_SCORE if shut_on == "identity" else 0.0  # with the rows removed every patch is row 0
    g = torch.cat([torch.where(closed, GATE_SCORE, 0.0), torch.tensor([removed_g])]).double()
    h = (math.log(H * W) + GATE_SPREAD * (col - (W - 1) / 2)).double()
    q = torch.zeros(d)
    q[rows] = torch.linalg.lstsq(a, g.unsqueeze(1)).solution.squeeze(1).float()
    q[cols] = torch.linalg.lstsq(clean[:, cols].double(), h.unsqueeze(1)).solution.squeeze(1).float()
    # the key weights read a direction w of the normalised state with w . cls = 1 and w . patch = 0
    # for every patch of the planted images (w orthogonal to the span of their states)
    norm = m.blocks[layer].norm1
    patches = norm(m.patch_embed(flat_images(64).float() / 255)).reshape(-1, D).double()
    cls = norm(m.cls_token.reshape(1, D))[0].double()
    u, sv, _ = torch.linalg.svd(patches.T, full_matrices=False)
    u = u[:, sv > sv[0] * 1e-4]
    w = cls - u @ (u.T @ cls)
    w = (w / (w @ cls)).float()
    qkv = m.blocks[layer].attn.qkv
    qs, ks = slice(head * d, (head + 1) * d), slice(D + head * d, D + (head + 1) * d)
    qkv.weight[qs] = 0
    qkv.bias[qs] = q
    qkv.weight[ks] = torch.outer(key, w)
    qkv.bias[ks] = 0


def c3_interacting() -> OwnSurface:
    """Block 0: a row-only head and the inverted gate (open only where the row rotation is the identity)."""
    s = planted_surface("rope-axial", depth=2)
    make_one_axis(s, 0, 0, "row")
    make_gate(s, 0, 1, shut_on="rotated")
    make_silent(s, 1)
    return s


def c3_entangled() -> OwnSurface:
    """Block 0: a row-only head and the gate (`make_gate`); block 1 silent."""
    s = planted_surface("rope-axial", depth=2)
    make_one_axis(s, 0, 0, "row")
    make_gate(s, 0, 1)
    make_silent(s, 1)
    return s


def col_content_images(n: int, seed: int = 0, amp: float = COL_AMP, spread: float = COL_SPREAD,
                       noise: float = 0.03) -> torch.Tensor:
    """uint8 images: one fixed pattern per patch (at mid grey) plus, per patch of column c,
    (amp * (c - 1.5) + spread * z) P with z standard normal per patch and image (P a fixed pixel
    pattern), plus a little noise: the column in content, linear and noisy."""
    side = GRID_PX // PATCH
    g0 = torch.Generator().manual_seed(0)  # the same patterns for every seed
    patch = torch.rand(3, PATCH, PATCH, generator=g0)
    p = torch.randn(3, PATCH, PATCH, generator=g0)
    p = p / p.abs().max()
    g = torch.Generator().manual_seed(seed)
    col = torch.arange(side, dtype=torch.float).view(1, 1, side, 1, 1, 1) - (side - 1) / 2
    z = torch.randn(n, side, side, generator=g)[..., None, None, None]
    code = ((amp * col + spread * z) * p).permute(0, 3, 1, 4, 2, 5).reshape(n, 3, GRID_PX, GRID_PX)
    base = (0.3 + 0.4 * patch).repeat(1, side, side)
    x = (base + code + noise * torch.rand(n, 3, GRID_PX, GRID_PX, generator=g)).clamp(0, 1)
    return (x * 255).to(torch.uint8)


def col_content_data(s: OwnSurface) -> TensorImageDataset:
    return dataset(col_content_images(240))


def c3_late_axes() -> OwnSurface:
    """Block 0 silent (layer 0 is the embedding under every condition); block 1 a row-only and a
    col-only head (C3-true's)."""
    s = planted_surface("rope-axial", depth=2)
    make_silent(s, 0)
    make_one_axis(s, 1, 0, "row")
    make_one_axis(s, 1, 1, "col")
    return s
