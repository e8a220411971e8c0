"""The adaptive top-1 race against the exhaustive sweep, on one model's exhaustive per-image results
(`HeadDrops`): does the race decide what C5 reads as the sweep does? Used by
scripts/compare_top1_screen.py and tests/unit/test_top1_screen_zoo.py (issue 33: the race is the
default only where it does)."""

from __future__ import annotations

from vitpos.claims.c5 import c5_outcome
from vitpos.experiments.rope_heads_ablation import HeadDrops


def largest(drops: list[list[float]]) -> tuple[int, int]:
    """(layer, head) of the largest drop."""
    return max(((v, li, h) for li, row in enumerate(drops) for h, v in enumerate(row)))[1:]


def compare(full: HeadDrops, cut: int) -> dict:
    """The screened race against the exhaustive sweep, with each head in turn kept as the primary (the
    race always keeps it): largest head, C5's outcome, every head's drop."""
    L, H, n = full.ablated.shape
    exact = full.drops()
    big = largest(exact)
    same_largest = same_c5 = 0
    race_sizes, diffs = [], []
    for p in [(li, h) for li in range(L) for h in range(H)]:
        s = full.raced(cut, [p])
        approx = s.drops()
        same_largest += largest(approx) == big
        same_c5 += c5_outcome(full.margin_intervals(p)) == c5_outcome(s.margin_intervals(p))
        race_sizes.append(sum(m == n for row in s.counts() for m in row))
        diffs += [abs(a - b) for ra, rb in zip(approx, exact, strict=True) for a, b in zip(ra, rb, strict=True)]
    # heads out of the race keep the screen's drop and interval: does that interval cover the full drop?
    s = full.raced(cut)
    ivs, out = s.drop_intervals(), [(li, h) for li in range(L) for h in range(H) if s.counts()[li][h] < n]
    covered = sum(ivs[li][h][0] <= exact[li][h] <= ivs[li][h][1] for li, h in out)
    return {"screen_images": cut, "same_largest": same_largest == L * H,
            "out_of_race_covered": f"{covered}/{len(out)}",
            "same_largest_for_primaries": f"{same_largest}/{L * H}", "c5_same_for_primaries": f"{same_c5}/{L * H}",
            "heads_in_race": [min(race_sizes), max(race_sizes)], "max_abs_drop_diff_points": max(diffs),
            "mean_abs_drop_diff_points": sum(diffs) / len(diffs)}
