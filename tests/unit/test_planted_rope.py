"""Planted RoPE models: the study's own measurements and verdict rules say `supported` where C3-C5
are true by construction and `not supported` where they are false (vitpos.models.planted_rope)."""

from __future__ import annotations

import pytest
import torch

from vitpos.hooks import remove_rope
from vitpos.models.planted_rope import make_inert, make_one_axis, make_silent, planted_surface
from vitpos.validation.rope_cases import rope_cases
from vitpos.validation.table import rope_case

# the held-out ones and the design case built for one condition ("interacting axes"): test_planted_rope_power.py
CASES = [c for c in rope_cases() if c.split == "design" and c.name != "interacting axes"]


def test_the_edits_do_what_the_cases_rely_on():
    """inert: no rotation changes anything; one-axis: the other axis' rotation changes nothing;
    silent: the block is the identity."""
    s = planted_surface()
    make_inert(s, 0, 0)
    make_one_axis(s, 1, 0, "row")
    make_silent(s, 1)
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        t = s.embed_tokens(x)
        clean0 = s.run_blocks(t, 0, 1)
        with remove_rope(s, {"row": [0], "col": [0]}, layers=[0]):
            assert torch.equal(s.run_blocks(t, 0, 1), clean0)  # head 0 of layer 0 is inert
        with remove_rope(s, {"row": [1]}, layers=[0]):
            assert not torch.equal(s.run_blocks(t, 0, 1), clean0)  # head 1 is not
        assert torch.equal(s.run_blocks(clean0, 1, 2), clean0)  # layer 1 is silent
    s = planted_surface()
    make_one_axis(s, 1, 0, "row")
    with torch.no_grad():
        t = s.run_blocks(s.embed_tokens(x), 0, 1)
        clean1 = s.run_blocks(t, 1, 2)
        with remove_rope(s, {"col": [0]}, layers=[1]):
            assert torch.equal(s.run_blocks(t, 1, 2), clean1)  # a row-only head ignores the column rotation
        with remove_rope(s, {"row": [0]}, layers=[1]):
            assert not torch.equal(s.run_blocks(t, 1, 2), clean1)


def test_every_claim_has_a_planted_true_and_a_planted_false_case():
    for claim in ("C3", "C4", "C5"):
        assert {c.truth for c in CASES if c.claim == claim} == {True, False}, claim


@pytest.mark.parametrize("case", CASES, ids=[f"{c.claim}-{c.name}" for c in CASES])
def test_verdict_matches_the_planted_truth(case, planted_inputs):
    (row,) = planted_inputs.table([rope_case(case)]).rows
    assert row.passes and row.claim == case.claim and row.planted == case.truth, (row.verdict, row.evidence)


def test_table_renders_and_reports_a_miss(planted_inputs):
    table = planted_inputs.table([rope_case(CASES[0])])
    (good,) = table.rows
    bad = good.model_copy(update={"verdict": "inconclusive", "passes": False})
    assert table.passes and not table.model_copy(update={"rows": [good, bad]}).passes
    assert "**no**" in table.model_copy(update={"rows": [good, bad]}).markdown()
