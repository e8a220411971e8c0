"""Planted RoPE models: the study's own measurements and verdict rules say `supported` where C3-C5
are true by construction and `not supported` where they are false (vitpos.models.planted_rope)."""

from __future__ import annotations

import pytest
import torch

from vitpos.hooks import remove_rope
from vitpos.models.planted_rope import make_inert, make_one_axis, make_silent, planted_surface
from vitpos.validation.rope_cases import ValidationTable, rope_cases, run_case, verdict

CASES = rope_cases()


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
def test_verdict_matches_the_planted_truth(case):
    row = verdict(case, run_case(case))
    assert row.ok, (row.verdict, row.expected, row.evidence)


def test_table_renders_and_reports_a_miss():
    case = CASES[0]
    doc = run_case(case)
    good = verdict(case, doc)
    bad = good.model_copy(update={"verdict": "inconclusive", "ok": False})
    table = ValidationTable(rows=[good, bad])
    assert not table.ok and ValidationTable(rows=[good]).ok
    md = table.markdown()
    assert md.count("\n") == 3 and "| NO |" in md and "| yes |" in md


def test_report_shows_the_count_matched_share_and_the_head_selection():
    from vitpos.experiments.registry import BY_NAME
    from vitpos.report.sections import CLAIM_RULES

    case = next(c for c in CASES if c.claim == "C4" and c.truth)
    res = run_case(case)
    assert res.rope_axis is not None and res.rope_heads is not None
    axis_html = BY_NAME["rope_axis"].section(res.rope_axis, CLAIM_RULES)
    heads_html = BY_NAME["rope_heads"].section(res.rope_heads, CLAIM_RULES)
    share = res.rope_axis.to_json()["median_rebuilt_share"]["row"]["median_share"]
    assert "count-matched" in axis_html and f"{share:.2f}" in axis_html
    assert "content floor" in axis_html
    assert "bootstrap" in heads_html and "restore condition" in heads_html and "L2H0 100.0%" in heads_html
    assert "R=2: L2 h0" in heads_html
