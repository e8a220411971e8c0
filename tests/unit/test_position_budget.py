"""The position budget (issue 47): an edit's share of the APE-table shuffle's effect on the same images,
its paired-bootstrap interval, and no share where the shuffle costs ~nothing; the positional subspace
edits; the sweep's schema change (older sweeps recomputed, and read as block outputs where loaded)."""

from __future__ import annotations

import pytest
import torch

from vitpos.experiments.ape_permute import budget_of
from vitpos.experiments.ape_permute_variants import permute_subspace, subspace_basis
from vitpos.results.ape_permute import MIN_SHUFFLE_DROP, position_budget, shuffle_undefined


def _correct(n: int, wrong: list[int]) -> torch.Tensor:
    c = torch.ones(n, dtype=torch.bool)
    c[wrong] = False
    return c


def test_the_share_is_the_ratio_of_the_drops_on_a_hand_built_case():
    n = 200
    base = _correct(n, list(range(10)))  # 95 % clean
    edit = torch.stack([_correct(n, list(range(40))), _correct(n, list(range(10)) + list(range(100, 130)))])
    shuffle = torch.stack([_correct(n, list(range(110))), _correct(n, list(range(90)))])
    # drops in points as the result reports them: clean top-1 - mean over seeds of the intervened top-1
    edit_drop = 100 * (0.95 - (160 + 160) / 2 / n)  # 15 pts
    shuffle_drop = 100 * (0.95 - (90 + 110) / 2 / n)  # 45 pts
    b = budget_of(base, edit, shuffle, edit_drop, shuffle_drop, [38.0, 52.0])
    assert b.share == pytest.approx(15 / 45) and b.undefined is None
    assert b.edit_drop == pytest.approx(15.0) and b.shuffle_drop == pytest.approx(45.0)
    assert b.share_ci95 is not None
    lo, hi = b.share_ci95
    assert lo < b.share < hi and 0 < lo and hi < 1  # contains the point; the edit costs less than the shuffle


def test_an_edit_as_costly_as_the_shuffle_has_a_share_of_one_with_a_zero_width_interval():
    base = _correct(100, [])
    same = _correct(100, list(range(30)))
    b = budget_of(base, same.unsqueeze(0), same.unsqueeze(0), 30.0, 30.0, [21.0, 39.0])
    assert b.share == pytest.approx(1.0) and b.share_ci95 == pytest.approx([1.0, 1.0])


def test_no_share_where_the_shuffle_costs_nothing():
    base = _correct(100, list(range(20)))
    edit = _correct(100, list(range(25)))
    b = budget_of(base, edit, base.clone(), 5.0, 0.0, [0.0, 0.0])  # the model reads no position from its APE
    assert b.share is None and b.share_ci95 is None and b.undefined is not None and "shuffle" in b.undefined
    assert b.edit_drop == 5.0 and b.shuffle_drop == 0.0
    # just under the floor, or above it with an interval reaching 0: no ratio over ~0 either
    assert shuffle_undefined(MIN_SHUFFLE_DROP - 0.1, [0.5, 3.0]) is not None
    assert shuffle_undefined(3.0, [-0.5, 6.5]) is not None
    assert shuffle_undefined(3.0, [0.5, 6.5]) is None
    assert shuffle_undefined(None, None) is not None


def test_the_reader_says_why_a_result_has_no_budget():
    from vitpos.results.ape_permute import ApePermuteResult

    skipped = {"skipped": "no features of this kind"}
    doc = {"model": "m", "layer": 0, "site": "resid_post", "data": "d", "n_images": 4, "seeds": [0],
           "baseline_top1": 1.0, "baseline_per_group": {}, "variants": [], "feature_counts": {},
           **{v: skipped for v in ("all", "row_only", "col_only", "all_positional", "random_features",
                                   "mean_ablate", "pos_embed_shuffle")}}
    old = ApePermuteResult.model_validate(doc)  # written before the position budget
    b = position_budget(old, "all_positional")
    assert b.share is None and "before the position budget" in (b.undefined or "")
    new = ApePermuteResult.model_validate({**doc, "position_budget": {}})
    assert "skipped" in (position_budget(new, "row_only").undefined or "")
    new_keys = {"position_budget", "subspace_positional", "subspace_error", "subspace_rank", "prefix_tokens",
                "prefix_edited"}
    assert not new_keys & set(old.to_json())  # the new fields stay out of an older result's JSON


def test_the_subspace_edit_moves_only_the_span_of_the_positional_directions():
    from vitpos.sae import SAE, SAEConfig

    torch.manual_seed(0)
    sae = SAE(SAEConfig(d_in=8, expansion=2, arch="topk", k=4))
    basis = subspace_basis(sae, [1, 5])
    assert basis.shape == (8, 2) and torch.allclose(basis.T @ basis, torch.eye(2, dtype=basis.dtype), atol=1e-10)
    many = subspace_basis(sae, list(range(16)))  # more directions than dimensions: the whole stream
    assert many.shape == (8, 8)
    x = torch.randn(2, 4, 8)
    z = sae.encode(x)
    perm = torch.tensor([[1, 0, 3, 2], [3, 2, 1, 0]])
    out = permute_subspace(x, z, sae, basis, perm, error_only=False)
    q = basis.float()
    off = torch.eye(8) - q @ q.T
    assert torch.allclose(out @ off, x @ off, atol=1e-5)  # outside the span nothing moves
    assert torch.allclose(out @ q, torch.gather(x @ q, 1, perm.unsqueeze(-1).expand(-1, -1, 2)), atol=1e-5)
    whole = permute_subspace(x, z, sae, many, perm, error_only=False)  # full rank: the tokens themselves move
    assert torch.allclose(whole, torch.gather(x, 1, perm.unsqueeze(-1).expand_as(x)), atol=1e-5)
    err = x - sae.decode(z)
    e_out = permute_subspace(x, z, sae, basis, perm, error_only=True)
    moved = torch.gather(err @ q, 1, perm.unsqueeze(-1).expand(-1, -1, 2)) - err @ q
    assert torch.allclose(e_out - x, moved @ q.T, atol=1e-5)  # only the error's component in the span moves
    assert torch.allclose(permute_subspace(x, z, sae, basis, torch.arange(4).expand(2, 4), True), x)  # identity


def test_an_older_sweep_is_recomputed_and_reads_as_block_outputs(tmp_path):
    """A sweep cached by the previous version (block outputs only) is not served to this one (the stage's
    version and settings key the cache); where an older results.json is read, its points are block outputs."""
    from vitpos.experiments.registry import BY_NAME, stage_versions
    from vitpos.results.sae_layers import SAELayersResult
    from vitpos.study.cache import StageCache

    exp = BY_NAME["sae_layers"]
    assert exp.version >= 2 and stage_versions(exp)["sae_layers"] == exp.version
    settings = {"max_layers": 8, "images": 1000, "eval_images": 400, "epochs": 2, "expansion": 4, "k": 32,
                "permute_images": 400, "seeds": 1, "layers": [0, 1]}
    base = {"model": "fp", "spec": "m", "data": "shapes", "seed": 0, "stage": "sae_layers"}
    old_key = {**base, "settings": settings, "versions": {**stage_versions(exp), "sae_layers": 1}}
    from vitpos.experiments.sae_layers import SAELayersStageSettings

    now = SAELayersStageSettings.model_validate({**settings, "embed": True}).model_dump(mode="json")
    assert now["embed"] is True
    new_key = {**base, "settings": now, "versions": stage_versions(exp)}
    cache = StageCache(tmp_path, force=False)
    old_doc = {"model": "m", "data": "shapes", "layers": [0, 1], "layer_rule": "every layer 0..1", "points": [
        {"layer": layer, "fvu": 0.1, "n_row": 1, "n_col": 1, "n_mixed": 0, "all_positional_drop": 3.0,
         "all_positional_drop_ci95": [1.0, 5.0], "swap_null_drop": 0.0, "selection_frequency": f}
        for layer, f in ((0, 0.7), (1, 0.3))], "selected_layer": 0, "plausible_layers": [0, 1],
        "sae_images": 8, "sae_eval_images": 8, "sae_epochs": 1, "sae_expansion": 1, "sae_k": 1, "permute_images": 8,
        "seeds": [0]}
    path = cache.path("m", "sae_layers", old_key)
    path.parent.mkdir(parents=True)
    cache.put(path, old_key, old_doc, 1.0)  # as the previous version's stage wrote it
    assert cache.get(path) is not None  # the old entry is there ...
    assert cache.get(cache.path("m", "sae_layers", new_key)) is None  # ... and not served: recomputed
    old = exp.load(old_doc)  # an older results.json: its choices by layer read as block outputs' keys
    assert isinstance(old, SAELayersResult) and old.sites == ["L0", "L1"]
    assert old.plausible_sites == ["L0", "L1"] and old.selected_site == "L0"
    assert all(p.site == "resid_post" and p.all_positional_budget is None for p in old.points)


def test_the_pooled_budget_is_the_ratio_of_the_pooled_drops_over_the_same_resamples():
    """Issue 47 item 2: over SAE seeds the budget is the pooled drop over the APE shuffle's, its interval the
    ratio's over the hierarchical resamples; the shuffle's column leaves every other column's draws as they were."""
    from vitpos.analysis.stats import hierarchical_means
    from vitpos.experiments.ape_permute import pooled_budget

    g = torch.Generator().manual_seed(0)
    shuffle = (torch.rand(300, generator=g) < 0.5).double()  # per-image drop of the APE shuffle (~50 %)
    seeds = [torch.stack([shuffle * (torch.rand(300, generator=g) < p).double(), torch.zeros(300)], 1)
             for p in (0.3, 0.4, 0.5)]  # each SAE seed's edit reproduces a share of the shuffle's images
    with_shuffle = [torch.cat([x, shuffle.unsqueeze(1)], 1) for x in seeds]
    draws = hierarchical_means(with_shuffle)
    assert torch.equal(draws[:, :2], hierarchical_means(seeds))  # the older columns do not move
    edit = 100 * float(torch.stack([x[:, 0].mean() for x in seeds]).mean())
    b = pooled_budget(draws[:, 0], draws[:, 2], edit, 100 * float(shuffle.mean()), None)
    assert b.share == pytest.approx(edit / (100 * float(shuffle.mean())))
    assert b.share_ci95 is not None and b.share_ci95[0] < b.share < b.share_ci95[1] and 0.2 < b.share < 0.6
    none = pooled_budget(draws[:, 0], draws[:, 2], edit, 0.5, "the APE-table shuffle costs 0.5 pts")
    assert none.share is None and none.undefined == "the APE-table shuffle costs 0.5 pts"


def test_c2_reads_the_pooled_budget_where_the_seed_pool_has_one():
    from vitpos.results.ape_permute import ApePermuteResult, PositionBudget, read_budget

    skipped = {"skipped": "not run"}
    doc = {"model": "m", "layer": 0, "site": "resid_post", "data": "d", "n_images": 4, "seeds": [0],
           "baseline_top1": 1.0, "baseline_per_group": {}, "variants": [], "feature_counts": {},
           **{v: skipped for v in ("all", "row_only", "col_only", "all_positional", "random_features",
                                   "mean_ablate", "pos_embed_shuffle")},
           "position_budget": {"all_positional": {"share": 0.9, "share_ci95": [0.8, 1.0]}}}
    one = ApePermuteResult.model_validate(doc)
    assert read_budget(one, "all_positional") == (PositionBudget(share=0.9, share_ci95=[0.8, 1.0]), False)
    pool = {"sae_seeds": [0, 1], "interval_sources": ["images", "sae_seeds"], "variants": {}}
    older = ApePermuteResult.model_validate({**doc, "seed_pool": pool})  # a pool before its budget: the run seed's
    assert read_budget(older, "all_positional")[1] is False
    pooled = ApePermuteResult.model_validate({**doc, "seed_pool": {**pool, "budget": {
        "all_positional": {"share": 0.4, "share_ci95": [0.2, 0.6]}}}})
    b, is_pooled = read_budget(pooled, "all_positional")
    assert is_pooled and b.share == 0.4
