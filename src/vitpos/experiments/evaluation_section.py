"""The eval stage's report section and summary line (`vitpos.experiments.evaluation`)."""

from __future__ import annotations

from vitpos.report.format import ci, e, pct, table
from vitpos.results.evaluation import EvalResult


def section(r: EvalResult) -> str:
    iv = ci(r.top1_ci95, 100, 1, "%")
    html_ = (f"<p>test top-1 <b>{pct(r.top1)}</b>{f' (95% Wilson interval {iv})' if iv else ''} on n = {e(r.n)} "
             "images</p>")
    if r.per_group:
        html_ += table(["class group", "top-1"], [[str(g), pct(acc)] for g, acc in r.per_group.items()])
    return html_


def summary(r: EvalResult) -> str:
    return f"test top-1 {pct(r.top1)} {ci(r.top1_ci95, 100, 1, '%')}".rstrip() + f" on n = {r.n} images"
