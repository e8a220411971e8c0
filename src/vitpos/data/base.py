"""What every dataset provides: a DatasetInfo and in-memory (or lazy) splits of (image, label)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset

from vitpos.errors import VitposError

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    num_classes: int
    class_names: tuple[str, ...]
    image_size: tuple[int, int]  # (H, W) in pixels
    in_chans: int
    # Named groups of class ids that a causal test can compare, e.g. classes decided by a
    # vertical relation only vs a horizontal relation only. Empty when the data has none.
    class_groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    description: str = ""
    # Defined only at the model's own input size (`tiles`: its tiles are the model's patches), so
    # nothing that needs the images at other sizes (larger grids: `extrapolate`) can read it.
    fixed_size: bool = False


def classes_problem(info: DatasetInfo, data: str | None = None) -> str | None:
    """Why `info` cannot be classification data (fewer than 2 classes: every top-1 is 100 %, a
    trained classifier learns nothing), with the fix; None when it can."""
    k = len(info.class_names)
    if k >= 2:
        return None
    names = f" ({', '.join(info.class_names)})" if info.class_names else ""
    return (f"{data or info.name} has {k} class{names}; a classifier needs at least 2 classes: add another class "
            "folder (PATH/CLASS/*.png, or PATH/train/CLASS/... in every split)")


def require_classes(info: DatasetInfo, data: str | None = None) -> None:
    """One VitposError (classes_problem) for data with fewer than 2 classes."""
    problem = classes_problem(info, data)
    if problem is not None:
        raise VitposError(problem)


def split_seed(seed: int, name: str, split: str) -> int:
    """A stable per-(dataset, split) seed, so splits never share samples and never drift."""
    digest = hashlib.sha256(f"{name}:{split}:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def to_float(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 (N, C, H, W) in [0, 255] -> float32 in [-1, 1], the input scale of vitpos' own ViTs."""
    return images_uint8.float().div_(127.5).sub_(1.0)


BatchTransform = Callable[[torch.Tensor], torch.Tensor]  # uint8 (B, C, H, W) -> float (B, C', H', W')


class TensorImageDataset(Dataset):
    """One split held in memory as uint8 (N, C, H, W) images and int64 (N,) labels.

    `transform` (uint8 batch -> float batch, e.g. a model's resize + normalisation) is applied
    lazily per batch, so memory stays uint8 at the native size; without one, images go through
    `to_float` ([-1, 1], the input scale of vitpos' own ViTs). `info` then describes what the
    transform yields (image_size, in_chans)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, info: DatasetInfo, split: str,
                 transform: BatchTransform | None = None):
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels must be ({images.shape[0]},), got {tuple(labels.shape)}")
        self.images = images
        self.labels = labels.long()
        self.info = info
        self.split = split
        self.transform = transform

    def _float(self, images: torch.Tensor) -> torch.Tensor:
        return to_float(images) if self.transform is None else self.transform(images)

    def with_transform(self, transform: BatchTransform, info: DatasetInfo) -> TensorImageDataset:
        """The same samples (shared memory) seen through `transform`; `info` describes its output."""
        return TensorImageDataset(self.images, self.labels, info, self.split, transform)

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self._float(self.images[i : i + 1])[0], int(self.labels[i])

    def subset(self, n: int | None) -> TensorImageDataset:
        """The first n samples (the split order is already random), or self when n is None."""
        if n is None or n >= len(self):
            return self
        return TensorImageDataset(self.images[:n], self.labels[:n], self.info, self.split, self.transform)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The float images and labels of samples `idx` (an index tensor), as `batches` yields them."""
        return self._float(self.images[idx]), self.labels[idx]

    def batches(
        self, batch_size: int, shuffle: bool = False, generator: torch.Generator | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Float batches without a DataLoader (the data is already in memory)."""
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(0, n, batch_size):
            yield self.batch(order[start : start + batch_size])


class Selection:
    """The samples `ids` of a dataset, in that order, seen as a dataset (info, split, len, indexing, subset,
    batches): e.g. one half of a sweep's permutation images (`experiments.sae_sweep.held_out_halves`). Lazy:
    a TensorImageDataset's samples are taken batch by batch (`TensorImageDataset.batch`), any other's item by
    item."""

    def __init__(self, dataset, ids: list[int]):
        if any(not 0 <= i < len(dataset) for i in ids):
            raise ValueError(f"ids must lie in 0..{len(dataset) - 1}")
        self.dataset, self.ids = dataset, list(ids)
        self.info: DatasetInfo = dataset.info
        self.split: str = getattr(dataset, "split", "?")

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.dataset[self.ids[i]]

    def subset(self, n: int | None) -> Selection:
        """The first n of the selected samples, or self when n is None."""
        return self if n is None or n >= len(self) else Selection(self.dataset, self.ids[:n])

    def batches(
        self, batch_size: int, shuffle: bool = False, generator: torch.Generator | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.tensor(self.ids, dtype=torch.long)
        if shuffle:
            order = order[torch.randperm(len(order), generator=generator)]
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            if isinstance(self.dataset, TensorImageDataset):
                yield self.dataset.batch(idx)
            else:
                items = [self.dataset[int(i)] for i in idx]
                yield torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items], dtype=torch.long)
