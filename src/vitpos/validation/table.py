"""The validation table: claim x planted truth -> the pipeline's verdict, for every planted case.

A case (`PlantedCase`) is a small model where some claims are true or false by construction; its
`measure` runs the experiments' own run functions and returns the model's entry as results.json
holds it; `study.claims.summarise` then gives the verdicts exactly as for a real run. A row passes
when a planted-true claim is `supported` and a planted-false one `not supported` (an inconclusive
verdict passes neither way). RoPE cases (C3-C5) join by adding PlantedCases to `CASES`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict

from vitpos.validation.planted_ape import APE_CASES, PlantedCase

CASES: tuple[PlantedCase, ...] = APE_CASES


class ValidationRow(BaseModel):
    model_config = ConfigDict(extra="forbid")
    claim: str
    case: str
    description: str
    planted: bool  # the claim is true of this model by construction
    verdict: str  # the pipeline's verdict
    expected: str  # supported (planted true) or not supported (planted false)
    passes: bool
    evidence: str


class ValidationTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rules_version: int
    rules_hash: str
    n_images: int
    seeds: list[int]
    rows: list[ValidationRow]

    @property
    def passes(self) -> bool:
        return all(r.passes for r in self.rows)

    def markdown(self) -> str:
        lines = ["| claim | planted model | planted | verdict | as planted |", "|---|---|---|---|---|"]
        lines += [f"| {r.claim} | {r.case}: {r.description} | {'true' if r.planted else 'false'} | {r.verdict} | "
                  f"{'yes' if r.passes else '**no**'} |" for r in self.rows]
        return "\n".join(lines)


def expected_verdict(planted: bool) -> str:
    return "supported" if planted else "not supported"


def validation_table(cases: Iterable[PlantedCase] = CASES, n_images: int = 300,
                     seeds: tuple[int, ...] = (0, 1)) -> ValidationTable:
    """Measure every case and read each planted claim's verdict from `summarise`."""
    from vitpos.study.claims import summarise
    from vitpos.study.rules import RULES

    rows = []
    for case in cases:
        entry: dict[str, Any] = case.measure(n_images, seeds)
        verdicts = {c.id: c for c in summarise({case.name: entry}).claims}
        for cid, planted in case.truth.items():
            c = verdicts[cid]
            want = expected_verdict(planted)
            rows.append(ValidationRow(claim=cid, case=case.name, description=case.description, planted=planted,
                                      verdict=c.verdict, expected=want, passes=c.verdict == want,
                                      evidence=c.evidence))
    rows.sort(key=lambda r: (r.claim, not r.planted, r.case))
    return ValidationTable(rules_version=RULES.version, rules_hash=RULES.digest(), n_images=n_images,
                           seeds=list(seeds), rows=rows)


__all__ = ["CASES", "ValidationRow", "ValidationTable", "expected_verdict", "validation_table"]
