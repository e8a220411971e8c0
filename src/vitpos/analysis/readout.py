"""Position read-outs beside the linear probes (issue 29): a small MLP probe of absolute row /
column, and pairwise relative-position probes (the row offset Δrow and column offset Δcol of two
patch tokens of one image, from their concatenated states). RoPE carries relative position, and a
probe of higher capacity shows whether information a linear probe misses is removed or only
not linearly readable.

Every read-out trains on the tokens of the first images and tests on the others (an image split:
the same test images under every condition, so differences pair image by image), with standardised
features and a seeded full-batch Adam fit: `hidden=None` is a multinomial linear probe, `hidden=k`
a one-hidden-layer ReLU MLP of width k. Per-image accuracy on the test images is what the
intervals resample.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

HIDDEN = 64  # MLP probe width
STEPS = 100  # full-batch Adam steps
LR = 3e-2
WEIGHT_DECAY = 1e-4
PAIRS_PER_IMAGE = 32  # token pairs drawn per image for the relative-position probes
TRAIN_SHARE = 0.75  # images in the read-outs' training split
TARGETS = ("row", "col", "drow", "dcol")
KINDS = ("linear", "mlp")


def fit_predict(x_tr: torch.Tensor, y_tr: torch.Tensor, x_te: torch.Tensor, classes: int, hidden: int | None,
                seed: int = 0) -> torch.Tensor:
    """Predicted classes of x_te from a probe fitted on (x_tr, y_tr): standardised with the training
    mean / std; linear (hidden=None) or one hidden ReLU layer; seeded, the global RNG untouched."""
    mean, std = x_tr.mean(0), x_tr.std(0).clamp_min(1e-6)
    xs, xt = (x_tr - mean) / std, (x_te - mean) / std
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        d = xs.shape[1]
        model: nn.Module = nn.Linear(d, classes) if hidden is None else nn.Sequential(
            nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        with torch.enable_grad():
            for _ in range(STEPS):
                opt.zero_grad()
                nn.functional.cross_entropy(model(xs), y_tr).backward()
                opt.step()
        with torch.no_grad():
            return model(xt).argmax(-1)


def pair_index(n_images: int, n_patches: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_images, PAIRS_PER_IMAGE) token indices i and j of the pairs drawn in each image (i != j)."""
    g = torch.Generator().manual_seed(seed)
    i = torch.randint(0, n_patches, (n_images, PAIRS_PER_IMAGE), generator=g)
    j = (i + torch.randint(1, n_patches, (n_images, PAIRS_PER_IMAGE), generator=g)) % n_patches
    return i, j


def readouts(tokens: torch.Tensor, grid: Sequence[int], seed: int = 0,
             kinds: Sequence[str] = KINDS) -> dict[str, dict[str, torch.Tensor]]:
    """Per kind (linear / mlp) and target (row, col, drow, dcol) each test image's accuracy.

    tokens: (n_images, H*W, D) patch tokens of one layer. Absolute targets read each token;
    relative ones read [x_i, x_j] of PAIRS_PER_IMAGE drawn pairs per image (Δrow = r_i - r_j,
    shifted to a class index)."""
    H, W = int(grid[0]), int(grid[1])
    n, N, _ = tokens.shape
    n_tr = max(1, min(n - 1, round(TRAIN_SHARE * n)))
    x = tokens.float()
    pos = torch.arange(N)
    rows, cols = pos // W, pos % W
    i, j = pair_index(n, N, seed)
    pairs = torch.cat([torch.gather(x, 1, i.unsqueeze(-1).expand(-1, -1, x.shape[-1])),
                       torch.gather(x, 1, j.unsqueeze(-1).expand(-1, -1, x.shape[-1]))], dim=-1)
    data = {"row": (x, rows.expand(n, N), H), "col": (x, cols.expand(n, N), W),
            "drow": (pairs, rows[i] - rows[j] + H - 1, 2 * H - 1),
            "dcol": (pairs, cols[i] - cols[j] + W - 1, 2 * W - 1)}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for kind in kinds:
        hidden = None if kind == "linear" else HIDDEN
        out[kind] = {}
        for t in TARGETS:
            feats, labels, classes = data[t]
            k = feats.shape[1]
            pred = fit_predict(feats[:n_tr].reshape(n_tr * k, -1), labels[:n_tr].reshape(-1),
                               feats[n_tr:].reshape((n - n_tr) * k, -1), classes, hidden, seed)
            out[kind][t] = (pred.reshape(n - n_tr, k) == labels[n_tr:]).double().mean(-1)
    return out


def chance(grid: Sequence[int], seed: int = 0, n_images: int = 64) -> dict[str, float]:
    """Each target's majority-class rate: 1/H, 1/W for absolute position; for offsets the share of
    the most frequent offset among drawn pairs (0 for uniform pairs: the most common offset)."""
    H, W = int(grid[0]), int(grid[1])
    N = H * W
    i, j = pair_index(n_images, N, seed)
    pos = torch.arange(N)
    out = {"row": 1 / H, "col": 1 / W}
    for t, coord in (("drow", pos // W), ("dcol", pos % W)):
        d = (coord[i] - coord[j]).reshape(-1)
        out[t] = float(torch.bincount(d - d.min()).max()) / d.numel()
    return out
