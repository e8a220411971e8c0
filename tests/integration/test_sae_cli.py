"""`vitpos sae` as a process: a --store of another model is one `error:` line and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import tiny_own, toy_set
from vitpos.store.capture import capture_to_store


@pytest.mark.slow
def test_cli_sae_store_mismatch_is_one_error_line(tmp_path):
    capture_to_store(tiny_own("ape"), toy_set(8), "train", "blocks.0.resid_post", tmp_path / "store", progress=False)
    proc = subprocess.run([sys.executable, "-m", "vitpos.cli", "sae", "--model", "builtin:ape", "--layer", "0",
                           "--store", str(tmp_path / "store"), "--out", str(tmp_path / "o"), "--no-progress"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "40"})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "tiny:ape" in lines[0] and "builtin:ape" in lines[0]
