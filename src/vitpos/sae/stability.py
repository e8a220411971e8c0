"""Seed stability of SAEs: how many latents two SAEs trained with different seeds share.

Two SAEs of the same size are matched one-to-one by their decoder directions (rows of ``W_dec``,
unit norm): the assignment maximising the summed cosine (Hungarian, scipy's
``linear_sum_assignment``). A latent is *stable* when its match has cosine >= a threshold; the
threshold is ours, so the fraction is reported over a grid of thresholds (its sensitivity curve).
For the positional feature sets, ``set_agreement`` is the fraction of one SAE's row (col) latents
whose match in the other is also a row (col) latent.

(Written for issue 28's DINOv2 run; a `stability` metric in sae.json from issue 32 may supersede it:
the matching is the standard one, so the two should agree on the same pair of SAEs.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from pydantic import BaseModel

COS_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)
DEFAULT_COS = 0.7


class SeedMatch(BaseModel):
    """One pair of SAEs (same size, different seeds) matched by decoder direction."""

    seeds: tuple[int, int]
    d_sae: int
    mean_cos: float  # mean matched cosine over all latents
    median_cos: float
    stable_frac: dict[str, float]  # cosine threshold -> fraction of latents whose match reaches it
    row_agreement: float | None = None  # fraction of A's row latents matched to a row latent of B
    col_agreement: float | None = None


def decoder_cosines(w_a: torch.Tensor, w_b: torch.Tensor) -> torch.Tensor:
    """(F_a, F_b) cosine between decoder rows."""
    a = torch.nn.functional.normalize(w_a.detach().double(), dim=1)
    b = torch.nn.functional.normalize(w_b.detach().double(), dim=1)
    return a @ b.T


def match_decoders(w_a: torch.Tensor, w_b: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(match, cos): match[i] is B's latent assigned to A's latent i (one-to-one, max summed cosine),
    cos[i] their cosine."""
    from scipy.optimize import linear_sum_assignment

    cos = decoder_cosines(w_a, w_b).numpy()
    rows, cols = linear_sum_assignment(cos, maximize=True)
    match = np.full(cos.shape[0], -1, dtype=np.int64)
    match[rows] = cols
    return match, cos[rows, cols][np.argsort(rows)]


def _agreement(ids_a: Sequence[int] | None, ids_b: Sequence[int] | None, match: np.ndarray) -> float | None:
    if ids_a is None or ids_b is None or not len(ids_a):
        return None
    in_b = set(int(i) for i in ids_b)
    return float(np.mean([int(match[i]) in in_b for i in ids_a]))


def seed_match(w_a: torch.Tensor, w_b: torch.Tensor, seeds: tuple[int, int], *,
               rows: tuple[Sequence[int], Sequence[int]] | None = None,
               cols: tuple[Sequence[int], Sequence[int]] | None = None,
               thresholds: Sequence[float] = COS_THRESHOLDS) -> SeedMatch:
    """Match two decoders (W_dec of each SAE, (F, D)) and summarise; rows / cols: each SAE's row
    (col) feature ids, for the set agreement."""
    match, cos = match_decoders(w_a, w_b)
    return SeedMatch(
        seeds=seeds, d_sae=int(w_a.shape[0]), mean_cos=float(cos.mean()), median_cos=float(np.median(cos)),
        stable_frac={f"{t:g}": float((cos >= t).mean()) for t in thresholds},
        row_agreement=_agreement(*(rows or (None, None)), match),
        col_agreement=_agreement(*(cols or (None, None)), match),
    )


__all__ = ["COS_THRESHOLDS", "DEFAULT_COS", "SeedMatch", "decoder_cosines", "match_decoders", "seed_match"]
