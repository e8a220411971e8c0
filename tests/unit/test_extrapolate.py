"""extrapolate: ModelSurface.at_size (timm's own resize on a model copy), shapes at other sizes, and
the experiment that probes and scores the model on grids larger than it was trained on."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.layers.pos_embed import resample_abs_pos_embed

import vitpos.experiments.extrapolate as extra
from conftest import TIMM_TINY, TINY, images_for, tiny_own, tiny_surface, tiny_timm
from vitpos.data import load_split
from vitpos.data.base import DatasetInfo, TensorImageDataset
from vitpos.errors import VitposError
from vitpos.experiments.extrapolate import ExtrapolateExperiment, check_scales, run_extrapolate
from vitpos.models.own import OwnViTConfig, build_own_vit
from vitpos.models.spec import parse_timm_spec
from vitpos.models.timm_adapter import surface_for

OWN = ["ape", "ape-sincos", "rope-axial", "rope-mixed", "rope-ape", "none"]
FAMILIES = [pytest.param(("own", pe), id=f"own-{pe}") for pe in OWN] + [
    pytest.param(("timm", k), id=f"timm-{k}") for k in TIMM_TINY]
APE = [p for p in FAMILIES if p.values[0][1] in ("ape", "ape-sincos", "rope-ape", "vit", "vit_reg", "deit3",
                                                  "rope_ape", "eva02")]
ROPE = [p for p in FAMILIES if p.values[0][1] in ("rope-axial", "rope-mixed", "rope-ape", "rope_axial", "rope_mixed",
                                                   "rope_ape", "dinov3", "eva02")]
# naver's RoPE (and vitpos' own, built on it) keep the grid step; EVA-02 (ref_feat_shape) and DINOv3
# (normalised coordinates) map a larger grid onto the trained range
RESCALED = {"eva02", "dinov3"}


def _built_at(which, surface, img: int):
    """The same family built at `img` px from scratch (random weights: callers load the ones they compare)."""
    kind, name = which
    if kind == "own":
        return surface_for(build_own_vit(OwnViTConfig(pe=name, **{**TINY, "img_size": img})).eval(), "built")
    spec_name, kw = parse_timm_spec(TIMM_TINY[name])
    return surface_for(timm.create_model(spec_name, **{**kw, "img_size": img}).eval(), "built")


def _toy(n: int, size: int = 16, seed: int = 0) -> TensorImageDataset:
    g = torch.Generator().manual_seed(seed)
    info = DatasetInfo(name="toy", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(size, size), in_chans=3)
    return TensorImageDataset(torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g),
                              torch.randint(0, 4, (n,), generator=g), info, "test")


@pytest.mark.parametrize("which", FAMILIES)
def test_at_the_training_size_equals_the_plain_forward(which):
    """APE / RoPE / none: the resized copy at the training size gives the plain surface's floats, bit for bit."""
    s = tiny_surface(which)
    same = s.at_size(s.input_size[1:])
    assert same.model is not s.model and same.grid == s.grid and same.input_size == s.input_size
    x = images_for(s, 4)
    assert torch.equal(same(x), s(x))
    assert torch.equal(same.embed_tokens(x), s.embed_tokens(x))
    assert torch.equal(same.pooled_features(x), s.pooled_features(x))


@pytest.mark.parametrize("which", FAMILIES)
def test_resizing_changes_the_grid_of_the_copy_only(which):
    s = tiny_surface(which)
    big = s.at_size(2 * s.input_size[1])
    H, W = s.grid
    assert big.grid == (2 * H, 2 * W) and big.num_patches == 4 * s.num_patches
    assert big.input_size == (3, 2 * s.input_size[1], 2 * s.input_size[2]) and big.patch_size == s.patch_size
    tokens = big.embed_tokens(images_for(big, 2))
    assert tokens.shape == (2, big.num_prefix_tokens + 4 * H * W, s.width)
    assert big(images_for(big, 2)).shape == s(images_for(s, 2)).shape  # the classifier applies at any grid
    # the original is untouched: its grid, and only its size accepted
    assert s.grid == (H, W) and s(images_for(s, 1)).shape[0] == 1
    with pytest.raises(VitposError, match="do not fit"):
        s(images_for(big, 1))
    with pytest.raises(VitposError, match="do not fit"):
        big(images_for(s, 1))


@pytest.mark.parametrize("which", APE)
def test_the_ape_table_is_resampled_as_timm_resamples_it(which):
    """The patch table of the resized copy is resample_abs_pos_embed (bicubic) of the trained one;
    prefix rows of a table that has them stay as they were."""
    s = tiny_surface(which)
    big = s.at_size(s.input_size[1] * 3 // 2)
    want = resample_abs_pos_embed(s.patch_pos_embed().unsqueeze(0), new_size=list(big.grid), old_size=list(s.grid),
                                  num_prefix_tokens=0)[0]
    got = big.patch_pos_embed()
    assert got.shape == (big.num_patches, s.width)
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got[: s.num_patches], s.patch_pos_embed())  # really resampled, not padded
    full_old, full_new = s.model.pos_embed, big.model.pos_embed
    assert full_old is not None and full_new is not None
    npt = full_old.shape[1] - s.num_patches
    assert torch.equal(full_new[:, :npt], full_old[:, :npt])


@pytest.mark.parametrize("which", ROPE)
def test_rope_tables_are_rebuilt_for_the_new_grid(which):
    """The resized copy's rotary table is the one the family computes when built at that size, has a
    row per new patch, and (for a model without APE) the copy is the model built at that size."""
    s = tiny_surface(which)
    big = s.at_size(2 * s.input_size[1])
    built = _built_at(which, s, 2 * s.input_size[1])
    # without APE every weight is size-free: the trained weights load into the big build as they are
    built.model.load_state_dict((big if s.has_ape else s).model.state_dict())  # mixed RoPE: learned freqs
    table = big.rope_table()
    assert table.shape[-2] == big.num_patches
    assert torch.equal(table, built.rope_table())
    grid = extra.rope_grid(s, big)
    assert grid == ("rescaled" if which[1] in RESCALED else "extended")
    x = images_for(big, 2)
    assert torch.equal(big(x), built(x))


def test_a_size_off_the_patch_grid_is_refused():
    s = tiny_own("rope-axial")
    with pytest.raises(VitposError, match="multiple of the patch size 4x4"):
        s.at_size(18)
    with pytest.raises(VitposError, match="multiple of the patch size"):
        s.at_size((0, 16))


def test_shapes_generated_at_a_larger_size_keep_labels_and_relations():
    small = load_split("shapes", "test", limit=40)
    big = load_split("shapes", "test", limit=40, size=48)
    assert tuple(big.images.shape) == (40, 3, 48, 48) and big.info.image_size == (48, 48)
    assert big.info.class_names == small.info.class_names
    assert torch.equal(big.labels, small.labels)  # the label is the scene's first draw
    assert torch.equal(load_split("shapes", "test", limit=40, size=32).images, small.images)
    img = big.images.int()
    red = (img[:, 0] > 150) & (img[:, 1] < 90) & (img[:, 2] < 90)
    blue = (img[:, 2] > 150) & (img[:, 0] < 110) & (img[:, 1] < 130)
    rows = torch.arange(48).view(1, 48, 1).float()
    cols = torch.arange(48).view(1, 1, 48).float()
    for i, label in enumerate(big.labels.tolist()):
        r, b = red[i].float(), blue[i].float()
        assert r.sum() > 0 and b.sum() > 0
        ry, rx = float((r * rows).sum() / r.sum()), float((r * cols).sum() / r.sum())
        by, bx = float((b * rows).sum() / b.sum()), float((b * cols).sum() / b.sum())
        assert {0: ry < by, 1: ry > by, 2: rx < bx, 3: rx > bx}[label], (i, label)
    with pytest.raises(VitposError, match="only the procedural shapes"):
        load_split("digits", "test", limit=4, size=48)


def test_the_larger_shapes_fill_the_larger_canvas():
    big = load_split("shapes", "test", limit=200, size=48)
    red = (big.images[:, 0] > 150) & (big.images[:, 1] < 90)
    ys = red.nonzero()[:, 1]
    assert int(ys.max()) >= 40  # key shapes reach rows a 32 px scene never has


def test_probes_get_the_new_rows_and_cols_as_classes(monkeypatch):
    seen: list[tuple[tuple[int, int], int, int]] = []
    real = extra.fit_probe_tokens

    def spy(tokens, grid, **kw):
        res = real(tokens, grid, **kw)
        seen.append((tuple(grid), res.row_probe.num_classes, res.col_probe.num_classes))
        return res

    monkeypatch.setattr(extra, "fit_probe_tokens", spy)
    s = tiny_own("rope-axial")
    doc = run_extrapolate(s, _toy(40), n_images=40, scales=[1.5, 1.25]).to_json()
    L = s.depth
    assert seen == [((4, 4), 4, 4)] * L + [((5, 5), 5, 5)] * L + [((6, 6), 6, 6)] * L
    assert [sz["grid"] for sz in doc["sizes"]] == [[4, 4], [5, 5], [6, 6]]
    assert [sz["img_size"] for sz in doc["sizes"]] == [[16, 16], [20, 20], [24, 24]]
    assert [sz["scale"] for sz in doc["sizes"]] == [1.0, 1.25, 1.5]
    for sz in doc["sizes"]:
        H = sz["grid"][0]
        assert sz["chance_row"] == pytest.approx(1 / H) and len(sz["row_acc"]) == len(sz["col_skill"]) == L
        assert sz["row_skill"][0] == pytest.approx((sz["row_acc"][0] - 1 / H) / (1 - 1 / H))
        assert sz["data_px"] is None  # toy images are resized, not generated
    assert doc["rope_grid"] == "extended" and doc["ape"] is None and doc["top1_refused"] is None


def test_top1_at_each_size_is_the_resized_model_on_that_data():
    """top-1 and its Wilson interval are the model's accuracy on the data at that size."""
    from vitpos.analysis.forward import predict
    from vitpos.analysis.stats import accuracy_interval
    from vitpos.data.resolve import dataset_at_size

    s = tiny_own("ape")
    data = _toy(60)
    doc = run_extrapolate(s, data, n_images=60, scales=[2.0]).to_json()
    for sz, surface in zip(doc["sizes"], (s, s.at_size(32)), strict=True):
        preds, labels = predict(surface, dataset_at_size(surface, data, "test", None, limit=60))
        assert sz["top1"] == pytest.approx(float((preds == labels).float().mean()))
        assert sz["top1_ci"] == pytest.approx(accuracy_interval(preds == labels))
        assert sz["top1_ci"][0] <= sz["top1"] <= sz["top1_ci"][1]
    assert "resample_abs_pos_embed" in doc["ape"] and doc["rope_grid"] is None


def test_a_classifier_that_does_not_fit_refuses_top1_but_probes_run():
    from vitpos.models import load_model

    torch.manual_seed(0)
    s = load_model(TIMM_TINY["vit"].replace("num_classes=4", "num_classes=0"))  # headless: pooled features
    doc = run_extrapolate(s, _toy(24), n_images=24, scales=[1.5]).to_json()
    assert "no classifier" in doc["top1_refused"] and "vitpos head" in doc["top1_refused"]
    assert all(sz["top1"] is None and sz["top1_ci"] is None for sz in doc["sizes"])
    assert all(len(sz["row_acc"]) == s.depth for sz in doc["sizes"])


@pytest.mark.parametrize("which", [p for p in FAMILIES if p.values[0][0] == "timm"])
def test_runs_on_timm_families(which):
    s = tiny_surface(which)
    doc = run_extrapolate(s, _toy(24, size=s.input_size[1]), n_images=24).to_json()
    H = s.grid[0]
    assert [sz["grid"][0] for sz in doc["sizes"]] == [H, round(1.5 * H), 2 * H]  # timm default: 1.5x, 2x
    assert doc["scheme"] == s.scheme and (doc["ape"] is not None) == s.has_ape
    assert doc["rope_grid"] == (None if not s.has_rope else "rescaled" if which[1] in RESCALED else "extended")
    assert all(0.0 <= v <= 1.0 for sz in doc["sizes"] for v in sz["row_acc"] + sz["col_acc"])


def test_scales_are_checked():
    s = tiny_own("rope-axial")  # grid 4 x 4
    assert check_scales(s, [1.5, 1.25]) == [1.25, 1.5]
    with pytest.raises(VitposError, match="same|gives the grid"):
        check_scales(s, [1.1])  # rounds to the training grid
    with pytest.raises(VitposError, match="gives the grid"):
        check_scales(s, [1.5, 1.6])
    with pytest.raises(VitposError, match="at least 2 rows"):
        check_scales(s, [0.25])


def test_applicability_and_the_study_settings():
    from vitpos.models.surface import ModelSurface
    from vitpos.study.config import RunConfig

    exp = ExtrapolateExperiment()
    assert exp.applies_to(tiny_own("none")) is None and exp.applies_to(tiny_timm("dinov3")) is None
    bare = ModelSurface()
    bare.spec, bare.scheme = "bare", "none"
    assert "cannot be resized" in (exp.applies_to(bare) or "")
    with pytest.raises(VitposError, match="cannot be resized"):
        bare.at_size(32)
    cfg = RunConfig()
    assert exp.stage_settings(cfg, tiny_own("ape"), {}, False).model_dump() == {"images": 300, "scales": [1.25, 1.5]}
    assert exp.stage_settings(cfg, tiny_timm("vit"), {}, False).scales == [1.5, 2.0]
    given = RunConfig.model_validate({"extrapolate": {"scales": [2]}})
    assert exp.stage_settings(given, tiny_own("ape"), {}, False).scales == [2.0]
    with pytest.raises(ValueError):
        RunConfig.model_validate({"extrapolate": {"scales": [0]}})


def test_document_figure_and_report_section(tmp_path):
    from vitpos.experiments.registry import BY_NAME
    from vitpos.report.sections import CLAIM_RULES

    s = tiny_own("rope-mixed")
    result = run_extrapolate(s, _toy(32), n_images=32, out=tmp_path)
    assert (tmp_path / "extrapolate.json").exists()
    assert (tmp_path / "extrapolate.png").read_bytes().startswith(b"\x89PNG")
    assert ExtrapolateExperiment().load(result.to_json()) == result
    html = BY_NAME["extrapolate"].section(result, CLAIM_RULES)
    assert "24 px" in html and "6×6" in html and "resized" in html and "unseen angles" in html
    doc = result.to_json()
    doc["top1_refused"] = "no <classifier>"
    for sz in doc["sizes"]:
        sz["top1"] = sz["top1_ci"] = None
    refused = ExtrapolateExperiment().load(doc)
    html = BY_NAME["extrapolate"].section(refused, CLAIM_RULES)
    assert "refused" in html and "&lt;classifier&gt;" in html
    from vitpos import plots

    assert plots.plot_extrapolate(refused, tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")


def test_shapes_data_is_generated_at_the_grid_ratio(monkeypatch):
    """With shapes, each larger size gets scenes generated at 32 px x the grid ratio (own models: 40, 48 px)."""
    import vitpos.data.resolve as resolve

    sizes: list[int | None] = []
    real = resolve.load_split

    def spy(name, split, seed=0, limit=None, transform=None, size=None):
        sizes.append(size)
        return real(name, split, seed=seed, limit=limit, transform=transform, size=size)

    monkeypatch.setattr(resolve, "load_split", spy)
    torch.manual_seed(0)
    s = tiny_own("rope-axial")  # 16 px, grid 4: shapes' 32 px go through a 2x downsample, at every size
    doc = run_extrapolate(s, "shapes", n_images=16, scales=[1.25, 1.5]).to_json()
    assert [sz["data_px"] for sz in doc["sizes"]] == [32, 40, 48]
    assert sizes[-2:] == [40, 48]
