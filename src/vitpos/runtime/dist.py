"""torch.distributed plumbing: where this process sits in a torchrun job, and the few collectives vitpos uses.

``torch.distributed`` is launched by ``torchrun``, which sets RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT; ``DistributedDataParallel`` does the gradient all-reduce (see
``vitpos.sae.parallel``). No process spawning or cluster logic of our own. ``dist_env`` takes the
environment explicitly so it is testable without a job.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from vitpos.errors import VitposError
from vitpos.runtime.device import resolve_device


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in a torchrun job (world_size 1 = a plain single process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Rank, world size and local rank from torchrun's environment variables (defaults 0, 1, 0)."""
    env = os.environ if environ is None else environ

    def num(key: str, default: int) -> int:
        v = env.get(key)
        if v is None or v == "":
            return default
        try:
            return int(v)
        except ValueError:
            raise VitposError(f"environment variable {key}={v!r} is not an integer; launch with torchrun") from None

    e = DistEnv(rank=num("RANK", 0), world_size=num("WORLD_SIZE", 1), local_rank=num("LOCAL_RANK", 0))
    if e.world_size < 1 or not 0 <= e.rank < e.world_size:
        raise VitposError(f"RANK={e.rank} WORLD_SIZE={e.world_size} are inconsistent; launch with torchrun")
    return e


def current() -> DistEnv:
    """The initialised process group's rank / world size (0 / 1 when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=dist_env().local_rank)
    return DistEnv()


def is_main() -> bool:
    return current().is_main


def barrier() -> None:
    if current().enabled:
        dist.barrier()


def backend_for(device: torch.device | str) -> str:
    """nccl for CUDA devices, gloo otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


@contextlib.contextmanager
def distributed(device: str | torch.device | None = "auto", *, environ: Mapping[str, str] | None = None,
                timeout_s: float | None = None) -> Iterator[tuple[DistEnv, torch.device]]:
    """Join the torchrun job described by the environment, if any; yield ``(env, device)``.

    Without WORLD_SIZE > 1 this is a no-op (single process). Otherwise it calls
    ``init_process_group`` (nccl on CUDA, gloo on CPU; rendezvous through torchrun's env://) and
    destroys the group on exit. A group that is already initialised is used as is and left alone.
    """
    env = dist_env(environ)
    dev = resolve_device(device, local_rank=env.local_rank if env.enabled else None)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not env.enabled or dist.is_initialized():
        yield (current() if dist.is_initialized() else env), dev
        return
    kwargs: dict[str, Any] = {"backend": backend_for(dev)}
    if timeout_s is not None:
        import datetime

        kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
    if dev.type == "cuda":
        kwargs["device_id"] = dev
    try:
        dist.init_process_group(**kwargs)
    except TypeError:  # older torch without device_id
        kwargs.pop("device_id", None)
        dist.init_process_group(**kwargs)
    try:
        yield env, dev
    finally:
        dist.destroy_process_group()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` of rank ``src`` on every rank (identity when not distributed)."""
    if not current().enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    if not current().enabled:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def block_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous block [start, end) of n items for ``rank``: sizes differ by at most one, lower
    ranks get the larger blocks, and concatenating the blocks in rank order gives 0..n-1."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise VitposError(f"rank {rank} is outside a world of {world_size}")
    base, extra = divmod(int(n), world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


__all__ = [
    "DistEnv", "all_gather_object", "backend_for", "barrier", "block_range", "broadcast_object", "current", "dist_env",
    "distributed", "is_main",
]
