"""benchmarks/reproducibility.py reads each claim's headline and interval from two runs' results.json
the way the summary does, and 'inside' compares one run's number with the other's interval."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reproducibility.py"


def load():
    spec = importlib.util.spec_from_file_location("reproducibility", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def results(drop: float, ci: list[float], sel: tuple[float, float]) -> dict:
    return {"summary": {"claims": [
        {"id": "C2", "numbers": {"builtin:ape": {"all_positional_drop": drop, "all_positional_drop_ci95": ci}}},
        {"id": "C1", "numbers": {"builtin:ape": {"row_selectivity": sel[0], "col_selectivity": sel[1],
                                                 "row_selectivity_ci95": [sel[0] - 0.1, sel[0] + 0.1],
                                                 "col_selectivity_ci95": [sel[1] - 0.1, sel[1] + 0.1]}}},
        {"id": "C3", "numbers": {}}]}}


def test_headlines_and_inside_read_each_run_against_the_other():
    mod = load()
    rows = mod.headlines({"1": results(12.0, [9.0, 15.0], (0.7, 0.9)),
                          "2": results(16.0, [15.5, 16.5], (0.72, 0.9))}, ["1", "2"])
    by = {(h.claim, h.model): h for h in rows}
    c2 = by["C2", "builtin:ape"]
    assert c2.values == {"1": 12.0, "2": 16.0}
    assert c2.inside("2", "1") is False and c2.inside("1", "2") is False  # 16 outside [9, 15]; 12 outside
    c1 = by["C1", "builtin:ape"]
    # the smaller of row / col, and its interval from the ends' minima
    assert c1.values["1"] == 0.7 and c1.cis["1"] == pytest.approx([0.6, 0.8])
    assert c1.inside("1", "2") is True and c1.inside("2", "1") is True
    assert not any(h.claim == "C3" for h in rows)  # a claim no model of the runs read has no row
    half = mod.headlines({"1": results(12.0, [9.0, 15.0], (0.7, 0.9)), "2": {"summary": {"claims": []}}}, ["1", "2"])
    assert {h.inside("1", "2") for h in half} == {None}  # a number missing in one run: not compared
