"""What a claim is: its text and scheme, the typed results it reads, its rule as named conditions,
its thresholds, its headline number, its report sentence and its planted cases.

A claim module (c1.py ... c5.py) defines one `Claim` and the registry lists it; everything that
reads claims (summary, sensitivity, report, validation) iterates the registry. Per model a claim's
`read` gives a `ModelClaim`: each condition's `ConditionReading` (holds / fails / inconclusive and
the numbers it read), the model's result (`all_of` them: holds when all hold, fails when any fails,
else inconclusive), the numbers the summary records and the same in words.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from vitpos.claims.inputs import ClaimInputs
from vitpos.claims.intervals import Outcome, all_of
from vitpos.claims.rules import Threshold, Thresholds, values
from vitpos.claims.verdict import ConditionReading, Number, SeedSummary

X = TypeVar("X")
# Which planted cases a rule has seen: `design` cases were looked at while the rules were written;
# `held_out` ones were built after the rules they test were frozen.
Split = Literal["design", "held_out"]  # what a claim's conditions read of one model (its typed view of the results)


@dataclass(frozen=True)
class Condition(Generic[X]):
    """One named condition of a claim's rule: `check` reads the claim's typed view of one model and the
    thresholds and gives the outcome with the numbers it read, or None where the model's results do
    not have what the condition reads (results written before it existed): then it is not part of
    that model's rule."""

    name: str
    meaning: str
    check: Callable[[X, Thresholds], tuple[Outcome, dict[str, Number]] | None]
    # a precondition names why the rule has nothing to read (e.g. no feature set to remove): every
    # condition that reads what it requires fails with it, so no planted case can be decided by it
    # alone and the mutation test does not switch it off (it checks that implication instead)
    precondition: bool = False

    def __call__(self, x: X, t: Thresholds) -> ConditionReading | None:
        got = self.check(x, t)
        return None if got is None else ConditionReading(name=self.name, outcome=got[0], numbers=got[1])


@dataclass(frozen=True)
class ModelClaim:
    """One claim's reading of one model: its outcome, the numbers the rule read (as the summary's
    `numbers` records them), the same in words, and each condition's reading."""

    result: Outcome
    numbers: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    conditions: tuple[ConditionReading, ...] = ()


def decide(conditions: Sequence[ConditionReading]) -> Outcome:
    """A model's result from its conditions' outcomes (`all_of`)."""
    return all_of(*(c.outcome for c in conditions))


@dataclass(frozen=True)
class Headline:
    """A claim's headline number: made of per-model numbers (`parts`, keys of the claim's numbers) as
    the smaller of them, their mean, or the one; `cis`: each part's interval key (default `<part>_ci95`);
    `range`: where the number can lie at all (a seed interval is cut there); `threshold`: the rule set's
    threshold the number must reach for the claim to hold (a model family's seed interval is read
    against it), None where the rule has no single threshold on this number."""

    number: str
    label: str
    unit: Literal["points", "fraction"]
    parts: tuple[str, ...]
    how: Literal["min", "mean", "one"]
    range: tuple[float, float] | None = None
    cis: tuple[str, ...] | None = None
    threshold: str | None = None
    # the parts of numbers written before they existed (results.json before issue 48 had no `*_pooled`)
    legacy_parts: tuple[str, ...] | None = None

    def parts_of(self, numbers: Mapping[str, Any]) -> tuple[str, ...]:
        """The parts `numbers` has: `parts`, or `legacy_parts` in numbers written before them."""
        if self.legacy_parts is not None and not any(k in numbers for k in self.parts):
            return self.legacy_parts
        return self.parts

    def ci_keys(self, numbers: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        if self.cis is not None:
            return self.cis
        return tuple(f"{k}_ci95" for k in (self.parts if numbers is None else self.parts_of(numbers)))


class Planted(Protocol):
    """A planted case: a small model where claims are true or false by construction (claim id ->
    truth) and how to measure the typed results the claims read of it."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def truth(self) -> Mapping[str, bool]: ...

    @property
    def split(self) -> Split: ...

    @property
    def measure(self) -> Callable[[int, tuple[int, ...]], ClaimInputs]: ...


class Claim(ABC):
    """One claim of the study. Subclasses (or `RuleClaim`) set the fields and implement `read`."""

    id: str
    text: str  # the claim, in one sentence
    scheme: str  # the position scheme whose models it is about (ape / rope)
    rule: str  # the verdict rule in words (the summary records every claim's)
    headline: Headline
    thresholds: tuple[Threshold, ...] = ()  # its thresholds in the hashed rule set (sensitivity curves)
    # planted cases declared with the claim; the validation table measures them beside its own
    planted: list[Planted]

    def __init__(self) -> None:
        self.planted = []

    @property
    def conditions(self) -> Sequence[Condition[Any]]:
        """The named conditions of its rule (what a planted case can decide)."""
        return ()

    def defaults(self) -> dict[str, float]:
        return values(self.thresholds)

    @abstractmethod
    def read(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs],
             t: Thresholds) -> ModelClaim | None:
        """The claim on one model (None: the model did not run what it reads); `models`: every model of
        the run (a matched `none` model), `t`: the rule set's thresholds."""

    @abstractmethod
    def gist(self, t: Thresholds) -> str:
        """What its rule needs, in one clause (the claim's sentence ends with it)."""

    def headline_gap(self, numbers: Mapping[str, Any]) -> str | None:
        """Why a model has no headline number, where its numbers say it (None: a generic reason)."""
        return None

    def notes(self, found: Sequence[tuple[str, ModelClaim]], seeds: Mapping[str, SeedSummary]) -> list[str]:
        """What is said of the claim beside its rule (e.g. its primary head over seeds)."""
        return []


class RuleClaim(Claim, Generic[X]):
    """A claim whose rule is its `rule_conditions` over one typed view of a model (`view`), read with
    numbers and words from `describe`."""

    rule_conditions: tuple[Condition[X], ...] = ()

    @property
    def conditions(self) -> Sequence[Condition[Any]]:
        return self.rule_conditions

    @abstractmethod
    def view(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs]) -> X | None:
        """What the conditions read of the model (None: it did not run what the claim reads)."""

    @abstractmethod
    def describe(self, spec: str, x: X, t: Thresholds) -> tuple[dict[str, Any], str]:
        """The numbers the summary records for the model and the same in words."""

    def readings(self, x: X, t: Thresholds) -> tuple[ConditionReading, ...]:
        return tuple(r for c in self.rule_conditions if (r := c(x, t)) is not None)

    def read_view(self, spec: str, x: X, t: Thresholds) -> ModelClaim:
        readings = self.readings(x, t)
        nums, text = self.describe(spec, x, t)
        return ModelClaim(decide(readings), nums, text, readings)

    def read(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs],
             t: Thresholds) -> ModelClaim | None:
        x = self.view(spec, model, models)
        return None if x is None else self.read_view(spec, x, t)
