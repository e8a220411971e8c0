"""What an experiment is: a name, the models it applies to, its settings, a typed result, the
figures it draws and its report section.

An experiment is one module: its `Settings` (the single source of its defaults: the run config's
section named like the experiment and its `--quick` sizes are derived from them), its `Result`,
`run_stage`, `plan`, `figures`, its report `section` and `summary` line (rendered by the module
`<name>_section.py` beside it). The study (`vitpos.study`) loops over the registry
(`vitpos.experiments.registry`, where `register` adds one); the report renders the figures and the
section each experiment declares; the CLI calls the experiments' library functions.
An experiment never imports another experiment: what several share lives in `common.py`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Any,
    ClassVar,
    Generic,
    Literal,
    Self,  # a TypeVar default (PEP 696) on Python 3.11
    cast,
)

from pydantic import BaseModel, ConfigDict
from typing_extensions import TypeVar

from vitpos.io import write_json
from vitpos.models.surface import ModelSurface
from vitpos.results.base import Result, Skipped
from vitpos.results.claim_rules import ClaimRules


class Settings(BaseModel):
    """Base of every experiment's settings: the run config's section named like the experiment.

    Frozen, unknown keys refused; its field defaults are the defaults of the study's stage and of the
    experiment's command, whose options are generated from the fields (`vitpos.commands.options`).
    `QUICK`: the `vitpos run --quick` sizes, overrides of those defaults.

    A stage's settings (`Experiment.stage_settings`) are an instance of the experiment's settings type or
    of a subclass adding what the stage derives (e.g. the SAE layer the probes chose); their
    `model_dump(mode="json")` keys the study's stage cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    QUICK: ClassVar[Mapping[str, Any]] = {}

    def updated(self, **changes: Any) -> Self:
        """A copy with `changes`, validated (bounds checked, unlike `model_copy(update=)`); nested
        settings stay the instances they are."""
        return self.model_validate({**{k: getattr(self, k) for k in type(self).model_fields}, **changes})


R = TypeVar("R", bound=Result)
S = TypeVar("S", bound=Settings, default=Settings)  # an experiment's stage settings
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
    settings: Settings


@dataclass(frozen=True)
class StageInput(Generic[S]):
    """What the study hands an experiment's stage: the data, the seed, earlier results of the same
    model (by experiment name), the stage's own settings, where to write artifacts."""

    data: str
    seed: int
    settings: S
    prior: Mapping[str, Done]
    out: Path
    progress: bool
    quick: bool
    root: Path | None = None  # the study's output folder: artifact paths in results are relative to it


def probe_train_tokens(n_images: int, num_patches: int, cap: int | None, test_frac: float = 0.25) -> int:
    """Training tokens of one fit_position_probes call on n_images (its split and token cap)."""
    n_test = max(1, round(test_frac * n_images))
    n_train = max(0, n_images - n_test)
    total = n_train * num_patches
    if cap is None or cap >= total:
        return total
    return min(cap, n_train * max(1, cap // max(1, n_train)))


@dataclass(frozen=True)
class SplitSizes:
    """Images in each split of the stage's data (None: unknown); `n` is what dataset_for(limit=) yields."""

    train: int | None = None
    test: int | None = None
    val: int | None = None

    def n(self, split: str, limit: int | None) -> int:
        size = getattr(self, split)
        if limit is None:
            if size is None:
                raise ValueError(f"the {split} split's size is unknown and no image count was given")
            return size
        return limit if size is None else min(limit, size)


@dataclass(frozen=True)
class StagePlan:
    """What one stage computes, counted from its settings without running it.

    forwards: images through the patch embedding (a forward from the input);
    blocks: image x block evaluations, full and partial forwards alike (a forward from a stored
      residual stream at layer l costs depth - l blocks and no forward);
    fits: probe fits (fit_position_probes calls, each a row and a column probe);
    fit_work: training tokens x softmax heads fitted, summed over the fits (their cost; the L2 path
      of a fit fits 2 heads per L2 value, the final refit 2, or 4 with control probes);
    sae_tokens: SAE training tokens (x epochs); sae_work: those tokens x the SAE's latents (their cost)."""

    forwards: int = 0
    blocks: int = 0
    fits: int = 0
    fit_work: int = 0
    sae_tokens: int = 0
    sae_work: int = 0
    note: str = ""

    def __add__(self, other: StagePlan) -> StagePlan:
        note = "; ".join(n for n in (self.note, other.note) if n)
        return StagePlan(self.forwards + other.forwards, self.blocks + other.blocks, self.fits + other.fits,
                         self.fit_work + other.fit_work, self.sae_tokens + other.sae_tokens,
                         self.sae_work + other.sae_work, note)

    @staticmethod
    def full(images: int, depth: int, passes: int = 1) -> StagePlan:
        """`passes` full forwards of `images` images."""
        return StagePlan(forwards=images * passes, blocks=images * depth * passes)

    @staticmethod
    def probe_fits(count: int, n_images: int, num_patches: int, cap: int | None, l2_values: int,
                   control: bool = False) -> StagePlan:
        heads = 2 * l2_values + (4 if control else 2)
        return StagePlan(fits=count, fit_work=count * heads * probe_train_tokens(n_images, num_patches, cap))


class Experiment(ABC, Generic[R, S]):
    """One measurement of the study, generic over its result and its stage settings `S` (by default its
    `settings_type`). Subclasses set the class attributes and implement the hooks."""

    name: ClassVar[str]  # key in results.json, stage name, figure-key suffix
    # The version of what the stage computes: it keys the study's stage cache (with the versions of
    # the experiments it requires, whose results it reads). Bump it when a change moves its numbers
    # or its result's fields, and a rerun on a cached OUT recomputes this stage (and the stages that
    # read it) only; every other stage stays cached.
    version: ClassVar[int] = 1
    title: ClassVar[str]  # section title in the report
    claims: ClassVar[tuple[str, ...]] = ()  # claim ids (vitpos.claims.registry) this experiment informs
    result_type: ClassVar[type[Result]]
    requires: ClassVar[tuple[str, ...]] = ()  # experiments whose results `run_stage` reads
    scheme: ClassVar[Literal["rope", "ape"] | None] = None  # the position encoding it tests (None: any)
    # The run config's section named like the experiment (`RunConfig` builds its sections from the
    # registry); None: the experiment has no section of its own (eval reads `eval_images`).
    settings_type: ClassVar[type[Settings] | None] = None

    def settings_of(self, config: Any) -> Settings:
        """This experiment's section of a run config (`vitpos.study.config.RunConfig`)."""
        return config.section(self.name)

    def applies_to(self, surface: ModelSurface) -> str | None:
        """None when the experiment applies to this model, else the reason it does not (by default:
        the model lacks the position encoding `scheme` names)."""
        if self.scheme == "rope" and not surface.has_rope:
            return f"no rotary embedding (scheme {surface.scheme})"
        if self.scheme == "ape" and not surface.has_ape:
            return f"no absolute position embedding (scheme {surface.scheme})"
        return None

    def applies_to_data(self, data: str) -> str | None:
        """None when the experiment can read `data`, else why not (by default every dataset it can load)."""
        return None

    def disabled(self, config: Any) -> str | None:
        """None when the run config lets the stage run, else why it is off (the study records it as not
        applicable, with this reason, like a model without the experiment's position encoding)."""
        return None

    def stage_settings(self, config: Any, surface: ModelSurface, prior: Mapping[str, Done], quick: bool) -> S:
        """The settings that define this stage's result (their JSON keys the study's cache); by default
        the run config's section named like the experiment (of type `settings_type`, which is `S` for an
        experiment that does not override this)."""
        return cast(S, self.settings_of(config))

    @abstractmethod
    def run_stage(self, surface: ModelSurface, stage: StageInput[S]) -> R:
        """Run the measurement for the study (no figures: the study draws them once)."""

    def plan_settings(self, config: Any, surface: ModelSurface, planned: Mapping[str, Settings], quick: bool) -> S:
        """The stage's settings before earlier stages ran (`planned`: their planned settings by
        name); stages whose settings read earlier results override this with a best guess."""
        return self.stage_settings(config, surface, {}, quick)

    def check(self, settings: S, surface: ModelSurface, data: str, sizes: SplitSizes | None) -> None:
        """Raise VitposError (naming the config key) when `run_stage` would refuse these settings on
        this model: the study checks every stage before the first runs (and `--plan` exits on it)."""

    def plan(self, settings: S, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        """Forwards, block evaluations and probe fits `run_stage` will do with these settings (pure:
        counted from the settings and the model's shape; `sizes` caps the image counts)."""
        return StagePlan(note="not counted")

    def artifacts_ready(self, result: R, root: Path | None = None) -> bool:
        """False when files a cached result points to (e.g. SAE weights) are gone: the stage reruns.
        root: the output folder the result's relative artifact paths are in."""
        return True

    def figures(self, result: R) -> list[Figure]:
        """The figures this result supports (the report shows them in this order)."""
        return []

    def section(self, result: R, claims: ClaimRules) -> str | None:
        """The body of this experiment's section in report.html (HTML, shown below its figures),
        rendered with `vitpos.report.format`'s helpers; `claims`: the claims' rules, for a section
        that shows a claim's reading beside its numbers (an experiment never imports the claims).
        None: the report lists the result's fields."""
        return None

    def summary(self, result: R, claim: str) -> str | None:
        """One line of this result's headline numbers for `claim`: the headline table shows it in the
        other scheme's column of a claim this experiment informs first (None: no line)."""
        return None

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
