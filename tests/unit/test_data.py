import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import needs_fashion
from vitpos.data import BUILTIN, dataset_info, digits, fashion, imagefolder, load_split, shapes
from vitpos.data.base import split_seed
from vitpos.errors import VitposError


def row_hashes(images: torch.Tensor) -> set[str]:
    return {hashlib.sha1(x.contiguous().numpy().tobytes()).hexdigest() for x in images}


# ---------------------------------------------------------------- shapes


def test_shapes_deterministic_and_split_disjoint():
    seeds = {s: split_seed(0, "shapes", s) for s in ("train", "val", "test")}
    a, la = shapes.generate(120, seeds["val"])
    b, lb = shapes.generate(120, seeds["val"])
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert a.shape == (120, 3, 32, 32) and a.dtype == torch.uint8
    assert torch.bincount(la, minlength=4).min() >= 15  # balanced-ish (expected 30 each)
    hashes = {s: row_hashes(shapes.generate(120, seed)[0]) for s, seed in seeds.items()}
    assert len(hashes["val"]) == 120  # no duplicate scenes inside a split either
    assert not hashes["train"] & hashes["val"] and not hashes["train"] & hashes["test"]
    assert not hashes["val"] & hashes["test"]


def test_shapes_load_split_interface():
    ds = load_split("shapes", "val", limit=8)
    assert len(ds) == 8 and ds.info is shapes.INFO and ds.split == "val"
    x, y = ds[0]
    assert x.dtype == torch.float32 and x.shape == (3, 32, 32) and -1 <= x.min() and x.max() <= 1
    assert 0 <= y < 4
    more = load_split("shapes", "val", limit=20)
    assert torch.equal(more.images[:8], ds.images) and torch.equal(more.labels[:8], ds.labels)
    full = shapes.generate(20, split_seed(0, "shapes", "val"))
    assert torch.equal(full[0], more.images)


# ---------------------------------------------------------------- digits


def test_digits_pools_are_disjoint_and_cover_source():
    pools = digits.pools()
    sets = {s: set(p.tolist()) for s, p in pools.items()}
    assert not sets["train"] & sets["val"] and not sets["train"] & sets["test"] and not sets["val"] & sets["test"]
    assert len(sets["train"] | sets["val"] | sets["test"]) == 1797
    _, classes = digits.source()
    for p in pools.values():
        assert set(classes[p].tolist()) == set(range(10))  # every class in every pool


def test_digits_label_is_upper_digit_and_scene_matches_meta():
    images, labels, meta = digits.generate(300, 5, pool="val", return_meta=True)
    assert images.shape == (300, 3, 32, 32) and images.dtype == torch.uint8
    assert torch.equal(images[:, 0], images[:, 1]) and torch.equal(images[:, 0], images[:, 2])  # grey
    assert np.array_equal(labels.numpy(), meta["upper_class"])
    src, classes = digits.source()
    assert np.array_equal(classes[meta["upper_source"]], meta["upper_class"])
    assert np.array_equal(classes[meta["lower_source"]], meta["lower_class"])
    assert (meta["upper_class"] != meta["lower_class"]).all()
    pool = set(digits.pools()["val"].tolist())
    assert set(meta["upper_source"].tolist()) | set(meta["lower_source"].tolist()) <= pool
    uy, ux = meta["upper_yx"].T
    ly, lx = meta["lower_yx"].T
    assert (uy + digits.DIGIT + digits.GAP <= ly).all()  # clearly above, never overlapping
    assert (ly + digits.DIGIT <= 32).all() and (ux >= 0).all() and (lx + digits.DIGIT <= 32).all()
    assert len(set(ux.tolist())) > 10 and len(set(uy.tolist())) > 3  # positions really vary
    # Re-render every scene from its metadata: the canvas holds exactly these two digits.
    canvas = np.zeros((300, 32, 32), np.uint8)
    d = digits.DIGIT
    for i in range(300):
        canvas[i, uy[i] : uy[i] + d, ux[i] : ux[i] + d] = src[meta["upper_source"][i]]
        canvas[i, ly[i] : ly[i] + d, lx[i] : lx[i] + d] = src[meta["lower_source"][i]]
    assert np.array_equal(canvas, images[:, 0].numpy())


def test_digits_splits_deterministic_balanced_disjoint():
    a = digits.generate(50, 11, pool="test")
    b = digits.generate(50, 11, pool="test")
    c = digits.generate(50, 12, pool="test")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    splits = {s: load_split("digits", s) for s in ("train", "val", "test")}
    assert {s: len(ds) for s, ds in splits.items()} == digits.SPLIT_SIZES
    for ds in splits.values():
        counts = torch.bincount(ds.labels, minlength=10)
        assert counts.min() == counts.max() == len(ds) // 10
        assert ds.info.num_classes == 10 and ds.images.shape[1:] == (3, 32, 32)
    h = {s: row_hashes(ds.images) for s, ds in splits.items()}
    assert not h["train"] & h["val"] and not h["train"] & h["test"] and not h["val"] & h["test"]
    again = digits.generate(digits.SPLIT_SIZES["val"], split_seed(0, "digits", "val"), pool="val")[0]
    assert torch.equal(again, splits["val"].images)  # the split is exactly the seeded generator


def test_builtin_with_transform_is_lazy_and_sized_by_transform():
    def tf(im):
        arr = np.asarray(im.resize((16, 16)), dtype=np.float32) / 255.0
        return torch.from_numpy(arr).permute(2, 0, 1)

    ds = load_split("digits", "val", limit=5, transform=tf)
    assert len(ds) == 5 and ds.info.image_size == (16, 16) and ds.info.in_chans == 3
    x, y = next(ds.batches(4))
    assert x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(y, load_split("digits", "val", limit=4).labels)


# ---------------------------------------------------------------- fashion


def write_idx(path: Path, arr: np.ndarray, magic: bytes | None = None) -> None:
    header = magic or bytes([0, 0, 8, arr.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    path.write_bytes(gzip.compress(header + arr.astype(np.uint8).tobytes()))


def fake_fashion(root: Path, n_train: int = 24, n_test: int = 6) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for part, n, offset in (("train", n_train, 0), ("t10k", n_test, n_train)):
        # Image i is filled with the value offset + i, so every image is unique and traceable.
        imgs = np.repeat(np.arange(offset, offset + n, dtype=np.uint8), 28 * 28).reshape(n, 28, 28)
        write_idx(root / f"{part}-images-idx3-ubyte.gz", imgs)
        write_idx(root / f"{part}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return root


def test_fashion_reads_tiny_idx_and_splits(tmp_path, monkeypatch):
    monkeypatch.setenv("VITPOS_FASHION_DIR", str(fake_fashion(tmp_path / "fm")))
    splits = {s: load_split("fashion", s) for s in ("train", "val", "test")}
    assert {s: len(ds) for s, ds in splits.items()} == {"train": 22, "val": 2, "test": 6}
    ids = {s: set(ds.images[:, 0, 0, 0].tolist()) for s, ds in splits.items()}
    assert ids["train"] | ids["val"] == set(range(24)) and not ids["train"] & ids["val"]
    assert ids["test"] == set(range(24, 30))
    for ds in splits.values():
        assert ds.images.shape[1:] == (1, 28, 28) and ds.images.dtype == torch.uint8
        assert torch.equal(ds.labels, (ds.images[:, 0, 0, 0].long() % 24) % 10)  # labels stay with images
    other = load_split("fashion", "val", seed=3)
    assert set(other.images[:, 0, 0, 0].tolist()) == ids["val"]  # membership never depends on the seed
    assert fashion.split_sizes(60000) == {"train": 55000, "val": 5000}
    assert dataset_info("fashion").class_names[0] == "T-shirt/top"


def test_fashion_missing_and_corrupt(tmp_path, monkeypatch):
    monkeypatch.setenv("VITPOS_FASHION_DIR", str(tmp_path / "nope"))
    assert dataset_info("fashion").num_classes == 10  # the info needs no files
    with pytest.raises(VitposError, match="apt-get install dataset-fashion-mnist"):
        load_split("fashion", "train")
    root = fake_fashion(tmp_path / "bad")
    monkeypatch.setenv("VITPOS_FASHION_DIR", str(root))
    imgs = np.zeros((3, 28, 28), np.uint8)
    write_idx(root / "t10k-images-idx3-ubyte.gz", imgs, magic=bytes([0, 0, 8, 9]))
    with pytest.raises(VitposError, match="bad magic"):
        load_split("fashion", "test")
    good = gzip.decompress((root / "train-images-idx3-ubyte.gz").read_bytes())
    (root / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(good[:-100]))
    with pytest.raises(VitposError, match="bytes, expected"):
        load_split("fashion", "train")
    (root / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(VitposError, match="decompress"):
        load_split("fashion", "train")


@needs_fashion
def test_fashion_real_files(monkeypatch):
    monkeypatch.delenv("VITPOS_FASHION_DIR", raising=False)
    ds = load_split("fashion", "test", limit=10)
    assert len(ds) == 10 and ds.images.shape == (10, 1, 28, 28)
    assert len(load_split("fashion", "test")) == 10000


# ---------------------------------------------------------------- imagefolder


def make_tree(root: Path, classes=("cat", "dog", "emu"), per_class: int = 10) -> Path:
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 6), (c * 100, i * 20, 7)).save(root / name / f"{i}.png")
    return root


def test_imagefolder_classes_splits_and_interface(tmp_path):
    root = make_tree(tmp_path / "tree")
    (root / ".ipynb_checkpoints").mkdir()  # hidden folders are not classes
    name = f"imagefolder:{root}"
    info = dataset_info(name)
    assert info.class_names == ("cat", "dog", "emu") and info.num_classes == 3
    splits = {s: load_split(name, s) for s in ("train", "val", "test")}
    assert {s: len(ds) for s, ds in splits.items()} == {"train": 24, "val": 3, "test": 3}
    keys = {s: set(ds.keys) for s, ds in splits.items()}
    assert not keys["train"] & keys["val"] and not keys["train"] & keys["test"] and not keys["val"] & keys["test"]
    assert len(keys["train"] | keys["val"] | keys["test"]) == 30
    for ds in splits.values():  # each label is its folder's class id
        assert [info.class_names[int(y)] for y in ds.labels] == [Path(p).parent.name for p in ds.keys]
    x, y = splits["val"][0]
    assert x.shape == (3, 224, 224) and x.dtype == torch.float32 and -1 <= x.min() and x.max() <= 1
    assert splits["val"].info.image_size == (224, 224)

    imagefolder._split_samples.cache_clear()  # determinism must not come from the cache
    assert load_split(name, "train").keys == splits["train"].keys
    assert set(load_split(name, "train", seed=1).keys) != keys["train"]

    from torchvision import transforms as T

    small = load_split(name, "train", limit=5, transform=T.Compose([T.Resize((12, 10)), T.ToTensor()]))
    assert len(small) == 5 and small.split == "train" and small.info.image_size == (12, 10)
    batches = list(small.batches(2, shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert [b[0].shape for b in batches] == [(2, 3, 12, 10), (2, 3, 12, 10), (1, 3, 12, 10)]
    assert all(b[1].dtype == torch.int64 for b in batches)
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == sorted(small.labels.tolist())
    assert len(small.subset(3)) == 3


def test_imagefolder_presplit_keeps_class_ids(tmp_path):
    root = tmp_path / "pre"
    make_tree(root / "train", per_class=3)
    make_tree(root / "val", classes=("cat", "emu"), per_class=2)  # no dog in val
    name = f"imagefolder:{root}"
    assert dataset_info(name).class_names == ("cat", "dog", "emu")
    assert len(load_split(name, "train")) == 9
    val = load_split(name, "val")
    assert len(val) == 4 and sorted(val.labels.tolist()) == [0, 0, 2, 2]
    with pytest.raises(VitposError, match="no test/ folder"):
        load_split(name, "test")


def test_imagefolder_errors(tmp_path):
    with pytest.raises(VitposError, match="not a folder"):
        dataset_info(f"imagefolder:{tmp_path / 'missing'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(VitposError, match="no class folders"):
        load_split(f"imagefolder:{tmp_path / 'empty'}", "train")
    (tmp_path / "flat").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "flat" / "a.png")
    with pytest.raises(VitposError, match="no class folders"):
        dataset_info(f"imagefolder:{tmp_path / 'flat'}")
    (tmp_path / "hollow" / "cat").mkdir(parents=True)
    with pytest.raises(VitposError, match="only 0 images"):
        load_split(f"imagefolder:{tmp_path / 'hollow'}", "train")
    with pytest.raises(VitposError, match="needs a path"):
        dataset_info("imagefolder:")


def test_unknown_dataset_and_split():
    with pytest.raises(VitposError, match="unknown dataset 'mnist'.*shapes, pairs, digits, fashion"):
        dataset_info("mnist")
    with pytest.raises(VitposError, match="unknown dataset"):
        load_split("mnist", "train")
    with pytest.raises(VitposError, match="unknown split"):
        load_split("shapes", "training")
    assert all(dataset_info(n).name == n for n in BUILTIN)
