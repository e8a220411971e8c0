"""A dataset split shaped for a model surface, and a dataset's name for JSON documents."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitpos.data import load_split
from vitpos.errors import VitposError

if TYPE_CHECKING:
    from vitpos.models.surface import ModelSurface


def dataset_for(surface: ModelSurface, data: str, split: str, limit: int | None = None, seed: int = 0):
    """A split of `data` shaped for `surface`: through the model's own preprocessing (input size,
    channels, mean / std); imagefolder data through the model family's own image transform
    (`ModelSurface.image_transform`).

    `data` may also be a dataset object already (anything with .batches, .info, .subset): used as is."""
    if not isinstance(data, str):
        return data.subset(limit)
    if data.startswith("imagefolder:"):
        return load_split(data, split, seed=seed, limit=limit, transform=surface.image_transform())
    ds = load_split(data, split, seed=seed, limit=limit)
    return shaped_for(surface, ds)


def generated_size(data) -> tuple[int, int] | None:
    """The native (H, W) of data that can be generated at another size (the procedural shapes), else None."""
    if data == "shapes":
        from vitpos.data import shapes

        return shapes.INFO.image_size
    return None


def dataset_at_size(surface: ModelSurface, data, split: str, size: int | None, limit: int | None = None,
                    seed: int = 0):
    """`dataset_for(surface, ...)` with shapes generated at size x size px first (None: native); data
    that cannot be generated at another size (`generated_size` None) ignores `size` and is resized by
    the surface's preprocessing as always (an in-memory dataset object too: its uint8 images, to the
    surface's input size)."""
    if not isinstance(data, str):
        return shaped_for(surface, data.subset(limit))
    if size is None or generated_size(data) is None:
        return dataset_for(surface, data, split, limit=limit, seed=seed)
    return shaped_for(surface, load_split(data, split, seed=seed, limit=limit, size=size))


def require_fit(surface: ModelSurface, data: str) -> None:
    """One VitposError when `data` cannot be measured on `surface` for a reason of its own making (beyond
    channels and size, which `shaped_for` converts): the tiles must be the model's patches."""
    from vitpos.data import tiles

    if data == tiles.NAME:
        tiles.require_tile_patches(surface, data)


def shaped_for(surface: ModelSurface, ds):
    """An in-memory built-in split seen through `surface`'s own preprocessing (`vitpos.data.preprocess`):
    resized to its input size, grey <-> RGB, its mean / std; unchanged when that is the identity."""
    import dataclasses

    from vitpos.data.base import TensorImageDataset
    from vitpos.data.preprocess import model_preprocess

    if not isinstance(ds, TensorImageDataset):
        return ds
    require_fit(surface, ds.info.name)
    prep = model_preprocess(surface)
    if prep.in_chans not in (1, 3) or ds.info.in_chans not in (1, 3):
        raise VitposError(f"{ds.info.name} images have {ds.info.in_chans} channels but {surface.spec} takes "
                          f"{prep.in_chans}; vitpos converts between grey and RGB only")
    if prep.is_identity(ds.info.in_chans, ds.info.image_size):
        return ds
    info = dataclasses.replace(ds.info, image_size=prep.size, in_chans=prep.in_chans)
    return ds.with_transform(prep, info)


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


__all__ = ["data_fingerprint", "data_name", "dataset_at_size", "dataset_for", "generated_size"]
