"""The validation table's schema: claim x planted truth -> the pipeline's verdict, per planted case
(`vitpos.validation.table` measures it; results.json holds it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
    # each named condition of the claim's rule on this case: holds / fails / inconclusive (empty in
    # tables written before the claims had named conditions)
    conditions: dict[str, str] = Field(default_factory=dict)
    # design: a case seen while the rules were written; held_out: built after they were frozen
    split: Literal["design", "held_out"] = "design"

    @property
    def decided_by(self) -> list[str]:
        """The conditions that kept a planted-false claim from holding (those that failed; inconclusive
        ones where none failed), or kept a planted-true one from holding. A planted-false row that one
        condition alone decides is that condition's evidence of power."""
        failed = [k for k, v in self.conditions.items() if v == "fails"]
        return failed or [k for k, v in self.conditions.items() if v == "inconclusive"]


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
        lines = ["| claim | planted model | planted | verdict | as planted | decided by |", "|---|---|---|---|---|---|"]
        lines += [f"| {r.claim} | {r.case}: {r.description} | {'true' if r.planted else 'false'} | {r.verdict} | "
                  f"{'yes' if r.passes else '**no**'} | {', '.join(r.decided_by) or '-'} |" for r in self.rows]
        return "\n".join(lines)

    def power(self) -> dict[str, dict[str, int]]:
        """claim -> condition -> how many planted-false rows that condition decides alone (it fails and
        every other condition holds). A condition at 0 decides nothing by itself: switched off, no row of
        this table would notice (METHODS.md, Power)."""
        out: dict[str, dict[str, int]] = {}
        for r in self.rows:
            counts = out.setdefault(r.claim, {})
            for name in r.conditions:
                counts.setdefault(name, 0)
            if not r.planted and r.passes and len(r.decided_by) == 1 and r.conditions[r.decided_by[0]] == "fails" \
                    and all(v == "holds" for k, v in r.conditions.items() if k != r.decided_by[0]):
                counts[r.decided_by[0]] += 1
        return out


def expected_verdict(planted: bool) -> str:
    return "supported" if planted else "not supported"
