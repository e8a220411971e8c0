"""A trained planted case (`vitpos.validation.trained_cases`) is measured by the study's own stages, every
one the run reads, in its order, and the claims read what they returned: a case read without the layer
sweep (or with a stage returning nothing) would be read on less than `vitpos run` reads. Real stages at
tiny sizes on the shipped `builtin:planted-trained-ape-where`, `max_layers=2` (sites embed, L0, L2):
11 s on 2 cores at load 2 (measured 2026-12-07; the 4-site sweep, nice 10 under load 7: 275 s)."""

from __future__ import annotations

import pytest

from vitpos.experiments.base import StageInput
from vitpos.experiments.registry import BY_NAME
from vitpos.results.base import Result
from vitpos.results.sae_run import SAEResult
from vitpos.validation import trained_cases as tc
from vitpos.validation.table import case_rows

# 64 images x 64 patches: one SAE batch
TINY = tc.TrainedSizes(test_images=24, sae_images=64, sae_epochs=1, expansion=2, k=8, max_layers=2)
WHERE = tc.TRAINED_MODELS[0]


def test_a_trained_case_is_measured_by_every_stage_the_run_reads(monkeypatch, tmp_path):
    calls: list[str] = []
    returned: dict[str, Result] = {}
    for name in tc.STAGES:
        exp = BY_NAME[name]

        def spy(surface, stage: StageInput, _run=exp.run_stage, _name=name) -> Result:
            calls.append(_name)
            returned[_name] = _run(surface, stage)
            return returned[_name]

        monkeypatch.setattr(exp, "run_stage", spy)
    measured = tc.measure_trained(WHERE, TINY, out=tmp_path)
    assert calls == list(tc.STAGES)  # each once, in the run's order
    x = measured.inputs
    # what the claims read is what the stages returned (ClaimInputs.of of the run's ModelEntry)
    assert x.sae_layers is returned["sae_layers"] and x.ape_permute is returned["ape_permute"]
    assert x.sae is returned["sae"] and isinstance(x.sae, SAEResult)  # an SAE the pipeline trained
    assert x.eval is returned["eval"] and x.probe is returned["probe"] and x.scheme == "ape"
    # the sweep starts at the embedding, then the block outputs (2 of 0..2: the first and the last but one)
    sweep = x.sae_layers
    assert sweep is not None and [p.key for p in sweep.points] == ["embed", "L0", "L2"]
    assert all(p.sae is not None and p.permute is not None for p in sweep.points)
    assert sum(p.selection_frequency for p in sweep.points) == pytest.approx(1.0)
    rows = case_rows(tc.trained_case(WHERE, TINY), x)
    assert [(r.claim, r.split, r.planted) for r in rows] == [("C1", "held_out", True), ("C2", "held_out", True)]
    # C1 and C2 are read over the sweep's plausible sites (`over_curve`), not at the single sae layer
    assert all(list(r.conditions) == ["plausible_layers"] for r in rows)
    assert [s.site for s in tc.site_readings(WHERE.spec, x)] == ["embed", "L0", "L2"]


def test_a_trained_rope_case_is_measured_by_the_stages_c3_reads(monkeypatch, tmp_path):
    rope = [m for m in tc.TRAINED_MODELS if m.name == "trained:rope-where"][0]
    assert rope.stages == tc.ROPE_STAGES and set(rope.truth) == {"C3"}
    calls: list[str] = []
    for name in tc.ROPE_STAGES:
        exp = BY_NAME[name]

        def spy(surface, stage: StageInput, _run=exp.run_stage, _name=name) -> Result:
            calls.append(_name)
            return _run(surface, stage)

        monkeypatch.setattr(exp, "run_stage", spy)
    tiny = tc.TrainedSizes(test_images=24, rope_restore=(2,), readout_images=0)  # one restore point, no read-outs
    measured = tc.measure_trained(rope, tiny, out=tmp_path)
    assert calls == list(tc.ROPE_STAGES)
    x = measured.inputs
    assert x.scheme == "rope" and x.rope_axis is not None and x.sae is None and x.sae_layers is None
    assert list(x.rope_axis.recovery["row"]) == ["2"]  # the one restore point asked for
    rows = case_rows(tc.trained_case(rope, tiny), x)
    # C3 read by its own conditions (the run's reading), on what rope_axis measured
    assert [(r.claim, r.split, r.planted) for r in rows] == [("C3", "held_out", True)]
    assert {"removed", "kept"} <= set(rows[0].conditions)
