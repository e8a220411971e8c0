"""The validation table's schema: claim x planted truth -> the pipeline's verdict, per planted case
(`vitpos.validation.table` measures it; results.json holds it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


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
