"""Counterfactual RoPE coordinates (vitpos.rope.CoordEdit, hooks.rope_coordinates) and the two
self-tests of the recomputation they rest on, on every timm RoPE family vitpos supports."""

from __future__ import annotations

import pytest
import torch

from conftest import images_for, permute_patches, tiny_own, tiny_timm
from vitpos.errors import VitposError
from vitpos.hooks import capture, head_means, mean_ablate_heads, remove_rope, rope_coordinates
from vitpos.models.surface import Site
from vitpos.rope import CoordEdit, RopeCoords
from vitpos.rope_selftest import self_test

# random-init naver axial / mixed / axial+APE, DINOv3, EVA-02, and vitpos' own RoPE models
ROPE_FAMILIES = [("timm", k) for k in ("rope_axial", "rope_mixed", "rope_ape", "dinov3", "eva02")] + [
    ("own", pe) for pe in ("rope-axial", "rope-mixed", "rope-ape")]


def make(kind: str, key: str):
    return tiny_own(key) if kind == "own" else tiny_timm(key)


@pytest.mark.parametrize("kind,key", ROPE_FAMILIES)
def test_both_self_tests_pass_on_every_rope_family(kind, key):
    s = make(kind, key)
    r = self_test(s)
    # (a) the recomputation is the model's own tensor, so the no-op edit is the plain forward, bit for bit
    assert r.table_exact and r.table_max_abs == 0.0 and r.noop_exact
    # (b) a constant shift of every patch coordinate leaves patch-to-patch scores unchanged (rounding) ...
    assert r.shift_deviation < 1e-5
    # ... while per-patch jitter moves them: the check can fail
    assert r.jitter_deviation > 1e-2
    assert r.passed, r.summary()


@pytest.mark.parametrize("kind,key", [("timm", "rope_axial"), ("timm", "rope_mixed"), ("timm", "dinov3"),
                                      ("timm", "eva02"), ("own", "rope-mixed")])
def test_a_wrong_layout_fails_the_recomputation_self_test(kind, key):
    """Interleaved read as rotate-half (or the reverse for DINOv3): (a) must fail."""
    s = make(kind, key)
    own = s.rope_axis_map().layout
    wrong = "half" if own == "interleaved" else "interleaved"
    r = self_test(s, layout=wrong)
    assert r.layout == wrong
    assert not r.table_exact and r.table_max_abs > 0.1 and not r.noop_exact
    assert not r.recompute_ok and not r.passed


@pytest.mark.parametrize("kind,key", [("own", "rope-axial"), ("own", "rope-mixed"), ("timm", "rope_axial"),
                                      ("timm", "dinov3")])
def test_swapped_coordinates_follow_swapped_patches(kind, key):
    """Planted truth: give every patch the coordinates of patch perm[i] in every layer and move the
    image's patches by the same perm; each token then carries the (content, coordinate) of a token
    of the plain run, so patch states are permuted and the prefix tokens and logits unchanged."""
    s = make(kind, key)
    assert not s.has_ape
    x = images_for(s, n=2)
    perm = torch.randperm(s.num_patches, generator=torch.Generator().manual_seed(3))
    npt = s.num_prefix_tokens
    with capture(s, ["blocks.1.resid_post"]) as c:
        out = s(x)
    with rope_coordinates(s, CoordEdit("swap", perm=tuple(perm.tolist()))), capture(s, ["blocks.1.resid_post"]) as c2:
        out_p = s(permute_patches(x, perm, s.grid))
    a, b = c["blocks.1.resid_post"], c2["blocks.1.resid_post"]
    torch.testing.assert_close(b[:, npt:], a[:, npt:][:, perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b[:, :npt], a[:, :npt], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_p, out, atol=1e-5, rtol=1e-5)
    # without the coordinate swap, moving the patches does change the state (rotations carry position;
    # random-init models attend almost uniformly, so the change is small but far above rounding)
    with capture(s, ["blocks.1.resid_post"]) as c3:
        s(permute_patches(x, perm, s.grid))
    err_swapped = (b[:, npt:] - a[:, npt:][:, perm]).abs().max()
    err_plain = (c3["blocks.1.resid_post"][:, npt:] - a[:, npt:][:, perm]).abs().max()
    assert err_plain > 100 * err_swapped + 1e-6


@pytest.mark.parametrize("kind,key", [("own", "rope-axial"), ("timm", "eva02"), ("own", "rope-mixed")])
def test_zero_coordinates_are_remove_rope(kind, key):
    """The identity rotation by coordinate 0 equals remove_rope's (exact for axial channels, which
    both set to sin 0, cos 1; mixed: timm's arithmetic on another tensor shape, rounding)."""
    s = make(kind, key)
    x = images_for(s)
    sites = ["blocks.1.resid_post"]
    with remove_rope(s, {"row": [1]}, layers=[0]), capture(s, sites) as c_want:
        s(x)
    with rope_coordinates(s, CoordEdit("zero", axes=("row",)), layers=[0], heads=[1]), capture(s, sites) as c_got:
        s(x)
    with capture(s, sites) as c_plain:
        s(x)
    got, want, plain = (c[sites[0]] for c in (c_got, c_want, c_plain))
    if s.rope_axis_map().kind == "axial":
        assert torch.equal(got, want)
    assert (got - want).abs().max() < 1e-3 * (got - plain).abs().max()


def test_edits_move_the_coordinates_they_name():
    s = tiny_timm("dinov3")  # centred, normalised coordinates: 0.5 units per patch on a 4x4 grid
    own = s.rope_coords()
    H, W = s.grid
    assert own.step == (2 / H, 2 / W)
    r, c = own.channel("row"), own.channel("col")
    rows = torch.arange(H * W) // W
    torch.testing.assert_close(own.coords[:, r], (2 * (rows + 0.5) / H - 1).float())
    shifted = CoordEdit("shift", offset=(1.0, -2.0)).apply(own)
    torch.testing.assert_close(shifted[:, r] - own.coords[:, r], torch.full((H * W,), 1.0 * own.step[0]))
    torch.testing.assert_close(shifted[:, c] - own.coords[:, c], torch.full((H * W,), -2.0 * own.step[1]))
    only_col = CoordEdit("rescale", axes=("col",), factor=2.0).apply(own)
    assert torch.equal(only_col[:, r], own.coords[:, r]) and torch.equal(only_col[:, c], 2 * own.coords[:, c])
    perm = torch.randperm(H * W, generator=torch.Generator().manual_seed(0))
    assert torch.equal(CoordEdit("swap", perm=tuple(perm.tolist())).apply(own), own.coords[perm])
    a, b = (CoordEdit("jitter", sigma=0.5, seed=s_).apply(own) for s_ in (0, 0))
    assert torch.equal(a, b) and not torch.equal(a, own.coords)  # seeded: the same noise twice
    assert CoordEdit().apply(own) is own.coords
    # an axial table recomputed from swapped coordinates is the own table's rows swapped
    table = s.rope_from_coords()
    assert torch.equal(s.rope_from_coords(own.coords[perm]), table[perm])
    # naver's index grid: one unit per patch, column first ('xy')
    naver = tiny_timm("rope_axial").rope_coords()
    assert naver.step == (1.0, 1.0) and naver.row_channel == 1


def test_only_the_chosen_heads_and_layers_turn_with_new_coordinates():
    s = tiny_own("rope-axial")
    x = images_for(s)
    sites = [Site(0, "k_rot"), Site(1, "k_rot")]
    with capture(s, sites) as plain:
        s(x)
    with rope_coordinates(s, CoordEdit("jitter", sigma=1.0), layers=[0], heads=[1]), capture(s, sites) as c:
        s(x)
    k0, p0 = c["blocks.0.k_rot"], plain["blocks.0.k_rot"]
    assert torch.equal(k0[:, 0], p0[:, 0])  # head 0 of the edited layer: untouched, bit for bit
    npt = s.num_prefix_tokens
    assert torch.equal(k0[:, 1, :npt], p0[:, 1, :npt])  # prefix tokens are never rotated
    assert not torch.allclose(k0[:, 1, npt:], p0[:, 1, npt:])


def test_mean_ablating_a_head_replaces_its_patch_outputs_by_their_mean():
    s = tiny_own("rope-axial")
    x = images_for(s, n=4)
    with capture(s, [Site(0, "z")]) as c:
        s(x)
    npt = s.num_prefix_tokens
    z = c["blocks.0.z"]
    means = head_means(s, [x[:2], x[2:]], [0])
    torch.testing.assert_close(means[0], z[:, :, npt:].double().mean((0, 2)).float())
    with mean_ablate_heads(s, {0: [0]}, means), capture(s, [Site(0, "z")]) as c2:
        out = s(x)
    z2 = c2["blocks.0.z"]
    assert torch.equal(z2[:, 1], z[:, 1]) and torch.equal(z2[:, 0, :npt], z[:, 0, :npt])
    assert torch.equal(z2[:, 0, npt:], means[0][0].expand_as(z2[:, 0, npt:]))
    assert not torch.equal(out, s(x))  # the last layer's patch outputs would not reach the CLS logits


def test_bad_coordinate_edits_are_refused():
    s = tiny_own("rope-axial")
    with pytest.raises(VitposError, match="unknown coordinate edit"):
        CoordEdit("tilt")  # type: ignore[arg-type]
    with pytest.raises(VitposError, match="row and/or col"):
        CoordEdit("shift", axes=("depth",))
    with pytest.raises(VitposError, match="permutation"):
        CoordEdit("swap", perm=(0, 0) + tuple(range(2, s.num_patches))).apply(s.rope_coords())
    with pytest.raises(VitposError, match="heads 0..1"):
        with rope_coordinates(s, CoordEdit(), heads=[5]):
            pass
    with pytest.raises(VitposError, match="no rotary embedding"):
        with rope_coordinates(tiny_own("ape"), CoordEdit()):
            pass
    with pytest.raises(VitposError, match="no rotary embedding"):
        self_test(tiny_own("none"))
    with pytest.raises(VitposError, match="do not fit"):
        RopeCoords.read(torch.zeros(5, 2), s.grid)


def test_c5_rule_per_ablation_holds_fails_and_abstains_on_planted_drops():
    from vitpos.experiments.rope_heads_ablation import _c5_entry

    n = 400
    clean = torch.ones(n, dtype=torch.bool)
    heads = [(0, 0), (1, 0), (1, 1)]

    def wrong_on(frac: float, offset: int = 0) -> torch.Tensor:
        c = torch.ones(n, dtype=torch.bool)
        c[offset:offset + int(frac * n)] = False
        return c

    primary = (1, 0)
    holds = _c5_entry("x", heads, clean, torch.stack([wrong_on(0.05), wrong_on(0.5), wrong_on(0.02)]), primary)
    assert holds.outcome == "holds" and holds.primary_drop_rank == 1 and holds.largest_drop_head == [1, 0]
    m0, m1, m2 = holds.margin_ci95
    assert m1 is None and m0 is not None and m2 is not None and m0[0] > 0 and m2[0] > 0
    torch.testing.assert_close(torch.tensor(holds.drop_points), torch.tensor([5.0, 50.0, 2.0]), atol=1e-9, rtol=0)
    fails = _c5_entry("x", heads, clean, torch.stack([wrong_on(0.6), wrong_on(0.2), wrong_on(0.0)]), primary)
    assert fails.outcome == "fails" and fails.primary_drop_rank == 2 and fails.largest_drop_head == [0, 0]
    tie = _c5_entry("x", heads, clean, torch.stack([wrong_on(0.2, 200), wrong_on(0.2), wrong_on(0.0)]), primary)
    assert tie.outcome == "inconclusive"
    no_primary = _c5_entry("x", heads, clean, torch.stack([wrong_on(0.1)] * 3), None)
    assert no_primary.outcome == "fails" and no_primary.primary_drop_rank is None
    # ties ranked as run_rope_heads ranks them (largest (drop, layer, head) first)
    tied = _c5_entry("x", heads, clean, torch.stack([wrong_on(0.1)] * 3), (0, 0))
    assert tied.primary_drop_rank == 3 and tied.largest_drop_head == [1, 1]


def test_c5_shift_ablation_is_a_null_without_prefix_tokens():
    """Planted null: with no prefix tokens every score is patch-to-patch, so shifting a head's
    coordinates changes nothing (rounding) and its C5 drop is exactly 0; swapping them moves logits."""
    from conftest import _Q, toy_set
    from vitpos.experiments.rope_heads_ablation import HeadDrops, c5_under_ablations
    from vitpos.models import load_model

    torch.manual_seed(0)
    s = load_model(f"timm:vit_small_patch16_rope_224?{_Q}&init_values=1.0&class_token=False&global_pool=avg")
    assert s.num_prefix_tokens == 0
    data = toy_set(n=24)
    x = next(iter(data.batches(24)))[0]
    site = ["blocks.1.resid_post"]
    with capture(s, site) as c:
        clean_logits = s(x)
    moved = {}
    for kind, e in (("shift", CoordEdit("shift", offset=(2.0, 2.0))), ("swap", CoordEdit("swap", seed=0))):
        with rope_coordinates(s, e, layers=[0], heads=[1]), capture(s, site) as c2:
            s(x)
        moved[kind] = float((c2[site[0]] - c[site[0]]).abs().max())
    assert moved["swap"] > 1e-6 and moved["swap"] > 100 * moved["shift"]
    heads = [(0, 1), (1, 0)]
    pred = clean_logits.argmax(-1) == data.labels[:24]
    measured = HeadDrops(pred, pred.expand(2, 2, -1).clone())
    out = c5_under_ablations(s, data, measured, (1, 0), heads, batch_size=8)
    assert set(out) == {"identity", "swap", "shift", "jitter", "rescale", "mean_output"}
    assert out["shift"].drop_points == [0.0, 0.0] and out["shift"].heads == [[0, 1], [1, 0]]
    assert out["identity"].heads == [[0, 0], [0, 1], [1, 0], [1, 1]]


def test_report_shows_c5_under_each_ablation():
    import copy

    from conftest import GOLDEN
    from vitpos.experiments.rope_heads_ablation import _c5_entry
    from vitpos.experiments.rope_heads_section import section as _sec_heads
    from vitpos.results.rope_heads import RopeHeadsResult

    doc = copy.deepcopy(GOLDEN["models"]["builtin:rope-axial"]["rope_heads"])
    assert "C5 under each ablation" not in _sec_heads(RopeHeadsResult.from_json(doc))  # results before the ablations
    prim = tuple(doc["primary_rebuilding_head"])
    heads = [(0, 0), prim]
    clean = torch.ones(100, dtype=torch.bool)
    abl = torch.ones(2, 100, dtype=torch.bool)
    abl[0, :40] = False  # L0H0 drops 40 points, the primary none
    entries = {k: _c5_entry(f"{k} text", heads, clean, abl, prim).model_dump() for k in ("identity", "swap")}
    doc.update(c5_ablations=entries, c5_rests_on="identity", c5_ablation_heads_rule="every head")
    html = _sec_heads(RopeHeadsResult.from_json(doc))  # typed: the new keys validate
    assert "C5 under each ablation" in html and "identity (verdict)" in html and "swap text" in html
    assert "L0 h0: 40.0 pts" in html and ">fails<" in html


def test_coordinate_edits_refuse_a_rope_family_without_the_recomputation():
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'vitpos[hf]')")
    from vitpos.models import load_model
    from vitpos.models.hf_families import tiny_spec

    torch.manual_seed(0)
    s = load_model(tiny_spec("dinov3"))  # Hugging Face DINOv3: RoPE, but not timm's modules
    assert s.has_rope
    with pytest.raises(VitposError, match="implemented for timm's RoPE families"):
        with rope_coordinates(s, CoordEdit()):
            pass
