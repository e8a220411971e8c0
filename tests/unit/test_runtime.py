"""Scaling helpers in one process: device/amp rules, OOM-adaptive batches (a fake OOM), bf16
autocast, and exact resume of SAE training. The 2-rank runs are integration/test_distributed.py."""

from __future__ import annotations

import pytest
import torch

from conftest import (
    CAPTURE_ARGS,
    CAPTURE_SITES,
    SAE_CFGS,
    SAE_STEPS,
    assert_same_store,
    capture_surface,
    sae_data,
)
from vitpos.errors import VitposError
from vitpos.runtime import device as rdevice
from vitpos.runtime import dist as rdist
from vitpos.runtime.options import RunOptions
from vitpos.sae import SAE, SAEConfig, train_sae


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
    data = sae_data(n_batches=3)
    sae, log = train_sae(data, SAEConfig(d_in=16, expansion=4, k=4), steps=3, amp="bf16", device="cpu", progress=False)
    assert all(torch.isfinite(torch.tensor(log.loss)))


def test_single_process_resume_is_exact(tmp_path):
    data, cfg = sae_data(), SAE_CFGS["topk"]
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


def test_capture_bf16_autocast_and_fp16_refusal(tmp_path):
    from vitpos.store.capture import capture_to_store
    from vitpos.store.reader import ActivationStore

    capture_to_store(capture_surface(), "shapes", "test", "blocks.1.resid_post", tmp_path / "a", amp="bf16",
                     dtype="bfloat16",
                     **CAPTURE_ARGS)
    assert ActivationStore(tmp_path / "a").dtype == "bfloat16"
    with pytest.raises(VitposError, match="fp16 needs a CUDA"):
        capture_to_store(capture_surface(), "shapes", "test", "blocks.1.resid_post", tmp_path / "b", amp="fp16",
                         **CAPTURE_ARGS)


def test_capture_retries_a_batch_that_runs_out_of_memory(tmp_path, single_store, monkeypatch):
    """A fake CUDA OOM on batches above 5 images: the batch is redone in halves, the store is unchanged."""
    from vitpos.models.surface import ModelSurface
    from vitpos.store.capture import capture_to_store

    surface = capture_surface()
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
    assert_same_store(single_store, tmp_path)


@pytest.mark.slow
def test_resume_continues_a_reseeded_epoch_stream(tmp_path):
    """Per-epoch shuffles (a callable reseeding on each call) continue where the run stopped."""
    flat = torch.cat(sae_data(n_batches=4))

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


@pytest.mark.slow
def test_probe_device_and_bf16_forwards():
    from vitpos.experiments.probe import run_probe

    s = capture_surface()
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
    data, cfg = sae_data(), SAE_CFGS["topk"]
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


def test_options_checkpoint_key_restarts_stale_state(tmp_path):
    from vitpos.sae.checkpoint import StaleCheckpointError

    data, cfg = sae_data(n_batches=3), SAE_CFGS["topk"]
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
