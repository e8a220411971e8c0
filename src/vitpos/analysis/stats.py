"""Uncertainty for accuracies and their differences: Wilson and paired-bootstrap 95 % intervals.

* ``wilson_interval(k, n)``: the Wilson score interval of a binomial proportion k / n (a plain
  accuracy on n independent images). Unlike the normal interval it stays inside [0, 1] and is not
  [1, 1] at k = n.
* ``bootstrap_means(x)``: resample images with replacement ``n_boot`` times and return the mean of
  every column of x (n_images, k) per resample, (n_boot, k). Each resample's draws are turned
  into counts per image, so its mean is counts @ x / n: one matrix product per chunk of
  resamples, memory bounded by the chunk whatever n_boot. Seeded: the same x, n_boot
  and seed give the same numbers on every machine.
* ``percentile_interval(samples)``: the 2.5 / 97.5 % percentiles of bootstrap samples.
* ``paired_bootstrap_diff(a, b)``: the interval of mean(a) - mean(b) when a and b were measured on
  the same images (clean vs intervened): images are resampled, and both means recomputed on the
  same resample, so per-image correlation is kept. Identical vectors give [0, 0]. Each of a, b is
  (n,) or (S, n): an (S, n) input (S seeds of the same images) is first averaged over seeds per
  image, so the statistic is the mean over seeds and the bootstrap is over images.

* ``paired_ratio_interval(num, den)``: the interval of mean(num) / mean(den) on the same images (e.g.
  an edit's drop over the APE-table shuffle's drop: the position budget), both means on one resample.

* ``hierarchical_means(groups)``: a two-stage bootstrap over SAE training seeds x images (issue 48):
  each resample draws as many seeds as there are, with replacement, then for every drawn seed its
  images with replacement (a fresh draw each time a seed is drawn again), and averages the per-seed
  column means over the drawn seeds. `groups[s]` is one seed's (n_s, k) per-image values; its k
  columns (the variants of that seed: an effect and its null) share every image resample, so they stay
  paired. `hierarchical_interval` is the percentile interval of one column; the point value is
  `pooled_mean` (the mean over seeds of each seed's image mean). With one
  seed it is the image bootstrap; with few seeds the seed level is coarse (3 seeds: at most 10
  distinct seed multisets), so where the seeds' spread dominates it covers less than 95 %.

* ``seed_interval(values)``: the mean over independently trained models (seeds) of one number and
  its Student-t interval (n - 1 degrees of freedom): with 3 seeds it is wide, as it should be.

Everything returns plain floats, [lo, hi] (JSON-ready).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vitpos.errors import VitposError

N_BOOT = 2000
LEVEL = 0.95
SEED = 0
_CHUNK_CELLS = 1 << 22  # resamples x images per chunk of counts


def _z(level: float) -> float:
    if not 0 < level < 1:
        raise VitposError(f"level must be in (0, 1), got {level}")
    return math.sqrt(2) * float(torch.special.erfinv(torch.tensor(level, dtype=torch.float64)))


def wilson_interval(k: float, n: int, level: float = LEVEL) -> list[float]:
    """Wilson score interval [lo, hi] of a proportion with k successes in n trials."""
    if n <= 0:
        raise VitposError(f"a binomial interval needs n >= 1 trials, got {n}")
    if not 0 <= k <= n:
        raise VitposError(f"successes must lie in [0, n={n}], got {k}")
    z = _z(level)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)  # exact ends: no float dust at k = 0 or k = n
    hi = 1.0 if k == n else min(1.0, centre + half)
    return [lo, hi]


def accuracy_interval(correct: torch.Tensor, level: float = LEVEL) -> list[float]:
    """Wilson interval of the accuracy of a boolean (or 0/1) per-image correctness vector."""
    c = torch.as_tensor(correct).reshape(-1)
    return wilson_interval(float(c.float().sum()), int(c.numel()), level)


def _as_images(x: torch.Tensor) -> torch.Tensor:
    """(n,) or (S, n) -> (n,) float64 per-image values (mean over seeds)."""
    x = torch.as_tensor(x).double()
    if x.ndim == 2:
        return x.mean(0)
    if x.ndim != 1:
        raise VitposError(f"expected per-image values (n,) or (seeds, n), got shape {tuple(x.shape)}")
    return x


def _resampled_means(x: torch.Tensor, b: int, g: torch.Generator) -> torch.Tensor:
    """(b, k) column means of x (n, k) over b resamples of its rows, drawn with replacement."""
    n = x.shape[0]
    idx = torch.randint(0, n, (b, n), generator=g)  # (b, n) image indices
    counts = torch.zeros(b, n, dtype=torch.float64).scatter_add_(1, idx, torch.ones(b, n, dtype=torch.float64))
    return counts @ x / n


def bootstrap_means(x: torch.Tensor, n_boot: int = N_BOOT, seed: int = SEED) -> torch.Tensor:
    """(n_boot, k) means of the columns of x (n, k) (or (n,) -> (n_boot,)) over resampled rows."""
    x = torch.as_tensor(x).double()
    flat = x.ndim == 1
    x2 = x.unsqueeze(1) if flat else x.reshape(x.shape[0], -1)
    n = x2.shape[0]
    if n == 0:
        raise VitposError("cannot bootstrap zero images")
    if n_boot < 1:
        raise VitposError(f"n_boot must be >= 1, got {n_boot}")
    g = torch.Generator().manual_seed(int(seed))
    step = max(1, _CHUNK_CELLS // n)
    out = []
    for start in range(0, n_boot, step):
        b = min(step, n_boot - start)
        out.append(_resampled_means(x2, b, g))
    means = torch.cat(out)
    return means.squeeze(1) if flat else means


def percentile_interval(samples: torch.Tensor, level: float = LEVEL) -> list[float] | None:
    """[lo, hi] percentiles of bootstrap samples (non-finite samples dropped; None if fewer than
    half are finite: the statistic is then undefined too often to bound)."""
    s = torch.as_tensor(samples).double().reshape(-1)
    s = s[torch.isfinite(s)]
    if s.numel() == 0 or 2 * s.numel() < torch.as_tensor(samples).numel():
        return None
    a = (1 - level) / 2
    q = torch.quantile(s, torch.tensor([a, 1 - a], dtype=torch.float64))
    return [float(q[0]), float(q[1])]


def bootstrap_mean_interval(x: torch.Tensor, n_boot: int = N_BOOT, seed: int = SEED,
                            level: float = LEVEL) -> list[float]:
    """Percentile interval of the mean over images of per-image values x ((n,) or (seeds, n))."""
    iv = percentile_interval(bootstrap_means(_as_images(x), n_boot, seed), level)
    assert iv is not None  # means of finite values are finite
    return iv


def paired_bootstrap_diff(a: torch.Tensor, b: torch.Tensor, n_boot: int = N_BOOT, seed: int = SEED,
                          level: float = LEVEL) -> list[float]:
    """Interval of mean(a) - mean(b), a and b per-image values on the SAME images ((n,) or (seeds, n))."""
    a, b = _as_images(a), _as_images(b)
    if a.shape != b.shape:
        raise VitposError(f"a paired bootstrap needs the same images on both sides, got {a.numel()} and {b.numel()}")
    return bootstrap_mean_interval(a - b, n_boot, seed, level)


def paired_ratio_interval(num: torch.Tensor, den: torch.Tensor, n_boot: int = N_BOOT, seed: int = SEED,
                          level: float = LEVEL) -> list[float] | None:
    """Interval of mean(num) / mean(den), num and den per-image values on the SAME images ((n,) or (S, n)):
    images are resampled and both means recomputed on that resample. A resample whose mean(den) is <= 0
    has no ratio and is left out (None when that is more than half of them): call it where den's own
    interval lies above 0, so that at most (1 - level) / 2 of the resamples are left out."""
    num, den = _as_images(num), _as_images(den)
    if num.shape != den.shape:
        raise VitposError(f"a paired ratio needs the same images on both sides, got {num.numel()} and {den.numel()}")
    means = bootstrap_means(torch.stack([num, den], dim=1), n_boot, seed)  # (n_boot, 2), one resample per row
    ratio = torch.where(means[:, 1] > 0, means[:, 0] / means[:, 1].clamp_min(1e-300), torch.nan)
    return percentile_interval(ratio, level)


def seed_interval(values: list[float], level: float = LEVEL) -> tuple[float, list[float] | None]:
    """(mean, Student-t interval of the mean) over seeds; the interval is None for one seed."""
    from scipy.stats import t as student_t  # the t quantile: scipy's, not a re-typed series

    if not values:
        raise VitposError("no values to summarise over seeds")
    x = torch.tensor(values, dtype=torch.float64)
    mean = float(x.mean())
    if len(values) < 2:
        return mean, None
    half = float(student_t.ppf((1 + level) / 2, len(values) - 1)) * float(x.std(unbiased=True)) / math.sqrt(len(values))
    return mean, [mean - half, mean + half]


def _groups(groups: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per seed (n_s, k) float64 per-image values ((n_s,) -> (n_s, 1))."""
    out = [torch.as_tensor(x).double() for x in groups]
    out = [x.unsqueeze(1) if x.ndim == 1 else x for x in out]
    if not out:
        raise VitposError("a hierarchical bootstrap needs at least one seed")
    if any(x.ndim != 2 or x.shape[0] == 0 for x in out) or len({x.shape[1] for x in out}) != 1:
        raise VitposError("a hierarchical bootstrap needs per seed (images, k) values with images >= 1 and one k, got "
                          + ", ".join(str(tuple(x.shape)) for x in out))
    return out


def pooled_mean(groups: Sequence[torch.Tensor]) -> torch.Tensor:
    """(k,) the mean over seeds of each seed's mean over its images (each seed weighs the same)."""
    return torch.stack([x.mean(0) for x in _groups(groups)]).mean(0)


def hierarchical_means(groups: Sequence[torch.Tensor], n_boot: int = N_BOOT, seed: int = SEED) -> torch.Tensor:
    """(n_boot, k) resampled pooled means: per resample, S seeds drawn with replacement from the S of
    `groups` (per seed (n_s, k) or (n_s,) per-image values), then each drawn seed's images drawn with
    replacement; the mean over the drawn seeds of their resampled column means. The columns of one
    seed share its image draws (paired)."""
    xs = _groups(groups)
    if n_boot < 1:
        raise VitposError(f"n_boot must be >= 1, got {n_boot}")
    S, k = len(xs), xs[0].shape[1]
    g = torch.Generator().manual_seed(int(seed))
    which = torch.randint(0, S, (n_boot, S), generator=g)  # the seed level: which seed fills each slot
    total = torch.zeros(n_boot, k, dtype=torch.float64)
    for s, x in enumerate(xs):
        slots = (which == s).nonzero()  # (draws of seed s, 2): resample index, slot
        n = x.shape[0]
        step = max(1, _CHUNK_CELLS // n)
        for start in range(0, slots.shape[0], step):  # the image level: a fresh resample per draw
            part = slots[start:start + step]
            total.index_add_(0, part[:, 0], _resampled_means(x, part.shape[0], g))
    return total / S


def hierarchical_interval(groups: Sequence[torch.Tensor], column: int = 0, n_boot: int = N_BOOT, seed: int = SEED,
                          level: float = LEVEL) -> list[float] | None:
    """Percentile interval of one column's pooled mean under `hierarchical_means` (seeds x images)."""
    return percentile_interval(hierarchical_means(groups, n_boot, seed)[:, column], level)


def scaled(iv: list[float] | None, factor: float) -> list[float] | None:
    """An interval times a positive factor (e.g. fractions -> points)."""
    return None if iv is None else [factor * iv[0], factor * iv[1]]


__all__ = ["LEVEL", "N_BOOT", "accuracy_interval", "bootstrap_mean_interval", "bootstrap_means",
           "hierarchical_interval", "hierarchical_means", "paired_bootstrap_diff", "paired_ratio_interval",
           "percentile_interval", "pooled_mean", "scaled", "seed_interval", "wilson_interval"]
