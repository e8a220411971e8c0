"""Three-valued conditions on 95 % intervals: holds / fails / inconclusive, and their aggregation.

Each condition reads the interval [lo, hi] of a measurement (a measurement without one counts as
[x, x]) and comes out `holds` (the whole interval is on the rule's side of the threshold), `fails`
(the whole interval is on the other side) or `inconclusive` (the threshold lies inside it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Outcome = Literal["holds", "fails", "inconclusive"]
HOLDS: Outcome = "holds"
FAILS: Outcome = "fails"
INCONCLUSIVE: Outcome = "inconclusive"
Interval = tuple[float, float]


def outcome(v: str | None) -> Outcome:
    """A recorded result string as an Outcome (anything else: inconclusive)."""
    return HOLDS if v == HOLDS else FAILS if v == FAILS else INCONCLUSIVE


def bounds(point: object, ci: object = None) -> Interval | None:
    """A measurement's interval: its 95 % interval where one was measured, else [point, point];
    None where the measurement itself is missing."""
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
        return float(ci[0]), float(ci[1])
    if isinstance(point, (int, float)) and not isinstance(point, bool):
        return float(point), float(point)
    return None


def at_least(iv: Interval | None, threshold: float) -> Outcome:
    """x >= threshold: true if the whole interval is, false if none of it is; a missing measurement is false."""
    if iv is None:
        return FAILS
    return HOLDS if iv[0] >= threshold else (FAILS if iv[1] < threshold else INCONCLUSIVE)


def at_most(iv: Interval | None, threshold: float) -> Outcome:
    """x <= threshold: true if the whole interval is, false if none of it is; a missing measurement is false."""
    if iv is None:
        return FAILS
    return HOLDS if iv[1] <= threshold else (FAILS if iv[0] > threshold else INCONCLUSIVE)


def measured_at_least(iv: Interval | None, threshold: float) -> Outcome:
    """As at_least, but a measurement that was not made is undecided, not false."""
    return INCONCLUSIVE if iv is None else at_least(iv, threshold)


def exceeds(iv: Interval | None, control: Interval | None, factor: float = 1.0) -> Outcome:
    """x > factor * max(control, 0) for every value of both intervals (true), for none (false), else
    undecided; a missing x is false, a missing control undecided (nothing to compare with)."""
    if iv is None:
        return FAILS
    if control is None:
        return INCONCLUSIVE
    if iv[0] > factor * max(control[1], 0.0):
        return HOLDS
    return FAILS if iv[1] <= factor * max(control[0], 0.0) else INCONCLUSIVE


def largest(iv: Interval | None, others: list[Interval]) -> Outcome:
    """x is the largest: its interval lies above every other's (true), below some other's (false)."""
    if iv is None:
        return FAILS
    if not others or iv[0] > max(o[1] for o in others):
        return HOLDS
    return FAILS if iv[1] < max(o[0] for o in others) else INCONCLUSIVE


def inside(iv: Interval | None, lo: float, hi: float) -> Outcome:
    """lo < x < hi: true if the whole interval is strictly inside, false if it lies wholly at or
    beyond one end, else undecided; a missing or undefined (NaN) measurement is false."""
    if iv is None or iv[0] != iv[0] or iv[1] != iv[1]:
        return FAILS
    if lo < iv[0] and iv[1] < hi:
        return HOLDS
    return FAILS if iv[1] <= lo or iv[0] >= hi else INCONCLUSIVE


def magnitude(iv: Interval | None) -> Interval | None:
    """The interval of |x| from that of x."""
    if iv is None:
        return None
    lo, hi = iv
    if lo >= 0:
        return lo, hi
    return (-hi, -lo) if hi <= 0 else (0.0, max(-lo, hi))


def all_positive(margins: list[Interval], floor: float = 0.0) -> Outcome:
    """Every difference is > floor (each interval above it: true), some is < floor (an interval below
    it: false), else undecided. Requiring every interval at once is an intersection-union test, so
    `holds` needs no multiplicity correction; `fails` is read per comparison."""
    if any(m[1] < floor for m in margins):
        return FAILS
    return HOLDS if all(m[0] > floor for m in margins) else INCONCLUSIVE


def known(ok: bool) -> Outcome:
    """A condition decided on point values (no interval yet)."""
    return HOLDS if ok else FAILS


def all_of(*outcomes: str) -> Outcome:
    """Holds when every outcome holds, fails when any fails, else inconclusive."""
    if FAILS in outcomes:
        return FAILS
    return HOLDS if all(o == HOLDS for o in outcomes) else INCONCLUSIVE


def aggregate(results: Sequence[str]) -> str:
    """A claim's verdict over the models that ran it (`AGGREGATION` in summary.py says it in words)."""
    if not results:
        return "not applicable"
    n_hold = sum(r == HOLDS for r in results)
    if n_hold == len(results):
        return "supported"
    if n_hold:
        return "partly supported"
    return "not supported" if FAILS in results else "inconclusive"


def as_list(iv: Interval | None) -> list[float] | None:
    """An interval as results.json holds it."""
    return None if iv is None else [iv[0], iv[1]]
