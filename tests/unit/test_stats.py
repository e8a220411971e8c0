"""analysis/stats.py: the intervals cover what they claim to, and are exact where they must be."""

from __future__ import annotations

import pytest
import torch

from vitpos.analysis.stats import (
    accuracy_interval,
    bootstrap_mean_interval,
    bootstrap_means,
    hierarchical_interval,
    hierarchical_means,
    paired_bootstrap_diff,
    percentile_interval,
    pooled_mean,
    wilson_interval,
)
from vitpos.errors import VitposError

TRIALS = 100


def _covers(iv, truth) -> bool:
    return iv[0] <= truth <= iv[1]


def test_wilson_covers_a_binomial_proportion():
    g = torch.Generator().manual_seed(0)
    p, n = 0.83, 150
    hits = sum(_covers(accuracy_interval(torch.rand(n, generator=g) < p), p) for _ in range(TRIALS))
    assert hits >= 93


def test_bootstrap_mean_covers_a_binomial_proportion():
    g = torch.Generator().manual_seed(1)
    p, n = 0.3, 300
    hits = sum(_covers(bootstrap_mean_interval((torch.rand(n, generator=g) < p).float(), n_boot=1000, seed=t), p)
               for t in range(TRIALS))
    assert hits >= 93


def test_paired_bootstrap_covers_a_difference_of_accuracies():
    """Clean correct with p = 0.9; the intervention flips a correct image to wrong with q = 0.2
    (and never the reverse): the true drop is 0.9 * 0.2 = 0.18."""
    g = torch.Generator().manual_seed(2)
    n, p, q = 400, 0.9, 0.2
    hits = 0
    for t in range(TRIALS):
        clean = torch.rand(n, generator=g) < p
        hurt = clean & ~(torch.rand(n, generator=g) < q)
        hits += _covers(paired_bootstrap_diff(clean.float(), hurt.float(), n_boot=1000, seed=t), p * q)
    assert hits >= 93


def test_paired_bootstrap_of_identical_vectors_is_zero():
    x = (torch.rand(3, 50, generator=torch.Generator().manual_seed(3)) < 0.5).float()
    assert paired_bootstrap_diff(x, x) == [0.0, 0.0]
    assert paired_bootstrap_diff(x[0], x[0]) == [0.0, 0.0]


def test_seeds_are_pooled_per_image_and_the_point_lies_inside():
    g = torch.Generator().manual_seed(4)
    base = (torch.rand(200, generator=g) < 0.9).float()
    per_seed = (torch.rand(3, 200, generator=g) < 0.6).float()
    iv = paired_bootstrap_diff(base, per_seed)
    assert iv == pytest.approx(paired_bootstrap_diff(base, per_seed.mean(0)))  # (S, n) = its mean over seeds
    assert iv[0] < float(base.mean() - per_seed.mean()) < iv[1]
    assert iv == paired_bootstrap_diff(base, per_seed)  # seeded: reproducible


def test_bootstrap_means_columns_and_chunks_agree():
    x = torch.rand(37, 2, generator=torch.Generator().manual_seed(5))
    m = bootstrap_means(x, n_boot=50, seed=7)
    assert m.shape == (50, 2)
    assert torch.allclose(bootstrap_means(x[:, 0], n_boot=50, seed=7), m[:, 0])


def test_wilson_edges_and_errors():
    lo, hi = wilson_interval(500, 500)
    assert hi == 1.0 and 0.99 < lo < 1.0
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(300, 300)[1] == 1.0
    with pytest.raises(VitposError):
        wilson_interval(3, 0)
    with pytest.raises(VitposError):
        paired_bootstrap_diff(torch.ones(3), torch.ones(4))
    assert percentile_interval(torch.tensor([float("nan")] * 3 + [1.0])) is None


def test_sae_causal_intervals_from_per_image_accuracies():
    from vitpos.experiments.sae_causal import selectivity_intervals

    g = torch.Generator().manual_seed(6)
    clean = {a: 0.9 + 0.1 * torch.rand(3, 40, generator=g) for a in ("row", "col")}
    same = selectivity_intervals(clean, clean, "row")
    assert same["row_drop_ci95"] == same["col_drop_ci95"] == [0.0, 0.0] and same["selectivity_ci95"] is None
    only_row = {"row": clean["row"] - 0.5, "col": clean["col"]}  # the row probe drops by 0.5 on every image
    iv = selectivity_intervals(clean, only_row, "row")
    assert iv["row_drop_ci95"] == pytest.approx([0.5, 0.5]) and iv["selectivity_ci95"] == pytest.approx([1.0, 1.0])
    assert selectivity_intervals(clean, only_row, "col")["selectivity_ci95"] == pytest.approx([0.0, 0.0])


def test_head_drop_intervals_are_the_per_head_paired_bootstrap():
    """rope_heads' grid of drop intervals (one resample set for every head) equals the paired
    bootstrap of each head alone, and the primary's margin against a head is the paired interval of
    their two ablated runs; an identical head has margin [0, 0]."""
    from vitpos.analysis.stats import paired_bootstrap_diff
    from vitpos.experiments.rope_heads_ablation import HeadDrops

    g = torch.Generator().manual_seed(3)
    clean = torch.rand(300, generator=g) < 0.9
    ablated = torch.rand(2, 3, 300, generator=g) < torch.tensor([0.8, 0.5, 0.85]).view(1, 3, 1)
    ablated[1, 2] = ablated[0, 1]
    m = HeadDrops(clean, ablated)
    grid = m.drop_intervals()
    margins = m.margin_intervals((0, 1))
    for li in range(2):
        for h in range(3):
            want = paired_bootstrap_diff(clean.double(), ablated[li, h].double())
            assert grid[li][h] == pytest.approx([100 * want[0], 100 * want[1]], abs=1e-9)
            assert grid[li][h][0] <= m.drops()[li][h] <= grid[li][h][1]
            if (li, h) != (0, 1):
                w = paired_bootstrap_diff(ablated[li, h].double(), ablated[0, 1].double())
                assert margins[li][h] == pytest.approx([100 * w[0], 100 * w[1]], abs=1e-9)
    assert margins[0][1] is None
    assert margins[1][2] == [0.0, 0.0]
    assert margins[0][0][0] > 0  # head (0, 0) loses far less than the primary


def test_seed_interval_is_the_t_interval_and_covers():
    """Three seeds: mean ± t(0.975, 2) s / √3 (t = 4.303); it covers the true mean of normal draws
    in about 95 % of trials (>= 90 of 100 here), and one seed has no interval."""
    from vitpos.analysis.stats import seed_interval

    mean, iv = seed_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and iv is not None
    assert iv == pytest.approx([2.0 - 4.302653 / 3 ** 0.5, 2.0 + 4.302653 / 3 ** 0.5], abs=1e-5)
    assert seed_interval([0.4]) == (0.4, None)
    g = torch.Generator().manual_seed(0)
    hits = 0
    for _ in range(100):
        m, ci = seed_interval((5.0 + torch.randn(3, generator=g)).tolist())
        assert ci is not None
        hits += ci[0] <= 5.0 <= ci[1]
    assert hits >= 90


def _seeded_sample(g: torch.Generator, seeds: int, images: int, offset_sd: float) -> list[torch.Tensor]:
    """Per SAE seed, per-image values (images, 2): a drop with a per-seed offset (which latents the seed
    finds) and image noise, and a null column sharing the seed's offset (paired: the same SAE's null)."""
    out = []
    for _ in range(seeds):
        off = offset_sd * float(torch.randn(1, generator=g))
        noise = torch.randn(images, generator=g)
        out.append(torch.stack([1.0 + off + noise, off + 0.5 * noise], 1))
    return out


def test_hierarchical_interval_covers_where_seed_offsets_make_the_image_interval_under_cover():
    """Per-seed offsets (sd 1) dwarf the image noise of a seed's mean (1 / sqrt(50)): the image-only
    interval over the pooled images misses the true mean most of the time (27 of 100 here), the seeds x
    images one covers at about 95 % (90 of 100 at 20 seeds; a percentile bootstrap over 20 clusters is a
    little short of nominal). Dropping the seed level (images resampled per seed, seeds fixed) gives ~40."""
    g = torch.Generator().manual_seed(48)
    trials, hier, flat = 100, 0, 0
    for t in range(trials):
        groups = _seeded_sample(g, seeds=20, images=50, offset_sd=1.0)
        hier += _covers(hierarchical_interval(groups, 0, n_boot=500, seed=t), 1.0)
        flat += _covers(bootstrap_mean_interval(torch.cat([x[:, 0] for x in groups]), n_boot=500, seed=t), 1.0)
    assert hier >= 86, hier
    assert flat <= 40, flat


def test_hierarchical_interval_has_a_seed_level():
    """Seeds that differ but whose images do not: an image-only bootstrap would give a point; the seed
    level gives the seeds' spread (between the smallest and the largest seed value)."""
    groups = [torch.full((30,), v) for v in (1.0, 2.0, 4.0)]
    iv = hierarchical_interval(groups, n_boot=1000)
    assert iv is not None and iv[0] < 2.0 < iv[1] and 1.0 <= iv[0] and iv[1] <= 4.0
    assert float(pooled_mean(groups)[0]) == pytest.approx(7.0 / 3)


def test_hierarchical_columns_stay_paired_and_one_seed_is_the_image_bootstrap():
    g = torch.Generator().manual_seed(3)
    groups = _seeded_sample(g, seeds=3, images=40, offset_sd=2.0)
    diff = [torch.stack([x[:, 0] - x[:, 1], x[:, 1]], 1) for x in groups]  # effect - null: the offset cancels
    m = hierarchical_means(diff, n_boot=400)
    assert m.shape == (400, 2)
    # the difference column's spread is the image noise's (sd 0.5 / sqrt(40) per seed), not the offsets'
    assert float(m[:, 0].std()) < 0.2 < float(m[:, 1].std())
    one = hierarchical_interval(groups[:1], 0, n_boot=2000)
    img = bootstrap_mean_interval(groups[0][:, 0], n_boot=2000)
    assert one is not None and abs(one[0] - img[0]) < 0.1 and abs(one[1] - img[1]) < 0.1
    assert hierarchical_interval([x[:, 1] - x[:, 1] for x in groups]) == [0.0, 0.0]  # an edit equal to its null
    with pytest.raises(VitposError):
        hierarchical_means([torch.zeros(3, 2), torch.zeros(3, 1)])
    with pytest.raises(VitposError):
        hierarchical_means([])


def test_a_removal_pooled_over_sae_seeds_is_the_mean_of_the_seeds_with_a_seeds_x_images_interval():
    """C1's pooling (issue 48): per seed the probe drops (images, row / col); the pooled drop is the mean over
    seeds of each seed's mean, the selectivity that of the pooled drops, and the interval spans the seeds'
    spread; a seed whose set is empty removes nothing (zeros, as causal_check keeps it)."""
    from vitpos.experiments.sae_causal import RemovalImages, pool_removal
    from vitpos.results.sae_run import CausalCheck

    g = torch.Generator().manual_seed(5)
    keeps = []
    for row in (0.30, 0.10, 0.0):  # seed 2 found no row feature: its removal is the identity
        probe = torch.stack([row + (0.01 * torch.randn(60, generator=g) if row else torch.zeros(60)),
                             torch.zeros(60)], 1)
        keeps.append({"ablate_row": RemovalImages(probe.double(), torch.full((50,), row).double())})
    check = {"layers": [1], "clean_row_acc": [0.9], "clean_col_acc": [0.9],
             "ablate_col": {"skipped": "no col features"}}
    eff = {"row_acc": [0.6], "col_acc": [0.9], "col_drop": 0.0, "row_drop_ci95": None, "col_drop_ci95": None,
           "selectivity": 1.0, "selectivity_ci95": None}
    checks = [CausalCheck.model_validate({**check, "ablate_row": {**eff, "row_drop": r, "top1_drop": 100 * r}})
              for r in (0.30, 0.10)] + [CausalCheck.model_validate({**check, "ablate_row": {"skipped": "no row"}})]
    p = pool_removal("ablate_row", "row", checks, keeps)
    assert p is not None
    want = float(pooled_mean([k["ablate_row"].probe for k in keeps])[0])
    assert p.row_drop == pytest.approx(want) and want == pytest.approx(0.4 / 3, abs=0.01)
    assert p.selectivity == pytest.approx(1.0) and p.top1_drop == pytest.approx(100 * 0.4 / 3)
    assert p.row_drop_ci95 is not None and p.row_drop_ci95[0] < 0.05 < 0.25 < p.row_drop_ci95[1]  # the seeds' spread
    assert p.per_seed_row_drop == [0.30, 0.10, 0.0] and p.per_seed_selectivity == [1.0, 1.0, None]
    assert pool_removal("ablate_col", "col", checks, keeps) is None  # not kept on every seed: not pooled
