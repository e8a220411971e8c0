"""Heads through the CLI (subprocesses): one-line refusals, data at any input size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import needs_fashion

# random-init DINOv2 layout without a classifier (patch 14 at 56 px: a 4x4 grid), 2 blocks for speed
HEADLESS = "timm:vit_small_patch14_dinov2?img_size=56&num_classes=0&depth=2"
TINY_HEADLESS = "timm:vit_small_patch16_224?img_size=16&patch_size=4&depth=2&embed_dim=32&num_heads=2&num_classes=0"
FASHION_64 = "timm:vit_small_patch16_224?img_size=64&num_classes=10&depth=3"  # 4x4 grid; 3 blocks for speed


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "vitpos.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def _one_error(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.mark.slow
def test_cli_refuses_a_classifier_that_does_not_fit_in_one_line(tmp_path):
    line = _one_error(_cli("eval", "-m", HEADLESS, "--limit", "8", "--no-progress"))
    assert "num_classes=0" in line and "vitpos head" in line
    line = _one_error(_cli("eval", "-m", "builtin:ape", "--data", "digits", "--no-progress"))
    assert "4 classes" in line and "digits has 10" in line and "vitpos head" in line
    # a head on fixed (shipped) weights, so that the next process loads the same model
    fitted = _cli("head", "-m", "builtin:ape", "--out", str(tmp_path / "h"), "--images", "24", "--no-progress")
    assert fitted.returncode == 0 and "val top-1" in fitted.stdout, fitted.stderr
    ok = _cli("eval", "-m", "builtin:ape", "--head", str(tmp_path / "h"), "--limit", "8", "--no-progress")
    assert ok.returncode == 0 and "top-1" in ok.stdout, ok.stderr
    line = _one_error(_cli("eval", "-m", HEADLESS, "--head", str(tmp_path / "h"), "--limit", "8", "--no-progress"))
    assert "weights digest" in line


@needs_fashion
@pytest.mark.slow
def test_fashion_feeds_a_64px_rgb_timm_model(tmp_path, capsys):
    from vitpos.cli import main

    def run(*args: str) -> None:
        torch.manual_seed(0)  # the same random weights in every command (the SAE is checked against them)
        try:
            main([*args, "--no-progress"])
        except SystemExit as e:
            assert e.code in (0, None), capsys.readouterr().err

    run("eval", "-m", FASHION_64, "--data", "fashion", "--limit", "64")
    assert "top-1" in capsys.readouterr().out
    run("probe", "-m", FASHION_64, "--data", "fashion", "--images", "64", "--sites", "blocks.1.resid_post",
        "--out", str(tmp_path / "p"))
    run("sae", "-m", FASHION_64, "--data", "fashion", "--layer", "1", "--images", "64", "--epochs", "1",
        "--batch-tokens", "512", "--expansion", "1", "--eval-images", "16", "--out", str(tmp_path / "s"))
    run("intervene", "ape-permute", "-m", FASHION_64, "--data", "fashion", "--sae", str(tmp_path / "s"), "--images",
        "8", "--seeds", "1", "--out", str(tmp_path / "a"))
    assert json.loads((tmp_path / "a" / "ape_permute.json").read_text())["n_images"] == 8
