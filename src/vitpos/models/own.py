"""vitpos' own small ViTs: timm's `Eva` (its real attention, RoPE and APE modules) at a CPU size.

Every --pe builds the same timm `Eva` with the same blocks (timm's `AttentionRope`); only the
positional encoding differs, so APE vs RoPE comparisons are matched architectures:
  ape         learned absolute embedding added to patch tokens (no_embed_class, as naver's APE ViTs)
  ape-sincos  fixed 2D sin-cos absolute embedding (timm's build_sincos2d_pos_embed, frozen)
  rope-axial  timm RotaryEmbeddingCat, grid 'xy': half of each head's pairs turn with the column,
              half with the row (naver's vit_*_rope_224 layout)
  rope-mixed  timm RotaryEmbeddingMixed: learned per-layer, per-head 2D frequencies
  rope-ape    rope-axial plus a learned APE (naver's vit_*_rope_ape_224)
  none        no positional signal at all (control: a bag of patches)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from timm.models.eva import Eva

OwnViT = Eva  # the model class of vitpos' own ViTs (what build_own_vit returns)
PE = Literal["ape", "ape-sincos", "rope-axial", "rope-mixed", "rope-ape", "rope-mixed-ape", "none"]
PE_CHOICES: tuple[str, ...] = ("ape", "ape-sincos", "rope-axial", "rope-mixed", "rope-ape", "rope-mixed-ape", "none")
APE_PES = ("ape", "ape-sincos", "rope-ape", "rope-mixed-ape")


class OwnViTConfig(BaseModel):
    """Everything needed to rebuild one of vitpos' own ViTs (written to config.json)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # bounded: a config.json is user input, and a zero or huge size must be refused, not built
    family: Literal["vitpos-own"] = "vitpos-own"
    pe: PE
    img_size: int = Field(default=32, ge=1, le=4096)
    patch_size: int = Field(default=4, ge=1, le=4096)
    in_chans: int = Field(default=3, ge=1, le=16)
    num_classes: int = Field(default=4, ge=0, le=100_000)
    embed_dim: int = Field(default=96, ge=1, le=16384)
    depth: int = Field(default=6, ge=1, le=256)
    num_heads: int = Field(default=4, ge=1, le=1024)
    mlp_ratio: float = Field(default=2.0, gt=0, le=64)
    # naver's RoPE ViTs use 100 for axial and 10 for mixed; small grids need no other value.
    rope_temperature: float | None = Field(default=None, gt=0, description="None = 100 axial / 10 mixed")
    # Learned APE starts from the 2D sin-cos table: from timm's default tiny random init
    # (std 0.02) the CPU-budget runs never found the positional signal (test top-1 = chance).
    ape_init: Literal["sincos", "trunc_normal"] = "sincos"

    @model_validator(mode="after")
    def _fits(self) -> OwnViTConfig:
        if self.img_size % self.patch_size:
            raise ValueError(f"img_size {self.img_size} is not a multiple of patch_size {self.patch_size}")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not a multiple of num_heads {self.num_heads}")
        return self

    @property
    def grid(self) -> tuple[int, int]:
        n = self.img_size // self.patch_size
        return (n, n)


def build_own_vit(cfg: OwnViTConfig) -> OwnViT:
    uses_rope = cfg.pe.startswith("rope")
    mixed = cfg.pe in ("rope-mixed", "rope-mixed-ape")
    temperature = cfg.rope_temperature if cfg.rope_temperature is not None else (10.0 if mixed else 100.0)
    model = Eva(
        img_size=cfg.img_size,
        patch_size=cfg.patch_size,
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        global_pool="token",
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        attn_type="rope",
        qkv_bias=True,
        class_token=True,
        no_embed_class=True,
        use_abs_pos_emb=cfg.pe in APE_PES,
        use_rot_pos_emb=uses_rope,
        rope_type="mixed" if mixed else "cat",
        rope_grid_indexing="xy",
        rope_temperature=temperature,
    )
    pos_embed = model.pos_embed  # present exactly when use_abs_pos_emb (always for ape-sincos)
    if pos_embed is not None and (cfg.pe == "ape-sincos" or cfg.ape_init == "sincos"):
        table = build_sincos2d_pos_embed(list(cfg.grid), dim=cfg.embed_dim, temperature=10000.0)
        pos_embed.data.copy_(table.unsqueeze(0))
        if cfg.pe == "ape-sincos":
            pos_embed.requires_grad_(False)
    return model


def decay_exempt(model: OwnViT) -> set[str]:
    """Parameter names (or their top-level module) trained without weight decay: timm's
    no_weight_decay list (pos_embed, cls_token, rope freqs)."""
    return set(model.no_weight_decay())
