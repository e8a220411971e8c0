"""The random draws of a position-probe fit (`vitpos.analysis.probes`), each from the seed alone and
on its own stream: the image split (train = fit + val, test), the training-token sample and the
control task's labels. Fixed before any activation exists, so a capture can keep only what a fit reads.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vitpos.errors import VitposError


def stream_seed(seed: int, stream: str) -> int:
    """Independent seed per random stream, so e.g. changing the token cap never moves the split."""
    return int.from_bytes(hashlib.sha256(f"{stream}:{int(seed)}".encode()).digest()[:4], "little")


def check_grid(grid: Any) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in grid)
    except (TypeError, ValueError):
        raise VitposError(f"grid must be a pair (H, W) of positive ints, got {grid!r}") from None
    if h < 1 or w < 1 or (h, w) != tuple(grid):
        raise VitposError(f"grid must be a pair (H, W) of positive ints, got {grid!r}")
    return h, w


def control_labels(grid: Sequence[int], target: str, seed: int = 0) -> torch.Tensor:
    """(H*W,) control label of each grid position: a fixed random map, the same for every image.

    Labels live in {0..H-1} for target 'row' and {0..W-1} for 'col'. The map is a randomly
    permuted Latin rectangle, label(r, c) = s[(p[r] + q[c]) mod K], so every label occurs (about)
    equally often in each row and in each column. Why: the control labels then carry no
    information about the row alone or the column alone, so a control probe does better than
    chance only by exploiting joint position identity (memorisation), never by reading the very
    row/column code the real probe is meant to find.
    """
    h, w = check_grid(grid)
    if target not in ("row", "col"):
        raise VitposError(f"target must be 'row' or 'col', got {target!r}")
    k = h if target == "row" else w
    # Row and column maps differ even on square grids (else the two controls would be one task).
    g = torch.Generator().manual_seed(stream_seed(seed, f"control-{target}"))
    p = torch.randperm(h, generator=g)
    q = torch.randperm(w, generator=g)
    s = torch.randperm(k, generator=g)
    return s[(p[:, None] + q[None, :]) % k].reshape(-1)


@dataclass(frozen=True)
class ProbeSplit:
    """Row indices (into the features' image axis) of each split; fit + val = train."""

    train: torch.Tensor
    fit: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor


def split_images(
    image_ids: Sequence[Any] | torch.Tensor | int,
    *,
    seed: int = 0,
    test_frac: float = 0.25,
    val_frac: float = 0.2,
) -> ProbeSplit:
    """Split images into train (= fit + val) and test, grouping rows that share an image id.

    `image_ids` is the id of each feature row (or an int: the number of rows, ids 0..n-1). Rows
    with equal ids (e.g. several crops of one source image) always land in the same split.
    """
    if isinstance(image_ids, int):
        ids = list(range(image_ids))
    elif isinstance(image_ids, torch.Tensor):
        ids = image_ids.reshape(-1).tolist()
    else:
        ids = list(image_ids)
    if not (0.0 < test_frac < 1.0) or not (0.0 < val_frac < 1.0):
        raise VitposError(f"test_frac and val_frac must be in (0, 1), got {test_frac} and {val_frac}")
    groups: dict[Any, list[int]] = {}
    for row, i in enumerate(ids):
        groups.setdefault(i, []).append(row)
    uniq = list(groups)
    n = len(uniq)
    n_test = max(1, round(test_frac * n))
    n_val = max(1, round(val_frac * (n - n_test)))
    if n - n_test - n_val < 1:
        raise VitposError(
            f"need at least 3 distinct images to split into fit/val/test, got {n}; probe more images"
        )
    g = torch.Generator().manual_seed(stream_seed(seed, "split"))
    order = torch.randperm(n, generator=g).tolist()

    def rows(group_idx: list[int]) -> torch.Tensor:
        return torch.tensor(sorted(r for j in group_idx for r in groups[uniq[j]]), dtype=torch.long)

    test, val, fit = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]
    return ProbeSplit(train=rows(val + fit), fit=rows(fit), val=rows(val), test=rows(test))


def sample_train_tokens(
    images: torch.Tensor, num_patches: int, max_tokens: int | None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(image_idx, patch_idx) of the training tokens: all tokens, or at most `max_tokens`.

    When capped, positions are dealt round-robin from shuffled decks, so every position (hence
    every row/column class) appears equally often (+-1) and each image contributes equally.
    """
    images = images.reshape(-1).long()
    n_img = images.numel()
    total = n_img * num_patches
    if max_tokens is None or max_tokens >= total:
        img = images.repeat_interleave(num_patches)
        patch = torch.arange(num_patches).repeat(n_img)
        return img, patch
    if max_tokens < 1:
        raise VitposError(f"max_train_tokens must be >= 1, got {max_tokens}")
    per_img = max(1, max_tokens // n_img)
    g = torch.Generator().manual_seed(stream_seed(seed, "tokens"))
    n_decks = math.ceil(n_img * per_img / num_patches)
    deck = torch.cat([torch.randperm(num_patches, generator=g) for _ in range(n_decks)])
    patch = deck[: n_img * per_img].reshape(n_img, per_img)
    img = images[:, None].expand(n_img, per_img)
    keep = torch.randperm(n_img * per_img, generator=g)[:max_tokens].sort().values
    return img.reshape(-1)[keep], patch.reshape(-1)[keep]
