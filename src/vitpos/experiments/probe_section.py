"""The probe stage's report section and summary line (`vitpos.experiments.probe`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vitpos.report.format import e, last, num, pct, pts, table
from vitpos.results.probe import ProbeResults, probe_sites


def section(r: ProbeResults) -> str:
    out = []
    for site, res in probe_sites(r).items():
        def col(vals: Sequence[float | None], i: int, fmt: Callable[[Any], str] = pct) -> str:
            return fmt(vals[i]) if i < len(vals) else "n/a"

        def sel(v: Any) -> str:
            x = num(v)
            return pts(None if x is None else 100 * x, signed=True)
        rows = [[str(layer), col(res.row_acc, i), col(res.col_acc, i), col(res.row_control_acc, i),
                 col(res.col_control_acc, i), col(res.row_selectivity, i, sel), col(res.col_selectivity, i, sel)]
                for i, layer in enumerate(res.layers)]
        cb = res.content_baseline
        out.append(f"<h4>site {e(site)}</h4><p>chance: row {pct(res.chance_row)}, col {pct(res.chance_col)}"
                   + (f"; content baseline (no positional input): row {pct(cb.row_acc)}, col {pct(cb.col_acc)}"
                      if num(cb.row_acc) is not None else "")
                   + "</p>")
        out.append(table(["layer", "row acc", "col acc", "row control", "col control", "row selectivity",
                           "col selectivity"], rows))
    return "".join(out)


def summary(r: ProbeResults) -> str:
    """Each site's row / column probe accuracy at the last probed layer."""
    return "; ".join(f"{site}: final-layer row {pct(last(res.row_acc))}, col {pct(last(res.col_acc))}"
                     for site, res in probe_sites(r).items())
