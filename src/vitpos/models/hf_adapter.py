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

Weights: `hf:CLASS?key=value&...` builds CLASS from its config class with those keys (random init);
`hf:DIR` reads a `save_pretrained` folder (config.json + model.safetensors) with transformers' own
loader, offline, safetensors only; `hf:ORG/NAME` uses the local Hugging Face cache only. `--checkpoint
FILE.safetensors` loads weights into the configured model. Any missing, unexpected or mis-shaped key
is an error.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from vitpos.errors import VitposError
from vitpos.io import check_finite, read_json, validate_doc
from vitpos.models.hookpoint import HookPoint, Undo
from vitpos.models.query import parse_query_value
from vitpos.models.surface import Axis, FreqBand, ModelSurface, RopeAxisMap
from vitpos.rope import axial_channel_axis, axial_channel_freqs, remove_axial_channels

IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
HALF = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
OPENAI_CLIP = {"mean": (0.48145466, 0.4578275, 0.40821073), "std": (0.26862954, 0.26130258, 0.27577711)}


@dataclass(frozen=True)
class HFFamily:
    """Where a transformers family keeps what the surface needs (module paths from the base model)."""

    key: str
    model_cls: str
    config_cls: str
    classifier_cls: str | None
    layers: str  # the ModuleList of layers
    attn: str  # attention module inside a layer
    norm2: str  # the layer's pre-MLP norm
    out_proj: str  # output projection inside the attention
    final_norm: str
    pe: Literal["ape", "rope"]
    prefix: str  # words for the README / `vitpos models --families`
    # pooled features of the headless model: CLS after the final norm; CLIP's CLS through post_layernorm;
    # DeiT's mean of CLS and distillation tokens (timm's pre-logits); SigLIP's attention-pool head (mean without it)
    pool: Literal["cls", "cls_post", "cls_dist", "siglip"]
    preprocess: dict
    pre_norm: str | None = None
    tiny: dict = field(default_factory=dict)  # a toy config for the gates
    timm_twin: str | None = None

    def num_prefix(self, config: Any) -> int:
        regs = int(getattr(config, "num_register_tokens", 0) or 0) if self.key in ("dinov2_reg", "dinov3") else 0
        return {"deit": 2, "siglip": 0}.get(self.key, 1) + regs


_TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
FAMILIES: dict[str, HFFamily] = {f.key: f for f in (
    HFFamily("vit", "ViTModel", "ViTConfig", "ViTForImageClassification", "layers", "attention", "layernorm_after",
             "o_proj", "layernorm", "ape", "CLS", "cls", HALF, tiny={**_TINY, "intermediate_size": 64},
             timm_twin="vit_small_patch16_224"),
    HFFamily("deit", "DeiTModel", "DeiTConfig", "DeiTForImageClassification", "layers", "attention",
             "layernorm_after", "o_proj", "layernorm", "ape", "CLS + distillation", "cls_dist", IMAGENET,
             tiny={**_TINY, "intermediate_size": 64}, timm_twin="deit_small_distilled_patch16_224"),
    HFFamily("dinov2", "Dinov2Model", "Dinov2Config", "Dinov2ForImageClassification", "encoder.layer", "attention",
             "norm2", "o_proj", "layernorm", "ape", "CLS", "cls", IMAGENET, tiny={**_TINY, "mlp_ratio": 2},
             timm_twin="vit_small_patch14_dinov2"),
    HFFamily("dinov2_reg", "Dinov2WithRegistersModel", "Dinov2WithRegistersConfig",
             "Dinov2WithRegistersForImageClassification", "encoder.layer", "attention", "norm2", "o_proj", "layernorm",
             "ape", "CLS + registers", "cls", IMAGENET, tiny={**_TINY, "mlp_ratio": 2, "num_register_tokens": 2}),
    HFFamily("dinov3", "DINOv3ViTModel", "DINOv3ViTConfig", None, "model.layer", "attention", "norm2", "o_proj",
             "norm", "rope", "CLS + registers", "cls", IMAGENET,
             tiny={**_TINY, "intermediate_size": 64, "num_register_tokens": 2}, timm_twin="vit_small_patch16_dinov3"),
    HFFamily("clip", "CLIPVisionModel", "CLIPVisionConfig", None, "encoder.layers", "self_attn", "layer_norm2",
             "out_proj", "post_layernorm", "ape", "CLS", "cls_post", OPENAI_CLIP, pre_norm="pre_layrnorm",
             tiny={**_TINY, "intermediate_size": 64}),
    HFFamily("siglip", "SiglipVisionModel", "SiglipVisionConfig", None, "encoder.layers", "self_attn", "layer_norm2",
             "out_proj", "post_layernorm", "ape", "none (attention-pool head)", "siglip", HALF,
             tiny={**_TINY, "intermediate_size": 64}),
)}
_BY_CLASS = {c: f for f in FAMILIES.values() for c in (f.model_cls, f.classifier_cls) if c}
# Vision towers asked for that do not fit a patch grid + prefix surface (see README, "Hugging Face models").
NO_SURFACE = {
    "PixtralVisionModel": "it takes a list of variable-size images flattened into one sequence with a block-diagonal "
                          "mask and has no prefix token or pooled output",
    "Qwen2VisionTransformerPretrainedModel": "its Conv3d patches are reordered into 2x2 merge windows and merged "
                                             "before the output, so its tokens are not a row-major patch grid",
}


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise VitposError("hf: specs need Hugging Face transformers; install it with `pip install 'vitpos[hf]'`") from e
    return transformers


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


def _family_of(cls_name: str, spec: str) -> HFFamily:
    if cls_name in NO_SURFACE:
        raise VitposError(f"{spec}: {cls_name} has no vitpos surface: {NO_SURFACE[cls_name]}; use one of "
                          f"{', '.join(sorted(_BY_CLASS))}")
    fam = _BY_CLASS.get(cls_name)
    if fam is None:
        raise VitposError(f"{spec}: {cls_name!r} is not a transformers vision family vitpos supports; use one of "
                          f"{', '.join(sorted(_BY_CLASS))} (hf:CLASS?key=value for a random-init config, hf:DIR for "
                          "a save_pretrained folder)")
    return fam


def _build(cls_name: str, config: Any, where: str) -> nn.Module:
    tr = _transformers()
    # The same random init on every load (the stage cache keys a model by its spec; see models/spec.py).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            return getattr(tr, cls_name)(config)
        except Exception as e:  # the config's values disagree with the modules (a dropout of 3, a bad activation)
            raise VitposError(f"transformers could not build {cls_name} from {where}: "
                              f"{' '.join(str(e).split())[:200]}; fix the config's keys") from None


def _load_weights(model: nn.Module, checkpoint: Path, spec: str) -> nn.Module:
    """Weights from a .safetensors file through transformers' own loader (its key renames for older
    checkpoints included), refused unless every key of the model is loaded and nothing is left over."""
    if checkpoint.suffix != ".safetensors":
        raise VitposError(f"checkpoint {checkpoint} is not .safetensors; vitpos never unpickles weights — convert it "
                          "first")
    if not checkpoint.is_file():
        raise VitposError(f"checkpoint {checkpoint} does not exist")
    cls: Any = type(model)
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # one load of a local file: no progress bars or load report in vitpos' output;
    hf_logging.set_verbosity_error()  # a mismatch is raised below as one error line
    with tempfile.TemporaryDirectory() as tmp:
        hf_model: Any = model
        hf_model.config.save_pretrained(tmp)
        os.symlink(checkpoint.resolve(), Path(tmp) / "model.safetensors")
        try:
            loaded, info = cls.from_pretrained(tmp, local_files_only=True, use_safetensors=True,
                                               output_loading_info=True)
        except Exception as e:  # transformers raises several types for a shape mismatch
            raise VitposError(f"checkpoint {checkpoint} does not fit {spec} ({' '.join(str(e).split())[:200]}); pass "
                              "the config it was trained with") from None
        finally:
            hf_logging.set_verbosity(level)
            if bars:
                hf_logging.enable_progress_bar()
    bad = _load_problems(info)
    if bad:
        raise VitposError(f"checkpoint {checkpoint} does not fit {spec}: {bad}; pass the config it was trained with")
    return loaded


def _load_problems(info: dict) -> dict:
    """Missing, unexpected or mis-shaped keys of a from_pretrained load (empty: every key loaded)."""
    return {k: sorted(map(str, v))[:4] for k, v in info.items()
            if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}


class PreprocessorConfig(BaseModel):
    """The keys of a preprocessor_config.json vitpos reads (the rest is transformers' business)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    image_mean: list[float] | None = Field(default=None, min_length=1, max_length=16)
    image_std: list[Annotated[float, Field(gt=0)]] | None = Field(default=None, min_length=1, max_length=16)
    resample: int | None = None


def _read_preprocess(folder: Path, channels: int) -> dict:
    """mean / std / interpolation from a preprocessor_config.json next to the weights (PIL resample codes)."""
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        return {}
    fix = "fix it, or remove it to use the family's own normalisation"
    doc = validate_doc(PreprocessorConfig, read_json(path, fix), path, fix)
    out: dict = {}
    if doc.image_mean is not None and doc.image_std is not None:
        for key, values in (("image_mean", doc.image_mean), ("image_std", doc.image_std)):
            if len(values) != channels:
                raise VitposError(f"{path}: key {key!r} has {len(values)} values for a model of {channels} input "
                                  f"channels; {fix}")
        out["mean"], out["std"] = tuple(doc.image_mean), tuple(doc.image_std)
    resample = {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(doc.resample if doc.resample is not None else -1)
    if resample:
        out["interpolation"] = resample
    return out


def classifier_labels(config: Any) -> tuple[str, ...] | None:
    """A classifier's class names in logit order from its config's id2label; None when transformers'
    placeholders (LABEL_0, ...) stand there: the names are then unknown, only their count is."""
    labels = getattr(config, "id2label", None) or {}
    try:
        names = tuple(str(labels[i]) for i in sorted(int(k) for k in labels))
    except (KeyError, ValueError, TypeError):
        return None
    if not names or all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return None
    return names


# sizes a config must have for a patch grid + prefix surface (StopIteration, division by zero otherwise),
# bounded as the timm: specs' (models.spec.SIZE_BOUNDS): a huge one must be refused, not allocated
_SIZE_BOUNDS = {"num_hidden_layers": 256, "hidden_size": 16384, "num_attention_heads": 1024, "patch_size": 4096,
                "image_size": 4096, "num_channels": 16, "intermediate_size": 1 << 18, "num_register_tokens": 1024}


def _check_config(config: Any, where: str) -> None:
    """One VitposError naming the key when the config cannot be a vision transformer of >= 1 layer."""
    _check_sizes({k: getattr(config, k, None) for k in _SIZE_BOUNDS}, where)
    heads, width = getattr(config, "num_attention_heads", None), getattr(config, "hidden_size", None)
    if isinstance(heads, int) and isinstance(width, int) and width % heads:
        raise VitposError(f"{where}: hidden_size {width} is not a multiple of num_attention_heads {heads}")
    size, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if isinstance(size, int) and isinstance(patch, int) and size < patch:
        raise VitposError(f"{where}: image_size {size} is smaller than patch_size {patch}: no patch fits")


def _check_sizes(values: Mapping[str, Any], where: str) -> None:
    """The size keys among `values` (a config.json's, a query's) within their bounds: checked before
    transformers sees them too, since a config builds lists of num_hidden_layers entries at init (a
    huge count would fill the memory before any model exists)."""
    for key, top in _SIZE_BOUNDS.items():
        value = values.get(key)
        low = 0 if key == "num_register_tokens" else 1
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if value is not None and (isinstance(v, bool) or not isinstance(v, int) or not low <= v <= top):
                raise VitposError(f"{where}: {key}={value!r}; it must be a whole number in {low}..{top}")


def _query_kwargs(query: str, defaults: dict[str, Any], where: str) -> dict[str, Any]:
    """A spec's ?key=value pairs, each a key of the config (`defaults`: its keys and default values): an
    unknown key is refused (transformers would keep it as an unused attribute, and nothing would change);
    a whole number where the config holds a float is that float (rope_theta=100)."""
    kwargs = {k: parse_query_value(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        accepted = sorted(k for k in defaults if not k.startswith("_"))
        raise VitposError(f"{where}: unknown query key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                          f"the config's keys are {', '.join(accepted)}")
    return {k: float(v) if isinstance(defaults[k], float) and isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in kwargs.items()}


def _config_keys(config: Any) -> dict[str, Any]:
    """The keys a spec's query may set on `config`, with their values: its own and num_labels (an init
    argument every config takes, stored as id2label)."""
    return {**config.to_dict(), "num_labels": int(getattr(config, "num_labels", 0) or 0)}


def _check_weights(model: nn.Module, where: str | Path) -> None:
    """NaN or infinity in any parameter or buffer: refused naming the file and the key, at load (not
    later as a probe's 'features contain NaN')."""
    check_finite(dict(model.state_dict()), where, "the weights are damaged or diverged; re-save or re-download them")


def load_hf(spec: str, checkpoint: str | Path | None = None) -> HFSurface:
    """An `hf:` spec behind the model surface (see the module docstring)."""
    tr = _transformers()
    body = spec[len("hf:"):]
    name, _, query = body.partition("?")
    if not name:
        raise VitposError("hf spec needs a class or a folder, e.g. hf:Dinov2Model?hidden_size=32 or hf:DIR")
    folder = Path(os.path.expanduser(name))
    preprocess: dict = {}
    if folder.is_dir():
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            raise VitposError(f"{folder} has no config.json; save the model with save_pretrained")
        fix = "save the model with save_pretrained, or fix the file"
        raw = read_json(cfg_path, fix)
        if not isinstance(raw, dict):
            raise VitposError(f"{cfg_path} holds a JSON {type(raw).__name__}, not an object of keys; {fix}")
        _check_sizes(raw, str(cfg_path))
        try:
            config = tr.AutoConfig.from_pretrained(folder, local_files_only=True)
            kwargs = _query_kwargs(query, _config_keys(config), spec)
            _check_sizes(kwargs, spec)
            if kwargs:
                config = tr.AutoConfig.from_pretrained(folder, local_files_only=True, **kwargs)
        except VitposError:
            raise
        except Exception as e:  # ValueError (no model_type: e.g. a `vitpos train` folder), JSON, query keys
            raise VitposError(f"{spec}: {cfg_path} is not a Hugging Face config transformers can read "
                              f"({' '.join(str(e).split())[:160]}); save the model with save_pretrained, or pass "
                              "a folder from `vitpos train` without the hf: prefix") from None
        _check_config(config, str(cfg_path))
        archs = list(getattr(config, "architectures", None) or [])
        cls_name = next((a for a in archs if a in _BY_CLASS or a in NO_SURFACE), archs[0] if archs else
                        type(config).__name__.replace("Config", "Model"))
        fam = _family_of(cls_name, spec)
        weights = Path(checkpoint) if checkpoint is not None else folder / "model.safetensors"
        if checkpoint is None and not weights.is_file():
            raise VitposError(f"{folder} has no model.safetensors (vitpos reads safetensors only); pass --checkpoint")
        preprocess = _read_preprocess(folder, int(config.num_channels))  # before the weights: the cheap check first
        model = _load_weights(_build(cls_name, config, str(cfg_path)), weights, spec)
        _check_weights(model, weights)
        return HFSurface(model, spec, fam, preprocess)
    if name in _BY_CLASS or name in NO_SURFACE:
        fam = _family_of(name, spec)
        config_cls = getattr(tr, fam.config_cls)
        kwargs = _query_kwargs(query, _config_keys(config_cls()), spec)
        _check_sizes(kwargs, spec)
        try:
            config = config_cls(**kwargs)
        except Exception as e:  # TypeError / ValueError / huggingface_hub's strict-dataclass validation errors
            raise VitposError(f"transformers could not build {spec!r}: {' '.join(str(e).split())[:200]}; check the "
                              f"?key=value names against {fam.config_cls}") from None
        _check_config(config, spec)
        model = _build(name, config, spec)
        if checkpoint is not None:
            model = _load_weights(model, Path(checkpoint), spec)
            _check_weights(model, checkpoint)
        return HFSurface(model, spec, fam)
    if "/" in name:  # a hub id: the local cache only
        if query:
            raise VitposError(f"{spec}: a cached hf:ORG/NAME takes no ?key=value (its config is the cached one, the "
                              "keys would be ignored); save it with save_pretrained and pass hf:DIR?key=value")
        try:
            config = tr.AutoConfig.from_pretrained(name, local_files_only=True)
        except OSError:
            raise VitposError(f"{spec}: {name} is not in the local Hugging Face cache and vitpos does not download; "
                              "save it with save_pretrained where the hub is reachable and pass hf:DIR, or pass "
                              "hf:CLASS?config-keys with --checkpoint FILE.safetensors") from None
        _check_config(config, f"{spec} (its cached config.json)")
        archs = list(getattr(config, "architectures", None) or [])
        cls_name = archs[0] if archs else type(config).__name__.replace("Config", "Model")
        fam = _family_of(cls_name, spec)
        try:
            model, info = getattr(tr, cls_name).from_pretrained(name, local_files_only=True, use_safetensors=True,
                                                                output_loading_info=True)
        except OSError:
            raise VitposError(f"{spec}: no safetensors weights for {name} in the local cache; pass "
                              "--checkpoint") from None
        except Exception as e:  # e.g. weights whose shapes disagree with the config (transformers' size mismatch)
            raise VitposError(f"{spec}: the cached weights do not fit its config ({' '.join(str(e).split())[:200]}); "
                              "re-download the model or pass --checkpoint") from None
        if _load_problems(info):
            raise VitposError(f"{spec}: the cached weights do not fit its config: {_load_problems(info)}")
        _check_weights(model, f"{spec} (its cached weights)")
        return HFSurface(model, spec, fam)
    raise VitposError(f"{spec}: {name!r} is neither a transformers class vitpos supports "
                      f"({', '.join(sorted(_BY_CLASS))}), an existing save_pretrained folder, nor an ORG/NAME in the "
                      "local Hugging Face cache")


def tiny_spec(key: str, **extra) -> str:
    """`hf:` spec of a family's toy config (the gates and tests)."""
    fam = FAMILIES[key]
    kw = {**fam.tiny, **extra}
    return f"hf:{fam.model_cls}?" + "&".join(f"{k}={v}" for k, v in kw.items())
