"""Planted RoPE cases with power (vitpos.models.planted_rope_power, issue 46): each held-out
planted-false case comes out as planted, and the one condition it was built to fail is the only one
that fails, so `ValidationTable.power()` credits that condition (METHODS.md, Power); the C4 cases
built for a pipeline mutation (`MUTATED`) flip under it."""

from __future__ import annotations

import pytest
import torch

from vitpos.data.base import to_float
from vitpos.hooks import remove_rope
from vitpos.models.planted_rope import _eva, flat_images
from vitpos.models.planted_rope_power import c3_entangled, c3_interacting, c4_hidden
from vitpos.validation.mutations import PIPELINE_MUTATIONS, applied
from vitpos.validation.rope_cases import rope_cases
from vitpos.validation.table import rope_case, validation_table

# case name -> the condition that alone decides it (None: planted true, every condition holds)
TARGETS: dict[str, str | None] = {
    "row in rings": "mlp_removed",
    "entangled axes": "kept",
    "interacting axes": "not_interacting",
    "complete rebuild": "partial",
    "redundant rebuilders": "head_share",
    "weakly biased rebuilders": "specialised",
    "specialised where it rebuilds": None,
    "column in content": None,
}
# case name -> the pipeline mutation that must flip its verdict (only that defence tells it apart) and the
# condition whose outcome it moves
MUTATED: dict[str, tuple[str, str]] = {
    "weakly biased rebuilders": ("C4 S threshold 0.5", "specialised"),
    "specialised where it rebuilds": ("C4 S from clean attention", "specialised"),
    "column in content": ("C3 floor at chance", "removed"),
}
CASES = [c for c in rope_cases() if c.name in TARGETS]


# built knowing the rule condition (or defence) that decides them: rules version 5, issue 46's mutations
DESIGN = {"interacting axes", "column in content"}


def test_every_power_case_is_listed_and_its_split_says_whether_a_rule_saw_it():
    assert {c.name for c in CASES} == set(TARGETS)
    assert all(c.split == ("design" if c.name in DESIGN else "held_out") for c in CASES)
    assert all(c.truth == (TARGETS[c.name] is None) for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.claim}-{c.name}" for c in CASES])
def test_the_case_is_decided_by_its_target_condition_alone(case, planted_inputs):
    table = planted_inputs.table([rope_case(case)])
    (row,) = table.rows
    assert row.passes and row.split == ("design" if case.name in DESIGN else "held_out"), (row.verdict, row.evidence)
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


def test_the_inverted_gate_reads_the_columns_on_the_top_rows_and_everywhere_once_the_rows_are_removed():
    """interacting axes: on identical patches, block 0's output varies with the column on the top half of
    the rows only; with the row rotations removed, on every row (the columns gain when the rows go)."""
    s = c3_interacting()
    x = flat_images(1, content=0.0).float() / 255
    H, W = s.grid
    with torch.no_grad():
        clean = s.run_blocks(s.embed_tokens(x), 0, 1)[0, -H * W:].reshape(H, W, -1)
        with remove_rope(s, {"row": None}):
            off = s.run_blocks(s.embed_tokens(x), 0, 1)[0, -H * W:].reshape(H, W, -1)

    def spread(t: torch.Tensor) -> float:
        return float((t - t[:1]).abs().max())

    assert min(spread(clean[r]) for r in range(H // 2)) > 1.0 and max(spread(clean[r]) for r in range(H // 2, H)) < 1e-3
    assert min(spread(off[r]) for r in range(H)) > 1.0


@pytest.mark.parametrize("name", sorted(MUTATED))
def test_the_mutation_it_was_built_for_flips_it(name):
    """Under its mutation the case's verdict moves: the weakly biased rebuilders' S (between 0.5 and
    the null threshold) passes a 0.5 threshold; the hidden-axis head's clean-attention S (~0.6) fails
    the null threshold that its restore-condition S (~1) clears; the column in content, measured
    against chance, looks kept where content carries it (layer 0: nothing removed), so under half of
    it reads removed."""
    (case,) = [c for c in CASES if c.name == name]
    mutation, condition = MUTATED[name]
    (m,) = [m for m in PIPELINE_MUTATIONS if m.name == mutation]
    with applied(m):
        (row,) = validation_table([rope_case(case)]).rows
    assert not row.passes, (row.verdict, row.conditions)
    assert row.conditions[condition] == ("fails" if case.truth else "holds"), row.conditions
    if name == "column in content":  # the col removal alone moves it
        assert [k for k, v in row.conditions.items() if v != "holds"] == ["removed"], row.conditions


def test_the_hidden_channels_are_quiet_only_where_the_head_rebuilds():
    """specialised where it rebuilds: the row rebuilder's col query channels are ~0 on the stream
    entering the last block with every rotation off before it (~0.1 of them: noise of the
    near-constant images), and large on the clean stream."""
    s = c4_hidden()
    last, d = s.depth - 1, s.head_dim
    block = _eva(s).blocks[last]
    cols = s.rope_axis_map().channels("col")  # type: ignore[arg-type]
    x = to_float(flat_images(16, seed=1))
    with torch.no_grad():
        clean = s.run_blocks(s.embed_tokens(x), 0, last)
        with remove_rope(s, {"row": None, "col": None}, layers=range(last)):
            restored = s.run_blocks(s.embed_tokens(x), 0, last)

        def col_query(stream: torch.Tensor) -> float:  # mean norm of head 0's col query channels, patch queries
            q = block.attn.qkv(block.norm1(stream))[:, s.num_prefix_tokens:, :d]
            return float(q[..., cols].norm(dim=-1).mean())

    assert col_query(restored) < 0.15 * col_query(clean), (col_query(restored), col_query(clean))


def test_the_content_floor_holds_the_column_content_gives(planted_inputs):
    """column in content: layer 0 (the embedding: block 0 silent) decodes the column from content
    alone, well above chance, and alike under the baseline, no_col and no_both, so above its floor it
    drops out; at layer 1 the rotations add the rest and removing them leaves about the floor. Above the
    floor ~all of the column is removed; above chance layer 0 counts as nothing removed (at most half)."""
    (case,) = [c for c in CASES if c.name == "column in content"]
    ra = planted_inputs(rope_case(case), 300, (0, 1)).rope_axis
    assert ra is not None and ra.removal_floored is not None and ra.removal is not None
    c, chance = ra.conditions, ra.chance_col
    layer0 = {n: c[n].col_acc[0] for n in ("baseline", "no_col", "no_both")}
    assert len(set(layer0.values())) == 1 and layer0["no_both"] > chance + 0.1, layer0
    assert c["baseline"].col_acc[1] > 0.9 and abs(c["no_col"].col_acc[1] - c["no_both"].col_acc[1]) < 0.05
    floored = ra.removal_floored["no_col"]
    assert floored.removed_layers == [1] and floored.removed_ci95 is not None and floored.removed_ci95[0] > 0.9
    above_chance = ra.removal["no_col"]
    assert above_chance.removed is not None and above_chance.removed <= 0.5 and above_chance.removed_layers == [0, 1]
