"""The one list of experiments, in the order the study runs them (each after what it requires)."""

from __future__ import annotations

from vitpos.experiments.ape_permute import ApePermuteExperiment
from vitpos.experiments.base import Experiment
from vitpos.experiments.evaluation import EvalExperiment
from vitpos.experiments.extrapolate import ExtrapolateExperiment
from vitpos.experiments.probe import ProbeExperiment
from vitpos.experiments.rope_axis import RopeAxisExperiment
from vitpos.experiments.rope_freq import RopeFreqExperiment
from vitpos.experiments.rope_heads import RopeHeadsExperiment
from vitpos.experiments.rope_prefix import RopePrefixExperiment
from vitpos.experiments.sae_run import SAEExperiment

EXPERIMENTS: tuple[Experiment, ...] = (
    EvalExperiment(), ProbeExperiment(), SAEExperiment(), ApePermuteExperiment(), RopeAxisExperiment(),
    RopeHeadsExperiment(), RopePrefixExperiment(), RopeFreqExperiment(), ExtrapolateExperiment(),
)
BY_NAME: dict[str, Experiment] = {e.name: e for e in EXPERIMENTS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def experiment(name: str) -> Experiment:
    return BY_NAME[name]


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


def _check_order() -> None:
    seen: set[str] = set()
    for e in EXPERIMENTS:
        missing = set(e.requires) - seen
        assert not missing, f"{e.name} requires {missing}, listed after it"
        assert isinstance(e.version, int) and e.version >= 1, f"{e.name}: version must be an int >= 1"
        seen.add(e.name)


_check_order()
