"""Writing an activation store: captured batches streamed into shards, resumable after a kill.

The writer rewrites the manifest after every shard, so a killed capture leaves a valid,
``complete: false`` store that the same writer resumes (docs/store-format.md, write protocol).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vitpos.errors import VitposError
from vitpos.io import read_json, write_json, write_safetensors
from vitpos.store.manifest import (
    DTYPE_NAMES,
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    PREFIX_SUFFIX,
    RESERVED_KEYS,
    SHARD_RE,
    Manifest,
    ShardEntry,
    is_temp_file,
    normalize_json,
    open_shard,
    shard_name,
    store_identity,
    wipe_store,
)


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
                raise VitposError(f"site name {s!r} is not allowed (empty, reserved, or ends in {PREFIX_SUFFIX!r}); "
                                  "rename it")
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
        if dtype not in DTYPE_NAMES:
            raise VitposError(f"dtype {dtype} is not supported for storage; use one of {sorted(DTYPES)}")
        self.dtype = dtype
        self.keep_prefix = bool(keep_prefix)
        if self.keep_prefix and self.num_prefix_tokens == 0:
            raise VitposError("keep_prefix=True but num_prefix_tokens is 0; there are no prefix tokens to keep")
        self.meta = normalize_json(meta, "meta")
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
            wipe_store(self.out_dir)  # only files this module writes; anything else in the folder is the user's
        if manifest_path.exists():
            self._manifest = self._resume(manifest_path)
        else:
            if self.out_dir.is_dir() and any(SHARD_RE.match(p.name) for p in self.out_dir.iterdir()):
                raise VitposError(f"{self.out_dir} holds shard files but no {MANIFEST}; pass a new --out or --force "
                                  "to overwrite")
            self._manifest = Manifest.new(sites=self.sites, grid=self.grid, num_prefix_tokens=self.num_prefix_tokens,
                                          keep_prefix=self.keep_prefix, dtype=DTYPE_NAMES[self.dtype],
                                          shard_images=self.shard_images, meta=self.meta)
            # Claim the directory now so a crash before the first shard still resumes cleanly.
            write_json(manifest_path, self._manifest.to_json())
        self.was_complete: bool = bool(self._manifest.complete)
        self._manifest.complete = False  # in memory only; rewritten on the next shard / close
        self.num_stored: int = int(self._manifest.num_images)

    # -- setup

    def _resume(self, manifest_path: Path) -> Manifest:
        fix = "pass a new --out to keep both, or --force to overwrite"
        m = Manifest.from_json(read_json(manifest_path), manifest_path, foreign=fix,
                               version=f"this vitpos writes {FORMAT_VERSION}; {fix}")
        stored = {
            "sites": m.sites,
            "grid": list(m.grid),
            "num_prefix_tokens": m.num_prefix_tokens,
            "keep_prefix": m.keep_prefix,
            "dtype": m.dtype,
        }
        mine = {
            "sites": self.sites,
            "grid": list(self.grid),
            "num_prefix_tokens": self.num_prefix_tokens,
            "keep_prefix": self.keep_prefix,
            "dtype": DTYPE_NAMES[self.dtype],
        }
        differ = [k for k, v in mine.items() if stored[k] != v]
        if differ:
            got = ", ".join(f"{k}: stored {stored[k]!r} != {mine[k]!r}" for k in differ)
            raise VitposError(f"{self.out_dir} was captured with different settings ({got}); {fix}")
        if m.meta != self.meta:
            keys = _diff_keys(m.meta, self.meta)
            got = ", ".join(f"{k}: stored {m.meta.get(k, '<missing>')!r} != "
                            f"{self.meta.get(k, '<missing>')!r}" for k in keys)
            raise VitposError(f"{self.out_dir} was captured with different meta ({got}); {fix}")
        for sh in m.shards:
            open_shard(self.out_dir, sh, m, fix=f"the store is damaged; {fix}").__exit__(None, None, None)
        m.shard_images = self.shard_images
        # Shards past the manifest's list were written but never recorded (killed in between):
        # they will be rewritten, so drop them now so the folder matches the manifest.
        listed = {sh.file for sh in m.shards}
        for p in self.out_dir.iterdir():
            if (SHARD_RE.match(p.name) and p.name not in listed) or is_temp_file(p.name):
                p.unlink()
        return m

    # -- public

    @property
    def num_done(self) -> int:
        """Images accepted so far (on disk + buffered); on a resumed store, the count to skip."""
        return self.num_stored + self._fill

    @property
    def d(self) -> dict[str, int]:
        return dict(self._manifest.d)

    def add(self, batch: dict[str, torch.Tensor], labels: torch.Tensor, image_ids: torch.Tensor) -> None:
        """Buffer a batch: ``batch[site]`` is ``(B, num_prefix_tokens + H*W, D)``; labels/image_ids ``(B,)``."""
        if self._closed:
            raise VitposError("this ActivationWriter is closed; open a new one to add more images")
        missing = [s for s in self.sites if s not in batch]
        extra = [s for s in batch if s not in self.sites]
        if missing or extra:
            raise VitposError(f"batch sites do not match the writer's (missing {missing}, unexpected {extra}); pass "
                              f"exactly sites={self.sites}")
        labels = _as_int64(labels, "labels")
        image_ids = _as_int64(image_ids, "image_ids")
        b = labels.shape[0]
        if image_ids.shape[0] != b:
            raise VitposError(f"labels has {b} entries but image_ids has {image_ids.shape[0]}; pass one of each per "
                              "image")
        t_expected = self.num_prefix_tokens + self.num_patches
        d_known = self._manifest.d
        for s in self.sites:
            x = batch[s]
            if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[0] != b or x.shape[1] != t_expected:
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise VitposError(
                    f"site {s!r}: expected shape ({b}, {t_expected}, D) = (batch, {self.num_prefix_tokens} prefix + "
                    f"{self.grid[0]}x{self.grid[1]} patches, D), got {shape}; check grid/num_prefix_tokens"
                )
            if s in d_known and x.shape[2] != d_known[s]:
                raise VitposError(f"site {s!r}: width D={x.shape[2]} but the store has D={d_known[s]}; pass the same "
                                  "model and sites")
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
        self._manifest.complete = True
        write_json(self.out_dir / MANIFEST, self._manifest.to_json())
        self._closed = True
        self._buf.clear()

    def abort(self) -> None:
        """Drop buffered images without writing; the store stays resumable (complete: false)."""
        self._closed = True
        self._buf.clear()
        self._fill = 0

    def __enter__(self) -> ActivationWriter:
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
            raise VitposError(f"site {key!r}: activations reach |x|={amax:.4g}, beyond float16's 65504; store with "
                              "dtype bfloat16 or float32")

    def _flush(self) -> None:
        n = self._fill
        index = len(self._manifest.shards)
        tensors = {k: v[:n] for k, v in self._buf.items()}
        tensors["labels"] = self._buf_labels[:n]
        tensors["image_ids"] = self._buf_ids[:n]
        first = self.num_stored
        entry = ShardEntry(shard_name(index), n, first)
        st_meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "shard": str(index),
                   "first_image": str(first), "num_images": str(n), "store": store_identity(self.meta)}
        # Shard first, manifest second: the manifest never lists a shard that is not fully on disk.
        write_safetensors(self.out_dir / entry.file, tensors, metadata=st_meta)
        self._manifest.shards.append(entry)
        self._manifest.num_images = first + n
        self._manifest.complete = False
        write_json(self.out_dir / MANIFEST, self._manifest.to_json())
        self.num_stored = first + n
        self._fill = 0


def _diff_keys(a: dict, b: dict) -> list[str]:
    keys = sorted(set(a) | set(b))
    return [k for k in keys if a.get(k, "<missing>") != b.get(k, "<missing>")]


def _as_int64(x: Any, what: str) -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.ndim != 1:
        raise VitposError(f"{what} must be 1-D (one per image), got shape {tuple(x.shape)}")
    if x.is_floating_point() or x.is_complex():
        raise VitposError(f"{what} must be integers, got {x.dtype}; pass class indices / integer ids")
    return x.detach().to("cpu", torch.int64)


__all__ = ["ActivationWriter"]
