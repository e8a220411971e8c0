"""`regions`: which photo a crop comes from, with training and test crops from disjoint regions.

A content classification task on natural images (issue 47 item 5: C2 as the study means it, the
top-1 of a content classifier) built from `natural`'s photos (same SOURCES, same licences, same crop
rule: area SCALE of its region, aspect ASPECT, resized to SIZE, mirrored with probability 1/2). The
label is the source photo (8 classes, as `natural`), but the splits do not share pixels: `train` and
`val` crops lie wholly in the left TRAIN_SHARE of each photo's width, `test` crops wholly in the rest.
So test top-1 measures recognising a scene from a part of it never seen in training, not from new
views of the same pixels (`natural`'s test crops overlap its training crops). The label ignores
where a crop sits by design (a crop's place in its region is random, and it is flipped at random).

Each split has its own seed stream (split_seed(seed, "regions", split)), so no crop is shared with
`natural` or `tiles`; crop i of a split is a pure function of (seed, split, i), made on access.
"""

from __future__ import annotations

import dataclasses
from typing import Self

import numpy as np
import torch

from vitpos.data import natural
from vitpos.data.base import split_seed

NAME = "regions"
SIZE = natural.SIZE
TRAIN_SHARE = 0.6  # train / val crops from the left 60 % of each photo's width, test crops from the right 40 %
SPLIT_SIZES = natural.SPLIT_SIZES

INFO = dataclasses.replace(
    natural.INFO, name=NAME,
    description=(f"crops of {len(natural.SOURCES)} colour photos shipped by scikit-image, scikit-learn and matplotlib, "
                 f"224x224 RGB; label = source photo; train / val crops from the left {TRAIN_SHARE:.0%} of each photo, "
                 "test crops from the rest (no pixel shared)"))


def region(split: str, width: int) -> tuple[int, int]:
    """The [left, right) pixel columns of a photo `width` wide that `split`'s crops lie in."""
    cut = round(width * TRAIN_SHARE)
    return (cut, width) if split == "test" else (0, cut)


class LazyRegionCrops(natural.LazyCrops):
    """LazyCrops drawn inside the split's region of each photo (the same draw as `natural`'s crop_box, on
    the region's width, then shifted to the region's left edge)."""

    def __init__(self, base_seed: int, ids: np.ndarray, split: str, size: int = SIZE):
        super().__init__(base_seed, ids, size)
        self.split = split

    def with_ids(self, ids: np.ndarray) -> Self:
        return type(self)(self.base_seed, ids, self.split, self.size)

    def boxes(self, ids) -> list[natural.CropBox]:
        full = [(int(p.shape[1]), int(p.shape[2])) for p in natural.photos()]
        spans = [region(self.split, w) for _, w in full]
        shapes = tuple((h, right - left) for (h, _), (left, right) in zip(full, spans, strict=True))
        out = []
        for i in ids:
            b = natural.crop_box(self.base_seed, int(i), shapes)
            out.append(dataclasses.replace(b, left=b.left + spans[b.photo][0]))
        return out


def load_split(split: str, seed: int = 0, limit: int | None = None) -> natural.NaturalCrops:
    """`limit` crops (default SPLIT_SIZES[split]) of a split; crop i depends only on (seed, split, i)."""
    n = SPLIT_SIZES[split] if limit is None else min(max(int(limit), 0), SPLIT_SIZES[split])
    base = split_seed(seed, NAME, split)
    ids = np.arange(n)
    # crop_box draws the photo first, whatever the region: the labels need no crop
    labels = natural.labels_for(base, ids)
    images = LazyRegionCrops(base, ids, split)
    return natural.NaturalCrops(images, labels, INFO, split)  # pyright: ignore[reportArgumentType]


def pixels_used(split: str, n: int, seed: int = 0) -> list[torch.Tensor]:
    """Per photo, a bool (H, W) mask of the pixels the first n crops of `split` cover (a test reads it)."""
    shapes = [(int(p.shape[1]), int(p.shape[2])) for p in natural.photos()]
    masks = [torch.zeros(h, w, dtype=torch.bool) for h, w in shapes]
    crops = LazyRegionCrops(split_seed(seed, NAME, split), np.arange(n), split)
    for b in crops.boxes(range(n)):
        masks[b.photo][b.top:b.top + b.height, b.left:b.left + b.width] = True
    return masks


__all__ = ["INFO", "NAME", "SIZE", "SPLIT_SIZES", "TRAIN_SHARE", "LazyRegionCrops", "load_split", "pixels_used",
           "region"]
