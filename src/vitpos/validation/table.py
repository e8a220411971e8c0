"""The validation table: claim x planted truth -> the pipeline's verdict, for every planted case.

A case (`PlantedCase`) is a small model where some claims are true or false by construction; its
`measure` runs the experiments' own run functions and returns the typed results the claims read
(`claims.inputs.ClaimInputs`); `claims.summary.summarise` then gives the verdicts exactly as for a real run. A row
passes when a planted-true claim is `supported` and a planted-false one `not supported` (an inconclusive
verdict passes neither way). The RoPE cases (C3-C5) come from `rope_cases.rope_cases()`; besides these the
table measures every planted case a registered claim declares (`Claim.planted`).
"""

from __future__ import annotations

from collections.abc import Iterable

from vitpos.claims.base import Planted
from vitpos.claims.inputs import ClaimInputs
from vitpos.claims.registry import CLAIMS, rule_set
from vitpos.claims.summary import summarise
from vitpos.results.validation import ValidationRow, ValidationTable, expected_verdict
from vitpos.validation import rope_cases
from vitpos.validation.ape_cases import APE_CASES, APE_POWER_CASES, PlantedCase


def rope_case(case: rope_cases.PlantedCase) -> PlantedCase:
    """A planted RoPE case (one claim each, sizes of its own) as a row source of the one table."""

    def measure(n_images: int, seeds: tuple[int, ...]) -> ClaimInputs:
        return rope_cases.run_case(case)  # its own probe / top-1 sizes: the rules were validated at them

    return PlantedCase(name=f"rope:{case.name}", description=case.why, truth={case.claim: case.truth},
                       measure=measure, split=case.split)


# C1/C2 (planted APE models, and the held-out ones that give each condition a case it alone decides) and
# C3-C5 (planted RoPE models): one table, claims x planted truth.
CASES: tuple[PlantedCase, ...] = (*APE_CASES, *APE_POWER_CASES, *(rope_case(c) for c in rope_cases.rope_cases()))


def registered_cases() -> list[Planted]:
    """The table's cases: the built-in ones and every planted case a registered claim declares (once each)."""
    out: list[Planted] = list(CASES)
    names = {c.name for c in out}
    for claim in CLAIMS:
        for case in claim.planted:
            if case.name not in names:
                out.append(case)
                names.add(case.name)
    return out


def case_rows(case: Planted, inputs: ClaimInputs) -> list[ValidationRow]:
    """The rows of one case from its measured results: each planted claim's verdict from `summarise`."""
    verdicts = {c.id: c for c in summarise({case.name: inputs}).claims}
    rows = []
    for cid, planted in case.truth.items():
        c = verdicts[cid]
        want = expected_verdict(planted)
        readings = {r.name: r.outcome for r in c.conditions.get(case.name, [])}
        rows.append(ValidationRow(claim=cid, case=case.name, description=case.description, planted=planted,
                                  verdict=c.verdict, expected=want, passes=c.verdict == want,
                                  evidence=c.text(), conditions=readings, split=case.split))
    return rows


def table_of(rows: Iterable[ValidationRow], n_images: int, seeds: tuple[int, ...]) -> ValidationTable:
    rules = rule_set()
    return ValidationTable(rules_version=rules.version, rules_hash=rules.digest(), n_images=n_images,
                           seeds=list(seeds), rows=sorted(rows, key=lambda r: (r.claim, not r.planted, r.case)))


def validation_table(cases: Iterable[Planted] | None = None, n_images: int = 300,
                     seeds: tuple[int, ...] = (0, 1)) -> ValidationTable:
    """Measure every case (None: `registered_cases()`) and read each planted claim's verdict from `summarise`."""
    rows = [row for case in (registered_cases() if cases is None else cases)
            for row in case_rows(case, case.measure(n_images, seeds))]
    return table_of(rows, n_images, seeds)


__all__ = ["CASES", "ValidationRow", "ValidationTable", "expected_verdict", "case_rows", "registered_cases",
           "rope_case", "table_of", "validation_table"]
