"""Activation store: captured activations streamed to disk in shards, read back in bounded memory.

Layout (see docs/store-format.md): ``manifest.json`` plus ``shard-00000.safetensors`` ... Each shard
holds, for a run of consecutive images, one ``(n, N, D)`` tensor per site (patch tokens only, prefix
tokens optionally under ``<site>::prefix``) and ``labels`` / ``image_ids`` (int64, n).

The writer rewrites the manifest after every shard, so a killed capture leaves a valid,
``complete: false`` store that the same writer resumes; the reader holds one shard at a time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch
from safetensors import safe_open
from torch.utils.data import IterableDataset, get_worker_info

from vitpos import __version__
from vitpos.errors import VitposError
from vitpos.io import read_json, write_json, write_safetensors

FORMAT = "vitpos-activations"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PREFIX_SUFFIX = "::prefix"
RESERVED_KEYS = ("labels", "image_ids")
DEFAULT_MAX_BYTES = 4 * 2**30

_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
# safetensors header spelling of each storage dtype, to check a shard before loading it.
_ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_SHARD_RE = re.compile(r"^shard-(\d{5,})\.safetensors$")
# Manifest entries may also name a rank's shard of a distributed capture (vitpos.capture_dist).
_ENTRY_RE = re.compile(r"^(rank-\d{5,}/)?shard-(\d{5,})\.safetensors$")

# Worst-case round-trip error of the storage dtypes (round-to-nearest): |x' - x| <= rel*|x| + abs.
# fp16 normals: unit roundoff 2^-11; its subnormals (|x| < 2^-14) are spaced 2^-24 -> half-step 2^-25.
# bf16 keeps fp32's exponent range, so only the 8-bit significand matters (2^-8 relative).
ROUNDTRIP_ERROR: dict[str, tuple[float, float]] = {
    "float32": (0.0, 0.0),
    "float16": (2.0**-11, 2.0**-25),
    "bfloat16": (2.0**-8, 2.0**-133),
}


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def patch_rows_cols(grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major patch order: patch n sits at row n // W, column n % W."""
    h, w = grid
    n = torch.arange(h * w, dtype=torch.int64)
    return n // w, n % w


def _jsonable(meta: Any, what: str) -> Any:
    # Normalise through JSON so tuples/lists and int keys compare equal to what was stored.
    try:
        return json.loads(json.dumps(meta, sort_keys=True))
    except (TypeError, ValueError) as e:
        raise VitposError(f"{what} must be JSON-serializable ({e}); pass plain str/int/float/list/dict values") from e


def _diff_keys(a: dict, b: dict) -> list[str]:
    keys = sorted(set(a) | set(b))
    return [k for k in keys if a.get(k, "<missing>") != b.get(k, "<missing>")]


# --------------------------------------------------------------------------------------- writer


class ActivationWriter:
    """Stream ``add()``-ed batches into shards of ``shard_images`` images under ``out_dir``.

    Use as a context manager: a clean exit writes the last (partial) shard and marks the store
    complete; an exception leaves the shards written so far plus a ``complete: false`` manifest.
    Opening the writer again on such a directory with the same settings resumes it: skip the first
    ``writer.num_done`` images of the dataset and keep adding. Buffered memory is one shard:
    ``shard_images * N * D * itemsize`` per site.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        sites: Sequence[str],
        grid: tuple[int, int],
        num_prefix_tokens: int,
        meta: dict[str, Any],
        shard_images: int = 256,
        dtype: torch.dtype = torch.float32,
        keep_prefix: bool = False,
        force: bool = False,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.sites = list(sites)
        if not self.sites or len(set(self.sites)) != len(self.sites):
            raise VitposError(f"sites must be a non-empty list of distinct names, got {self.sites}")
        for s in self.sites:
            if not isinstance(s, str) or not s or s in RESERVED_KEYS or s.endswith(PREFIX_SUFFIX):
                raise VitposError(f"site name {s!r} is not allowed (empty, reserved, or ends in {PREFIX_SUFFIX!r}); rename it")
        if len(grid) != 2 or min(int(grid[0]), int(grid[1])) < 1:
            raise VitposError(f"grid must be (rows, cols) of positive ints, got {grid}")
        self.grid = (int(grid[0]), int(grid[1]))
        self.num_patches = self.grid[0] * self.grid[1]
        if int(num_prefix_tokens) < 0:
            raise VitposError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}")
        self.num_prefix_tokens = int(num_prefix_tokens)
        if int(shard_images) < 1:
            raise VitposError(f"shard_images must be >= 1, got {shard_images}")
        self.shard_images = int(shard_images)
        if dtype not in _DTYPE_NAMES:
            raise VitposError(f"dtype {dtype} is not supported for storage; use one of {sorted(_DTYPES)}")
        self.dtype = dtype
        self.keep_prefix = bool(keep_prefix)
        if self.keep_prefix and self.num_prefix_tokens == 0:
            raise VitposError("keep_prefix=True but num_prefix_tokens is 0; there are no prefix tokens to keep")
        self.meta = _jsonable(meta, "meta")
        if not isinstance(self.meta, dict):
            raise VitposError(f"meta must be a dict, got {type(meta).__name__}")

        self._closed = False
        self._buf: dict[str, torch.Tensor] = {}  # key -> preallocated (shard_images, T, D) buffer
        self._buf_labels = torch.empty(self.shard_images, dtype=torch.int64)
        self._buf_ids = torch.empty(self.shard_images, dtype=torch.int64)
        self._fill = 0

        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise VitposError(f"{self.out_dir} is a file, not a folder; pass a folder path as --out")
        manifest_path = self.out_dir / MANIFEST
        if force:
            self._wipe()
        if manifest_path.exists():
            self._manifest = self._resume(manifest_path)
        else:
            if self.out_dir.is_dir() and any(_SHARD_RE.match(p.name) for p in self.out_dir.iterdir()):
                raise VitposError(f"{self.out_dir} holds shard files but no {MANIFEST}; pass a new --out or --force to overwrite")
            self._manifest = self._new_manifest()
            # Claim the directory now so a crash before the first shard still resumes cleanly.
            write_json(manifest_path, self._manifest)
        self.was_complete: bool = bool(self._manifest["complete"])
        self._manifest["complete"] = False  # in memory only; rewritten on the next shard / close
        self.num_stored: int = int(self._manifest["num_images"])

    # -- setup

    def _new_manifest(self) -> dict[str, Any]:
        rows, cols = patch_rows_cols(self.grid)
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "vitpos_version": __version__,
            "sites": self.sites,
            "grid": list(self.grid),
            "num_patches": self.num_patches,
            "num_prefix_tokens": self.num_prefix_tokens,
            "keep_prefix": self.keep_prefix,
            "dtype": _DTYPE_NAMES[self.dtype],
            "d": {},
            "shard_images": self.shard_images,
            "num_images": 0,
            "shards": [],
            "rows": rows.tolist(),
            "cols": cols.tolist(),
            "meta": self.meta,
            "complete": False,
        }

    def _wipe(self) -> None:
        # Remove only files this module writes; anything else in the folder is the user's.
        if not self.out_dir.is_dir():
            return
        for p in self.out_dir.iterdir():
            if p.name == MANIFEST or _SHARD_RE.match(p.name) or _is_our_temp(p.name):
                p.unlink()

    def _resume(self, manifest_path: Path) -> dict[str, Any]:
        fix = "pass a new --out to keep both, or --force to overwrite"
        m = read_json(manifest_path)
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise VitposError(f"{manifest_path} is not a vitpos activation manifest; {fix}")
        if m.get("format_version") != FORMAT_VERSION:
            raise VitposError(f"{manifest_path} has format version {m.get('format_version')}, this vitpos writes {FORMAT_VERSION}; {fix}")
        _check_manifest(m, manifest_path)
        mine = {
            "sites": self.sites,
            "grid": list(self.grid),
            "num_prefix_tokens": self.num_prefix_tokens,
            "keep_prefix": self.keep_prefix,
            "dtype": _DTYPE_NAMES[self.dtype],
        }
        differ = [k for k, v in mine.items() if m.get(k) != v]
        if differ:
            got = ", ".join(f"{k}: stored {m.get(k)!r} != {mine[k]!r}" for k in differ)
            raise VitposError(f"{self.out_dir} was captured with different settings ({got}); {fix}")
        if m["meta"] != self.meta:
            keys = _diff_keys(m["meta"], self.meta)
            got = ", ".join(f"{k}: stored {m['meta'].get(k, '<missing>')!r} != {self.meta.get(k, '<missing>')!r}" for k in keys)
            raise VitposError(f"{self.out_dir} was captured with different meta ({got}); {fix}")
        for sh in m["shards"]:
            _open_checked(self.out_dir / sh["file"], sh, m, self.out_dir, fix=f"the store is damaged; {fix}").__exit__(None, None, None)
        m["shard_images"] = self.shard_images
        # Shards past the manifest's list were written but never recorded (killed in between):
        # they will be rewritten, so drop them now so the folder matches the manifest.
        listed = {sh["file"] for sh in m["shards"]}
        for p in self.out_dir.iterdir():
            if (_SHARD_RE.match(p.name) and p.name not in listed) or _is_our_temp(p.name):
                p.unlink()
        return m

    # -- public

    @property
    def num_done(self) -> int:
        """Images accepted so far (on disk + buffered); on a resumed store, the count to skip."""
        return self.num_stored + self._fill

    @property
    def d(self) -> dict[str, int]:
        return dict(self._manifest["d"])

    def add(self, batch: dict[str, torch.Tensor], labels: torch.Tensor, image_ids: torch.Tensor) -> None:
        """Buffer a batch: ``batch[site]`` is ``(B, num_prefix_tokens + H*W, D)``; labels/image_ids ``(B,)``."""
        if self._closed:
            raise VitposError("this ActivationWriter is closed; open a new one to add more images")
        missing = [s for s in self.sites if s not in batch]
        extra = [s for s in batch if s not in self.sites]
        if missing or extra:
            raise VitposError(f"batch sites do not match the writer's (missing {missing}, unexpected {extra}); pass exactly sites={self.sites}")
        labels = _as_int64(labels, "labels")
        image_ids = _as_int64(image_ids, "image_ids")
        b = labels.shape[0]
        if image_ids.shape[0] != b:
            raise VitposError(f"labels has {b} entries but image_ids has {image_ids.shape[0]}; pass one of each per image")
        t_expected = self.num_prefix_tokens + self.num_patches
        d_known = self._manifest["d"]
        for s in self.sites:
            x = batch[s]
            if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[0] != b or x.shape[1] != t_expected:
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise VitposError(
                    f"site {s!r}: expected shape ({b}, {t_expected}, D) = (batch, {self.num_prefix_tokens} prefix + "
                    f"{self.grid[0]}x{self.grid[1]} patches, D), got {shape}; check grid/num_prefix_tokens"
                )
            if s in d_known and x.shape[2] != d_known[s]:
                raise VitposError(f"site {s!r}: width D={x.shape[2]} but the store has D={d_known[s]}; pass the same model and sites")
            if not x.is_floating_point():
                raise VitposError(f"site {s!r}: activations must be floating point, got {x.dtype}")
        if b == 0:
            return
        for s in self.sites:
            d_known.setdefault(s, int(batch[s].shape[2]))

        start = 0
        while start < b:
            take = min(self.shard_images - self._fill, b - start)
            sl = slice(self._fill, self._fill + take)
            for s in self.sites:
                x = batch[s][start : start + take].detach()
                self._copy_in(s, x[:, self.num_prefix_tokens :], sl)
                if self.keep_prefix:
                    self._copy_in(s + PREFIX_SUFFIX, x[:, : self.num_prefix_tokens], sl)
            self._buf_labels[sl] = labels[start : start + take]
            self._buf_ids[sl] = image_ids[start : start + take]
            self._fill += take
            start += take
            if self._fill == self.shard_images:
                self._flush()

    def close(self) -> None:
        """Write the last partial shard and mark the store complete. Idempotent."""
        if self._closed:
            return
        if self._fill:
            self._flush()
        self._manifest["complete"] = True
        write_json(self.out_dir / MANIFEST, self._manifest)
        self._closed = True
        self._buf.clear()

    def abort(self) -> None:
        """Drop buffered images without writing; the store stays resumable (complete: false)."""
        self._closed = True
        self._buf.clear()
        self._fill = 0

    def __enter__(self) -> "ActivationWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # On error the buffer is dropped, exactly as a killed process would lose it: the
        # on-disk state is then the same in both cases and resume handles both.
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- internals

    def _copy_in(self, key: str, x: torch.Tensor, sl: slice) -> None:
        buf = self._buf.get(key)
        if buf is None:
            buf = torch.empty((self.shard_images, x.shape[1], x.shape[2]), dtype=self.dtype)
            self._buf[key] = buf
        dst = buf[sl]
        dst.copy_(x)  # one copy: device -> cpu and cast, and it detaches us from the caller's memory
        if self.dtype is torch.float16 and torch.isinf(dst).any() and not torch.isinf(x).any():
            self.abort()
            amax = float(x.abs().max())
            raise VitposError(f"site {key!r}: activations reach |x|={amax:.4g}, beyond float16's 65504; store with dtype bfloat16 or float32")

    def _flush(self) -> None:
        n = self._fill
        index = len(self._manifest["shards"])
        tensors = {k: v[:n] for k, v in self._buf.items()}
        tensors["labels"] = self._buf_labels[:n]
        tensors["image_ids"] = self._buf_ids[:n]
        first = self.num_stored
        info = {"file": shard_name(index), "num_images": n, "first_image": first}
        st_meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "shard": str(index), "first_image": str(first), "num_images": str(n)}
        # Shard first, manifest second: the manifest never lists a shard that is not fully on disk.
        write_safetensors(self.out_dir / info["file"], tensors, metadata=st_meta)
        self._manifest["shards"].append(info)
        self._manifest["num_images"] = first + n
        self._manifest["complete"] = False
        write_json(self.out_dir / MANIFEST, self._manifest)
        self.num_stored = first + n
        self._fill = 0


def _is_our_temp(name: str) -> bool:
    # vitpos.io.atomic_path temp names: ".<target>.<random>.tmp"
    return name.endswith(".tmp") and (name.startswith(f".{MANIFEST}.") or name.startswith(".shard-"))


def _as_int64(x: Any, what: str) -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.ndim != 1:
        raise VitposError(f"{what} must be 1-D (one per image), got shape {tuple(x.shape)}")
    if x.is_floating_point() or x.is_complex():
        raise VitposError(f"{what} must be integers, got {x.dtype}; pass class indices / integer ids")
    return x.detach().to("cpu", torch.int64)


# --------------------------------------------------------------------------------------- reader


def _check_manifest(m: dict[str, Any], path: Path) -> None:
    fix = "the manifest is damaged; re-create the store by rerunning the capture with --force"
    need = {
        "sites": list, "grid": list, "num_patches": int, "num_prefix_tokens": int, "keep_prefix": bool,
        "dtype": str, "d": dict, "num_images": int, "shards": list, "rows": list, "cols": list,
        "meta": dict, "complete": bool,
    }
    for k, typ in need.items():
        if not isinstance(m.get(k), typ):
            raise VitposError(f"{path}: field {k!r} missing or not a {typ.__name__}; {fix}")
    if m["dtype"] not in _DTYPES:
        raise VitposError(f"{path}: unknown dtype {m['dtype']!r}; {fix}")
    if len(m["grid"]) != 2 or not all(isinstance(v, int) and v > 0 for v in m["grid"]):
        raise VitposError(f"{path}: grid {m['grid']!r} is not two positive ints; {fix}")
    h, w = m["grid"]
    if h * w != m["num_patches"] or len(m["rows"]) != h * w or len(m["cols"]) != h * w:
        raise VitposError(f"{path}: grid {m['grid']} disagrees with num_patches/rows/cols; {fix}")
    total = 0
    for sh in m["shards"]:
        # File names must be our own pattern: never follow a manifest outside the store folder.
        if not isinstance(sh, dict) or not _ENTRY_RE.match(str(sh.get("file"))) or not isinstance(sh.get("num_images"), int) or sh["num_images"] < 1:
            raise VitposError(f"{path}: bad shard entry {sh!r}; {fix}")
        total += sh["num_images"]
    if total != m["num_images"]:
        raise VitposError(f"{path}: shards hold {total} images but num_images is {m['num_images']}; {fix}")


def _open_checked(path: Path, sh: dict, m: dict, store_dir: Path, *, fix: str, key: str | None = None):
    """Open a shard and check its header against the manifest; return the open handle (caller closes)."""
    if not path.is_file():
        raise VitposError(f"shard {path} listed in {store_dir / MANIFEST} is missing; {fix}")
    try:
        f = safe_open(str(path), framework="pt")
        f.__enter__()
    except Exception as e:  # safetensors raises its own SafetensorError, plus OSError/ValueError
        raise VitposError(f"shard {path} is unreadable ({e}); {fix}") from e
    try:
        n = sh["num_images"]
        keys = set(f.keys())
        if key is not None:
            want = [key]
        else:
            want = list(m["sites"]) + ([s + PREFIX_SUFFIX for s in m["sites"]] if m["keep_prefix"] else [])
        for k in [*want, "labels", "image_ids"]:
            if k not in keys:
                raise VitposError(f"shard {path} has no tensor {k!r}; {fix}")
        for k in ("labels", "image_ids"):
            sl = f.get_slice(k)
            if sl.get_shape() != [n] or sl.get_dtype() != "I64":
                raise VitposError(f"shard {path}: {k} is {sl.get_dtype()}{sl.get_shape()}, expected I64[{n}]; {fix}")
        for k in want:
            site, is_prefix = (k[: -len(PREFIX_SUFFIX)], True) if k.endswith(PREFIX_SUFFIX) else (k, False)
            t = m["num_prefix_tokens"] if is_prefix else m["num_patches"]
            shape = [n, t, m["d"].get(site, -1)]
            sl = f.get_slice(k)
            if sl.get_shape() != shape or sl.get_dtype() != _ST_DTYPES[m["dtype"]]:
                raise VitposError(f"shard {path}: {k!r} is {sl.get_dtype()}{sl.get_shape()}, expected {_ST_DTYPES[m['dtype']]}{shape}; {fix}")
    except VitposError:
        f.__exit__(None, None, None)
        raise
    except Exception as e:
        f.__exit__(None, None, None)
        raise VitposError(f"shard {path} is unreadable ({e}); {fix}") from e
    return f


def _rebatch(chunks: Iterable[tuple[torch.Tensor, ...]], size: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """Re-cut a stream of row-aligned tensor tuples into tuples of exactly `size` rows (last may be short)."""
    pending: list[tuple[torch.Tensor, ...]] = []
    n_pending = 0
    for chunk in chunks:
        n = chunk[0].shape[0]
        i = 0
        if n_pending:
            take = min(size - n_pending, n)
            pending.append(tuple(t[:take] for t in chunk))
            n_pending += take
            i = take
            if n_pending == size:
                yield tuple(torch.cat(parts) for parts in zip(*pending))
                pending, n_pending = [], 0
        while n - i >= size:
            yield tuple(t[i : i + size] for t in chunk)
            i += size
        if i < n:
            # Copy the tail so the shard it came from can be freed before the next one loads.
            pending.append(tuple(t[i:].clone() for t in chunk))
            n_pending += n - i
        del chunk
    if n_pending:
        yield tuple(torch.cat(parts) for parts in zip(*pending))


class ActivationStore:
    """Read a store written by :class:`ActivationWriter`; only one shard is loaded at a time.

    Yielded activations are float32. Batches from ``iter_images`` / unshuffled ``iter_tokens``
    may be views into the current shard: ``.clone()`` them to keep them past the next step
    without pinning that shard in memory.
    """

    def __init__(self, store_dir: str | Path, *, allow_incomplete: bool = False) -> None:
        self.dir = Path(store_dir)
        path = self.dir / MANIFEST
        if not path.is_file():
            what = "does not exist" if not self.dir.exists() else f"has no {MANIFEST}"
            raise VitposError(f"no activation store at {self.dir} (it {what}); run the capture first or fix the path")
        m = read_json(path)
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise VitposError(f"{path} is not a vitpos activation manifest; point at a capture output folder")
        if m.get("format_version") != FORMAT_VERSION:
            raise VitposError(f"{path} has format version {m.get('format_version')}, this vitpos reads {FORMAT_VERSION}; recapture with this version")
        _check_manifest(m, path)
        if not m["complete"] and not allow_incomplete:
            raise VitposError(
                f"activation store at {self.dir} is incomplete ({m['num_images']} images so far): "
                "capture was interrupted; rerun the same capture command to resume"
            )
        for sh in m["shards"]:
            if not (self.dir / sh["file"]).is_file():
                raise VitposError(f"shard {self.dir / sh['file']} listed in {path} is missing; re-create the store by rerunning the capture with --force")
        self._m = m
        self.sites: list[str] = list(m["sites"])
        self.grid: tuple[int, int] = (int(m["grid"][0]), int(m["grid"][1]))
        self.num_patches: int = int(m["num_patches"])
        self.num_prefix_tokens: int = int(m["num_prefix_tokens"])
        self.has_prefix: bool = bool(m["keep_prefix"])
        self.num_images: int = int(m["num_images"])
        self.dtype: str = m["dtype"]
        self.d: dict[str, int] = {k: int(v) for k, v in m["d"].items()}
        self.meta: dict[str, Any] = m["meta"]
        self.complete: bool = bool(m["complete"])
        self.shards: list[dict[str, Any]] = list(m["shards"])
        self.rows = torch.tensor(m["rows"], dtype=torch.int64)
        self.cols = torch.tensor(m["cols"], dtype=torch.int64)
        # Peak bytes of activation tensors this reader held at once during the last iteration
        # (measured from the live tensors, for checking/configuring memory use).
        self.peak_buffer_bytes = 0
        self._live = 0

    def __repr__(self) -> str:
        return f"ActivationStore({str(self.dir)!r}, sites={self.sites}, grid={self.grid}, num_images={self.num_images})"

    def __len__(self) -> int:
        return self.num_images

    # -- shard access

    def _key(self, site: str, prefix: bool) -> str:
        if site not in self.sites:
            raise VitposError(f"site {site!r} is not in the store at {self.dir}; available: {self.sites}")
        if prefix and not self.has_prefix:
            raise VitposError(f"the store at {self.dir} has no prefix tokens; recapture with keep_prefix=True")
        return site + PREFIX_SUFFIX if prefix else site

    def _read(self, index: int, key: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(acts in storage dtype, labels, image_ids) of one shard, loading only `key`."""
        sh = self.shards[index]
        fix = "the store is corrupt; re-create it by rerunning the capture with --force"
        f = _open_checked(self.dir / sh["file"], sh, self._m, self.dir, fix=fix, key=key)
        try:
            # CPU get_tensor returns views into a private mmap of the whole file: only `key`'s pages
            # are read. Copy the small index tensors so they alone never pin that mapping.
            acts = f.get_tensor(key)
            labels = f.get_tensor("labels").clone()
            ids = f.get_tensor("image_ids").clone()
        except Exception as e:
            raise VitposError(f"shard {self.dir / sh['file']} is unreadable ({e}); {fix}") from e
        finally:
            f.__exit__(None, None, None)
        return acts, labels, ids

    def _track(self, delta: int) -> None:
        self._live += delta
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self._live)

    def _shard_chunks(self, key: str, order: Sequence[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        for i in order:
            acts, labels, ids = self._read(i, key)
            nbytes = acts.nbytes
            self._track(nbytes)
            if acts.dtype != torch.float32:
                acts32 = acts.float()
                self._track(acts32.nbytes)
                del acts
                self._track(-nbytes)
                acts, nbytes = acts32, acts32.nbytes
                del acts32
            yield acts, labels, ids
            del acts, labels, ids
            self._track(-nbytes)

    def _start(self) -> None:
        self._live = 0
        self.peak_buffer_bytes = 0

    # -- public iteration

    def iter_images(self, site: str, batch_images: int = 64, *, prefix: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``(acts (b, N, D) float32, labels (b,), image_ids (b,))`` in stored order.

        With ``prefix=True`` the acts are the prefix tokens ``(b, num_prefix_tokens, D)``.
        """
        key = self._key(site, prefix)
        if batch_images < 1:
            raise VitposError(f"batch_images must be >= 1, got {batch_images}")
        self._start()
        return _rebatch(self._shard_chunks(key, range(len(self.shards))), batch_images)

    def iter_tokens(
        self,
        site: str,
        batch_tokens: int = 4096,
        *,
        shuffle: bool = False,
        seed: int = 0,
        buffer_tokens: int | None = None,
        shard_indices: Sequence[int] | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield patch tokens as ``(acts (B, D) float32, rows (B,), cols (B,), image_ids (B,))``.

        Unshuffled: image-major stored order. Shuffled: shard order is permuted, then tokens are
        drawn at random from a buffer of ``buffer_tokens`` (default: one shard's tokens) that each
        new shard is mixed into; every token comes out exactly once and the order depends only on
        ``seed``. Shuffled memory ~ (buffer_tokens + largest shard + batch_tokens) * D * 4 bytes.
        ``shard_indices`` restricts reading to those shards (used to split across workers).
        """
        key = self._key(site, False)
        if batch_tokens < 1:
            raise VitposError(f"batch_tokens must be >= 1, got {batch_tokens}")
        g = torch.Generator().manual_seed(int(seed))
        order = torch.randperm(len(self.shards), generator=g).tolist() if shuffle else list(range(len(self.shards)))
        if shard_indices is not None:
            keep = set(int(i) for i in shard_indices)
            order = [i for i in order if i in keep]
        if buffer_tokens is not None and int(buffer_tokens) < 0:
            raise VitposError(f"buffer_tokens must be >= 0, got {buffer_tokens}")
        self._start()
        if not shuffle:
            return _rebatch(self._token_chunks(key, order), batch_tokens)
        return self._shuffled_tokens(key, order, batch_tokens, g, buffer_tokens)

    def _token_chunks(self, key: str, order: Sequence[int]) -> Iterator[tuple[torch.Tensor, ...]]:
        n_p = self.num_patches
        for acts, _labels, ids in self._shard_chunks(key, order):
            n = acts.shape[0]
            yield (acts.reshape(n * n_p, acts.shape[2]), self.rows.repeat(n), self.cols.repeat(n), ids.repeat_interleave(n_p))
            del acts

    def _shuffled_tokens(self, key: str, order: list[int], batch: int, g: torch.Generator, buffer_tokens: int | None):
        n_p = self.num_patches
        max_shard = max((self.shards[i]["num_images"] for i in order), default=0) * n_p
        keep = max_shard if buffer_tokens is None else int(buffer_tokens)
        d = self.d.get(key, 0)
        cap = keep + batch + max_shard
        buf = torch.empty((cap, d), dtype=torch.float32)
        buf_ids = torch.empty(cap, dtype=torch.int64)
        buf_patch = torch.empty(cap, dtype=torch.int64)  # patch index n; rows/cols looked up on emit
        self._track(buf.nbytes)
        patch_idx = torch.arange(n_p, dtype=torch.int64)
        fill = 0

        def emit(idx: torch.Tensor):
            p = buf_patch[idx]
            return buf[idx], self.rows[p], self.cols[p], buf_ids[idx]

        for i in order:
            acts, _, ids = self._read(i, key)
            self._track(acts.nbytes)
            m = acts.shape[0] * n_p
            buf[fill : fill + m].copy_(acts.reshape(m, d))  # casts to float32 in place, no extra copy
            buf_ids[fill : fill + m] = ids.repeat_interleave(n_p)
            buf_patch[fill : fill + m] = patch_idx.repeat(acts.shape[0])
            self._track(-acts.nbytes)
            del acts, ids
            fill += m
            perm = torch.randperm(fill, generator=g)
            n_out = max(0, (fill - keep) // batch) * batch
            for j in range(0, n_out, batch):
                yield emit(perm[j : j + batch])
            # Compact: move kept tokens sitting past the new end into the emitted slots below it.
            new_fill = fill - n_out
            rest, gone = perm[n_out:], perm[:n_out]
            src, dst = rest[rest >= new_fill], gone[gone < new_fill]
            for j in range(0, src.numel(), 8192):  # chunked: src/dst are disjoint, temp stays small
                s, t = src[j : j + 8192], dst[j : j + 8192]
                buf[t] = buf[s]
                buf_ids[t] = buf_ids[s]
                buf_patch[t] = buf_patch[s]
            fill = new_fill
        perm = torch.randperm(fill, generator=g)
        for j in range(0, fill, batch):
            yield emit(perm[j : j + batch])
        self._track(-buf.nbytes)

    def load_site(self, site: str, max_images: int | None = None, *, prefix: bool = False, max_bytes: int = DEFAULT_MAX_BYTES) -> torch.Tensor:
        """All (or the first ``max_images``) images of one site as one float32 ``(n, N, D)`` tensor."""
        key = self._key(site, prefix)
        n = self.num_images if max_images is None else min(int(max_images), self.num_images)
        t = self.num_prefix_tokens if prefix else self.num_patches
        d = self.d.get(site, 0)
        need = n * t * d * 4
        if need > max_bytes:
            raise VitposError(
                f"load_site({site!r}) would allocate {need / 2**30:.2f} GiB (> max_bytes {max_bytes / 2**30:.2f} GiB); "
                "stream with iter_images/iter_tokens, or pass max_images or a larger max_bytes"
            )
        out = torch.empty((n, t, d), dtype=torch.float32)
        pos = 0
        for i, sh in enumerate(self.shards):
            if pos >= n:
                break
            acts, _, _ = self._read(i, key)
            take = min(sh["num_images"], n - pos)
            out[pos : pos + take].copy_(acts[:take])
            pos += take
            del acts
        return out

    def load_labels(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels, image_ids) of every image, int64 (num_images,), in stored order."""
        labels, ids = [], []
        for i, sh in enumerate(self.shards):
            f = _open_checked(self.dir / sh["file"], sh, self._m, self.dir, fix="the store is corrupt; re-create it by rerunning the capture with --force", key=None)
            try:
                labels.append(f.get_tensor("labels").clone())
                ids.append(f.get_tensor("image_ids").clone())
            finally:
                f.__exit__(None, None, None)
        if not labels:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        return torch.cat(labels), torch.cat(ids)

    def token_dataset(self, site: str, batch_tokens: int | None = 4096, *, shuffle: bool = False, seed: int = 0, buffer_tokens: int | None = None) -> "TokenDataset":
        """An IterableDataset over the patch tokens of `site` (see :class:`TokenDataset`)."""
        self._key(site, False)
        return TokenDataset(self.dir, site, batch_tokens=batch_tokens, shuffle=shuffle, seed=seed, buffer_tokens=buffer_tokens, allow_incomplete=not self.complete)


class TokenDataset(IterableDataset):
    """Patch tokens of one site as an IterableDataset.

    With ``batch_tokens`` set (default) it yields ready batches ``(acts, rows, cols, image_ids)``:
    use ``DataLoader(ds, batch_size=None)``. With ``batch_tokens=None`` it yields single tokens
    (slow; for a DataLoader that batches itself). DataLoader workers split the shards between
    them, so every token is seen once per epoch; call ``set_epoch`` to reshuffle each epoch.
    """

    def __init__(self, store_dir: str | Path, site: str, *, batch_tokens: int | None = 4096, shuffle: bool = False, seed: int = 0, buffer_tokens: int | None = None, allow_incomplete: bool = False) -> None:
        super().__init__()
        self.store_dir = Path(store_dir)
        self.site = site
        self.batch_tokens = batch_tokens
        self.shuffle = shuffle
        self.seed = int(seed)
        self.buffer_tokens = buffer_tokens
        self.allow_incomplete = allow_incomplete
        self.epoch = 0
        store = ActivationStore(self.store_dir, allow_incomplete=allow_incomplete)
        self.num_tokens = store.num_images * store.num_patches

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        # A fresh reader per iteration: each DataLoader worker process gets its own.
        store = ActivationStore(self.store_dir, allow_incomplete=self.allow_incomplete)
        info = get_worker_info()
        shards = None if info is None else range(info.id, len(store.shards), info.num_workers)
        it = store.iter_tokens(
            self.site,
            batch_tokens=self.batch_tokens or 4096,
            shuffle=self.shuffle,
            seed=self.seed + self.epoch,
            buffer_tokens=self.buffer_tokens,
            shard_indices=shards,
        )
        if self.batch_tokens is not None:
            yield from it
        else:
            for acts, rows, cols, ids in it:
                yield from zip(acts, rows, cols, ids)


__all__ = [
    "ActivationStore",
    "ActivationWriter",
    "TokenDataset",
    "ROUNDTRIP_ERROR",
    "patch_rows_cols",
    "shard_name",
]
