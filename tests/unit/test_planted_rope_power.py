"""Planted RoPE cases with power (vitpos.models.planted_rope_power, issue 46): each held-out
planted-false case comes out as planted, and the one condition it was built to fail is the only one
that fails, so `ValidationTable.power()` credits that condition (METHODS.md, Power)."""

from __future__ import annotations

import pytest

from vitpos.validation.rope_cases import rope_cases
from vitpos.validation.table import rope_case, validation_table

# case name -> the condition that alone decides it (None: planted true, every condition holds)
TARGETS: dict[str, str | None] = {
    "row in rings": "mlp_removed",
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
