"""Issue 47 item 3: conjunction latents (position dependence within the latent's content) are typed apart from
the positional ones, and ape_permute's conjunction-inclusive variant moves exactly positional ∪ conjunction."""

from __future__ import annotations

from dataclasses import replace

import torch
from test_ape_controls import toy_images

from conftest import tiny_own
from vitpos.experiments.ape_permute import run_ape_permute
from vitpos.experiments.ape_permute_section import section
from vitpos.experiments.ape_permute_variants import (
    FeatureSets,
    PermuteRun,
    permute_features,
    random_perms,
    site_edits,
)
from vitpos.results.ape_permute import CONJ_VARIANTS
from vitpos.sae import SAE, SAEConfig, score_codes

H = W = 4
N = H * W
P = 5  # the cell a conjunction latent is tied to


def synthetic_codes(n: int = 400, seed: int = 0) -> torch.Tensor:
    """(n, N, 4) codes: latent 0 positional (fires at every token, its value the row), latent 1 a conjunction
    (fires only where content A sits at cell P), latent 2 pure content (fires wherever A is), latent 3 dead.
    Each image holds content A at one random cell (half the images) or none."""
    g = torch.Generator().manual_seed(seed)
    z = torch.zeros(n, N, 4)
    z[:, :, 0] = (torch.arange(N) // W).float() + 1.0
    has_a = torch.rand(n, generator=g) < 0.5
    where = torch.randint(N, (n,), generator=g)
    for b in range(n):
        if has_a[b]:
            z[b, where[b], 2] = 1.0 + float(torch.rand(1, generator=g))
            if int(where[b]) == P:
                z[b, P, 1] = 1.0 + float(torch.rand(1, generator=g))
    return z


def test_conjunction_latent_is_typed_conjunctional_not_positional():
    sc = score_codes([synthetic_codes()], (H, W))
    # the old typing: the conjunction latent's unconditional eta2_pos is small (it fires in ~1/32 of images)
    assert float(sc.eta2_pos[1]) < sc.thresholds.min_eta2_pos
    assert 1 not in sc.row_features + sc.col_features + sc.mixed_features
    assert 0 in sc.row_features  # the positional latent is typed as before
    # within the images where it fires it sits at one cell: eta2 ~ 1
    assert float(sc.eta2_pos_fired[1]) > 0.9
    assert sc.conj_features == [1]
    # pure content: fires at A's random cell, so within its images position explains ~nothing
    assert float(sc.eta2_pos_fired[2]) < 0.1
    assert 2 not in sc.conj_features and 2 not in sc.mixed_features
    assert 3 not in sc.conj_features and float(sc.eta2_pos_fired[3]) == 0.0
    # positional latents are not counted twice
    assert 0 not in sc.conj_features


def test_conjunction_needs_enough_firing_images():
    z = synthetic_codes(n=400)
    k = int((z[:, :, 1] != 0).any(1).sum())
    sc = score_codes([z], (H, W))
    assert int(sc.fire_images[1]) == k
    sc.classify(replace(sc.thresholds, min_conj_images=k + 1))
    assert sc.conj_features == []


def test_eta2_fired_streams_like_one_batch():
    z = synthetic_codes(n=120, seed=3)
    one = score_codes([z], (H, W))
    parts = score_codes([z[:50], z[50:]], (H, W))
    assert torch.allclose(one.eta2_pos_fired, parts.eta2_pos_fired, atol=1e-6)
    assert one.conj_features == parts.conj_features


# --- ape_permute's conjunction-inclusive variant ------------------------------------------------------------------

ROW, COL, MIXED, CONJ = [1, 2], [3], [4, 5], [6, 7]


def _sets() -> tuple[FeatureSets, SAE]:
    torch.manual_seed(0)
    sae = SAE(SAEConfig.model_validate({"d_in": 16, "expansion": 4, "k": 8})).eval()
    F = sae.d_sae
    spread = torch.linspace(0.1, 1.0, F)
    return FeatureSets(sae, (H, W), ROW, COL, MIXED, torch.linspace(0.1, 1.0, F), torch.ones(F, dtype=torch.bool),
                       spread, CONJ), sae


def test_conj_variant_moves_exactly_the_conjunction_inclusive_set():
    feats, sae = _sets()
    both = ROW + COL + MIXED + CONJ
    edits = site_edits(feats, [PermuteRun(v, 0) for v in ("all_positional", "conj_positional", *CONJ_VARIANTS)])
    assert edits.moved[("conj_positional", 0)] == (both, "all")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, N, 16, generator=g)
    z = torch.relu(torch.randn(3, N, sae.d_sae, generator=g))
    got = edits.fns[("conj_positional", 0)](x, z)
    # the same permutations as the all-positional set (seed 0), applied to exactly positional ∪ conjunction
    perms = random_perms("all", 3, (H, W), torch.Generator().manual_seed(0))
    assert torch.allclose(got, permute_features(x, z, sae, both, perms), atol=1e-5)
    # a latent outside the set does not move: changing its codes leaves the edit (x' - x) as it was
    z2 = z.clone()
    z2[:, :, 0] = torch.rand(3, N, generator=g)
    fresh = site_edits(feats, [PermuteRun("conj_positional", 0)]).fns[("conj_positional", 0)]
    assert torch.allclose(fresh(x, z2) - x, got - x, atol=1e-5)
    # beside all_positional (same draws) the difference is the conjunction latents' moved contributions alone
    allpos = site_edits(feats, [PermuteRun("all_positional", 0)]).fns[("all_positional", 0)](x, z)
    assert torch.allclose(got - allpos, permute_features(x, z, sae, CONJ, perms) - x, atol=1e-5)


def test_norm_controls_draw_from_latents_in_neither_set():
    feats, _ = _sets()
    both = set(ROW + COL + MIXED + CONJ)
    for v, n in (("norm_conj_positional", len(both)), ("norm_all_positional_no_conj", len(ROW + COL + MIXED))):
        ids, kind, _ = feats.moved(v, 0)
        assert len(ids) == n and not set(ids) & both, v
    # the older control C2 reads still draws from every non-positional latent (conjunction ones may be drawn)
    ids, _, _ = feats.moved("norm_all_positional", 0)
    assert not set(ids) & set(ROW + COL + MIXED)


def test_without_conjunction_latents_the_variants_are_skipped():
    feats, _ = _sets()
    none = replace(feats, conj=[])
    for v in CONJ_VARIANTS:
        ids, _, note = none.moved(v, 0)
        assert ids == [] and note is not None and "no conjunction" in note
    untyped = replace(feats, conj=[], conj_typed=False)
    assert "types no conjunction" in str(untyped.moved("conj_positional", 0)[2])


def test_run_reports_the_conjunction_inclusive_set_beside_the_positional_one():
    s = tiny_own("ape")
    torch.manual_seed(0)
    sae = SAE(SAEConfig.model_validate({"d_in": s.width, "expansion": 4, "k": 8})).eval()
    doc = {"layer": 0, "site": "resid_post", "row_features": [1, 2], "col_features": [3], "mixed_features": [4, 5],
           "conj_features": [6, 7, 8]}
    res = run_ape_permute(s, sae, doc, data=toy_images(32), n_images=32, seeds=(0,))
    assert res.feature_counts["conj"] == 3
    cp, ap = res.variant("conj_positional"), res.variant("all_positional")
    assert cp is not None and ap is not None and ap.n_features is not None and cp.n_features == ap.n_features + 3
    assert res.position_budget is not None and "conj_positional" in res.position_budget
    for v in ("norm_conj_positional", "norm_all_positional_no_conj"):
        assert res.outcome(v) is not None
    html = section(res)
    assert "conjunction-inclusive" in html and "norm_all_positional_no_conj" in html
    # an SAE description without the typing: the variants are not measured (no key), nothing else moves
    del doc["conj_features"]
    old = run_ape_permute(s, sae, doc, data=toy_images(32), n_images=32, seeds=(0,))
    assert all(old.outcome(v) is None for v in CONJ_VARIANTS) and "conj" not in old.feature_counts
    assert old.variant("all_positional") == ap
