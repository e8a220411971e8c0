"""The Hugging Face `transformers` vision families vitpos supports (`hf:` specs): where each keeps what
the surface needs, its normalisation, its toy config for the gates, and what a config says about its
classes. `vitpos.models.hf_adapter` puts a family behind the model surface; `vitpos.models.hf_load`
builds or loads one from a spec."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from vitpos.errors import VitposError

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
BY_CLASS = {c: f for f in FAMILIES.values() for c in (f.model_cls, f.classifier_cls) if c}
# Vision towers asked for that do not fit a patch grid + prefix surface (see README, "Hugging Face models").
NO_SURFACE = {
    "PixtralVisionModel": "it takes a list of variable-size images flattened into one sequence with a block-diagonal "
                          "mask and has no prefix token or pooled output",
    "Qwen2VisionTransformerPretrainedModel": "its Conv3d patches are reordered into 2x2 merge windows and merged "
                                             "before the output, so its tokens are not a row-major patch grid",
}


def require_transformers():
    try:
        import transformers
    except ImportError as e:
        raise VitposError("hf: specs need Hugging Face transformers; install it with `pip install 'vitpos[hf]'`") from e
    return transformers


def family_of(cls_name: str, spec: str) -> HFFamily:
    if cls_name in NO_SURFACE:
        raise VitposError(f"{spec}: {cls_name} has no vitpos surface: {NO_SURFACE[cls_name]}; use one of "
                          f"{', '.join(sorted(BY_CLASS))}")
    fam = BY_CLASS.get(cls_name)
    if fam is None:
        raise VitposError(f"{spec}: {cls_name!r} is not a transformers vision family vitpos supports; use one of "
                          f"{', '.join(sorted(BY_CLASS))} (hf:CLASS?key=value for a random-init config, hf:DIR for "
                          "a save_pretrained folder)")
    return fam


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


def tiny_spec(key: str, **extra) -> str:
    """`hf:` spec of a family's toy config (the gates and tests)."""
    fam = FAMILIES[key]
    kw = {**fam.tiny, **extra}
    return f"hf:{fam.model_cls}?" + "&".join(f"{k}={v}" for k, v in kw.items())
