"""Rotary tensors rebuilt with an axis coordinate removed (pure functions on timm's layouts; what
needs timm's own mixed-RoPE code lives in `vitpos.models.timm_adapter`).

timm hands each attention block `rope` = cat([sin, cos], -1) with shape (..., N, 2d) for the N
patch tokens. Removing an axis sets that axis' coordinate to 0 in q and k alike: for axial RoPE
its channels get angle 0 (sin = 0, cos = 1, the identity); for mixed RoPE the angle
c*f_col + r*f_row loses its row (or col) term and is recomputed with timm's own get_mixed_freqs.
"""

from __future__ import annotations

import torch

from vitpos.errors import VitposError


def axial_channel_axis(emb: torch.Tensor, grid: tuple[int, int], atol: float = 1e-6) -> tuple[str, ...]:
    """Read which axis each channel turns with from an axial rotary tensor (N, 2d).

    A channel is 'row' if its sin/cos change between grid rows and never between columns, 'col'
    mirrored, 'none' if constant (a zero frequency). Both -> the tensor is not axial."""
    H, W = grid
    if emb.ndim != 2 or emb.shape[0] != H * W:
        raise VitposError(f"expected an axial rotary tensor (H*W={H * W}, 2d), got {tuple(emb.shape)}")
    if H < 2 or W < 2:
        raise VitposError(f"a {H}x{W} grid is too small to tell row from column channels")
    d = emb.shape[1] // 2
    e = emb.float().reshape(H, W, 2, d)
    varies_rows = (e - e[:1]).abs().amax(dim=(0, 1, 2)) > atol  # (d,)
    varies_cols = (e - e[:, :1]).abs().amax(dim=(0, 1, 2)) > atol
    axes = []
    for r, c in zip(varies_rows.tolist(), varies_cols.tolist(), strict=True):
        if r and c:
            raise VitposError("rotary tensor mixes both axes in one channel: this is not axial RoPE")
        axes.append("row" if r else "col" if c else "none")
    return tuple(axes)


def remove_axial_channels(emb: torch.Tensor, channels: list[int]) -> torch.Tensor:
    """Identity rotation on `channels`: sin -> 0, cos -> 1 (emb (..., N, 2d), returns a copy)."""
    d = emb.shape[-1] // 2
    out = emb.clone()
    idx = torch.as_tensor(channels, dtype=torch.long, device=emb.device)
    out[..., idx] = 0.0
    out[..., d + idx] = 1.0
    return out


# --- channel frequencies and frequency bands ------------------------------------------------------
# A channel pair's frequency along an axis is its angle step per grid unit. On an integer grid a
# step f and f + 2*pi rotate alike, and f and -f are equally sharp, so the effective frequency is
# |f| folded into [0, pi]: what attention on this grid can tell apart.

def fold_frequency(f: torch.Tensor) -> torch.Tensor:
    """|f| wrapped into [0, pi] (radians per grid unit): the frequency the grid sees."""
    f = f.double()
    return torch.remainder(f + torch.pi, 2 * torch.pi).sub(torch.pi).abs()


def axial_channel_freqs(emb: torch.Tensor, grid: tuple[int, int], channel_axis: tuple[str, ...]) -> tuple[float, ...]:
    """Effective frequency of each channel of an axial rotary tensor (N, 2d) along its own axis
    (0 for 'none' channels), read off the tensor: the angle between neighbouring grid cells,
    averaged over the grid (timm's coordinates are affine in the index, so every step is the same)."""
    H, W = grid
    d = emb.shape[1] // 2
    e = emb.double().reshape(H, W, 2, d)
    z = torch.complex(e[:, :, 1], e[:, :, 0])  # cos + i sin, (H, W, d)
    step_row = (z[1:] * z[:-1].conj()).sum((0, 1)).angle().abs()
    step_col = (z[:, 1:] * z[:, :-1].conj()).sum((0, 1)).angle().abs()
    return tuple(float(step_row[j]) if a == "row" else float(step_col[j]) if a == "col" else 0.0
                 for j, a in enumerate(channel_axis))


def pair_of_channel(head_dim: int, layout: str) -> list[int]:
    """Rotary pair of each channel: interleaved pairs (2p, 2p+1), 'half' pairs (p, p + d/2)."""
    half = head_dim // 2
    return [j // 2 if layout == "interleaved" else j % half for j in range(head_dim)]


def band_members(freqs: torch.Tensor, index: int, count: int) -> list[int]:
    """Positions in `freqs` of band `index` of `count` equal-rank bands, 0 = lowest: ranked by
    frequency (ties by position), band b holds ranks [b*n//count, (b+1)*n//count)."""
    n = int(freqs.numel())
    order = sorted(range(n), key=lambda i: (float(freqs[i]), i))
    return sorted(order[index * n // count:(index + 1) * n // count])
