"""Planted RoPE cases with power (vitpos.models.planted_rope_power, issue 46): each held-out
planted-false case comes out as planted, and the one condition it was built to fail is the only one
that fails, so `ValidationTable.power()` credits that condition (METHODS.md, Power)."""

from __future__ import annotations

import pytest
import torch

from vitpos.hooks import remove_rope
from vitpos.models.planted_rope import flat_images
from vitpos.models.planted_rope_power import c3_entangled
from vitpos.validation.rope_cases import rope_cases
from vitpos.validation.table import rope_case, validation_table

# case name -> the condition that alone decides it (None: planted true, every condition holds)
TARGETS: dict[str, str | None] = {
    "row in rings": "mlp_removed",
    "entangled axes": "kept",
    "complete rebuild": "partial",
    "redundant rebuilders": "head_share",
}
CASES = [c for c in rope_cases() if c.name in TARGETS]


def test_every_power_case_is_listed_and_held_out():
    assert {c.name for c in CASES} == set(TARGETS)
    assert all(c.split == "held_out" for c in CASES)
    assert all(c.truth == (TARGETS[c.name] is None) for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.claim}-{c.name}" for c in CASES])
def test_the_case_is_decided_by_its_target_condition_alone(case):
    table = validation_table([rope_case(case)])
    (row,) = table.rows
    assert row.passes and row.split == "held_out", (row.verdict, row.evidence)
    target = TARGETS[case.name]
    if target is None:
        assert set(row.conditions.values()) == {"holds"}, row.conditions
        return
    assert row.decided_by == [target], row.conditions
    assert table.power()[case.claim][target] == 1, table.power()


def test_the_gate_reads_the_columns_only_where_the_row_rotation_is_not_the_identity():
    """entangled axes: on identical patches, block 0's output varies with the column on rows 1-3,
    not on row 0 (the gate shut), and with the row rotations removed on no row at all."""
    s = c3_entangled()
    x = flat_images(1, content=0.0).float() / 255  # every patch the same content
    H, W = s.grid
    with torch.no_grad():
        clean = s.run_blocks(s.embed_tokens(x), 0, 1)[0, -H * W:].reshape(H, W, -1)
        with remove_rope(s, {"row": None}):
            off = s.run_blocks(s.embed_tokens(x), 0, 1)[0, -H * W:].reshape(H, W, -1)

    def spread(t: torch.Tensor) -> float:  # largest difference between the columns of a row
        return float((t - t[:1]).abs().max())

    assert spread(clean[0]) < 1e-3 and min(spread(clean[r]) for r in range(1, H)) > 1.0
    assert max(spread(off[r]) for r in range(H)) < 1e-3
