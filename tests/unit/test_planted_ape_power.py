"""The held-out planted APE cases of `planted_ape_power`: each planted-false case passes every condition
of its claim but one, and that one alone decides it (`ValidationTable.power` credits exactly it); the
near-threshold planted-true case is supported; and each circuit is what its docstring says."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from vitpos.claims.inputs import ClaimInputs
from vitpos.models import planted_ape_power as power
from vitpos.models.planted_ape_power import PC
from vitpos.models.spec import OwnSurface
from vitpos.results.validation import ValidationTable
from vitpos.validation.ape_cases import APE_POWER_CASES
from vitpos.validation.table import CASES

N_IMAGES, SEEDS = 150, (0,)
TARGET = {"ape:cells_recoded": ("C1", "selective"), "ape:rows_elsewhere": ("C1", "probe_drop"),
          "ape:rows_need_everything": ("C1", "above_control"), "ape:colour_beside_position": ("C2", "above_null"),
          "ape:rare_position": ("C2", "min_drop"), "ape:position_beyond_sae": ("C2", "budget"),
          "ape:content_moves_label": ("C2", "above_norm_control")}
# built with rules version 7 (issue 47 item 2), the rule they test: design cases
DESIGN = {"ape:colour_beside_position", "ape:position_beyond_sae", "ape:content_moves_label"}


@pytest.fixture(scope="module")
def measured(planted_inputs) -> dict[str, ClaimInputs]:
    return {c.name: planted_inputs(c, N_IMAGES, SEEDS) for c in APE_POWER_CASES}


@pytest.fixture(scope="module")
def table(planted_inputs) -> ValidationTable:
    """The validation table of the power cases, read from the session's one measurement of each."""
    return planted_inputs.table(APE_POWER_CASES, n_images=N_IMAGES, seeds=SEEDS)


def test_every_power_case_is_split_as_built_and_in_the_one_table():
    assert {c.name for c in APE_POWER_CASES} == {*TARGET, "ape:near_threshold", "ape:colour_in_position"}
    assert {c.name for c in APE_POWER_CASES if c.split == "design"} == DESIGN
    assert all(c.split == "held_out" for c in APE_POWER_CASES if c.name not in DESIGN)
    assert {c.name for c in APE_POWER_CASES} <= {c.name for c in CASES}


def test_each_row_passes_and_power_credits_exactly_its_condition(table):
    assert table.passes, "\n" + table.markdown() + "\n" + "\n".join(r.evidence for r in table.rows if not r.passes)
    assert all(r.split == ("design" if r.case in DESIGN else "held_out") for r in table.rows)
    for case, (claim, condition) in TARGET.items():
        rows = [r for r in table.rows if r.case == case]
        assert [(r.claim, r.planted) for r in rows] == [(claim, False)]
        one = ValidationTable(rules_version=table.rules_version, rules_hash=table.rules_hash, n_images=N_IMAGES,
                              seeds=list(SEEDS), rows=rows)
        credited = {k: v for k, v in one.power()[claim].items() if v}
        assert credited == {condition: 1}, (case, rows[0].conditions)
    near = [r for r in table.rows if r.case == "ape:near_threshold"]
    assert {r.claim for r in near} == {"C1", "C2"} and all(r.planted and r.passes for r in near)
    # since rules version 7 colour_in_position's APE shuffle costs 0: the precondition and the budget fail with
    # above_null (colour_beside_position is the case above_null decides alone)
    (row,) = [r for r in table.rows if r.case == "ape:colour_in_position"]
    assert {k for k, v in row.conditions.items() if v == "fails"} == {"ape_shuffle", "above_null", "budget"}
    # with the design case ape:pos_unused (top1_drop), every condition but the preconditions (C1's feature_sets,
    # C2's ape_shuffle) decides a row alone
    counts = table.power()
    assert {k for k, v in counts["C2"].items() if v} == {"min_drop", "above_null", "budget", "above_norm_control"}
    assert {k for k, v in counts["C1"].items() if v} == {"selective", "probe_drop", "above_control"}


def _iv(point: float, ci: list[float] | None) -> tuple[float, float]:
    return (ci[0], ci[1]) if ci else (point, point)


def test_the_numbers_behind_each_deciding_condition(measured):
    """Each case fails its condition by its construction's margin, not by noise at the threshold."""
    causal = {k: v.sae.causal for k, v in measured.items() if v.sae is not None}
    # cells_recoded: each removal costs the other axis as much as its own (selectivity ~0.5 < 0.6)
    c = causal["ape:cells_recoded"]
    assert c is not None
    for axis in ("row", "col"):
        e = c.effect(axis)
        assert e is not None and e.selectivity_ci95 is not None and e.selectivity_ci95[1] < 0.6
        assert min(e.row_drop, e.col_drop) > 0.6  # both probes fall: the cell code needs both latents
    # rows_elsewhere: the row probe moves by a few points (< 5), above 0 and its control (0)
    c = causal["ape:rows_elsewhere"]
    assert c is not None and (e := c.effect("row")) is not None and (ctl := c.control("row")) is not None
    lo, hi = _iv(e.row_drop, e.row_drop_ci95)
    assert 0 < lo and hi < 0.05 and ctl.row_drop == 0.0
    # rows_need_everything: the random always-on latents cost the row probe as much as the row latents
    c = causal["ape:rows_need_everything"]
    assert c is not None and (e := c.effect("row")) is not None and (ctl := c.control("row")) is not None
    assert ctl.row_drop > 0.6 and abs(e.row_drop - ctl.row_drop) < 0.05
    assert ctl.features is not None and set(ctl.features) <= set(PC.on)
    # colour_in_position: the swap null costs as much as the permutation; the APE table's shuffle nothing
    ap = measured["ape:colour_in_position"].ape_permute
    assert ap is not None and (perm := ap.variant("all_positional")) is not None
    assert (swap := ap.variant("swap_all_positional")) is not None and (pe := ap.variant("pos_embed_shuffle"))
    assert perm.drop_points > 80 and swap.drop_points >= perm.drop_points - 5 and pe.drop_points == 0.0
    # rare_position: a small drop (its interval inside (0, 10)) against a swap null of exactly 0
    ap = measured["ape:rare_position"].ape_permute
    assert ap is not None and (perm := ap.variant("all_positional")) is not None
    assert (swap := ap.variant("swap_all_positional")) is not None and swap.drop_points == 0.0
    lo, hi = _iv(perm.drop_points, perm.drop_ci95)
    assert 0 < lo and hi < 10
    # colour_beside_position: the swap null costs most of the permutation (the red marks), the APE shuffle only
    # the green images' column
    ap = measured["ape:colour_beside_position"].ape_permute
    assert ap is not None and (perm := ap.variant("all_positional")) and (swap := ap.variant("swap_all_positional"))
    assert (pe := ap.variant("pos_embed_shuffle")) is not None and perm.drop_points > 60
    assert 2 * _iv(swap.drop_points, swap.drop_ci95)[0] > _iv(perm.drop_points, perm.drop_ci95)[1]
    assert 2 < _iv(pe.drop_points, pe.drop_ci95)[0] and pe.drop_points < perm.drop_points / 2
    # position_beyond_sae: the SAE's latents carry about a third of the position the label reads
    ap = measured["ape:position_beyond_sae"].ape_permute
    assert ap is not None and ap.position_budget is not None and (perm := ap.variant("all_positional"))
    b = ap.position_budget["all_positional"]
    assert b.share is not None and b.share_ci95 is not None and 0.2 < b.share < 0.45 and b.share_ci95[1] < 0.5
    assert _iv(perm.drop_points, perm.drop_ci95)[0] > 10
    # content_moves_label: moving the colours away from their (unencoded) mark costs nearly every image, more
    # than moving position; the permutation reproduces the whole APE effect
    ap = measured["ape:content_moves_label"].ape_permute
    assert ap is not None and ap.position_budget is not None and (perm := ap.variant("all_positional"))
    assert (norm := ap.variant("norm_all_positional")) is not None and norm.drop_points > 85
    assert _iv(norm.drop_points, norm.drop_ci95)[0] > _iv(perm.drop_points, perm.drop_ci95)[1]
    assert (b := ap.position_budget["all_positional"].share_ci95) is not None and b[0] > 0.5
    # every other C2 case's norm-matched control moves idle channels: it costs nothing
    for case in ("ape:rare_position", "ape:near_threshold", "ape:colour_beside_position", "ape:position_beyond_sae"):
        ap = measured[case].ape_permute
        assert ap is not None and (norm := ap.variant("norm_all_positional")) is not None
        assert norm.drop_points == 0.0 and set(ap.variant_names()) >= {"norm_all_positional"}, case
    # near_threshold: top-1 drops within 4x of C1's 5 points and 3x of C2's 10, their intervals above them
    near = measured["ape:near_threshold"]
    c, ap = causal["ape:near_threshold"], near.ape_permute
    assert c is not None and ap is not None and (perm := ap.variant("all_positional")) is not None
    for axis in ("row", "col"):
        e = c.effect(axis)
        assert e is not None and e.top1_drop is not None and 5 < _iv(e.top1_drop, e.top1_drop_ci95)[0]
        assert e.top1_drop < 20
    assert 10 < _iv(perm.drop_points, perm.drop_ci95)[0] and perm.drop_points < 30


@torch.no_grad()
def test_the_circuits_compute_their_labels_and_cancel_what_they_say():
    builds: tuple[tuple[Callable[[], OwnSurface], power.Label, float, tuple[int, ...]], ...] = (
        (power.cells_recoded, "position", 0.0, PC.row + PC.col),
        (power.rows_elsewhere, "position", 0.0, PC.row + PC.cell),
        (power.rows_need_everything, "position", 0.0, PC.row), (power.colour_in_position, "colour", 0.0, ()),
        (power.colour_position, "position", 0.5, ()), (power.colour_beside_position, "mixed", 0.0, ()),
        (power.position_beyond_sae, "position", 0.0, ()), (power.content_moves_label, "position", 0.0, ()))
    for build, label, p_blue, cancelled in builds:
        s = build()
        x, y = next(power.power_data(160, label, p_blue, seed=3).batches(160))
        assert bool((s(x).argmax(-1) == y).all()), s.spec
        if cancelled:  # gone for the probes: a spread under their 1e-6 standardisation floor
            out = s.run_blocks(s.embed_tokens(x), 0, 2)[:, 1:].reshape(-1, power.D)
            assert float(out[:, list(cancelled)].std(0).max()) < 1e-6, s.spec


@torch.no_grad()
def test_position_beyond_sae_reads_the_column_only_through_the_channels_its_sae_leaves_out():
    s, sae = power.position_beyond_sae(), power.power_sae(PC.hidden_col)
    x, y = next(power.power_data(64, "position", seed=5, red=0.0).batches(64))  # green only: read by column
    t = s.run_blocks(s.embed_tokens(x), 0, 1)
    z = sae.encode(t[:, 1:])
    assert float(z[..., list(PC.hidden_col)].abs().max()) == 0.0  # no latent encodes them: the error term does
    t[:, 1:, list(PC.col)] = t[:, 1:, list(PC.col)].flip(1)  # the encoded col one-hot moved: the label stays
    assert bool((s.head_from(s.run_blocks(t, 1, 2)).argmax(-1) == y).all())


@torch.no_grad()
def test_rows_need_every_always_on_channel_and_colour_ignores_position():
    s = power.rows_need_everything()
    x, _ = next(power.power_data(8).batches(8))
    t = s.run_blocks(s.embed_tokens(x), 0, 1)
    assert torch.allclose(s.run_blocks(t, 1, 2)[:, 1:, list(PC.row_code)].sum(-1), torch.ones(8, 16), atol=1e-5)
    t[:, 1:, PC.on[3]] = 0  # one always-on channel removed: the row code is gone everywhere
    assert float(s.run_blocks(t, 1, 2)[:, 1:, list(PC.row_code)].abs().max()) < 1e-5
    # colour_in_position's label reads no position: any permutation of the APE table leaves every logit
    s = power.colour_in_position()
    x, _ = next(power.power_data(64, "colour").batches(64))
    clean = s(x)
    pe = s.model.pos_embed
    assert isinstance(pe, torch.Tensor)
    pe.copy_(pe[:, torch.randperm(16, generator=torch.Generator().manual_seed(0))])
    assert torch.allclose(s(x), clean, atol=1e-5)
