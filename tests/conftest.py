"""Shared tiny models: every test model is small enough for a 2-core CPU."""

from __future__ import annotations

import pytest
import torch

from vitpos.models.own import OwnViTConfig, build_own_vit
from vitpos.models.spec import OwnSurface, load_model

TINY = dict(img_size=16, patch_size=4, in_chans=3, num_classes=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
# timm models at toy size (pretrained=False): the real timm classes, just small; _Q is their shared size
_Q = "img_size=16&patch_size=4&depth=2&embed_dim=32&num_heads=2&num_classes=4"
TIMM_TINY = {
    "vit": f"timm:vit_small_patch16_224?{_Q}",
    "vit_reg": f"timm:vit_small_patch16_224?{_Q}&reg_tokens=2&no_embed_class=True",
    "deit3": f"timm:deit3_small_patch16_224?{_Q}",
    "rope_axial": f"timm:vit_small_patch16_rope_224?{_Q}&init_values=1.0",
    "rope_mixed": f"timm:vit_small_patch16_rope_mixed_224?{_Q}&init_values=1.0",
    "rope_ape": f"timm:vit_small_patch16_rope_ape_224?{_Q}&init_values=1.0",
    "dinov3": f"timm:vit_small_patch16_dinov3?{_Q}&init_values=1.0",
    "eva02": "timm:eva02_tiny_patch14_224?img_size=28&patch_size=7&depth=2&embed_dim=32&num_heads=2&num_classes=4",
}


def tiny_own(pe: str, seed: int = 0) -> OwnSurface:
    torch.manual_seed(seed)
    cfg = OwnViTConfig(pe=pe, **TINY)
    return OwnSurface(build_own_vit(cfg).eval(), f"tiny:{pe}", cfg)


def tiny_timm(key: str, seed: int = 0):
    torch.manual_seed(seed)
    return load_model(TIMM_TINY[key])


def images_for(surface, n: int = 3, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *surface.input_size, generator=g)


def permute_patches(images: torch.Tensor, perm: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Move image patch n to position perm-inverse: output patch m is input patch perm[m]."""
    B, C, Hp, Wp = images.shape
    H, W = grid
    ph, pw = Hp // H, Wp // W
    patches = images.reshape(B, C, H, ph, W, pw).permute(0, 2, 4, 1, 3, 5).reshape(B, H * W, C, ph, pw)
    patches = patches[:, perm]
    return patches.reshape(B, H, W, C, ph, pw).permute(0, 3, 1, 4, 2, 5).reshape(B, C, Hp, Wp)


@pytest.fixture
def own():
    return tiny_own
