"""Issue 47 item 4: the sweep's site is chosen on half A of the permutation images and read on half B."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from conftest import TINY, toy_set
from vitpos.data.base import Selection
from vitpos.errors import VitposError
from vitpos.experiments.registry import LAYER_MEASURES
from vitpos.experiments.sae_sweep import SELECTION_VARIANTS, LayerMeasures, held_out_halves, run_sae_sweep
from vitpos.results.ape_permute import ApePermuteResult, VariantResult
from vitpos.results.sae_layers import HeldOutSplit, SAELayersResult, site_key


def test_the_halves_are_disjoint_cover_the_images_and_are_fixed_by_the_seed():
    for n in (2, 3, 40, 301):
        a, b = held_out_halves(n, 0)
        assert (a, b) == held_out_halves(n, 0)  # deterministic
        assert not set(a) & set(b) and sorted(a + b) == list(range(n))  # disjoint, every image once
        assert (len(a), len(b)) == (n // 2, n - n // 2) and a == sorted(a) and b == sorted(b)
    assert held_out_halves(40, 0) != held_out_halves(40, 1)  # the seed draws the split
    a, _ = held_out_halves(40, 0)
    assert a != list(range(20))  # a random half, not the first images
    with pytest.raises(VitposError, match="permute_images"):
        held_out_halves(1, 0)
    with pytest.raises(ValidationError, match="disjoint"):  # the result refuses halves that overlap
        HeldOutSplit(rule="r", seed=0, n_images=4, selection=[0, 1], verdict=[1, 2, 3])


def test_a_selection_yields_exactly_its_images():
    ds = toy_set(30)
    ids = [29, 3, 7, 0, 12]
    sel = Selection(ds, ids)
    xs, ys = zip(*sel.batches(2), strict=True)
    want_x, want_y = ds.batch(torch.tensor(ids))
    assert torch.equal(torch.cat(xs), want_x) and torch.equal(torch.cat(ys), want_y)
    assert len(sel) == 5 and sel.subset(2).ids == [29, 3] and sel.info == ds.info
    with pytest.raises(ValueError):
        Selection(ds, [30])


X, Y = "L1", "embed"  # half A's per-image drops favour X, half B's favour Y
B_DROP = {"embed": 77.0, "L0": 5.0, "L1": 11.0}  # what half B's permutation reports at each site (sentinels)


def _variant(drop: float) -> VariantResult:
    return VariantResult(top1=1 - drop / 100, top1_std=0.0, drop_points=drop, drop_std=0.0,
                         per_seed_top1=[1 - drop / 100], n_features=3, per_group={}, drop_ci95=[drop - 1, drop + 1])


@pytest.fixture(scope="module")
def held_out():
    """The sweep on a tiny depth-3 APE model, its permutation replaced by one whose per-image correctness says
    what each half shows: on half A every image drops at X and none elsewhere, on half B at Y only."""
    from vitpos.models.own import OwnViTConfig, build_own_vit
    from vitpos.models.spec import OwnSurface

    torch.manual_seed(0)
    cfg = OwnViTConfig(pe="ape", **{**TINY, "depth": 3})
    s = OwnSurface(build_own_vit(cfg).eval(), "tiny:ape3", cfg)
    calls: list[tuple[str, list[int], Any]] = []

    def permute(surface, sae, sae_doc: Mapping, *, data, keep_correct: dict[str, torch.Tensor], variants=None,
                **kw) -> ApePermuteResult:
        real = LAYER_MEASURES.run_ape_permute(surface, sae, sae_doc, data=data, keep_correct=keep_correct,
                                              variants=variants, **kw)
        key = site_key(int(sae_doc["layer"]), sae_doc.get("site", "resid_post"))
        selecting = variants == SELECTION_VARIANTS
        calls.append((key, list(data.ids), variants))
        n = len(data)
        favoured = key == (X if selecting else Y)
        keep_correct["baseline"] = torch.ones(n, dtype=torch.bool)
        keep_correct["all_positional"] = torch.full((1, n), not favoured)  # wrong on every image where favoured
        return real.model_copy(update={"all_positional": _variant(100.0 if selecting else B_DROP[key])})

    measures = LayerMeasures(**{**LAYER_MEASURES.__dict__, "run_ape_permute": permute})
    kw = {"k": 4, "expansion": 2, "n_train_images": 300, "n_eval_images": 40, "epochs": 1, "seed": 0,
          "keep_acts": False}
    sweep = run_sae_sweep(s, toy_set(300), measures, [0, 1], sae_kw=kw, permute_images=40, seeds=(0,), split_seed=3)
    return sweep, calls


def test_the_site_is_chosen_on_half_a_and_read_on_half_b(held_out):
    sweep, calls = held_out
    split = sweep.held_out
    assert split is not None and split.seed == 3 and split.n_images == 40
    assert (split.selection, split.verdict) == held_out_halves(40, 3)
    # each site: half A's all-positional permutation only, then half B's full one
    for key in sweep.sites:
        mine = [(ids, v) for k, ids, v in calls if k == key]
        assert mine == [(split.selection, SELECTION_VARIANTS), (split.verdict, None)]
    freq = {p.key: p.selection_frequency for p in sweep.points}
    assert freq == {"embed": 0.0, "L0": 0.0, X: 1.0}  # chosen by half A alone: half B favours Y
    assert sweep.selected_site == X and sweep.plausible_sites == [X]
    for p in sweep.points:  # the numbers read there are half B's
        assert p.permute is not None and p.permute.n_images == len(split.verdict) == 20
        assert p.all_positional_drop == B_DROP[p.key] and p.selection_drop == 100.0
        assert p.permute.data == "toy:train"  # the run's data named, not the half


def test_the_claims_and_report_say_where_the_site_was_chosen_and_read(held_out):
    from vitpos.claims.inputs import ClaimInputs
    from vitpos.claims.summary import summarise
    from vitpos.experiments.registry import BY_NAME
    from vitpos.report.sections import CLAIM_RULES

    sweep, _ = held_out
    res = SAELayersResult(**dict(sweep), sae_images=300, sae_eval_images=40, sae_epochs=1, sae_expansion=2,
                          sae_k=4, permute_images=40, seeds=[0])
    said = "site chosen on half A (20 images), read on half B (20 images)"
    html, line = BY_NAME["sae_layers"].section(res, CLAIM_RULES), BY_NAME["sae_layers"].summary(res, "C2")
    assert html is not None and line is not None
    assert said in html and "selecting drop (half A)" in html and said in line
    for c in summarise({"m": ClaimInputs(sae_layers=res)}).claims:
        if c.id == "C2":
            nums = c.numbers["m"]
            assert nums["headline_site"] == X and nums["plausible_sites"] == [X]
            assert (nums["selection_images"], nums["verdict_images"]) == (20, 20)
            assert said in nums["site_selection"] and said in c.details["m"]
            assert nums["all_positional_drop"] == pytest.approx(B_DROP[X])  # the headline: half B's number at X
    again = SAELayersResult.model_validate(res.to_json())  # results.json round trip keeps the halves
    assert again.held_out == res.held_out


def test_an_older_sweep_reads_as_chosen_and_read_on_the_same_images():
    old = SAELayersResult.model_validate({
        "model": "m", "data": "shapes", "layers": [0], "layer_rule": "every layer 0..0", "points": [
            {"layer": 0, "fvu": 0.1, "n_row": 1, "n_col": 1, "n_mixed": 0, "all_positional_drop": 3.0,
             "all_positional_drop_ci95": [1.0, 5.0], "swap_null_drop": 0.0, "selection_frequency": 1.0}],
        "selected_layer": 0, "plausible_layers": [0], "sae_images": 8, "sae_eval_images": 8, "sae_epochs": 1,
        "sae_expansion": 1, "sae_k": 1, "permute_images": 8, "seeds": [0]})
    assert old.held_out is None and old.points[0].selection_drop is None
    assert "same images" in old.selection_said()
