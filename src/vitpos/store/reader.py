"""Reading an activation store in bounded memory: images, tokens (optionally shuffled), whole sites.

The reader holds one shard at a time (safetensors maps the file and reads only the requested
site's pages); ``TokenDataset`` wraps it for DataLoader workers (docs/store-format.md, reader
guarantees).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from torch.utils.data import IterableDataset, get_worker_info

from vitpos.errors import VitposError
from vitpos.io import read_json
from vitpos.store.manifest import MANIFEST, PREFIX_SUFFIX, Manifest, open_shard

DEFAULT_MAX_BYTES = 4 * 2**30


TensorTuple = TypeVar("TensorTuple", bound=tuple[torch.Tensor, ...])


def rebatch(chunks: Iterable[TensorTuple], size: int) -> Iterator[TensorTuple]:
    """Re-cut a stream of row-aligned tensor tuples into tuples of exactly `size` rows (last may be short).

    Every tuple yielded has the arity of the input tuples (hence the casts: `tuple(...)` loses it)."""
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
                yield cast(TensorTuple, tuple(torch.cat(parts) for parts in zip(*pending, strict=True)))
                pending, n_pending = [], 0
        while n - i >= size:
            yield cast(TensorTuple, tuple(t[i : i + size] for t in chunk))
            i += size
        if i < n:
            # Copy the tail so the shard it came from can be freed before the next one loads.
            pending.append(tuple(t[i:].clone() for t in chunk))
            n_pending += n - i
        del chunk
    if n_pending:
        yield cast(TensorTuple, tuple(torch.cat(parts) for parts in zip(*pending, strict=True)))


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
        m = Manifest.from_json(read_json(path), path)
        if not m.complete and not allow_incomplete:
            raise VitposError(
                f"activation store at {self.dir} is incomplete ({m.num_images} images so far): "
                "capture was interrupted; rerun the same capture command to resume"
            )
        for sh in m.shards:
            if not (self.dir / sh.file).is_file():
                raise VitposError(f"shard {self.dir / sh.file} listed in {path} is missing; re-create the store by "
                                  "rerunning the capture with --force")
        self.manifest = m
        self.sites: list[str] = list(m.sites)
        self.grid: tuple[int, int] = (int(m.grid[0]), int(m.grid[1]))
        self.num_patches: int = int(m.num_patches)
        self.num_prefix_tokens: int = int(m.num_prefix_tokens)
        self.has_prefix: bool = bool(m.keep_prefix)
        self.num_images: int = int(m.num_images)
        self.dtype: str = m.dtype
        self.d: dict[str, int] = {k: int(v) for k, v in m.d.items()}
        self.meta: dict[str, Any] = m.meta
        self.complete: bool = bool(m.complete)
        self.shards: list[dict[str, Any]] = [sh.to_json() for sh in m.shards]
        self.rows = torch.tensor(m.rows, dtype=torch.int64)
        self.cols = torch.tensor(m.cols, dtype=torch.int64)
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
        sh = self.manifest.shards[index]
        fix = "the store is corrupt; re-create it by rerunning the capture with --force"
        f = open_shard(self.dir, sh, self.manifest, fix=fix, key=key)
        try:
            # CPU get_tensor returns views into a private mmap of the whole file: only `key`'s pages
            # are read. Copy the small index tensors so they alone never pin that mapping.
            acts = f.get_tensor(key)
            labels = f.get_tensor("labels").clone()
            ids = f.get_tensor("image_ids").clone()
        except Exception as e:
            raise VitposError(f"shard {self.dir / sh.file} is unreadable ({e}); {fix}") from e
        finally:
            f.__exit__(None, None, None)
        return acts, labels, ids

    def first_image(self, index: int, site: str) -> tuple[torch.Tensor, int, int]:
        """(patch tokens (N, D) float32, label, image id) of shard `index`'s first image, reading only
        that image's rows of `site`."""
        sh = self.manifest.shards[index]
        fix = "the store is corrupt; re-create it by rerunning the capture with --force"
        key = self._key(site, False)
        f = open_shard(self.dir, sh, self.manifest, fix=fix, key=key)
        try:
            acts = f.get_slice(key)[0:1].float().clone()[0]
            label = int(f.get_slice("labels")[0:1][0])
            image_id = int(f.get_slice("image_ids")[0:1][0])
        except Exception as e:
            raise VitposError(f"shard {self.dir / sh.file} is unreadable ({e}); {fix}") from e
        finally:
            f.__exit__(None, None, None)
        return acts, label, image_id

    def _track(self, delta: int) -> None:
        self._live += delta
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self._live)

    def _shard_chunks(self, key: str,
                      order: Sequence[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
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

    def iter_images(self, site: str, batch_images: int = 64, *,
                    prefix: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``(acts (b, N, D) float32, labels (b,), image_ids (b,))`` in stored order.

        With ``prefix=True`` the acts are the prefix tokens ``(b, num_prefix_tokens, D)``.
        """
        key = self._key(site, prefix)
        if batch_images < 1:
            raise VitposError(f"batch_images must be >= 1, got {batch_images}")
        self._start()
        return rebatch(self._shard_chunks(key, range(len(self.shards))), batch_images)

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
            return rebatch(self._token_chunks(key, order), batch_tokens)
        return self._shuffled_tokens(key, order, batch_tokens, g, buffer_tokens)

    def _token_chunks(self, key: str,
                      order: Sequence[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        n_p = self.num_patches
        for acts, _labels, ids in self._shard_chunks(key, order):
            n = acts.shape[0]
            yield (acts.reshape(n * n_p, acts.shape[2]), self.rows.repeat(n), self.cols.repeat(n),
                   ids.repeat_interleave(n_p))
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

    def load_site(self, site: str, max_images: int | None = None, *, prefix: bool = False,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> torch.Tensor:
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
        for sh in self.manifest.shards:
            f = open_shard(self.dir, sh, self.manifest,
                           fix="the store is corrupt; re-create it by rerunning the capture with --force", key=None)
            try:
                labels.append(f.get_tensor("labels").clone())
                ids.append(f.get_tensor("image_ids").clone())
            finally:
                f.__exit__(None, None, None)
        if not labels:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        return torch.cat(labels), torch.cat(ids)

    def token_dataset(self, site: str, batch_tokens: int | None = 4096, *, shuffle: bool = False, seed: int = 0,
                      buffer_tokens: int | None = None) -> TokenDataset:
        """An IterableDataset over the patch tokens of `site` (see :class:`TokenDataset`)."""
        self._key(site, False)
        return TokenDataset(self.dir, site, batch_tokens=batch_tokens, shuffle=shuffle, seed=seed,
                            buffer_tokens=buffer_tokens, allow_incomplete=not self.complete)


class TokenDataset(IterableDataset):
    """Patch tokens of one site as an IterableDataset.

    With ``batch_tokens`` set (default) it yields ready batches ``(acts, rows, cols, image_ids)``:
    use ``DataLoader(ds, batch_size=None)``. With ``batch_tokens=None`` it yields single tokens
    (slow; for a DataLoader that batches itself). DataLoader workers split the shards between
    them, so every token is seen once per epoch; call ``set_epoch`` to reshuffle each epoch.
    """

    def __init__(self, store_dir: str | Path, site: str, *, batch_tokens: int | None = 4096, shuffle: bool = False,
                 seed: int = 0, buffer_tokens: int | None = None, allow_incomplete: bool = False) -> None:
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
                yield from zip(acts, rows, cols, ids, strict=True)


__all__ = ["ActivationStore", "DEFAULT_MAX_BYTES", "TokenDataset", "rebatch"]
