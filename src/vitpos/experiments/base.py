"""What an experiment is: a name, the models it applies to, a typed result, the figures it draws.

The study (`vitpos.study`) loops over the registry (`vitpos.experiments.registry`); the report
renders the figures each experiment declares; the CLI calls the experiments' library functions.
An experiment never imports another experiment: what several share lives in `common.py`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from vitpos.io import write_json
from vitpos.models.surface import ModelSurface


class Result(BaseModel):
    """Base of every experiment result: a typed object whose JSON is what results.json holds.

    Unknown keys are refused on load, so a result file from another vitpos version fails
    loudly rather than rendering half-empty."""

    model_config = ConfigDict(extra="forbid")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]):
        return cls.model_validate(doc)


class Skipped(BaseModel):
    """An experiment that ran but could not produce its measurement (e.g. no features of a kind)."""

    model_config = ConfigDict(extra="forbid")
    skipped: str


R = TypeVar("R", bound=Result)
Plot = Callable[[Any, Path], Any]


@dataclass(frozen=True)
class Figure:
    """One figure an experiment draws from its result: `plot(result, path)` writes a PNG."""

    name: str
    caption: str
    plot: Plot


@dataclass(frozen=True)
class Done:
    """A finished stage of the same model: its result and the settings that produced it."""

    result: Result
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class StageInput:
    """What the study hands an experiment's stage: the data, the seed, earlier results of the same
    model (by experiment name), the stage's own settings, where to write artifacts."""

    data: str
    seed: int
    settings: Mapping[str, Any]
    prior: Mapping[str, Done]
    out: Path
    progress: bool
    quick: bool


class Experiment(ABC, Generic[R]):
    """One measurement of the study. Subclasses set the class attributes and implement the hooks."""

    name: ClassVar[str]  # key in results.json, stage name, figure-key suffix
    title: ClassVar[str]  # section title in the report
    claims: ClassVar[tuple[str, ...]] = ()  # claim ids (vitpos.study.claims) this experiment informs
    result_type: ClassVar[type[Result]]
    requires: ClassVar[tuple[str, ...]] = ()  # experiments whose results `run_stage` reads

    def applies_to(self, surface: ModelSurface) -> str | None:
        """None when the experiment applies to this model, else the reason it does not."""
        return None

    @abstractmethod
    def stage_settings(self, config: Any, surface: ModelSurface, prior: Mapping[str, Done], quick: bool) -> dict:
        """The settings that define this stage's result (they key the study's cache)."""

    @abstractmethod
    def run_stage(self, surface: ModelSurface, stage: StageInput) -> R:
        """Run the measurement for the study (no figures: the study draws them once)."""

    def artifacts_ready(self, result: R) -> bool:
        """False when files a cached result points to (e.g. SAE weights) are gone: the stage reruns."""
        return True

    def figures(self, result: R) -> list[Figure]:
        """The figures this result supports (the report shows them in this order)."""
        return []

    def load(self, doc: Mapping[str, Any]) -> R | Skipped:
        if "skipped" in doc:
            return Skipped.model_validate(doc)
        return self.result_type.model_validate(doc)  # type: ignore[return-value]

    def write(self, result: R, out: str | Path, json_name: str | None = None) -> None:
        """Write `result` as OUT/<name>.json plus every declared figure as OUT/<figure>.png."""
        out = Path(out)
        write_json(out / (json_name or f"{self.name}.json"), result.to_json())
        for fig in self.figures(result):
            fig.plot(result, out / f"{fig.name}.png")
