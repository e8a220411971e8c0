"""`vitpos run --quick` on a tiny random-init Hugging Face DINOv3 (RoPE): every stage that applies runs
through the HF adapter, the ones that do not say why, and the report renders."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'vitpos[hf]')")

from vitpos.cli import main  # noqa: E402
from vitpos.models.hf_families import tiny_spec  # noqa: E402

pytestmark = pytest.mark.slow


def test_quick_run_on_a_tiny_hf_dinov3(tmp_path, capsys):
    spec = tiny_spec("dinov3")
    out = tmp_path / "run"
    main(["run", "--quick", "--no-progress", "--models", spec, "--out", str(out)])
    doc = json.loads((out / "results.json").read_text())
    entry = doc["models"][spec]
    assert entry["describe"]["hf_family"] == "dinov3" and entry["describe"]["scheme"] == "rope"
    assert entry["describe"]["rope"]["layout"] == "half" and len(entry["describe"]["rope"]["row_channels"]) == 8
    for stage in ("head", "eval", "probe", "rope_axis", "rope_heads", "rope_prefix", "rope_freq", "extrapolate"):
        assert entry.get(stage) is not None, (stage, entry["not_applicable"])
    assert set(entry["not_applicable"]) == {"sae", "sae_layers", "ape_permute"}  # the APE-only stages
    assert entry["extrapolate"] is not None  # at_size: the rotary grid rebuilt by the model itself
    assert len(entry["probe"]["row_acc"]) == 2 and (out / "report.html").is_file()
