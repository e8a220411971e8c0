"""The activation store's on-disk format: file names, storage dtypes and the manifest.

Layout (see docs/store-format.md): ``manifest.json`` plus ``shard-00000.safetensors`` ... Each shard
holds, for a run of consecutive images, one ``(n, N, D)`` tensor per site (patch tokens only, prefix
tokens optionally under ``<site>::prefix``) and ``labels`` / ``image_ids`` (int64, n). A distributed
capture adds one such store per rank under ``rank-NNNNN/`` and a merged manifest naming their shards.

:class:`Manifest` is ``manifest.json`` as a validated object (``from_json`` / ``to_json``, format
version 1); :func:`open_shard` checks a shard's header against it; :func:`wipe_store` is the one
place that deletes a store's own files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from vitpos import __version__
from vitpos.errors import VitposError

FORMAT = "vitpos-activations"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PREFIX_SUFFIX = "::prefix"
RESERVED_KEYS = ("labels", "image_ids")

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
# safetensors header spelling of each storage dtype, to check a shard before loading it.
SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
SHARD_RE = re.compile(r"^shard-(\d{5,})\.safetensors$")
RANK_DIR_RE = re.compile(r"^rank-(\d{5,})$")
# Manifest entries may also name a rank's shard of a distributed capture (vitpos.store.capture).
ENTRY_RE = re.compile(r"^(rank-\d{5,}/)?shard-(\d{5,})\.safetensors$")

# Worst-case round-trip error of the storage dtypes (round-to-nearest): |x' - x| <= rel*|x| + abs.
# fp16 normals: unit roundoff 2^-11; its subnormals (|x| < 2^-14) are spaced 2^-24 -> half-step 2^-25.
# bf16 keeps fp32's exponent range, so only the 8-bit significand matters (2^-8 relative).
ROUNDTRIP_ERROR: dict[str, tuple[float, float]] = {
    "float32": (0.0, 0.0),
    "float16": (2.0**-11, 2.0**-25),
    "bfloat16": (2.0**-8, 2.0**-133),
}

DAMAGED = "the manifest is damaged; re-create the store by rerunning the capture with --force"
# A rank's block of a distributed capture: in its own store's meta, not in the merged manifest's.
RANK_META_KEYS = ("rank", "world_size", "first_image", "end_image")


def store_identity(meta: dict[str, Any]) -> str:
    """sha256 (16 hex) of a store's meta (model, weights, data, split, limit, ...) without a rank's
    block keys: every shard carries it in its header (``store``), so a shard copied in from another
    store (another model, weights, data or split) is refused against the manifest that lists it."""
    import hashlib

    core = {k: v for k, v in meta.items() if k not in RANK_META_KEYS}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def rank_dir_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def patch_rows_cols(grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major patch order: patch n sits at row n // W, column n % W."""
    h, w = grid
    n = torch.arange(h * w, dtype=torch.int64)
    return n // w, n % w


def normalize_json(value: Any, what: str) -> Any:
    """``value`` through a JSON round trip, so tuples/lists and int keys compare equal to what was stored."""
    try:
        return json.loads(json.dumps(value, sort_keys=True))
    except (TypeError, ValueError) as e:
        raise VitposError(f"{what} must be JSON-serializable ({e}); pass plain str/int/float/list/dict values") from e


# ------------------------------------------------------------------------------- store files


def is_temp_file(name: str) -> bool:
    """A leftover temp file of ours (vitpos.io.atomic_path names: ``.<target>.<random>.tmp``)."""
    return name.endswith(".tmp") and (name.startswith(f".{MANIFEST}.") or name.startswith(".shard-"))


def is_store_file(name: str) -> bool:
    """A file the store writes into its folder: the manifest, a shard, or a temp file of either."""
    return name == MANIFEST or bool(SHARD_RE.match(name)) or is_temp_file(name)


def wipe_store(folder: str | Path) -> None:
    """Delete the store files directly in ``folder`` (manifest, shards, temp files); anything else
    there, rank sub-folders included, is left alone."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        if p.is_file() and is_store_file(p.name):
            p.unlink()


# ---------------------------------------------------------------------------------- manifest


@dataclass
class ShardEntry:
    """One shard of a manifest: its file (relative to the store folder), image count, first image."""

    file: str
    num_images: int
    first_image: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "num_images": self.num_images}
        if self.first_image is not None:
            out["first_image"] = self.first_image
        return out


@dataclass
class Manifest:
    """``manifest.json`` of an activation store (format version 1; docs/store-format.md).

    Mutable on purpose: the writer appends shards and rewrites it after each one. ``ranks`` is set
    only on the merged manifest of a distributed capture; ``extra`` keeps fields this version does
    not know, so a rewrite loses nothing."""

    sites: list[str]
    grid: tuple[int, int]
    num_patches: int
    num_prefix_tokens: int
    keep_prefix: bool
    dtype: str
    d: dict[str, int]
    num_images: int
    shards: list[ShardEntry]
    rows: list[int]
    cols: list[int]
    meta: dict[str, Any]
    complete: bool
    shard_images: int | None = None
    vitpos_version: str | None = None
    ranks: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def new(cls, *, sites: list[str], grid: tuple[int, int], num_prefix_tokens: int, keep_prefix: bool, dtype: str,
            shard_images: int, meta: dict[str, Any]) -> Manifest:
        """The manifest of an empty store (no shards, not complete)."""
        rows, cols = patch_rows_cols(grid)
        return cls(sites=list(sites), grid=(int(grid[0]), int(grid[1])), num_patches=int(grid[0]) * int(grid[1]),
                   num_prefix_tokens=num_prefix_tokens, keep_prefix=keep_prefix, dtype=dtype, d={}, num_images=0,
                   shards=[], rows=rows.tolist(), cols=cols.tolist(), meta=meta, complete=False,
                   shard_images=shard_images, vitpos_version=__version__)

    @classmethod
    def from_json(cls, m: Any, path: str | Path, *, foreign: str = "point at a capture output folder",
                  version: str = f"this vitpos reads {FORMAT_VERSION}; recapture with this version") -> Manifest:
        """Validate a parsed manifest.json (from ``path``, named in errors) into a Manifest.

        ``foreign`` / ``version`` end the error for a file that is not an activation manifest / of
        another format version (the reader and the resuming writer advise differently)."""
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise VitposError(f"{path} is not a vitpos activation manifest; {foreign}")
        if m.get("format_version") != FORMAT_VERSION:
            raise VitposError(f"{path} has format version {m.get('format_version')}, {version}")
        need = {
            "sites": list, "grid": list, "num_patches": int, "num_prefix_tokens": int, "keep_prefix": bool,
            "dtype": str, "d": dict, "num_images": int, "shards": list, "rows": list, "cols": list,
            "meta": dict, "complete": bool,
        }
        for k, typ in need.items():
            if not isinstance(m.get(k), typ):
                raise VitposError(f"{path}: field {k!r} missing or not a {typ.__name__}; {DAMAGED}")
        for k in ("num_patches", "num_prefix_tokens", "num_images"):
            if m[k] < 0:
                raise VitposError(f"{path}: field {k!r} is negative ({m[k]}); {DAMAGED}")
        if m.get("shard_images") is not None and (not isinstance(m["shard_images"], int) or m["shard_images"] < 1):
            raise VitposError(f"{path}: shard_images {m['shard_images']!r} is not a positive int; {DAMAGED}")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in m["d"].values()):
            raise VitposError(f"{path}: d (the width per site) holds a value that is not a positive int; {DAMAGED}")
        if m["dtype"] not in DTYPES:
            raise VitposError(f"{path}: unknown dtype {m['dtype']!r}; {DAMAGED}")
        if len(m["grid"]) != 2 or not all(isinstance(v, int) and v > 0 for v in m["grid"]):
            raise VitposError(f"{path}: grid {m['grid']!r} is not two positive ints; {DAMAGED}")
        h, w = m["grid"]
        if h * w != m["num_patches"] or len(m["rows"]) != h * w or len(m["cols"]) != h * w:
            raise VitposError(f"{path}: grid {m['grid']} disagrees with num_patches/rows/cols; {DAMAGED}")
        shards, total = [], 0
        for sh in m["shards"]:
            # File names must be our own pattern: never follow a manifest outside the store folder.
            if (not isinstance(sh, dict) or not ENTRY_RE.match(str(sh.get("file")))
                    or not isinstance(sh.get("num_images"), int) or sh["num_images"] < 1):
                raise VitposError(f"{path}: bad shard entry {sh!r}; {DAMAGED}")
            shards.append(ShardEntry(sh["file"], sh["num_images"], sh.get("first_image")))
            total += sh["num_images"]
        if total != m["num_images"]:
            raise VitposError(f"{path}: shards hold {total} images but num_images is {m['num_images']}; {DAMAGED}")
        known = {"format", "format_version", "vitpos_version", "shard_images", "ranks", *need}
        return cls(sites=list(m["sites"]), grid=(h, w), num_patches=m["num_patches"],
                   num_prefix_tokens=m["num_prefix_tokens"], keep_prefix=m["keep_prefix"], dtype=m["dtype"],
                   d=dict(m["d"]), num_images=m["num_images"], shards=shards, rows=list(m["rows"]),
                   cols=list(m["cols"]), meta=m["meta"], complete=m["complete"], shard_images=m.get("shard_images"),
                   vitpos_version=m.get("vitpos_version"), ranks=m.get("ranks"),
                   extra={k: v for k, v in m.items() if k not in known})

    def to_json(self) -> dict[str, Any]:
        """The manifest.json document (fields in the documented order)."""
        out: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION}
        if self.vitpos_version is not None:
            out["vitpos_version"] = self.vitpos_version
        out.update(sites=list(self.sites), grid=list(self.grid), num_patches=self.num_patches,
                   num_prefix_tokens=self.num_prefix_tokens, keep_prefix=self.keep_prefix, dtype=self.dtype,
                   d=dict(self.d))
        if self.shard_images is not None:
            out["shard_images"] = self.shard_images
        out.update(num_images=self.num_images, shards=[sh.to_json() for sh in self.shards], rows=list(self.rows),
                   cols=list(self.cols), meta=self.meta)
        if self.ranks is not None:
            out["ranks"] = self.ranks
        out["complete"] = self.complete
        out.update(self.extra)
        return out


def open_shard(store_dir: Path, entry: ShardEntry, m: Manifest, *, fix: str, key: str | None = None):
    """Open a shard of the store in ``store_dir`` and check its header against the manifest; return
    the open safetensors handle (the caller closes it with ``__exit__``). ``key``: check only that
    site tensor (plus labels / image_ids); None: every tensor the manifest promises."""
    path = store_dir / entry.file
    if not path.is_file():
        raise VitposError(f"shard {path} listed in {store_dir / MANIFEST} is missing; {fix}")
    try:
        f = safe_open(str(path), framework="pt")
        f.__enter__()
    except Exception as e:  # safetensors raises its own SafetensorError, plus OSError/ValueError
        raise VitposError(f"shard {path} is unreadable ({e}); {fix}") from e
    try:
        _check_shard_header(path, entry, m, f.metadata() or {}, fix)
        n = entry.num_images
        keys = set(f.keys())
        if key is not None:
            want = [key]
        else:
            want = list(m.sites) + ([s + PREFIX_SUFFIX for s in m.sites] if m.keep_prefix else [])
        for k in [*want, "labels", "image_ids"]:
            if k not in keys:
                raise VitposError(f"shard {path} has no tensor {k!r}; {fix}")
        for k in ("labels", "image_ids"):
            sl = f.get_slice(k)
            if sl.get_shape() != [n] or sl.get_dtype() != "I64":
                raise VitposError(f"shard {path}: {k} is {sl.get_dtype()}{sl.get_shape()}, expected I64[{n}]; {fix}")
        st_dtype = SAFETENSORS_DTYPES[m.dtype]
        for k in want:
            site, is_prefix = (k[: -len(PREFIX_SUFFIX)], True) if k.endswith(PREFIX_SUFFIX) else (k, False)
            t = m.num_prefix_tokens if is_prefix else m.num_patches
            shape = [n, t, m.d.get(site, -1)]
            sl = f.get_slice(k)
            if sl.get_shape() != shape or sl.get_dtype() != st_dtype:
                raise VitposError(f"shard {path}: {k!r} is {sl.get_dtype()}{sl.get_shape()}, expected "
                                  f"{st_dtype}{shape}; {fix}")
    except VitposError:
        f.__exit__(None, None, None)
        raise
    except Exception as e:
        f.__exit__(None, None, None)
        raise VitposError(f"shard {path} is unreadable ({e}); {fix}") from e
    return f


def _check_shard_header(path: Path, entry: ShardEntry, m: Manifest, header: dict[str, str], fix: str) -> None:
    """The shard's own header against the manifest entry naming it: its format, its index in its
    store and (shards written since the ``store`` key) the identity of the capture it came from.
    Shards of older stores carry no ``store`` key; `vitpos sae --store` spot-checks their values."""
    if header.get("format", FORMAT) != FORMAT:
        raise VitposError(f"shard {path} is not an activation shard (format {header.get('format')!r}); {fix}")
    listed = ENTRY_RE.match(entry.file)
    if listed is not None and "shard" in header and header["shard"] != str(int(listed.group(2))):
        raise VitposError(f"shard {path} is shard {header['shard']} of its store, but {MANIFEST} lists it as shard "
                          f"{int(listed.group(2))} (copied or renamed?); {fix}")
    if "store" in header and header["store"] != store_identity(m.meta):
        raise VitposError(f"shard {path} was captured by another capture (store digest {header['store']}) than its "
                          f"{MANIFEST} describes ({store_identity(m.meta)}: {m.meta.get('model', '?')} on "
                          f"{m.meta.get('data', '?')}/{m.meta.get('split', '?')}); it does not belong to this store; "
                          f"{fix}")


__all__ = [
    "DTYPES", "FORMAT", "FORMAT_VERSION", "MANIFEST", "Manifest", "PREFIX_SUFFIX", "RESERVED_KEYS", "ROUNDTRIP_ERROR",
    "ShardEntry", "is_store_file", "is_temp_file", "normalize_json", "open_shard", "patch_rows_cols", "rank_dir_name",
    "shard_name", "store_identity", "wipe_store",
]
