"""`regions` (issue 47 item 5): a content task whose test crops share no pixel with its training crops."""

import pytest
import torch

pytest.importorskip("skimage")

from vitpos.data import dataset_info, load_split, natural, regions  # noqa: E402
from vitpos.data.natural import NaturalCrops  # noqa: E402


def test_train_val_and_test_crops_share_no_pixel():
    train, val, test = (regions.pixels_used(s, n) for s, n in (("train", 300), ("val", 100), ("test", 300)))
    for tr, va, te in zip(train, val, test, strict=True):
        assert tr.any() and te.any()
        assert not (tr & te).any() and not (va & te).any()


def test_labels_are_the_photo_each_crop_is_cut_from_and_crops_are_deterministic():
    ds = regions.load_split("test", limit=24)
    assert torch.equal(ds.labels, load_split("regions", "test", limit=24).labels)  # the registry's name reaches it
    boxes = ds.images.boxes(range(24))
    assert [b.photo for b in boxes] == ds.labels.tolist()
    again = regions.load_split("test", limit=24)
    assert torch.equal(ds.images[torch.arange(24)], again.images[torch.arange(24)])
    # crop 5 is the crop of its box, and it lies in the test region of its photo
    b = boxes[5]
    assert torch.equal(ds.images[5], natural.make_crop(b))
    left, right = regions.region("test", int(natural.photos()[b.photo].shape[2]))
    assert left <= b.left and b.left + b.width <= right


def test_a_prefix_keeps_its_split_and_every_class_appears():
    ds = regions.load_split("train", limit=400)
    sub = ds.subset(50)
    assert isinstance(sub, NaturalCrops)
    assert isinstance(sub.images, regions.LazyRegionCrops) and sub.images.split == "train"
    assert torch.equal(sub.images[torch.arange(50)], ds.images[torch.arange(50)])
    assert set(ds.labels.tolist()) == set(range(len(natural.SOURCES)))
    assert dataset_info("regions").num_classes == len(natural.SOURCES)
