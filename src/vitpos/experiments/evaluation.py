"""E0: test top-1 of the model on the data, the reference every causal drop is measured from."""

from __future__ import annotations

from collections.abc import Mapping

from vitpos.analysis.forward import evaluate
from vitpos.data.resolve import dataset_for
from vitpos.experiments.base import Done, Experiment, Result, SplitSizes, StageInput, StagePlan
from vitpos.models.surface import ModelSurface


class EvalResult(Result):
    top1: float
    n: int
    per_class: dict[str, float]  # class name -> accuracy
    per_group: dict[str, float]  # class group (e.g. vertical / horizontal) -> accuracy


class EvalExperiment(Experiment[EvalResult]):
    name = "eval"
    title = "Test accuracy"
    result_type = EvalResult

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done], quick: bool) -> dict:
        return {"images": config.eval_images}

    def plan(self, settings: Mapping, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        return StagePlan.full(sizes.n("test", settings["images"]), surface.depth)

    def run_stage(self, surface: ModelSurface, stage: StageInput) -> EvalResult:
        dataset = dataset_for(surface, stage.data, "test", limit=stage.settings["images"])
        return EvalResult.model_validate(evaluate(surface, dataset, progress=False))
