"""A dataset split shaped for a model surface, and a dataset's name for JSON documents."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from vitpos.data import load_split
from vitpos.errors import VitposError

if TYPE_CHECKING:
    from vitpos.models.surface import ModelSurface


def dataset_for(surface: ModelSurface, data: str, split: str, limit: int | None = None, seed: int = 0):
    """A split of `data` shaped for `surface`; imagefolder data gets the timm model's own preprocessing.

    `data` may also be a dataset object already (anything with .batches, .info, .subset): used as is."""
    if not isinstance(data, str):
        return data.subset(limit)
    if data.startswith("imagefolder:"):
        from timm.data.config import resolve_data_config
        from timm.data.transforms_factory import create_transform

        cfg = resolve_data_config({}, model=surface.model)
        cfg["input_size"] = surface.input_size
        # One eval transform (separate=False); the declared return type also covers separate=True's tuple.
        transform = cast(Callable, create_transform(**cfg))
        return load_split(data, split, seed=seed, limit=limit, transform=transform)
    ds = load_split(data, split, seed=seed, limit=limit)
    shape = (ds.info.in_chans, *ds.info.image_size)
    if shape != tuple(surface.input_size):
        raise VitposError(
            f"{data} images are {shape} but {surface.spec} takes {tuple(surface.input_size)}; use matching data "
            "(fashion for builtin:fashion-*) or pass img_size/in_chans in the timm spec"
        )
    return ds


def data_fingerprint(data: str) -> str:
    """What identifies the data's content beyond its name: the file list of an imagefolder; the
    built-in data sets are fixed by vitpos' version and the seed."""
    if data.startswith("imagefolder:"):
        from vitpos.data.imagefolder import fingerprint

        return fingerprint(data)
    return ""


def data_name(data) -> str:
    """A dataset's name for JSON documents (`data` may be a name or a dataset object)."""
    return data if isinstance(data, str) else f"{data.info.name}:{getattr(data, 'split', '?')}"


__all__ = ["data_fingerprint", "data_name", "dataset_for"]
