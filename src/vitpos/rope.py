"""Rotary tensors rebuilt with an axis coordinate removed (pure functions on timm's layouts; what
needs timm's own mixed-RoPE code lives in `vitpos.models.timm_adapter`).

timm hands each attention block `rope` = cat([sin, cos], -1) with shape (..., N, 2d) for the N
patch tokens. Removing an axis sets that axis' coordinate to 0 in q and k alike: for axial RoPE
its channels get angle 0 (sin = 0, cos = 1, the identity); for mixed RoPE the angle
c*f_col + r*f_row loses its row (or col) term and is recomputed with timm's own get_mixed_freqs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

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


# --- rotations recomputed from coordinates: counterfactual coordinate edits --------------------------
# Every timm RoPE family turns a patch's coordinates (its own units: index, pixel [-1, 1], DINOv3's
# centred [-1, 1], EVA's reference-rescaled grid) into angles that are LINEAR in the coordinates:
# axial `cat` angle = coord * band, DINOv3 angle = 2 pi coord / period, mixed angle = t_x f_x + t_y f_y.
# The families' adapters (`ModelSurface.rope_coords` / `rope_from_coords`) recompute the rotary
# tensor from any coordinates with the family's own arithmetic; an edit is new coordinates.

Layout = Literal["interleaved", "half"]
CoordKind = Literal["none", "zero", "swap", "shift", "jitter", "rescale"]
COORD_KINDS: tuple[str, ...] = ("none", "zero", "swap", "shift", "jitter", "rescale")


def rope_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Per-pair values (..., d/2) spread over the d channels: interleaved [f0, f0, f1, f1, ...],
    'half' [f0, f1, ..., f0, f1, ...] (what apply_rot_embed(half=...) expects; data movement only)."""
    if layout == "half":
        return torch.cat([x, x], dim=-1)
    if layout == "interleaved":
        return x.repeat_interleave(2, -1)
    raise VitposError(f"unknown rotary layout {layout!r}; use interleaved or half")


def rotary_from_angles(angles: torch.Tensor, layout: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """cat([sin, cos], -1) in `layout` from per-pair angles (..., N, d/2): timm's rotary tensor."""
    sin, cos = angles.sin(), angles.cos()
    if dtype is not None:
        sin, cos = sin.to(dtype), cos.to(dtype)
    return torch.cat([rope_layout(sin, layout), rope_layout(cos, layout)], dim=-1)


@dataclass(frozen=True)
class RopeCoords:
    """A model's own rotary coordinates: `coords` (N, 2), patches in row-major order, columns in the
    family's own order and units; `row_channel` is the column holding the row coordinate; `step` the
    family's units per patch along (row, col) (what a shift or jitter of one patch adds)."""

    coords: torch.Tensor
    row_channel: int
    step: tuple[float, float]

    def channel(self, axis: str) -> int:
        if axis not in ("row", "col"):
            raise VitposError(f"unknown axis {axis!r}; use row or col")
        return self.row_channel if axis == "row" else 1 - self.row_channel

    @staticmethod
    def read(coords: torch.Tensor, grid: tuple[int, int]) -> RopeCoords:
        """Which column of a (H*W, 2) coordinate grid is the row, and the per-patch step of each axis."""
        H, W = grid
        if coords.shape != (H * W, 2):
            raise VitposError(f"rotary coordinates of shape {tuple(coords.shape)} do not fit a {H}x{W} grid")
        c = coords.double().reshape(H, W, 2)
        # the row coordinate is constant along each row of the grid (any H, W >= 1)
        const_in_rows = [bool((c[:, :, i] - c[:, :1, i]).abs().max() == 0) for i in range(2)]
        const_in_cols = [bool((c[:, :, i] - c[:1, :, i]).abs().max() == 0) for i in range(2)]
        rows = [i for i in range(2) if const_in_rows[i] and (H == 1 or not const_in_cols[i])]
        if len(rows) != 1 or (W > 1 and not const_in_cols[1 - rows[0]]):
            raise VitposError("cannot tell the row coordinate of this model's rotary grid")
        r = rows[0]
        step_r = float((c[-1, 0, r] - c[0, 0, r]) / (H - 1)) if H > 1 else 1.0
        step_c = float((c[0, -1, 1 - r] - c[0, 0, 1 - r]) / (W - 1)) if W > 1 else 1.0
        return RopeCoords(coords, r, (step_r, step_c))


@dataclass(frozen=True)
class CoordEdit:
    """New rotary coordinates for the patches (prefix tokens are never rotated), applied to `axes`:

    none     the model's own coordinates (a no-op: recomputed, bit-identical to the model's tensor)
    zero     coordinate 0: the identity rotation on those axes (what `remove_rope` does)
    swap     patch i takes the coordinates of patch perm[i] (`perm`; None: a random permutation
             drawn with `seed`): every key sits at another patch's position
    shift    every coordinate + `offset` patches (row, col): a relative encoding cannot see it
             between patches (only against the unrotated prefix tokens)
    jitter   every coordinate + `sigma` patches x N(0, 1), drawn per patch and axis with `seed`
    rescale  every coordinate x `factor` about the family's origin (DINOv3's rescale augmentation;
             offsets between patches scale by `factor`)
    """

    kind: CoordKind = "none"
    axes: tuple[str, ...] = ("row", "col")
    offset: tuple[float, float] = (0.0, 0.0)
    sigma: float = 0.0
    factor: float = 1.0
    perm: tuple[int, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in COORD_KINDS:
            raise VitposError(f"unknown coordinate edit {self.kind!r}; use one of {', '.join(COORD_KINDS)}")
        bad = [a for a in self.axes if a not in ("row", "col")]
        if bad or not self.axes:
            raise VitposError(f"coordinate edit axes {self.axes!r}: use row and/or col")
        if not (math.isfinite(self.sigma) and self.sigma >= 0 and math.isfinite(self.factor)
                and all(math.isfinite(o) for o in self.offset)):
            raise VitposError("coordinate edit: offset, factor must be finite and sigma >= 0")

    def describe(self) -> str:
        on = "/".join(self.axes)
        return {"none": "own coordinates", "zero": f"identity rotation ({on})",
                "swap": f"coordinates of a permuted patch ({on}, seed {self.seed})" if self.perm is None
                else f"coordinates of patch perm[i] ({on})",
                "shift": f"shifted by {self.offset[0]:g}, {self.offset[1]:g} patches (row, col)",
                "jitter": f"jittered by {self.sigma:g} patch (std, per patch, seed {self.seed})",
                "rescale": f"rescaled x{self.factor:g} ({on})"}[self.kind]

    def apply(self, own: RopeCoords) -> torch.Tensor:
        """The edited (N, 2) coordinates (the model's own tensor itself for 'none')."""
        c = own.coords
        if self.kind == "none":
            return c
        n = c.shape[0]
        out = c.clone()
        g = torch.Generator().manual_seed(self.seed)
        for i, axis in enumerate(("row", "col")):
            if axis not in self.axes:
                continue
            ch = own.channel(axis)
            step = own.step[i]
            if self.kind == "zero":
                out[:, ch] = 0
            elif self.kind == "swap":
                perm = (torch.randperm(n, generator=g) if self.perm is None
                        else torch.as_tensor(self.perm, dtype=torch.long))
                if sorted(perm.tolist()) != list(range(n)):
                    raise VitposError(f"swap: perm must be a permutation of the {n} patches")
                out[:, ch] = c[perm.to(c.device), ch]
                g = torch.Generator().manual_seed(self.seed)  # the same permutation for both axes
            elif self.kind == "shift":
                out[:, ch] = c[:, ch] + self.offset[i] * step
            elif self.kind == "jitter":
                noise = torch.randn(n, generator=g, dtype=torch.float64) * (self.sigma * step)
                out[:, ch] = (c[:, ch].double() + noise.to(c.device)).to(c.dtype)
            else:  # rescale
                out[:, ch] = c[:, ch] * self.factor
        return out
