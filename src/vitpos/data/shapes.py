"""`shapes`: procedural scenes whose class is a spatial relation between a red and a blue shape.

Classes (see CLASS_NAMES): the red and blue key shapes share a column band and the class is which
one is on top (decided by ROW information only), or they share a row band and the class is which
one is on the left (decided by COLUMN information only). Two to three distractor shapes in other
colours, random shape types (square, disc, triangle) and random absolute placement make colour
counts, shape types and absolute position useless: a model without any positional signal sees an
unordered bag of patches and stays near chance (25%).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np
import torch

from vitpos.data.base import DatasetInfo
from vitpos.errors import VitposError

SIZE = 32
CLASS_NAMES = ("red above blue", "red below blue", "red left of blue", "red right of blue")
CLASS_GROUPS = {"vertical": (0, 1), "horizontal": (2, 3)}
SPLIT_SIZES = {"train": 20000, "val": 2000, "test": 4000}

INFO = DatasetInfo(
    name="shapes",
    num_classes=4,
    class_names=CLASS_NAMES,
    image_size=(SIZE, SIZE),
    in_chans=3,
    class_groups=CLASS_GROUPS,
    description="red/blue spatial relations among distractors (32x32 RGB, procedural)",
)

_RED = np.array([220, 35, 35])
_BLUE = np.array([40, 70, 230])
_DISTRACTOR_COLOURS = np.array([[40, 200, 60], [225, 215, 40], [160, 160, 160], [200, 80, 220]])


MIN_SIZE = 20  # two key shapes of radius <= 3, 6 px apart, 3 px from the border: 3 + 3+3+6 + 4 < 20
MAX_TRIES = 10_000


def info_at(size: int) -> DatasetInfo:
    """INFO for scenes rendered at `size` px (same classes; shapes keep their pixel size, the canvas grows)."""
    if size == SIZE:
        return INFO
    return dataclasses.replace(INFO, image_size=(size, size),
                               description=f"red/blue spatial relations among distractors ({size}x{size} RGB, "
                                           "procedural)")


@lru_cache(maxsize=4)
def _coords(size: int) -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.mgrid[0:size, 0:size]
    return yy, xx


def _mask(kind: int, cy: int, cx: int, r: int, size: int = SIZE) -> np.ndarray:
    yy, xx = _coords(size)
    dy, dx = yy - cy, xx - cx
    if kind == 0:  # square
        return (np.abs(dy) <= r) & (np.abs(dx) <= r)
    if kind == 1:  # disc
        return dy * dy + dx * dx <= r * r + r
    # triangle pointing up
    return (dy >= -r) & (dy <= r) & (np.abs(dx) * 2 <= dy + r)


def _free(boxes: list[tuple[int, int, int]], cy: int, cx: int, r: int, gap: int = 2) -> bool:
    return all(abs(cy - by) > r + br + gap or abs(cx - bx) > r + br + gap for by, bx, br in boxes)


def _key_positions(rng: np.random.Generator, label: int, r1: int, r2: int,
                   size: int = SIZE) -> tuple[int, int, int, int]:
    """Centres (y_red, x_red, y_blue, x_blue) realising the relation `label`."""
    lo, hi = 3, size - 4
    for _try in range(MAX_TRIES):  # bounded: a canvas too small for two separated shapes fails, never hangs
        along_a, along_b = rng.integers(lo, hi + 1, size=2)
        if abs(int(along_a) - int(along_b)) < r1 + r2 + 6:  # clearly separated along the relation axis
            continue
        first, second = sorted((int(along_a), int(along_b)))
        shared = int(rng.integers(lo, hi + 1))
        jitter = int(rng.integers(-2, 3))
        other = int(np.clip(shared + jitter, lo, hi))
        if label == 0:  # red above blue: same column band, red has the smaller row
            return first, shared, second, other
        if label == 1:
            return second, shared, first, other
        if label == 2:  # red left of blue: same row band, red has the smaller column
            return shared, first, other, second
        return shared, second, other, first
    raise VitposError(f"shapes could not place two separated key shapes on a {size} px canvas in {MAX_TRIES} tries; "
                      f"render at least {MIN_SIZE} px (e.g. a larger extrapolation scale)")


def render(rng: np.random.Generator, label: int, size: int = SIZE) -> np.ndarray:
    """One (3, size, size) uint8 scene of class `label`."""
    img = np.zeros((size, size, 3), dtype=np.float32)
    img += rng.normal(12, 4, size=img.shape)  # faint background texture
    r_red, r_blue = (int(v) for v in rng.integers(2, 4, size=2))
    yr, xr, yb, xb = _key_positions(rng, label, r_red, r_blue, size)
    boxes = [(yr, xr, r_red), (yb, xb, r_blue)]
    for (cy, cx, r), colour in zip(boxes, (_RED, _BLUE), strict=True):
        img[_mask(int(rng.integers(3)), cy, cx, r, size)] = colour + rng.normal(0, 12, size=3)
    for _ in range(int(rng.integers(2, 4))):
        for _try in range(30):
            r = int(rng.integers(1, 3))
            cy, cx = (int(v) for v in rng.integers(r, size - r, size=2))
            if _free(boxes, cy, cx, r):
                boxes.append((cy, cx, r))
                colour = _DISTRACTOR_COLOURS[rng.integers(len(_DISTRACTOR_COLOURS))]
                img[_mask(int(rng.integers(3)), cy, cx, r, size)] = colour + rng.normal(0, 12, size=3)
                break
    return np.clip(img, 0, 255).astype(np.uint8).transpose(2, 0, 1)


def generate(n: int, seed: int, size: int = SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """n scenes with uniformly drawn labels. Scene i depends only on (seed, i), so the first m
    scenes of generate(n, seed) are exactly generate(m, seed): small subsets are cheap and stable.
    `size` renders on a larger (or smaller) canvas: key shapes at least 3 px from the border, as at 32."""
    if size < MIN_SIZE:
        raise VitposError(f"shapes needs at least {MIN_SIZE} px to place two separated key shapes, got size {size}; "
                          "use a larger size (for extrapolate: a larger --scales value)")
    images = np.zeros((n, 3, size, size), np.uint8)
    labels = np.zeros(n, np.int64)
    for i in range(n):
        rng = np.random.default_rng((seed, i))
        labels[i] = rng.integers(len(CLASS_NAMES))
        images[i] = render(rng, int(labels[i]), size)
    return torch.from_numpy(images), torch.from_numpy(labels)
