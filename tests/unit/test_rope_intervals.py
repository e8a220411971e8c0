"""C3's removal fractions, C4's median recovery and the heads' axis index S with their bootstrap
intervals: the statistics the verdicts read, measured where the per-image numbers live."""

from __future__ import annotations

from statistics import median

import pytest
import torch
from test_experiments import planted_rope_model, toy_images

from vitpos.claims.inputs import ClaimInputs
from vitpos.claims.summary import summarise
from vitpos.experiments.rope_axis import kept_fraction_samples, median_samples, run_rope_axis
from vitpos.experiments.rope_heads_analysis import axis_index, axis_index_intervals
from vitpos.results.rope_axis import MIN_ABOVE_CHANCE, kept_fraction


@pytest.fixture(scope="module")
def planted():
    """test_experiments' planted toy RoPE model: position is decodable from the rotations alone."""
    return planted_rope_model()


def test_kept_fraction_uses_only_layers_above_chance():
    assert MIN_ABOVE_CHANCE == 0.05
    base, cond = [0.27, 0.5, 0.9], [0.9, 0.25, 0.5]  # layer 0 is 0.02 above chance: left out
    assert kept_fraction(base, cond, 0.25) == pytest.approx((0.0 + 0.25 / 0.65) / 2)
    assert kept_fraction([0.26], [0.9], 0.25) is None


class _Fit:
    def __init__(self, acc: torch.Tensor):
        self.acc = acc

    def per_image_acc(self, axis: str) -> torch.Tensor:
        return self.acc


def test_kept_fraction_samples_are_paired():
    """The same per-image accuracies under both conditions keep exactly 1 on every resample: the
    baseline and the condition are resampled together (unpaired resamples would scatter)."""
    g = torch.Generator().manual_seed(0)
    acc = {0: torch.rand(50, generator=g, dtype=torch.float64), 1: torch.rand(50, generator=g, dtype=torch.float64)}
    fits = {layer: _Fit(a) for layer, a in acc.items()}
    base_acc = [float(acc[0].mean()), float(acc[1].mean())]
    s = kept_fraction_samples(fits, fits, "row", base_acc, 0.1, [0, 1])
    assert s is not None and torch.allclose(s, torch.ones_like(s))
    half = {layer: _Fit(0.1 + 0.5 * (a - 0.1)) for layer, a in acc.items()}  # half the above-chance part
    s = kept_fraction_samples(fits, half, "row", base_acc, 0.1, [0, 1])
    assert s is not None and torch.allclose(s, torch.full_like(s, 0.5))


def test_median_samples_is_statistics_median_per_resample():
    g = torch.Generator().manual_seed(1)
    for k in (1, 2, 3, 4):
        xs = [torch.randn(7, generator=g, dtype=torch.float64) for _ in range(k)]
        got = median_samples(xs)
        assert got is not None
        want = torch.tensor([median([float(x[i]) for x in xs]) for i in range(7)], dtype=torch.float64)
        assert torch.allclose(got, want)
    xs = [torch.tensor([1.0, float("nan")]), torch.tensor([2.0, 3.0]), torch.tensor([0.0, 0.0])]
    got = median_samples(xs)
    assert got is not None and got[0] == 1.0 and got[1].isnan()  # an undefined Rec: an undefined median
    assert median_samples([]) is None and median_samples([torch.zeros(3), None]) is None


def test_rope_axis_intervals_cover_the_numbers_claims_compute(planted):
    res = run_rope_axis(planted, data=toy_images(120), n_images=120, restore_points=[1])
    doc = res.to_json()
    nums = next(c for c in summarise({"m": ClaimInputs(rope_axis=res)}).model_dump()["claims"] if c["id"] == "C3")
    nums = nums["numbers"]["m"]
    for a, b in (("row", "col"), ("col", "row")):
        rem = doc["removal"][f"no_{a}"]
        assert rem["removed"] == nums[f"no_{a}_{a}_removed"] and rem["kept"] == nums[f"no_{a}_{b}_kept"]
        assert rem["removed_ci95"] == nums[f"no_{a}_{a}_removed_ci95"]
        for key in ("removed", "kept"):
            lo, hi = rem[f"{key}_ci95"]
            assert lo - 1e-9 <= rem[key] <= hi + 1e-9
            assert hi - lo < 1  # a real interval, not a placeholder
        assert rem["removed_layers"] == rem["kept_layers"] == [0, 1]  # every layer of the planted model decodes
    assert doc["removal"]["no_row"]["removed_ci95"][1] > doc["removal"]["no_row"]["removed_ci95"][0]
    c4 = next(c for c in summarise({"m": ClaimInputs(rope_axis=res)}).model_dump()["claims"] if c["id"] == "C4")
    for a in ("row", "col"):
        med = doc["median_recovery"][a]
        assert med["median_rec"] == c4["numbers"]["m"][f"median_recovery_{a}"]
        assert med["restore_points"] == [1] and med["median_rec"] == doc["recovery"][a]["1"]["mean_rec"]
        assert med["median_rec_ci95"] == pytest.approx(doc["recovery"][a]["1"]["mean_rec_ci95"])  # one R: its own


def test_axis_index_interval_covers_the_point_and_shrinks_with_more_images(planted):
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(3, 4, 4, generator=g).repeat(1, 4, 4) + 0.6 * torch.rand(64, 3, 16, 16, generator=g))
    x = (x.clamp(0, 1) - 0.5) / 0.5
    widths = []
    for n in (8, 64):
        S, kl = axis_index(planted, x[:n])
        ci = kl["ci95"]
        assert len(ci) == len(S) and all(len(r) == len(c) for r, c in zip(S, ci, strict=True))
        for srow, crow in zip(S, ci, strict=True):
            for s, (lo, hi) in zip(srow, crow, strict=True):
                assert lo - 1e-6 <= s <= hi + 1e-6
        widths.append(sum(hi - lo for row in ci for lo, hi in row) / sum(len(r) for r in ci))
    assert widths[0] > 0 and widths[1] < 0.7 * widths[0], widths


def test_axis_index_intervals_of_identical_images_are_points():
    per_image = torch.tensor([[[[0.3, 0.1]], [[0.0, 0.2]]]], dtype=torch.float64).expand(5, 2, 1, 2)
    ci = axis_index_intervals(per_image)
    assert ci[0][0] == pytest.approx([0.5, 0.5]) and ci[1][0] == pytest.approx([-1.0, -1.0])


def test_an_undefined_median_recovery_is_null_not_nan(monkeypatch):
    """`--restore 1 --images 8` on builtin:rope-axial: no restore point had a mean Rec, and
    rope_axis.json held NaN for the medians; undefined is null (claims read it as missing)."""
    import json

    import vitpos.experiments.rope_axis as ra
    from vitpos.results.rope_axis import MedianRecovery, MedianShare

    none = {"mean_rec": None, "mean_share": None}
    monkeypatch.setattr(ra, "condition_recovery_samples", lambda *a, **k: (dict(none), None))
    monkeypatch.setattr(ra, "condition_rebuilt_share", lambda *a, **k: (dict(none), None))
    _, medians, _, shares = ra.recoveries({}, {}, [1, 2], [0, 1])
    for a in ("row", "col"):
        assert MedianRecovery(**medians[a]).median_rec is None and medians[a]["restore_points"] == []
        assert MedianShare(**shares[a]).median_share is None
    json.dumps([medians, shares], allow_nan=False)  # no NaN to write


def test_a_repeated_restore_point_is_refused_by_the_library_too(planted):
    from vitpos.errors import VitposError

    with pytest.raises(VitposError, match="R=1 twice"):
        run_rope_axis(planted, data=toy_images(8), n_images=8, restore_points=[1, 1])
