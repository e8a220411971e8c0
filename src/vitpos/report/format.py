"""Text formatting shared by the report's pieces: escaping, numbers, small tables, and the few
typed readers several experiments' sections share.

The experiments' own sections (`vitpos.experiments.<name>_section`) import this module, so it
imports nothing above the results layer (tests/unit/test_import_graph.py). Every string that comes
from the results goes through `e` (html.escape)."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import Any

from vitpos.results.ape_permute import Outcome, PositionBudget, VariantResult
from vitpos.results.base import Skipped
from vitpos.results.common import ProbedCondition


def e(x: Any) -> str:
    """Escaped text of any JSON value."""
    return html.escape("" if x is None else str(x), quote=True)


def num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def pct(v: Any) -> str:
    """An accuracy fraction as a percentage with one decimal."""
    x = num(v)
    return "n/a" if x is None else f"{100 * x:.1f}%"


def pts(v: Any, std: Any = None, signed: bool = False) -> str:
    """A difference already in points, one decimal, optional ± std."""
    x = num(v)
    if x is None:
        return "n/a"
    s = f"{x:+.1f}" if signed else f"{x:.1f}"
    sd = num(std)
    return f"{s} ± {sd:.1f} pts" if sd is not None else f"{s} pts"


def ci(iv: Any, scale: float = 1.0, digits: int = 1, unit: str = "") -> str:
    """A 95 % interval as "[lo, hi]" (values times `scale`), "" when there is none."""
    if not isinstance(iv, (list, tuple)) or len(iv) != 2:
        return ""
    lo, hi = num(iv[0]), num(iv[1])
    if lo is None or hi is None:
        return ""
    return f"[{scale * lo:.{digits}f}{unit}, {scale * hi:.{digits}f}{unit}]"


def fnum(v: Any, digits: int = 3) -> str:
    x = num(v)
    if x is None:
        return "n/a"
    if isinstance(v, int):
        return str(v)
    return f"{x:.{digits}f}"


def fmt_value(v: Any, depth: int = 0) -> str:
    """Compact plain text of a JSON value (escaped later)."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        items = [fmt_value(x, depth + 1) for x in v[:8]]
        return "[" + ", ".join(items) + (", …" if len(v) > 8 else "") + "]"
    if isinstance(v, dict):
        if depth > 2:
            return "{…}"
        return "{" + ", ".join(f"{k}: {fmt_value(x, depth + 1)}" for k, x in list(v.items())[:12]) + "}"
    return str(v)


def table(headers: list[str], rows: Iterable[list[str]], cls: str = "data", raw: bool = False) -> str:
    """An HTML table; cells are escaped unless `raw` (then they are pre-built HTML)."""
    out = [f'<table class="{cls}"><thead><tr>' + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c if raw else e(c)}</td>" for c in r) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def kv_table(pairs: list[tuple[str, str]]) -> str:
    return table(["quantity", "value"], [list(p) for p in pairs], cls="kv")


def na(reason: Any) -> str:
    return f'<p class="na">not applicable: {e(reason)}</p>'


def families(scheme: Any) -> set[str]:
    s = str(scheme or "").lower()
    return {f for f in ("ape", "rope") if f in s}


def last(vals: Any) -> Any:
    return vals[-1] if isinstance(vals, list) and vals else None


# ---------------------------------------------------------------- typed readers several sections share
def axis_acc(c: ProbedCondition | None, axis: str, orig: bool = False) -> float | None:
    """A condition's final-layer probe accuracy for one axis (retrained, or the clean model's probe)."""
    if c is None:
        return None
    if orig:
        return last(c.row_acc_orig_probe if axis == "row" else c.col_acc_orig_probe)
    return last(c.row_acc if axis == "row" else c.col_acc)


def delta_top1(name: str, t: float | None, base_top1: float | None) -> str:
    """A condition's top-1 change from the baseline condition, in points ("—" for the baseline itself)."""
    return "—" if t is None or base_top1 is None or name == "baseline" else pts(100 * (t - base_top1), signed=True)


def drop_text(x: Outcome | None) -> str:
    """A permutation variant's top-1 drop with its interval ("n/a" where it did not run)."""
    if not isinstance(x, VariantResult):
        return "n/a"
    return f"{pts(x.drop_points)} {ci(x.drop_ci95)}".rstrip()


def drop_or_why(x: Outcome | None) -> str:
    """A permutation variant's drop, or why there is none (skipped, not run)."""
    if isinstance(x, VariantResult):
        return drop_text(x)
    return f"skipped: {x.skipped}" if isinstance(x, Skipped) else "not run"


def budget_text(b: PositionBudget | None, why: bool = False) -> str:
    """An edit's share of the APE-table shuffle's effect as "42.0% [35.1%, 49.8%]", or "undefined" (with
    the reason when `why`) where there is none."""
    if b is None:
        return "n/a"
    if b.share is None:
        return f"undefined: {b.undefined}" if why and b.undefined else "undefined"
    return f"{100 * b.share:.1f}% {ci(b.share_ci95, 100, 1, '%')}".rstrip()
