"""Atomic artifact writes: a temp file in the same folder, then os.replace (never half-written)."""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from pydantic import BaseModel, ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from vitpos.errors import OutputBusyError, VitposError


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
        fault_point(f"write:{path.name}", path)
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


REWRITE = "delete it and rerun the step that writes it"


def read_json(path: str | Path, fix: str = REWRITE) -> Any:
    """The JSON document in `path`; a missing, unreadable, non-UTF-8 or unparsable file
    is one VitposError naming the file and `fix`."""
    path = Path(path)
    if not path.is_file():
        raise VitposError(f"{path} does not exist")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise VitposError(f"{path} is not UTF-8 text (byte {e.start}); {fix}") from None
    except OSError as e:
        raise VitposError(f"{path} cannot be read ({e.strerror or e}); {fix}") from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise VitposError(f"{path} is not valid JSON ({_first_line(e)}); {fix}") from None


def read_json_object(path: str | Path, fix: str = REWRITE) -> dict[str, Any]:
    """read_json for files that must hold a JSON object (a mapping of keys)."""
    doc = read_json(path, fix)
    if not isinstance(doc, dict):
        raise VitposError(f"{path} holds a JSON {_json_kind(doc)}, not an object of keys; {fix}")
    return doc


M = TypeVar("M", bound=BaseModel)


def validate_doc(model: type[M], doc: Any, where: str | Path, fix: str = REWRITE) -> M:
    """`model.model_validate(doc)` with a wrong shape (a list, a missing key, a wrong type) as one
    VitposError naming `where`, the first bad key and `fix`."""
    if not isinstance(doc, dict):
        raise VitposError(f"{where} holds a JSON {_json_kind(doc)}, not an object of keys; {fix}")
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise VitposError(f"{where}: key {loc!r}: {err['msg']}; {fix}") from None


def load_typed(model: type[M], path: str | Path, fix: str = REWRITE) -> M:
    """The typed loader every vitpos JSON file goes through: decode, parse and schema problems are
    one VitposError naming the file and the fix."""
    return validate_doc(model, read_json(path, fix), path, fix)


def _json_kind(doc: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(doc), type(doc).__name__)


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def check_finite(tensors: dict[str, torch.Tensor], where: str | Path, fix: str) -> None:
    """One VitposError when a floating tensor holds NaN or infinity (a diverged or damaged file)."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise VitposError(f"{where}: tensor {name!r} holds NaN or infinite values; {fix}")


def finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor],
                      metadata: dict[str, str] | None = None) -> None:
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def read_safetensors(path: str | Path, fix: str = "re-create it") -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise VitposError(f"{path} does not exist")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise VitposError(f"{path} is not a readable safetensors file ({_first_line(e)}); {fix}") from e


def read_safetensors_metadata(path: str | Path, fix: str = "re-create it") -> dict[str, str]:
    """The header metadata of a .safetensors file ({} when it has none)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise VitposError(f"{path} is not a readable safetensors file ({_first_line(e)}); {fix}") from e


_FAULT_HITS: dict[str, int] = {}
_FAULT_SPEC: list[str] = [""]


def fault_point(name: str, path: str | Path | None = None) -> None:
    """Test hook: die right here, like `kill -9`, when the environment variable VITPOS_FAULT names this point.

    VITPOS_FAULT=NAME ends the process with os._exit(137) (no cleanup, no atexit handlers, no
    buffer flushes: what SIGKILL would leave) the first time it reaches fault_point(NAME);
    VITPOS_FAULT=NAME@N the N-th time. Without VITPOS_FAULT (always, outside tests) it does
    nothing. tests/integration/test_train_atomic.py uses it to kill `vitpos train` between the writes of a
    checkpoint and check that the rerun still ends with the uninterrupted run's model.

    VITPOS_FAULT=enospc:NAME[@N] simulates a full disk instead: the point raises
    OSError(ENOSPC) (what a write on a full disk raises), so the error path runs. Every atomic
    write passes the point `write:FILENAME` just before its rename, e.g.
    VITPOS_FAULT=enospc:write:manifest.json. The hit count restarts when VITPOS_FAULT changes.
    """
    spec = os.environ.get("VITPOS_FAULT")
    if not spec:
        return
    if spec != _FAULT_SPEC[0]:
        _FAULT_SPEC[0] = spec
        _FAULT_HITS.clear()
    enospc = spec.startswith("enospc:")
    target, _, nth = spec.removeprefix("enospc:").partition("@")
    if target != name:
        return
    _FAULT_HITS[name] = _FAULT_HITS.get(name, 0) + 1
    if _FAULT_HITS[name] == int(nth or 1):
        if enospc:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path or name))
        os._exit(137)


def require_out_dir(out: Path) -> None:
    """--out must be a folder or not exist yet."""
    if out.exists() and not out.is_dir():
        raise VitposError(f"--out {out} is a file; pass a directory path")


def artifact_path(root: str | Path | None, recorded: str | Path) -> Path:
    """A path recorded in results: relative to the output folder `root` (what vitpos writes, so a
    copied or moved output folder reads its own artifacts), or absolute (older results: read as is)."""
    p = Path(recorded)
    return p if p.is_absolute() or root is None else Path(root) / p


def relative_artifact(root: str | Path | None, path: str | Path) -> str:
    """`path` as results record it: relative to `root` when it lies inside it."""
    if root is None:
        return str(path)
    try:
        return Path(path).relative_to(Path(root)).as_posix()
    except ValueError:
        return str(path)


class OutputGuard:
    """What a command's --out folder held before it ran, so that a failed command can leave it as it
    found it: `restore()` removes every file and folder the command created there (the folder too,
    when it did not exist), except its resume points `keep` (top-level names: `vitpos run`'s finished
    stages, hours of work that a rerun resumes from, as after an interrupt). Files it replaced stay
    replaced: every write is atomic, so they are the complete new version. A folder that is a file, or
    no folder, is left alone; an --out that is a symlink to a folder is cleaned in that folder."""

    def __init__(self, out: str | Path | None, keep: tuple[str, ...] = ()):
        self.out = Path(out) if out is not None else None
        self.keep = keep
        self.existed = self.out is not None and self.out.exists()
        self.before: set[str] | None = None
        if self.out is not None and self.out.is_dir():
            self.before = {str(p.relative_to(self.out)) for p in self.out.rglob("*")}

    def restore(self) -> list[Path]:
        """Remove what the command created; returns the resume points kept (created or grown by it)."""
        import shutil

        out = self.out
        if out is not None and out.is_symlink():
            if not self.existed:  # a link that appeared meanwhile: not the command's to clean
                return []
            out = out.resolve()  # --out names a link to a folder: clean the folder it points at
        if out is None or not out.is_dir():
            return []
        before = self.before or set()
        kept = [out / name for name in self.keep if (out / name).exists()
                and any(str(p.relative_to(out)) not in before for p in (out / name).rglob("*"))]
        if not self.existed and not kept:
            shutil.rmtree(out, ignore_errors=True)
            return []
        if self.existed and self.before is None:
            return []
        for p in sorted(out.rglob("*"), key=lambda q: len(q.parts), reverse=True):
            rel = p.relative_to(out)
            if str(rel) in before or rel.parts[0] in self.keep:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        return kept


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
            raise OutputBusyError(f"another `{what}` is writing to {folder} ({holder}); wait for it to finish or pass "
                              "another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        try:
            yield path
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
