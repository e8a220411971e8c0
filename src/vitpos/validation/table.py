"""The validation table: claim x planted truth -> the pipeline's verdict, for every planted case.

A case (`PlantedCase`) is a small model where some claims are true or false by construction; its
`measure` runs the experiments' own run functions and returns the typed results the claims read
(`study.claims.ClaimInputs`); `study.claims.summarise` then gives the verdicts exactly as for a real run. A row passes
when a planted-true claim is `supported` and a planted-false one `not supported` (an inconclusive
verdict passes neither way). The RoPE cases (C3-C5) come from `rope_cases.rope_cases()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from vitpos.results.validation import ValidationRow, ValidationTable, expected_verdict
from vitpos.validation import rope_cases
from vitpos.validation.ape_cases import APE_CASES, PlantedCase

if TYPE_CHECKING:
    from vitpos.study.claims import ClaimInputs


def _from_rope(case: rope_cases.PlantedCase) -> PlantedCase:
    """A planted RoPE case (one claim each, sizes of its own) as a row source of the one table."""

    def measure(n_images: int, seeds: tuple[int, ...]) -> ClaimInputs:
        return rope_cases.run_case(case)  # its own probe / top-1 sizes: the rules were validated at them

    return PlantedCase(name=f"rope:{case.name}", description=case.why, truth={case.claim: case.truth},
                       measure=measure)


# C1/C2 (planted APE models) and C3-C5 (planted RoPE models): one table, claims x planted truth.
CASES: tuple[PlantedCase, ...] = (*APE_CASES, *(_from_rope(c) for c in rope_cases.rope_cases()))


def validation_table(cases: Iterable[PlantedCase] = CASES, n_images: int = 300,
                     seeds: tuple[int, ...] = (0, 1)) -> ValidationTable:
    """Measure every case and read each planted claim's verdict from `summarise`."""
    from vitpos.study.claims import summarise
    from vitpos.study.rules import RULES

    rows = []
    for case in cases:
        verdicts = {c.id: c for c in summarise({case.name: case.measure(n_images, seeds)}).claims}
        for cid, planted in case.truth.items():
            c = verdicts[cid]
            want = expected_verdict(planted)
            rows.append(ValidationRow(claim=cid, case=case.name, description=case.description, planted=planted,
                                      verdict=c.verdict, expected=want, passes=c.verdict == want,
                                      evidence=c.text()))
    rows.sort(key=lambda r: (r.claim, not r.planted, r.case))
    return ValidationTable(rules_version=RULES.version, rules_hash=RULES.digest(), n_images=n_images,
                           seeds=list(seeds), rows=rows)


__all__ = ["CASES", "ValidationRow", "ValidationTable", "expected_verdict", "validation_table"]
