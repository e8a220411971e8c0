"""One streaming pass over held-out images: what the latent browser shows, in bounded memory.

Per batch of images the SAE's codes z (B, N, F) are computed at its site and folded into

* the positional scores of `vitpos.sae.features` (per-cell sums (N, F), per-latent sums of
  squares and firing counts: η² per axis, firing rate, the row x column mean map, the type);
* per-latent sums of z over firing tokens (mean activation when firing) and its maximum;
* per class group, the sum of z and the token count (the class-group breakdown);
* the top-k images per latent: only (score, image, patch) per latent and slot, (k, F) each,
  merged with the batch's per-image maxima and cut back to k;
* each patch token's norm (4 bytes a token; the outlier marks).

So what the pass holds is O(F·(N + k + groups)) numbers plus one batch of codes, whatever the
number of images; the batch is sized so its codes stay under ``CODE_BUDGET`` floats. The heatmaps
are then recomputed for the winners only (`heatmaps`): a second forward over the images that
won a slot, keeping z[:, :, f] for the latents they won.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from vitpos.errors import VitposError
from vitpos.sae.features import FeatureScores, score_codes

CODE_BUDGET = 1 << 22  # floats of codes per batch (16 MiB): images per batch = budget // (N * F)


@dataclass
class Collected:
    scores: FeatureScores
    n_images: int
    mean_act: Tensor  # (F,) mean of z over the tokens where it fires (0 when it never does)
    max_act: Tensor  # (F,)
    top_score: Tensor  # (F, k) descending; 0 = empty slot
    top_image: Tensor  # (F, k) long, -1 = empty
    top_patch: Tensor  # (F, k) long, -1 = empty
    group_names: list[str] = field(default_factory=list)
    group_mean: Tensor | None = None  # (F, G) mean z over the tokens of each class group's images
    group_fire: Tensor | None = None  # (F, G) firing rate within each group
    labels: Tensor | None = None  # (images,)
    patch_norms: Tensor | None = None  # (images, N)
    peak_state_bytes: int = 0  # the pass's own state (accumulators + top-k + norms), measured


class _Reached(Exception):
    """Raised by the capture sink once the SAE's site is computed: the blocks after it are not run."""


def _site_tokens(surface, x: Tensor, got: dict[str, Tensor]) -> Tensor:
    """The site's tokens (B, T, D) of images x; the forward stops at the site."""
    try:
        surface(x)
    except _Reached:
        pass
    return got.pop("x")


def batch_images(num_patches: int, n_latents: int, budget: int = CODE_BUDGET) -> int:
    return max(1, budget // max(1, num_patches * n_latents))


def _merge_topk(score: Tensor, image: Tensor, patch: Tensor, z: Tensor, first: int) -> tuple[Tensor, Tensor, Tensor]:
    """Merge a batch's per-image maxima (z: (B, N, F), images first..first+B-1) into the (F, k) slots."""
    k = score.shape[1]
    m, arg = z.max(1)  # (B, F)
    B = m.shape[0]
    cand_s = torch.cat([score, m.T], 1)  # (F, k + B)
    cand_i = torch.cat([image, torch.arange(first, first + B).expand(m.shape[1], B)], 1)
    cand_p = torch.cat([patch, arg.T], 1)
    # stable: equal scores keep the earlier image, so the slots do not depend on the batch size
    order = torch.sort(-cand_s, dim=1, stable=True).indices[:, :k]
    s = cand_s.gather(1, order)
    i = cand_i.gather(1, order)
    p = cand_p.gather(1, order)
    empty = s <= 0
    return s.masked_fill(empty, 0.0), i.masked_fill(empty, -1), p.masked_fill(empty, -1)


@torch.no_grad()
def collect(surface, sae, site, dataset, *, top_k: int = 8, batch_size: int | None = None) -> Collected:
    """The browser's per-latent numbers over `dataset` (one forward per image)."""
    from vitpos.hooks import capture

    if top_k < 1:
        raise VitposError(f"--top-k must be >= 1 (got {top_k})")
    npt, N, F = int(surface.num_prefix_tokens), surface.num_patches, sae.d_sae
    B = batch_size or batch_images(N, F)
    info = dataset.info
    groups = {str(g): list(ids) for g, ids in (getattr(info, "class_groups", None) or {}).items()}
    G = len(groups)
    dev = next(surface.model.parameters()).device
    sae = sae.to(dev).eval()
    st = {
        "score": torch.zeros(F, top_k), "image": torch.full((F, top_k), -1, dtype=torch.long),
        "patch": torch.full((F, top_k), -1, dtype=torch.long),
        "sum_fire": torch.zeros(F, dtype=torch.float64), "n_fire": torch.zeros(F, dtype=torch.float64),
        "max": torch.zeros(F), "g_sum": torch.zeros(F, G, dtype=torch.float64),
        "g_fire": torch.zeros(F, G, dtype=torch.float64), "g_tok": torch.zeros(G, dtype=torch.float64),
    }
    labels, norms = [], []
    seen = 0
    got: dict[str, Tensor] = {}

    def sink(key: str, t: Tensor) -> None:
        got["x"] = t
        raise _Reached

    def codes():
        nonlocal seen
        with capture(surface, [site], to_cpu=False, sink=sink):
            for x, y in dataset.batches(B):
                acts = _site_tokens(surface, x.to(dev), got)[:, npt:].float()
                z = sae.encode(acts).cpu()
                norms.append(acts.norm(dim=-1).cpu())
                labels.append(y.cpu())
                st["score"], st["image"], st["patch"] = _merge_topk(st["score"], st["image"], st["patch"], z, seen)
                zd = z.double()
                fire = z > 0
                st["sum_fire"] += zd.sum((0, 1))
                st["n_fire"] += fire.sum((0, 1)).double()
                st["max"] = torch.maximum(st["max"], z.amax((0, 1)))
                for j, ids in enumerate(groups.values()):
                    sel = torch.isin(y.cpu(), torch.tensor(ids))
                    if bool(sel.any()):
                        st["g_sum"][:, j] += zd[sel].sum((0, 1))
                        st["g_fire"][:, j] += fire[sel].sum((0, 1)).double()
                        st["g_tok"][j] += int(sel.sum()) * N
                seen += x.shape[0]
                yield z

    scores = score_codes(codes(), surface.grid)
    state_bytes = sum(t.numel() * t.element_size() for t in st.values())
    state_bytes += scores.cell_means.numel() * 8 * 2  # the scorer's float64 cell sums (N, F) and its copy
    n_fire = st["n_fire"]
    g_tok = st["g_tok"].clamp_min(1)
    patch_norms = torch.cat(norms) if norms else torch.zeros(0, N)
    return Collected(
        scores=scores, n_images=seen,
        mean_act=(st["sum_fire"] / n_fire.clamp_min(1)).float(), max_act=st["max"],
        top_score=st["score"], top_image=st["image"], top_patch=st["patch"],
        group_names=list(groups), group_mean=(st["g_sum"] / g_tok).float() if G else None,
        group_fire=(st["g_fire"] / g_tok).float() if G else None,
        labels=torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long), patch_norms=patch_norms,
        peak_state_bytes=state_bytes + patch_norms.numel() * 4)


@torch.no_grad()
def heatmaps(surface, sae, site, dataset, images: Tensor, latents: Tensor, batch_size: int = 64) -> Tensor:
    """z[image, :, latent] for each (image, latent) pair, (P, N): a forward over the distinct images only."""
    from vitpos.hooks import capture

    npt = int(surface.num_prefix_tokens)
    out = torch.zeros(len(images), surface.num_patches)
    if len(images) == 0:
        return out
    uniq = torch.unique(images)
    sub = _select(dataset, uniq)
    dev = next(surface.model.parameters()).device
    got: dict[str, Tensor] = {}

    def sink(key: str, t: Tensor) -> None:
        got["x"] = t
        raise _Reached

    pos = 0
    with capture(surface, [site], to_cpu=False, sink=sink):
        for x, _ in sub.batches(batch_size):
            z = sae.encode(_site_tokens(surface, x.to(dev), got)[:, npt:].float()).cpu()  # (b, N, F)
            ids = uniq[pos:pos + x.shape[0]]
            for j, img in enumerate(ids.tolist()):
                pairs = (images == img).nonzero().squeeze(1)
                out[pairs] = z[j][:, latents[pairs]].T
            pos += x.shape[0]
    return out


def _select(dataset, ids: Tensor):
    """The dataset restricted to `ids` (in that order)."""
    from vitpos.data.base import TensorImageDataset

    if isinstance(dataset, TensorImageDataset):
        return TensorImageDataset(dataset.images[ids], dataset.labels[ids], dataset.info, dataset.split,
                                  dataset.transform)
    return _Subset(dataset, ids.tolist())


class _Subset:
    def __init__(self, dataset, ids: list[int]):
        self.dataset, self.ids, self.info = dataset, ids, dataset.info

    def __len__(self) -> int:
        return len(self.ids)

    def batches(self, batch_size: int):
        for s in range(0, len(self.ids), batch_size):
            items = [self.dataset[i] for i in self.ids[s:s + batch_size]]
            yield torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def thumbnail_pixels(dataset, ids: list[int]) -> list[Tensor]:
    """uint8 (H, W, 3) pictures of images `ids`: the stored pixels when the data keeps them, else the
    model input min-max scaled per image (any normalisation shows)."""
    out = []
    raw = getattr(dataset, "images", None)
    for i in ids:
        if isinstance(raw, Tensor) and raw.dtype == torch.uint8:
            img = raw[i]
        else:
            x = dataset[i][0].float()
            lo, hi = x.amin(), x.amax()
            img = ((x - lo) / (hi - lo).clamp_min(1e-8) * 255).round().to(torch.uint8)
        if img.shape[0] == 1:
            img = img.expand(3, -1, -1)
        out.append(img[:3].permute(1, 2, 0).contiguous())
    return out
