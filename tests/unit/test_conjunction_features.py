"""Issue 47 item 3: conjunction latents (position dependence within the latent's content) are typed apart from
the positional ones, and ape_permute's conjunction-inclusive variant moves exactly positional ∪ conjunction."""

from __future__ import annotations

from dataclasses import replace

import torch

from vitpos.sae import score_codes

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
