"""`tiles`: natural crops with their tile rows / columns reversed; only position tells the classes apart."""

from __future__ import annotations

import pytest
import torch

from conftest import TIMM_TINY
from vitpos.data import tiles
from vitpos.errors import VitposError

G = tiles.GRID


def _tiles_of(x: torch.Tensor) -> torch.Tensor:
    """(C, S, S) -> (G, G, C, TILE, TILE): the tile at each (row, col)."""
    c = x.shape[0]
    return x.reshape(c, G, tiles.TILE, G, tiles.TILE).permute(1, 3, 0, 2, 4)


def test_reorder_moves_whole_tiles_and_keeps_their_pixels():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (3, tiles.SIZE, tiles.SIZE), dtype=torch.uint8, generator=g)
    t = _tiles_of(x)
    rows, cols, both = (_tiles_of(tiles.reorder(x, o)) for o in (1, 2, 3))
    assert torch.equal(rows, t.flip(0)) and torch.equal(cols, t.flip(1)) and torch.equal(both, t.flip(0).flip(1))
    assert torch.equal(tiles.reorder(x, 0), x)
    for o in (1, 2, 3):
        assert torch.equal(tiles.reorder(tiles.reorder(x, o), o), x)
        assert not torch.equal(tiles.reorder(x, o), x)
    with pytest.raises(ValueError):
        tiles.reorder(x, 4)


def test_each_crop_comes_in_all_four_orders_with_balanced_labels():
    pytest.importorskip("skimage")
    from vitpos.data import dataset_info, load_split

    ds = load_split("tiles", "val", limit=8)
    assert isinstance(ds, tiles.TileCrops) and len(ds) == 8
    assert ds.labels.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    x = ds.images[torch.arange(8)]
    assert x.shape == (8, 3, tiles.SIZE, tiles.SIZE) and x.dtype == torch.uint8
    for c in (0, 1):
        for o in range(4):
            assert torch.equal(x[4 * c + o], tiles.reorder(x[4 * c], o))
    assert not torch.equal(x[0], x[4])  # another crop
    # prefix-stable and seeded like `natural`, but not `natural`'s crops
    assert torch.equal(load_split("tiles", "val", limit=3).images[torch.arange(3)], x[:3])
    assert torch.equal(ds[5][0], ds.subset(6)[5][0])
    assert not torch.equal(load_split("tiles", "test", limit=1).images[torch.arange(1)], x[:1])
    assert not torch.equal(load_split("natural", "val", limit=1).images[torch.arange(1)], x[:1])
    info = dataset_info("tiles")
    assert info.num_classes == 4 and info.image_size == (tiles.SIZE, tiles.SIZE) and info.class_groups == {}


def test_a_model_without_position_cannot_tell_the_orders_apart():
    """The task's position-free ceiling is chance, exactly: the four orders are the same bag of patch
    tokens for a model that patches at the tiles (timm's ViT, patch 14 at 224, no position)."""
    pytest.importorskip("skimage")
    from timm.models.vision_transformer import VisionTransformer

    from vitpos.data import load_split

    x = load_split("tiles", "train", limit=8).images[torch.arange(8)].float().div(127.5).sub(1)
    torch.manual_seed(0)
    blind = VisionTransformer(img_size=tiles.SIZE, patch_size=tiles.TILE, embed_dim=32, depth=2, num_heads=2,
                              num_classes=4, class_token=False, global_pool="avg", pos_embed="none").eval()
    with torch.no_grad():
        y = blind.forward_head(blind.forward_features(x), pre_logits=True).view(2, 4, -1)
        t = blind.patch_embed(x).flatten(1, 2).view(2, 4, tiles.GRID**2, -1)
    assert (y[1, 0] - y[0, 0]).norm() > 0.1 * y[0, 0].norm()  # not a constant: another crop moves it
    for c in range(2):
        for o in range(1, 4):
            torch.testing.assert_close(y[c, o], y[c, 0], atol=1e-4, rtol=1e-4)
            assert not torch.equal(t[c, o], t[c, 0])  # the tokens are the same set in another order
            torch.testing.assert_close(t[c, o].sort(0).values, t[c, 0].sort(0).values)


def test_a_model_whose_patches_are_not_the_tiles_is_refused_in_one_line():
    from vitpos.data.resolve import require_fit
    from vitpos.models.spec import load_model

    wrong = load_model(TIMM_TINY["vit"])  # 16 px input, 4-px patches
    with pytest.raises(VitposError, match=r"14-px tiles at 224 px.*4 x 4 patches") as e:
        require_fit(wrong, "tiles")
    assert "\n" not in str(e.value)
    require_fit(wrong, "natural")  # other data: no such condition
    fits = load_model("timm:vit_small_patch14_dinov2?img_size=224&depth=1&embed_dim=32&num_heads=2&num_classes=4")
    require_fit(fits, "tiles")


def test_run_refuses_tiles_on_a_misfit_model_before_writing(tmp_path, capsys):
    pytest.importorskip("skimage")
    from vitpos.cli import main

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["run", "--models", TIMM_TINY["vit"], "--data", "tiles", "--quick", "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: tiles is built of 14-px tiles")
    assert not out.exists()


def test_the_tiles_config_differs_from_the_natural_one_only_in_the_labelled_task():
    from pathlib import Path

    from vitpos.study.config import load_config

    root = Path(__file__).resolve().parents[2] / "configs"
    tiles_cfg = load_config(root / "dinov2-tiles.yaml", {}, quick=False)
    natural_cfg = load_config(root / "dinov2-natural.yaml", {}, quick=False)
    assert tiles_cfg.data == ["tiles"] and tiles_cfg.head.images >= 5000
    assert tiles_cfg.sae == natural_cfg.sae and tiles_cfg.models == natural_cfg.models
    assert tiles_cfg.checkpoints == natural_cfg.checkpoints


def test_extrapolation_is_not_applicable_to_tiles_and_the_plan_says_why(tmp_path, capsys):
    """`tiles` exists only at the model's own input size (its tiles are the patches): the study marks
    `extrapolate` not applicable with the reason, in the plan, instead of stopping at that stage with an
    error after the stages before it have run; `vitpos extrapolate` on it is refused in one line."""
    pytest.importorskip("skimage")
    from vitpos.cli import main
    from vitpos.experiments.extrapolate import ExtrapolateExperiment, check_scales
    from vitpos.models.spec import load_model

    exp = ExtrapolateExperiment()
    assert exp.applies_to_data("shapes") is None and exp.applies_to_data("natural") is None
    reason = exp.applies_to_data("tiles")
    assert reason is not None and "only at the model's own input size" in reason
    spec = "timm:vit_small_patch14_dinov2?img_size=224&depth=1&embed_dim=32&num_heads=2&num_classes=4"
    with pytest.raises(VitposError, match="only at the model's own input size") as e:
        check_scales(load_model(spec), [1.5], data="tiles")
    assert "\n" not in str(e.value)
    out = tmp_path / "out"
    main(["run", "--models", spec, "--data", "tiles", "--quick", "--plan", "--out", str(out)])
    rows = [line for line in capsys.readouterr().out.splitlines() if " extrapolate " in line]
    assert len(rows) == 1 and "n/a" in rows[0] and "only at the model" in rows[0]
    assert not out.exists()
