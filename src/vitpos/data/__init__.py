"""Built-in datasets by name: `shapes` (default), `digits`, `fashion`, and `imagefolder:PATH`."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from vitpos.data import digits, fashion, imagefolder, shapes
from vitpos.data.base import SPLITS, DatasetInfo, TensorImageDataset, split_seed, to_float
from vitpos.data.imagefolder import LazyImageDataset
from vitpos.errors import VitposError

DEFAULT_DATA = "shapes"
BUILTIN = ("shapes", "digits", "fashion")

__all__ = [
    "DatasetInfo",
    "TensorImageDataset",
    "LazyImageDataset",
    "load_split",
    "dataset_info",
    "DEFAULT_DATA",
    "BUILTIN",
    "to_float",
]


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise VitposError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")


@lru_cache(maxsize=8)
def _shapes_split(split: str, seed: int, n: int) -> TensorImageDataset:
    # shapes scene i depends only on (seed, i): a limit only generates the prefix it keeps.
    images, labels = shapes.generate(n, split_seed(seed, "shapes", split))
    return TensorImageDataset(images, labels, shapes.INFO, split)


@lru_cache(maxsize=8)
def _digits_split(split: str, seed: int) -> TensorImageDataset:
    images, labels = digits.generate(digits.SPLIT_SIZES[split], split_seed(seed, "digits", split), pool=split)
    return TensorImageDataset(images, labels, digits.INFO, split)


def dataset_info(name: str) -> DatasetInfo:
    if name == "shapes":
        return shapes.INFO
    if name == "digits":
        return digits.INFO
    if name == "fashion":
        return fashion.INFO  # static: needs no files
    if name.startswith(imagefolder.PREFIX):
        return imagefolder.dataset_info(name)
    raise VitposError(f"unknown dataset {name!r}; use one of {', '.join(BUILTIN)} or imagefolder:PATH")


def load_split(
    name: str,
    split: str,
    seed: int = 0,
    limit: int | None = None,
    transform: Callable | None = None,
) -> TensorImageDataset | LazyImageDataset:
    """One split of a dataset; the same (name, split, seed) always gives the same samples.

    transform (PIL image -> float tensor (C, H, W), e.g. a timm model's preprocessing) makes the
    split lazy: built-in images are converted to RGB PIL images and transformed on access.
    imagefolder splits are always lazy (default transform: resize 224, [-1, 1]).
    """
    _check_split(split)
    if name.startswith(imagefolder.PREFIX):
        return imagefolder.load_split(name, split, seed, transform).subset(limit)
    if name == "shapes":
        size = shapes.SPLIT_SIZES[split]
        ds = _shapes_split(split, seed, size if limit is None else min(max(limit, 0), size))
    elif name == "digits":
        ds = _digits_split(split, seed)
    elif name == "fashion":
        ds = fashion.load_split(split, seed)
    else:
        dataset_info(name)  # raises the clear error for unknown names
        raise AssertionError("unreachable")
    ds = ds.subset(limit)
    return ds if transform is None else imagefolder.with_transform(ds, transform)
