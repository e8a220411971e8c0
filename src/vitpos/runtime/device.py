"""Devices, mixed precision and memory-adaptive batches.

Everything here is small and built on torch's own engines: ``torch.autocast`` for mixed precision,
the CUDA out-of-memory error for batches that adapt to memory. Process groups live in
``vitpos.runtime.dist``; the settings a command passes down live in ``vitpos.runtime.options``.

The pure helpers (``resolve_device``, ``autocast_dtype``, ``retry_on_oom``) take their inputs
explicitly so the CUDA branches are testable on a CPU-only machine.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

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


__all__ = [
    "AMP_CHOICES", "DEVICE_CHOICES", "autocast", "autocast_dtype", "full_precision", "is_oom", "resolve_device",
    "retry_on_oom",
]


def release_freed_memory() -> None:
    """Hand the C heap's freed pages back to the OS (glibc's malloc_trim; a no-op elsewhere).

    Why: a loop that runs many forwards per batch (ape_permute's variants, rope_heads' ablations)
    frees and reallocates activation-sized blocks whose sizes vary; glibc keeps the freed blocks in
    its heap and the resident set grows with every forward (measured on builtin:pairs-ape's
    permutation: +7 MB per forward, 0.75 -> 2.6 GB over 2000 images; trimmed once per batch: 1.17 GB
    at the same speed; trimmed after every forward it costs ~15 % of the time). Call it once per batch."""
    global _LIBC
    if _LIBC is None:
        _LIBC = _load_libc()
    if _LIBC is not False:
        _LIBC.malloc_trim(0)


_LIBC: Any = None


def trimmed(batches: Iterable[T]) -> Iterator[T]:
    """`batches` as they come, with `release_freed_memory` after each one is used (the loop body ran)."""
    for batch in batches:
        yield batch
        release_freed_memory()


def _load_libc() -> Any:
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018  (musl and others lack it)
    except (OSError, AttributeError):
        return False
    return libc


def peak_memory_gb() -> float | None:
    """This process's peak resident memory so far, in GB (None where the OS does not say: Windows)."""
    try:
        import resource
    except ImportError:
        return None
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux (bytes on macOS)
    return kb / (1e9 if sys.platform == "darwin" else 1e6)
