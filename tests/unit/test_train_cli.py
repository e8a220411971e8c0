"""Own-model training and the CLI: bit-exact checkpoints, determinism, resume, and one-line errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import vitpos.data as vdata
import vitpos.train as vtrain
from vitpos.cli import app
from vitpos.data import load_split
from vitpos.errors import VitposError
from vitpos.io import read_json
from vitpos.models import load_model
from vitpos.models.checkpoint import read_own_config
from vitpos.models.own import build_own_vit
from vitpos.train import QUICK_LIMITS, QUICK_MODEL, accuracy, train

FASHION_DIR = Path(os.environ.get("VITPOS_FASHION_DIR") or "/usr/share/datasets/fashion-mnist")


class _Stop(Exception):
    """Stands in for a kill in the middle of training."""


def _record_losses(monkeypatch, stop_at: int | None = None) -> list[float]:
    """Record every training loss train() computes; raise _Stop at call number `stop_at` (1-based)."""
    losses: list[float] = []
    real = torch.nn.functional.cross_entropy

    def ce(logits, y):
        if stop_at is not None and len(losses) + 1 == stop_at:
            raise _Stop
        loss = real(logits, y)
        losses.append(float(loss.detach()))
        return loss

    monkeypatch.setattr(vtrain, "F", types.SimpleNamespace(cross_entropy=ce))
    return losses


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # tiny models on a shared CPU: one thread is several times faster than two that contend
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _weights(d: Path) -> dict[str, torch.Tensor]:
    return load_file(str(d / "model.safetensors"))


def _assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One quick-trained ape model on shapes, the in-memory model train() saved, and its metrics."""
    out = tmp_path_factory.mktemp("trained") / "ape"
    saved = {}
    real_save = vtrain.save_own_model

    def spy(out_dir, model, cfg, extra=None):
        saved["model"] = model
        real_save(out_dir, model, cfg, extra)

    mp = pytest.MonkeyPatch()
    mp.setattr(vtrain, "save_own_model", spy)
    try:
        metrics = train("ape", out, quick=True, progress=False)
    finally:
        mp.undo()
    return out, saved["model"], metrics


# --- checkpoints, metrics, config ----------------------------------------------------------------

def test_checkpoint_roundtrip_bit_identical(trained):
    out, model, _ = trained
    surface = load_model(str(out))
    loaded = surface.model.state_dict()
    _assert_same_tensors(loaded, _weights(out))
    _assert_same_tensors(loaded, {k: v.detach() for k, v in model.state_dict().items()})
    x, _ = next(load_split("shapes", "test", limit=64).batches(64))
    with torch.no_grad():
        assert torch.equal(surface(x), model.eval()(x))


def test_metrics_and_config_rebuild_the_model(trained):
    out, _, metrics = trained
    m = read_json(out / "metrics.json")
    assert m == metrics
    assert 0.0 <= m["test_top1"] <= 1.0 and 0.0 <= m["val_top1"] <= 1.0
    assert m["epochs"] == 2 and len(m["history"]) == 2 and m["seconds"] >= 0
    assert m["n_train"] == QUICK_LIMITS["train"] and m["n_test"] == QUICK_LIMITS["test"]

    cfg = read_own_config(out)
    assert cfg.pe == "ape" and cfg.img_size == 32 and cfg.num_classes == 4
    assert {k: getattr(cfg, k) for k in QUICK_MODEL} == QUICK_MODEL
    model = build_own_vit(cfg)
    model.load_state_dict(_weights(out), strict=True)
    # the rebuilt model reproduces the recorded test accuracy on the same images
    test = load_split("shapes", "test", limit=QUICK_LIMITS["test"])
    assert accuracy(model, test) == m["test_top1"]


# --- determinism -----------------------------------------------------------------------------------

def test_same_seed_same_data():
    a = load_split("shapes", "train", seed=0, limit=64)
    vdata._shapes_split.cache_clear()  # regenerate rather than hit the cache
    b = load_split("shapes", "train", seed=0, limit=64)
    c = load_split("shapes", "train", seed=1, limit=64)
    assert a is not b
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, c.images)


def test_same_seed_same_first_losses(tmp_path, monkeypatch):
    def first_losses(seed: int, name: str) -> list[float]:
        losses = _record_losses(monkeypatch, stop_at=3)  # loss of step 1 and of step 2 (after one update)
        with pytest.raises(_Stop):
            train("rope-axial", tmp_path / name, seed=seed, quick=True, progress=False)
        return losses

    a, b, c = first_losses(0, "a"), first_losses(0, "b"), first_losses(1, "c")
    assert len(a) == 2 and a == b
    assert a[0] != c[0]


# --- resume and reruns -----------------------------------------------------------------------------

def test_interrupted_run_resumes_bit_identically(tmp_path, monkeypatch):
    full = tmp_path / "full"
    m_full = train("rope-mixed", full, epochs=2, quick=True, progress=False)
    steps = -(-QUICK_LIMITS["train"] // 128)  # steps per epoch at batch 128

    cut = tmp_path / "cut"
    with monkeypatch.context() as mp:
        _record_losses(mp, stop_at=steps + 2)  # killed mid-way through epoch 2
        with pytest.raises(_Stop):
            train("rope-mixed", cut, epochs=2, quick=True, progress=False)
    state = read_json(cut / "checkpoint" / "state.json")
    assert state["epochs_done"] == 1 and not (cut / "metrics.json").exists()

    losses = _record_losses(monkeypatch)
    m_cut = train("rope-mixed", cut, epochs=2, quick=True, progress=False)
    assert len(losses) == steps  # only epoch 2 was trained again
    _assert_same_tensors(_weights(cut), _weights(full))
    _assert_same_tensors(load_file(str(cut / "checkpoint" / "optim.safetensors")),
                         load_file(str(full / "checkpoint" / "optim.safetensors")))

    def drop(m: dict) -> dict:
        return {k: v for k, v in m.items() if k != "seconds"}

    assert drop(m_cut) == drop(m_full)


def test_rerun_is_noop_and_other_config_needs_force(tmp_path, monkeypatch, trained):
    src, _, metrics = trained
    out = tmp_path / "run"
    shutil.copytree(src, out)
    before = (out / "model.safetensors").read_bytes()
    losses = _record_losses(monkeypatch)
    assert train("ape", out, quick=True, progress=False) == metrics
    assert losses == [] and (out / "model.safetensors").read_bytes() == before

    with pytest.raises(VitposError, match="--force"):
        train("ape", out, quick=True, lr=5e-4, progress=False)
    with pytest.raises(VitposError, match="--force"):
        train("none", out, quick=True, progress=False)
    assert read_json(out / "metrics.json") == metrics  # the refused runs changed nothing

    m = train("none", out, quick=True, force=True, progress=False)
    assert len(losses) == 2 * -(-QUICK_LIMITS["train"] // 128)
    assert m["pe"] == "none" and read_own_config(out).pe == "none"


def test_interrupted_run_with_other_settings_needs_force(tmp_path, monkeypatch):
    out = tmp_path / "cut"
    with monkeypatch.context() as mp:
        _record_losses(mp, stop_at=4)
        with pytest.raises(_Stop):
            train("ape", out, quick=True, progress=False)
    with pytest.raises(VitposError, match="--force"):
        train("ape", out, quick=True, seed=3, progress=False)


# --- CLI -------------------------------------------------------------------------------------------

def test_cli_eval_writes_eval_json(tmp_path, trained):
    src, _, metrics = trained
    res = CliRunner().invoke(app, ["eval", "--model", str(src), "--limit", str(QUICK_LIMITS["test"]),
                                   "--out", str(tmp_path), "--no-progress"])
    assert res.exit_code == 0, res.output
    doc = read_json(tmp_path / "eval.json")
    assert doc["test_top1"] == metrics["test_top1"] and doc["n"] == QUICK_LIMITS["test"]


# Each case runs `vitpos.cli.main()` in its own forked process of one interpreter (one import of
# torch/timm for all cases instead of one per case) with its own stdout/stderr files and exit code.
_DRIVER = r"""
import json, os, sys, traceback
import torch
import vitpos.analysis.forward, vitpos.store.capture, vitpos.train  # heavy imports once, before forking
from vitpos.cli import main
torch.set_num_threads(1)
results = {}
for name, args in json.loads(sys.argv[1]).items():
    out, err = sys.argv[2] + "/" + name + ".out", sys.argv[2] + "/" + name + ".err"
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        fo, fe = os.open(out, os.O_WRONLY | os.O_CREAT), os.open(err, os.O_WRONLY | os.O_CREAT)
        os.dup2(fo, 1); os.dup2(fe, 2)
        sys.argv = ["vitpos", *args]
        code = 0
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    results[name] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def cli_runs(trained, tmp_path_factory):
    src, _, _ = trained
    tmp = tmp_path_factory.mktemp("cli")
    garbage = tmp / "garbage"
    shutil.copytree(src, garbage)
    (garbage / "model.safetensors").write_bytes(b"\x89not safetensors at all\x00" * 40)
    truncated = tmp / "truncated"
    shutil.copytree(src, truncated)
    data = (src / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    quick = ["--quick", "--no-progress"]
    cases = {
        "unknown_pe": ["train", "--pe", "bogus", "--out", str(tmp / "x"), *quick],
        "missing_model": ["eval", "--model", "/missing/dir", "--no-progress"],
        "garbage_weights": ["eval", "--model", str(garbage), "--no-progress"],
        "truncated_weights": ["eval", "--model", str(truncated), "--no-progress"],
        "unknown_data": ["train", "--pe", "ape", "--data", "nosuchdata", "--out", str(tmp / "y"), *quick],
        "other_config": ["train", "--pe", "rope-axial", "--out", str(src), *quick],
        "rerun": ["train", "--pe", "ape", "--out", str(src), *quick],
        "batch_size_0": ["train", "--pe", "ape", "--out", str(tmp / "b0"), "--batch-size", "0", *quick],
        "negative_lr": ["train", "--pe", "ape", "--out", str(tmp / "lr"), "--lr", "-1", *quick],
        "out_is_a_file": ["train", "--pe", "ape", "--out", str(tmp / "a_file"), *quick],
        "limit_0": ["eval", "--model", str(src), "--limit", "0", "--no-progress"],
        "quick_epochs_3": ["train", "--pe", "ape", "--out", str(tmp / "e3"), "--epochs", "3", *quick],
    }
    (tmp / "a_file").write_text("not a folder")
    if FASHION_DIR.is_dir():
        cases["wrong_size"] = ["eval", "--model", str(src), "--data", "fashion", "--limit", "8", "--no-progress"]
    logs = tmp / "logs"
    logs.mkdir()
    env = {**os.environ, "COLUMNS": "40", "OMP_NUM_THREADS": "1"}  # a long message must still be one line
    env.pop("FORCE_COLOR", None)
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(cases), str(logs)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    return {k: (codes[k], (logs / f"{k}.out").read_text(), (logs / f"{k}.err").read_text()) for k in cases}


@pytest.mark.parametrize("case, needle", [
    ("unknown_pe", "bogus"),
    ("missing_model", "/missing/dir"),
    ("garbage_weights", "model.safetensors"),
    ("truncated_weights", "model.safetensors"),
    ("unknown_data", "nosuchdata"),
    ("other_config", "--force"),
    ("wrong_size", "fashion"),
    ("batch_size_0", "batch"),
    ("negative_lr", "lr"),
    ("out_is_a_file", "a_file"),
    ("limit_0", "limit"),
])
def test_cli_bad_input_is_one_error_line(cli_runs, case, needle):
    if case not in cli_runs:
        pytest.skip(f"Fashion-MNIST is not installed in {FASHION_DIR}")
    code, stdout, stderr = cli_runs[case]
    lines = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", stderr).splitlines() if ln.strip()]
    assert code == 2, (code, stderr)
    assert "Traceback" not in stderr and "Traceback" not in stdout
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert needle in lines[0]


def test_cli_rerun_of_finished_train_is_noop(cli_runs, trained):
    src, _, metrics = trained
    code, stdout, stderr = cli_runs["rerun"]
    assert code == 0, stderr
    assert f"test top-1 {metrics['test_top1']:.4f}" in stdout
    assert read_json(src / "metrics.json") == metrics


def test_cli_quick_honours_explicit_epochs(cli_runs, trained):
    code, stdout, stderr = cli_runs["quick_epochs_3"]
    assert code == 0, stderr
    # --quick sets the default (2 epochs); it no longer silently caps an explicit --epochs at 2
    assert "(3 epochs," in " ".join(stdout.split())  # (the console wraps lines at 40 columns here)
    assert read_json(trained[0] / "metrics.json")["epochs"] == 2  # plain --quick / quick=True: 2 epochs
