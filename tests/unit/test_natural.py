"""`natural` (crops of packaged photos), the capture's early stop, high-norm exclusion, seed stability."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from vitpos.data import natural
from vitpos.errors import VitposError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "real-models.md"


def _crops(ds, n):
    return ds.images[torch.arange(n)]


def test_crops_are_deterministic_per_seed_and_prefix_stable():
    pytest.importorskip("skimage")
    from vitpos.data import load_split

    a = load_split("natural", "train", seed=0, limit=6)
    b = load_split("natural", "train", seed=0, limit=3)
    again = load_split("natural", "train", seed=0, limit=6)
    assert torch.equal(_crops(a, 6), _crops(again, 6))
    assert torch.equal(_crops(a, 3), _crops(b, 3))  # crop i depends on (seed, split, i) only
    assert torch.equal(a.labels[:3], b.labels)
    other_seed = load_split("natural", "train", seed=1, limit=6)
    test = load_split("natural", "test", seed=0, limit=6)
    assert not torch.equal(_crops(a, 6), _crops(other_seed, 6))
    assert not torch.equal(_crops(a, 6), _crops(test, 6))


def test_crops_sizes_labels_and_batches():
    pytest.importorskip("skimage")
    from vitpos.data import dataset_info, load_split

    ds = load_split("natural", "val", limit=10)
    assert isinstance(ds, natural.NaturalCrops)
    assert len(ds) == 10 and ds.images.shape == (10, 3, 224, 224)
    x = _crops(ds, 10)
    assert x.dtype == torch.uint8 and x.shape == (10, 3, 224, 224)
    assert x.float().std() > 10  # real photo content, not a constant
    assert int(ds.labels.min()) >= 0 and int(ds.labels.max()) < len(natural.SOURCES)
    info = dataset_info("natural")
    assert info.in_chans == 3 and info.image_size == (224, 224) and info.num_classes == len(natural.SOURCES)
    batches = list(ds.batches(4))
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([b[1] for b in batches]), ds.labels)
    img, label = ds[2]
    assert img.shape == (3, 224, 224) and img.dtype == torch.float32 and label == int(ds.labels[2])
    assert len(ds.subset(4)) == 4 and torch.equal(_crops(ds.subset(4), 4), x[:4])


def test_crop_box_stays_inside_its_photo_and_flips_half():
    shapes = ((300, 451), (872, 1000))
    boxes = [natural.crop_box(7, i, shapes) for i in range(400)]
    for b in boxes:
        h, w = shapes[b.photo]
        assert 0 <= b.top and b.top + b.height <= h and 0 <= b.left and b.left + b.width <= w
        assert b.height >= 1 and b.width >= 1
    flips = sum(b.flip for b in boxes) / len(boxes)
    assert 0.4 < flips < 0.6
    scales = [b.height * b.width / (shapes[b.photo][0] * shapes[b.photo][1]) for b in boxes]
    assert min(scales) < 0.15 and max(scales) > 0.7  # multi-scale


def test_licence_list_is_present_and_documented():
    allowed = {"public domain", "CC0", "CC BY 2.0"}
    assert len(natural.SOURCES) >= 8
    assert all(s.licence in allowed and s.credit for s in natural.SOURCES)
    doc = DOCS.read_text()
    for s in natural.SOURCES:
        assert f"| {s.name} |" in doc and s.licence in doc, s.name
    assert natural.licence_table().count("\n") == len(natural.SOURCES) + 1


def test_missing_package_is_one_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "skimage" else real(name, *a))
    natural.photos.cache_clear()
    try:
        with pytest.raises(VitposError, match=r"pip install scikit-image") as e:
            natural.photos()
        assert "\n" not in str(e.value)
        from vitpos.data import dataset_info

        with pytest.raises(VitposError, match=r"pip install scikit-image"):
            dataset_info("natural")
    finally:
        natural.photos.cache_clear()


def test_capture_stops_after_the_last_block_it_reads(tmp_path):
    """The capture's early stop stores exactly what a full forward stores, and skips the later blocks."""
    from tests.conftest import capture_surface

    from vitpos.hooks import capture
    from vitpos.models.surface import Site
    from vitpos.store.capture import capture_to_store
    from vitpos.store.reader import ActivationStore

    surface = capture_surface()
    calls = []
    handle = surface.block(1).register_forward_hook(lambda m, a, o: calls.append(1))
    try:
        capture_to_store(surface, "shapes", "test", "blocks.0.resid_post", tmp_path / "s", limit=6, batch_size=4,
                         progress=False)
    finally:
        handle.remove()
    assert calls == []  # block 1 never ran
    stored = ActivationStore(tmp_path / "s").load_site("blocks.0.resid_post")
    from vitpos.data.resolve import dataset_for

    x = torch.cat([b[0] for b in dataset_for(surface, "shapes", "test", limit=6).batches(4)])
    with torch.no_grad(), capture(surface, [Site(0, "resid_post")]) as cache:
        surface(x)
        full = cache.pop_batch("blocks.0.resid_post")
    assert torch.equal(stored, full[:, surface.num_prefix_tokens:])
    assert surface(x[:1]).shape[-1] == 4  # the stop hook is gone after the capture


def test_high_norm_tokens_are_left_out_of_training_batches(tmp_path):
    from tests.conftest import capture_surface

    from vitpos.sae.stream import median_token_norm, store_batches
    from vitpos.store.capture import capture_to_store
    from vitpos.store.reader import ActivationStore

    capture_to_store(capture_surface(), "shapes", "test", "blocks.0.resid_post", tmp_path / "s", limit=8,
                     batch_size=8, progress=False)
    store = ActivationStore(tmp_path / "s")
    site = "blocks.0.resid_post"
    norms = torch.cat([a.norm(dim=1) for a, *_ in store.iter_tokens(site, 64)])
    assert median_token_norm(store, site) == pytest.approx(float(norms.median()))
    cut = float(norms.quantile(0.9))
    batches = store_batches(store, site, 16, max_norm=cut, min_batch=1)
    kept = torch.cat(list(batches()))
    assert float(kept.norm(dim=1).max()) <= cut
    assert batches.excluded_tokens == int((norms > cut).sum()) > 0
    assert kept.shape[0] + batches.excluded_tokens == norms.numel()


def test_seed_match_finds_a_permuted_dictionary_and_not_a_random_one():
    from vitpos.sae.stability import seed_match

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 16, generator=g)
    perm = torch.randperm(64, generator=g)
    same = seed_match(w, w[perm] * 3.0, (0, 1), rows=([0, 1, 2], [int((perm == i).nonzero()) for i in (0, 1, 2)]),
                      cols=([5], [0 if int((perm == 5).nonzero()) != 0 else 1]))
    assert same.mean_cos == pytest.approx(1.0) and same.stable_frac["0.9"] == 1.0
    assert same.row_agreement == 1.0 and same.col_agreement == 0.0
    rand = seed_match(w, torch.randn(64, 16, generator=g), (0, 1))
    assert rand.mean_cos < 0.6 and rand.stable_frac["0.9"] == 0.0 and rand.row_agreement is None


def test_natural_configs_parse_and_ask_for_what_the_issue_needs():
    from vitpos.study.config import load_config

    root = Path(__file__).resolve().parents[2] / "configs"
    full = load_config(root / "dinov2-natural.yaml", {}, quick=False)
    assert full.data == ["fashion"] and full.sae.data == "natural" and full.head.images >= 5000
    assert full.sae.images * 256 >= 1_000_000 and full.sae.seeds >= 2 and len(set(full.sae.expansions or [])) >= 2
    assert full.sae.high_norm is not None
    run = load_config(root / "dinov2-natural-run.yaml", {}, quick=False)  # what fitted the session (docs)
    assert run.sae.data == "natural" and run.sae.seeds >= 2 and len(set(run.sae.expansions or [])) >= 2


def test_sae_sweep_trains_the_grid_and_matches_seeds(tmp_path):
    """The sweep on a tiny timm ViT: every (size, seed) scored on the same held-out images, the main
    SAE reused as is, one stability entry per size."""
    from tests.conftest import capture_surface

    from vitpos.experiments.sae_seeds import run_sweep
    from vitpos.experiments.sae_settings import SAESettings
    from vitpos.models.surface import Site
    from vitpos.sae import SAEConfig, train_sae
    from vitpos.sae.stream import store_batches
    from vitpos.store.capture import capture_to_store
    from vitpos.store.reader import ActivationStore

    surface = capture_surface()
    site = Site(0, "resid_post")
    capture_to_store(surface, "shapes", "train", str(site), tmp_path / "s", limit=24, batch_size=8, progress=False)
    store = ActivationStore(tmp_path / "s")
    settings = SAESettings(expansion=2, expansions=[1, 2], seeds=2, k=4, arch="topk", epochs=1, lr=None,
                           eval_images=6, high_norm=4.0)
    cfg = SAEConfig.model_validate({"arch": "topk", "d_in": surface.width, "expansion": 2, "k": 4, "seed": 0})
    main, _ = train_sae(store_batches(store, str(site), 64, seed=0), cfg, epochs=1, progress=False)
    sweep = run_sweep(surface, site, "shapes", main, lambda: store, settings=settings, seed=0, out=tmp_path / "sw",
                      batch_tokens=64)
    assert [(r.expansion, r.seed, r.main) for r in sweep.runs] == [(1, 0, False), (1, 1, False), (2, 0, True),
                                                                  (2, 1, False)]
    assert [r.d_sae for r in sweep.runs] == [32, 32, 64, 64]
    assert all(0 <= r.fvu < 2 and r.l0 <= 4 for r in sweep.runs)
    assert [(m.d_sae, m.seeds) for m in sweep.stability] == [(32, (0, 1)), (64, (0, 1))]
    assert all(-1 <= m.mean_cos <= 1 and set(m.stable_frac) == {"0.5", "0.6", "0.7", "0.8", "0.9"}
               for m in sweep.stability)
    assert (tmp_path / "sw" / "x1-seed0" / "sae.safetensors").is_file()


def test_sae_stage_settings_keep_their_old_keys_unless_the_new_ones_are_set():
    from vitpos.study.config import RunConfig

    def key(config: RunConfig) -> dict:  # the stage settings' JSON: what the stage cache hashes
        return config.section("sae").stage(0).model_dump(mode="json")  # type: ignore[attr-defined]

    plain = key(RunConfig())
    assert not {"data", "seeds", "expansions", "high_norm", "causal_data"} & set(plain)
    set_ = key(RunConfig.model_validate({"sae": {"data": "natural", "seeds": 2, "expansions": [2, 4],
                                                 "high_norm": 4.0}}))
    assert set_["causal_data"] == "the run's data"
    assert {k: set_[k] for k in ("data", "seeds", "expansions", "high_norm")} == {
        "data": "natural", "seeds": 2, "expansions": [2, 4], "high_norm": 4.0}
