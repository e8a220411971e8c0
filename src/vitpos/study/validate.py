"""Everything a study stage would refuse, checked before the first stage runs (and by `--plan`).

`check_stage` applies each experiment's `check` (`vitpos.experiments.base.Experiment.check`): the
same checks the experiments' library functions make at their start (the
SAE's k against its dictionary, restore points and windows against the depth, scales against the
grid and the data's canvas, enough training tokens for one SAE batch), to the settings the study
will hand the stage, so that a run never stops at its fifth stage for a setting it could have
refused before the first; a `--plan` exits 2 on the same problems.
"""

from __future__ import annotations

from vitpos.errors import VitposError
from vitpos.experiments.base import Settings, SplitSizes
from vitpos.models.surface import ModelSurface


def check_stage(name: str, settings: Settings, surface: ModelSurface, data: str,
                sizes: SplitSizes | None = None) -> None:
    """One VitposError, naming the config key and the model, when the stage `name` would refuse
    `settings` on `surface` (None when it would run)."""
    try:
        _check(name, settings, surface, data, sizes)
    except VitposError as e:
        raise VitposError(f"{surface.spec} on {data}, stage {name}: {e}") from None


def _check(name: str, s: Settings, surface: ModelSurface, data: str, sizes: SplitSizes | None) -> None:
    from vitpos.experiments.registry import BY_NAME

    BY_NAME[name].check(s, surface, data, sizes)


__all__ = ["check_stage"]
