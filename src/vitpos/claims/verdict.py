"""The claims' summary as results.json holds it: per claim its verdict, sentence, headline number per
model family, per model the numbers its rule read and each condition's outcome; the rule set, and the
validation table on planted models (filled by `vitpos.validation`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from vitpos.claims.intervals import Outcome
from vitpos.claims.rules import RuleSet, Sensitivity
from vitpos.results.validation import ValidationTable

Number = float | int | bool | str | list[float] | list[int] | list[str] | None


class ConditionReading(BaseModel):
    """One condition of a claim's rule on one model: its outcome and the numbers it read (intervals as
    [lo, hi], the thresholds it compared them with)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    outcome: Outcome
    numbers: dict[str, Number] = Field(default_factory=dict)


class SeedSummary(BaseModel):
    """One claim over the independently trained seeds of one model family (`NAME`, `NAME-seed1`, ...)."""

    model_config = ConfigDict(extra="forbid")
    models: list[str]
    holds: int  # seeds on which the claim holds
    results: list[str]  # holds / fails / inconclusive per model, in `models` order
    number: str  # the headline number summarised
    values: list[float | None]
    mean: float | None
    ci95: list[float] | None  # Student-t over the seeds with a value
    family_result: str | None = None  # holds / fails / inconclusive for the family (`FAMILY_RULE`)
    family_reason: str | None = None  # why, in words


class FamilyHeadline(BaseModel):
    """A claim's headline number on one model family (`NAME`, `NAME-seed1`, ... folded: what
    `claims.inputs.model_family` gives), with its interval and on how many of the family's seeds it holds."""

    model_config = ConfigDict(extra="forbid")
    family: str
    models: list[str]
    results: list[str]  # holds / fails / inconclusive per model, in `models` order
    holds: int  # models (seeds) on which the claim holds
    number: str  # the headline number (the claim's `Headline.number`), made of the per-model numbers
    label: str  # what it is, in words
    unit: str  # points | fraction
    value: float | None  # one model: its number; several seeds: their mean (None: not measured)
    ci95: list[float] | None  # one model: its own 95 % interval; several seeds: Student-t over them
    why_undefined: str | None = None  # why `value` is None, in words (the claim's `headline_gap`)
    family_result: str | None = None  # several seeds: the family's result by `FAMILY_RULE`
    family_reason: str | None = None
    # issue 48: how many SAE training seeds each model's number pools (None: not an SAE claim) and what its
    # interval resamples (one model: "images", "sae_seeds"; several model seeds: "model_seeds", the
    # Student-t interval of their numbers, each pooled over its SAE seeds)
    sae_seeds: int | None = None
    interval_sources: list[str] | None = None
    site: str | None = None  # read over the layer sweep: the site of the number ("embed", "L2"; "per seed")

    def value_text(self) -> str:
        """The number with its interval, e.g. '23.1 [20.0, 26.2] pts (3 SAE seeds, at embed)' or '0.81 [0.70, 0.93]'."""
        if self.value is None or self.value != self.value:
            return "n/a" if self.why_undefined is None else f"n/a ({self.why_undefined})"
        fmt = "{:.1f}" if self.unit == "points" else "{:.2f}"
        iv = "" if self.ci95 is None else f" [{fmt.format(self.ci95[0])}, {fmt.format(self.ci95[1])}]"
        n = self.sae_seeds
        where = [] if self.site is None else [f"at {self.site}"]
        notes = where if n is None else [f"{n} SAE seed{'' if n == 1 else 's'}", *where]
        tail = f" ({', '.join(notes)})" if notes else ""
        return fmt.format(self.value) + iv + (" pts" if self.unit == "points" else "") + tail

    def seeds_text(self) -> str:
        """'holds on 2/3 seeds'; a family of one model: its result ('holds', 'fails', 'inconclusive')."""
        if len(self.models) == 1:
            return self.results[0]
        family = "" if self.family_result is None else f"; family {self.family_result} ({self.family_reason})"
        return f"holds on {self.holds}/{len(self.models)} seeds{family}"

    def text(self) -> str:
        return f"{self.family}: {self.value_text()}, {self.seeds_text()}"


class ClaimVerdict(BaseModel):
    """One claim: its verdict, one sentence, the headline number per model family, and what each
    model's rule read (`details` in words, `numbers`), which the report folds below the headline.

    `evidence`: results written before the typed pieces held the claim's evidence as one prose
    string (every model's text joined); they load with it and without the pieces."""

    model_config = ConfigDict(extra="forbid")
    id: str
    claim: str
    scheme: str
    verdict: str  # supported | partly supported | not supported | inconclusive | not applicable
    sentence: str = ""  # the verdict's reading in one sentence
    headlines: list[FamilyHeadline] = Field(default_factory=list)  # per model family, in the models' order
    notes: list[str] = Field(default_factory=list)  # said of the claim beside the rule (e.g. heads over seeds)
    details: dict[str, str] = Field(default_factory=dict)  # model spec -> what the rule read on it, in words
    numbers: dict[str, dict[str, Any]]  # model spec -> the numbers the verdict rule read (+ result, holds)
    # model spec -> each condition of the rule: its name, outcome and the numbers it read (the model's
    # result is their aggregation: holds when all hold, fails when any fails)
    conditions: dict[str, list[ConditionReading]] = Field(default_factory=dict)
    models: list[str]
    seeds: dict[str, SeedSummary] = Field(default_factory=dict)  # model family -> its seeds, where >= 2 ran
    sensitivity: list[Sensitivity] | None = None  # the verdict as each threshold moves (claims with thresholds)
    evidence: str | None = None  # results written before the typed pieces (see above); None in newer ones

    @model_serializer(mode="wrap")
    def _without_legacy(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        doc = handler(self)
        if doc.get("evidence") is None:
            doc.pop("evidence", None)
        return doc

    def text(self) -> str:
        """Everything said of the claim as one text: the older `evidence`, or the sentence, the notes
        and each model's reading."""
        if self.evidence is not None:
            return self.evidence
        return " ".join([self.sentence, *(f"{n}." for n in self.notes), "; ".join(self.details.values())]).strip()


class Summary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    claims: list[ClaimVerdict]
    rules: str
    rules_version: int | None = None  # claims.registry.rule_set() (None: written before rules were versioned)
    rules_hash: str | None = None
    rule_set: RuleSet | None = None
    validation: ValidationTable | None = None  # planted models: claim x planted truth -> verdict (vitpos.validation)
