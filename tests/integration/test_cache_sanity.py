"""A stage-cache entry holding a number that cannot be right is damaged: the stage is recomputed
(said once, as for an unparsable entry), and results.json holds the recomputed value, never the
edited one. Covers a NaN / infinite / 7.5 top-1, a validation row whose `passes` contradicts its
verdict, rules of an unknown version, and a truncated SAE weights file (the sae stage retrains).

The quick study of builtin:ape at test_stage_rebuild.py's sizes; the planted-model validation table
(minutes to measure) is stood in for by a small consistent table."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from vitpos.claims.registry import rule_set
from vitpos.cli import main
from vitpos.study.sanity import impossible, retyped, validation_problem
from vitpos.validation.table import ValidationRow, ValidationTable


def _table() -> ValidationTable:
    rows = [ValidationRow(claim="C1", case="planted", description="d", planted=True, verdict="supported",
                          expected="supported", passes=True, evidence="e"),
            ValidationRow(claim="C2", case="planted", description="d", planted=False, verdict="supported",
                          expected="not supported", passes=False, evidence="e")]
    rules = rule_set()
    return ValidationTable(rules_version=rules.version, rules_hash=rules.digest(), n_images=8, seeds=[0], rows=rows)


@pytest.fixture
def measured(monkeypatch) -> list[int]:
    """Stand in for the planted-model validation table; counts its measurements."""
    calls: list[int] = []
    monkeypatch.setattr("vitpos.study.run.validation_table", lambda **kw: calls.append(1) or _table())
    return calls


MODEL = "builtin:ape"  # the quickest study test_stage_rebuild.py runs: every stage, the SAE among them
SMALL = {"eval_images": 16, "probe": {"images": 16}, "sae": {"images": 64, "eval_images": 16, "epochs": 1,
                                                                 "expansion": 1, "stability": False, "browse": False},
         "ape_permute": {"images": 8, "seeds": 1}, "extrapolate": {"images": 8}}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[list[str], Path]:
    """(the run's arguments but --out, the output of a finished run)."""
    root = tmp_path_factory.mktemp("cache_sanity")
    config = root / "run.yaml"
    config.write_text(json.dumps(SMALL))  # JSON is YAML
    out = root / "out"
    args = ["run", "--quick", "--no-progress", "--models", MODEL, "--config", str(config)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("vitpos.study.run.validation_table", lambda **kw: _table())
        assert _main([*args, "--out", str(out)]) == 0
    return args, out


def _main(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def _edit_entry(path: Path, edit: Callable[[dict], None]) -> None:
    """The entry as if the stage itself had written the edited result (its digest matches): what the run's
    checks of the numbers must catch (a hand edit is caught earlier, by the digest: test_stage_cache_digest)."""
    from vitpos.study.cache import entry_digest

    doc = json.loads(path.read_text())
    edit(doc["result"])
    doc["digest"] = entry_digest(doc)
    path.write_text(json.dumps(doc))  # json writes NaN as the literal NaN


def _copy(world: tuple[list[str], Path], tmp_path: Path) -> tuple[Path, list[str]]:
    """A copy of the finished run, and the arguments that rerun it."""
    args, out = world
    copy = shutil.copytree(out, tmp_path / "out")
    return copy, [*args, "--out", str(copy)]


def _run(args: list[str], capsys) -> str:
    capsys.readouterr()
    assert _main(args) == 0
    cap = capsys.readouterr()
    return " ".join((cap.out + cap.err).split())


@pytest.mark.parametrize("value", [float("nan"), 7.5, float("inf"), -0.5, "0.5"],
                         ids=["nan", "7.5", "inf", "negative", "string"])  # "0.5": parsed as a number by the schema
def test_an_impossible_cached_top1_is_recomputed(value, world, tmp_path, capsys, measured):
    out, args = _copy(world, tmp_path)
    (entry,) = (out / "stages").glob("*/eval-*.json")
    truth = json.loads(entry.read_text())["result"]["top1"]
    _edit_entry(entry, lambda r: r.update(top1=value))
    said = _run(args, capsys)
    assert said.count("damaged stage-cache entry") == 1 and "top1 is" in said and "recomputing it" in said, said
    assert "] eval ..." in said and "] probe: cached" in said  # that stage only
    (model,) = json.loads((out / "results.json").read_text())["models"].values()
    assert model["eval"]["top1"] == truth
    assert json.loads(entry.read_text())["result"]["top1"] == truth  # the entry is whole again
    assert measured == []  # the validation table stayed cached


def _contradict(r: dict) -> None:
    r["rows"][0].update(verdict="inconclusive", passes=True)  # inconclusive passes neither way


@pytest.mark.parametrize("edit", [_contradict, lambda r: r.update(rules_version=99),
                                  lambda r: r["rows"][1].update(passes=True)],
                         ids=["inconclusive_passes", "rules_version_99", "wrong_verdict_passes"])
def test_an_inconsistent_cached_validation_table_is_recomputed(edit, world, tmp_path, capsys, measured):
    out, args = _copy(world, tmp_path)
    (entry,) = (out / "stages" / "validation").glob("table-*.json")
    _edit_entry(entry, edit)
    said = _run(args, capsys)
    assert said.count("damaged stage-cache entry") == 1 and "recomputing it" in said, said
    assert measured == [1]
    validation = json.loads((out / "results.json").read_text())["summary"]["validation"]
    assert validation == _table().model_dump(mode="json")


def test_a_truncated_cached_sae_is_retrained(world, tmp_path, capsys, measured):
    """The sae stage's weights cut short: retrained (not refused with 're-train or re-copy it'); an extra
    claim seed's: tests/unit/test_sae.py::test_a_truncated_extra_seed_is_not_a_finished_run."""
    out, args = _copy(world, tmp_path)
    (weights,) = (out / "artifacts").glob("*/sae/sae.safetensors")
    raw = weights.read_bytes()
    weights.write_bytes(raw[: len(raw) // 2])
    said = _run(args, capsys)
    assert "sae: cached, but its files" in said and "gone or damaged: recomputing it" in said, said
    assert "] sae ..." in said and "] ape_permute ..." in said  # what reads the SAE is recomputed too
    assert len(weights.read_bytes()) == len(raw)


def test_a_value_the_schema_retyped_is_named():
    """A hand edit that the result schema's lax parsing takes in (a string for a number, a number for a
    flag) is not an entry vitpos wrote: named, for the recompute (issue 49)."""
    assert retyped({"top1": "0.5", "n": 3}, {"top1": 0.5, "n": 3}) == \
        "top1 is the string '0.5', where the result holds a number"
    assert retyped({"x": {"rows": [{"ok": 1}]}}, {"x": {"rows": [{"ok": True}]}}) == \
        "x.rows[0].ok is the number 1, where the result holds a boolean"
    # as written: no problem (ints for floats, None, keys only one side has)
    assert retyped({"top1": 1, "ci": None, "old": 2}, {"top1": 1.0, "ci": [0.1, 0.2], "new": 3}) is None


def test_the_bounds_by_name():
    nan, inf = float("nan"), float("inf")
    assert impossible({"top1": nan}) == "top1 is NaN"
    assert impossible({"x": {"val_top1_by_l2": [0.5, 1.5]}}) == "x.val_top1_by_l2 is 1.5, outside [0, 1]"
    assert impossible({"per_class": {"cat": 1.2}}) == "per_class.cat is 1.2, outside [0, 1]"
    assert impossible({"row_acc": [0.1, -0.1]}) is not None and impossible({"dead_frac": 2.0}) is not None
    assert impossible({"seconds": inf}) == "seconds is inf"
    # not fractions: drops, changes in points, counts, shares and a group's drop object
    assert impossible({"top1_drop": -0.3, "top1_change_points": -20.0, "n_top1_images": 300, "mean_share": 1.4,
                       "per_group": {"v": {"top1": 0.5, "drop": 3.0}}}) is None
    # NaN is a measurement where a value can be undefined (rope_heads' rebuild score)
    assert impossible({"rebuild_score": [[nan, 0.1]]}) is None
    assert validation_problem(_table().model_dump(mode="json")) is None
