"""`natural`: random multi-scale crops (and flips) of the colour photographs that pip packages ship.

The photos (all read from the installed packages' files, never from the network; licences checked,
see SOURCES and docs/real-models.md):
  scikit-image  astronaut.png, chelsea.png, coffee.png, rocket.jpg, hubble_deep_field.jpg
  scikit-learn  china.jpg, flower.jpg
  matplotlib    grace_hopper.jpg
scikit-learn and matplotlib are vitpos dependencies; scikit-image is optional: without it, `natural`
stops with one line naming `pip install scikit-image`.

Crop i of a split is a pure function of (seed, split, i): photo index, scale, aspect, position and
flip are drawn from a generator seeded with (split_seed(seed, "natural", split), i), so any prefix
or subset of a split is the same crops whatever else is generated, and nothing is stored: the split
holds only the (small) source photos and makes each 224 x 224 uint8 crop when it is indexed. A crop
covers SCALE (area fraction of its photo, log-uniform) at aspect ASPECT (log-uniform), is
resized (bilinear, antialiased) to SIZE x SIZE, then mirrored left-right with probability 1/2.

Labels: the index of the source photo (8 classes). Every split draws from every photo, so a test
crop overlaps training crops' pixels: "which photo is this crop from" measures recognition of seen
photos from new crops, not generalisation, and it does not depend on position by design (a crop's
place in the photo is random). It exists so the split is a labelled dataset like the others; the
study's top-1 on DINOv2 is measured on Fashion-MNIST (configs/dinov2-natural.yaml).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Self, cast, overload

import numpy as np
import torch
import torch.nn.functional as F

from vitpos.data.base import DatasetInfo, TensorImageDataset, split_seed
from vitpos.errors import VitposError

NAME = "natural"
SIZE = 224
SCALE = (0.08, 1.0)  # area fraction of the photo a crop covers (log-uniform)
ASPECT = (3 / 4, 4 / 3)  # crop width / height (log-uniform)
# Crops are generated, not stored: a split's length only bounds what `limit=None` asks for.
SPLIT_SIZES = {"train": 200_000, "val": 20_000, "test": 20_000}


@dataclass(frozen=True)
class Source:
    name: str  # class name
    package: str  # import name of the package that ships the file
    pip: str  # what to pip install
    path: str  # file inside the package
    licence: str
    credit: str


SOURCES: tuple[Source, ...] = (
    Source("astronaut", "skimage", "scikit-image", "data/astronaut.png", "public domain",
           "NASA (Eileen Collins), via the NASA Great Images database; scikit-image data"),
    Source("chelsea", "skimage", "scikit-image", "data/chelsea.png", "CC0",
           "Stefan van der Walt; scikit-image data"),
    Source("coffee", "skimage", "scikit-image", "data/coffee.png", "CC0",
           "Rachel Michetti; scikit-image data"),
    Source("rocket", "skimage", "scikit-image", "data/rocket.jpg", "public domain",
           "SpaceX (Falcon 9 launch); scikit-image data"),
    Source("hubble_deep_field", "skimage", "scikit-image", "data/hubble_deep_field.jpg", "public domain",
           "NASA / Hubble; scikit-image data"),
    Source("china", "sklearn", "scikit-learn", "datasets/images/china.jpg", "CC BY 2.0",
           "danielbuechele (Flickr), retrieved by Robert Layton; scikit-learn sample images"),
    Source("flower", "sklearn", "scikit-learn", "datasets/images/flower.jpg", "CC BY 2.0",
           "vultilion (Flickr), retrieved by Robert Layton; scikit-learn sample images"),
    Source("grace_hopper", "matplotlib", "matplotlib", "mpl-data/sample_data/grace_hopper.jpg", "public domain",
           "US Navy official portrait of Grace Hopper; matplotlib sample data"),
)

INFO = DatasetInfo(
    name=NAME,
    num_classes=len(SOURCES),
    class_names=tuple(s.name for s in SOURCES),
    image_size=(SIZE, SIZE),
    in_chans=3,
    class_groups={},
    description=(f"random multi-scale crops + flips of {len(SOURCES)} colour photos shipped by scikit-image, "
                 "scikit-learn and matplotlib, 224x224 RGB; label = source photo (crops of a photo overlap across "
                 "splits)"),
)


def source_path(src: Source) -> Path:
    spec = importlib.util.find_spec(src.package)
    if spec is None or spec.origin is None:
        raise VitposError(f"the natural data needs {src.pip}'s sample photos ({src.path}); install it with: "
                          f"pip install {src.pip}")
    path = Path(spec.origin).parent / src.path
    if not path.is_file():
        raise VitposError(f"{path} is missing from the installed {src.pip}; reinstall it with: "
                          f"pip install --force-reinstall {src.pip}")
    return path


@lru_cache(maxsize=1)
def photos() -> tuple[torch.Tensor, ...]:
    """The source photos as uint8 (3, H, W) tensors, in SOURCES order (~6 MB in all)."""
    from PIL import Image

    out = []
    for src in SOURCES:
        path = source_path(src)
        try:
            with Image.open(path) as im:
                arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
        except OSError as e:
            raise VitposError(f"cannot read {path} ({e}); reinstall it with: pip install --force-reinstall "
                              f"{src.pip}") from e
        out.append(torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous())
    return tuple(out)


@dataclass(frozen=True)
class CropBox:
    photo: int
    top: int
    left: int
    height: int
    width: int
    flip: bool


def crop_box(base_seed: int, i: int, shapes: tuple[tuple[int, int], ...]) -> CropBox:
    """Crop i's photo, box and flip: a pure function of (base_seed, i) and the photos' sizes."""
    rng = np.random.default_rng([base_seed, i])
    photo = int(rng.integers(len(shapes)))
    h, w = shapes[photo]
    area = h * w * float(np.exp(rng.uniform(np.log(SCALE[0]), np.log(SCALE[1]))))
    aspect = float(np.exp(rng.uniform(np.log(ASPECT[0]), np.log(ASPECT[1]))))
    cw = min(w, max(1, round((area * aspect) ** 0.5)))
    ch = min(h, max(1, round((area / aspect) ** 0.5)))
    top = int(rng.integers(h - ch + 1))
    left = int(rng.integers(w - cw + 1))
    return CropBox(photo, top, left, ch, cw, bool(rng.random() < 0.5))


def make_crop(box: CropBox, size: int = SIZE) -> torch.Tensor:
    """uint8 (3, size, size) of one crop box."""
    img = photos()[box.photo][:, box.top : box.top + box.height, box.left : box.left + box.width]
    x = F.interpolate(img[None].float(), size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    x = x.round_().clamp_(0, 255).to(torch.uint8)[0]
    return x.flip(-1) if box.flip else x


class LazyCrops:
    """Behaves like the uint8 (N, 3, SIZE, SIZE) tensor TensorImageDataset holds (indexing by int,
    slice or index tensor; shape, dtype, ndim), making each indexed crop on the fly."""

    dtype = torch.uint8
    ndim = 4

    def __init__(self, base_seed: int, ids: np.ndarray, size: int = SIZE):
        self.base_seed = base_seed
        self.ids = ids
        self.size = size

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.ids), 3, self.size, self.size))

    def __len__(self) -> int:
        return len(self.ids)

    def boxes(self, ids) -> list[CropBox]:
        shapes = tuple((int(p.shape[1]), int(p.shape[2])) for p in photos())
        return [crop_box(self.base_seed, int(i), shapes) for i in ids]

    @overload
    def __getitem__(self, key: slice) -> Self: ...
    @overload
    def __getitem__(self, key: int | np.integer | torch.Tensor | np.ndarray | list[int]) -> torch.Tensor: ...

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self.with_ids(self.ids[key])
        if isinstance(key, (int, np.integer)):
            return self.render(self.ids[[int(key)]])[0]
        idx = key.cpu().numpy() if isinstance(key, torch.Tensor) else np.asarray(key)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        return self.render(self.ids[idx])

    def with_ids(self, ids: np.ndarray) -> Self:
        """The same crops generator over other ids (a slice of this one)."""
        return type(self)(self.base_seed, ids, self.size)

    def render(self, ids: np.ndarray) -> torch.Tensor:
        """uint8 (len(ids), 3, size, size): the items these ids name (subclasses change what an item is)."""
        if not len(ids):
            return torch.empty((0, 3, self.size, self.size), dtype=torch.uint8)
        return torch.stack([make_crop(b, self.size) for b in self.boxes(ids)])


def labels_for(base_seed: int, ids: np.ndarray) -> torch.Tensor:
    shapes = tuple((int(p.shape[1]), int(p.shape[2])) for p in photos())
    return torch.tensor([crop_box(base_seed, int(i), shapes).photo for i in ids], dtype=torch.int64)


class NaturalCrops(TensorImageDataset):
    """A TensorImageDataset whose `images` are LazyCrops: the same interface (batches, subset,
    with_transform, indexing), each crop made when a batch asks for it."""

    images: LazyCrops  # pyright: ignore[reportIncompatibleVariableOverride]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self._float(cast(torch.Tensor, self.images[torch.tensor([i])]))[0], int(self.labels[i])

    def subset(self, n: int | None) -> NaturalCrops:
        if n is None or n >= len(self):
            return self
        return type(self)(self.images[:n], self.labels[:n], self.info, self.split,  # pyright: ignore[reportArgumentType]
                          self.transform)

    def with_transform(self, transform, info: DatasetInfo) -> NaturalCrops:
        return type(self)(self.images, self.labels, info, self.split, transform)  # pyright: ignore[reportArgumentType]


def load_split(split: str, seed: int = 0, limit: int | None = None) -> NaturalCrops:
    """`limit` crops (default SPLIT_SIZES[split]) of a split; crop i depends only on (seed, split, i)."""
    n = SPLIT_SIZES[split] if limit is None else min(max(int(limit), 0), SPLIT_SIZES[split])
    base = split_seed(seed, NAME, split)
    ids = np.arange(n)
    # the labels are the crops' photo ids: drawn without making any crop
    return NaturalCrops(LazyCrops(base, ids), labels_for(base, ids), INFO, split)  # pyright: ignore[reportArgumentType]


def licence_table() -> str:
    """The sources as a markdown table (docs/real-models.md carries it)."""
    rows = ["| photo | package | file | licence | credit |", "|---|---|---|---|---|"]
    rows += [f"| {s.name} | {s.pip} | `{s.path}` | {s.licence} | {s.credit} |" for s in SOURCES]
    return "\n".join(rows)


__all__ = ["INFO", "NAME", "SIZE", "SOURCES", "SPLIT_SIZES", "LazyCrops", "NaturalCrops", "crop_box",
           "licence_table", "load_split", "make_crop", "photos", "source_path"]
