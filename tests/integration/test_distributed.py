"""Scaling: device/amp helpers, OOM-adaptive batches, and 2-rank gloo runs on CPU that must equal
single-process runs (DDP SAE training, sharded capture, resume after a rank dies)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from vitpos.errors import VitposError
from vitpos.runtime import device as rdevice
from vitpos.runtime import dist as rdist
from vitpos.runtime.options import RunOptions
from vitpos.sae import SAE, SAEConfig, train_sae

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


# ------------------------------------------------------------------------------- pure helpers


def test_resolve_device():
    assert rdevice.resolve_device("auto", cuda_available=False) == torch.device("cpu")
    assert rdevice.resolve_device(None, cuda_available=False) == torch.device("cpu")
    assert rdevice.resolve_device("cpu", cuda_available=True) == torch.device("cpu")
    assert rdevice.resolve_device("auto", cuda_available=True, local_rank=0) == torch.device("cuda", 0)
    assert rdevice.resolve_device("cuda", cuda_available=True, local_rank=3) == torch.device("cuda", 3)
    assert rdevice.resolve_device("cuda:1", cuda_available=True, local_rank=3) == torch.device("cuda", 1)
    with pytest.raises(VitposError, match="no CUDA device"):
        rdevice.resolve_device("cuda", cuda_available=False)
    with pytest.raises(VitposError, match="unknown --device"):
        rdevice.resolve_device("tpu", cuda_available=False)


def test_autocast_choices():
    assert rdevice.autocast_dtype("none", "cpu") is None
    assert rdevice.autocast_dtype("bf16", "cpu") is torch.bfloat16
    assert rdevice.autocast_dtype("fp16", "cuda") is torch.float16
    with pytest.raises(VitposError, match="fp16 needs a CUDA"):
        rdevice.autocast_dtype("fp16", "cpu")
    with pytest.raises(VitposError, match="unknown --amp"):
        rdevice.autocast_dtype("int8", "cpu")
    with rdevice.autocast("cpu", "bf16"):
        assert (torch.ones(4, 4) @ torch.ones(4, 4)).dtype is torch.bfloat16


def test_retry_on_oom_halves_the_batch():
    tried, shrinks = [], []

    def step(bs):
        tried.append(bs)
        if bs > 24:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return bs * 10

    assert rdevice.retry_on_oom(step, 100, on_shrink=lambda a, b: shrinks.append((a, b))) == (120, 12)
    assert tried == [100, 50, 25, 12]
    assert shrinks == [(100, 50), (50, 25), (25, 12)]
    with pytest.raises(VitposError, match="out of memory even at batch size 4"):
        rdevice.retry_on_oom(lambda bs: step(1000), 8, min_batch=4)
    with pytest.raises(ValueError):  # other errors pass through untouched
        rdevice.retry_on_oom(lambda bs: (_ for _ in ()).throw(ValueError("no")), 8)
    assert rdevice.is_oom(RuntimeError("CUDA error: out of memory"))
    assert not rdevice.is_oom(RuntimeError("shape mismatch"))


def test_dist_env_and_blocks():
    assert rdist.dist_env({}) == rdist.DistEnv(0, 1, 0)
    e = rdist.dist_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (e.rank, e.world_size, e.local_rank, e.is_main, e.enabled) == (3, 4, 1, False, True)
    with pytest.raises(VitposError):
        rdist.dist_env({"RANK": "4", "WORLD_SIZE": "4"})
    blocks = [rdist.block_range(10, r, 3) for r in range(3)]
    assert blocks == [(0, 4), (4, 7), (7, 10)]
    assert rdist.backend_for("cpu") == "gloo" and rdist.backend_for("cuda:0") == "nccl"


def test_sae_bf16_autocast_trains_on_cpu():
    data = _sae_data(n_batches=3)
    sae, log = train_sae(data, SAEConfig(d_in=16, expansion=4, k=4), steps=3, amp="bf16", device="cpu", progress=False)
    assert all(torch.isfinite(torch.tensor(log.loss)))


# ------------------------------------------------------------------------------- SAE with DDP


def _sae_data(n_batches: int = 8, n: int = 256, seed: int = 0) -> list[torch.Tensor]:
    """Sparse combinations of 40 directions in 16-D: latents die at 16x expansion, so AuxK runs."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(40, 16, generator=g)
    out = []
    for _ in range(n_batches):
        z = torch.rand(n, 40, generator=g) * (torch.rand(n, 40, generator=g) < 0.1)
        out.append(z @ basis + 0.01 * torch.randn(n, 16, generator=g))
    return out


SAE_CFGS = {
    "topk": SAEConfig(d_in=16, expansion=16, k=2, dead_steps=256),
    "relu": SAEConfig(arch="relu", d_in=16, expansion=4, l1_coeff=1e-2),
}
SAE_STEPS = 12


def _sae_worker(rank, world, port, out, arch, ckpt, kill_at):
    _join(rank, world, port)
    on_step = None
    if kill_at and rank == world - 1:
        def on_step(step, m):  # a rank dying mid-run (no cleanup, like a lost node)
            if step == kill_at:
                os._exit(3)
    with rdist.distributed("cpu", timeout_s=60):
        sae, log = train_sae(_sae_data(), SAE_CFGS[arch], steps=SAE_STEPS, lr=3e-3, device="cpu", progress=False,
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
    ref, ref_log = train_sae(_sae_data(), SAE_CFGS[arch], steps=SAE_STEPS, lr=3e-3, device="cpu", progress=False)
    if arch == "topk":
        assert max(ref_log.dead_frac) > 0  # the dead-latent / AuxK path is exercised
    _spawn(_sae_worker, str(tmp_path), arch, None, 0)
    worst = _compare(ref, ref_log, tmp_path, atol=1e-5)
    print(f"{arch}: max |distributed - single| = {worst:.2e}")


def test_ddp_sae_resumes_after_a_rank_dies(tmp_path):
    ref, ref_log = train_sae(_sae_data(), SAE_CFGS["topk"], steps=SAE_STEPS, lr=3e-3, device="cpu", progress=False)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(mp.ProcessExitedException):
        _spawn(_sae_worker, str(tmp_path), "topk", str(ckpt), 6)
    assert (ckpt / "train-state.safetensors").is_file() and not (tmp_path / "sae.safetensors").exists()
    import shutil

    shutil.copytree(ckpt, tmp_path / "ckpt1")  # the 2-rank checkpoint also resumes in one process
    one, _ = train_sae(_sae_data(), SAE_CFGS["topk"], steps=SAE_STEPS, lr=3e-3, device="cpu", progress=False,
                       checkpoint_dir=tmp_path / "ckpt1")
    assert float((one.W_dec - ref.W_dec).detach().abs().max()) <= 1e-5
    _spawn(_sae_worker, str(tmp_path), "topk", str(ckpt), 0)  # the same job again: resumes at step 4
    log = json.loads((tmp_path / "log.json").read_text())
    assert any("resumed" in n and "step 4" in n for n in log["notes"])
    _compare(ref, ref_log, tmp_path, atol=1e-5)


def test_single_process_resume_is_exact(tmp_path):
    data, cfg = _sae_data(), SAE_CFGS["topk"]
    ref, _ = train_sae(data, cfg, epochs=2, lr=3e-3, progress=False)

    class Stop(Exception):
        pass

    def crash(step, m):
        if step == 11:
            raise Stop

    with pytest.raises(Stop):
        train_sae(data, cfg, epochs=2, lr=3e-3, progress=False, checkpoint_dir=tmp_path, checkpoint_every=5,
                  on_step=crash)
    sae, log = train_sae(data, cfg, epochs=2, lr=3e-3, progress=False, checkpoint_dir=tmp_path, checkpoint_every=5)
    assert log.steps == 16 and log.epochs_done == 2 and "resumed" in log.notes[-1]
    for name in ("W_enc", "W_dec", "b_dec", "b_enc"):
        assert torch.equal(getattr(ref, name), getattr(sae, name))
    # a finished run reruns as a no-op; a different run in the same folder is refused
    again, log2 = train_sae(data, cfg, epochs=2, lr=3e-3, progress=False, checkpoint_dir=tmp_path)
    assert log2.steps == 16 and torch.equal(again.W_dec, sae.W_dec)
    with pytest.raises(VitposError, match="different SAE run"):
        train_sae(data, cfg, epochs=3, lr=3e-3, progress=False, checkpoint_dir=tmp_path)


# ---------------------------------------------------------------------------- sharded capture

CAPTURE_SPEC = "timm:vit_small_patch16_224?img_size=32&patch_size=8&depth=2&embed_dim=32&num_heads=2&num_classes=4"
CAPTURE_ARGS = dict(limit=45, batch_size=16, shard_images=8, progress=False)
CAPTURE_SITES = "resid_post,blocks.0.q"


def _surface():
    from vitpos.models import load_model

    torch.manual_seed(0)
    return load_model(CAPTURE_SPEC)


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
        capture_to_store(_surface(), "shapes", "test", CAPTURE_SITES, out, force=force, **CAPTURE_ARGS)


def _assert_same_store(a_dir, b_dir):
    from vitpos.store.reader import ActivationStore

    a, b = ActivationStore(a_dir), ActivationStore(b_dir)
    assert a.meta == b.meta and a.num_images == b.num_images and a.sites == b.sites and a.d == b.d
    la, ia = a.load_labels()
    lb, ib = b.load_labels()
    assert torch.equal(ia, ib) and torch.equal(la, lb) and torch.equal(ia, torch.arange(a.num_images))
    for site in a.sites:
        assert torch.equal(a.load_site(site), b.load_site(site)), site  # bit-exact (float32)
    xa = torch.cat([t[0] for t in a.iter_tokens(a.sites[0], 100)])
    xb = torch.cat([t[0] for t in b.iter_tokens(b.sites[0], 100)])
    assert torch.equal(xa, xb)


@pytest.fixture(scope="module")
def single_store(tmp_path_factory):
    from vitpos.store.capture import capture_to_store

    out = tmp_path_factory.mktemp("single")
    capture_to_store(_surface(), "shapes", "test", CAPTURE_SITES, out, **CAPTURE_ARGS)
    return out


def test_distributed_capture_equals_single_process(tmp_path, single_store):
    from vitpos.store.reader import ActivationStore

    _spawn(_capture_worker, str(tmp_path), 0, False)
    _assert_same_store(single_store, tmp_path)
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
    _assert_same_store(single_store, tmp_path)
    _spawn(_capture_worker, str(tmp_path), 0, False)  # finished: a rerun leaves it as it is
    _assert_same_store(single_store, tmp_path)


def test_distributed_capture_refuses_other_world_size(tmp_path, single_store):
    from vitpos.store.capture import capture_to_store, merge_manifests

    _spawn(_capture_worker, str(tmp_path), 0, False)
    with pytest.raises(VitposError, match="captured with 2 ranks"):
        capture_to_store(_surface(), "shapes", "test", CAPTURE_SITES, tmp_path, distributed=True, **CAPTURE_ARGS)
    with pytest.raises(VitposError, match="single-process"):
        capture_to_store(_surface(), "shapes", "test", CAPTURE_SITES, single_store, distributed=True, **CAPTURE_ARGS)
    capture_to_store(_surface(), "shapes", "test", CAPTURE_SITES, tmp_path, distributed=True, force=True,
                     **CAPTURE_ARGS)
    _assert_same_store(single_store, tmp_path)  # one "rank" now, still the same store
    merged = json.loads((tmp_path / "manifest.json").read_text())
    assert merged["ranks"] == 1 and not (tmp_path / "rank-00001").exists()
    assert merge_manifests(tmp_path, 1, merged["meta"])["num_images"] == 45


def test_capture_bf16_autocast_and_fp16_refusal(tmp_path):
    from vitpos.store.capture import capture_to_store
    from vitpos.store.reader import ActivationStore

    capture_to_store(_surface(), "shapes", "test", "blocks.1.resid_post", tmp_path / "a", amp="bf16", dtype="bfloat16",
                     **CAPTURE_ARGS)
    assert ActivationStore(tmp_path / "a").dtype == "bfloat16"
    with pytest.raises(VitposError, match="fp16 needs a CUDA"):
        capture_to_store(_surface(), "shapes", "test", "blocks.1.resid_post", tmp_path / "b", amp="fp16",
                         **CAPTURE_ARGS)


def test_capture_retries_a_batch_that_runs_out_of_memory(tmp_path, single_store, monkeypatch):
    """A fake CUDA OOM on batches above 5 images: the batch is redone in halves, the store is unchanged."""
    from vitpos.models.surface import ModelSurface
    from vitpos.store.capture import capture_to_store

    surface = _surface()
    call = ModelSurface.__call__
    sizes = []

    def flaky(self, images):
        sizes.append(images.shape[0])
        out = call(self, images)  # hooks fire (partial capture) before the OOM
        if images.shape[0] > 5:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")
        return out

    monkeypatch.setattr(ModelSurface, "__call__", flaky)
    capture_to_store(surface, "shapes", "test", CAPTURE_SITES, tmp_path, **CAPTURE_ARGS)
    assert sizes[:4] == [16, 8, 4, 4] and max(sizes[4:]) <= 4
    _assert_same_store(single_store, tmp_path)


def test_torchrun_cli_capture(tmp_path, single_store):
    """The real launcher: `torchrun --nproc-per-node 2 -m vitpos.cli capture ...` on CPU (gloo)."""
    import subprocess
    import sys

    from safetensors.torch import save_file

    weights = tmp_path / "w.safetensors"  # the same (seed-0) weights as the single-process store
    save_file({k: v.contiguous() for k, v in _surface().model.state_dict().items()}, str(weights))
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
    _assert_same_store(single_store, tmp_path / "acts")


def test_resume_continues_a_reseeded_epoch_stream(tmp_path):
    """Per-epoch shuffles (a callable reseeding on each call) continue where the run stopped."""
    flat = torch.cat(_sae_data(n_batches=4))

    def source():
        def passes():
            g = torch.Generator().manual_seed(passes.epoch)
            passes.epoch += 1
            order = torch.randperm(flat.shape[0], generator=g)
            for i in range(0, len(order), 256):
                yield flat[order[i:i + 256]]
        passes.epoch = 0
        return passes

    cfg = SAE_CFGS["topk"]
    ref, _ = train_sae(source(), cfg, epochs=3, lr=3e-3, progress=False)

    def crash(step, m):
        if step == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_sae(source(), cfg, epochs=3, lr=3e-3, progress=False, checkpoint_dir=tmp_path, checkpoint_every=6,
                  on_step=crash)
    sae, log = train_sae(source(), cfg, epochs=3, lr=3e-3, progress=False, checkpoint_dir=tmp_path, checkpoint_every=6)
    assert log.steps == 12 and torch.equal(ref.W_dec, sae.W_dec) and torch.equal(ref.b_enc, sae.b_enc)


def test_full_precision_shields_a_fit_from_autocast():
    @rdevice.full_precision
    def fit():
        return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype

    with rdevice.autocast("cpu", "bf16"):
        assert fit() is torch.float32
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype is torch.bfloat16


def test_probe_device_and_bf16_forwards():
    from vitpos.experiments.probe import run_probe

    s = _surface()
    ref = run_probe(s, "shapes", "resid_post", n_images=40).to_json()
    same = run_probe(s, "shapes", "resid_post", n_images=40, device="auto").to_json()  # resolves to the CPU here
    amp = run_probe(s, "shapes", "resid_post", n_images=40, device="cpu", amp="bf16").to_json()
    assert same["row_acc"] == ref["row_acc"] and same["col_acc"] == ref["col_acc"]
    for key in ("row_acc", "col_acc"):
        assert max(abs(a - b) for a, b in zip(amp[key], ref[key], strict=True)) <= 0.05
    assert next(s.model.parameters()).dtype is torch.float32


def test_sae_step_splits_a_batch_that_runs_out_of_memory(monkeypatch):
    """A fake CUDA OOM above 100 tokens: the step is redone in accumulated pieces and equals the
    whole-batch step (TopK with AuxK active)."""
    data, cfg = _sae_data(), SAE_CFGS["topk"]
    ref, ref_log = train_sae(data, cfg, steps=SAE_STEPS, lr=3e-3, progress=False)
    step = SAE.step

    def small_only(self, x, *args, **kwargs):
        if x.shape[0] > 100:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")
        return step(self, x, *args, **kwargs)

    monkeypatch.setattr(SAE, "step", small_only)
    sae, log = train_sae(data, cfg, steps=SAE_STEPS, lr=3e-3, progress=False)
    assert any("out of memory at 128 tokens" in n for n in log.notes)  # 256 -> 128 -> 64 tokens per piece
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        assert float((getattr(ref, name) - getattr(sae, name)).detach().abs().max()) <= 1e-5, name
    assert max(abs(a - b) for a, b in zip(log.fvu, ref_log.fvu, strict=True)) <= 1e-5
    assert log.dead_frac == pytest.approx(ref_log.dead_frac, abs=1e-6) and max(ref_log.dead_frac) > 0


def test_torchrun_cli_sae_equals_single_process(tmp_path):
    """`torchrun --nproc-per-node 2 -m vitpos.cli sae --store S` (DDP) == run_sae on S in one process."""
    import subprocess
    import sys

    from safetensors.torch import save_file

    from vitpos.experiments.sae_run import run_sae
    from vitpos.store.capture import capture_to_store

    surface = _surface()
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


def test_options_checkpoint_key_restarts_stale_state(tmp_path):
    from vitpos.sae.checkpoint import StaleCheckpointError

    data, cfg = _sae_data(n_batches=3), SAE_CFGS["topk"]
    train_sae(data, cfg, epochs=1, lr=3e-3, progress=False,
              options=RunOptions(checkpoint_dir=str(tmp_path), checkpoint_key={"batch_tokens": 256}))
    other = RunOptions(checkpoint_dir=str(tmp_path), checkpoint_key={"batch_tokens": 128})
    with pytest.raises(StaleCheckpointError, match="different SAE run"):
        train_sae(data, cfg, epochs=1, lr=3e-3, progress=False, options=other)
    sae, log = train_sae(data, cfg, epochs=1, lr=3e-3, progress=False,
                         options=RunOptions(checkpoint_dir=str(tmp_path), checkpoint_key={"batch_tokens": 128},
                                            restart_on_mismatch=True))
    ref, _ = train_sae(data, cfg, epochs=1, lr=3e-3, progress=False)
    assert log.steps == 3 and "other settings" in log.notes[0] and torch.equal(sae.W_dec, ref.W_dec)
