"""The validation table names, per row, the conditions that decided it, and per claim how many
planted-false rows each condition decides alone (METHODS.md, Power: a condition that decides none
can be switched off without the table noticing)."""

from __future__ import annotations

from vitpos.results.validation import ValidationRow, ValidationTable


def row(case: str, planted: bool, verdict: str, **conditions: str) -> ValidationRow:
    want = "supported" if planted else "not supported"
    return ValidationRow(claim="C9", case=case, description=case, planted=planted, verdict=verdict, expected=want,
                         passes=verdict == want, evidence="", conditions=conditions)


def test_decided_by_and_power_count_only_cases_one_condition_decides_alone():
    rows = [
        row("true", True, "supported", null="holds", floor="holds", control="holds"),
        row("only_null", False, "not supported", null="fails", floor="holds", control="holds"),
        row("crude", False, "not supported", null="fails", floor="fails", control="holds"),  # two decide it
        row("undecided", False, "partly supported", null="inconclusive", floor="holds", control="holds"),
    ]
    table = ValidationTable(rules_version=4, rules_hash="x", n_images=1, seeds=[0], rows=rows)
    assert [r.decided_by for r in rows] == [[], ["null"], ["null", "floor"], ["null"]]
    # `crude` fails on two conditions (neither is shown to matter alone); `undecided` is not as planted
    assert table.power() == {"C9": {"null": 1, "floor": 0, "control": 0}}
    assert "| null |" in table.markdown() and "| null, floor |" in table.markdown()


def test_the_report_says_which_rows_are_held_out_and_how_they_fared():
    """The report's validation section gives each row's set and counts the held-out rows apart (a rule
    tuned on a case is not tested by it); what it shows of a row is escaped."""
    from vitpos.claims.verdict import Summary
    from vitpos.report.html import _validation

    seen = row("seen", True, "supported", null="holds")
    unseen = row("<b>unseen</b>", False, "supported", null="holds").model_copy(update={"split": "held_out"})
    table = ValidationTable(rules_version=4, rules_hash="x", n_images=1, seeds=[0], rows=[seen, unseen])
    html = _validation(Summary.model_validate({"claims": [], "rules": "r", "rules_version": 4, "rules_hash": "x",
                                               "validation": table.model_dump(mode="json")}))
    assert "1 of 2 rows as planted; 0 of 1 held-out rows" in html
    assert "<td>held out</td>" in html and "<td>design</td>" in html
    assert "<b>unseen</b>" not in html and "&lt;b&gt;unseen&lt;/b&gt;" in html
