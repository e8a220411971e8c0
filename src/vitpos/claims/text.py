"""How the claims print numbers in their per-model texts.

A number that cannot be right (NaN: e.g. Rec when removing the rotations removed nothing) prints as
n/a, never as "nan"; the rule already reads it as unknown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import SupportsFloat

from vitpos.claims.intervals import Interval, bounds


def finite(*vs: SupportsFloat | None) -> bool:
    try:
        return all(v is not None and math.isfinite(float(v)) for v in vs)
    except (TypeError, ValueError):
        return False


def f(v: SupportsFloat | None, d: int = 2) -> str:
    """A number with d decimals, or n/a."""
    return f"{float(v):.{d}f}" if v is not None and finite(v) else "n/a"


def iv(x: Interval | None, d: int = 2) -> str:
    """' [lo, hi]' of an interval ('' where none, a point, or not finite)."""
    return "" if x is None or x[0] == x[1] or not finite(*x) else f" [{x[0]:.{d}f}, {x[1]:.{d}f}]"


def pc(v: SupportsFloat | None) -> str:
    """A fraction as a whole percentage, or n/a."""
    return f"{100 * float(v):.0f}%" if v is not None and finite(v) else "n/a"


def pc_iv(x: Interval | None) -> str:
    return "" if x is None or x[0] == x[1] or not finite(*x) else f" [{pc(x[0])}, {pc(x[1])}]"


def pts(v: object) -> float | None:
    """A fraction as points (None where it is not a number)."""
    return 100 * float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def pts_iv(point: object, ci: object) -> Interval | None:
    """A fraction and its interval as points."""
    x = bounds(point, ci)
    return None if x is None else (100 * x[0], 100 * x[1])


def head(lh: Sequence[int] | None) -> str:
    """A [layer, head] pair as L<layer>H<head>."""
    return f"L{lh[0]}H{lh[1]}" if lh else "n/a"


def rank(v: int | None) -> str:
    return "n/a" if v is None else str(v)


def ci(x: Sequence[float]) -> str:
    return f"[{x[0]:.1f}, {x[1]:.1f}]"
