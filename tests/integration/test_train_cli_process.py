"""`vitpos train` / `vitpos eval` as processes: bad input is one `error:` line with exit code 2, a
finished run reruns as a no-op, --quick honours an explicit --epochs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitpos.io import read_json
from vitpos.train import train

FASHION_DIR = Path(os.environ.get("VITPOS_FASHION_DIR") or "/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # tiny models on a shared CPU: one thread is several times faster than two that contend
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One quick-trained ape model on shapes and its metrics."""
    out = tmp_path_factory.mktemp("trained") / "ape"
    return out, train("ape", out, quick=True, progress=False)


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
    src, _ = trained
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_cli_rerun_of_finished_train_is_noop(cli_runs, trained):
    src, metrics = trained
    code, stdout, stderr = cli_runs["rerun"]
    assert code == 0, stderr
    assert f"test top-1 {metrics['test_top1']:.4f}" in stdout
    assert read_json(src / "metrics.json") == metrics


@pytest.mark.slow
def test_cli_quick_honours_explicit_epochs(cli_runs, trained):
    code, stdout, stderr = cli_runs["quick_epochs_3"]
    assert code == 0, stderr
    # --quick sets the default (2 epochs); it no longer silently caps an explicit --epochs at 2
    assert "(3 epochs," in " ".join(stdout.split())  # (the console wraps lines at 40 columns here)
    assert read_json(trained[0] / "metrics.json")["epochs"] == 2  # plain --quick / quick=True: 2 epochs
