"""Trained planted cases (issue 46 item 2, issue 47 item 6): small own ViTs trained by `vitpos train`
on tasks whose label is a known function of position, or of content only, measured by the study's own
stages -- eval, probe, sae, ape_permute and the layer sweep sae_layers (from the embedding), each through
its experiment's `stage_settings` and `run_stage` as `vitpos run` calls them -- and read by the claims
exactly as a run's models are (`ModelEntry` -> `ClaimInputs.of` -> `summarise`, C1 / C2 over the sweep's
plausible sites by `over_curve`).

Unlike the hand-built cases (`ape_cases`: one-hot position channels, an identity SAE), nothing here is
written by hand: the model learned where to keep position, the SAEs are trained by the pipeline and
typed by its eta^2 rule. What is planted is only the task:

  `builtin:planted-trained-ape-where`    shapes (which of red / blue is above / left of the other): the
      label is a function of position, and a model without position sits at chance (the shipped
      `builtin:none`: 25 %), so the APE model reads it through its table: C1 and C2 planted true.
  `builtin:planted-trained-ape-content`  fashion (Fashion-MNIST class): the label is the garment, a
      function of content; position adds little there (the shipped `fashion-none` reaches 85.8 % against
      `fashion-ape`'s 88.5 %, same recipe as each other): C1 and C2 planted false. It is the weaker planted
      truth of the two: a model that CAN do without position may still have learned to read it
      (docs/methods.md, "Trained planted cases").

The RoPE cases (C3) are read by the stages C3 reads (eval, probe, rope_axis: ROPE_STAGES):

  `builtin:planted-trained-rope-where`      shapes, axial RoPE and no APE: the rotations are the model's
      only source of position (the patch embedding sees pixels, never coordinates), and the row
      rotations carry only rows, the col rotations only columns; so removing one axis' rotations
      removes that axis above the content floor and leaves the other's source in place: C3 planted
      true. The weaker part is "kept": the other axis' source stays, but the layers after it were
      trained with both, and a retrained probe must still find it.
  `builtin:planted-trained-rope-ape-where`  the same task with a learned APE beside the rotations: the
      APE carries row and col into the stream whatever the rotations do, so no axis' rotations add
      decodable position above what the model keeps without any (the floor): C3 planted false (the
      rule's `rotary_position` precondition, or `removed`).
  C4 and C5 have no trained case: what a trained model rebuilds, and with which head, is not fixed by
  its task, so no truth is planted (their cases are the hand-built `planted_rope*` models).

Every case is held out: trained (fresh seed 46) and first measured after rules version 4 was frozen.
Cost: minutes per case on 2 cores (an SAE per swept site), so they are not part of the table every
`vitpos run` appends; `scripts/validation_trained.py` measures them and writes their rows.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from vitpos.claims import c1, c2
from vitpos.claims.inputs import ClaimInputs
from vitpos.claims.intervals import FAILS, INCONCLUSIVE, Interval
from vitpos.claims.registry import rule_set
from vitpos.claims.rules import Thresholds
from vitpos.claims.verdict import ConditionReading
from vitpos.errors import VitposError
from vitpos.experiments.base import Done, Experiment, StageInput
from vitpos.experiments.registry import EXPERIMENTS
from vitpos.models import load_model
from vitpos.models.surface import ModelSurface
from vitpos.results.base import Result
from vitpos.results.sae_layers import LayerPoint
from vitpos.study.config import RunConfig
from vitpos.study.plan import split_sizes
from vitpos.study.results import ModelDescription, ModelEntry
from vitpos.study.validate import check_stage
from vitpos.validation.ape_cases import PlantedCase

# the stages whose results C1 and C2 read, in the registry's order (each after what it requires)
STAGES = ("eval", "probe", "sae", "ape_permute", "sae_layers")
ROPE_STAGES = ("eval", "probe", "rope_axis")  # C3's (rope_axis) and what the run computes before it
TRAINING_SEED = 46  # the planted models' training seed: none of the zoo's 0-2 that rules were read on


@dataclass(frozen=True)
class TrainedSizes:
    """The sizes a trained case is measured at: every SAE (the sae stage's and each swept site's) as the
    sweep's defaults (`SAELayersSettings`), test images for every stage, one permutation seed. The sae
    stage trains no second (stability) SAE and writes no browser page: neither is read by C1 / C2."""

    test_images: int = 400  # eval, probe, each SAE's held-out scoring and causal check, each permutation
    sae_images: int = 1000  # SAE training images (train split), per SAE
    sae_epochs: int = 2
    expansion: int = 4
    k: int = 32
    seeds: int = 1  # permutation seeds per site
    max_layers: int = 8  # block outputs the sweep takes at most (`sae_layers.max_layers`; 8 covers a 4-block model)
    rope_restore: tuple[int, ...] | None = None  # rope_axis' restore points (None: every layer, as the run)
    readout_images: int = 128  # rope_axis' MLP and relative-offset read-outs (0: none)

    def config(self, spec: str, data: str) -> RunConfig:
        """The run config `vitpos run --config` would take for these sizes (stage settings come from it)."""
        sae = {"images": self.sae_images, "eval_images": self.test_images, "epochs": self.sae_epochs,
               "expansion": self.expansion, "k": self.k}
        return RunConfig.model_validate({
            "models": [spec], "data": [data], "seed": 0, "eval_images": self.test_images,
            "probe": {"images": self.test_images},
            "sae": {**sae, "stability": False, "browse": False},
            "ape_permute": {"images": self.test_images, "seeds": self.seeds},
            "sae_layers": {**sae, "permute_images": self.test_images, "seeds": self.seeds,
                           "max_layers": self.max_layers},
            "rope_axis": {"images": self.test_images, "readout_images": min(self.readout_images, self.test_images),
                          "restore": None if self.rope_restore is None else list(self.rope_restore)}})


@dataclass(frozen=True)
class TrainedModel:
    """A shipped planted model, its data and what is true of it by construction."""

    name: str  # the case's name in the table
    spec: str
    data: str
    truth: dict[str, bool]
    description: str
    stages: tuple[str, ...] = STAGES  # the stages whose results the claims of `truth` read


TRAINED_MODELS: tuple[TrainedModel, ...] = (
    TrainedModel("trained:ape-where", "builtin:planted-trained-ape-where", "shapes", {"C1": True, "C2": True},
                 "trained APE ViT (8x8 grid, 4 blocks) on shapes: the label (red above / below / left / right of "
                 "blue) is read from position"),
    TrainedModel("trained:ape-content", "builtin:planted-trained-ape-content", "fashion", {"C1": False, "C2": False},
                 "trained APE ViT (7x7 grid, 4 blocks) on Fashion-MNIST: the label is the garment (content)"),
    TrainedModel("trained:rope-where", "builtin:planted-trained-rope-where", "shapes", {"C3": True},
                 "trained axial-RoPE ViT without APE (8x8 grid, 4 blocks) on shapes: the label is read from position, "
                 "and the row (col) rotations are the model's only source of the row (col)", stages=ROPE_STAGES),
    TrainedModel("trained:rope-ape-where", "builtin:planted-trained-rope-ape-where", "shapes", {"C3": False},
                 "the same with a learned APE beside the rotations: the APE carries row and col into the stream, so "
                 "removing an axis' rotations cannot remove what it lets a probe decode", stages=ROPE_STAGES),
)


@dataclass
class Measured:
    """One model's stage results as the claims read them, and each stage's wall time (s)."""

    inputs: ClaimInputs
    seconds: dict[str, float] = field(default_factory=dict)


def _stages(stages: tuple[str, ...]) -> list[Experiment[Any, Any]]:
    wanted = [e for e in EXPERIMENTS if e.name in stages]
    missing = sorted(set(stages) - {e.name for e in wanted})
    if missing:
        raise VitposError(f"stages {', '.join(missing)} are not registered")
    return wanted


def run_stages(surface: ModelSurface, data: str, cfg: RunConfig, out: Path, stages: tuple[str, ...] = STAGES,
               log: Callable[[str], None] | None = None) -> Measured:
    """The study's stages `stages` on one model, as `vitpos run` runs them (no cache): each stage's settings
    from `cfg` and the results before it, checked, then its `run_stage`; the results as a `ModelEntry`,
    read into `ClaimInputs` as the run's summary reads it. A stage that would not apply to the model (or
    that the config turns off) is refused before any runs: a trained case read without one of them would
    be read on less than the run reads."""
    exps = _stages(stages)
    for exp in exps:
        reason = exp.applies_to(surface) or exp.applies_to_data(data) or exp.disabled(cfg)
        if reason is not None:
            raise VitposError(f"{surface.spec} on {data}: stage {exp.name} would not run ({reason})")
    sizes = split_sizes(data)
    done: dict[str, Done] = {}
    seconds: dict[str, float] = {}
    for exp in exps:
        settings = exp.stage_settings(cfg, surface, done, False)
        check_stage(exp.name, settings, surface, data, sizes)
        t0 = time.time()
        stage = StageInput(data=data, seed=cfg.seed, settings=settings, prior=done, out=out / exp.name,
                           progress=False, quick=False, root=out)
        result = exp.run_stage(surface, stage)
        if not isinstance(result, Result):
            raise VitposError(f"{surface.spec}: stage {exp.name} returned no result ({type(result).__name__})")
        seconds[exp.name] = round(time.time() - t0, 1)
        if log is not None:
            log(f"[{surface.spec}] {exp.name}: {seconds[exp.name]:.0f} s")
        done[exp.name] = Done(result, settings)
    entry = ModelEntry(describe=ModelDescription.model_validate(surface.describe()), data=data, not_applicable={},
                       results={k: d.result for k, d in done.items()})
    return Measured(ClaimInputs.of(entry), seconds)


def measure_trained(model: TrainedModel, sizes: TrainedSizes | None = None, out: Path | None = None,
                    log: Callable[[str], None] | None = None) -> Measured:
    """`run_stages` on a shipped trained model at `sizes` (None: `TrainedSizes()`); the SAEs and other
    artifacts go to `out` (None: a temporary folder, removed after)."""
    surface = load_model(model.spec)
    cfg = (sizes or TrainedSizes()).config(model.spec, model.data)
    if out is not None:
        return run_stages(surface, model.data, cfg, out, model.stages, log=log)
    with tempfile.TemporaryDirectory(prefix="vitpos-trained-") as tmp:
        return run_stages(surface, model.data, cfg, Path(tmp), model.stages, log=log)


def trained_case(model: TrainedModel, sizes: TrainedSizes | None = None) -> PlantedCase:
    """A trained model as a planted case of the table (held out). `measure(n_images, seeds)` sets the test
    images of every stage and the number of permutation seeds; the SAE sizes stay `sizes`' (None:
    `TrainedSizes()`)."""
    sizes = sizes or TrainedSizes()

    def measure(n_images: int, seeds: tuple[int, ...]) -> ClaimInputs:
        at = TrainedSizes(test_images=n_images, sae_images=sizes.sae_images, sae_epochs=sizes.sae_epochs,
                          expansion=sizes.expansion, k=sizes.k, seeds=len(seeds), max_layers=sizes.max_layers,
                          rope_restore=sizes.rope_restore, readout_images=sizes.readout_images)
        return measure_trained(model, at).inputs

    return PlantedCase(model.name, model.description, dict(model.truth), measure, split="held_out")


class SiteReading(BaseModel):
    """C1 and C2 at one site of the layer sweep, as the claims read them there (intervals in points,
    selectivity a fraction): what decided a trained case, for the script's table and the docs."""

    model_config = ConfigDict(extra="forbid")
    site: str
    selection_frequency: float
    n_row: int
    n_col: int
    n_mixed: int
    c1: str
    c1_failed: list[str]  # C1's conditions that failed here (inconclusive ones where none failed)
    selectivity: dict[str, Interval | None]  # per axis (row, col)
    probe_drop: dict[str, Interval | None]
    control_probe_drop: dict[str, Interval | None]
    top1_drop: dict[str, Interval | None]
    c2: str
    c2_failed: list[str]
    n_all_positional: int | None
    all_positional_drop: Interval | None
    swap_null_drop: Interval | None
    ape_shuffle_drop: float | None  # the APE table shuffled (points)
    budget: float | None  # the all-positional drop's share of the APE shuffle's
    budget_ci95: list[float] | None
    budget_undefined: str | None


def _failed(conditions: tuple[ConditionReading, ...]) -> list[str]:
    failed = [c.name for c in conditions if c.outcome == FAILS]
    return failed or [c.name for c in conditions if c.outcome == INCONCLUSIVE]


def site_readings(spec: str, inputs: ClaimInputs) -> list[SiteReading]:
    """C1 and C2 at every site of the sweep (`sae_layers`), with the thresholds of the rule set."""
    if inputs.sae_layers is None:
        raise VitposError(f"{spec}: no layer sweep (sae_layers) to read")
    t = rule_set().values()
    return [_site(spec, p, t) for p in inputs.sae_layers.points]


def _site(spec: str, p: LayerPoint, t: Thresholds) -> SiteReading:
    if p.sae is None or p.permute is None:
        raise VitposError(f"{spec}: sweep site {p.key} has no typed SAE / permutation result")
    r1, r2 = c1.CLAIM.at_layer(spec, p, t), c2.CLAIM.at_layer(spec, p, t)
    v1, v2 = c1.View.of(p.sae), c2.View.of(p.permute)
    shuffle = p.permute.variant("pos_embed_shuffle")
    allpos = p.permute.variant("all_positional")
    budget = p.all_positional_budget
    return SiteReading(
        site=p.key, selection_frequency=p.selection_frequency, n_row=p.n_row, n_col=p.n_col, n_mixed=p.n_mixed,
        c1=r1.result, c1_failed=_failed(r1.conditions), selectivity=v1.selectivity, probe_drop=v1.own,
        control_probe_drop=v1.control, top1_drop=v1.top1, c2=r2.result, c2_failed=_failed(r2.conditions),
        n_all_positional=None if allpos is None else allpos.n_features, all_positional_drop=v2.treated,
        swap_null_drop=v2.null, ape_shuffle_drop=None if shuffle is None else shuffle.drop_points,
        budget=None if budget is None else budget.share, budget_ci95=None if budget is None else budget.share_ci95,
        budget_undefined=None if budget is None else budget.undefined)


TRAINED_CASES: tuple[PlantedCase, ...] = tuple(trained_case(m) for m in TRAINED_MODELS)

__all__ = ["ROPE_STAGES", "STAGES", "TRAINED_CASES", "TRAINED_MODELS", "TRAINING_SEED", "Measured", "SiteReading",
           "TrainedModel", "TrainedSizes", "measure_trained", "run_stages", "site_readings", "trained_case"]
