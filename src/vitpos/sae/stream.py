"""SAE training batches streamed from an on-disk activation store, in bounded memory.

:func:`store_batches` turns one site of an :class:`~vitpos.store.reader.ActivationStore` into what
:func:`~vitpos.sae.train.train_sae` takes: a callable returning a fresh pass per epoch. Each pass
is the store's shuffled ``iter_tokens`` (shard order permuted, tokens drawn from a bounded buffer),
reseeded per epoch, so the reader holds at most ``buffer_tokens + largest shard + batch_tokens``
float32 tokens plus the shard being read, whatever the store's size; the trainer holds one batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from vitpos.errors import VitposError

DEFAULT_BUFFER_TOKENS = 65_536  # ~25 MiB at D = 96, ~200 MiB at D = 768 (ViT-B)


class StoreBatches:
    """Callable: ``batches()`` starts the next epoch's pass over the patch tokens of ``site``.

    Epoch ``e`` is shuffled with seed ``seed + e`` (``shuffle=False``: stored, image-major order).
    A trailing batch shorter than ``min_batch`` tokens (default half a batch) is dropped: a handful
    of tokens gives a meaningless batch FVU to train on. After each pass,
    ``peak_reader_bytes`` is the most activation bytes the store reader held at once (its own
    accounting, ``ActivationStore.peak_buffer_bytes``), ``max_batch_tokens`` the largest batch
    yielded and ``tokens`` / ``dropped_tokens`` what the last pass yielded and dropped.
    """

    def __init__(self, store, site: str, batch_tokens: int = 4096, *, seed: int = 0, shuffle: bool = True,
                 buffer_tokens: int | None = DEFAULT_BUFFER_TOKENS, min_batch: int | None = None,
                 max_norm: float | None = None) -> None:
        from vitpos.store.reader import ActivationStore

        self.store = store if isinstance(store, ActivationStore) else ActivationStore(Path(store))
        if site not in self.store.sites:
            raise VitposError(f"site {site!r} is not in the store at {self.store.dir}; available: {self.store.sites}")
        if batch_tokens < 1:
            raise VitposError(f"batch_tokens must be >= 1, got {batch_tokens}")
        self.site = site
        self.batch_tokens = int(batch_tokens)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.buffer_tokens = buffer_tokens
        self.min_batch = max(1, self.batch_tokens // 2) if min_batch is None else int(min_batch)
        self.epoch = 0
        self.num_tokens = self.store.num_images * self.store.num_patches
        self.d = self.store.d.get(site, 0)
        self.peak_reader_bytes = 0
        self.max_batch_tokens = 0
        self.tokens = 0
        self.dropped_tokens = 0
        self.max_norm = max_norm  # tokens with a larger L2 norm are left out of every batch (None: none)
        self.excluded_tokens = 0  # what the last pass left out by max_norm

    def bound_bytes(self) -> int:
        """What the reader may hold at most (float32): buffer + largest shard + batch, plus the
        shard being read in its storage dtype (at most float32 too)."""
        shard = max((sh["num_images"] for sh in self.store.shards), default=0) * self.store.num_patches
        buf = shard if self.buffer_tokens is None else int(self.buffer_tokens)
        if not self.shuffle:
            buf = 0
        return (buf + 2 * shard + self.batch_tokens) * self.d * 4

    def __call__(self) -> Iterator[torch.Tensor]:
        seed = self.seed + self.epoch
        self.epoch += 1
        return self._pass(seed)

    def _pass(self, seed: int) -> Iterator[torch.Tensor]:
        it = self.store.iter_tokens(self.site, self.batch_tokens, shuffle=self.shuffle, seed=seed,
                                    buffer_tokens=self.buffer_tokens)
        self.tokens = self.dropped_tokens = self.excluded_tokens = 0
        try:
            for acts, _rows, _cols, _ids in it:
                if self.max_norm is not None:
                    keep = acts.norm(dim=1) <= self.max_norm
                    if not bool(keep.all()):
                        self.excluded_tokens += int((~keep).sum())
                        acts = acts[keep]
                n = acts.shape[0]
                if n < self.min_batch:
                    self.dropped_tokens += n
                    continue
                self.tokens += n
                self.max_batch_tokens = max(self.max_batch_tokens, n)
                yield acts
                del acts
        finally:
            self.peak_reader_bytes = max(self.peak_reader_bytes, self.store.peak_buffer_bytes)


def store_batches(store, site: str, batch_tokens: int = 4096, *, seed: int = 0, shuffle: bool = True,
                  buffer_tokens: int | None = DEFAULT_BUFFER_TOKENS, min_batch: int | None = None,
                  max_norm: float | None = None) -> StoreBatches:
    """Batches for ``train_sae`` from an activation store (a path or an ``ActivationStore``);
    max_norm: leave out tokens whose L2 norm exceeds it (high-norm "artifact" tokens)."""
    return StoreBatches(store, site, batch_tokens, seed=seed, shuffle=shuffle, buffer_tokens=buffer_tokens,
                        min_batch=min_batch, max_norm=max_norm)


def median_token_norm(store, site: str, max_tokens: int = 65_536) -> float:
    """The median L2 norm of the first `max_tokens` patch tokens of `site`, in stored order."""
    norms, n = [], 0
    for acts, _rows, _cols, _ids in store.iter_tokens(site, 4096, shuffle=False):
        norms.append(acts.norm(dim=1))
        n += acts.shape[0]
        if n >= max_tokens:
            break
    if not norms:
        raise VitposError(f"the store at {store.dir} holds no tokens of {site}")
    return float(torch.cat(norms)[:max_tokens].median())


__all__ = ["DEFAULT_BUFFER_TOKENS", "StoreBatches", "median_token_norm", "store_batches"]
