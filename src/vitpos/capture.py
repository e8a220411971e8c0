"""Streaming a dataset's captured sites into the on-disk activation store (`capture_to_store`).

In-memory capture for small studies is ``vitpos.analysis.forward.capture_layers``. Prefix tokens
are dropped: probes and SAEs only ever see patch tokens.
"""

from __future__ import annotations

import torch

from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.hooks import capture
from vitpos.models.surface import ModelSurface, expand_sites
from vitpos.progress import progress_bar

_STORABLE = ("embed", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "q_rot", "k_rot")


def _tokens_first(t: torch.Tensor) -> torch.Tensor:
    """Per-head (B, h, T, d) -> (B, T, h*d) so every stored site is (B, T, D)."""
    return t.transpose(1, 2).flatten(2) if t.ndim == 4 else t


def capture_to_store(surface: ModelSurface, data: str, split: str, sites: str, out, *, limit: int | None = None,
                     batch_size: int = 128, dtype: str = "float32", shard_images: int = 256, force: bool = False,
                     progress: bool = True, device: str | torch.device | None = None, amp: str | None = None,
                     distributed: bool | None = None, _first_id: int = 0, _meta: dict | None = None) -> dict:
    """Stream the chosen sites of every image of a split into an activation store (resumable).

    ``device`` (auto|cpu|cuda; None = where the model is)
    moves the model there for the capture (and back after); ``amp`` (none|bf16|fp16) autocasts the forward. On CUDA a batch that
    runs out of memory is retried in halves (and later batches keep the smaller size). Under a
    torchrun job with several ranks (``distributed`` None = detect) the split is cut into one
    contiguous block per rank, each rank writes its own store under ``out/rank-NNNNN/`` and rank 0
    merges their manifests into ``out/manifest.json`` (docs/distributed.md).
    """
    from vitpos.runtime import device as rdevice
    from vitpos.runtime import dist as rdist
    from vitpos.store import ActivationWriter

    if distributed or (distributed is None and rdist.current().enabled):
        from vitpos.capture_dist import capture_sharded

        return capture_sharded(surface, data, split, sites, out, limit=limit, batch_size=batch_size, dtype=dtype,
                               shard_images=shard_images, force=force, progress=progress, device=device, amp=amp)

    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise VitposError(f"unknown --dtype {dtype!r}; use float32, float16 or bfloat16")
    site_list = expand_sites(sites, surface.depth)
    for s in site_list:
        if s.name not in _STORABLE:
            raise VitposError(f"site {s} cannot be stored (attention patterns and tables are not token activations)")
    home = next(surface.model.parameters()).device
    dev = rdevice.resolve_device(device) if device is not None else home  # default: wherever the model already is
    rdevice.autocast_dtype(amp, dev)
    if dev != home:
        surface.model.to(dev)  # moved back below: callers keep the surface where it was
        try:
            return capture_to_store(surface, data, split, sites, out, limit=limit, batch_size=batch_size, dtype=dtype,
                                    shard_images=shard_images, force=force, progress=progress, device=dev, amp=amp,
                                    distributed=False, _first_id=_first_id, _meta=_meta)
        finally:
            surface.model.to(home)
    dataset = dataset_for(surface, data, split, limit=limit)
    meta = store_meta(surface, data, split, limit, len(dataset)) if _meta is None else _meta
    keys = [str(s) for s in site_list]
    chunk = [batch_size]  # forward size; halves on CUDA OOM
    with ActivationWriter(out, sites=keys, grid=surface.grid, num_prefix_tokens=surface.num_prefix_tokens,
                          meta=meta, shard_images=shard_images, dtype=dtypes[dtype], force=force) as writer:
        done = writer.num_done
        total = (len(dataset) + batch_size - 1) // batch_size
        with progress_bar(enabled=progress) as bar, capture(surface, site_list) as cache:
            task = bar.add_task(f"capture {surface.spec}", total=total)
            seen = 0
            for x, y in dataset.batches(batch_size):
                ids = torch.arange(seen, seen + len(y))
                seen += len(y)
                keep = ids >= done  # resume: skip images already in the store
                if keep.any():
                    _forward_adaptive(surface, x[keep].to(dev, non_blocking=True), cache, keys, chunk, dev, amp)
                    batch = {k: _tokens_first(cache.pop_batch(k)) for k in keys}
                    writer.add(batch, y[keep], ids[keep] + _first_id)
                bar.update(task, advance=1)
    return {"num_images": len(dataset), "sites": keys, "out": str(out)}


def _forward_adaptive(surface: ModelSurface, x: torch.Tensor, cache, keys: list[str], chunk: list[int],
                      dev: torch.device, amp: str | None) -> None:
    """Forward ``x`` in pieces of ``chunk[0]`` images under autocast; on out-of-memory drop what was
    captured for this batch, halve the piece size (kept for later batches) and redo the batch."""
    from vitpos.runtime import device as rdevice

    def step(bs: int) -> None:
        try:
            with rdevice.autocast(dev, amp):
                for i in range(0, x.shape[0], bs):
                    surface(x[i : i + bs])
        except BaseException:
            for k in keys:  # a partial batch must not reach the store
                try:
                    cache.pop_batch(k)
                except KeyError:
                    pass
            raise

    _, chunk[0] = rdevice.retry_on_oom(step, chunk[0])


def store_meta(surface: ModelSurface, data, split: str, limit: int | None, n_images: int) -> dict:
    """What a store records of its source; one description for single-process and sharded capture,
    with the weights digest so a store is never mistaken for one of retrained weights."""
    return {"model": surface.spec, "weights": surface.weights_digest(), "data": data_name(data), "split": split,
            "limit": limit, "n_images": n_images}
