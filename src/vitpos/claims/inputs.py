"""What the claims read of one model (`ClaimInputs`: its experiments' typed results, scheme and data),
model families over training seeds, and the matched `none` model of a model."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Protocol, TypeVar

from vitpos.results.ape_permute import ApePermuteResult
from vitpos.results.base import Result, Skipped
from vitpos.results.evaluation import EvalResult
from vitpos.results.probe import ProbeSiteResult
from vitpos.results.rope_axis import RopeAxisResult
from vitpos.results.rope_heads import RopeHeadsResult
from vitpos.results.sae_layers import SAELayersResult
from vitpos.results.sae_run import GivenSAEResult, SAEResult

SAEReading = SAEResult | GivenSAEResult  # a trained SAE's result, or what is measured of a given (planted) one


class _Described(Protocol):
    @property
    def scheme(self) -> str: ...


class ModelResults(Protocol):
    """A model's entry as the study keeps it (`study.results.ModelEntry`): its results by experiment
    name, its description (the scheme) and its data."""

    @property
    def describe(self) -> _Described: ...

    @property
    def results(self) -> Mapping[str, Result | Skipped]: ...

    @property
    def data(self) -> str: ...


R = TypeVar("R", bound=Result)


def _typed(results: Mapping[str, Result | Skipped], name: str, cls: type[R]) -> R | None:
    r = results.get(name)
    return r if isinstance(r, cls) else None


@dataclass(frozen=True)
class ClaimInputs:
    """The typed results the claims read of one model (None: not run, or skipped), each under its
    experiment's name, and the model's scheme and data (which `none` model is its position-free match)."""

    sae: SAEReading | None = None
    ape_permute: ApePermuteResult | None = None
    rope_axis: RopeAxisResult | None = None
    rope_heads: RopeHeadsResult | None = None
    probe: ProbeSiteResult | None = None
    eval: EvalResult | None = None
    scheme: str | None = None
    data: str | None = None
    sae_layers: SAELayersResult | None = None  # the layer sweep: C1 and C2 are read over its plausible layers

    @classmethod
    def of(cls, model: ModelResults | ClaimInputs) -> ClaimInputs:
        if isinstance(model, ClaimInputs):
            return model
        r = model.results
        return cls(sae=_typed(r, "sae", SAEResult), ape_permute=_typed(r, "ape_permute", ApePermuteResult),
                   rope_axis=_typed(r, "rope_axis", RopeAxisResult),
                   rope_heads=_typed(r, "rope_heads", RopeHeadsResult),
                   probe=_typed(r, "probe", ProbeSiteResult), eval=_typed(r, "eval", EvalResult),
                   scheme=model.describe.scheme, data=model.data,
                   sae_layers=_typed(r, "sae_layers", SAELayersResult))

    def measured(self) -> set[str]:
        """The experiments whose result this model has (a threshold's `needs` names one)."""
        return {f.name for f in fields(self) if f.name not in ("scheme", "data") and getattr(self, f.name) is not None}


SEED_SUFFIX = re.compile(r"-seed(\d+)$")


def model_family(spec: str) -> str:
    """Seeds of one model share a family: `NAME-seed<k>` belongs to `NAME` (seed 0 is `NAME`)."""
    return SEED_SUFFIX.sub("", spec)


def seed_of(spec: str) -> int:
    """The training seed a shipped model's name says (`NAME-seed<k>`; seed 0 is `NAME`)."""
    m = SEED_SUFFIX.search(spec)
    return int(m.group(1)) if m else 0


def none_model(models: Mapping[str, ClaimInputs], data: str | None, spec: str | None,
               measured: Callable[[ClaimInputs], bool]) -> ClaimInputs | None:
    """The model without position (scheme `none`) on the same data with the measurement `measured` asks
    for: the one of `spec`'s training seed (`-seed<k>` suffix) where it ran, else the first (each seed's
    position gain is its own: the zoo's `none` seeds reach 72.1 / 71.0 / 63.4 %). Found by scheme, not by
    name, so that every model gets its `none` (`pairs-rope-mixed-ape` has no `pairs-none-ape`)."""
    nones = [(s, m) for s, m in models.items() if m.scheme == "none" and m.data == data and measured(m)]
    same = [m for s, m in nones if spec is not None and seed_of(s) == seed_of(spec)]
    return same[0] if same else nones[0][1] if nones else None


def none_top1(models: Mapping[str, ClaimInputs], data: str | None, spec: str | None = None) -> float | None:
    """Clean top-1 of a model without position on the same data (`none_model`), if one ran."""
    none = none_model(models, data, spec, lambda m: m.eval is not None)
    return None if none is None or none.eval is None else float(none.eval.top1)


def matched_none(spec: str, models: Mapping[str, ClaimInputs]) -> ProbeSiteResult | None:
    """The `probe` result of the `none` model matched to a RoPE model (`none_model`), if one ran."""
    none = none_model(models, models[spec].data, spec, lambda m: m.probe is not None)
    return None if none is None else none.probe
