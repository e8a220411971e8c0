"""The zoo's task (`pairs`) and recipes: the properties the zoo's verdicts lean on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage

from vitpos import zoo
from vitpos.data import load_split, pairs
from vitpos.errors import VitposError
from vitpos.models.own import OwnViTConfig, build_own_vit

PATCH = 4


def _blobs(img: np.ndarray) -> list[np.ndarray]:
    """Boolean masks of the two shapes (pixels far above the noise background)."""
    fg = img.astype(int).max(axis=0) > 70
    lab, n = ndimage.label(fg, structure=np.ones((3, 3)))
    return [lab == i for i in range(1, n + 1)]


def _fill(mask: np.ndarray) -> float:
    ys, xs = np.nonzero(mask)
    return float(mask.sum()) / float((np.ptp(ys) + 1) * (np.ptp(xs) + 1))


@pytest.fixture(scope="module")
def scenes():
    return pairs.generate(400, seed=7)


def test_scenes_are_deterministic_and_prefix_stable(scenes):
    images, labels = scenes
    again, again_labels = pairs.generate(50, seed=7)
    assert torch.equal(images[:50], again) and torch.equal(labels[:50], again_labels)
    other, _ = pairs.generate(50, seed=8)
    assert not torch.equal(images[:50], other)


def test_every_scene_has_two_shapes_no_patch_sees_both_and_relations_match_labels(scenes):
    images, labels = scenes
    stacked_by_group = {"content": [], "relation": []}
    for img, label in zip(images.numpy(), labels.tolist(), strict=True):
        blobs = _blobs(img)
        assert len(blobs) == 2, "a scene holds exactly two separated shapes"
        # No 4-px patch holds pixels of both shapes: a position-free model cannot read the relation locally.
        owners = [np.add.reduceat(np.add.reduceat(b, np.arange(0, 32, PATCH), 0), np.arange(0, 32, PATCH), 1) > 0
                  for b in blobs]
        assert not (owners[0] & owners[1]).any()
        (y1, x1), (y2, x2) = (ndimage.center_of_mass(b) for b in blobs)
        stacked = abs(y1 - y2) > abs(x1 - x2)
        stacked_by_group["content" if label < 4 else "relation"].append(stacked)
        if label >= 4:
            assert stacked == (label in (4, 5))
            first = 0 if (y1 < y2 if stacked else x1 < x2) else 1  # the top (left) shape
            # The first shape is the disc exactly for classes 4 and 6; a disc fills less of its
            # bounding box than a square does.
            first_is_disc = _fill(blobs[first]) < _fill(blobs[1 - first])
            assert first_is_disc == (label in (4, 6)), label
    # The arrangement is drawn the same way for content and relation classes: alignment tells nothing.
    for flags in stacked_by_group.values():
        assert 0.35 < np.mean(flags) < 0.65


def test_groups_cover_the_classes_once_and_splits_are_disjoint():
    covered = sorted(c for g in pairs.CLASS_GROUPS.values() for c in g)
    assert covered == list(range(pairs.INFO.num_classes))
    a = load_split("pairs", "train", limit=64).images
    b = load_split("pairs", "test", limit=64).images
    assert not any(torch.equal(x, y) for x in a for y in b)


def test_zoo_recipes_build_the_matched_models():
    names = zoo.members()
    assert len(names) == 21 and len(set(names)) == 21
    built = {}
    for enc in zoo.ENCODINGS:
        r = zoo.recipe(f"pairs-{enc.key}")
        cfg = OwnViTConfig(pe=r["pe"], num_classes=8, img_size=32, **r["model_overrides"])
        assert cfg.embed_dim // cfg.num_heads >= 32 and cfg.num_heads >= 4 and cfg.depth >= 6 and cfg.grid == (8, 8)
        torch.manual_seed(0)
        model = build_own_vit(cfg)
        built[enc.key] = model
        has_ape = model.pos_embed is not None
        assert has_ape == (enc.pe in ("ape", "ape-sincos", "rope-mixed-ape"))
        assert (model.rope is not None) == enc.pe.startswith("rope")
    # Same architecture apart from the encoding: every non-positional parameter has the same shape.
    shapes = {k: {n: tuple(p.shape) for n, p in m.named_parameters() if "pos_embed" not in n and "rope" not in n}
              for k, m in built.items()}
    assert all(s == shapes["none"] for s in shapes.values())
    # Seeds differ only in the seed.
    r0, r1 = zoo.recipe("pairs-rope-axial"), zoo.recipe("builtin:pairs-rope-axial-seed1")
    assert {k: v for k, v in r0.items() if k != "seed"} == {k: v for k, v in r1.items() if k != "seed"}
    assert (r0["seed"], r1["seed"]) == (0, 1)
    # One training recipe for all encodings, epochs included.
    common = {k: v for k, v in r0.items() if k not in ("pe", "model_overrides")}
    assert common["epochs"] == 12
    for enc in zoo.ENCODINGS:
        r = {k: v for k, v in zoo.recipe(f"pairs-{enc.key}").items() if k not in ("pe", "model_overrides")}
        assert r == common, enc.key
    with pytest.raises(VitposError, match="not a zoo member"):
        zoo.recipe("pairs-rope-2d")


def test_random_init_ape_is_not_axis_split():
    """The truncated-normal APE table starts without structure: each channel is not a function of one
    coordinate (unlike the sin-cos init, where every channel is)."""
    def axis_split_share(table: torch.Tensor) -> float:
        t = table.reshape(8, 8, -1)
        row_only = (t - t.mean(1, keepdim=True)).abs().amax((0, 1)) < 1e-6  # constant along columns
        col_only = (t - t.mean(0, keepdim=True)).abs().amax((0, 1)) < 1e-6
        return float((row_only | col_only).float().mean())

    for enc, want in (("ape", 0.0), ("ape-sinit", 1.0)):
        r = zoo.recipe(f"pairs-{enc}")
        torch.manual_seed(0)
        model = build_own_vit(OwnViTConfig(pe=r["pe"], num_classes=8, **r["model_overrides"]))
        assert axis_split_share(model.pos_embed.detach()[0]) == want


def test_a_member_trained_under_another_recipe_is_named(tmp_path):
    """`zoo list` and `vitpos run` flag a shipped member whose train_config departs from the recipe."""
    import json
    import shutil

    from vitpos.models.spec import BUILTIN_DIR

    shipped = BUILTIN_DIR / "pairs-ape"
    assert zoo.recipe_differences("pairs-ape", shipped) == []  # trained with the current recipe
    old = tmp_path / "pairs-ape"
    shutil.copytree(shipped, old)
    cfg = json.loads((old / "train_config.json").read_text())
    cfg["train"]["epochs"], cfg["model"]["embed_dim"] = 4, 96
    (old / "train_config.json").write_text(json.dumps(cfg))
    assert zoo.recipe_differences("pairs-ape", old) == ["epochs: 4 (12)", "model.embed_dim: 96 (128)"]
    assert zoo.older_recipe_note("builtin:rope-axial") is None  # not a zoo member
    assert zoo.older_recipe_note("builtin:pairs-ape") is None


def test_zoo_list_reads_in_80_columns(monkeypatch, capsys):
    """Every member on one line with its name, top-1 and groups whole (no '…'), in an 80-column terminal."""
    from vitpos.cli import main, out_console
    from vitpos.models.spec import BUILTIN_DIR

    monkeypatch.setattr(out_console, "_width", 80)
    main(["zoo", "list"])
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80 and not any("…" in line for line in lines)
    rows = {line.split()[0]: line.split() for line in lines if line.strip().startswith("pairs-")}
    assert set(rows) == set(zoo.members())
    shipped = [n for n in zoo.members() if (BUILTIN_DIR / n / "metrics.json").is_file()]
    assert shipped and all(rows[n][1] != "-" and rows[n][2].count("/") == 2 for n in shipped)


def test_the_none_model_sees_a_bag_of_patches_and_stays_under_the_bag_bound():
    """The position-free member is exactly invariant to shuffling its 4-px patches, and on the
    relation classes it reaches no more than the best bag-of-patches rule (`pairs.bag_bound`), which
    is above 1/4 (the shapes' sub-patch phases carry some of the relation) and far below 1."""
    from vitpos.models.spec import load_model

    torch.manual_seed(0)
    surface = load_model("builtin:pairs-none")
    x, y = next(load_split("pairs", "test", limit=1000).batches(1000))
    b, c, h, w = x.shape
    g = h // PATCH
    tiles = x.reshape(b, c, g, PATCH, g, PATCH).permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, c, PATCH, PATCH)
    shuffled = tiles[:, torch.randperm(g * g)].reshape(b, g, g, c, PATCH, PATCH)
    shuffled = shuffled.permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
    with torch.no_grad():
        logits, logits_shuffled = surface(x), surface(shuffled)
    assert torch.allclose(logits, logits_shuffled, atol=1e-4)
    relation = y >= 4
    acc = float((logits.argmax(-1) == y)[relation].float().mean())
    bound = pairs.bag_bound(n_fit=100_000, n_eval=20_000)
    se = (bound * (1 - bound) / int(relation.sum())) ** 0.5
    assert 0.40 < bound < 0.60
    assert acc <= bound + 3 * se
