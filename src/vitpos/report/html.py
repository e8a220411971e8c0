"""The self-contained HTML report: one page rendered from results.json, figures inlined.

Pure rendering: nothing here runs a model. The page is rendered from the typed `StudyResults`
and shows, per model and experiment, the figures the experiments declare (drawn once by the study
into OUT/figures/) and a table; the claims' texts come from the claims registry (`vitpos.claims.registry`). Every string
that comes from the results goes through `html.escape`; not-applicable or skipped pieces render as a
one-line reason, and a section that fails raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitpos.claims.registry import BY_ID, CLAIMS, scheme_of
from vitpos.claims.rules import Sensitivity
from vitpos.claims.verdict import ClaimVerdict, Summary
from vitpos.errors import VitposError
from vitpos.experiments.registry import BY_NAME, EXPERIMENTS
from vitpos.io import atomic_path
from vitpos.report.format import e, families, fmt_value, num, table
from vitpos.report.sections import img, model_section, models_table, reason
from vitpos.results.base import Result
from vitpos.study.results import HEADLINE_FIGURE, ModelEntry, StudyResults


def claim_experiment(claim: str) -> str | None:
    """The first experiment (registry order) that informs a claim: its one-line summary fills the
    other scheme's cell of the headline table (None: no registered experiment informs it)."""
    return next((x.name for x in EXPERIMENTS if claim in x.claims), None)


def _claim_data(claim: ClaimVerdict, models: Mapping[str, ModelEntry]) -> str | None:
    ds = {models[s].data for s in claim.models if s in models}
    return ds.pop() if len(ds) == 1 else None


def _evidence_cell(entries: list[ClaimVerdict]) -> str:
    """A claim at a glance: one sentence and the headline number per model family (its interval,
    the seeds it holds on); each model's reading and numbers fold below, then the sensitivity."""
    out = []
    for c in entries:
        if c.evidence is not None and not c.headlines:  # written before the typed pieces: one prose string
            block = f"<p>{e(c.evidence)}</p>" + _per_model(c)
        else:
            block = f'<p class="sentence">{e(c.sentence)}</p>'
            if c.headlines:
                block += (f'<p class="small">{e(c.headlines[0].label)}:</p><ul class="headline">'
                          + "".join(f"<li><b>{e(h.family)}</b>: {e(h.value_text())}, <i>{e(h.seeds_text())}</i></li>"
                                    for h in c.headlines) + "</ul>")
            block += "".join(f'<p class="small">{e(n)}</p>' for n in c.notes)
            block += _per_model(c)
        out.append(block + _sensitivity(c.sensitivity))
    return "".join(out)


def _per_model(c: ClaimVerdict) -> str:
    """Each model's result, its reading in words and the numbers behind it, folded."""
    specs = list(dict.fromkeys([*c.models, *c.numbers]))
    if not specs:
        return ""
    items = []
    for spec in specs:
        nums = c.numbers.get(spec)
        result = nums.get("result") if isinstance(nums, dict) else None
        text = c.details.get(spec, "")
        text = text[len(spec) + 2:] if text.startswith(f"{spec}: ") else text
        head = f"<b>{e(spec)}</b>" + (f" ({e(result)})" if result else "") + (f": {e(text)}" if text else "")
        items.append(f"<li>{head}{_numbers_list(nums)}</li>")
    # folded: with several seeds the per-model lists run to pages; the headline above reads alone
    return (f'<details class="nums"><summary>per model ({len(specs)}): what the rule read</summary>'
            f'<ul class="nums">{"".join(items)}</ul></details>')


def _sensitivity(curves: list[Sensitivity] | None) -> str:
    """Each threshold's sensitivity curve: the verdict as it moves over its documented range."""
    if not curves:
        return ""
    rows = [[s.threshold, f"{fmt_value(s.value)} {s.unit}", s.source, "yes" if s.stable else "no",
             "; ".join(f"{fmt_value(p.value)}: {p.verdict}" for p in s.curve)] for s in curves]
    return ('<details class="nums"><summary>threshold sensitivity (verdict as each threshold moves)</summary>'
            + table(["threshold", "rule's value", "source", "verdict stable", "verdict over the range"], rows)
            + "</details>")


def _validation(summary: Summary) -> str:
    """The rule set's version and hash, and the validation table on planted models."""
    out = ['<section id="validation"><h2>Validation: verdicts on planted models</h2>']
    if summary.rules_version is not None:
        out.append(f"<p>Verdict rules version <b>{e(summary.rules_version)}</b>, hash <code>{e(summary.rules_hash)}"
                   "</code> (claims/rules.py; results.json records both).</p>")
    val = summary.validation
    if val is None or not val.rows:
        out.append('<p class="na">no validation table in these results (written before it existed).</p></section>')
        return "".join(out)
    out.append(f"<p>Small models where each claim is true or false by construction, measured by the same "
               f"pipeline and rules ({e(val.n_images)} planted images, seeds {e(val.seeds)}). A "
               "planted-true claim should come out supported, a planted-false one not supported.</p>")
    held = [r for r in val.rows if r.split == "held_out"]
    if held:  # a rule tuned on a case is not tested by it: say how many no rule has seen
        out.append(f"<p>{e(sum(r.passes for r in val.rows))} of {e(len(val.rows))} rows as planted; "
                   f"{e(sum(r.passes for r in held))} of {e(len(held))} held-out rows (cases built after the rules "
                   "were frozen, which no rule was tuned on).</p>")
    rows = [[r.claim, f"{r.case}: {r.description}", "true" if r.planted else "false", r.split.replace("_", " "),
             r.verdict, "yes" if r.passes else "NO", ", ".join(r.decided_by) or "-"] for r in val.rows]
    out.append(table(["claim", "planted model", "planted truth", "set", "verdict", "as planted", "decided by"], rows))
    pre = {(c.id, k.name) for c in CLAIMS for k in c.conditions if k.precondition}  # decide nothing alone by design
    idle = [f"{claim}: {name}" for claim, counts in val.power().items() for name, n in counts.items()
            if n == 0 and (claim, name) not in pre]
    if idle:  # METHODS.md, Power: a condition no planted-false case fails on alone is untested by this table
        out.append(f"<p>Conditions that decide no planted-false case on their own (switched off, this table "
                   f"would not notice): {e('; '.join(idle))}.</p>")
    out.append("</section>")
    return "".join(out)


def _numbers_list(numbers: Any) -> str:
    """One model's numbers behind a verdict: a nested list of readable name = value pairs."""
    if not isinstance(numbers, dict):
        return "" if numbers is None else f"<ul class=\"nums\"><li>{e(fmt_value(numbers))}</li></ul>"
    # an unmeasured number (None) says nothing to a reader: left out rather than printed as "None";
    # result and holds are said beside the model's name
    rows = "".join(f"<li>{e(str(k).replace('_', ' '))}: {e(_readable(v))}</li>" for k, v in numbers.items()
                   if v is not None and k not in ("result", "holds"))
    return f'<ul class="nums">{rows}</ul>' if rows else ""


def _readable(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return f"L{v[0]}H{v[1]}"  # a [layer, head] pair
    x = num(v)
    if isinstance(v, float) and x is not None:
        return f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"
    return fmt_value(v)


def _contrast_cell(claim: str, family: str, models: Mapping[str, ModelEntry], data: str | None) -> str:
    """What the other scheme's models show for this claim's experiment (or why it does not apply)."""
    exp = claim_experiment(claim)
    if exp is None:
        return '<p class="na">—</p>'
    by_text: dict[str, list[str]] = {}  # models with the same line share one item (e.g. every seed not applicable)
    for spec, m in models.items():
        if family not in families(m.describe.scheme):
            continue
        if data is not None and m.data != data:
            continue
        result = m.results.get(exp)
        if isinstance(result, Result):  # the experiment's own line ("" where it has none)
            text = BY_NAME[exp].summary(result, claim) or ""
        else:
            text = f"not applicable: {reason(m, exp)}"
        by_text.setdefault(text, []).append(str(spec))
    items = [f"<li><b>{e(', '.join(specs))}</b>: {e(text)}</li>" for text, specs in by_text.items()]
    if not items:
        where = "in this run" if data is None else f"on {data}"
        return f'<p class="na">no {"APE" if family == "ape" else "RoPE"} model {e(where)}</p>'
    return '<ul class="contrast">' + "".join(items) + "</ul>"


def _badge(verdict: Any, prefix: str = "") -> str:
    v = str(verdict or "not evaluated")
    cls = re.sub(r"[^a-z]+", "-", v.lower()).strip("-")
    if cls not in ("supported", "not-supported", "not-applicable", "inconclusive", "partly-supported"):
        cls = "other"
    return f'<span class="badge {cls}">{e(prefix)}{e(v)}</span>'


def _headline(summary: Summary, models: Mapping[str, ModelEntry]) -> str:
    claims = summary.claims
    datas: list[str] = []
    for m in models.values():
        if m.data not in datas:
            datas.append(m.data)
    groups: list[str | None] = [None]
    grouped = len(datas) > 1
    if grouped:  # one block per dataset that has claims; claims spanning datasets last
        with_claims = {_claim_data(c, models) for c in claims}
        groups = [d for d in datas if d in with_claims] + ([None] if None in with_claims else [])
        groups = groups or [None]
    registered = [c.id for c in CLAIMS]
    ids = registered + sorted({c.id for c in claims} - set(registered))
    rows = ['<table id="headline"><thead><tr><th>claim</th><th>APE evidence</th><th>RoPE evidence</th>'
            "<th>verdict</th></tr></thead><tbody>"]
    for g in groups:
        if grouped:
            label = f"data: {g}" if g is not None else "across datasets"
            rows.append(f'<tr class="group"><th colspan="4">{e(label)}</th></tr>')
        for cid in ids:
            entries = [c for c in claims if c.id == cid and (not grouped or _claim_data(c, models) == g)]
            text = next((c.claim for c in entries if c.claim), BY_ID[cid].text if cid in BY_ID else "")
            cells = {}
            for fam in ("ape", "rope"):
                mine = [c for c in entries if (c.scheme or scheme_of(cid)).lower() == fam]
                cells[fam] = _evidence_cell(mine) if mine else _contrast_cell(cid, fam, models, g)
            if entries:
                many = len(entries) > 1
                badges = " ".join(_badge(c.verdict, f"{c.scheme.upper()}: " if many else "") for c in entries)
            else:
                badges = _badge("not evaluated")
            rows.append(f'<tr data-claim="{e(cid)}"><td><b>{e(cid)}</b> {e(text)}</td><td>{cells["ape"]}</td>'
                        f'<td>{cells["rope"]}</td><td class="verdict">{badges}</td></tr>')
    rows.append("</tbody></table>")
    return "".join(rows)



_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#1b1b1b;line-height:1.45}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.9em}
th,td{border:1px solid #c8c8c8;padding:.3em .55em;vertical-align:top;text-align:left}
thead th{background:#eef1f5}
tr.group th{background:#dfe6ee;font-size:1.02em}
#headline td{min-width:12em}
#headline td:first-child{max-width:22em}
.badge{display:inline-block;padding:.15em .6em;border-radius:1em;font-weight:600;font-size:.85em;color:#fff;
margin:.1em 0}
.badge.supported{background:#0072B2}.badge.not-supported{background:#D55E00}
.badge.not-applicable{background:#7a7a7a}.badge.other{background:#a07400}
.badge.partly-supported{background:#a07400}.badge.inconclusive{background:#fff;color:#5a5a5a;border:2px dashed #5a5a5a}
.na{color:#666;font-style:italic}
.small{color:#555;font-size:.85em}
ul.nums,ul.contrast,ul.headline{margin:.2em 0;padding-left:1.2em;font-size:.88em}
p.sentence{margin:.2em 0}
figure{margin:.8em 0}figure img{max-width:100%;height:auto;border:1px solid #ddd}
figcaption{font-size:.85em;color:#555}
section.exp{margin-left:.5em;border-left:3px solid #e3e7ec;padding-left:.8em}
pre{background:#f4f5f7;padding:.7em;overflow-x:auto}
footer{margin-top:3em;border-top:1px solid #ccc;font-size:.85em;color:#444}
"""


def _reproduce(results: StudyResults) -> str:
    cfg = results.config.model_dump(mode="json")
    out = ['<section id="reproduce"><h2>How to reproduce</h2>']
    if results.reproduce:
        out.append(f"<p>Run:</p><pre><code>{e(results.reproduce)}</code></pre>")
    else:
        out.append('<p class="na">no reproduce command was recorded; the configuration below defines the run.</p>')
    out.append(_versions(results))
    out.append(f"<details><summary>configuration</summary><pre><code>{e(json.dumps(cfg, indent=2, default=str))}"
               "</code></pre></details>")
    out.append("</section>")
    return "".join(out)


def _versions(results: StudyResults) -> str:
    versions = (("vitpos_version", results.vitpos_version), ("torch_version", results.torch_version),
                ("timm_version", results.timm_version))
    return ("<p>" + "; ".join(f"{k} <code>{e(v)}</code>" for k, v in versions) +
            f"; seed <code>{e(results.seed)}</code>; created <code>{e(results.created)}</code></p>")


def _footer(results: StudyResults) -> str:
    out = ["<footer>", _versions(results)]
    t = results.timings
    if t:
        # `total_this_run` is the run's wall clock, not a stage: summed with the stages it counted them twice
        stages = {k: v for k, v in t.items() if k != "total_this_run"}
        rows = [[str(k), f"{num(v):.1f} s" if num(v) is not None else fmt_value(v)] for k, v in stages.items()]
        rows.append(["stages computed in this run (sum; cached ones are not listed)",
                     f"{sum(num(v) or 0.0 for v in stages.values()):.1f} s"])
        if num(t.get("total_this_run")) is not None:
            rows.append(["this run, wall clock", f"{num(t['total_this_run']):.1f} s"])
        out.append(table(["stage", "time"], rows, cls="data timings"))
    out.append("</footer>")
    return "".join(out)


def _figure_paths(results: StudyResults, out_dir: Path) -> dict[str, Path]:
    """figure key -> PNG path; results.json records them relative to the output directory."""
    out = {}
    for k, p in results.figures.items():
        path = Path(p)
        out[k] = path if path.is_absolute() else out_dir / path
    return out


def render_report(results: StudyResults | Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write out_dir/report.html (atomically): one self-contained page with figures inlined.

    `results`: the study's results, typed or as the results.json dict (validated first). Figures
    are read from the paths results.figures records (relative to `out_dir`). Returns the path.
    """
    if not isinstance(results, StudyResults):
        if not isinstance(results, Mapping):
            raise VitposError(f"results must be StudyResults or the results.json dict, got {type(results).__name__}")
        results = StudyResults.from_json(results)
    out_dir = Path(out_dir)
    figs = _figure_paths(results, out_dir)
    models = results.models
    datas = sorted({m.data for m in models.values()})
    quick = ('<p class="na">quick mode: a minutes-long smoke run on tiny models; the numbers are not the study\'s.</p>'
             if results.quick else "")
    desc = (f"This report compares where {len(models)} Vision Transformer(s) keep spatial position: absolute "
            "positional embeddings (APE) versus 2D rotary embeddings (RoPE). It checks the study's claims C1–C5 "
            "with linear row/column probes, sparse-autoencoder positional features and their permutation (APE), "
            "and removal and restoring of row/column rotations per layer and head (RoPE). Data: "
            f"{', '.join(datas) or 'n/a'}. Accuracies are percentages; drops are in top-1 points.")
    used: set[str] = {HEADLINE_FIGURE}
    headline_fig = (img(figs[HEADLINE_FIGURE], "APE vs RoPE at a glance: (a) probes per layer, (b) permutation drops "
                        "beside their controls, (c) recovery after restoring rotations, (d) per-head drops")
                    if HEADLINE_FIGURE in figs else "")
    body = [f"<header><h1>vitpos report: where ViTs keep position (APE vs RoPE)</h1><p>{e(desc)}</p>{quick}</header>",
            '<section id="claims"><h2>Claims C1–C5: APE vs RoPE</h2>', headline_fig, _headline(results.summary, models),
            "</section>", _validation(results.summary),
            '<section id="models"><h2>Models</h2>', models_table(models), "</section>"]
    for spec, entry in models.items():
        body.append(model_section(spec, entry, figs, used))
    rest = [k for k in figs if k not in used]
    if rest:
        body.append('<section id="other-figures"><h2>Other figures</h2>'
                    + "".join(img(figs[k], k) for k in rest) + "</section>")
    body += [_reproduce(results), _footer(results)]
    page = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>vitpos report</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    path = out_dir / "report.html"
    with atomic_path(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return path
