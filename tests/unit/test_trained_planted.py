"""The trained planted APE cases (issue 46 item 2, issue 47 item 6): the shipped models load, are small and
score what their metrics say; a stage that would not run, or returns nothing, stops a trained case's
measurement (test_trained_planted_stages.py runs the real stages on one)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from conftest import needs_fashion
from vitpos.analysis.forward import predict
from vitpos.data.resolve import dataset_for
from vitpos.errors import VitposError
from vitpos.experiments.registry import BY_NAME
from vitpos.models import load_model
from vitpos.models.spec import BUILTIN_DIR
from vitpos.validation import trained_cases as tc

SHIPPED = {"planted-trained-ape-where": ("shapes", "ape"), "planted-trained-ape-content": ("fashion", "ape"),
           "planted-trained-rope-where": ("shapes", "rope-axial"),
           "planted-trained-rope-ape-where": ("shapes", "rope-ape")}
TINY = tc.TrainedSizes(test_images=24, sae_images=64, sae_epochs=1, expansion=2, k=8)
WHERE = tc.TRAINED_MODELS[0]


def _doc(name: str, file: str) -> Any:
    return json.loads((BUILTIN_DIR / name / file).read_text())


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_trained_models_are_small_and_say_how_they_were_trained(name):
    data, pe = SHIPPED[name]
    folder = BUILTIN_DIR / name
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "metrics.json", "model.safetensors",
                                                        "train_config.json"]
    assert sum(p.stat().st_size for p in folder.iterdir()) <= 1_100_000
    train = _doc(name, "train_config.json")
    assert train["train"]["seed"] == tc.TRAINING_SEED and train["train"]["data"] == data
    assert (train["model"]["pe"], train["model"]["embed_dim"], train["model"]["depth"]) == (pe, 64, 4)
    metrics = _doc(name, "metrics.json")
    assert metrics["data"] == data and metrics["pe"] == pe
    case = [m for m in tc.TRAINED_MODELS if m.spec == f"builtin:{name}"]
    assert not case or case[0].data == data  # a case reads the data its model was trained on


def _recomputed_top1(name: str, n: int = 300) -> tuple[float, float]:
    surface = load_model(f"builtin:{name}")
    preds, labels = predict(surface, dataset_for(surface, SHIPPED[name][0], "test", limit=n))
    return float((preds == labels).float().mean()), float(_doc(name, "metrics.json")["test_top1"])


def _within(recomputed: float, stored: float, n: int = 300) -> bool:
    # the stored top-1 is on the whole test split, ours on its first n images: 4 binomial SEs and a point
    return abs(recomputed - stored) <= 4 * math.sqrt(max(stored * (1 - stored), 1e-4) / n) + 0.01


@pytest.mark.parametrize("name", ["planted-trained-ape-where", "planted-trained-rope-where",
                                  "planted-trained-rope-ape-where"])
def test_the_where_models_score_what_their_metrics_say(name):
    got, stored = _recomputed_top1(name)
    assert stored > 0.9 and _within(got, stored), (got, stored)


@needs_fashion
def test_the_content_model_scores_what_its_metrics_say():
    got, stored = _recomputed_top1("planted-trained-ape-content")
    assert stored > 0.5 and _within(got, stored), (got, stored)


def test_a_stage_that_would_not_run_is_refused_before_any_stage_runs(monkeypatch, tmp_path):
    ran: list[str] = []
    for name in tc.STAGES:
        monkeypatch.setattr(BY_NAME[name], "run_stage", lambda surface, stage, _n=name: ran.append(_n))
    monkeypatch.setattr(BY_NAME["sae_layers"], "disabled", lambda cfg: "turned off")
    with pytest.raises(VitposError, match="sae_layers would not run"):
        tc.measure_trained(WHERE, TINY, out=tmp_path)
    assert ran == []


def test_a_stage_that_returns_nothing_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(BY_NAME["eval"], "run_stage", lambda surface, stage: None)
    with pytest.raises(VitposError, match="eval returned no result"):
        tc.measure_trained(WHERE, TINY, out=tmp_path)
