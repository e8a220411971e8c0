"""Physical bounds of a stage-cache entry's numbers: a value that cannot be right (a NaN top-1, a
top-1 of 7.5, a validation row whose `passes` contradicts its verdict, rules of an unknown version)
marks the entry as damaged, and the study recomputes that stage, as for an unparsable entry.

Why by key name, not by each result schema's field types: the result classes live in many modules
(one per experiment, and they move); a check that walks the JSON by name covers every one of them,
old and new, from one place, and the names are the project's convention: `top1` and `*_top1`, `*_acc`,
`*_frac`, `per_class` / `per_group` are fractions of images or tokens, by construction in [0, 1]
(a drop, a share or a recovery ratio is not, and matches none of the patterns); `n` and `n_*` are
counts."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from vitpos.claims.registry import rule_set
from vitpos.validation.table import expected_verdict

# A fraction in [0, 1]: the key of the number, of the list of numbers, or of the mapping
# (class name / threshold -> number) that holds it.
FRACTION = re.compile(r"^(?:(?:.+_)?top1(?:_ci95|_ci|_spliced|_by_l2)?|(?:.+_)?acc(?:uracy)?(?:_ci95|_orig_probe)?"
                      r"|.+_frac(?:_by_threshold)?|per_class|per_group)$")
# A count of images, tokens or features (n, n_test_images, n_row_features ...): a whole number >= 0.
COUNT = re.compile(r"^n(?:_.+)?$")
# NaN is a measurement here: undefined where no value exists (e.g. rope_heads' rebuild score of a
# restore point without a recovery, an SAE's fvu on constant activations). Infinity is never one.
MAY_BE_NAN = frozenset({"rebuild_score", "recovery_restore", "fvu"})


def impossible(doc: Any, key: str = "", where: str = "") -> str | None:
    """The first value of a cached result's JSON that cannot be right ('where: why'), or None.
    key: the name the value is checked under; where: its dotted location in the document."""
    if isinstance(doc, Mapping):
        numbers_only = all(_is_number(v) or v is None or isinstance(v, list) for v in doc.values())
        for k, v in doc.items():
            # a mapping of names to fractions (per_class: class -> accuracy) is checked under its own key
            inner = key if numbers_only and FRACTION.match(key) else str(k)
            problem = impossible(v, inner, f"{where}.{k}" if where else str(k))
            if problem is not None:
                return problem
        return None
    if isinstance(doc, list):
        return next((p for p in (impossible(v, key, where) for v in doc) if p is not None), None)
    if not _is_number(doc):
        return None
    x, at = float(doc), where or "the result"
    if math.isnan(x):
        return None if key in MAY_BE_NAN else f"{at} is NaN"
    if math.isinf(x):
        return f"{at} is {x}"
    if FRACTION.match(key) and not -1e-9 <= x <= 1 + 1e-9:  # float rounding of an exact 0 or 1
        return f"{at} is {x:g}, outside [0, 1]"
    if COUNT.match(key) and (x < 0 or x != int(x)):
        return f"{at} is {x:g}, not a count"
    return None


def validation_problem(doc: Mapping[str, Any]) -> str | None:
    """Why a cached validation table cannot be this code's: rules of another version or hash, or a row
    whose `expected` / `passes` disagree with its planted truth and verdict (None: consistent)."""
    if doc.get("rules_version") != rule_set().version or doc.get("rules_hash") != rule_set().digest():
        return (f"rules_version {doc.get('rules_version')!r} / rules_hash {doc.get('rules_hash')!r} are not the "
                f"rules of this vitpos ({rule_set().version} / {rule_set().digest()})")
    rows = doc.get("rows")
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, Mapping):
            continue  # the schema refuses it
        want = expected_verdict(bool(row.get("planted")))
        if row.get("expected") != want or row.get("passes") != (row.get("verdict") == want):
            return (f"row {row.get('claim')!r} / {row.get('case')!r}: passes {row.get('passes')!r} disagrees with "
                    f"verdict {row.get('verdict')!r} against planted {row.get('planted')!r}")
    return None


def retyped(stored: Any, read: Any, where: str = "") -> str | None:
    """The first value of a cached entry (`stored`) whose kind its result type changed on reading (`read`:
    the parsed result written back as JSON), e.g. a top1 edited to the string "0.5" that the schema's lax
    parsing made a number: the entry was not written by vitpos ('where: why'), or None."""
    if isinstance(stored, Mapping) and isinstance(read, Mapping):
        return next((p for k in stored if k in read
                     and (p := retyped(stored[k], read[k], f"{where}.{k}" if where else str(k))) is not None), None)
    if isinstance(stored, list) and isinstance(read, list) and len(stored) == len(read):
        return next((p for i, (a, b) in enumerate(zip(stored, read, strict=True))
                     if (p := retyped(a, b, f"{where}[{i}]")) is not None), None)
    kinds = (_kind(stored), _kind(read))
    if None in kinds or kinds[0] == kinds[1]:
        return None
    return f"{where or 'the result'} is the {kinds[0]} {stored!r}, where the result holds a {kinds[1]}"


def _kind(x: Any) -> str | None:
    if x is None:
        return None
    if isinstance(x, bool):
        return "boolean"
    if _is_number(x):
        return "number"
    return {str: "string", list: "list"}.get(type(x), "object" if isinstance(x, Mapping) else type(x).__name__)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


__all__ = ["COUNT", "FRACTION", "MAY_BE_NAN", "impossible", "retyped", "validation_problem"]
