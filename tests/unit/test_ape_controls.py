"""ape_permute: every permuted set has its own matched random control, and every variant an interval."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conftest import tiny_own
from vitpos.data.base import DatasetInfo, TensorImageDataset
from vitpos.experiments.ape_permute import run_ape_permute
from vitpos.experiments.ape_permute_variants import code_stats, crossed_edit, image_rotation, swap_features
from vitpos.results.ape_permute import BUDGET_VARIANTS, CONTROLS, NULLS, SUBSPACE_VARIANTS, VARIANTS, variant_names
from vitpos.sae import SAE, SAEConfig
from vitpos.sae.controls import matched_control, matched_random_features

INFO = DatasetInfo(name="toy", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(16, 16), in_chans=3)


def toy_images(n: int, seed: int = 0) -> Any:  # a dataset object: run_ape_permute takes names or datasets
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, 16, 16, generator=g)
    return TensorImageDataset((x * 255).to(torch.uint8), torch.randint(0, 4, (n,), generator=g), INFO, "test")


def toy_sae(d: int = 32) -> SAE:
    torch.manual_seed(0)
    return SAE(SAEConfig.model_validate({"d_in": d, "expansion": 4, "k": 8})).eval()


def test_matched_control_is_live_non_positional_and_matched_in_mass():
    """Positional latents (even ids) and candidates (odd ids) interleave in mass: the control is
    live, non-positional, as many, and within 10 % of the set's total mass, with no note."""
    mass = torch.linspace(0.1, 1, 40)
    live = torch.ones(40, dtype=torch.bool)
    live[35:] = False
    positional = list(range(0, 40, 2))
    targets = [2, 10, 20]
    ids, note = matched_control(mass, targets, positional, live, torch.Generator().manual_seed(0), pool=2)
    assert note is None and len(ids) == len(set(ids)) == 3
    assert not set(ids) & set(positional) and all(live[i] for i in ids)
    assert abs(float(mass[ids].sum()) / float(mass[targets].sum()) - 1) <= 0.10


def test_a_control_whose_mass_cannot_match_says_so():
    """When every non-positional latent is lighter than the set, the closest are taken and the
    note gives both masses."""
    mass = torch.linspace(0, 1, 40)
    live = torch.ones(40, dtype=torch.bool)
    positional = list(range(30, 40))
    ids, note = matched_control(mass, [35, 37, 39], positional, live, torch.Generator().manual_seed(0), pool=3)
    assert len(ids) == 3 and not set(ids) & set(positional)
    assert set(ids) <= {25, 26, 27, 28, 29}  # the pool closest in mass
    assert note is not None and "not matched within 10%" in note


def test_matched_control_too_few_is_the_largest_set_with_a_note():
    mass = torch.arange(12.0)
    live = torch.ones(12, dtype=torch.bool)
    ids, note = matched_control(mass, list(range(8)), list(range(10)), live, torch.Generator().manual_seed(0))
    assert sorted(ids) == [10, 11] and note is not None and "only 2" in note
    ids, note = matched_control(mass, [0], list(range(12)), live, torch.Generator().manual_seed(0))
    assert ids == [] and note is not None and "no live" in note


def test_the_older_random_control_draws_as_before():
    """matched_random_features is the row+col control of format 1: same draws from the same generator."""
    mass = torch.rand(50, generator=torch.Generator().manual_seed(1))
    live = torch.ones(50, dtype=torch.bool)
    a = matched_random_features(mass, [1, 2, 3], live, torch.Generator().manual_seed(10_000))
    b, _ = matched_control(mass, [1, 2, 3], [1, 2, 3], live, torch.Generator().manual_seed(10_000))
    assert a == b


@pytest.fixture(scope="module")
def model_and_sae():
    return tiny_own("ape"), toy_sae()


def test_each_permuted_set_has_its_control_and_every_variant_an_interval(model_and_sae):
    s, sae = model_and_sae
    doc = {"layer": 0, "site": "resid_post", "row_features": [1, 2], "col_features": [3], "mixed_features": [4, 5]}
    res = run_ape_permute(s, sae, doc, data=toy_images(64), n_images=64, seeds=(0, 1)).to_json()
    assert res["variants"] == list(VARIANTS) and res["controls"] == CONTROLS
    assert sorted(variant_names(res)[-8:-5]) == ["random_all_positional", "random_col", "random_row"]
    assert variant_names(res)[-5:-2] == list(NULLS) and res["nulls"] == NULLS
    assert variant_names(res)[-2:] == list(SUBSPACE_VARIANTS)  # issue 47: the positional subspace, the error in it
    # every edit's share of the APE shuffle's effect (the conjunction set's needs the typing this doc has not)
    assert set(res["position_budget"]) == set(BUDGET_VARIANTS) - {"conj_positional"}
    for kept, ctrl in CONTROLS.items():
        assert res[ctrl]["n_features"] == res[kept]["n_features"], ctrl
        assert res[ctrl]["activation_mass"] is not None
        # unflagged means matched on every seed, so also on the mean over seeds: within 10 % of the set's mass
        ratio = res[ctrl]["activation_mass"] / res[kept]["activation_mass"]
        assert res[ctrl]["note"] is not None or abs(ratio - 1) <= 0.10, ctrl
    lo, hi = res["baseline_top1_ci95"]
    assert lo <= res["baseline_top1"] <= hi
    for v in variant_names(res):
        lo, hi = res[v]["drop_ci95"]
        assert lo - 1e-6 <= res[v]["drop_points"] <= hi + 1e-6, v


def test_a_control_with_too_few_latents_says_so(model_and_sae):
    s, sae = model_and_sae
    doc = {"layer": 0, "site": "resid_post", "row_features": list(range(0, 40)), "col_features": list(range(40, 80)),
           "mixed_features": list(range(80, 120))}
    res = run_ape_permute(s, sae, doc, data=toy_images(32), n_images=32, seeds=(0,)).to_json()
    ctrl = res["random_all_positional"]
    assert ctrl["n_features"] < 120 and ctrl["note"].startswith(f"only {ctrl['n_features']} live")
    assert "skipped" in res["random_features"]  # format 1's control: all or nothing, as before


@pytest.fixture(scope="module")
def varied_ape():
    """A tiny APE model whose predictions vary from image to image (at timm's init every image gets
    one class, and then no edit could move a top-1)."""
    s = tiny_own("ape")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in s.model.parameters():
            p.normal_(0, 0.3)
    return s


@pytest.mark.parametrize("layer,site", [(0, "resid_post"), (1, "resid_pre"), (1, "resid_post")])
def test_shared_prefix_gives_the_numbers_of_full_forwards(varied_ape, layer, site):
    """The SAE variants run from the clean stream at the site (codes encoded once per batch) and
    give the very numbers of per-variant full forwards with a hook, across two batches (each
    variant's generator carries over from batch to batch either way)."""
    s, sae = varied_ape, toy_sae()
    doc = {"layer": layer, "site": site, "row_features": [1, 2], "col_features": [3], "mixed_features": [4, 5, 6]}
    data = toy_images(300, seed=3)  # two batches of the sweeps' 256
    shared = run_ape_permute(s, sae, doc, data=data, n_images=300, seeds=(0, 1)).to_json()
    full = run_ape_permute(s, sae, doc, data=data, n_images=300, seeds=(0, 1), shared_prefix=False).to_json()
    assert shared == full
    assert any(abs(shared[v]["drop_points"]) > 0.1 for v in variant_names(shared))  # the edits moved predictions


# ---------------------------------------------------------------- nulls by construction (issue 28)
def _pure_codes(B: int = 5, grid=(4, 4)):
    """Codes of 4 row latents (ids 0-3), 4 col latents (4-7), 4 content latents (8-11) that vary by image."""
    H, W = grid
    z = torch.zeros(B, H * W, 12)
    n = torch.arange(H * W)
    z[:, n, n // W] = 1.0
    z[:, n, 4 + n % W] = 1.0
    z[..., 8:] = torch.rand(B, H * W, 4, generator=torch.Generator().manual_seed(0))
    return z


def _identity_sae() -> SAE:
    sae = SAE(SAEConfig.model_validate({"arch": "relu", "d_in": 12, "expansion": 1, "normalize": False}))
    with torch.no_grad():
        sae.W_dec.copy_(torch.eye(12))
        sae.W_enc.copy_(torch.eye(12))
    return sae


def test_the_swap_and_crossed_nulls_are_no_ops_on_pure_positional_features():
    """Another image's codes at the same patch, and row codes moved by whole columns (col codes by whole
    rows), leave pure row / col features exactly where they were; on content latents the swap moves codes."""
    sae, z = _identity_sae(), _pure_codes()
    x = z.clone()
    g = torch.Generator().manual_seed(0)
    other = image_rotation(5, g)
    assert not torch.equal(other, torch.arange(5)) and sorted(other.tolist()) == list(range(5))
    assert torch.equal(swap_features(x, z, sae, list(range(8)), other), x)
    assert torch.equal(crossed_edit(x, z, sae, [0, 1, 2, 3], [4, 5, 6, 7], (4, 4), g), x)
    assert not torch.equal(swap_features(x, z, sae, [8, 9], other), x)
    # the real permutation of the same set does move them
    from vitpos.experiments.ape_permute_variants import permute_features, random_perms
    assert not torch.equal(permute_features(x, z, sae, list(range(8)), random_perms("all", 5, (4, 4), g)), x)
    assert torch.equal(image_rotation(1, g), torch.zeros(1, dtype=torch.long))


def test_every_variant_has_its_edit_size_and_the_norm_control_is_matched_on_it(model_and_sae):
    s, sae = model_and_sae
    doc = {"layer": 0, "site": "resid_post", "row_features": [1, 2], "col_features": [3], "mixed_features": [4, 5]}
    res = run_ape_permute(s, sae, doc, data=toy_images(64), n_images=64, seeds=(0,)).to_json()
    for v in ("all_positional", "random_all_positional", "swap_all_positional", "crossed", "norm_all_positional",
              "mean_ablate"):
        if "skipped" not in res[v]:
            assert res[v]["edit_norm"] is not None and res[v]["edit_norm"] >= 0, v
    assert res["norm_all_positional"]["n_features"] == res["all_positional"]["n_features"]
    assert res["pos_embed_shuffle"].get("edit_norm") is None  # SAE-free: no SAE edit to size


def test_code_stats_in_chunks_are_those_of_one_whole_encode():
    """The mass images' codes are encoded a few images at a time (memory): the firing rate is exactly that of
    one encode of every token, and the mean code and spread equal it up to the encoder matmul's rounding
    (bit for bit at one thread; at two, BLAS splits a 27-row and a 90-row product differently: ~1e-8)."""
    sae = toy_sae(16)
    torch.manual_seed(0)
    acts = torch.randn(10, 9, 16)
    st = code_stats(sae, acts, chunk=3)  # 3 + 3 + 3 + 1 images
    with torch.no_grad():
        z = sae.encode(acts.reshape(-1, 16))
        whole = sae.encode(acts)
    assert torch.equal(st.fire, (z != 0).float().mean(0))
    torch.testing.assert_close(st.mean_code, z.mean(0), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(st.spread, whole.var(1, correction=0).mean(0).sqrt(), rtol=1e-6, atol=1e-7)
    assert 0 < float(st.fire.mean()) < 1 and float(st.spread.max()) > 0  # codes that fire on some tokens only
