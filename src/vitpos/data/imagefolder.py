"""`imagefolder:PATH`: a user's own tree of class subfolders of images, loaded lazily.

Layout: either PATH/{train,val,test}/CLASS/*.png (pre-split: used as given), or PATH/CLASS/*.png
(split here, by the seed: 80% train / 10% val / 10% test). Class ids are the sorted class folder
names (the union over the split folders, so a class missing from one split keeps its id).
Images go through `transform` (PIL -> float tensor), by default resize to 224 (shorter side, then
a centre crop), ToTensor and normalise to [-1, 1]; timm models pass their own preprocessing.

LazyImageDataset is also how a built-in in-memory split is given a transform.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from vitpos.data.base import SPLITS, DatasetInfo, TensorImageDataset, split_seed
from vitpos.errors import VitposError

PREFIX = "imagefolder:"
DEFAULT_SIZE = 224
SPLIT_FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}

Transform = Callable[[Image.Image], torch.Tensor]


def default_transform(size: int = DEFAULT_SIZE) -> Transform:
    from torchvision import transforms as T

    return T.Compose([T.Resize(size), T.CenterCrop(size), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])


def _root(name: str) -> Path:
    raw = name[len(PREFIX) :]
    if not raw:
        raise VitposError("imagefolder needs a path: use imagefolder:PATH (a folder of class subfolders)")
    root = Path(raw).expanduser()
    if not root.is_dir():
        raise VitposError(f"imagefolder path {root} is not a folder; pass imagefolder:PATH with class subfolders")
    return root


def _subdirs(folder: Path) -> list[str]:
    # Hidden folders (.ipynb_checkpoints, .git) are never classes.
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def _layout(root: Path) -> tuple[dict[str, Path] | None, tuple[str, ...]]:
    """(split folders or None when PATH is not pre-split, sorted class names)."""
    top = _subdirs(root)
    split_dirs = {s: root / s for s in SPLITS if s in top}
    if split_dirs:
        classes = sorted({c for d in split_dirs.values() for c in _subdirs(d)})
    else:
        classes = top
    if not classes:
        raise VitposError(
            f"no class folders in {root}; put images in PATH/CLASS/*.png (or PATH/train/CLASS/*.png ...)"
        )
    return split_dirs or None, tuple(classes)


def dataset_info(name: str) -> DatasetInfo:
    """The info without scanning any image: class names are the class folder names."""
    root = _root(name)
    split_dirs, classes = _layout(root)
    kind = "pre-split train/val/test" if split_dirs else "split 80/10/10 by seed"
    return DatasetInfo(
        name=name,
        num_classes=len(classes),
        class_names=classes,
        image_size=(DEFAULT_SIZE, DEFAULT_SIZE),
        in_chans=3,
        class_groups={},
        description=f"user ImageFolder at {root} ({len(classes)} classes, {kind})",
    )


def fingerprint(name: str) -> str:
    """sha256 (16 hex) of every file's relative path, size and mtime under the folder: results
    cached for an imagefolder are recomputed once its images change (added, removed, edited)."""
    import hashlib
    import os

    root = _root(name)
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in sorted(filenames):
            if fn.startswith("."):
                continue
            p = Path(dirpath) / fn
            st = p.stat()
            h.update(f"{p.relative_to(root).as_posix()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _check_links(folder: Path) -> None:
    """Every folder under `folder` is read once: a symbolic link to a folder already in the tree (a loop
    back to a parent, or a second name for a class folder) is refused, since the images under it would
    be read again, under another class or as duplicates across splits."""
    import os

    seen: dict[str, Path] = {}
    for dirpath, dirnames, _ in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            raise VitposError(f"{dirpath} is the folder {seen[real]} again (through a symbolic link): its images "
                              "would be read twice, under two names; remove the link or copy the images")
        seen[real] = Path(dirpath)
        dirnames.sort()


def _scan(folder: Path, classes: tuple[str, ...]) -> list[tuple[str, int]]:
    from torchvision.datasets import ImageFolder

    _check_links(folder)

    class_to_idx = {c: i for i, c in enumerate(classes)}

    class _Fixed(ImageFolder):
        # The class ids come from the whole tree, not from this one folder.
        def find_classes(self, directory):
            return list(classes), class_to_idx

    return list(_Fixed(str(folder), allow_empty=True).samples)


@lru_cache(maxsize=4)
def _split_samples(root: str, seed: int) -> dict[str, tuple[tuple[str, int], ...]]:
    """Every split's (path, label) list, in a seeded random order (so `limit` mixes classes)."""
    name = PREFIX + root
    split_dirs, classes = _layout(Path(root))
    if split_dirs is not None:
        per_split = {s: _scan(d, classes) for s, d in split_dirs.items()}
    else:
        samples = _scan(Path(root), classes)
        if len(samples) < len(SPLITS):
            raise VitposError(
                f"only {len(samples)} images under {root}; need at least 3 to split into train/val/test"
            )
        perm = np.random.default_rng(split_seed(seed, name, "split")).permutation(len(samples))
        n_val = max(1, round(len(samples) * SPLIT_FRACTIONS["val"]))
        n_test = max(1, round(len(samples) * SPLIT_FRACTIONS["test"]))
        parts = {"val": perm[:n_val], "test": perm[n_val : n_val + n_test], "train": perm[n_val + n_test :]}
        per_split = {s: [samples[i] for i in idx] for s, idx in parts.items()}
    out = {}
    for s, items in per_split.items():
        order = np.random.default_rng(split_seed(seed, name, s)).permutation(len(items))
        out[s] = tuple(items[i] for i in order)
    return out


MAX_PIXELS = 64_000_000  # 8000 x 8000: larger images are refused before decoding (decompression bombs)


def _load_path(path: str) -> Image.Image:
    fix = "remove or replace the file"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                w, h = im.size
                if w * h > MAX_PIXELS:
                    raise VitposError(f"image {path} is {w}x{h} pixels, more than vitpos reads ({MAX_PIXELS:,}: a "
                                      f"decompression bomb?); downscale or {fix}")
                if im.mode.startswith("I;16"):  # 16-bit grey: convert("RGB") clips it to white; keep the top byte
                    return Image.fromarray((np.asarray(im, dtype=np.uint16) >> 8).astype(np.uint8)).convert("RGB")
                if im.mode in ("I", "F"):
                    raise VitposError(f"image {path} has 32-bit {im.mode!r} pixels, whose range vitpos cannot know; "
                                      f"save it as 8-bit (or 16-bit) grey or RGB, or {fix}")
                return im.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise VitposError(f"image {path} is too large to decode safely ({e}); downscale or {fix}") from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as e:  # PIL's ways to say "broken file"
        raise VitposError(f"cannot read image {path} ({type(e).__name__}: {e}); {fix}") from None


def _tensor_to_pil(images: torch.Tensor, i: int) -> Image.Image:
    arr = np.ascontiguousarray(images[i].permute(1, 2, 0).numpy())
    return Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr).convert("RGB")


class LazyImageDataset(Dataset):
    """A split whose images are loaded and transformed on access: same interface as TensorImageDataset."""

    def __init__(
        self,
        keys: Sequence,
        labels: torch.Tensor,
        load: Callable[[Any], Image.Image],  # called with one of `keys`
        transform: Transform,
        info: DatasetInfo,
        split: str,
        probe: bool = True,
    ):
        self.keys = keys
        self.labels = labels.long()
        self.load = load
        self.transform = transform
        self.info = info
        self.split = split
        if probe and len(keys):
            # The transform decides the image size and channels the model sees.
            x = self._image(0)
            self.info = dataclasses.replace(info, image_size=(x.shape[1], x.shape[2]), in_chans=x.shape[0])

    def _image(self, i: int) -> torch.Tensor:
        x = self.transform(self.load(self.keys[i]))
        if not (isinstance(x, torch.Tensor) and x.ndim == 3 and x.is_floating_point()):
            got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise VitposError(f"the image transform must return a float tensor (C, H, W), got {got}; fix the transform")
        return x

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self._image(i), int(self.labels[i])

    def subset(self, n: int | None) -> LazyImageDataset:
        """The first n samples (the split order is already random), or self when n is None."""
        if n is None or n >= len(self):
            return self
        return LazyImageDataset(self.keys[:n], self.labels[:n], self.load, self.transform, self.info, self.split, False)

    def batches(
        self,
        batch_size: int,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
        num_workers: int = 0,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(float (B, C, H, W), int64 (B,)) batches; num_workers > 0 decodes images in parallel."""
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        loader = DataLoader(self, batch_size=batch_size, sampler=order.tolist(), num_workers=num_workers)
        for images, labels in loader:
            yield images, labels.long()


def load_split(name: str, split: str, seed: int = 0, transform: Transform | None = None) -> LazyImageDataset:
    root = _root(name)
    samples = _split_samples(str(root), seed)
    if split not in samples:
        raise VitposError(
            f"{root} has {', '.join(f'{s}/' for s in samples)} but no {split}/ folder; add {root / split} "
            "with class subfolders, or remove the split folders to split the images 80/10/10"
        )
    items = samples[split]
    if not items:
        raise VitposError(f"no images for split {split!r} under {root}; add images to the class folders")
    info = dataset_info(name)
    labels = torch.tensor([y for _, y in items], dtype=torch.int64)
    return LazyImageDataset(
        [p for p, _ in items], labels, _load_path, transform or default_transform(), info, split
    )


def native_size(name: str, seed: int = 0) -> int:
    """The shorter side of the first training image: what an own ViT trains at by default
    (resizing 32-px images to 224 px would make a 56x56 grid of 4-px patches)."""
    items = _split_samples(str(_root(name)), seed).get("train") or []
    if not items:
        raise VitposError(f"no training images under {_root(name)}; add images to the class folders")
    return min(_load_path(items[0][0]).size)  # a broken or oversized image: one error line


def with_transform(ds: TensorImageDataset, transform: Transform) -> LazyImageDataset:
    """A built-in in-memory split seen through a PIL transform (e.g. a timm model's preprocessing)."""
    keys = list(range(len(ds)))
    return LazyImageDataset(keys, ds.labels, partial(_tensor_to_pil, ds.images), transform, ds.info, ds.split)
