"""Sparse codes of a TopK / BatchTopK SAE step (`vitpos.sae.model.SAE.step`): the selection of the
k largest pre-activations, and the codes as COO entries whose encoder and decoder gradients are
gathered / scattered with ``embedding_bag`` (O(N·k·D) instead of O(N·F·D)), never forming the dense
(N, F) code matrix on the backward pass.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as Fn
from torch import Tensor


def topk_rows(pre: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k values and indices per row (unordered), like ``pre.topk(k, dim=1, sorted=False)``.

    On CPU numpy's introselect (argpartition) is ~3x faster than torch.topk, and selection is
    most of a TopK training step there; same selected set (ties aside)."""
    if pre.device.type == "cpu" and pre.dtype in (torch.float32, torch.float64) and 0 < k < pre.shape[1]:
        a = pre.detach().contiguous().numpy()
        idx = torch.from_numpy(np.ascontiguousarray(np.argpartition(a, -k, axis=1)[:, -k:]))
        return pre.gather(1, idx), idx
    return pre.topk(k, dim=1, sorted=False)


def topk_flat(pre: Tensor, k: int) -> Tensor:
    """Flat indices of the k largest entries of ``pre`` (any order): BatchTopK's selection."""
    flat = pre.detach().reshape(-1)
    if pre.device.type == "cpu" and pre.dtype in (torch.float32, torch.float64) and 0 < k < flat.numel():
        return torch.from_numpy(np.argpartition(flat.contiguous().numpy(), -k)[-k:].copy())
    return flat.topk(min(k, flat.numel()), sorted=False).indices


def stable_argsort_small(keys: Tensor, bound: int) -> Tensor:
    """``torch.argsort(keys, stable=True)`` for integer keys in [0, bound): the same permutation.

    On CPU with bound <= 2**15 numpy's stable sort of int16 keys is a radix sort, ~3x faster than
    torch's merge sort at the sizes of an SAE step (32k entries); anything else goes to torch."""
    if keys.device.type == "cpu" and bound <= 1 << 15:
        return torch.from_numpy(np.argsort(keys.numpy().astype(np.int16), kind="stable"))
    return torch.argsort(keys, stable=True)


# ---------------------------------------------------------------------------------------------
# Sparse codes as COO entries grouped by token: entry i is (rows[i], cols[i]) with rows sorted,
# so each token's latents form one embedding_bag "bag". The column order is computed once and
# shared by the encoder and decoder backward passes.
class Sparse:
    __slots__ = ("rows", "cols", "flat", "row_offsets", "n_rows", "n_cols", "_order", "_col_offsets", "_rows_by_col")

    def __init__(self, rows: Tensor, cols: Tensor, row_offsets: Tensor, n_rows: int, n_cols: int,
                 flat: Tensor | None = None):
        self.rows, self.cols, self.row_offsets = rows, cols, row_offsets
        self.n_rows, self.n_cols = n_rows, n_cols
        # Flat positions in the (N, F) code matrix: 1-D take/scatter beat 2-D advanced indexing.
        self.flat = rows * n_cols + cols if flat is None else flat
        self._order: Tensor | None = None
        self._col_offsets: Tensor | None = None
        self._rows_by_col: Tensor | None = None

    @classmethod
    def from_topk(cls, idx: Tensor, n_cols: int) -> Sparse:
        n, k = idx.shape
        ar = torch.arange(n, device=idx.device)
        cols = idx.reshape(-1)
        rows = ar.repeat_interleave(k)
        return cls(rows, cols, ar * k, n, n_cols, flat=(ar.unsqueeze(1) * n_cols + idx).reshape(-1))

    @classmethod
    def from_flat(cls, flat_idx: Tensor, n_rows: int, n_cols: int) -> Sparse:
        flat_idx, _ = flat_idx.sort()
        rows, cols = flat_idx // n_cols, flat_idx % n_cols
        counts = torch.bincount(rows, minlength=n_rows)
        return cls(rows, cols, torch.cumsum(counts, 0) - counts, n_rows, n_cols, flat=flat_idx)

    def by_col(self) -> tuple[Tensor, Tensor, Tensor]:
        """(entry order grouped by column, each column's first position in it, rows in that order)."""
        if self._order is None:
            self._order = stable_argsort_small(self.cols, self.n_cols)
            counts = torch.bincount(self.cols, minlength=self.n_cols)
            self._col_offsets = torch.cumsum(counts, 0) - counts
            self._rows_by_col = self.rows.index_select(0, self._order)
        return self._order, self._col_offsets, self._rows_by_col  # type: ignore[return-value]

    def col_sum(self, per_entry: Tensor, per_row: Tensor) -> Tensor:
        """out[f] = Σ_{entries i with col f} per_entry[i] · per_row[rows[i]]  -> (F, D)."""
        order, offs, rows = self.by_col()
        return Fn.embedding_bag(rows, per_row, offs, mode="sum",
                                per_sample_weights=per_entry.index_select(0, order).to(per_row.dtype))

    def row_sum(self, per_entry: Tensor, per_col: Tensor) -> Tensor:
        """out[n] = Σ_{entries i with row n} per_entry[i] · per_col[cols[i]]  -> (N, D)."""
        return Fn.embedding_bag(self.cols, per_col, self.row_offsets, mode="sum",
                                per_sample_weights=per_entry.to(per_col.dtype))  # autocast: codes may be bf16

    def take(self, dense: Tensor) -> Tensor:
        """The entries' values in a dense (N, F) matrix."""
        return dense.reshape(-1).take(self.flat)

    def dense(self, vals: Tensor) -> Tensor:
        z = vals.new_zeros(self.n_rows * self.n_cols)
        return z.scatter(0, self.flat, vals).view(self.n_rows, self.n_cols)


class SparseEncode(torch.autograd.Function):
    """Pre-activations at the selected entries, with gradient only through those entries."""

    @staticmethod
    def forward(ctx, xc, W_enc, b_enc, sp: Sparse, pre_sel):  # type: ignore[override]
        ctx.sp = sp
        ctx.save_for_backward(xc, W_enc)
        return pre_sel.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        xc, W_enc = ctx.saved_tensors
        sp: Sparse = ctx.sp
        g = g.contiguous()
        g_xc = sp.row_sum(g, W_enc) if ctx.needs_input_grad[0] else None
        g_W = sp.col_sum(g, xc) if ctx.needs_input_grad[1] else None
        g_b = g.new_zeros(sp.n_cols).index_add_(0, sp.cols, g) if ctx.needs_input_grad[2] else None
        return g_xc, g_W, g_b, None, None


class SparseDecode(torch.autograd.Function):
    """Σ_entries vals · W_dec[col] per row, without forming the dense code matrix."""

    @staticmethod
    def forward(ctx, vals, W_dec, sp: Sparse):  # type: ignore[override]
        ctx.sp = sp
        ctx.save_for_backward(vals, W_dec)
        return sp.row_sum(vals, W_dec)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        vals, W_dec = ctx.saved_tensors
        sp: Sparse = ctx.sp
        g = g.contiguous()
        g_vals = g_W = None
        if ctx.needs_input_grad[0]:
            # A dense (N, F) matmul then a gather beats a row gather of W_dec on CPU memory bandwidth.
            g_vals = sp.take(g @ W_dec.T)
        if ctx.needs_input_grad[1]:
            g_W = sp.col_sum(vals, g)
        return g_vals, g_W, None
