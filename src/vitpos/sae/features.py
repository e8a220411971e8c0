"""Positional feature discovery: which SAE latents encode a patch's row, column, or both.

For latent f over held-out patch tokens on an H×W grid (patch n sits at r = n // W, c = n % W):

* A_f(r, c)  = mean of z_f over the tokens at cell (r, c)          (``cell_means``)
* η²_row     = Var_r(mean_c A_f) / Var(z_f)
* η²_col     = Var_c(mean_r A_f) / Var(z_f)
* η²_pos     = Var_{r,c}(A_f)    / Var(z_f)                         (correlation ratio)

All variances are population variances over tokens. Every image contributes one token to
every cell, so cells (and rows, and columns) carry equal weight and plain means over them are
the token-weighted ones; with that balance η²_row + η²_col ≤ η²_pos ≤ 1 (the rest of η²_pos is
the row×col interaction). Everything is accumulated streaming in float64: per-cell sums (N, F)
and per-latent sums of squares, so memory does not grow with the number of images.

Conjunction latents (issue 47 item 3). A latent that fires for "this object at top-left" is silent on most
tokens, so its unconditional η²_pos is small (≈ the share of images where it fires) and it is typed
non-positional, yet it carries position the model can read. The second typing measures position dependence
*within the latent's content*: η² of position over the images in which the latent fires at all
(``eta2_pos_fired``; k_f of them, ``fire_images``), with the bias of a correlation ratio on few images removed.
Why this definition: an image in which the latent fires is one that holds the content it encodes, so
restricting to those images conditions on content without content labels (which a where-task's images do
not have per token); within them "content A wherever A is" spreads evenly over the cells (η² ≈ 0) and "A only
at p" sits at p (η² ≈ 1); a pure positional latent fires in every image and keeps its η²_pos. It is exact from
the same streaming sums: SAE codes are ReLU / TopK (z ≥ 0, 0 when silent), so the images where a latent never
fires add nothing to its sums and only the count of images differs (a k_f-image cell mean is the n-image one
times n / k_f). (Conditioning on the *tokens* where it fires would not do: a latent that fires only at p has
one position among those tokens and η² 0.) The bias: with k_f images of N cells, η² under no position effect is
≈ (N-1)/(k_f·N-1); ``eta2_pos_fired`` is the adjusted (epsilon-squared) ratio
ε² = η² − (1 − η²)(N − 1)/(k_f·N − N), clamped to [0, 1], and a latent needs ``min_conj_images`` images.

Types: ``conj_features`` are the live latents (firing in ≥ ``min_conj_images`` images) with ε² ≥
``min_eta2_conj`` that are not row / col / mixed; the existing typing is unchanged, and positional ∪
conjunction is the conjunction-inclusive positional set ape_permute permutes beside the positional one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from vitpos.errors import VitposError


@dataclass(frozen=True)
class FeatureThresholds:
    """A row feature: fire_rate ≥ min_fire_rate, η²_row ≥ min_eta2, η²_col ≤ max_other_eta2
    (columns mirrored). Mixed: fire_rate ≥ min_fire_rate, η²_pos ≥ min_eta2_pos, neither."""

    min_fire_rate: float = 0.005
    min_eta2: float = 0.3
    max_other_eta2: float = 0.05
    min_eta2_pos: float = 0.3
    # conjunction latents (issue 47 item 3, reported, no claim reads them): position dependence within the
    # images where the latent fires (bias-adjusted η², see the module docstring), on at least this many images
    min_eta2_conj: float = 0.3
    min_conj_images: int = 10


@dataclass
class FeatureScores:
    grid: tuple[int, int]
    n_images: int
    eta2_row: Tensor  # (F,)
    eta2_col: Tensor  # (F,)
    eta2_pos: Tensor  # (F,)
    fire_rate: Tensor  # (F,) fraction of tokens with z_f != 0
    cell_means: Tensor  # (F, H, W)
    fire_images: Tensor  # (F,) images in which latent f fires on at least one token
    eta2_pos_fired: Tensor  # (F,) bias-adjusted η² of position over those images (module docstring)
    thresholds: FeatureThresholds = field(default_factory=FeatureThresholds)
    row_features: list[int] = field(default_factory=list)  # sorted by η²_row, descending
    col_features: list[int] = field(default_factory=list)  # sorted by η²_col, descending
    mixed_features: list[int] = field(default_factory=list)  # sorted by η²_pos, descending
    conj_features: list[int] = field(default_factory=list)  # sorted by eta2_pos_fired, descending

    @property
    def n_features(self) -> int:
        return int(self.eta2_row.numel())

    def classify(self, thresholds: FeatureThresholds | None = None) -> None:
        """(Re)compute the row/col/mixed lists under ``thresholds``."""
        t = thresholds or self.thresholds
        self.thresholds = t
        live = self.fire_rate >= t.min_fire_rate
        row = live & (self.eta2_row >= t.min_eta2) & (self.eta2_col <= t.max_other_eta2)
        col = live & (self.eta2_col >= t.min_eta2) & (self.eta2_row <= t.max_other_eta2)
        mixed = live & (self.eta2_pos >= t.min_eta2_pos) & ~row & ~col
        self.row_features = _ranked(row, self.eta2_row)
        self.col_features = _ranked(col, self.eta2_col)
        self.mixed_features = _ranked(mixed, self.eta2_pos)
        conj = ((self.fire_images >= t.min_conj_images) & (self.eta2_pos_fired >= t.min_eta2_conj)
                & ~row & ~col & ~mixed)
        self.conj_features = _ranked(conj, self.eta2_pos_fired)

    def to_json(self, cell_means: str = "positional") -> dict[str, Any]:
        """JSON-ready dict. ``cell_means``: "positional" (maps of the row/col/mixed features
        only), "all", or "none"."""
        if cell_means not in ("positional", "all", "none"):
            raise VitposError(f"cell_means must be 'positional', 'all' or 'none', got {cell_means!r}")
        d: dict[str, Any] = {
            "grid": list(self.grid),
            "n_images": self.n_images,
            "n_features": self.n_features,
            "thresholds": asdict(self.thresholds),
            "row_features": self.row_features,
            "col_features": self.col_features,
            "mixed_features": self.mixed_features,
            "conj_features": self.conj_features,
            "eta2_row": self.eta2_row.tolist(),
            "eta2_col": self.eta2_col.tolist(),
            "eta2_pos": self.eta2_pos.tolist(),
            "fire_rate": self.fire_rate.tolist(),
            "fire_images": self.fire_images.tolist(),
            "eta2_pos_fired": self.eta2_pos_fired.tolist(),
        }
        if cell_means == "all":
            d["cell_means"] = self.cell_means.tolist()
        elif cell_means == "positional":
            ids = sorted(set(self.row_features) | set(self.col_features) | set(self.mixed_features))
            d["cell_means"] = {str(f): self.cell_means[f].tolist() for f in ids}
        return d


def _ranked(mask: Tensor, key: Tensor) -> list[int]:
    ids = mask.nonzero().squeeze(1)
    # Stable sort on -key keeps ties in id order, so lists are reproducible.
    order = torch.sort(-key[ids], stable=True).indices
    return ids[order].tolist()


def _check_grid(grid: tuple[int, int]) -> tuple[int, int]:
    try:
        H, W = (int(g) for g in grid)
    except (TypeError, ValueError) as e:
        raise VitposError(f"grid must be (rows, cols), got {grid!r}") from e
    if H < 1 or W < 1:
        raise VitposError(f"grid must have positive sides, got {grid!r}")
    return H, W


class _Accumulator:
    def __init__(self, N: int, F: int, device: torch.device):
        self.N, self.F = N, F
        self.cell_sum = torch.zeros(N, F, dtype=torch.float64, device=device)
        self.sum_sq = torch.zeros(F, dtype=torch.float64, device=device)
        self.fires = torch.zeros(F, dtype=torch.float64, device=device)
        self.fire_images = torch.zeros(F, dtype=torch.float64, device=device)
        self.n_images = 0

    def add(self, z: Tensor) -> None:
        zd = z.double()
        self.cell_sum += zd.sum(0)
        self.sum_sq += zd.pow(2).sum((0, 1))
        self.fires += (z != 0).sum((0, 1)).double()
        self.fire_images += (z != 0).any(1).sum(0).double()
        self.n_images += z.shape[0]


def score_codes(
    code_batches: Iterable[Tensor],
    grid: tuple[int, int],
    thresholds: FeatureThresholds | None = None,
) -> FeatureScores:
    """Score latents from batches of codes (B_images, N = H·W, F), patch tokens only."""
    H, W = _check_grid(grid)
    acc: _Accumulator | None = None
    for z in code_batches:
        z = torch.as_tensor(z)
        if z.ndim != 3 or z.shape[1] != H * W:
            raise VitposError(
                f"codes must be (images, {H * W} patches, features) for grid {H}x{W}, got {tuple(z.shape)}; "
                "pass patch tokens only (drop CLS/register tokens)"
            )
        if acc is None:
            acc = _Accumulator(H * W, z.shape[2], z.device)
        elif z.shape[2] != acc.F:
            raise VitposError(f"code batches disagree on the number of features ({z.shape[2]} vs {acc.F})")
        if z.shape[0]:
            acc.add(z.to(acc.cell_sum.device))
    if acc is None or acc.n_images == 0:
        raise VitposError("no held-out images to score SAE features on")
    return _finish(acc, (H, W), thresholds or FeatureThresholds())


def score_features(
    sae,
    activation_batches: Iterable[Tensor],
    grid: tuple[int, int],
    thresholds: FeatureThresholds | None = None,
) -> FeatureScores:
    """Encode batches of patch activations (B_images, N = H·W, D) with ``sae`` and score its latents."""
    H, W = _check_grid(grid)

    def codes():
        with torch.no_grad():
            for x in activation_batches:
                x = torch.as_tensor(x)
                if x.ndim != 3 or x.shape[1] != H * W:
                    raise VitposError(
                        f"activations must be (images, {H * W} patches, D) for grid {H}x{W}, got {tuple(x.shape)}; "
                        "pass patch tokens only (drop CLS/register tokens)"
                    )
                yield sae.encode(x)

    was_training = sae.training
    sae.eval()
    try:
        return score_codes(codes(), (H, W), thresholds)
    finally:
        sae.train(was_training)


def _finish(acc: _Accumulator, grid: tuple[int, int], thresholds: FeatureThresholds) -> FeatureScores:
    H, W = grid
    n_img = acc.n_images
    A = (acc.cell_sum / n_img).T.reshape(acc.F, H, W)  # cell means
    mean = A.mean((1, 2))  # equal cell weights = token mean
    var = (acc.sum_sq / (n_img * H * W) - mean.pow(2)).clamp_min(0)
    var_pos = A.var((1, 2), correction=0)
    var_row = A.mean(2).var(1, correction=0)
    var_col = A.mean(1).var(1, correction=0)
    # Latents that never vary (e.g. never fire) get η² = 0; the relative floor guards against
    # float64 cancellation making a constant latent look positional.
    ok = var > 1e-12 * (acc.sum_sq / (n_img * H * W)).clamp_min(1e-300)

    def ratio(v: Tensor) -> Tensor:
        return torch.where(ok, (v / var.where(ok, torch.ones_like(var))).clamp(0, 1), torch.zeros_like(v))

    scores = FeatureScores(
        grid=(H, W),
        n_images=n_img,
        eta2_row=ratio(var_row).float().cpu(),
        eta2_col=ratio(var_col).float().cpu(),
        eta2_pos=ratio(var_pos).float().cpu(),
        fire_rate=(acc.fires / (n_img * H * W)).float().cpu(),
        cell_means=A.float().cpu(),
        fire_images=acc.fire_images.float().cpu(),
        eta2_pos_fired=_eta2_fired(acc, H * W).float().cpu(),
        thresholds=thresholds,
    )
    scores.classify()
    return scores


def _eta2_fired(acc: _Accumulator, N: int) -> Tensor:
    """(F,) bias-adjusted η² of position over the images where each latent fires (module docstring): the
    cell means over k_f images are the accumulated sums / k_f (a silent image adds 0 to every sum). 0 where
    fewer than 2 images fire (no within-cell spread to adjust by) or the latent does not vary there."""
    k = acc.fire_images
    kk = k.clamp_min(1)
    A = acc.cell_sum.T / kk[:, None]  # (F, N) cell means over the firing images
    mean = A.mean(1)
    second = acc.sum_sq / (kk * N)
    var = (second - mean.pow(2)).clamp_min(0)
    ok = (k >= 2) & (var > 1e-12 * second.clamp_min(1e-300))
    eta = (A.var(1, correction=0) / var.where(ok, torch.ones_like(var))).clamp(0, 1)
    adj = eta - (1 - eta) * (N - 1) / (kk * N - N).clamp_min(1)
    return torch.where(ok, adj.clamp(0, 1), torch.zeros_like(adj))
