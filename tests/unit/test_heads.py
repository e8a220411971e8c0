"""Heads for headless backbones (issue 15): the classifier check, `vitpos head`, --head, the study's head
stage, and built-in data at any model input size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import needs_fashion
from vitpos.analysis.forward import capture_layers, evaluate
from vitpos.analysis.heads import fit_head, fit_head_on_features, pooled_features
from vitpos.data import load_split, to_float
from vitpos.data.resolve import dataset_for
from vitpos.errors import VitposError
from vitpos.hooks import capture
from vitpos.models import load_model
from vitpos.models.head import Head, HeadInfo, check_head

# random-init DINOv2 layout without a classifier (patch 14 at 56 px: a 4x4 grid), 2 blocks for speed
HEADLESS = "timm:vit_small_patch14_dinov2?img_size=56&num_classes=0&depth=2"
TINY_HEADLESS = "timm:vit_small_patch16_224?img_size=16&patch_size=4&depth=2&embed_dim=32&num_heads=2&num_classes=0"
FASHION_64 = "timm:vit_small_patch16_224?img_size=64&num_classes=10&depth=3"  # 4x4 grid; 3 blocks for speed


def _headless(spec: str = TINY_HEADLESS, seed: int = 0):
    """The spec's random-init model (the same on every load), its weights moved by `seed` when > 0:
    another set of weights under the same spec."""
    surface = load_model(spec)
    if seed:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in surface.model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
    return surface


def _random_head(surface, info, seed: int = 0) -> Head:
    g = torch.Generator().manual_seed(seed)
    k = len(info.class_names)
    hi = HeadInfo(model=surface.spec, weights=surface.weights_digest(), data=info.name, classes=list(info.class_names),
                  num_classes=k, width=surface.width, l2=1e-3, l2_grid=[1e-3], val_top1_by_l2=[0.0], val_top1=0.0,
                  test_top1=0.0, n_train_images=0, n_val_images=0, n_test_images=0, seed=seed)
    return Head(torch.randn(k, surface.width, generator=g), torch.randn(k, generator=g), hi)


def test_head_reaches_full_accuracy_on_separable_features():
    g = torch.Generator().manual_seed(0)
    k, d = 5, 24
    centres = 6 * torch.randn(k, d, generator=g)
    scale = torch.linspace(0.1, 50, d)  # anisotropic raw features: the fold must undo the standardisation

    def draw(n):
        y = torch.randint(k, (n,), generator=g)
        return (centres[y] + torch.randn(n, d, generator=g)) * scale + 3.0, y

    train, val, test = draw(400), draw(100), draw(200)
    fit = fit_head_on_features(train, val, k)
    assert fit["weight"].shape == (k, d) and fit["bias"].shape == (k,)
    assert fit["val_top1"] >= 0.99 and fit["l2"] in fit["l2_grid"]
    assert fit["val_top1"] == max(fit["val_top1_by_l2"])
    logits = test[0] @ fit["weight"].T + fit["bias"]  # raw features, no standardisation at use time
    assert float((logits.argmax(-1) == test[1]).float().mean()) >= 0.99


def test_with_head_changes_logits_only_through_the_head():
    surface = _headless()
    info = load_split("shapes", "test", limit=4).info
    x = torch.randn(3, *surface.input_size, generator=torch.Generator().manual_seed(1))
    pooled = surface(x)  # headless: the outputs are the pooled features
    assert pooled.shape == (3, surface.width) and torch.equal(pooled, surface.pooled_features(x))
    head = _random_head(surface, info)
    headed = surface.with_head(head, info, "shapes")
    assert surface.head is None and headed.head is head and headed.model is surface.model
    with capture(surface, "resid_post") as plain:
        surface(x)
    with capture(headed, "resid_post") as withh:
        logits = headed(x)
    for site in plain:
        assert torch.equal(plain[site], withh[site])  # the model's activations are untouched
    assert torch.equal(headed.pooled_features(x), pooled)
    assert torch.allclose(logits, pooled @ head.weight.T + head.bias, atol=1e-6)
    assert headed.classifier_problem(info) is None and surface.classifier_problem(info) is not None


def test_headless_top1_is_refused_but_activations_are_not():
    surface = _headless()
    ds = dataset_for(surface, "shapes", "test", limit=8)
    with pytest.raises(VitposError) as err:
        evaluate(surface, ds)
    msg = str(err.value)
    assert "\n" not in msg and "num_classes=0" in msg and "vitpos head" in msg and "--head DIR" in msg
    with pytest.raises(VitposError, match="no classifier"):
        capture_layers(surface, ds, "resid_post")  # logits for top-1: checked by default
    acts, labels, _ = capture_layers(surface, ds, "resid_post", check_classifier=False)  # probes / SAEs
    assert acts["blocks.1.resid_post"].shape == (8, surface.num_patches, surface.width) and len(labels) == 8
    rep = evaluate(surface.with_head(_random_head(surface, ds.info), ds.info, "shapes"), ds)
    assert rep["n"] == 8 and 0.0 <= rep["top1"] <= 1.0


def test_a_wrong_class_count_is_refused():
    surface = _headless(TINY_HEADLESS.replace("num_classes=0", "num_classes=7"))
    info = load_split("shapes", "test", limit=2).info
    msg = surface.classifier_problem(info, "shapes")
    assert msg is not None and "7 classes" in msg and "shapes has 4" in msg


@needs_fashion
def test_a_head_from_other_weights_or_classes_is_refused(tmp_path):
    a, b = _headless(seed=0), _headless(seed=1)
    shapes = load_split("shapes", "test", limit=2).info
    head = _random_head(a, shapes)
    head.save(tmp_path / "h")
    loaded = Head.load(tmp_path / "h")
    assert torch.equal(loaded.weight, head.weight) and loaded.info == head.info and loaded.digest() == head.digest()
    with pytest.raises(VitposError) as err:
        b.with_head(loaded)
    assert a.weights_digest() in str(err.value) and b.weights_digest() in str(err.value)
    fashion = load_split("fashion", "test", limit=2).info
    with pytest.raises(VitposError, match="fitted on shapes .*fashion has 10 classes"):
        check_head(loaded, a, fashion, "fashion")
    with pytest.raises(VitposError, match="holds no head"):
        Head.load(tmp_path)


def test_fit_head_writes_a_head_that_eval_uses(tmp_path):
    surface = _headless()
    head = fit_head(surface, "shapes", n_images=48, n_val_images=16, n_test_images=16, out=tmp_path)
    doc = json.loads((tmp_path / "head.json").read_text())
    assert doc["model"] == TINY_HEADLESS and doc["weights"] == surface.weights_digest() and doc["data"] == "shapes"
    assert doc["feature_site"] == "pre_logits" and doc["num_classes"] == 4 and doc["n_train_images"] == 48
    assert (tmp_path / "head.safetensors").is_file() and doc["l2"] in doc["l2_grid"]
    headed = surface.with_head(Head.load(tmp_path))
    test = dataset_for(headed, "shapes", "test", limit=16)
    x, y = pooled_features(surface, test)
    want = float(((x @ head.weight.T + head.bias).argmax(-1) == y).float().mean())
    assert evaluate(headed, test)["top1"] == pytest.approx(want) == pytest.approx(doc["test_top1"])


@needs_fashion
def test_builtin_data_at_any_input_size_stays_uint8():
    timm64 = load_model(FASHION_64)
    ds = dataset_for(timm64, "fashion", "test", limit=6)
    assert ds.images.dtype == torch.uint8 and tuple(ds.images.shape[1:]) == (1, 28, 28)  # stored native
    x, _ = next(ds.batches(6))
    assert x.shape == (6, 3, 64, 64) and x.dtype == torch.float32
    assert torch.equal(x[:, 0], x[:, 1]) and float(x.min()) >= -1.0 - 1e-6 and float(x.max()) <= 1.0 + 1e-6
    assert tuple(ds.info.image_size) == (64, 64) and ds.info.in_chans == 3
    assert torch.equal(ds[2][0], x[2])
    # vitpos' own models: the unchanged [-1, 1] path, bit for bit
    own = load_model("builtin:ape")
    native = dataset_for(own, "shapes", "test", limit=5)
    assert native.transform is None
    assert torch.equal(next(native.batches(5))[0], to_float(load_split("shapes", "test", limit=5).images))


def test_study_fits_a_head_for_a_headless_model(tmp_path):
    from vitpos.study.config import load_config
    from vitpos.study.results import StudyResults
    from vitpos.study.run import run_study

    torch.manual_seed(0)
    cfg = load_config(None, {"models": [HEADLESS], "data": ["shapes"], "eval_images": 24, "head": {"images": 48},
                             "probe": {"images": 16}, "ape_permute": {"images": 8, "seeds": 1},
                             "sae": {"images": 256, "eval_images": 16, "epochs": 1, "expansion": 1}}, quick=True)
    run_study(tmp_path, cfg, quick=True, progress=False, log=lambda m: None)
    doc = json.loads((tmp_path / "results.json").read_text())
    entry = doc["models"][HEADLESS]
    assert entry["head"]["source"] == "fitted" and "num_classes=0" in entry["head"]["reason"]
    assert {"val_top1", "test_top1", "l2"} <= set(entry["head"])
    # artifact paths are relative to the output folder (a copied folder reads its own files)
    assert not Path(entry["head"]["head_dir"]).is_absolute() and not Path(entry["sae"]["sae_dir"]).is_absolute()
    head = Head.load(tmp_path / entry["head"]["head_dir"])
    surface = _headless(HEADLESS, seed=1)  # same spec, other weights: the head is refused for them
    with pytest.raises(VitposError, match="weights digest"):
        surface.with_head(head)
    # eval's top-1 is the head's on the pooled features, never an argmax over the features themselves
    torch.manual_seed(0)
    surface = load_model(HEADLESS)
    test = dataset_for(surface, "shapes", "test", limit=24)
    x, y = pooled_features(surface, test)
    assert entry["eval"]["top1"] == pytest.approx(float((head(x).argmax(-1) == y).float().mean()))
    assert entry["sae"]["top1"] is not None and entry["ape_permute"]["baseline_top1"] is not None
    assert StudyResults.from_json(doc).models[HEADLESS].head is not None
    # the rerun reuses the head stage
    logs: list[str] = []
    torch.manual_seed(0)
    run_study(tmp_path, cfg, quick=True, progress=False, log=logs.append)
    assert any(m.endswith("head: cached") for m in logs)
