"""`digits`: two real handwritten digits, one above the other; the label is the UPPER digit's class.

Source: scikit-learn's bundled `load_digits` (1797 8x8 greyscale digits, no download). The 1797
source images are first split, per class and with the fixed seed POOL_SEED, into disjoint pools
(70% train / 10% val / 20% test), so no source digit appears in two splits.

Each scene (3, 32, 32) uint8, grey on black, all three channels equal:
  * two digits of DIFFERENT classes are drawn from the split's pool; the upper one's class is the
    label (balanced over the 10 classes), the lower one's class is uniform over the other 9;
  * each digit is upscaled 8x8 -> 12x12 (bilinear) and its 0..16 ink scaled to 0..255;
  * the upper digit's top row is uniform in [0, 6]; the lower digit's top row is uniform in
    [upper top + 14, 20], so at least GAP=2 blank rows separate them (they never overlap);
  * each digit's left column is uniform in [0, 20], independently of the other.
A model without positional information sees the same unordered bag of patches for "a above b" and
"b above a", so it can at best pick one of the two digits (~50%); the rest needs ROW information.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Literal, cast, overload

import numpy as np
import torch
import torch.nn.functional as F

from vitpos.data.base import DatasetInfo

if TYPE_CHECKING:
    from sklearn.utils import Bunch

SIZE = 32
DIGIT = 12  # upscaled digit side
GAP = 2  # minimum blank rows between the two digits
MAX_TOP = SIZE - 2 * DIGIT - GAP  # last top row of the upper digit (6)
MAX_LEFT = SIZE - DIGIT  # last left column of either digit (20)
POOL_SEED = 1797  # fixed: the source pools never depend on the user's seed
POOL_FRACTIONS = {"train": 0.7, "val": 0.1, "test": 0.2}
SPLIT_SIZES = {"train": 20000, "val": 2000, "test": 4000}
CLASS_NAMES = tuple(f"upper digit {d}" for d in range(10))

INFO = DatasetInfo(
    name="digits",
    num_classes=10,
    class_names=CLASS_NAMES,
    image_size=(SIZE, SIZE),
    in_chans=3,
    class_groups={},
    description=(
        "two sklearn handwritten digits of different classes (8x8 upscaled to 12x12, grey on black), "
        "one above the other with >=2 blank rows between them (upper top row in [0,6], lower top row in "
        "[upper+14,20], columns independent in [0,20]); label = class of the UPPER digit "
        "(32x32 RGB; source digits disjoint between splits)"
    ),
)


@lru_cache(maxsize=1)
def source() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits upscaled to uint8 (1797, 12, 12) in [0, 255], and their int64 classes."""
    from sklearn.datasets import load_digits  # imported lazily: sklearn is slow to import

    d = cast("Bunch", load_digits())  # a Bunch unless return_X_y=True (its annotation covers both)
    small = torch.from_numpy(d.images.astype(np.float32))[:, None]  # (N, 1, 8, 8) in [0, 16]
    big = F.interpolate(small, size=(DIGIT, DIGIT), mode="bilinear", align_corners=False)
    big = (big[:, 0] * (255.0 / 16.0)).round().clamp(0, 255).to(torch.uint8).numpy()
    return big, d.target.astype(np.int64)


@lru_cache(maxsize=1)
def pools() -> dict[str, np.ndarray]:
    """Disjoint source indices per split, stratified by class, from the fixed POOL_SEED."""
    _, classes = source()
    rng = np.random.default_rng(POOL_SEED)
    out: dict[str, list[np.ndarray]] = {s: [] for s in POOL_FRACTIONS}
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(classes == c))
        n_val = round(len(idx) * POOL_FRACTIONS["val"])
        n_test = round(len(idx) * POOL_FRACTIONS["test"])
        out["val"].append(idx[:n_val])
        out["test"].append(idx[n_val : n_val + n_test])
        out["train"].append(idx[n_val + n_test :])
    return {s: np.sort(np.concatenate(parts)) for s, parts in out.items()}


@overload
def generate(n: int, seed: int, pool: str = ...,
             return_meta: Literal[False] = ...) -> tuple[torch.Tensor, torch.Tensor]:
    ...


@overload
def generate(n: int, seed: int, pool: str = ..., *,
             return_meta: Literal[True]) -> tuple[torch.Tensor, torch.Tensor, dict[str, np.ndarray]]:
    ...


def generate(n: int, seed: int, pool: str = "train", return_meta: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, dict[str, np.ndarray]]:
    """n scenes from `pool`'s source digits with balanced, shuffled labels.

    Returns (images uint8 (n, 3, 32, 32), labels int64 (n,)), plus, with return_meta, a dict of
    numpy arrays: upper_class, lower_class, upper_source, lower_source (indices into
    sklearn's load_digits), upper_yx, lower_yx ((n, 2) top-left corners). Same (n, seed, pool)
    always gives the same output.
    """
    if pool not in POOL_FRACTIONS:
        raise ValueError(f"pool must be one of {tuple(POOL_FRACTIONS)}, got {pool!r}")
    digits, classes = source()
    pool_idx = pools()[pool]
    by_class = [pool_idx[classes[pool_idx] == c] for c in range(10)]
    counts = np.array([len(b) for b in by_class])
    table = np.zeros((10, counts.max()), dtype=np.int64)  # row c: the pool's digits of class c
    for c, b in enumerate(by_class):
        table[c, : len(b)] = b
    rng = np.random.default_rng(seed)
    upper_class = np.arange(n, dtype=np.int64) % 10
    rng.shuffle(upper_class)
    lower_class = (upper_class + rng.integers(1, 10, size=n)) % 10  # uniform over the other 9
    upper_source = table[upper_class, rng.integers(0, counts[upper_class])]
    lower_source = table[lower_class, rng.integers(0, counts[lower_class])]
    upper_y = rng.integers(0, MAX_TOP + 1, size=n)
    lower_y = rng.integers(upper_y + DIGIT + GAP, SIZE - DIGIT + 1)
    upper_x, lower_x = rng.integers(0, MAX_LEFT + 1, size=(2, n))

    canvas = np.zeros((n, SIZE, SIZE), dtype=np.uint8)
    for i in range(n):
        canvas[i, upper_y[i] : upper_y[i] + DIGIT, upper_x[i] : upper_x[i] + DIGIT] = digits[upper_source[i]]
        canvas[i, lower_y[i] : lower_y[i] + DIGIT, lower_x[i] : lower_x[i] + DIGIT] = digits[lower_source[i]]
    images = torch.from_numpy(np.repeat(canvas[:, None], 3, axis=1))
    labels = torch.from_numpy(upper_class.copy())
    if not return_meta:
        return images, labels
    meta = {
        "upper_class": upper_class,
        "lower_class": lower_class,
        "upper_source": upper_source,
        "lower_source": lower_source,
        "upper_yx": np.stack([upper_y, upper_x], axis=1),
        "lower_yx": np.stack([lower_y, lower_x], axis=1),
    }
    return images, labels, meta
