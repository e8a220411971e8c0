"""The report's pieces that are not one experiment's: the models table, each model's section (its
experiments' figures and the sections they render), figures inlined, reasons for absent results,
and the claims' rules the sections are handed.

Each experiment renders its own section and summary line (`Experiment.section` / `summary`, in
`vitpos.experiments.<name>_section`); an experiment without a section shows its result's fields. A
measurement a result lacks renders as a one-line reason; anything else that goes wrong raises (the
report is never silently half-empty)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path

from vitpos.claims.base import ModelClaim
from vitpos.claims.c1 import CLAIM as C1
from vitpos.claims.c2 import CLAIM as C2
from vitpos.claims.layers import over_plausible, plausible_sites
from vitpos.experiments.registry import EXPERIMENTS
from vitpos.report.format import e, fmt_value, kv_table, na, pct, table
from vitpos.results.base import Result, Skipped
from vitpos.results.evaluation import EvalResult
from vitpos.results.sae_layers import PLAUSIBLE, LayerPoint, SAELayersResult
from vitpos.study.results import ModelEntry, figure_key, model_slug

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def img(path: Path, alt: str) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return f'<p class="na">figure missing: {e(Path(path).name)}</p>'
    if not data.startswith(PNG_MAGIC):
        return f'<p class="na">figure is not a PNG: {e(Path(path).name)}</p>'
    b64 = base64.b64encode(data).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{b64}" alt="{e(alt)}">'
            f"<figcaption>{e(alt)}</figcaption></figure>")


def reason(entry: ModelEntry, exp: str) -> str:
    """Why a model's entry has no result of `exp`: not applicable, skipped, or not run."""
    if entry.not_applicable.get(exp):
        return str(entry.not_applicable[exp])
    r = entry.results.get(exp)
    if isinstance(r, Skipped):
        return r.skipped
    return "no result in this run"


class _ClaimRules:
    """`vitpos.results.claim_rules.ClaimRules` from the claims' own rules (the sections' view of them)."""

    def at_layer(self, claim: str, spec: str, point: LayerPoint) -> ModelClaim:
        rule = {"C1": C1, "C2": C2}.get(claim)
        if rule is None:
            raise KeyError(f"{claim} is not read over a layer sweep (C1 and C2 are)")
        return rule.at_layer(spec, point)

    def plausible_sites(self, sweep: SAELayersResult) -> list[str]:
        return plausible_sites(sweep, PLAUSIBLE)

    def over_plausible(self, outcomes: Sequence[str]) -> str:
        return over_plausible(outcomes)


CLAIM_RULES = _ClaimRules()  # what every experiment's section is handed


def models_table(models: Mapping[str, ModelEntry]) -> str:
    rows = []
    for spec, m in models.items():
        d = m.describe
        ev = m.results.get("eval")
        ev = ev if isinstance(ev, EvalResult) else None
        top1 = pct(ev and ev.top1) + (f" (n={ev.n})" if ev is not None else "")
        if m.head is not None:  # measured through a classifier head on the pooled features
            top1 += f"; {e(m.head.source)} head on pooled features, l2 {e(m.head.l2)}"
        rows.append([f'<a href="#model-{e(model_slug(spec))}">{e(spec)}</a>', e(m.data), e(d.scheme),
                     e("×".join(map(str, d.grid))), e(d.depth), e(d.num_heads), e(top1)])
    return table(["model", "data", "scheme", "grid", "depth", "heads", "test top-1"], rows, cls="data models", raw=True)


def _generic_section(result: Result) -> str:
    """The section of an experiment without one of its own: its result's fields as they are."""
    return kv_table([(str(k), fmt_value(v)) for k, v in result.to_json().items()])


def model_section(spec: str, entry: ModelEntry, figures: dict[str, Path], used: set[str]) -> str:
    """One model's section: per experiment (registry order) its declared figures, then its table."""
    d = entry.describe
    slug = model_slug(spec)
    info = ", ".join(f"{k} {fmt_value(v)}" for k, v in (("scheme", d.scheme), ("grid", d.grid), ("depth", d.depth),
                                                      ("num_heads", d.num_heads), ("width", d.width)))
    out = [f'<section id="model-{e(slug)}"><h2>{e(spec)}</h2><p>data: <code>{e(entry.data)}</code>; {e(info)}</p>']
    for exp in EXPERIMENTS:
        out.append(f'<section class="exp"><h3>{e(exp.title)}</h3>')
        result = entry.results.get(exp.name)
        if not isinstance(result, Result):  # not applicable, skipped or not run: one line saying which
            out.append(na(reason(entry, exp.name)))
        else:
            for fig in exp.figures(result):
                key = figure_key(spec, fig.name)
                if key in figures:
                    used.add(key)
                    out.append(img(figures[key], f"{spec}: {fig.caption}"))
            own = exp.section(result, CLAIM_RULES)  # the experiment's own section, else its result's fields
            out.append(_generic_section(result) if own is None else own)
        out.append("</section>")
    out.append("</section>")
    return "".join(out)
