"""Devices, mixed precision, memory-adaptive batches and torch.distributed plumbing.

Everything here is small and built on torch's own engines: ``torch.autocast`` for mixed precision,
``torch.distributed`` (launched by ``torchrun``, which sets RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT) for data parallelism, ``DistributedDataParallel`` for gradient
all-reduce (see ``vitpos.sae.ddp``). No process spawning or cluster logic of our own.

The pure helpers (``resolve_device``, ``autocast_dtype``, ``retry_on_oom``, ``dist_env``) take
their inputs explicitly so the CUDA branches are testable on a CPU-only machine.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, TypeVar

import torch
import torch.distributed as dist

from vitpos.errors import VitposError

T = TypeVar("T")

DEVICE_CHOICES = ("auto", "cpu", "cuda")
AMP_CHOICES = ("none", "bf16", "fp16")
_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ------------------------------------------------------------------------------------ devices


def resolve_device(requested: str | torch.device | None = "auto", *, cuda_available: bool | None = None,
                   local_rank: int | None = None) -> torch.device:
    """``auto | cpu | cuda | cuda:N`` -> a torch.device.

    ``auto`` (or None) is CUDA when available, else CPU. Under torchrun (``local_rank`` given, or
    LOCAL_RANK in the environment) a bare ``cuda`` becomes ``cuda:LOCAL_RANK`` so each process of a
    node uses its own GPU. Asking for CUDA without one is an error, not a silent CPU run.
    """
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if local_rank is None:
        local_rank = int(os.environ["LOCAL_RANK"]) if os.environ.get("LOCAL_RANK", "").isdigit() else None
    if isinstance(requested, torch.device):
        requested = str(requested)
    req = (requested or "auto").strip().lower()
    if req == "auto":
        req = "cuda" if cuda_available else "cpu"
    if req == "cpu":
        return torch.device("cpu")
    if req == "cuda" or req.startswith("cuda:"):
        if not cuda_available:
            raise VitposError(f"--device {requested} asked for a GPU but torch sees no CUDA device here; "
                              "use --device cpu (or auto)")
        if req == "cuda":
            return torch.device("cuda", local_rank or 0)
        return torch.device(req)
    raise VitposError(f"unknown --device {requested!r}; use one of {', '.join(DEVICE_CHOICES)} (or cuda:N)")


def autocast_dtype(amp: str | None, device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype for ``--amp none|bf16|fp16`` on ``device`` (None = full float32).

    fp16 autocast is a CUDA feature here (fp16 matmuls on CPU are slow and need loss scaling for
    training): on CPU it is refused with a message pointing at bf16."""
    amp = (amp or "none").strip().lower()
    if amp not in AMP_CHOICES:
        raise VitposError(f"unknown --amp {amp!r}; use one of {', '.join(AMP_CHOICES)}")
    if amp == "none":
        return None
    dev = torch.device(device)
    if amp == "fp16" and dev.type != "cuda":
        raise VitposError("--amp fp16 needs a CUDA device; on CPU use --amp bf16 (or none)")
    return _AMP_DTYPES[amp]


def autocast(device: torch.device | str, amp: str | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``amp`` on ``device``, or a no-op context for ``none``."""
    dtype = autocast_dtype(amp, device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def full_precision(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator: run ``fn`` with autocast off (CPU and CUDA), e.g. an optimiser that needs float32
    curvature while the model forward around it runs under ``--amp``."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with contextlib.ExitStack() as stack:
            for dt in ("cpu", "cuda"):
                if torch.is_autocast_enabled(dt):
                    stack.enter_context(torch.autocast(dt, enabled=False))
            return fn(*args, **kwargs)
    return wrapper


# ----------------------------------------------------------------------------- adaptive batch


def is_oom(exc: BaseException) -> bool:
    """True for a CUDA out-of-memory error (``torch.cuda.OutOfMemoryError`` or its message)."""
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def retry_on_oom(step: Callable[[int], T], batch_size: int, *, min_batch: int = 1,
                 on_shrink: Callable[[int, int], None] | None = None,
                 is_oom: Callable[[BaseException], bool] = is_oom) -> tuple[T, int]:
    """Run ``step(batch_size)``; on an out-of-memory error halve the batch and retry.

    Returns ``(result, batch_size that worked)`` so a caller keeps using the smaller size. Below
    ``min_batch`` the OOM is re-raised as a VitposError. ``on_shrink(old, new)`` is told of each
    halving (e.g. to print a note). The CUDA cache is emptied between tries."""
    if batch_size < 1 or min_batch < 1:
        raise VitposError(f"batch sizes must be >= 1 (got {batch_size}, min {min_batch})")
    bs = int(batch_size)
    while True:
        try:
            return step(bs), bs
        except BaseException as e:  # noqa: BLE001 - filtered by is_oom, everything else re-raised
            if not is_oom(e):
                raise
            new = bs // 2
            if new < min_batch:
                raise VitposError(f"out of memory even at batch size {bs}; use a smaller model, --amp bf16, "
                                  "or a device with more memory") from e
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if on_shrink is not None:
                on_shrink(bs, new)
            bs = new


# ------------------------------------------------------------------------------ distributed


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


# --------------------------------------------------------------------------- runtime settings


@dataclass(frozen=True)
class Runtime:
    """Defaults that library calls deep inside a command read when their own argument is None
    (so a CLI flag like --device reaches ``train_sae`` through experiment code unchanged)."""

    device: str | None = None
    amp: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    checkpoint_key: dict | None = None  # extra run identity a resumed checkpoint must match (e.g. CLI settings)
    restart_on_mismatch: bool = False  # a checkpoint of other settings: start over instead of an error


_RUNTIME: contextvars.ContextVar[Runtime] = contextvars.ContextVar("vitpos_runtime", default=Runtime())


def runtime() -> Runtime:
    return _RUNTIME.get()


@contextlib.contextmanager
def use_runtime(**settings: Any) -> Iterator[Runtime]:
    """Set runtime defaults (device, amp, checkpoint_dir, checkpoint_every) for the block."""
    rt = replace(_RUNTIME.get(), **settings)
    token = _RUNTIME.set(rt)
    try:
        yield rt
    finally:
        _RUNTIME.reset(token)


__all__ = [
    "AMP_CHOICES", "DEVICE_CHOICES", "DistEnv", "Runtime", "all_gather_object", "autocast", "autocast_dtype",
    "backend_for", "barrier", "block_range", "broadcast_object", "current", "dist_env", "distributed", "full_precision", "is_main",
    "is_oom", "resolve_device", "retry_on_oom", "runtime", "use_runtime",
]
