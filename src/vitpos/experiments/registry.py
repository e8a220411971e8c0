"""The one list of experiments, in the order the study runs them (each after what it requires).

Adding an experiment: one module (its settings, result, `run_stage`, `plan`, figures, report
section: `vitpos.experiments.base`) and one `register(...)` line below, or `register(...)` at run
time (a plugin, a test). The run config's section, its `--quick` sizes, the stage cache, the plan,
the report and results.json all follow the registry; nothing else needs an edit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vitpos.experiments.ape_permute import (
    ApePermuteExperiment,
    ApePermuteStageSettings,
    permute_seed_pool,
    plan_ape_permute,
    run_ape_permute,
)
from vitpos.experiments.base import Experiment, Settings, SplitSizes, StagePlan
from vitpos.experiments.common import SAESite
from vitpos.experiments.evaluation import EvalExperiment
from vitpos.experiments.extrapolate import ExtrapolateExperiment
from vitpos.experiments.probe import ProbeExperiment
from vitpos.experiments.rope_axis import RopeAxisExperiment
from vitpos.experiments.rope_freq import RopeFreqExperiment
from vitpos.experiments.rope_heads import RopeHeadsExperiment
from vitpos.experiments.rope_prefix import RopePrefixExperiment
from vitpos.experiments.sae_layers import SAELayersExperiment
from vitpos.experiments.sae_run import SAEExperiment, run_sae
from vitpos.experiments.sae_settings import SAESettings
from vitpos.experiments.sae_sweep import LayerMeasures
from vitpos.models.surface import ModelSurface

# Changed in place by register / unregister: whoever imported them sees every registered experiment
# (of any result and settings type: Experiment is invariant in them).
EXPERIMENTS: list[Experiment[Any, Any]] = []
BY_NAME: dict[str, Experiment[Any, Any]] = {}

# names a registered experiment may not take: the run config's and a results.json model entry's own keys
RESERVED = frozenset({"models", "data", "seed", "model_seeds", "eval_images", "pretrained", "checkpoints", "heads",
                      "head", "describe", "not_applicable", "section", "quick"})


def register(exp: Experiment[Any, Any]) -> Experiment[Any, Any]:
    """Add `exp` after the experiments registered so far (the study runs them in this order); the
    experiments it requires must be registered already. Returns `exp`."""
    name = getattr(exp, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{type(exp).__name__}: `name` must be a Python identifier (it is a config key), got {name!r}")
    if name in BY_NAME or name in RESERVED:
        raise ValueError(f"an experiment named {name!r} is registered already, or the name is reserved")
    missing = [r for r in exp.requires if r not in BY_NAME]
    if missing:
        raise ValueError(f"{name} requires {missing}: register them first")
    if not isinstance(exp.version, int) or exp.version < 1:
        raise ValueError(f"{name}: version must be an int >= 1")
    if exp.settings_type is not None and not issubclass(exp.settings_type, Settings):
        raise ValueError(f"{name}: settings_type must subclass vitpos.experiments.base.Settings")
    EXPERIMENTS.append(exp)
    BY_NAME[name] = exp
    return exp


def unregister(name: str) -> None:
    """Remove a registered experiment (and nothing that requires it may stay registered)."""
    needed = [e.name for e in EXPERIMENTS if name in e.requires]
    if needed:
        raise ValueError(f"{', '.join(needed)} require {name}: unregister them first")
    exp = BY_NAME.pop(name)
    EXPERIMENTS.remove(exp)


def names() -> tuple[str, ...]:
    """The registered experiments' names, in study order."""
    return tuple(BY_NAME)


def experiment(name: str) -> Experiment[Any, Any]:
    return BY_NAME[name]


def settings_types() -> dict[str, type[Settings]]:
    """Experiment name -> its settings type: the run config's experiment sections, in study order."""
    return {e.name: e.settings_type for e in EXPERIMENTS if e.settings_type is not None}


def quick_sizes() -> dict[str, dict]:
    """Each experiment's `--quick` sizes (its settings' QUICK), by section name."""
    return {name: dict(t.QUICK) for name, t in settings_types().items() if t.QUICK}


def stage_versions(exp: Experiment) -> dict[str, int]:
    """The versions a stage's cache key holds: the experiment's own and those of every experiment
    it requires, transitively (it reads their results, so their change is its change)."""
    out: dict[str, int] = {}
    todo = [exp]
    while todo:
        e = todo.pop()
        if e.name not in out:
            out[e.name] = e.version
            todo.extend(BY_NAME[r] for r in e.requires)
    return dict(sorted(out.items()))


# What the sae_layers sweep runs at each layer: two experiments' run functions, composed here (the one
# module that imports every experiment) so that no experiment imports another.


def _plan_permute_at(layer: int, site: str, images: int, seeds: int, surface: ModelSurface,
                     sizes: SplitSizes, claim_seeds: int = 1, variants: Sequence[str] | None = None) -> StagePlan:
    """The ape_permute stage's plan for the SAE at `site` of `layer` with `claim_seeds` SAE seeds, running
    `variants` (None: every one; the sweep names them, this builds the settings)."""
    at = (SAESite.model_validate({"layer": layer, "site": site}) if claim_seeds == 1 else
          SAESettings.model_validate({"layer": layer, "site": site, "claim_seeds": claim_seeds}))
    return plan_ape_permute(ApePermuteStageSettings(images=images, seeds=seeds, sae=at), surface, sizes,
                            variants=variants)


LAYER_MEASURES = LayerMeasures(run_sae=run_sae, run_ape_permute=run_ape_permute, plan_sae=SAEExperiment().plan,
                               plan_ape_permute=_plan_permute_at, permute_seed_pool=permute_seed_pool)

# sae_layers last: the stages before it run as they did before it existed (whatever global state it leaves)
for _exp in (EvalExperiment(), ProbeExperiment(), SAEExperiment(), ApePermuteExperiment(), RopeAxisExperiment(),
             RopeHeadsExperiment(), RopePrefixExperiment(), RopeFreqExperiment(), ExtrapolateExperiment(),
             SAELayersExperiment(LAYER_MEASURES)):
    register(_exp)
