"""Captures that keep only what their consumer reads: memory does not grow with layers x images x grid.

A consumer says before the forward what it will read of each site's (n_images, N, D) patch tokens
(`Keep`, e.g. from a probe's `ProbeSample`, which depends on the seed alone): single tokens (a
probe's sampled training tokens) stay in memory; whole images (a probe's validation and test images,
an SAE's held-out set) stream into an on-disk activation store (``vitpos.store``), one per site, and
are read back one site at a time, unless all of a site's fit its share of the shard buffers: then
they are held in memory (the store would buffer them all in one shard anyway), and no store is
written, read back and deleted. The hook hands each batch of each site over as the model computes
it (`vitpos.hooks.capture` with a sink), so during the forward nothing piles up beyond the kept
tokens and one store shard buffer per site. The values are the captured floats, unchanged.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from vitpos.analysis.probes import ProbeSample
from vitpos.errors import VitposError

# Shard buffers of all sites' stores together stay under this (one shard per site is buffered).
DEFAULT_BUFFER_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Keep:
    """What a consumer reads of one site's (n_images, N, D) patch tokens: single tokens
    (`token_images`[i], `token_patches`[i]), kept in that order, and every token of `images`
    (sorted distinct rows)."""

    token_images: torch.Tensor
    token_patches: torch.Tensor
    images: torch.Tensor

    @classmethod
    def whole(cls, rows: torch.Tensor | range) -> Keep:
        """Every token of `rows`, no single tokens."""
        empty = torch.empty(0, dtype=torch.long)
        return cls(empty, empty, torch.as_tensor(list(rows), dtype=torch.long).unique())

    @classmethod
    def probe(cls, sample: ProbeSample, extra_images: torch.Tensor | None = None) -> Keep:
        """What a fit of `sample` reads (its training tokens, its val and test images), plus
        `extra_images` kept whole (e.g. another probe's test images to score it on)."""
        rows = sample.whole_images if extra_images is None else torch.cat([sample.whole_images, extra_images])
        return cls(sample.train_images.long(), sample.train_patches.long(), rows.long().unique())

    def nbytes(self, d: int, itemsize: int = 4) -> int:
        """Bytes of the single tokens in memory at width d."""
        return int(self.token_images.numel()) * d * itemsize


class KeptTokens:
    """One forward's kept tokens per site: `tokens(site)` (T, D) in memory, `images(site)` (M, N, D)
    loaded from the site's store on each call. A context manager: closing deletes the stores."""

    def __init__(self, keep: Mapping[str, Keep], tokens: dict[str, torch.Tensor], stores: dict[str, Path],
                 widths: dict[str, int], num_patches: int, tmp: tempfile.TemporaryDirectory | None, peak_bytes: int,
                 in_memory: dict[str, torch.Tensor] | None = None):
        self.keep = dict(keep)
        self._tokens = tokens
        self._stores = stores
        self._in_memory = in_memory or {}  # sites whose kept images fit one shard buffer: no store
        self._widths = widths
        self._num_patches = num_patches
        self._tmp: tempfile.TemporaryDirectory | None = tmp
        self.peak_bytes = peak_bytes  # most bytes the capture held at once: kept tokens + shard buffers

    def tokens(self, site: str) -> torch.Tensor:
        """The single tokens of `site`, (T, D), in the order its Keep lists them."""
        return self._tokens.get(site, torch.empty(0, self._widths.get(site, 0)))

    def images(self, site: str) -> torch.Tensor:
        """Every token of the kept images of `site`, (M, N, D) float32, rows in Keep.images order."""
        from vitpos.store.reader import ActivationStore

        if site in self._in_memory:
            return self._in_memory[site].clone()
        if site not in self._stores:
            return torch.empty(0, self._num_patches, self._widths.get(site, 0))
        st = ActivationStore(self._stores[site])
        return st.load_site(site, max_bytes=st.num_images * self._num_patches * self._widths[site] * 4)

    def iter_images(self, site: str, batch_images: int) -> Iterator[torch.Tensor]:
        """The kept images of `site` in batches of `batch_images`, (b, N, D) float32, without loading them all."""
        from vitpos.store.reader import ActivationStore

        if site in self._in_memory:
            acts = self._in_memory[site]
            for i in range(0, acts.shape[0], batch_images):
                yield acts[i:i + batch_images].clone()
        elif site in self._stores:
            for acts, _, _ in ActivationStore(self._stores[site]).iter_images(site, batch_images):
                # a fresh copy: a batch may be a view into a shard's mapping, and numerics should
                # not depend on where the floats sit
                yield acts.clone()

    def close(self) -> None:
        """Delete the on-disk stores and drop the images held in memory (idempotent)."""
        self._in_memory = {}
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> KeptTokens:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TokenKeeper:
    """A capture sink (`vitpos.hooks.capture(sink=...)`): keeps, of each site's batches, what its
    Keep names. Batches of a site must arrive in image order (row 0 first), as forwards give them."""

    def __init__(self, keep: Mapping[str, Keep], grid: tuple[int, int], *,
                 buffer_bytes: int = DEFAULT_BUFFER_BYTES, spill_dir: str | Path | None = None):
        self.keep = dict(keep)
        self.grid = (int(grid[0]), int(grid[1]))
        self.num_patches = self.grid[0] * self.grid[1]
        self.buffer_bytes = int(buffer_bytes)
        self.spill_dir = spill_dir
        self._tmp: tempfile.TemporaryDirectory | None = None  # made when a site's images need a store
        self._seen: dict[str, int] = dict.fromkeys(self.keep, 0)
        self._tokens: dict[str, torch.Tensor] = {}
        self._images: dict[str, torch.Tensor] = {}  # sites whose kept images fit their buffer share
        self._writers: dict = {}
        self._stores: dict[str, Path] = {}
        self._widths: dict[str, int] = {}
        self._held = 0
        self.peak_bytes = 0

    def _hold(self, nbytes: int) -> None:
        self._held += nbytes
        self.peak_bytes = max(self.peak_bytes, self._held)

    def __call__(self, key: str, t: torch.Tensor) -> None:
        keep = self.keep.get(key)
        if keep is None:
            raise VitposError(f"site {key} was captured but has no Keep; name what to keep of every captured site")
        if t.ndim != 3 or t.shape[1] != self.num_patches:
            raise VitposError(f"site {key}: expected (batch, {self.num_patches} patches, D), got {tuple(t.shape)}")
        first = self._seen[key]
        b = t.shape[0]
        self._seen[key] = first + b
        if key not in self._widths:
            self._start(key, keep, t)
        if keep.token_images.numel():
            sel = (keep.token_images >= first) & (keep.token_images < first + b)
            if bool(sel.any()):
                self._tokens[key][sel] = t[keep.token_images[sel] - first, keep.token_patches[sel]]
        if keep.images.numel():
            rows = keep.images[(keep.images >= first) & (keep.images < first + b)]
            if rows.numel():
                if key in self._images:
                    at = torch.searchsorted(keep.images, rows)  # keep.images is sorted and distinct
                    self._images[key][at] = t[rows - first]  # float32: only such sites are held
                else:
                    self._writers[key].add({key: t[rows - first]}, torch.full_like(rows, -1), rows)

    def _start(self, key: str, keep: Keep, t: torch.Tensor) -> None:
        """Allocate the site's kept-token tensor and open its store, now that its width is known."""
        from vitpos.store.writer import ActivationWriter

        d = int(t.shape[2])
        self._widths[key] = d
        self._tokens[key] = torch.empty(keep.token_images.numel(), d, dtype=t.dtype)
        self._hold(self._tokens[key].nbytes)
        if keep.images.numel():
            per_site = self.buffer_bytes // max(1, sum(int(k.images.numel() > 0) for k in self.keep.values()))
            image_bytes = self.num_patches * d * t.element_size()
            shard = max(1, min(int(keep.images.numel()), per_site // image_bytes))
            if shard == keep.images.numel() and t.dtype == torch.float32:
                # every kept image fits the site's one shard buffer: hold them there, as float32 as the
                # store would give them back, without writing, reading and deleting a store
                self._images[key] = torch.empty(shard, self.num_patches, d, dtype=torch.float32)
                self._hold(self._images[key].nbytes)
                return
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="vitpos-kept-", dir=self.spill_dir)
            folder = Path(self._tmp.name) / f"site-{len(self._stores):03d}"
            # labels are not kept (-1): consumers read tokens only; the meta says what the store is
            self._writers[key] = ActivationWriter(folder, sites=[key], grid=self.grid, num_prefix_tokens=0,
                                                  meta={"kept": key}, shard_images=shard, dtype=t.dtype)
            self._stores[key] = folder
            self._hold(shard * image_bytes)

    def finish(self) -> KeptTokens:
        """Close the stores; the kept tokens of every site. Refused when a Keep names rows beyond those captured."""
        for key, keep in self.keep.items():
            n = self._seen[key]
            last = max((int(x.max()) for x in (keep.images, keep.token_images) if x.numel()), default=-1)
            if last >= n:
                raise VitposError(f"site {key}: keep names image {last} but only {n} images were captured")
        for w in self._writers.values():
            w.close()
        self._writers.clear()
        return KeptTokens(self.keep, self._tokens, self._stores, self._widths, self.num_patches, self._tmp,
                          self.peak_bytes, in_memory=self._images)

    def abort(self) -> None:
        """Drop everything kept so far (after a failed forward)."""
        for w in self._writers.values():
            w.abort()
        self._writers.clear()
        self._images.clear()
        if self._tmp is not None:
            self._tmp.cleanup()


__all__ = ["DEFAULT_BUFFER_BYTES", "Keep", "KeptTokens", "TokenKeeper"]
