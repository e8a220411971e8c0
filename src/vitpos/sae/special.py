"""Special tokens, on purpose: prefix tokens (CLS, registers) and high-norm outlier patch tokens.

Prefix tokens never reach an SAE here: captures and activation stores keep patch tokens only
(`vitpos.store`, `capture_condition`), and `sae_edit` passes prefix tokens through untouched.
High-norm outlier patch tokens (Darcet et al., "Vision Transformers Need Registers", 2024: a few
patch tokens of large ViTs carry norms several times the rest and hold global information) are
patch tokens by position, so they are detected by rule:

    a patch token is an outlier at a site when  ‖x‖ > k · median  of that site's patch-token norms,
    k = ``OUTLIER_K`` = 5.

Why a ratio and not median + k·MAD: on the shipped builtin models most patches are background,
so the MAD is tiny and median + 10·MAD flags ordinary shape patches (0.03 % of builtin:ape's
layer-1 tokens, 3 % of builtin:none's layer 5); their largest patch norm is 1.4-3.9x the median
(measured over 1000 test images, every layer of every builtin model), while the outliers of
register-less DINOv2 / ViT-L sit several times above the bulk. Every report also gives the share
at k = 3 and k = 8 (the rule's sensitivity): at k = 3, builtin:fashion-none's tokens would count.
By default outliers are left out of SAE training (and passed through unchanged when the SAE's
reconstruction is spliced in); ``--include-special`` keeps them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from pydantic import BaseModel

from vitpos.errors import VitposError

OUTLIER_K = 5.0
SENSITIVITY_K = (3.0, 5.0, 8.0)
RULE = "patch token norm > k x the median patch-token norm at the site"


def norm_threshold(norms: torch.Tensor, k: float = OUTLIER_K) -> float:
    """k x the median of a tensor of token norms."""
    x = norms.reshape(-1).float()
    if x.numel() == 0:
        raise VitposError("no tokens to compute an outlier threshold on")
    return float(k * x.median())


def prefix_names(surface) -> list[str]:
    """Names of the prefix tokens in order: "cls", "reg0", "reg1", ... (timm's layout: CLS first,
    then registers); "prefix<i>" where the model does not say."""
    n = int(surface.num_prefix_tokens)
    model = getattr(surface, "model", None)
    has_cls = getattr(model, "cls_token", None) is not None
    n_reg = int(getattr(model, "num_reg_tokens", 0) or 0)
    if has_cls + n_reg == n:
        return ["cls"] * has_cls + [f"reg{i}" for i in range(n_reg)]
    if n == 1:
        return ["cls"]
    return [f"prefix{i}" for i in range(n)]


class LayerSpecial(BaseModel):
    """One layer's special tokens (resid_post) on the held-out images."""

    layer: int
    median_patch_norm: float
    prefix_share: float  # prefix tokens / all tokens
    prefix_norm_ratio: list[float]  # per prefix token: its mean norm / the median patch-token norm
    outlier_threshold: float  # OUTLIER_K x median patch norm
    outlier_share: float  # share of patch tokens above it
    outlier_norm_ratio: float | None  # mean outlier norm / median patch norm (None: no outliers)
    outlier_share_by_k: dict[str, float]  # the rule's sensitivity: share at k = 3, 5, 8


class SpecialTokens(BaseModel):
    rule: str = RULE
    k: float = OUTLIER_K
    prefix: list[str]
    site: str = "resid_post"
    n_images: int
    layers: list[LayerSpecial]


def layer_special(layer: int, patch_norms: torch.Tensor, prefix_norms: torch.Tensor,
                  k: float = OUTLIER_K) -> LayerSpecial:
    """Stats of one layer from patch-token norms (images, N) and prefix-token norms (images, P)."""
    pn = patch_norms.reshape(-1).float()
    med = float(pn.median())
    thr = norm_threshold(pn, k)
    out = pn > thr
    denom = med if med > 0 else 1.0
    n_pre = prefix_norms.shape[1] if prefix_norms.ndim == 2 else 0
    by_k = {f"{kk:g}": float((pn > norm_threshold(pn, kk)).double().mean()) for kk in SENSITIVITY_K}
    return LayerSpecial(
        layer=layer, median_patch_norm=med,
        prefix_share=n_pre / (n_pre + patch_norms.shape[-1]) if patch_norms.ndim == 2 else 0.0,
        prefix_norm_ratio=[float(prefix_norms[:, j].float().mean()) / denom for j in range(n_pre)],
        outlier_threshold=thr, outlier_share=float(out.double().mean()),
        outlier_norm_ratio=float(pn[out].mean()) / denom if bool(out.any()) else None,
        outlier_share_by_k=by_k)


def special_token_report(surface, dataset, batch_size: int = 256, k: float = OUTLIER_K) -> SpecialTokens:
    """Per-layer prefix / outlier statistics at resid_post over `dataset` (one forward; only the
    token norms are kept: images x tokens x layers floats)."""
    from vitpos.analysis.forward import forward_batches
    from vitpos.hooks import capture
    from vitpos.models.surface import Site

    npt = int(surface.num_prefix_tokens)
    sites = [Site(i, "resid_post") for i in range(surface.depth)]
    norms: dict[str, list[torch.Tensor]] = {str(s): [] for s in sites}

    def sink(key: str, t: torch.Tensor) -> None:
        norms[key].append(t.float().norm(dim=-1).cpu())

    with torch.no_grad(), capture(surface, sites, sink=sink):
        for _ in forward_batches(surface, dataset, batch_size, check_classifier=False):
            pass
    layers = []
    for i, s in enumerate(sites):
        n = torch.cat(norms.pop(str(s)))
        layers.append(layer_special(i, n[:, npt:], n[:, :npt], k))
    return SpecialTokens(k=k, prefix=prefix_names(surface), n_images=len(dataset), layers=layers)


def store_norms(store, site: str, batch_images: int = 64) -> torch.Tensor:
    """Every patch token's norm at `site` of an activation store, (tokens,) float32 in stored order."""
    out = [acts.float().norm(dim=-1).reshape(-1) for acts, _, _ in store.iter_images(site, batch_images)]
    return torch.cat(out) if out else torch.zeros(0)


def drop_outliers(batches: Iterator[torch.Tensor], threshold: float | None,
                  counter: list[int]) -> Iterator[torch.Tensor]:
    """The token batches with tokens of norm > threshold removed (counted into counter[0]); a batch
    without any is yielded as is (the same tensor), so a model without outliers trains bit-identically."""
    for x in batches:
        if threshold is not None:
            keep = x.float().norm(dim=-1) <= threshold
            if not bool(keep.all()):
                counter[0] += int((~keep).sum())
                x = x[keep]
        yield x


def mix_prefix(batches: Iterator[torch.Tensor], store, site: str, seed: int = 0) -> Iterator[torch.Tensor]:
    """``--include-special`` with a store that kept prefix tokens: each patch-token batch gets its
    share of the store's prefix tokens (P per N patch tokens, in stored order) and is shuffled within
    itself; prefix tokens still unread when the patch tokens run out (the dropped tail's share) are
    dropped too. The prefix stream is read through its own reader, a few images at a time."""
    from vitpos.store.reader import ActivationStore

    P, N = int(store.num_prefix_tokens), int(store.num_patches)
    pre = (a.reshape(-1, a.shape[-1]).float() for a, _, _ in ActivationStore(store.dir).iter_images(site, 64,
                                                                                                   prefix=True))
    pending: torch.Tensor | None = None
    g = torch.Generator().manual_seed(int(seed))
    owed = 0.0
    for x in batches:
        owed += x.shape[0] * P / N
        need = int(owed)
        owed -= need
        while need and (pending is None or pending.shape[0] < need):
            nxt = next(pre, None)
            if nxt is None:
                break
            pending = nxt if pending is None else torch.cat([pending, nxt])
        if need and pending is not None and pending.shape[0]:
            take, pending = pending[:need], pending[need:]
            x = torch.cat([x, take.to(x.dtype)])
            x = x[torch.randperm(x.shape[0], generator=g)]
        yield x


__all__ = ["OUTLIER_K", "RULE", "LayerSpecial", "SpecialTokens", "drop_outliers", "layer_special", "mix_prefix",
           "norm_threshold", "prefix_names", "special_token_report", "store_norms"]
