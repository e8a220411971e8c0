"""Hugging Face `transformers` vision models behind the model surface (`hf:` specs).

Families (the base model, headless; `*ForImageClassification` where transformers has one, with its classifier):

  ViTModel, DeiTModel, Dinov2Model, Dinov2WithRegistersModel, CLIPVisionModel, SiglipVisionModel (APE),
  DINOv3ViTModel (axial RoPE, rotate-half layout, patch-centre coordinates normalised to [-1, 1]).

Every site is reached on transformers' own modules; nothing of a family's forward is re-typed:
  resid_pre / resid_post   pre-hook / hook on the layer (`layers[L]`)
  resid_mid                pre-hook on the layer's second norm
  attn_out                 hook on the attention module (its first output, before layer scale)
  mlp_out                  hook on the layer's `mlp`
  q / k                    hook on q_proj / k_proj, seen per head (B, h, T, d) — before any rotation
  z                        pre-hook on the output projection (o_proj / out_proj), per head
  q_rot / k_rot            the query / key the attention function receives (after the model's own RoPE)
  attn_pattern             softmax(q_rot k_rot^T * scale) computed in the attention function, so it carries
                           RoPE even when the model runs SDPA
The attention function: at construction the model's `config._attn_implementation` is pointed at a
dispatcher registered with transformers' AttentionInterface, and each attention module gets a
parameter-free `vitpos_taps` child (identity modules: the hook points of q_rot, k_rot, attn_pattern).
The dispatcher passes query and key through the taps and calls the implementation the model had (sdpa
or eager) with the same arguments, so the plain forward is the model's own bit for bit; while a
pattern hook is attached it computes attention as transformers' `eager_attention_forward` does
(matmul, scale, softmax, dropout, matmul) with the pattern tap between softmax and dropout.

The families themselves (module paths, normalisation, toy configs) are `vitpos.models.hf_families`;
building or loading one from a spec (`load_hf`: configs, preprocessor configs, weights, each checked)
is `vitpos.models.hf_load`.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from vitpos.errors import VitposError
from vitpos.models.hf_families import HFFamily, classifier_labels
from vitpos.models.hookpoint import HookPoint, Undo
from vitpos.models.surface import Axis, FreqBand, ModelSurface, RopeAxisMap
from vitpos.rope import axial_channel_axis, axial_channel_freqs, remove_axial_channels

# --- the attention dispatcher ---------------------------------------------------------------------

class _Tap(nn.Module):
    """Identity: a module for a hook point on a tensor that only exists inside the attention function."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Taps(nn.Module):
    """The hook points of one attention module's attention function (no parameters, no state dict)."""

    def __init__(self, impl: str):
        super().__init__()
        self.impl = impl  # the model's own implementation (sdpa or eager)
        self.q_rot, self.k_rot, self.pattern = _Tap(), _Tap(), _Tap()
        self.patterns_on = 0  # pattern hooks attached: attention runs as eager attention with the tap


DISPATCH = "vitpos_hooks"


def _dispatch(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0, **kwargs):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    taps = getattr(module, "vitpos_taps", None)
    impl = taps.impl if isinstance(taps, _Taps) else "sdpa"
    if isinstance(taps, _Taps):
        query, key = taps.q_rot(query), taps.k_rot(key)  # identities; capture-only sites
    if not isinstance(taps, _Taps) or taps.patterns_on == 0:
        if impl == "eager":
            fam_eager = sys.modules[type(module).__module__].eager_attention_forward  # the family's own eager
            return fam_eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        return ALL_ATTENTION_FUNCTIONS[impl](module, query, key, value, attention_mask, scaling=scaling,
                                             dropout=dropout, **kwargs)
    # transformers' eager_attention_forward, with the pattern tap between softmax and dropout
    scale = query.size(-1) ** -0.5 if scaling is None else scaling
    weights = torch.matmul(query, key.transpose(2, 3)) * scale
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = taps.pattern(nn.functional.softmax(weights, dim=-1))
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


def _register_dispatch() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(DISPATCH, _dispatch)


def _heads_view(t: torch.Tensor, heads: int) -> torch.Tensor:
    B, T, C = t.shape
    return t.reshape(B, T, heads, C // heads).transpose(1, 2)


def _heads_merge(t: torch.Tensor) -> torch.Tensor:
    B, h, T, d = t.shape
    return t.transpose(1, 2).reshape(B, T, h * d)


class HFSurface(ModelSurface):
    """A transformers vision model (base or *ForImageClassification) behind the model surface."""

    rope_kwarg = "position_embeddings"  # what a DINOv3 layer gets its (cos, sin) as

    def __init__(self, model: nn.Module, spec: str, family: HFFamily, preprocess: dict | None = None):
        self.model = model.eval()
        self.spec = spec
        self.family = family
        self.has_classifier = type(model).__name__ == family.classifier_cls
        m: Any = model  # a transformers PreTrainedModel (nn.Module attribute access is untyped)
        self.base: Any = m.base_model if self.has_classifier else m
        cfg: Any = self.base.config
        self.config = cfg
        size = cfg.image_size if isinstance(cfg.image_size, (list, tuple)) else (cfg.image_size, cfg.image_size)
        patch = cfg.patch_size if isinstance(cfg.patch_size, (list, tuple)) else (cfg.patch_size, cfg.patch_size)
        self.grid = (int(size[0]) // int(patch[0]), int(size[1]) // int(patch[1]))
        self.input_size = (int(cfg.num_channels), int(self.grid[0] * patch[0]), int(self.grid[1] * patch[1]))
        self.num_prefix_tokens = family.num_prefix(cfg)
        self.depth = int(cfg.num_hidden_layers)
        self.num_heads = int(cfg.num_attention_heads)
        self.width = int(cfg.hidden_size)
        self.head_dim = self.width // self.num_heads
        self.num_classes = int(getattr(model.config, "num_labels", 0)) if self.has_classifier else 0
        if self.has_classifier:
            self.trained_classes = classifier_labels(model.config)
        self.scheme = "rope" if family.pe == "rope" else "ape"
        self._preprocess = {**family.preprocess, "interpolation": "bicubic", **(preprocess or {})}
        self.resizable = family.key not in ("clip", "siglip")  # nn.Embedding position tables: see at_size
        self._axis_map: RopeAxisMap | None = None
        self._install_dispatch()

    def _install_dispatch(self) -> None:
        _register_dispatch()
        impl = getattr(self.model.config, "_attn_implementation", None) or "sdpa"
        impl = "sdpa" if impl == DISPATCH else impl
        if impl not in ("sdpa", "eager"):
            raise VitposError(f"{self.spec}: attention implementation {impl!r} is not supported; load it with sdpa "
                              "or eager attention")
        for i in range(self.depth):
            attn = self.attention(i)
            if not isinstance(getattr(attn, "vitpos_taps", None), _Taps):
                attn.add_module("vitpos_taps", _Taps(impl))
        hf_model: Any = self.model
        hf_model.set_attn_implementation(DISPATCH)

    def at_size(self, img_size: int | tuple[int, int]) -> ModelSurface:
        """A copy taking `img_size` images: DINOv3's rotary angles come from the input's own grid (patch
        centres normalised to [-1, 1], so a larger grid is rescaled, not extended); absolute tables are
        resampled once by the family's own `interpolate_pos_encoding` (bicubic) and stored, square sizes only."""
        h, w = (img_size, img_size) if isinstance(img_size, int) else (int(img_size[0]), int(img_size[1]))
        ph, pw = self.patch_size
        if h < ph or w < pw or h % ph or w % pw:
            raise VitposError(f"img_size {h}x{w} does not fit {self.spec}: it must be a positive multiple of the "
                              f"patch size {ph}x{pw}")
        if not self.resizable:
            raise VitposError(f"{self.spec}: {type(self.model).__name__} keeps its position table in an nn.Embedding "
                              "that vitpos does not resample; extrapolation is not available for it")
        if self.has_ape and h != w:
            raise VitposError(f"{self.spec}: transformers resamples absolute tables to square grids only; pass a "
                              "square img_size")
        model: Any = copy.deepcopy(self.model)
        base: Any = model.base_model if self.has_classifier else model
        if self.has_ape:
            emb = base.embeddings
            skip = {"deit": 2}.get(self.family.key, 1)
            with torch.no_grad():
                table = emb.interpolate_pos_encoding(torch.zeros(1, skip + (h // ph) * (w // pw), self.width), h, w)
            emb.position_embeddings = nn.Parameter(table.detach().clone())
            pe = getattr(emb, "patch_embeddings", None)
            if pe is not None and hasattr(pe, "image_size"):
                pe.image_size, pe.num_patches = (h, w), (h // ph) * (w // pw)
            if hasattr(emb, "image_size"):  # ViT / DeiT check the input against it
                emb.image_size = (h, w)
        base.config.image_size = h if h == w else [h, w]
        out = HFSurface(model, self.spec, self.family, self._preprocess)
        out.head, out.trained_classes = self.head, self.trained_classes
        return out

    # --- modules --------------------------------------------------------------------------------
    def block(self, layer: int) -> nn.Module:
        layers: Any = self.base.get_submodule(self.family.layers)
        return layers[layer]

    def attention(self, layer: int) -> nn.Module:
        return self.block(layer).get_submodule(self.family.attn)

    def embed_module(self) -> nn.Module:
        return self.base.get_submodule("embeddings")

    def head_projections(self, layer: int) -> torch.Tensor:
        weight = torch.as_tensor(self.attention(layer).get_submodule(self.family.out_proj).weight).detach()  # (D, h*d)
        D, hd = weight.shape
        return weight.T.reshape(self.num_heads, hd // self.num_heads, D)

    def data_config(self) -> dict:
        return dict(self._preprocess)

    # --- forwards -------------------------------------------------------------------------------
    def _rope(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.base.rope_embeddings(images) if self.has_rope else None

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        self._check_images(images)
        if self.head is not None:
            return self.head(self._pooled(images))
        out = self.model(pixel_values=images)
        return out.logits if self.has_classifier else self._pool_output(out)

    def _pool_output(self, out: Any) -> torch.Tensor:
        if self.family.pool == "cls":
            return out.last_hidden_state[:, 0]
        if self.family.pool == "cls_dist":
            return (out.last_hidden_state[:, 0] + out.last_hidden_state[:, 1]) / 2
        if self.family.pool == "siglip" and out.pooler_output is None:
            return out.last_hidden_state.mean(1)
        return out.pooler_output

    def _pooled(self, images: torch.Tensor) -> torch.Tensor:
        return self._pool_tokens(self.run_blocks(self.embed_tokens(images), 0))

    def _pool_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The classifier's input (or the headless model's pooled output) from the last layer's output."""
        fam, base = self.family, self.base
        norm: Any = base.get_submodule(fam.final_norm)
        if fam.pool == "cls_post":  # CLIP: the CLS state through post_layernorm
            return norm(tokens[:, 0])
        x = norm(tokens)
        if fam.pool == "siglip":
            return base.head(x) if getattr(base, "use_head", False) else x.mean(1)
        if self.has_classifier and fam.key in ("dinov2", "dinov2_reg"):  # Dinov2ForImageClassification
            return torch.cat([x[:, 0], x[:, self.num_prefix_tokens:].mean(1) if fam.key == "dinov2_reg"
                              else x[:, 1:].mean(1)], dim=1)
        if fam.pool == "cls_dist" and not self.has_classifier:
            return (x[:, 0] + x[:, 1]) / 2
        return x[:, 0]

    @torch.no_grad()
    def embed_tokens(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed_module()(images)
        if self.family.pre_norm is not None:
            x = self.base.get_submodule(self.family.pre_norm)(x)
        return x

    @torch.no_grad()
    def run_blocks(self, tokens: torch.Tensor, start: int, stop: int | None = None,
                   images: torch.Tensor | None = None) -> torch.Tensor:
        stop = self.depth if stop is None else stop
        self._check_tokens(tokens, start, stop)
        extra: dict[str, Any] = {}
        if self.has_rope and start < stop:
            extra[self.rope_kwarg] = self._rope(torch.zeros(1, *self.input_size, dtype=tokens.dtype,
                                                            device=tokens.device))
        layers: Any = self.base.get_submodule(self.family.layers)
        x = tokens
        for i in range(start, stop):
            x = layers[i](x, None, **extra)
        return x

    @torch.no_grad()
    def head_from(self, tokens: torch.Tensor) -> torch.Tensor:
        pooled = self._pool_tokens(tokens)
        if self.head is not None:
            return self.head(pooled)
        return self.model.get_submodule("classifier")(pooled) if self.has_classifier else pooled

    # --- hook points (vitpos.models.adapter.FamilyAdapter) ------------------------------------------
    def hook_point(self, layer: int | None, site: str) -> HookPoint:
        if layer is None:
            if site == "embed":
                return HookPoint(self.embed_module())
            raise VitposError(f"unknown global site {site!r}")
        blk, attn, heads = self.block(layer), self.attention(layer), self.num_heads
        if site == "resid_pre":
            return HookPoint(blk, "input")
        if site == "resid_post":
            return HookPoint(blk)
        if site == "resid_mid":
            return HookPoint(blk.get_submodule(self.family.norm2), "input")
        if site == "attn_out":  # transformers' attention returns (output, weights)
            return HookPoint(attn, view=lambda out: out[0], unview=lambda new, out: (new, *out[1:]))
        if site == "mlp_out":
            return HookPoint(blk.get_submodule("mlp"))
        if site in ("q", "k"):  # the projection's (B, T, h*d) output seen per head
            return HookPoint(attn.get_submodule(f"{site}_proj"), view=lambda out: _heads_view(out, heads),
                             unview=lambda new, out: _heads_merge(new))
        if site == "z":
            return HookPoint(attn.get_submodule(self.family.out_proj), "input", view=lambda x: _heads_view(x, heads),
                             unview=lambda new, x: _heads_merge(new))
        taps: Any = attn.get_submodule("vitpos_taps")
        if site in ("q_rot", "k_rot"):
            return HookPoint(taps.get_submodule(site))
        if site == "attn_pattern":
            def prepare() -> Undo:
                taps.patterns_on += 1

                def undo() -> None:
                    taps.patterns_on -= 1
                return undo
            return HookPoint(taps.get_submodule("pattern"), prepare=prepare)
        raise VitposError(f"unknown site blocks.{layer}.{site}")

    def rotary_input(self, layer: int) -> HookPoint:
        """DINOv3 layers get (cos, sin) as `position_embeddings`; `rope_embed` takes and returns that pair."""
        if not self.has_rope:
            return super().rotary_input(layer)
        return HookPoint(self.block(layer), "input", arg=self.rope_kwarg)

    def image_transform(self) -> Callable[[Any], torch.Tensor]:
        """One PIL image -> (C, H, W): resized to the input size (the family's interpolation), to [0, 1],
        normalised with the family's (or the folder's preprocessor_config.json) mean and std."""
        from torchvision import transforms

        cfg = self.data_config()
        mode = {"bilinear": transforms.InterpolationMode.BILINEAR, "nearest": transforms.InterpolationMode.NEAREST}
        return transforms.Compose([
            transforms.Resize(self.input_size[1:], interpolation=mode.get(cfg["interpolation"],
                                                                          transforms.InterpolationMode.BICUBIC)),
            transforms.ToTensor(), transforms.Normalize(cfg["mean"], cfg["std"])])

    # --- RoPE (DINOv3) ----------------------------------------------------------------------------
    def rope_table(self) -> torch.Tensor:
        """(H*W, 2d) = cat([sin, cos]) of the model's own rotary embedding (timm's layout, vitpos.rope)."""
        if not self.has_rope:
            return super().rope_table()
        with torch.no_grad():
            rope = self._rope(torch.zeros(1, *self.input_size))
        assert rope is not None
        cos, sin = rope
        return torch.cat([sin, cos], dim=-1)

    def rope_axis_map(self) -> RopeAxisMap:
        if not self.has_rope:
            return super().rope_axis_map()
        if self._axis_map is None:
            base = self.rope_table().float()
            axes = axial_channel_axis(base, self.grid)
            self._axis_map = RopeAxisMap("axial", self.head_dim, self.depth, self.num_heads, "half", channel_axis=axes,
                                         channel_freq=axial_channel_freqs(base, self.grid, axes))
        return self._axis_map

    def rope_embed(self, layer: int, base: Any, remove: Mapping[Axis, list[int] | None],
                   band: FreqBand | None = None) -> Any:
        """base: the (cos, sin) a layer gets, each (N, d); returns (cos, sin), each (h, N, d), with the
        removed axes' channels at angle 0 for the chosen heads."""
        if not self.has_rope:
            return super().rope_embed(layer, base, remove, band)
        cos, sin = base
        d = cos.shape[-1]
        out = torch.cat([sin, cos], dim=-1).expand(self.num_heads, *cos.shape[-2:-1], 2 * d).clone()
        amap = self.rope_axis_map()
        for head in range(self.num_heads):
            axes: list[Axis] = [a for a, heads in remove.items() if heads is None or head in heads]
            chans = [j for a in axes for j in (amap.channels(a) if band is None
                                               else amap.band_channels(a, layer, head, band))]
            if chans:
                out[head] = remove_axial_channels(out[head], chans)
        return out[..., d:], out[..., :d]

    # --- APE --------------------------------------------------------------------------------------
    def patch_pos_embed(self) -> torch.Tensor:
        if not self.has_ape:
            return super().patch_pos_embed()
        emb: Any = self.embed_module()
        table = emb.position_embedding.weight if hasattr(emb, "position_embedding") else emb.position_embeddings
        table = table.detach().reshape(-1, self.width)
        skip = {"deit": 2, "siglip": 0}.get(self.family.key, 1)  # the table's CLS / distillation rows
        pe = table[skip:]
        if pe.shape[0] != self.num_patches:
            raise VitposError(f"{self.spec}: the position table has {pe.shape[0]} patch rows for a {self.grid} grid")
        return pe

    def describe(self) -> dict:
        return {**super().describe(), "hf_family": self.family.key, "hf_class": type(self.model).__name__}


# --- specs ------------------------------------------------------------------------------------------


