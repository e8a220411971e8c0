"""timm's VisionTransformer and Eva (RoPE ViT axial/mixed, EVA-02, DINOv3) behind the model surface.

Both families share timm's block layout (norm1 -> attn -> residual, norm2 -> mlp -> residual;
attn.q_norm / attn.k_norm applied to per-head q, k before rotation; attn.attn_drop applied to the
softmax pattern when attention is unfused), which is what the hook sites attach to
(`hook_point`, the `vitpos.models.adapter.FamilyAdapter` protocol).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import timm
import torch
from timm.data.config import resolve_data_config
from timm.data.transforms_factory import create_transform
from timm.layers.pos_embed_sincos import (
    RotaryEmbeddingCat,
    RotaryEmbeddingDinoV3,
    RotaryEmbeddingMixed,
    _build_grid,
    apply_rot_embed_cat,
    get_mixed_freqs,
    get_mixed_grid,
)
from timm.models.eva import Eva
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from vitpos.errors import VitposError
from vitpos.models.hookpoint import HookPoint, Undo
from vitpos.models.surface import Axis, FreqBand, ModelSurface, RopeAxisMap
from vitpos.rope import (
    RopeCoords,
    axial_channel_axis,
    axial_channel_freqs,
    remove_axial_channels,
    rotary_from_angles,
)

TIMM_VERSION: str = timm.__version__

if TYPE_CHECKING:
    from timm.layers.attention import Attention, AttentionRope
    from timm.models.eva import EvaAttention

    # What a block's `attn` is in the families vitpos accepts (_check_blocks checks what is used).
    TimmAttention = Attention | AttentionRope | EvaAttention
    TimmRope = RotaryEmbeddingCat | RotaryEmbeddingMixed | RotaryEmbeddingDinoV3

_REQUIRED_ATTN = ("q_norm", "k_norm", "attn_drop", "num_heads")


def mixed_grid_axes(grid: tuple[int, int], grid_indexing: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """timm's mixed coordinates (t_x, t_y) and which of them (0 or 1) is the ROW coordinate.

    Which one is the row depends on grid_indexing (get_mixed_grid names the row t_x under 'ij'),
    so it is read off the grid rather than assumed."""
    t_x, t_y = get_mixed_grid(list(grid), grid_indexing=grid_indexing)
    H, W = grid
    row_of = (torch.arange(H * W) // W).float()
    if torch.equal(t_x.float(), row_of):
        return t_x, t_y, 0
    if torch.equal(t_y.float(), row_of):
        return t_x, t_y, 1
    raise VitposError(f"cannot tell the row coordinate of timm's mixed RoPE grid (indexing {grid_indexing!r})")


def mixed_embed(freqs_layer: torch.Tensor, t_x: torch.Tensor, t_y: torch.Tensor, drop_x: bool,
                drop_y: bool) -> torch.Tensor:
    """(h, N, 2d) mixed rotary tensor of one layer with t_x and/or t_y zeroed (timm's get_mixed_freqs)."""
    return get_mixed_freqs(freqs_layer, t_x * (0.0 if drop_x else 1.0), t_y * (0.0 if drop_y else 1.0))


def _unfused(attn: nn.Module) -> Callable[[], Undo]:
    """Attention patterns exist only on timm's unfused path: switch it for the hook's context only."""
    def prepare() -> Undo:
        if getattr(attn, "fused_attn", False):
            setattr(attn, "fused_attn", False)  # noqa: B010 - Module.__setattr__ is typed for Tensor/Module values
            return lambda: setattr(attn, "fused_attn", True)
        return lambda: None
    return prepare


def _check_blocks(model: VisionTransformer | Eva, name: str) -> None:
    for i, blk in enumerate(model.blocks):
        missing = [m for m in ("norm1", "attn", "norm2", "mlp") if not hasattr(blk, m)]
        missing += [f"attn.{m}" for m in _REQUIRED_ATTN if not hasattr(getattr(blk, "attn", None), m)]
        if missing:
            raise VitposError(
                f"{name}: block {i} ({type(blk).__name__}) lacks {', '.join(missing)}; vitpos supports timm's "
                "standard ViT/Eva blocks only (no post-norm, parallel or fused-qkv-only blocks)"
            )


class TimmViTSurface(ModelSurface):
    """timm VisionTransformer (APE or none): vit_*, deit_*, deit3_*, vit_*_reg*."""

    model: VisionTransformer | Eva
    resizable = True

    def __init__(self, model: nn.Module, spec: str):
        if not isinstance(model, (VisionTransformer, Eva)):
            raise VitposError(
                f"{spec}: {type(model).__name__} is not a timm VisionTransformer or Eva; vitpos needs a plain ViT "
                "(patch_embed, blocks with attention over a patch grid), not a CNN, Swin or hybrid"
            )
        if not hasattr(model, "blocks") or not hasattr(model, "patch_embed"):
            raise VitposError(f"{spec}: model has no patch_embed/blocks, which vitpos needs")
        _check_blocks(model, spec)
        if getattr(model, "dynamic_img_size", False) and not isinstance(model, Eva):
            pass  # fixed-size use is fine; the grid below is the configured one
        self.model = model.eval()
        self.spec = spec
        self._read_size()
        self.num_prefix_tokens = int(model.num_prefix_tokens)
        self.depth = len(model.blocks)
        # nn.ModuleList / Sequential items are typed as plain Modules; blocks[i].attn is a timm attention.
        attn0 = cast("TimmAttention", model.blocks[0].attn)
        self.num_heads = int(attn0.num_heads)
        self.head_dim = int(getattr(attn0, "head_dim", model.embed_dim // self.num_heads))
        self.width = int(model.embed_dim)
        self.num_classes = int(getattr(model, "num_classes", 0))
        self.scheme = "ape" if getattr(model, "pos_embed", None) is not None else "none"

    def _read_size(self) -> None:
        """grid and input_size from the model's patch embedding (at construction and after a resize)."""
        pe: Any = self.model.patch_embed
        grid_h, grid_w = pe.grid_size
        self.grid = (int(grid_h), int(grid_w))
        img = cast(tuple[int, int], pe.img_size)  # PatchEmbed keeps to_2tuple(img_size)
        self.input_size = (int(pe.proj.in_channels), int(img[0]), int(img[1]))

    def at_size(self, img_size: int | tuple[int, int]) -> ModelSurface:
        h, w = (img_size, img_size) if isinstance(img_size, int) else (int(img_size[0]), int(img_size[1]))
        pe: Any = self.model.patch_embed
        ph, pw = (int(v) for v in pe.patch_size)
        if h < ph or w < pw or h % ph or w % pw:
            raise VitposError(f"img_size {h}x{w} does not fit {self.spec}: it must be a positive multiple of the "
                              f"patch size {ph}x{pw}")
        model = copy.deepcopy(self.model)
        # timm's own resize: PatchEmbed grid, resample_abs_pos_embed (bicubic) of the APE table, and
        # rope.update_feat_shape for the rotary tables (Eva)
        model.set_input_size(img_size=(h, w))
        out = copy.copy(self)
        out.model = model.eval()
        out._resized()
        return out

    def _resized(self) -> None:
        """Refresh what depends on the input size after `at_size` put a resized model copy in place."""
        self._read_size()
        self._weights_digest = None

    def _pooled(self, images: torch.Tensor) -> torch.Tensor:
        m = self.model
        return m.forward_head(m.forward_features(images), pre_logits=True)

    def data_config(self) -> dict:
        """timm's resolve_data_config for the model (mean, std, interpolation, crop...)."""
        return resolve_data_config({}, model=self.model)

    def image_transform(self) -> Callable:
        """timm's eval transform for the model, at the surface's input size."""
        cfg = resolve_data_config({}, model=self.model)
        cfg["input_size"] = self.input_size
        # One eval transform (separate=False); the declared return type also covers separate=True's tuple.
        return cast(Callable, create_transform(**cfg))

    # --- hook points: the sites on timm's block layout ----------------------------------------------
    def hook_point(self, layer: int | None, site: str) -> HookPoint:
        if layer is None:
            if site == "embed":
                return HookPoint(self.embed_module())
            raise VitposError(f"unknown global site {site!r}")
        blk, attn = self.block(layer), self.attention(layer)
        if site == "resid_pre":
            return HookPoint(blk, "input")
        if site == "resid_post":
            return HookPoint(blk)
        if site == "resid_mid":
            return HookPoint(blk.get_submodule("norm2"), "input")
        if site == "attn_out":
            return HookPoint(attn)
        if site == "mlp_out":
            return HookPoint(blk.get_submodule("mlp"))
        if site in ("q", "k"):
            return HookPoint(attn.get_submodule("q_norm" if site == "q" else "k_norm"))
        if site in ("q_rot", "k_rot"):
            return self._rotated(attn, "q_norm" if site == "q_rot" else "k_norm")
        if site == "z":
            heads = self.num_heads

            def split(x: torch.Tensor) -> torch.Tensor:  # (B, T, h * d): heads concatenated, as proj reads them
                B, T, C = x.shape
                return x.reshape(B, T, heads, C // heads).transpose(1, 2)

            def join(new: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
                B, T, C = x.shape
                return new.transpose(1, 2).reshape(B, T, C)
            return HookPoint(attn.get_submodule("proj"), "input", view=split, unview=join)
        if site == "attn_pattern":
            return HookPoint(attn.get_submodule("attn_drop"), prepare=_unfused(attn))
        raise VitposError(f"unknown site blocks.{layer}.{site}")

    def _rotated(self, attn: nn.Module, norm: str) -> HookPoint:
        """q or k after rotation: the rope tensor attention receives (after any rope edit on the
        block) is recorded by a pre-hook on the attention, then applied to the normed q / k."""
        seen: dict[str, torch.Tensor | None] = {}

        def prepare() -> Undo:
            handle = attn.register_forward_pre_hook(
                lambda m, args, kwargs: seen.__setitem__("rope", kwargs.get("rope")), with_kwargs=True)
            return handle.remove
        return HookPoint(attn.get_submodule(norm), view=lambda out: self.apply_rope(out, seen.get("rope")),
                         prepare=prepare)

    def rotary_input(self, layer: int) -> HookPoint:
        if not self.has_rope:
            return super().rotary_input(layer)
        return HookPoint(self.block(layer), "input", arg="rope")

    def head_projections(self, layer: int) -> torch.Tensor:
        proj = self.attention(layer).get_submodule("proj")
        weight = torch.as_tensor(proj.weight).detach()  # (D, h * d)
        D, hd = weight.shape
        return weight.T.reshape(self.num_heads, hd // self.num_heads, D)

    def block(self, layer: int) -> nn.Module:
        return self.model.blocks[layer]

    # partial forwards with timm's own modules, in VisionTransformer.forward_features' order
    @torch.no_grad()
    def embed_tokens(self, images: torch.Tensor) -> torch.Tensor:
        m: Any = self.model  # timm's modules (nn.Module attribute access is untyped)
        x = m._pos_embed(m.patch_embed(images))
        return m.norm_pre(m.patch_drop(x))

    @torch.no_grad()
    def run_blocks(self, tokens: torch.Tensor, start: int, stop: int | None = None) -> torch.Tensor:
        stop = self.depth if stop is None else stop
        self._check_tokens(tokens, start, stop)
        blocks: Any = self.model.blocks
        x = tokens
        for i in range(start, stop):
            x = blocks[i](x)
        return x

    @torch.no_grad()
    def head_from(self, tokens: torch.Tensor) -> torch.Tensor:
        m: Any = self.model
        if self.head is not None:  # an attached head reads the pooled features, as __call__ does
            return self.head(m.forward_head(m.norm(tokens), pre_logits=True))
        return m.forward_head(m.norm(tokens))

    def attention(self, layer: int) -> nn.Module:
        return self.block(layer).get_submodule("attn")

    def embed_module(self) -> nn.Module:
        """Module whose output is the `embed` site."""
        return self.model.get_submodule("pos_drop")

    def apply_rope(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
        """Rotate per-head q or k (B, h, T, d) as the model does: no rotary embedding here."""
        return x

    def patch_pos_embed(self) -> torch.Tensor:
        pe = getattr(self.model, "pos_embed", None)
        if pe is None:
            return super().patch_pos_embed()
        pe = pe.detach()[0]
        if not getattr(self.model, "no_embed_class", False):
            pe = pe[self.num_prefix_tokens:]  # table has rows for CLS/registers first
        if pe.shape[0] != self.num_patches:
            raise VitposError(f"{self.spec}: pos_embed has {pe.shape[0]} patch rows for a {self.grid} grid")
        return pe


class TimmEvaSurface(TimmViTSurface):
    """timm Eva: RoPE ViTs (axial 'cat', 'mixed'), EVA-02, DINOv3 ('dinov3'), with or without APE."""

    model: Eva

    def __init__(self, model: nn.Module, spec: str):
        if not isinstance(model, Eva):
            raise VitposError(f"{spec}: expected a timm Eva model, got {type(model).__name__}")
        super().__init__(model, spec)
        rope = model.rope
        if rope is not None and not isinstance(rope, (RotaryEmbeddingCat, RotaryEmbeddingMixed, RotaryEmbeddingDinoV3)):
            raise VitposError(f"{spec}: rotary module {type(rope).__name__} is not supported (axial cat, mixed or "
                              "dinov3 only)")
        self._rope: TimmRope | None = rope
        has_ape = getattr(model, "pos_embed", None) is not None
        self.scheme = ("rope+ape" if has_ape else "rope") if rope is not None else ("ape" if has_ape else "none")
        self._axis_map: RopeAxisMap | None = None

    def _resized(self) -> None:
        super()._resized()
        self._rope = self.model.rope  # type: ignore[assignment]  # checked at construction; the copy's module
        self._axis_map = None  # channel axes / mixed grids are read off the new grid

    def rope_table(self) -> torch.Tensor:
        if not self.has_rope:
            return super().rope_table()
        return self._base_rope()

    @torch.no_grad()
    def embed_tokens(self, images: torch.Tensor) -> torch.Tensor:
        m: Any = self.model  # timm's modules (nn.Module attribute access is untyped)
        x, _ = m._pos_embed(m.patch_embed(images))
        return m.norm_pre(x)

    def _forward_rope(self) -> torch.Tensor | None:
        """The rotary tensor Eva._pos_embed computes for the configured grid (a fixed input size)."""
        m: Any = self.model
        rope = m.rope
        if rope is None:
            return None
        if getattr(m, "dynamic_img_size", False):
            return rope.get_embed(shape=list(self.grid))
        if hasattr(rope, "feat_shape"):
            return rope.get_embed()
        return rope.get_embed(shape=m.patch_embed.grid_size)

    @torch.no_grad()
    def run_blocks(self, tokens: torch.Tensor, start: int, stop: int | None = None) -> torch.Tensor:
        """As Eva.forward_features: each block gets `rope=` (per-layer for mixed RoPE), so remove_rope's
        pre-hooks and every other hook on the blocks act as in a full forward."""
        stop = self.depth if stop is None else stop
        self._check_tokens(tokens, start, stop)
        rot = self._forward_rope() if start < stop else None
        per_layer = bool(getattr(self.model, "rope_mixed", False)) and rot is not None
        blocks: Any = self.model.blocks
        x = tokens
        for i in range(start, stop):
            rope = rot[i] if per_layer and rot is not None else rot
            x = blocks[i](x, rope=rope, attn_mask=None, is_causal=False)
        return x

    # the rotary tensor timm computes for this grid (what forward_features passes to blocks)
    def _base_rope(self) -> torch.Tensor:
        rope = self._rope
        assert rope is not None, "only RoPE models have a rotary tensor"
        with torch.no_grad():
            if getattr(self.model, "dynamic_img_size", False) or getattr(rope, "feat_shape", None) is None:
                return rope.get_embed(shape=list(self.grid))
            return rope.get_embed()

    def rope_axis_map(self) -> RopeAxisMap:
        if not self.has_rope:
            return super().rope_axis_map()
        if self._axis_map is None:
            rope = self._rope
            half = bool(getattr(self.model.blocks[0].attn, "rotate_half", False))
            layout = "half" if half else "interleaved"
            if isinstance(rope, RotaryEmbeddingMixed):
                t_x, t_y, row_idx = mixed_grid_axes(self.grid, rope.grid_indexing)
                f = rope.freqs.detach().float()  # (2 = [x, y], depth, heads, d/2)
                freqs = torch.stack([f[0] if row_idx == 0 else f[1], f[1] if row_idx == 0 else f[0]])
                self._axis_map = RopeAxisMap("mixed", self.head_dim, self.depth, self.num_heads, layout, freqs=freqs)
            else:
                base = self._base_rope()
                axes = axial_channel_axis(base, self.grid)
                self._axis_map = RopeAxisMap("axial", self.head_dim, self.depth, self.num_heads, layout,
                                             channel_axis=axes, channel_freq=axial_channel_freqs(base, self.grid, axes))
        return self._axis_map

    def rope_embed(self, layer: int, base: torch.Tensor, remove: Mapping[Axis, list[int] | None],
                   band: FreqBand | None = None) -> torch.Tensor:
        if not self.has_rope:
            return super().rope_embed(layer, base, remove, band)
        h = self.num_heads
        out = (base if base.ndim == 3 else base.unsqueeze(0)).expand(h, *base.shape[-2:]).clone()
        amap = self.rope_axis_map()
        for head in range(h):
            axes: list[Axis] = [a for a, heads in remove.items() if heads is None or head in heads]
            if not axes:
                continue
            if amap.kind == "axial":
                chans = [j for a in axes for j in (amap.channels(a) if band is None
                                                   else amap.band_channels(a, layer, head, band))]
                out[head] = remove_axial_channels(out[head], chans)
                continue
            if band is None:
                out[head] = self._mixed_without(layer, head, set(axes)).to(out.dtype)
                continue
            # each band pair recomputed without the axes whose band holds it; other pairs kept from base
            drops: dict[int, set[str]] = {}
            for a in axes:
                for p in amap.band_pairs(a, layer, head, band):
                    drops.setdefault(p, set()).add(a)
            d = amap.head_dim
            for dropped in ({"row"}, {"col"}, {"row", "col"}):
                chans = amap.pair_channels([p for p, s in drops.items() if s == dropped])
                if chans:
                    idx = torch.tensor(chans + [d + j for j in chans], dtype=torch.long, device=out.device)
                    out[head, :, idx] = self._mixed_without(layer, head, dropped)[:, idx].to(out.dtype)
        return out

    def _mixed_without(self, layer: int, head: int, axes: set[str]) -> torch.Tensor:
        """(N, 2d) mixed rotary tensor of one layer and head with the `axes` coordinates set to 0."""
        rope = self._rope
        assert isinstance(rope, RotaryEmbeddingMixed), "a mixed axis map comes from a mixed rope"
        t_x, t_y, row_idx = mixed_grid_axes(self.grid, rope.grid_indexing)
        drop_row, drop_col = "row" in axes, "col" in axes
        drop_x, drop_y = (drop_row, drop_col) if row_idx == 0 else (drop_col, drop_row)
        return mixed_embed(rope.freqs.detach()[:, layer, head : head + 1], t_x, t_y, drop_x, drop_y)[0]

    # --- rotations recomputed from coordinates (vitpos.rope.CoordEdit, hooks.rope_coordinates) -----------
    # Each family's own arithmetic on the device timm computes on (tables cached at construction were
    # computed on the CPU), so the model's own coordinates give the model's own tensor bit for bit.

    def _rope_cached(self) -> bool:
        """True when the blocks get a table timm computed once (at construction, on the CPU) rather than
        one it computes in every forward (on the device of the rotary module's buffers)."""
        rope = self._rope
        if isinstance(rope, RotaryEmbeddingCat):
            return bool(getattr(rope, "_use_cached_embed", False)) and getattr(rope, "pos_embed", None) is not None
        if isinstance(rope, RotaryEmbeddingDinoV3):
            return not getattr(self.model, "dynamic_img_size", False) and rope.pos_embed_cached is not None
        return False  # mixed: get_mixed_freqs in every forward

    def _rope_shape(self) -> list[int]:
        """The grid the blocks' rotary tensor is for (a cached table's own, else the surface's)."""
        fs = getattr(self._rope, "feat_shape", None)
        per_forward_grid = getattr(self.model, "dynamic_img_size", False) and not self._rope_cached()
        return list(self.grid) if fs is None or per_forward_grid else [int(v) for v in fs]

    def rope_coords(self) -> RopeCoords:
        if not self.has_rope:
            return super().rope_coords()
        rope = self._rope
        shape = self._rope_shape()
        if isinstance(rope, RotaryEmbeddingMixed):
            t_x, t_y = rope.t_x, rope.t_y
            if t_x is None or t_y is None or getattr(self.model, "dynamic_img_size", False):
                t_x, t_y = get_mixed_grid(shape, grid_indexing=rope.grid_indexing, device=rope.freqs.device)
            coords = torch.stack([t_x, t_y], dim=-1)
        elif isinstance(rope, RotaryEmbeddingDinoV3):
            coords = _build_grid(shape, grid_type="centered", grid_offset=rope.grid_offset,
                                 grid_indexing=rope.grid_indexing, normalize_coords=rope.normalize_coords,
                                 ndim=2).flatten(0, -2)
        else:
            assert isinstance(rope, RotaryEmbeddingCat), "checked at construction"
            dev = torch.device("cpu") if self._rope_cached() else torch.as_tensor(rope.bands).device
            coords = _build_grid(shape, grid_type=rope.grid_type, ref_feat_shape=rope.ref_feat_shape,
                                 grid_offset=rope.grid_offset, grid_indexing=rope.grid_indexing,
                                 normalize_coords=rope.normalize_coords, device=dev).flatten(0, -2)
        return RopeCoords.read(coords, (shape[0], shape[1]))

    def rope_from_coords(self, coords: torch.Tensor | None = None, layout: str | None = None) -> torch.Tensor:
        if not self.has_rope:
            return super().rope_from_coords(coords, layout)
        rope = self._rope
        c = self.rope_coords().coords if coords is None else coords
        n = self._rope_shape()[0] * self._rope_shape()[1]
        if tuple(c.shape) != (n, 2):
            raise VitposError(f"rotary coordinates of shape {tuple(c.shape)}: {self.spec} needs ({n}, 2)")
        if isinstance(rope, RotaryEmbeddingMixed):  # timm's get_mixed_freqs, per layer and head
            f = rope.freqs.detach()
            ff, t = f.float(), c.to(f.device).float()
            angles = t[:, 0].unsqueeze(-1) * ff[0].unsqueeze(-2) + t[:, 1].unsqueeze(-1) * ff[1].unsqueeze(-2)
            return rotary_from_angles(angles, layout or "interleaved").to(f.dtype)
        if isinstance(rope, RotaryEmbeddingDinoV3):  # _get_pos_embed_from_coords
            periods = torch.as_tensor(rope.periods)
            dev = torch.device("cpu") if self._rope_cached() else periods.device
            p = periods.to(dev)
            cc = c[:, :, None].to(device=dev, dtype=p.dtype)
            angles = (2 * math.pi * cc / p[None, None, :]).flatten(1)
            out = rotary_from_angles(angles, layout or ("half" if rope.rotate_half else "interleaved"))
            cached = getattr(rope, "pos_embed_cached", None)
            return out.to(cached.dtype) if isinstance(cached, torch.Tensor) and self._rope_cached() else out
        assert isinstance(rope, RotaryEmbeddingCat), "checked at construction"
        bands = torch.as_tensor(rope.bands)  # a buffer (nn.Module attributes are typed Tensor | Module)
        dev = torch.device("cpu") if self._rope_cached() else bands.device
        bands = bands.to(dev)
        angles = (c.to(dev).unsqueeze(-1) * bands).flatten(-2)  # build_fourier_pos_embed: grid * bands
        out = rotary_from_angles(angles, layout or ("half" if rope.rotate_half else "interleaved"), torch.float32)
        cached = getattr(rope, "pos_embed", None)
        return out.to(cached.dtype) if isinstance(cached, torch.Tensor) and self._rope_cached() else out

    def apply_rope(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
        """Rotate per-head q or k (B, h, T, d) exactly as the model does (prefix untouched)."""
        if rope is None:
            return x
        npt = self.num_prefix_tokens
        half = bool(getattr(self.model.blocks[0].attn, "rotate_half", False))
        return torch.cat([x[:, :, :npt], apply_rot_embed_cat(x[:, :, npt:], rope, half=half)], dim=2).type_as(x)


def surface_for(model: nn.Module, spec: str) -> ModelSurface:
    if isinstance(model, Eva):
        return TimmEvaSurface(model, spec)
    return TimmViTSurface(model, spec)
