"""Built-in datasets by name: `shapes` (default), `pairs`, `digits`, `fashion`, `natural` (crops of packaged
photos), `regions` (which photo a crop is from, train and test crops from disjoint regions), `tiles`
(those crops with their tiles reordered) and `imagefolder:PATH`."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from vitpos.data import digits, fashion, imagefolder, natural, pairs, regions, shapes, tiles
from vitpos.data.base import SPLITS, DatasetInfo, TensorImageDataset, split_seed, to_float
from vitpos.data.imagefolder import LazyImageDataset
from vitpos.errors import VitposError

DEFAULT_DATA = "shapes"
BUILTIN = ("shapes", "pairs", "digits", "fashion", "natural", "regions", "tiles")

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
def _shapes_split(split: str, seed: int, n: int, size: int = shapes.SIZE) -> TensorImageDataset:
    # shapes scene i depends only on (seed, i): a limit only generates the prefix it keeps.
    images, labels = shapes.generate(n, split_seed(seed, "shapes", split), size)
    return TensorImageDataset(images, labels, shapes.info_at(size), split)


@lru_cache(maxsize=8)
def _pairs_split(split: str, seed: int, n: int) -> TensorImageDataset:
    images, labels = pairs.generate(n, split_seed(seed, "pairs", split))
    return TensorImageDataset(images, labels, pairs.INFO, split)


@lru_cache(maxsize=8)
def _digits_split(split: str, seed: int) -> TensorImageDataset:
    images, labels = digits.generate(digits.SPLIT_SIZES[split], split_seed(seed, "digits", split), pool=split)
    return TensorImageDataset(images, labels, digits.INFO, split)


def dataset_info(name: str) -> DatasetInfo:
    if name == "shapes":
        return shapes.INFO
    if name == "pairs":
        return pairs.INFO
    if name == "digits":
        return digits.INFO
    if name == "fashion":
        return fashion.INFO  # static: needs no files
    if name == natural.NAME:
        natural.photos()  # the photos' packages must be installed (one-line error naming the install)
        return natural.INFO
    if name == tiles.NAME:
        natural.photos()
        return tiles.INFO
    if name == regions.NAME:
        natural.photos()
        return regions.INFO
    if name.startswith(imagefolder.PREFIX):
        return imagefolder.dataset_info(name)
    raise VitposError(f"unknown dataset {name!r}; use one of {', '.join(BUILTIN)} or imagefolder:PATH")


def load_split(
    name: str,
    split: str,
    seed: int = 0,
    limit: int | None = None,
    transform: Callable | None = None,
    size: int | None = None,
) -> TensorImageDataset | LazyImageDataset:
    """One split of a dataset; the same (name, split, seed) always gives the same samples.

    transform (PIL image -> float tensor (C, H, W), e.g. a timm model's preprocessing) makes the
    split lazy: built-in images are converted to RGB PIL images and transformed on access.
    imagefolder splits are always lazy (default transform: resize 224, [-1, 1]).
    size: render the procedural `shapes` at size x size px (None: its native 32); data with fixed
    images refuse it.
    """
    _check_split(split)
    if size is not None and name != "shapes":
        raise VitposError(f"{name} has fixed images; only the procedural shapes can be generated at another size "
                          "(drop size=, and resize the images instead)")
    if name.startswith(imagefolder.PREFIX):
        return imagefolder.load_split(name, split, seed, transform).subset(limit)
    if name == "shapes":
        n = shapes.SPLIT_SIZES[split]
        ds = _shapes_split(split, seed, n if limit is None else min(max(limit, 0), n), size or shapes.SIZE)
    elif name == "pairs":
        n = pairs.SPLIT_SIZES[split]
        ds = _pairs_split(split, seed, n if limit is None else min(max(limit, 0), n))
    elif name == "digits":
        ds = _digits_split(split, seed)
    elif name == "fashion":
        ds = fashion.load_split(split, seed)
    elif name == natural.NAME:
        ds = natural.load_split(split, seed, limit)  # crops are made on access: only the prefix asked for
    elif name == tiles.NAME:
        ds = tiles.load_split(split, seed, limit)
    elif name == regions.NAME:
        ds = regions.load_split(split, seed, limit)
    else:
        dataset_info(name)  # raises the clear error for unknown names
        raise AssertionError("unreachable")
    ds = ds.subset(limit)
    return ds if transform is None else imagefolder.with_transform(ds, transform)
