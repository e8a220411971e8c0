"""The machine's available memory, for refusing up front a request that cannot fit (a browse with a
huge --top-k, a model of 64 blocks of width 4096) instead of failing after minutes with an
allocation error that names neither the option nor the number."""

from __future__ import annotations

import os
from pathlib import Path

from vitpos.errors import VitposError


def available_bytes() -> int | None:
    """Memory a new allocation can get now: MemAvailable of /proc/meminfo (Linux), else physical
    pages x page size (other POSIX systems); None where neither says."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def require_memory(needed: int, what: str, fix: str, available: int | None = None) -> None:
    """One VitposError, with both numbers, when `needed` bytes exceed the available memory (unknown
    available memory: nothing is refused)."""
    have = available_bytes() if available is None else available
    if have is not None and needed > have:
        raise VitposError(f"{what} needs about {gib(needed)} of memory, more than the {gib(have)} available; {fix}")


__all__ = ["available_bytes", "gib", "require_memory"]
