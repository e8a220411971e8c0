"""State-dict mapping between timm and Hugging Face transformers for the families both implement.

  family   timm model (class)                          transformers model
  vit      vit_* (VisionTransformer)                   ViTModel / ViTForImageClassification
  deit     deit_*_distilled_* (VisionTransformerDistilled)  DeiTModel
  dinov2   vit_*_dinov2 (VisionTransformer, layer scale) Dinov2Model
  dinov3   vit_*_dinov3 (Eva, rope_type='dinov3')       DINOv3ViTModel

timm fuses q, k, v into one `attn.qkv` (out features [q; k; v]); transformers keeps q_proj, k_proj,
v_proj. Everything else is a rename. `hf_config_for_timm` reads the transformers config off a timm
model (width, depth, heads, MLP width, norm eps, biases, registers) so the two compute the same function.
transformers-only parameters that inference never reads (the mask token) are filled with zeros.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from vitpos.errors import VitposError

# timm key -> transformers base-model key; {i} is the block index. Layer prefix and per-family names below.
_LAYER = {"vit": "layers.{i}", "deit": "layers.{i}", "dinov2": "encoder.layer.{i}", "dinov3": "model.layer.{i}"}
_NORMS = {"vit": ("layernorm_before", "layernorm_after", "layernorm"),
          "deit": ("layernorm_before", "layernorm_after", "layernorm"),
          "dinov2": ("norm1", "norm2", "layernorm"), "dinov3": ("norm1", "norm2", "norm")}


def _renames(family: str) -> list[tuple[str, str]]:
    if family not in _LAYER:
        raise VitposError(f"no timm <-> transformers mapping for {family!r}; mapped: {', '.join(_LAYER)}")
    L = _LAYER[family]
    n1, n2, nf = _NORMS[family]
    patch = "embeddings.patch_embeddings" if family == "dinov3" else "embeddings.patch_embeddings.projection"
    out = [("cls_token", "embeddings.cls_token"), ("patch_embed.proj.weight", f"{patch}.weight"),
           ("patch_embed.proj.bias", f"{patch}.bias"), ("norm.weight", f"{nf}.weight"), ("norm.bias", f"{nf}.bias"),
           ("blocks.{i}.norm1.weight", f"{L}.{n1}.weight"), ("blocks.{i}.norm1.bias", f"{L}.{n1}.bias"),
           ("blocks.{i}.norm2.weight", f"{L}.{n2}.weight"), ("blocks.{i}.norm2.bias", f"{L}.{n2}.bias"),
           ("blocks.{i}.attn.proj.weight", f"{L}.attention.o_proj.weight"),
           ("blocks.{i}.attn.proj.bias", f"{L}.attention.o_proj.bias")]
    fc1, fc2 = ("up_proj", "down_proj") if family == "dinov3" else ("fc1", "fc2")
    for t, h in (("fc1", fc1), ("fc2", fc2)):
        out += [(f"blocks.{{i}}.mlp.{t}.weight", f"{L}.mlp.{h}.weight"),
                (f"blocks.{{i}}.mlp.{t}.bias", f"{L}.mlp.{h}.bias")]
    if family in ("vit", "deit", "dinov2"):
        out.append(("pos_embed", "embeddings.position_embeddings"))
    if family == "deit":
        out.append(("dist_token", "embeddings.distillation_token"))
    if family == "dinov2":
        out += [("blocks.{i}.ls1.gamma", f"{L}.layer_scale1.lambda1"),
                ("blocks.{i}.ls2.gamma", f"{L}.layer_scale2.lambda1")]
    if family == "dinov3":
        out += [("reg_token", "embeddings.register_tokens"), ("blocks.{i}.gamma_1", f"{L}.layer_scale1.lambda1"),
                ("blocks.{i}.gamma_2", f"{L}.layer_scale2.lambda1")]
    return out


def _match(pattern: str, key: str) -> str | None:
    """The block index if `key` fits `pattern` ('' for a pattern without {i}), else None."""
    rx = "^" + re.escape(pattern).replace(r"\{i\}", r"(\d+)") + "$"
    m = re.match(rx, key)
    return None if m is None else (m.group(1) if m.groups() else "")


def timm_to_hf(state: dict[str, torch.Tensor], family: str, classifier: str | None = None) -> dict[str, torch.Tensor]:
    """transformers base-model state dict from a timm one; `classifier`: the prefix of a *ForImageClassification
    model (e.g. 'vit'), whose `classifier` takes timm's `head`."""
    out: dict[str, torch.Tensor] = {}
    L = _LAYER[family]
    renames = _renames(family)
    left = []
    for key, t in state.items():
        m = re.match(r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", key)
        if m:
            q, k, v = t.chunk(3, dim=0)
            base = L.format(i=m.group(1))
            for name, part in (("q", q), ("k", k), ("v", v)):
                out[f"{base}.attention.{name}_proj.{m.group(2)}"] = part.clone()
            continue
        for tp, hp in renames:
            i = _match(tp, key)
            if i is not None:
                out[hp.format(i=i)] = t
                break
        else:
            left.append(key)
    heads = [k for k in left if k.startswith("head.")]
    left = [k for k in left if k not in heads and not k.startswith("head_dist.")]
    if left:
        raise VitposError(f"timm keys without a transformers counterpart for {family}: {left[:6]}")
    if classifier is not None:
        out = {f"{classifier}.{k}": v for k, v in out.items()}
        out.update({f"classifier.{k[len('head.'):]}": state[k] for k in heads})
    return out


def hf_to_timm(state: dict[str, torch.Tensor], family: str, classifier: str | None = None) -> dict[str, torch.Tensor]:
    """The inverse of `timm_to_hf` (transformers-only parameters such as the mask token are dropped)."""
    if classifier is not None:
        heads = {f"head.{k[len('classifier.'):]}": v for k, v in state.items() if k.startswith("classifier.")}
        state = {k[len(classifier) + 1:]: v for k, v in state.items() if k.startswith(classifier + ".")}
    else:
        heads = {}
    L = _LAYER[family]
    out: dict[str, torch.Tensor] = dict(heads)
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    rx = "^" + re.escape(L).replace(r"\{i\}", r"(\d+)") + r"\.attention\.([qkv])_proj\.(weight|bias)$"
    inverse = [(hp, tp) for tp, hp in _renames(family)]
    for key, t in state.items():
        m = re.match(rx, key)
        if m:
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = t
            continue
        for hp, tp in inverse:
            i = _match(hp, key)
            if i is not None:
                out[tp.format(i=i)] = t
                break
    for (i, kind), parts in qkv.items():
        out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


def hf_config_for_timm(model: nn.Module, family: str) -> dict[str, Any]:
    """Keyword arguments for the transformers config class that make it compute what the timm `model` does."""
    m: Any = model
    blk: Any = m.blocks[0]
    attn: Any = blk.attn
    pe: Any = m.patch_embed
    img = [int(v) for v in pe.img_size]
    patch = int(pe.patch_size[0])
    width, depth, heads = int(m.embed_dim), len(m.blocks), int(attn.num_heads)
    hidden = int(blk.mlp.fc1.out_features)
    cfg: dict[str, Any] = dict(image_size=img[0], patch_size=patch, hidden_size=width, num_hidden_layers=depth,
                               num_attention_heads=heads, num_channels=int(pe.proj.in_channels),
                               layer_norm_eps=float(blk.norm1.eps))
    has_bias = getattr(getattr(attn, "qkv", None), "bias", None) is not None
    if family in ("vit", "deit"):
        cfg.update(intermediate_size=hidden, qkv_bias=has_bias, hidden_act="gelu")
    elif family == "dinov2":
        ratio = hidden / width
        cfg.update(mlp_ratio=int(ratio) if ratio == int(ratio) else ratio,  # the config field is strict about int
                   qkv_bias=has_bias, hidden_act="gelu", layerscale_value=1.0)
    elif family == "dinov3":
        cfg.update(intermediate_size=hidden, query_bias=has_bias, key_bias=has_bias, value_bias=has_bias,
                   proj_bias=attn.proj.bias is not None, mlp_bias=blk.mlp.fc1.bias is not None,
                   num_register_tokens=int(getattr(m, "num_reg_tokens", 0) or m.num_prefix_tokens - 1),
                   rope_theta=100.0, pos_embed_rescale=None)
    else:
        raise VitposError(f"no timm <-> transformers mapping for {family!r}")
    return cfg


def hf_from_timm(model: nn.Module, family: str, classifier: bool = False) -> nn.Module:
    """The transformers twin of a timm model: its config from `hf_config_for_timm`, its weights mapped, loaded
    strictly (only the mask token, which inference never reads, is left at transformers' zeros)."""
    from vitpos.models.hf_families import FAMILIES, require_transformers

    tr = require_transformers()
    fam = FAMILIES[family]
    kwargs = hf_config_for_timm(model, family)
    if classifier:
        kwargs["num_labels"] = int(getattr(model, "num_classes", 0))
    config = getattr(tr, fam.config_cls)(**kwargs)
    cls_name = fam.classifier_cls if classifier else fam.model_cls
    assert cls_name is not None
    hf: Any = getattr(tr, cls_name)(config)
    prefix = hf.base_model_prefix if classifier else None
    state = timm_to_hf(model.state_dict(), family, classifier=prefix)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("mask_token") and ".pooler." not in f".{k}"]
    if missing or unexpected:
        raise VitposError(f"timm -> transformers {family}: missing {missing[:6]}, unexpected {unexpected[:6]}")
    return hf.eval()
