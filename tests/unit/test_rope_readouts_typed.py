"""rope_axis `readouts.removal` is typed (`ReadoutRemoval`): results written when it was a free-form
dict load, write back the same JSON, and C3 and the report read the same numbers from it."""

from __future__ import annotations

import copy
import json

import pytest
from test_claims import axis_doc, claim

from vitpos.experiments.rope_axis_section import _axis_calibrated
from vitpos.results.rope_axis import ReadoutRemoval, RopeAxisResult

KEYS = ("removed", "kept", "removed_pair", "kept_pair")


def fractions(base: float) -> dict:
    """One kind's entry as results.json holds it (the order run_readouts wrote the keys in)."""
    doc: dict = {}
    for i, k in enumerate(KEYS):
        point = base + 0.01 * i
        doc[k], doc[f"{k}_ci95"] = point, [point - 0.05, point + 0.05]
    doc["kept_pair_ci95"] = None  # an undefined interval
    return doc


def readouts_doc() -> dict:
    acc = {"row": 0.9, "col": 0.8, "drow": 0.5, "dcol": 0.4}
    return {"layers": [2], "n_images": 48, "n_test_images": 12,
            "chance": {"row": 0.25, "col": 0.25, "drow": 0.125, "dcol": 0.125},
            "accuracy": {c: {"2": {"linear": dict(acc), "mlp": dict(acc)}}
                         for c in ("baseline", "no_row", "no_col", "no_both")},
            "removal": {"no_row": {"linear": fractions(0.8), "mlp": fractions(0.75)},
                        "no_col": {"linear": fractions(0.7), "mlp": fractions(0.85)}}}


def floored_doc() -> dict:
    return {f"no_{a}": {"removed": 0.9, "removed_ci95": [0.85, 0.95], "kept": 1.0, "kept_ci95": [0.9, 1.1],
                        "removed_layers": [0, 1], "kept_layers": [0, 1], "interaction": False} for a in ("row", "col")}


def full_doc() -> dict:
    from test_claims import BASES

    cls, base, off = BASES["rope_axis"]
    assert cls is RopeAxisResult
    return {**copy.deepcopy(base), **off, **axis_doc(), "removal_floored": floored_doc(),
            "content_floor": {"row": [0.25, 0.25, 0.25], "col": [0.25, 0.25, 0.25]}, "readouts": readouts_doc()}


def test_old_readouts_load_typed_and_write_back_the_same_json():
    doc = full_doc()
    res = RopeAxisResult.model_validate(doc)
    assert res.readouts is not None
    m = res.readouts.removal["no_row"]["mlp"]
    assert isinstance(m, ReadoutRemoval) and m.removed == 0.75 and m.kept_pair_ci95 is None
    assert json.dumps(res.to_json()["readouts"]) == json.dumps(doc["readouts"])  # same keys, order and values
    with pytest.raises(ValueError):
        ReadoutRemoval.model_validate({**fractions(0.5), "extra": 1.0})


def test_c3_reads_the_mlp_fractions_from_the_typed_readouts():
    nums = claim({"m": {"rope_axis": {**axis_doc(), "removal_floored": floored_doc(),
                                      "readouts": readouts_doc()}}}, "C3")["numbers"]["m"]
    mlp = readouts_doc()["removal"]
    for a, b in (("row", "col"), ("col", "row")):
        m = mlp[f"no_{a}"]["mlp"]
        rm, kp = f"no_{a}_{a}_removed", f"no_{a}_{b}_kept"
        for key, num in (("removed", f"{rm}_mlp"), ("kept", f"{kp}_mlp"), ("removed_pair", f"{rm}_pair_mlp"),
                         ("kept_pair", f"{kp}_pair_mlp")):
            assert nums[num] == m[key] and nums[f"{num}_ci95"] == m[f"{key}_ci95"]


def test_report_lists_the_typed_readout_fractions():
    html = _axis_calibrated(RopeAxisResult.model_validate(full_doc()))
    assert ("<td>no_row</td><td>mlp</td><td>75.0% [70.0%, 80.0%]</td><td>76.0% [71.0%, 81.0%]</td>"
            "<td>77.0% [72.0%, 82.0%]</td><td>78.0%</td></tr>") in html  # kept_pair: no interval
