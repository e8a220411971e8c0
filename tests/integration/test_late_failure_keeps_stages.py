"""A `vitpos run` refused at a late stage keeps the stages it finished (its resume points), says so in
its one error line, and a rerun serves them from the cache: the DINOv2 study lost 1.5 h of finished
stages this way when a later stage refused its data (fixed in the same change)."""

from __future__ import annotations

import pytest

from vitpos.errors import VitposError


def test_a_run_refused_at_a_late_stage_keeps_its_finished_stages_and_resumes(tmp_path, capsys, monkeypatch):
    from vitpos.cli import main
    from vitpos.experiments.registry import BY_NAME

    def refuse(self, surface, stage):
        raise VitposError("the probe stage refused its settings")

    monkeypatch.setattr(type(BY_NAME["probe"]), "run_stage", refuse)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["run", "--quick", "--models", "builtin:ape", "--out", str(out), "--no-progress"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert e.value.code == 2 and len(err) == 1, err
    assert "the probe stage refused" in err[0] and "rerun the same command to resume" in err[0]
    stages = sorted(p.name.split("-")[0] for p in (out / "stages").rglob("*.json"))
    assert stages == ["eval"], stages  # the one stage before the refusal, finished and kept
    assert not (out / "results.json").exists() and not (out / "report.html").exists()

    monkeypatch.undo()
    main(["run", "--quick", "--models", "builtin:ape", "--out", str(out), "--plan"])
    rows = [line for line in capsys.readouterr().out.splitlines() if " eval " in line]
    assert len(rows) == 1 and "cached" in rows[0], rows


def test_other_commands_still_leave_out_as_they_found_it(tmp_path):
    """Only `run` keeps resume points: the guard of any other command removes all it created."""
    from vitpos.io import OutputGuard

    out = tmp_path / "new"
    guard = OutputGuard(out)
    (out / "stages").mkdir(parents=True)
    (out / "stages" / "x.json").write_text("{}")
    assert guard.restore() == [] and not out.exists()
    kept = OutputGuard(out, keep=("stages",))
    (out / "stages").mkdir(parents=True)
    (out / "stages" / "x.json").write_text("{}")
    (out / "report.html").write_text("half")
    assert kept.restore() == [out / "stages"]
    assert sorted(p.name for p in out.iterdir()) == ["stages"]
