"""Capture under torchrun: one contiguous block of the split per rank, one manifest at the end.

Layout of ``out/`` after a W-rank capture::

    manifest.json                  merged: lists every rank's shards in global image order
    rank-00000/manifest.json       rank 0's own store (images 0 .. n0-1), resumable on its own
    rank-00000/shard-00000.safetensors ...
    rank-00001/...                 images n0 .. n0+n1-1

Rank r stores images ``block_range(n, r, W)`` of the split with their global image ids. The merged
manifest is an ordinary version-1 manifest whose shard entries carry a ``rank-NNNNN/`` prefix and
global ``first_image``; ``ActivationStore(out)`` reads it exactly like a single-process store of
the same images (same ids, labels and activations, in the same order; shard boundaries differ).
A killed job is resumed by rerunning it with the same number of ranks: each rank resumes its own
store. A different number of ranks over an existing store is refused (``--force`` starts over).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from vitpos.runtime import dist as vdist
from vitpos.errors import VitposError
from vitpos.io import read_json, write_json
from vitpos.models.surface import ModelSurface

MANIFEST = "manifest.json"


def rank_dir_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def _index_range(dataset, start: int, end: int):
    """Images [start, end) of a vitpos dataset as a dataset of the same kind."""
    from vitpos.data.base import TensorImageDataset

    if isinstance(dataset, TensorImageDataset):
        return TensorImageDataset(dataset.images[start:end], dataset.labels[start:end], dataset.info, dataset.split)
    from vitpos.data.imagefolder import LazyImageDataset

    if isinstance(dataset, LazyImageDataset):
        return LazyImageDataset(dataset.keys[start:end], dataset.labels[start:end], dataset.load, dataset.transform,
                                dataset.info, dataset.split, False)
    raise VitposError(f"distributed capture cannot split a {type(dataset).__name__}; use a built-in or imagefolder dataset")


def _wipe_store_files(folder: Path) -> None:
    from vitpos.store import _SHARD_RE, _is_our_temp

    for p in folder.iterdir():
        if p.is_file() and (p.name == MANIFEST or _SHARD_RE.match(p.name) or _is_our_temp(p.name)):
            p.unlink()


def _wipe_top(out: Path, world: int) -> None:
    """--force: remove the merged manifest, single-process store files at the top level, and the
    stores of ranks this job does not have (each remaining rank's writer wipes its own folder)."""
    if not out.is_dir():
        return
    _wipe_store_files(out)
    for p in out.iterdir():
        if p.is_dir() and re.fullmatch(r"rank-(\d{5,})", p.name) and int(p.name[5:]) >= world:
            _wipe_store_files(p)
            if not any(p.iterdir()):
                p.rmdir()


def _precheck(out: Path, meta: dict, world: int, force: bool) -> str:
    """Rank 0's look at out/: 'done' (a finished store of this very capture), 'go', or an error text."""
    if force:
        _wipe_top(out, world)
        return "go"
    path = out / MANIFEST
    if not path.is_file():
        return "go"
    m = read_json(path)
    if not isinstance(m, dict) or "ranks" not in m:
        return (f"{out} holds a single-process activation store; pass a new --out, or --force to replace it "
                "with a distributed capture")
    if m["ranks"] != world:
        return (f"{out} was captured with {m['ranks']} ranks, this job has {world}; rerun with "
                f"--nproc-per-node/--nnodes giving {m['ranks']} ranks to resume, or pass --force")
    import json

    if json.loads(json.dumps(m.get("meta"), sort_keys=True)) != json.loads(json.dumps(meta, sort_keys=True)):
        return f"{out} holds a different capture ({m.get('meta')}); pass a new --out or --force"
    return "done" if m.get("complete") else "go"


def merge_manifests(out: str | Path, world: int, meta: dict[str, Any]) -> dict[str, Any]:
    """Write ``out/manifest.json`` from the complete per-rank stores ``out/rank-*/``."""
    out = Path(out)
    parts = []
    for r in range(world):
        p = out / rank_dir_name(r) / MANIFEST
        m = read_json(p)
        if not m.get("complete"):
            raise VitposError(f"rank {r}'s store {p.parent} is incomplete; rerun the same torchrun command to resume")
        parts.append(m)
    merged = {k: v for k, v in parts[0].items() if k not in ("shards", "num_images", "d", "meta", "complete")}
    merged["d"] = next((m["d"] for m in parts if m["d"]), {})
    shards, total = [], 0
    for r, m in enumerate(parts):
        if m["num_images"] and m["d"] != merged["d"]:
            raise VitposError(f"rank {r}'s store has site widths {m['d']}, rank 0's {merged['d']}; rerun with --force")
        for sh in m["shards"]:
            shards.append({"file": f"{rank_dir_name(r)}/{sh['file']}", "num_images": sh["num_images"], "first_image": total})
            total += sh["num_images"]
    merged.update(shards=shards, num_images=total, meta=meta, ranks=world, complete=True)
    write_json(out / MANIFEST, merged)
    return merged


def capture_sharded(surface: ModelSurface, data, split: str, sites: str, out, *, limit: int | None = None,
                    batch_size: int = 128, dtype: str = "float32", shard_images: int = 256, force: bool = False,
                    progress: bool = True, device=None, amp: str | None = None) -> dict:
    """``capture_to_store`` on this rank's block, then a merged manifest (call on every rank)."""
    from vitpos.capture import capture_to_store, dataset_for, store_meta

    env = vdist.current()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise VitposError(f"{out} is a file, not a folder; pass a folder path as --out")
    dataset = dataset_for(surface, data, split, limit=limit)
    n = len(dataset)
    # The same description a single-process capture of these images writes.
    meta = store_meta(surface, data, split, limit, n)
    verdict = vdist.broadcast_object(_precheck(out, meta, env.world_size, force) if env.is_main else None)
    if verdict not in ("go", "done"):
        raise VitposError(verdict)
    if verdict == "go":
        start, end = vdist.block_range(n, env.rank, env.world_size)
        rank_meta = {**meta, "rank": env.rank, "world_size": env.world_size, "first_image": start, "end_image": end}
        capture_to_store(surface, _index_range(dataset, start, end), split, sites, out / rank_dir_name(env.rank),
                         batch_size=batch_size, dtype=dtype, shard_images=shard_images, force=force,
                         progress=progress and env.is_main, device=device, amp=amp, distributed=False,
                         _first_id=start, _meta=rank_meta)
        vdist.barrier()
        if env.is_main:
            merge_manifests(out, env.world_size, meta)
        vdist.barrier()
    from vitpos.capture import expand_sites

    return {"num_images": n, "sites": [str(s) for s in expand_sites(sites, surface.depth)], "out": str(out),
            "ranks": env.world_size}
