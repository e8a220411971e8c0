"""Adding a claim is one module and one registry line: a claim defined here, in the test, is summarised
(its verdict from its conditions), reported (its row in the claims table), swept for sensitivity (its
threshold's curve) and validated (a planted case it declares is a row of the validation table), with no
file outside this test touched."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from conftest import GOLDEN
from vitpos.claims.base import Condition, Headline, RuleClaim
from vitpos.claims.inputs import ClaimInputs
from vitpos.claims.intervals import HOLDS, Outcome, all_of, as_list, at_least, bounds
from vitpos.claims.registry import BY_ID, CLAIMS, register, rule_set, unregister
from vitpos.claims.rules import Threshold, Thresholds
from vitpos.claims.summary import summarise
from vitpos.claims.verdict import Number
from vitpos.results.probe import ProbeSiteResult

# ----------------------------------------------------------------------------- the new claim, C6
THRESHOLD = Threshold(name="C6.above_chance", claim="C6", value=0.3, unit="fraction",
                      meaning="the last layer's row and col probes lie at least this far above chance",
                      sweep=(0.0, 0.3, 0.6, 0.9))


def _above_chance(p: ProbeSiteResult, t: Thresholds) -> tuple[Outcome, dict[str, Number]]:
    row = bounds(p.row_acc[-1] - p.chance_row)
    col = bounds(p.col_acc[-1] - p.chance_col)
    th = t[THRESHOLD.name]
    return all_of(at_least(row, th), at_least(col, th)), {"row": as_list(row), "col": as_list(col), THRESHOLD.name: th}


class C6(RuleClaim[ProbeSiteResult]):
    id = "C6"
    text = "APE: a linear probe decodes row and column far above chance at the last layer."
    scheme = "ape"
    rule = "  C6 (APE)  the last layer's row and col probe accuracies lie >= C6.above_chance above chance."
    thresholds = (THRESHOLD,)
    rule_conditions = (Condition("above_chance", "both axes >= C6.above_chance above chance", _above_chance),)
    headline = Headline(number="row_above_chance", label="last-layer row probe accuracy above chance",
                        unit="fraction", parts=("row_above_chance",), how="one")

    def view(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs]) -> ProbeSiteResult | None:
        return model.probe

    def describe(self, spec: str, x: ProbeSiteResult, t: Thresholds) -> tuple[dict[str, Any], str]:
        above = x.row_acc[-1] - x.chance_row
        return {"row_above_chance": above}, f"{spec}: last-layer row probe {above:.2f} above chance"

    def gist(self, t: Thresholds) -> str:
        return f"both axes' last-layer probes lie >= {t[THRESHOLD.name]:g} above chance"


def probe(decodable: bool) -> ProbeSiteResult:
    """The golden quick run's APE probe (last layer 1.00 / 0.999, chance 0.125), or the same at chance."""
    doc = copy.deepcopy(GOLDEN["models"]["builtin:ape"]["probe"])
    if not decodable:
        doc["row_acc"] = [doc["chance_row"]] * len(doc["row_acc"])
        doc["col_acc"] = [doc["chance_col"]] * len(doc["col_acc"])
    return ProbeSiteResult.model_validate(doc)


GOOD = ClaimInputs(probe=probe(True), scheme="ape")
BAD = ClaimInputs(probe=probe(False), scheme="ape")


class PlantedProbe:
    """A planted case C6 declares: position decodable by construction (C6 true)."""

    name = "c6:decodable"
    description = "position planted at every layer"
    truth = {"C6": True}
    split = "design"

    @property
    def measure(self) -> Callable[[int, tuple[int, ...]], ClaimInputs]:
        return lambda n_images, seeds: GOOD  # what the experiments would measure of the planted model


@pytest.fixture
def c6() -> Iterator[C6]:
    claim = C6()
    claim.planted.append(PlantedProbe())
    register(claim)
    try:
        yield claim
    finally:
        unregister("C6")


def verdict_of(models: dict[str, ClaimInputs], cid: str = "C6"):
    return next(c for c in summarise(models).claims if c.id == cid)


# ----------------------------------------------------------------------------- the tests
def test_registered_claim_is_summarised_from_its_conditions(c6):
    good = verdict_of({"good": GOOD})
    assert good.verdict == "supported" and good.numbers["good"]["result"] == HOLDS
    (cond,) = good.conditions["good"]
    assert cond.name == "above_chance" and cond.outcome == "holds" and cond.numbers["row"] == [0.875, 0.875]
    assert good.headlines[0].value == pytest.approx(0.875)
    bad = verdict_of({"bad": BAD})
    assert bad.verdict == "not supported" and bad.conditions["bad"][0].outcome == "fails"
    assert verdict_of({"good": GOOD, "bad": BAD}).verdict == "partly supported"
    assert "C6.above_chance" in summarise({}).rules and c6.rule in summarise({}).rules
    # the other claims read as before: C1 has no SAE here, so it is not applicable
    assert verdict_of({"good": GOOD}, "C1").verdict == "not applicable"


def test_its_threshold_is_in_the_hashed_rule_set_only_while_registered(c6):
    with_c6 = rule_set()
    assert with_c6.of("C6") == [THRESHOLD] and summarise({}).rules_hash == with_c6.digest()
    unregister("C6")
    try:
        assert "C6" not in BY_ID and rule_set().digest() != with_c6.digest()
        assert rule_set().digest() == "540c3e085f4ae8cc"  # rules version 8 of C1-C5, unchanged
    finally:
        register(c6)


def test_registered_claim_is_swept_for_sensitivity(c6):
    (curve,) = verdict_of({"good": GOOD}).sensitivity or []
    assert curve.threshold == "C6.above_chance" and curve.value == 0.3 and not curve.stable
    # 0.875 above chance on both axes (col 0.874): holds up to 0.6, fails at 0.9
    assert [p.verdict for p in curve.curve] == ["supported", "supported", "supported", "not supported"]


def test_registered_claim_is_reported_in_the_claims_table(c6):
    from vitpos.report.html import _headline

    page = _headline(summarise({"good": GOOD}), {})
    start = page.index('<tr data-claim="C6">')  # its cells hold nested tables: up to its verdict cell's end
    row = page[start:page.index("</td></tr>", page.index('<td class="verdict">', start))]
    assert c6.text in row and '<span class="badge supported">supported</span>' in row
    assert "C6.above_chance" in row  # its sensitivity curve, folded in the row
    assert page.index('data-claim="C5"') < page.index('data-claim="C6"')  # registry order
    unregister("C6")
    try:
        assert 'data-claim="C6"' not in _headline(summarise({"good": GOOD}), {})
    finally:
        register(c6)


def test_registered_claims_planted_case_is_a_validation_row(c6):
    from vitpos.validation.table import registered_cases, validation_table

    cases = [case for case in registered_cases() if "C6" in case.truth]
    assert [case.name for case in cases] == ["c6:decodable"]
    table = validation_table(cases, n_images=8, seeds=(0,))
    (row,) = table.rows
    assert (row.claim, row.case, row.planted, row.verdict, row.passes) == ("C6", "c6:decodable", True, "supported",
                                                                           True)
    assert table.rules_hash == rule_set().digest()


def test_unregistering_restores_the_five_claims():
    assert [c.id for c in CLAIMS] == ["C1", "C2", "C3", "C4", "C5"]
