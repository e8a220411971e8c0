"""Results written by older code: they load with the numbers they hold, or give one `error:` line;
never a result silently missing a measurement its claims read."""

from __future__ import annotations

import copy

import pytest

from conftest import GOLDEN
from vitpos.errors import VitposError
from vitpos.study.results import StudyResults


def test_the_golden_results_file_still_loads_with_its_numbers():
    res = StudyResults.from_json(copy.deepcopy(GOLDEN))
    ape = res.models["builtin:ape"]
    assert ape.to_json()["eval"]["top1"] == GOLDEN["models"]["builtin:ape"]["eval"]["top1"]
    assert ape.to_json()["sae"]["causal"] == GOLDEN["models"]["builtin:ape"]["sae"]["causal"]


@pytest.mark.parametrize("model, path", [
    ("builtin:ape", ("eval", "top1_ci95")),  # eval's interval, once optional for results written before it
    ("builtin:ape", ("sae", "causal", "ablate_row", "selectivity_ci95")),  # C1 reads it
    ("builtin:rope-axial", ("rope_heads", "primary_margin_ci95")),  # C5 reads it (no fallback tiers any more)
    ("builtin:rope-axial", ("rope_heads", "drop_ci95")),
])
def test_a_result_missing_a_measurement_is_one_error_line_naming_it(model, path, tmp_path):
    from vitpos.report.html import render_report

    doc = copy.deepcopy(GOLDEN)
    node = doc["models"][model]
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    with pytest.raises(VitposError) as e:
        render_report(doc, tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and path[-1] in msg and "rerun `vitpos run`" in msg
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_an_sae_result_without_class_logits_reads_back_as_written():
    """A headless model's SAE (DINOv2 on natural crops) has no top-1: its JSON must still load, or the
    study's stage cache recomputes the SAE stage on every resume (it once did: 19 min on DINOv2)."""
    from vitpos.results.sae_run import SAEResult

    doc = {**copy.deepcopy(GOLDEN["models"]["builtin:ape"]["sae"]),
           "logit_kl": None, "top1": None, "top1_spliced": None, "top1_change_points": None}
    result = SAEResult.model_validate(doc)
    assert SAEResult.model_validate(result.to_json()) == result
