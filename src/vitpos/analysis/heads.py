"""Fit a linear softmax classifier on a model's pooled pre-logit features (`vitpos head`).

Features: ``ModelSurface.pooled_features`` (timm's ``forward_head(forward_features(x),
pre_logits=True)``) of the first N train-split images, through the model's own preprocessing.
Solver: vitpos' multinomial logistic regression (``analysis.lbfgs.fit_softmax_heads``) on
standardised features; the l2 strength is chosen on val-split images from a small grid walked from
strong to weak with warm starts (ties keep the stronger l2), and the chosen fit is scored once on
test-split images. The standardisation is folded into the weights, so the head applies to raw
pooled features.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from vitpos.analysis.lbfgs import Design, all_finite, fit_softmax_heads, standardise_stats, standardised_design
from vitpos.data.base import require_classes
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.models.head import Head, HeadInfo
from vitpos.models.surface import ModelSurface
from vitpos.progress import progress_bar

HEAD_L2_GRID: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


@torch.no_grad()
def pooled_features(surface: ModelSurface, dataset, batch_size: int = 256, progress: bool = False,
                    desc: str = "pooled features") -> tuple[torch.Tensor, torch.Tensor]:
    """(n, D) float32 pooled features on the CPU and (n,) labels of every image of `dataset`."""
    feats, labels = [], []
    dev = surface.device
    total = (len(dataset) + batch_size - 1) // batch_size
    with progress_bar(enabled=progress) as bar:
        task = bar.add_task(desc, total=total)
        for x, y in dataset.batches(batch_size):
            feats.append(surface.pooled_features(x.to(dev)).float().cpu())
            labels.append(y)
            bar.update(task, advance=1)
    return torch.cat(feats), torch.cat(labels)


def _accuracy(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((torch.addmm(b, x, w).argmax(-1) == y).float().mean()) if len(y) else float("nan")


def fit_head_on_features(train: tuple[torch.Tensor, torch.Tensor], val: tuple[torch.Tensor, torch.Tensor],
                         num_classes: int, l2_grid: Sequence[float] = HEAD_L2_GRID, max_iter: int = 200,
                         tol: float = 1e-4) -> dict:
    """Fit on (x (n, D), y (n,)) train features, choose l2 on val; weight (K, D) and bias (K,) act on raw features."""
    x, y = train
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise VitposError(f"head features must be (n, D) with (n,) labels, got {tuple(x.shape)} and {tuple(y.shape)}")
    if len(y) < 2:
        raise VitposError(f"a head needs at least 2 training images, got {len(y)}")
    if int(y.min()) < 0 or int(y.max()) >= num_classes:
        raise VitposError(f"labels must be in [0, {num_classes - 1}], got [{int(y.min())}, {int(y.max())}]")
    x = x.float()
    if not all_finite(x):
        raise VitposError("pooled features contain NaN or inf; check the model's weights and inputs")
    grid = sorted({float(v) for v in l2_grid}, reverse=True)
    if not grid or any(not v > 0 for v in grid):
        raise VitposError(f"the l2 grid must hold positive numbers, got {list(l2_grid)}")
    mean, std = standardise_stats(x)
    design = Design(standardised_design(x, mean, std))
    xv, yv = val[0].float(), val[1]
    heads: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None
    memory: dict = {}
    by_l2: dict[float, float] = {}
    best: tuple[float, float, torch.Tensor, torch.Tensor] | None = None
    for l2 in grid:  # strong to weak: each fit warm-starts the next
        fitted = fit_softmax_heads(design, [y.long()], [num_classes], [l2], heads, max_iter=max_iter, tol=tol,
                                   memory=memory)
        heads = list(fitted)
        w_std, b_std = fitted[0]
        w = w_std / std[:, None]  # fold the standardisation: ((x - m) / s) @ W + b == x @ (W / s) + (b - (m / s) @ W)
        b = b_std - mean @ w
        acc = _accuracy(w, b, xv, yv) if len(yv) else _accuracy(w, b, x, y)
        by_l2[l2] = acc
        if best is None or acc > best[0]:
            best = (acc, l2, w, b)
    assert best is not None
    acc, l2, w, b = best
    return {"weight": w.T.contiguous(), "bias": b.contiguous(), "l2": l2, "val_top1": acc,
            "l2_grid": [float(v) for v in sorted(by_l2)], "val_top1_by_l2": [by_l2[v] for v in sorted(by_l2)]}


def fit_head(surface: ModelSurface, data: str = "shapes", n_images: int = 4000, n_val_images: int | None = None,
             n_test_images: int | None = None, seed: int = 0, out: str | Path | None = None, progress: bool = False,
             l2_grid: Sequence[float] = HEAD_L2_GRID) -> Head:
    """Fit a head on `surface`'s pooled features of `data`; writes OUT/head.safetensors + head.json when `out` is given.

    n_images train-split images fit it; n_val_images (default n_images // 4, at least 1) val-split
    images choose its l2; n_test_images (default: as many) test-split images score it."""
    if n_images < 2:
        raise VitposError(f"--images must be at least 2 to fit a head (got {n_images})")
    n_val = max(1, n_images // 4) if n_val_images is None else n_val_images
    n_test = n_val if n_test_images is None else n_test_images
    base = surface if surface.head is None else _without_head(surface)
    train_set = dataset_for(base, data, "train", limit=n_images, seed=seed)
    info = train_set.info
    require_classes(info, data_name(data))
    k = len(info.class_names)
    train = pooled_features(base, train_set, progress=progress, desc="head: train features")
    val_set = dataset_for(base, data, "val", limit=n_val, seed=seed)
    val = pooled_features(base, val_set, progress=progress, desc="head: val features")
    fit = fit_head_on_features(train, val, k, l2_grid)
    test_set = dataset_for(base, data, "test", limit=n_test, seed=seed)
    xt, yt = pooled_features(base, test_set, progress=progress, desc="head: test features")
    test_top1 = _accuracy(fit["weight"].T, fit["bias"], xt, yt)
    head_info = HeadInfo(model=surface.spec, weights=surface.weights_digest(), data=data_name(data),
                         classes=list(info.class_names), num_classes=k, width=int(train[0].shape[1]), l2=fit["l2"],
                         l2_grid=fit["l2_grid"], val_top1_by_l2=fit["val_top1_by_l2"], val_top1=fit["val_top1"],
                         test_top1=test_top1, n_train_images=len(train_set), n_val_images=len(val_set),
                         n_test_images=len(test_set), seed=seed)
    head = Head(fit["weight"], fit["bias"], head_info)
    if out is not None:
        head.save(out)
    return head


def _without_head(surface: ModelSurface) -> ModelSurface:
    import copy

    bare = copy.copy(surface)
    bare.head = None
    return bare


__all__ = ["HEAD_L2_GRID", "fit_head", "fit_head_on_features", "pooled_features"]
