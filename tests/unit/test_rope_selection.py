"""Issue 29's statistics: the count-matched rebuilt share, bootstrap selection frequency, and S
measured where a head rebuilds with its relabelling null."""

from __future__ import annotations

import pytest
import torch

from vitpos.experiments.common import rebuilt_share, rebuilt_share_samples
from vitpos.experiments.rope_heads_analysis import null_split, restore_axis_index, selection_frequency
from vitpos.models.planted_rope import make_one_axis, make_symmetric, planted_surface


def test_rebuilt_share_against_the_clean_gain_over_the_same_layers():
    layers = [0, 1, 2]
    clean, off = [0.9, 0.95, 0.97], [0.3, 0.3, 0.3]
    # restored layers close 0.35 of the 0.6 deficit at R - 1 = 0 by layer 1: share 1 - 0.35 / 0.6
    b = rebuilt_share(clean, off, [0.3, 0.6, 0.97], 1, layers)
    assert b["deficit"] == pytest.approx(0.6)
    assert b["clean_gain"] == [None, pytest.approx(0.05), pytest.approx(0.07)]
    assert b["restore_gain"] == [None, pytest.approx(0.3), pytest.approx(0.67)]
    assert b["share"][1] == pytest.approx(1 - 0.35 / 0.6) and b["share"][2] == pytest.approx(1.0)
    # the layers after R only add what they add in the clean run: Rec > 0, yet nothing is rebuilt
    same_gain = [0.3, 0.3 + 0.05, 0.3 + 0.07]
    b = rebuilt_share(clean, off, same_gain, 1, layers)
    assert b["mean_share"] == pytest.approx(0.0)
    assert (same_gain[1] - off[1]) / (clean[1] - off[1]) > 0  # what Rec would have called partial recovery
    assert rebuilt_share(clean, [0.88, 0.3, 0.3], same_gain, 1, layers)["mean_share"] is None  # deficit < MIN_GAP


class _Fit:
    def __init__(self, acc: torch.Tensor):
        self.acc = acc

    def per_image_acc(self, axis: str) -> torch.Tensor:
        return self.acc


def test_rebuilt_share_samples_are_paired():
    g = torch.Generator().manual_seed(0)
    clean = {i: _Fit(0.6 + 0.4 * torch.rand(60, generator=g, dtype=torch.float64)) for i in range(2)}
    off = {i: _Fit(0.1 * torch.rand(60, generator=g, dtype=torch.float64)) for i in range(2)}
    share = {"layers": [0, 1], "share": [None, 1.0]}
    s = rebuilt_share_samples(clean, off, clean, "row", share, 1)  # restored = clean: the deficit closes
    assert s is not None and torch.allclose(s, torch.ones_like(s))


def test_selection_frequency_counts_argmax_per_resample():
    scores = {(1, 0): torch.tensor([0.5, 0.1, 0.5, float("nan")]), (1, 1): torch.tensor([0.2, 0.3, 0.1, 0.0])}
    assert selection_frequency(scores) == {"L1H0": 0.5, "L1H1": 0.5}
    assert selection_frequency({(1, 0): None}) is None


def test_restore_axis_index_reads_planted_heads_and_its_null_stays_below_one():
    s = planted_surface(depth=2)
    make_one_axis(s, 1, 0, "row")
    make_symmetric(s, 1, 1)
    pairs, n_row = null_split(s, 1, 0)
    assert len(pairs) == s.head_dim // 2 and n_row == len(pairs) // 2
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 4, 4, generator=g).repeat(1, 4, 4).expand(8, 3, 16, 16) * 2 - 1
    res = restore_axis_index(s, x, ("row", "col"), 1, n_null=8)
    assert res.S[0] == [None, None]
    row_head, sym_head = res.S[1]
    assert row_head == pytest.approx(1.0, abs=1e-6)  # removing the column rotation moves nothing
    assert sym_head is not None and abs(sym_head) < 0.05  # row and column alike
    assert res.threshold is not None and 0 < res.threshold < 1 and len(res.null) == 16


def test_readouts_find_planted_positions_and_nothing_where_there_is_none():
    """Tokens that are one-hot codes of (row, col) plus noise: every probe reads both axes and both
    offsets (the MLP at least as well as chance allows); tokens without position read at chance."""
    from vitpos.analysis.readout import chance, readouts

    g = torch.Generator().manual_seed(0)
    H = W = 4
    pos = torch.arange(H * W)
    code = torch.cat([torch.nn.functional.one_hot(pos // W, H), torch.nn.functional.one_hot(pos % W, W)], -1).float()
    tokens = 3 * code.expand(40, -1, -1) + 0.3 * torch.randn(40, H * W, 8, generator=g)
    ch = chance((H, W))
    assert ch["row"] == 0.25 and 0.2 < ch["drow"] < 0.3
    got = readouts(tokens, (H, W))
    for t in ("row", "col"):
        assert float(got["linear"][t].mean()) > 0.95 and float(got["mlp"][t].mean()) > 0.95
    for t in ("drow", "dcol"):
        assert float(got["mlp"][t].mean()) > 0.8  # offsets need the MLP: a difference of one-hot codes
    flat = torch.randn(40, H * W, 8, generator=g)
    got = readouts(flat, (H, W))
    for kind in ("linear", "mlp"):
        for t in ("row", "col", "drow", "dcol"):
            assert float(got[kind][t].mean()) < ch[t] + 0.15, (kind, t)


def test_primary_head_over_seeds_counts_each_family():
    from vitpos.claims.base import ModelClaim
    from vitpos.claims.c4 import primary_over_seeds
    from vitpos.claims.intervals import HOLDS

    found = [("builtin:rope-axial", ModelClaim(HOLDS, {"primary_head": [4, 0]})),
             ("builtin:rope-axial-seed1", ModelClaim(HOLDS, {"primary_head": [3, 2]})),
             ("builtin:rope-axial-seed2", ModelClaim(HOLDS, {"primary_head": [4, 0]})),
             ("builtin:rope-mixed", ModelClaim(HOLDS, {"primary_head": [1, 1]}))]
    text = primary_over_seeds(found)
    assert "builtin:rope-axial: L4H0 on 2 of 3 seeds, L3H2 on 1 of 3 seeds" in text and "rope-mixed" not in text
