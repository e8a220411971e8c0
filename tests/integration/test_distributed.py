"""Scaling across processes: 2-rank gloo runs on CPU (forked ranks and real `torchrun` launches) that
must equal single-process runs (DDP SAE training, sharded capture, resume after a rank dies). The
one-process helpers (device/amp rules, OOM fallbacks, exact resume) are unit/test_runtime.py."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from conftest import (
    CAPTURE_ARGS,
    CAPTURE_SITES,
    CAPTURE_SPEC,
    SAE_CFGS,
    SAE_STEPS,
    assert_same_store,
    capture_surface,
    sae_data,
)
from vitpos.errors import VitposError
from vitpos.runtime import dist as rdist
from vitpos.sae import SAE, train_sae

pytestmark = pytest.mark.slow  # every test starts 2 ranks (forked or torchrun)

WORLD = 2
SPAWN_TIMEOUT = 120  # seconds a 2-rank job may take before the test fails
# fork: the ranks inherit the imported modules (seconds saved per job); the parent has no process group.
START_METHOD = "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _join(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    torch.set_num_threads(1)


def _spawn(fn, *args) -> None:
    ctx = mp.start_processes(fn, args=(WORLD, _free_port(), *args), nprocs=WORLD, join=False, start_method=START_METHOD)
    import time

    deadline = time.monotonic() + SPAWN_TIMEOUT
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"2-rank job did not finish within {SPAWN_TIMEOUT} s")


# ------------------------------------------------------------------------------- SAE with DDP


def _sae_worker(rank, world, port, out, arch, ckpt, kill_at):
    _join(rank, world, port)
    on_step = None
    if kill_at and rank == world - 1:
        def on_step(step, m):  # a rank dying mid-run (no cleanup, like a lost node)
            if step == kill_at:
                os._exit(3)
    with rdist.distributed("cpu", timeout_s=60):
        sae, log = train_sae(sae_data(), SAE_CFGS[arch], steps=SAE_STEPS, lr=3e-3, device="cpu", progress=False,
                             on_step=on_step, checkpoint_dir=ckpt, checkpoint_every=4 if ckpt else None)
        if rank == 0:
            sae.save(Path(out) / "sae.safetensors")
            (Path(out) / "log.json").write_text(json.dumps(log.to_dict()))


def _compare(ref: SAE, ref_log, out: Path, atol: float) -> float:
    got = SAE.load(out / "sae.safetensors")
    worst = 0.0
    for name in ("W_enc", "b_enc", "W_dec", "b_dec", "scale", "threshold"):
        d = float((getattr(ref, name) - getattr(got, name)).detach().abs().max())
        worst = max(worst, d)
        assert d <= atol, f"{name} differs by {d}"
    log = json.loads((out / "log.json").read_text())
    assert log["steps"] == ref_log.steps and log["tokens"] == ref_log.tokens
    assert max(abs(a - b) for a, b in zip(log["fvu"], ref_log.fvu, strict=True)) <= 1e-5
    assert log["dead_frac"] == pytest.approx(ref_log.dead_frac, abs=1e-6)
    return worst


@pytest.mark.parametrize("arch", ["topk", "relu"])
def test_ddp_sae_equals_single_process(tmp_path, arch):
    ref, ref_log = train_sae(sae_data(), SAE_CFGS[arch], steps=SAE_STEPS, lr=3e-3, device="cpu", progress=False)
    if arch == "topk":
        assert max(ref_log.dead_frac) > 0  # the dead-latent / AuxK path is exercised
    _spawn(_sae_worker, str(tmp_path), arch, None, 0)
    worst = _compare(ref, ref_log, tmp_path, atol=1e-5)
    print(f"{arch}: max |distributed - single| = {worst:.2e}")


def test_ddp_sae_resumes_after_a_rank_dies(tmp_path):
    ref, ref_log = train_sae(sae_data(), SAE_CFGS["topk"], steps=SAE_STEPS, lr=3e-3, device="cpu", progress=False)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(mp.ProcessExitedException):
        _spawn(_sae_worker, str(tmp_path), "topk", str(ckpt), 6)
    assert (ckpt / "train-state.safetensors").is_file() and not (tmp_path / "sae.safetensors").exists()
    import shutil

    shutil.copytree(ckpt, tmp_path / "ckpt1")  # the 2-rank checkpoint also resumes in one process
    one, _ = train_sae(sae_data(), SAE_CFGS["topk"], steps=SAE_STEPS, lr=3e-3, device="cpu", progress=False,
                       checkpoint_dir=tmp_path / "ckpt1")
    assert float((one.W_dec - ref.W_dec).detach().abs().max()) <= 1e-5
    _spawn(_sae_worker, str(tmp_path), "topk", str(ckpt), 0)  # the same job again: resumes at step 4
    log = json.loads((tmp_path / "log.json").read_text())
    assert any("resumed" in n and "step 4" in n for n in log["notes"])
    _compare(ref, ref_log, tmp_path, atol=1e-5)


# ---------------------------------------------------------------------------- sharded capture


def _capture_worker(rank, world, port, out, die_after_shards, force):
    from vitpos.store.capture import capture_to_store
    from vitpos.store.writer import ActivationWriter

    _join(rank, world, port)
    if die_after_shards and rank == world - 1:
        flush, count = ActivationWriter._flush, [0]

        def dying_flush(self):
            flush(self)
            count[0] += 1
            if count[0] == die_after_shards:
                os._exit(3)
        ActivationWriter._flush = dying_flush
    with rdist.distributed("cpu", timeout_s=60):
        capture_to_store(capture_surface(), "shapes", "test", CAPTURE_SITES, out, force=force, **CAPTURE_ARGS)


def test_distributed_capture_equals_single_process(tmp_path, single_store):
    from vitpos.store.reader import ActivationStore

    _spawn(_capture_worker, str(tmp_path), 0, False)
    assert_same_store(single_store, tmp_path)
    store = ActivationStore(tmp_path)
    assert {sh["file"].split("/")[0] for sh in store.shards} == {"rank-00000", "rank-00001"}
    assert ActivationStore(tmp_path / "rank-00001").meta["first_image"] == 23  # 45 images: blocks of 23 + 22


def test_distributed_capture_resumes_after_a_rank_dies(tmp_path, single_store):
    with pytest.raises(mp.ProcessExitedException):
        _spawn(_capture_worker, str(tmp_path), 1, False)
    assert not (tmp_path / "manifest.json").exists()
    rank1 = json.loads((tmp_path / "rank-00001" / "manifest.json").read_text())
    assert rank1["num_images"] == 8 and not rank1["complete"]
    _spawn(_capture_worker, str(tmp_path), 0, False)  # the same job again: rank 1 resumes at image 23 + 8
    assert_same_store(single_store, tmp_path)
    _spawn(_capture_worker, str(tmp_path), 0, False)  # finished: a rerun leaves it as it is
    assert_same_store(single_store, tmp_path)


def test_distributed_capture_refuses_other_world_size(tmp_path, single_store):
    from vitpos.store.capture import capture_to_store, merge_manifests

    _spawn(_capture_worker, str(tmp_path), 0, False)
    with pytest.raises(VitposError, match="captured with 2 ranks"):
        capture_to_store(capture_surface(), "shapes", "test", CAPTURE_SITES, tmp_path, distributed=True, **CAPTURE_ARGS)
    with pytest.raises(VitposError, match="single-process"):
        capture_to_store(capture_surface(), "shapes", "test", CAPTURE_SITES, single_store, distributed=True,
                         **CAPTURE_ARGS)
    capture_to_store(capture_surface(), "shapes", "test", CAPTURE_SITES, tmp_path, distributed=True, force=True,
                     **CAPTURE_ARGS)
    assert_same_store(single_store, tmp_path)  # one "rank" now, still the same store
    merged = json.loads((tmp_path / "manifest.json").read_text())
    assert merged["ranks"] == 1 and not (tmp_path / "rank-00001").exists()
    assert merge_manifests(tmp_path, 1, merged["meta"])["num_images"] == 45


def test_torchrun_cli_capture(tmp_path, single_store):
    """The real launcher: `torchrun --nproc-per-node 2 -m vitpos.cli capture ...` on CPU (gloo)."""
    import subprocess
    import sys

    from safetensors.torch import save_file

    weights = tmp_path / "w.safetensors"  # the same (seed-0) weights as the single-process store
    save_file({k: v.contiguous() for k, v in capture_surface().model.state_dict().items()}, str(weights))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
           "-m", "vitpos.cli", "capture", "--model", CAPTURE_SPEC, "--data", "shapes", "--split", "test",
           "--sites", CAPTURE_SITES, "--limit", "45", "--batch-size", "16", "--shard-images", "8",
           "--device", "cpu", "--no-progress", "--checkpoint", str(weights), "--out", str(tmp_path / "acts")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=SPAWN_TIMEOUT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "captured 45 images x 3 sites on 2 ranks" in r.stdout
    from vitpos.store.reader import ActivationStore

    assert ActivationStore(tmp_path / "acts").meta["model"] == CAPTURE_SPEC
    assert_same_store(single_store, tmp_path / "acts")


def test_torchrun_cli_sae_equals_single_process(tmp_path):
    """`torchrun --nproc-per-node 2 -m vitpos.cli sae --store S` (DDP) == run_sae on S in one process."""
    import subprocess
    import sys

    from safetensors.torch import save_file

    from vitpos.experiments.sae_run import run_sae
    from vitpos.store.capture import capture_to_store

    surface = capture_surface()
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in surface.model.state_dict().items()}, str(weights))
    capture_to_store(surface, "shapes", "train", "blocks.0.resid_post", tmp_path / "acts", limit=64, progress=False)
    _, ref = run_sae(surface, 0, data="shapes", k=4, epochs=2, batch_tokens=128, store=tmp_path / "acts",
                     n_eval_images=64)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
           "-m", "vitpos.cli", "sae", "--model", CAPTURE_SPEC, "--checkpoint", str(weights), "--layer", "0",
           "--store", str(tmp_path / "acts"), "--k", "4", "--epochs", "2", "--batch-tokens", "128", "--device", "cpu",
           "--no-progress", "--out", str(tmp_path / "sae")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=SPAWN_TIMEOUT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("SAE L0 resid_post") == 1  # rank 0 reports
    got = SAE.load(tmp_path / "sae")
    for name in ("W_enc", "b_enc", "W_dec", "b_dec", "scale"):
        assert float((getattr(ref, name) - getattr(got, name)).detach().abs().max()) <= 1e-5, name
    assert (tmp_path / "sae" / "train-state" / "train-state.safetensors").is_file()
