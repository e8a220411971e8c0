"""A `vitpos train` killed at any write of a checkpoint reruns to the uninterrupted run's model.

Each run is `vitpos.cli.main()` with the argv of `python -m vitpos.cli train ...`, in its own
process forked from one driver interpreter (torch/timm imported once, not once per run). The kill
is `vitpos.io.fault_point`: VITPOS_FAULT=NAME@N ends the process with os._exit(137), like
kill -9, the N-th time it reaches that point, i.e. while writing the N-th checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vitpos.io import read_json

pytestmark = pytest.mark.slow  # `vitpos train` processes killed at each write

CKPT_POINTS = ["ckpt-model", "ckpt-optim", "ckpt-state", "ckpt-aside", "ckpt-commit"]
# every checkpoint write of both epochs, then the final artifacts (weights + config, before metrics.json)
FAULTS = [f"{p}@{n}" for n in (1, 2) for p in CKPT_POINTS] + ["final-model@1"]
TRAIN = ["train", "--pe", "ape", "--quick", "--no-progress"]

_DRIVER = r"""
import json, os, sys, traceback
import torch
import vitpos.train  # heavy imports once, before forking
from vitpos.cli import main
torch.set_num_threads(1)
codes = []
for fault, args in json.loads(sys.argv[1]):
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        if fault:
            os.environ["VITPOS_FAULT"] = fault
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
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(codes))
"""


def _committed_epochs(out: Path) -> int:
    """Epochs in the checkpoint a rerun resumes from (checkpoint/, or checkpoint.old/ if the swap was cut)."""
    for name in ("checkpoint", "checkpoint.old"):
        if (out / name / "state.json").exists():
            return read_json(out / name / "state.json")["epochs_done"]
    return 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run and one killed run per fault; then, in a second driver (so the killed
    runs' leftovers can be inspected first), each killed run's rerun."""
    tmp = tmp_path_factory.mktemp("atomic")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("VITPOS_FAULT", None)

    def drive(steps):
        proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(steps)], capture_output=True,
                              text=True, env=env, timeout=240)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    killed = [[f, [*TRAIN, "--epochs", "2", "--out", str(tmp / f)]] for f in FAULTS]
    codes = drive([[None, [*TRAIN, "--epochs", "2", "--out", str(tmp / "full")]], *killed])
    left = {f: (_committed_epochs(tmp / f), (tmp / f / "metrics.json").exists()) for f in FAULTS}
    rerun_codes = drive([[None, args] for _, args in killed])
    return tmp, codes[0], dict(zip(FAULTS, codes[1:], strict=True)), left, dict(zip(FAULTS, rerun_codes, strict=True))


@pytest.mark.parametrize("fault", FAULTS)
def test_killed_run_reruns_to_the_uninterrupted_model(runs, fault):
    tmp, full_code, killed_codes, left, rerun_codes = runs
    assert full_code == 0
    assert killed_codes[fault] == 137  # the fault point fired: the run died mid-write
    point, n = fault.split("@")
    committed, finished = left[fault]
    # what survives the kill is a whole checkpoint: the previous one up to the swap, the new one after
    assert committed == {"ckpt-commit": int(n), "final-model": 2}.get(point, int(n) - 1)
    assert not finished
    assert rerun_codes[fault] == 0
    out = tmp / fault
    assert (out / "model.safetensors").read_bytes() == (tmp / "full" / "model.safetensors").read_bytes()

    def drop(m: dict) -> dict:
        return {k: v for k, v in m.items() if k != "seconds"}

    assert drop(read_json(out / "metrics.json")) == drop(read_json(tmp / "full" / "metrics.json"))
    # the rerun tidied up: one committed checkpoint, no temp or set-aside folders
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint"]
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == [
        "model.safetensors", "optim.safetensors", "state.json"]

