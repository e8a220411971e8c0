"""`fashion`: the real Fashion-MNIST (28x28 grey, 10 classes) from Debian's `dataset-fashion-mnist`.

Files: DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (IDX format, gzip; plain files are
accepted too), DIR = $VITPOS_FASHION_DIR or /usr/share/datasets/fashion-mnist.
Splits: `test` is the standard 10k test set; the official training set is split by a fixed
permutation (VAL_SEED, independent of the user's seed, so val never leaks into train) into `val`
(min(5000, N/12) images: 5000 of the 60000) and `train` (the rest: 55000). The user's seed only
shuffles the order inside a split (which `limit` then truncates).
"""

from __future__ import annotations

import gzip
import os
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from vitpos.data.base import DatasetInfo, TensorImageDataset, split_seed
from vitpos.errors import VitposError

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
ENV_DIR = "VITPOS_FASHION_DIR"
SIZE = 28
VAL_MAX = 5000
VAL_FRACTION = 1 / 12
VAL_SEED = 60000
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CLASS_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip

INFO = DatasetInfo(
    name="fashion",
    num_classes=10,
    class_names=CLASS_NAMES,
    image_size=(SIZE, SIZE),
    in_chans=1,
    class_groups={},
    description="Fashion-MNIST (28x28 grey, 10 clothing classes; Debian dataset-fashion-mnist)",
)


def data_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)


def _find(directory: Path, stem: str) -> Path:
    for path in (directory / f"{stem}.gz", directory / stem):
        if path.is_file():
            return path
    raise VitposError(
        f"Fashion-MNIST not found in {directory}; install it with: "
        f"sudo apt-get install dataset-fashion-mnist (or set {ENV_DIR})"
    )


def _corrupt(path: Path, why: str) -> VitposError:
    return VitposError(
        f"{path} is not a valid IDX file ({why}); reinstall it with: "
        f"sudo apt-get install --reinstall dataset-fashion-mnist (or fix {ENV_DIR})"
    )


def read_idx(path: str | Path, ndim: int) -> np.ndarray:
    """A uint8 IDX file (optionally gzipped) with `ndim` dimensions, as a numpy array."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise _corrupt(path, f"cannot decompress: {e}") from e
    if len(raw) < 4 + 4 * ndim:
        raise _corrupt(path, f"only {len(raw)} bytes")
    # Magic: two zero bytes, dtype code (0x08 = uint8), number of dimensions.
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or raw[3] != ndim:
        raise _corrupt(path, f"bad magic number 0x{raw[:4].hex()}, expected 0x000008{ndim:02x}")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = 4 + 4 * ndim + int(np.prod(dims))
    if len(raw) != expected:
        raise _corrupt(path, f"{len(raw)} bytes, expected {expected} for shape {dims}")
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


@lru_cache(maxsize=4)
def _read_part(image_path: str, label_path: str, _stamp: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    # _stamp (mtimes, sizes) is only part of the cache key, so a replaced file is re-read.
    images = read_idx(image_path, 3)
    labels = read_idx(label_path, 1)
    if images.shape[1:] != (SIZE, SIZE):
        raise _corrupt(Path(image_path), f"images are {images.shape[1:]}, expected {(SIZE, SIZE)}")
    if labels.shape[0] != images.shape[0]:
        raise _corrupt(Path(label_path), f"{labels.shape[0]} labels for {images.shape[0]} images")
    if labels.size and labels.max() >= len(CLASS_NAMES):
        raise _corrupt(Path(label_path), f"label {int(labels.max())} is not a class id 0..9")
    return torch.from_numpy(images.copy())[:, None], torch.from_numpy(labels.astype(np.int64))


def read_part(part: str, directory: Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The official `train` or `test` part: uint8 (N, 1, 28, 28) images and int64 (N,) labels."""
    directory = data_dir() if directory is None else Path(directory)
    paths = [_find(directory, stem) for stem in FILES[part]]
    stamp = tuple((p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
    return _read_part(str(paths[0]), str(paths[1]), stamp)


def split_sizes(n_train: int) -> dict[str, int]:
    """train/val sizes carved from an official training part of n_train images."""
    n_val = min(VAL_MAX, int(n_train * VAL_FRACTION))
    return {"train": n_train - n_val, "val": n_val}


def load_split(split: str, seed: int = 0) -> TensorImageDataset:
    """One split, its order shuffled by `seed`; membership never depends on the seed."""
    directory = data_dir()
    paths = [_find(directory, stem) for part in ("train", "test") for stem in FILES[part]]
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
    return _load_split(split, seed, str(directory), stamp)


@lru_cache(maxsize=6)
def _load_split(split: str, seed: int, directory: str, _stamp: tuple) -> TensorImageDataset:
    part = "test" if split == "test" else "train"
    images, labels = read_part(part, Path(directory))
    if split == "test":
        members = np.arange(len(labels))
    else:
        n_val = split_sizes(len(labels))["val"]
        perm = np.random.default_rng(VAL_SEED).permutation(len(labels))
        members = perm[:n_val] if split == "val" else perm[n_val:]
    order = np.random.default_rng(split_seed(seed, "fashion", split)).permutation(members)
    idx = torch.from_numpy(order)
    return TensorImageDataset(images[idx], labels[idx], INFO, split)
