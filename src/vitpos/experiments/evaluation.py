"""E0: test top-1 of the model on the data, the reference every causal drop is measured from.

`top1_ci95`: the Wilson 95 % interval of top-1 (images as independent trials; analysis/stats.py)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from vitpos.analysis.forward import accuracy_report, predict
from vitpos.analysis.stats import accuracy_interval
from vitpos.data.resolve import dataset_for
from vitpos.experiments import evaluation_section
from vitpos.experiments.base import Done, Experiment, Settings, SplitSizes, StageInput, StagePlan
from vitpos.models.surface import ModelSurface
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.evaluation import EvalResult


class EvalSettings(Settings):
    """The eval stage's settings: the run config's top-level `eval_images` (eval has no section)."""

    images: int | None = Field(default=None, ge=1, description="test images; None = the whole test split")


class EvalExperiment(Experiment[EvalResult, EvalSettings]):
    name = "eval"
    version = 1
    title = "Test accuracy"
    result_type = EvalResult

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done], quick: bool) -> EvalSettings:
        return EvalSettings(images=config.eval_images)

    def plan(self, settings: EvalSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        return StagePlan.full(sizes.n("test", settings.images), surface.depth)

    def run_stage(self, surface: ModelSurface, stage: StageInput[EvalSettings]) -> EvalResult:
        dataset = dataset_for(surface, stage.data, "test", limit=stage.settings.images)
        preds, labels = predict(surface, dataset)
        report = accuracy_report(preds, labels, dataset.info)
        return EvalResult.model_validate({**report, "top1_ci95": accuracy_interval(preds == labels)})

    def section(self, result: EvalResult, claims: ClaimRules) -> str:
        return evaluation_section.section(result)

    def summary(self, result: EvalResult, claim: str) -> str:
        return evaluation_section.summary(result)
