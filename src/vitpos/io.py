"""Atomic artifact writes: a temp file in the same folder, then os.replace (never half-written)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from vitpos.errors import VitposError


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it is renamed onto `path`, on error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; artifacts are ordinary files
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise VitposError(f"{path} does not exist")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise VitposError(f"{path} is not valid JSON ({e}); delete it and rerun the step that writes it") from e


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor],
                      metadata: dict[str, str] | None = None) -> None:
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise VitposError(f"{path} does not exist")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise VitposError(f"{path} is not a readable safetensors file ({e}); re-create it") from e


_FAULT_HITS: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Test hook: die right here, like `kill -9`, when the environment variable VITPOS_FAULT names this point.

    VITPOS_FAULT=NAME ends the process with os._exit(137) (no cleanup, no atexit handlers, no
    buffer flushes: what SIGKILL would leave) the first time it reaches fault_point(NAME);
    VITPOS_FAULT=NAME@N the N-th time. Without VITPOS_FAULT (always, outside tests) it does
    nothing. tests/integration/test_train_atomic.py uses it to kill `vitpos train` between the writes of a
    checkpoint and check that the rerun still ends with the uninterrupted run's model.
    """
    spec = os.environ.get("VITPOS_FAULT")
    if not spec:
        return
    target, _, nth = spec.partition("@")
    if target != name:
        return
    _FAULT_HITS[name] = _FAULT_HITS.get(name, 0) + 1
    if _FAULT_HITS[name] == int(nth or 1):
        os._exit(137)


@contextmanager
def exclusive_lock(folder: str | Path, what: str = "vitpos run") -> Iterator[Path]:
    """Hold an exclusive lock on FOLDER/.vitpos.lock while writing there; a second writer is refused.

    An OS lock (flock), not a marker file: it goes away with the process, so a killed run never
    leaves a stale lock behind."""
    import fcntl

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".vitpos.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise VitposError(f"another `{what}` is writing to {folder} ({holder}); wait for it to finish or pass "
                              "another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        try:
            yield path
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
