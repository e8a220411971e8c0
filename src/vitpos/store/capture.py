"""Streaming a dataset's captured sites into an activation store, in one process or under torchrun.

One code path: a *block* of images of the split (``capture_block``) goes into one store. A single
process captures the whole split as one block straight into ``out/``. Under a torchrun job with W
ranks, rank r captures the contiguous block ``block_range(n, r, W)`` into its own store and rank 0
merges the manifests; layout of ``out/`` after such a capture::

    manifest.json                  merged: lists every rank's shards in global image order
    rank-00000/manifest.json       rank 0's own store (images 0 .. n0-1), resumable on its own
    rank-00000/shard-00000.safetensors ...
    rank-00001/...                 images n0 .. n0+n1-1

Each block stores its images with their global image ids. The merged manifest is an ordinary
version-1 manifest whose shard entries carry a ``rank-NNNNN/`` prefix and global ``first_image``;
``ActivationStore(out)`` reads it exactly like a single-process store of the same images (same ids,
labels and activations, in the same order; shard boundaries differ). A killed job is resumed by
rerunning it with the same number of ranks: each rank resumes its own store. A different number of
ranks over an existing store is refused (``--force`` starts over). Prefix tokens are dropped: probes
and SAEs only ever see patch tokens. In-memory capture for small studies is
``vitpos.analysis.forward.capture_layers``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.hooks import capture
from vitpos.io import read_json, write_json
from vitpos.models.surface import ModelSurface, Site, expand_sites
from vitpos.progress import progress_bar
from vitpos.runtime.device import autocast, autocast_dtype, resolve_device, retry_on_oom
from vitpos.runtime.dist import barrier, block_range, broadcast_object, current
from vitpos.store.manifest import (
    DTYPES,
    MANIFEST,
    RANK_DIR_RE,
    Manifest,
    ShardEntry,
    normalize_json,
    rank_dir_name,
    wipe_store,
)
from vitpos.store.writer import ActivationWriter

# The version of what a capture stores (the hook sites' tensors as `vitpos.hooks` reads them): it is
# part of every store's meta, so an interrupted store of another version is not resumed into and
# run_sae does not train on its own scratch store of another version. Bump it when a site's values change.
CAPTURE_VERSION = 1
STORABLE_SITES = ("embed", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "q_rot", "k_rot")


def tokens_first(t: torch.Tensor) -> torch.Tensor:
    """Per-head (B, h, T, d) -> (B, T, h*d) so every stored site is (B, T, D)."""
    return t.transpose(1, 2).flatten(2) if t.ndim == 4 else t


def store_meta(surface: ModelSurface, data, split: str, limit: int | None, n_images: int) -> dict:
    """What a store records of its source; one description for single-process and sharded capture,
    with the weights digest so a store is never mistaken for one of retrained weights."""
    return {"model": surface.spec, "weights": surface.weights_digest(), "data": data_name(data), "split": split,
            "limit": limit, "n_images": n_images, "capture_version": CAPTURE_VERSION}


def capture_to_store(surface: ModelSurface, data: str, split: str, sites: str, out, *, limit: int | None = None,
                     batch_size: int = 128, dtype: str = "float32", shard_images: int = 256, force: bool = False,
                     progress: bool = True, device: str | torch.device | None = None, amp: str | None = None,
                     distributed: bool | None = None, keep_prefix: bool = False) -> dict:
    """Stream the chosen sites of every image of a split into an activation store (resumable).

    ``device`` (auto|cpu|cuda; None = where the model is) moves the model there for the capture (and
    back after); ``amp`` (none|bf16|fp16) autocasts the forward. On CUDA a batch that runs out of
    memory is retried in halves (and later batches keep the smaller size). Under a torchrun job with
    several ranks (``distributed`` None = detect) the split is cut into one contiguous block per
    rank, each rank writes its own store under ``out/rank-NNNNN/`` and rank 0 merges their
    manifests into ``out/manifest.json`` (docs/distributed.md). Call it on every rank. ``keep_prefix``:
    also store the prefix tokens (CLS, registers) under ``<site>::prefix``.
    """
    if dtype not in DTYPES:
        raise VitposError(f"unknown --dtype {dtype!r}; use float32, float16 or bfloat16")
    site_list = expand_sites(sites, surface.depth)
    for s in site_list:
        if s.name not in STORABLE_SITES:
            raise VitposError(f"site {s} cannot be stored (attention patterns and tables are not token activations)")
    # default: wherever the model already is
    dev = resolve_device(device) if device is not None else surface.device
    autocast_dtype(amp, dev)
    sharded = distributed or (distributed is None and current().enabled)
    dataset = dataset_for(surface, data, split, limit=limit)
    n = len(dataset)
    meta = store_meta(surface, data, split, limit, n)  # the same for a single-process and a sharded capture
    info = {"num_images": n, "sites": [str(s) for s in site_list], "out": str(out)}

    def block(start: int, end: int, folder, block_meta: dict, show: bool) -> None:
        capture_block(surface, dataset, start, end, site_list, folder, meta=block_meta, batch_size=batch_size,
                      dtype=DTYPES[dtype], shard_images=shard_images, force=force, progress=show, device=dev, amp=amp,
                      keep_prefix=keep_prefix)

    if not sharded:
        block(0, n, out, meta, progress)
        return info

    env = current()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise VitposError(f"{out} is a file, not a folder; pass a folder path as --out")
    verdict = broadcast_object(_precheck(out, meta, env.world_size, force) if env.is_main else None)
    if verdict not in ("go", "done"):
        raise VitposError(verdict)
    if verdict == "go":
        start, end = block_range(n, env.rank, env.world_size)
        rank_meta = {**meta, "rank": env.rank, "world_size": env.world_size, "first_image": start, "end_image": end}
        block(start, end, out / rank_dir_name(env.rank), rank_meta, progress and env.is_main)
        barrier()
        if env.is_main:
            merge_manifests(out, env.world_size, meta)
        barrier()
    return {**info, "ranks": env.world_size}


def capture_block(surface: ModelSurface, dataset, start: int, end: int, sites: list[Site], out, *, meta: dict,
                  batch_size: int = 128, dtype: torch.dtype = torch.float32, shard_images: int = 256,
                  force: bool = False, progress: bool = True, device: torch.device | None = None,
                  amp: str | None = None, keep_prefix: bool = False) -> None:
    """Images ``[start, end)`` of ``dataset`` into the store ``out``, stored with their global ids
    ``start ..``; an interrupted store there of the same block and ``meta`` is resumed.

    The model is moved to ``device`` (None: it stays where it is) for the capture and back after."""
    home = surface.device
    dev = home if device is None else device
    part = dataset if (start, end) == (0, len(dataset)) else _index_range(dataset, start, end)
    keys = [str(s) for s in sites]
    chunk = [batch_size]  # forward size; halves on CUDA OOM
    if dev != home:
        surface.to(dev)  # moved back below: callers keep the surface where it was
    try:
        with ActivationWriter(out, sites=keys, grid=surface.grid, num_prefix_tokens=surface.num_prefix_tokens,
                              meta=meta, shard_images=shard_images, dtype=dtype, force=force,
                              keep_prefix=keep_prefix and surface.num_prefix_tokens > 0) as writer:
            done = writer.num_done
            total = (len(part) + batch_size - 1) // batch_size
            with progress_bar(enabled=progress) as bar, capture(surface, sites) as cache, _stop_after(surface, sites):
                task = bar.add_task(f"capture {surface.spec}", total=total)
                seen = 0
                for x, y in part.batches(batch_size):
                    ids = torch.arange(seen, seen + len(y))
                    seen += len(y)
                    keep = ids >= done  # resume: skip images already in the store
                    if keep.any():
                        _forward_adaptive(surface, x[keep].to(dev, non_blocking=True), cache, keys, chunk, dev, amp)
                        batch = {k: tokens_first(cache.pop_batch(k)) for k in keys}
                        writer.add(batch, y[keep], ids[keep] + start)
                    bar.update(task, advance=1)
    finally:
        if dev != home:
            surface.to(home)


class _StopForward(Exception):
    """Raised after the last block a capture reads: the blocks after it cannot change what was stored."""


class _stop_after:  # noqa: N801 - a context manager used like a function
    """While active, a forward stops after the last block that `sites` read (every site at a layer
    below depth - 1; otherwise, and for sites outside the blocks, the forward runs whole). The stored
    activations are the same; a capture at layer l of L blocks costs ~(l + 1) / L of a forward."""

    def __init__(self, surface: ModelSurface, sites: list[Site]):
        layers = [s.layer for s in sites]
        last = max((x for x in layers if x is not None), default=None)
        self.block = (surface.block(last) if last is not None and None not in layers and last < surface.depth - 1
                      else None)
        self.handle = None

    def __enter__(self):
        if self.block is not None:
            def stop(module, args, out):
                raise _StopForward
            self.handle = self.block.register_forward_hook(stop)
        return self

    def __exit__(self, *exc):
        if self.handle is not None:
            self.handle.remove()
        return False


def _forward_adaptive(surface: ModelSurface, x: torch.Tensor, cache, keys: list[str], chunk: list[int],
                      dev: torch.device, amp: str | None) -> None:
    """Forward ``x`` in pieces of ``chunk[0]`` images under autocast; on out-of-memory drop what was
    captured for this batch, halve the piece size (kept for later batches) and redo the batch."""

    def step(bs: int) -> None:
        try:
            with autocast(dev, amp):
                for i in range(0, x.shape[0], bs):
                    try:
                        surface(x[i : i + bs])
                    except _StopForward:
                        pass
        except BaseException:
            for k in keys:  # a partial batch must not reach the store
                try:
                    cache.pop_batch(k)
                except KeyError:
                    pass
            raise

    _, chunk[0] = retry_on_oom(step, chunk[0])


def _index_range(dataset, start: int, end: int):
    """Images [start, end) of a vitpos dataset as a dataset of the same kind."""
    from vitpos.data.base import TensorImageDataset

    if isinstance(dataset, TensorImageDataset):
        return TensorImageDataset(dataset.images[start:end], dataset.labels[start:end], dataset.info, dataset.split,
                                  dataset.transform)  # the model's preprocessing travels with the block
    from vitpos.data.imagefolder import LazyImageDataset

    if isinstance(dataset, LazyImageDataset):
        return LazyImageDataset(dataset.keys[start:end], dataset.labels[start:end], dataset.load, dataset.transform,
                                dataset.info, dataset.split, False)
    raise VitposError(f"distributed capture cannot split a {type(dataset).__name__}; use a built-in or imagefolder "
                      "dataset")


# ------------------------------------------------------------------------ sharded bookkeeping


def _wipe_top(out: Path, world: int) -> None:
    """--force: remove the merged manifest, single-process store files at the top level, and the
    stores of ranks this job does not have (each remaining rank's writer wipes its own folder)."""
    if not out.is_dir():
        return
    wipe_store(out)
    for p in out.iterdir():
        m = RANK_DIR_RE.match(p.name)
        if p.is_dir() and m and int(m.group(1)) >= world:
            wipe_store(p)
            if not any(p.iterdir()):
                p.rmdir()


SPOT_CHECK_TOLERANCE = 0.05  # relative L2 error of a recomputed image's tokens; storage dtypes and autocast stay far
# below it (fp16/bf16 round-off is <= 2^-8), activations of another model or another image are near 1 or above


def spot_check_store(store, surface: ModelSurface, site: Site, data, fix: str, batch_size: int = 32) -> None:
    """The first image of every shard recomputed with `surface` and compared with what the shard
    holds (its label too): a shard copied in from another model's or another data set's store,
    which its header may not say (stores written before shard headers carried the capture's
    identity), is one VitposError naming it instead of an SAE trained on foreign activations.
    Costs one image forward per shard. `data`: the store's data (its name, or the dataset object it
    was captured from)."""
    meta = store.meta
    dataset = dataset_for(surface, data, meta.get("split", "train"), limit=meta.get("limit"))
    key = str(site)
    picks = []
    for i, sh in enumerate(store.manifest.shards):
        acts, label, image_id = store.first_image(i, key)
        path = store.dir / sh.file
        if not 0 <= image_id < len(dataset):
            raise VitposError(f"shard {path} holds image id {image_id}, but {meta['data']}/{meta.get('split')} has "
                              f"{len(dataset)} images; it does not belong to this store; {fix}")
        picks.append((path, acts, label, image_id))
    P = surface.num_prefix_tokens
    for start in range(0, len(picks), batch_size):
        chunk = picks[start : start + batch_size]
        x = torch.stack([dataset[image_id][0] for _, _, _, image_id in chunk]).to(surface.device)
        with torch.no_grad(), capture(surface, [site]) as cache:
            surface(x)
            got = tokens_first(cache.pop_batch(key)).float().cpu()[:, P:]
        for (path, stored, label, image_id), now in zip(chunk, got, strict=True):
            truth = dataset[image_id][1]
            err = float((now - stored).norm() / now.norm().clamp_min(1e-12)) if now.shape == stored.shape else 1.0
            if label != truth or not err <= SPOT_CHECK_TOLERANCE:
                labels = "" if label == truth else f", label {label} != {truth}"
                raise VitposError(f"shard {path} does not hold {surface.spec}'s {site} activations of image {image_id} "
                                  f"of {meta['data']}/{meta.get('split')} (relative difference {err:.3g}{labels}), so "
                                  f"it does not belong to this store (copied in from another one?); {fix}")


def _precheck(out: Path, meta: dict, world: int, force: bool) -> str:
    """Rank 0's look at out/: 'done' (a finished store of this very capture), 'go', or an error text."""
    if force:
        _wipe_top(out, world)
        return "go"
    path = out / MANIFEST
    if not path.is_file():
        return "go"
    try:
        m = Manifest.from_json(read_json(path), path)
    except VitposError as e:  # told to every rank, which all stop with it
        return str(e)
    if m.ranks is None:
        return (f"{out} holds a single-process activation store; pass a new --out, or --force to replace it "
                "with a distributed capture")
    if m.ranks != world:
        return (f"{out} was captured with {m.ranks} ranks, this job has {world}; rerun with "
                f"--nproc-per-node/--nnodes giving {m.ranks} ranks to resume, or pass --force")
    if m.meta != normalize_json(meta, "meta"):
        return f"{out} holds a different capture ({m.meta}); pass a new --out or --force"
    return "done" if m.complete else "go"


def merge_manifests(out: str | Path, world: int, meta: dict[str, Any]) -> dict[str, Any]:
    """Write ``out/manifest.json`` from the complete per-rank stores ``out/rank-*/``; returns it as JSON."""
    out = Path(out)
    parts = []
    for r in range(world):
        p = out / rank_dir_name(r) / MANIFEST
        m = Manifest.from_json(read_json(p), p)
        if not m.complete:
            raise VitposError(f"rank {r}'s store {p.parent} is incomplete; rerun the same torchrun command to resume")
        parts.append(m)
    d = next((m.d for m in parts if m.d), {})
    shards, total = [], 0
    for r, m in enumerate(parts):
        if m.num_images and m.d != d:
            raise VitposError(f"rank {r}'s store has site widths {m.d}, rank 0's {d}; rerun with --force")
        for sh in m.shards:
            shards.append(ShardEntry(f"{rank_dir_name(r)}/{sh.file}", sh.num_images, total))
            total += sh.num_images
    merged = replace(parts[0], d=dict(d), shards=shards, num_images=total, meta=normalize_json(meta, "meta"),
                     ranks=world, complete=True)
    doc = merged.to_json()
    write_json(out / MANIFEST, doc)
    return doc


__all__ = ["STORABLE_SITES", "capture_block", "capture_to_store", "merge_manifests", "spot_check_store", "store_meta",
           "tokens_first"]
