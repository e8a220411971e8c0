"""The model surface: the one interface every experiment talks to.

A surface exposes the patch grid, prefix tokens, blocks and heads, the positional scheme, named
hook sites, and the rotary angles per axis and head. Adapters (timm_adapter.py for timm's
VisionTransformer and Eva, own.py for vitpos' own ViTs) implement it; experiments never touch a
model family's modules directly.

Site names (TransformerLens style), shapes for a batch of B images with T = prefix + H*W tokens:
  embed                    (B, T, D)    tokens right after the absolute embedding is added (editable)
  pos_embed                (1, H*W, D)  the APE table for patches (capture only)
  blocks.L.resid_pre       (B, T, D)    block input (editable)
  blocks.L.resid_mid       (B, T, D)    after the attention residual add (capture only)
  blocks.L.resid_post      (B, T, D)    block output (editable)
  blocks.L.attn_out        (B, T, D)    attention branch output before layer scale (editable)
  blocks.L.mlp_out         (B, T, D)    MLP branch output before layer scale (editable)
  blocks.L.q / .k          (B, h, T, d) per-head queries/keys before rotation (editable)
  blocks.L.q_rot / .k_rot  (B, h, T, d) after rotation; prefix tokens unrotated (capture only)
  blocks.L.attn_pattern    (B, h, T, T) softmax attention (editable; runs unfused attention)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from vitpos.errors import VitposError

LAYER_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "q_rot", "k_rot",
               "attn_pattern")
GLOBAL_SITES = ("embed", "pos_embed")
CAPTURE_ONLY = ("resid_mid", "q_rot", "k_rot", "pos_embed")
Scheme = Literal["ape", "rope", "rope+ape", "none"]
Axis = Literal["row", "col"]
AXES: tuple[Axis, Axis] = ("row", "col")

_SITE_RE = re.compile(r"^blocks\.(\d+)\.([a-z_]+)$")


@dataclass(frozen=True, order=True)
class Site:
    layer: int | None
    name: str

    def __str__(self) -> str:
        return self.name if self.layer is None else f"blocks.{self.layer}.{self.name}"

    @staticmethod
    def parse(text: str, depth: int | None = None) -> Site:
        text = text.strip()
        if text in GLOBAL_SITES:
            return Site(None, text)
        m = _SITE_RE.match(text)
        if not m or m.group(2) not in LAYER_SITES:
            raise VitposError(
                f"unknown hook site {text!r}; use blocks.L.<{'|'.join(LAYER_SITES)}> or one of "
                f"{', '.join(GLOBAL_SITES)}"
            )
        layer = int(m.group(1))
        if depth is not None and layer >= depth:
            raise VitposError(f"hook site {text!r} names layer {layer}, but the model has layers 0..{depth - 1}")
        return Site(layer, m.group(2))


def expand_sites(names: str | list[str], depth: int) -> list[Site]:
    """'resid_post' -> every layer's resid_post; 'blocks.3.q' -> that one; comma lists allowed."""
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    out: list[Site] = []
    for name in names:
        name = name.strip()
        if name in LAYER_SITES:
            out.extend(Site(i, name) for i in range(depth))
        else:
            out.append(Site.parse(name, depth))
    return out


@dataclass(frozen=True)
class RopeAxisMap:
    """Which rotary channels turn with which image axis, per layer and head.

    axial: `channel_axis[j]` is 'row', 'col' or 'none' for channel j of every head (timm's axial
    families share one map over layers and heads). mixed: every channel turns with both axes;
    `freqs[a, layer, head, pair]` is the angle step per grid unit along axis a (0 = row, 1 = col).
    """

    kind: Literal["axial", "mixed"]
    head_dim: int
    depth: int
    num_heads: int
    layout: Literal["interleaved", "half"]
    channel_axis: tuple[str, ...] | None = None
    freqs: torch.Tensor | None = None

    def channels(self, axis: Axis) -> list[int]:
        if self.channel_axis is None:
            raise VitposError("mixed RoPE has no per-axis channels: every channel turns with both axes")
        return [j for j, a in enumerate(self.channel_axis) if a == axis]

    def to_json(self) -> dict:
        doc: dict = {"kind": self.kind, "head_dim": self.head_dim, "layout": self.layout}
        if self.channel_axis is not None:
            doc["row_channels"] = self.channels("row")
            doc["col_channels"] = self.channels("col")
        return doc


class ModelSurface:
    """Base class; adapters fill in the attributes and the module lookups below."""

    spec: str
    model: nn.Module
    grid: tuple[int, int]
    num_prefix_tokens: int
    depth: int
    num_heads: int
    head_dim: int
    width: int
    num_classes: int
    scheme: Scheme
    input_size: tuple[int, int, int]  # (C, H, W)

    # --- what experiments use -------------------------------------------------------------
    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def has_rope(self) -> bool:
        return self.scheme in ("rope", "rope+ape")

    @property
    def has_ape(self) -> bool:
        return self.scheme in ("ape", "rope+ape")

    def patch_rows_cols(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = torch.arange(self.num_patches)
        return n // self.grid[1], n % self.grid[1]

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if tuple(images.shape[1:]) != tuple(self.input_size):
            raise VitposError(
                f"images of shape {tuple(images.shape[1:])} do not fit {self.spec}, which takes "
                f"{tuple(self.input_size)}; use the dataset the model was trained on or pass img_size"
            )
        return self.model(images)

    def weights_digest(self) -> str:
        """sha256 (16 hex) of every parameter and buffer: the model's content identity, so results
        cached under a spec are never reused after the weights behind that spec change (a retrained
        train dir, another checkpoint). Computed once per surface; experiments never edit weights."""
        if getattr(self, "_weights_digest", None) is None:
            h = hashlib.sha256()
            for name, t in sorted(self.model.state_dict().items()):
                t = t.detach().cpu().contiguous()
                h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            self._weights_digest = h.hexdigest()[:16]
        return self._weights_digest

    def describe(self) -> dict:
        return {
            "spec": self.spec, "family": type(self).__name__, "grid": list(self.grid),
            "num_prefix_tokens": self.num_prefix_tokens, "depth": self.depth, "num_heads": self.num_heads,
            "head_dim": self.head_dim, "width": self.width, "scheme": self.scheme,
            "rope": None if not self.has_rope else self.rope_axis_map().to_json(),
        }

    def patch_pos_embed(self) -> torch.Tensor:
        """(H*W, D) absolute embedding of the patches; VitposError for models without APE."""
        raise VitposError(f"{self.spec} has no absolute position embedding (scheme {self.scheme})")

    def rope_axis_map(self) -> RopeAxisMap:
        raise VitposError(f"{self.spec} has no rotary embedding (scheme {self.scheme})")

    def rope_embed(self, layer: int, base: torch.Tensor, remove: Mapping[Axis, list[int] | None]) -> torch.Tensor:
        """The rotary tensor for `layer` with axes removed for chosen heads.

        base: the tensor timm passes to the block (N, 2d) or (h, N, 2d). remove: axis -> heads
        (None = all heads). Returns (h, N, 2d)."""
        raise VitposError(f"{self.spec} has no rotary embedding (scheme {self.scheme})")

    # --- what the hook engine uses ------------------------------------------------------
    def block(self, layer: int) -> nn.Module:
        raise NotImplementedError

    def attention(self, layer: int) -> nn.Module:
        raise NotImplementedError

    def embed_module(self) -> nn.Module:
        """Module whose output is the `embed` site."""
        raise NotImplementedError

    def apply_rope(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
        """Rotate per-head q or k (B, h, T, d) exactly as the model does (prefix untouched)."""
        return x
