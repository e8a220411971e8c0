"""The self-contained HTML report: one page rendered from results.json, figures inlined.

Pure rendering: nothing here runs a model. Every string that comes from the JSON goes through
`html.escape`; missing or not-applicable pieces render as a one-line reason.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

from vitpos.errors import VitposError
from vitpos.io import atomic_path

CLAIMS: dict[str, tuple[str, str]] = {  # id -> (scheme, default text)
    "C1": ("ape", "APE: sparse autoencoders recover causal row- and column-specific features."),
    "C2": ("ape", "APE: permuting the positional features across patches drops top-1 by 24–31 points."),
    "C3": ("rope", "RoPE: disabling the row (column) rotations removes decodable row (column) information "
                   "independently."),
    "C4": ("rope", "RoPE: once rotations are restored the information is partly rebuilt (0 < recovery < 1), "
                   "in part by axis-specialised heads."),
    "C5": ("rope", "RoPE: ablating the rotations of the primary rebuilding head reduces accuracy more than "
                   "any other head."),
}
CLAIM_EXPERIMENT = {"C1": "sae", "C2": "ape_permute", "C3": "rope_axis", "C4": "rope_axis", "C5": "rope_heads"}
EXPERIMENTS = ("eval", "probe", "sae", "ape_permute", "rope_axis", "rope_heads")
EXPERIMENT_TITLES = {
    "eval": "Test accuracy", "probe": "Linear position probes", "sae": "Sparse autoencoder",
    "ape_permute": "APE positional-feature permutation (C2)", "rope_axis": "RoPE axis removal and restoring (C3, C4)",
    "rope_heads": "RoPE per-head roles and ablation (C4, C5)",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_RENDER_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, VitposError)


# ---------------------------------------------------------------- small helpers
def e(x: Any) -> str:
    """Escaped text of any JSON value."""
    return html.escape("" if x is None else str(x), quote=True)


def model_slug(spec: str) -> str:
    """A safe file/anchor name for a model spec; a short hash keeps distinct specs distinct."""
    spec = str(spec)
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-._")[:60] or "model"
    if clean != spec:
        clean += "-" + hashlib.sha1(spec.encode()).hexdigest()[:8]
    return clean


def figure_key(spec: str, experiment: str) -> str:
    """The key (and file stem) of a model's figure in render_figures' result."""
    return f"{model_slug(spec)}_{experiment}"


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def pct(v: Any) -> str:
    """An accuracy fraction as a percentage with one decimal."""
    x = _num(v)
    return "n/a" if x is None else f"{100 * x:.1f}%"


def pts(v: Any, std: Any = None, signed: bool = False) -> str:
    """A difference already in points, one decimal, optional ± std."""
    x = _num(v)
    if x is None:
        return "n/a"
    s = f"{x:+.1f}" if signed else f"{x:.1f}"
    sd = _num(std)
    return f"{s} ± {sd:.1f} pts" if sd is not None else f"{s} pts"


def fnum(v: Any, digits: int = 3) -> str:
    x = _num(v)
    if x is None:
        return "n/a"
    if isinstance(v, int):
        return str(v)
    return f"{x:.{digits}f}"


def _fmt_value(v: Any, depth: int = 0) -> str:
    """Compact plain text of a JSON value (escaped later)."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        items = [_fmt_value(x, depth + 1) for x in v[:8]]
        return "[" + ", ".join(items) + (", …" if len(v) > 8 else "") + "]"
    if isinstance(v, dict):
        if depth > 2:
            return "{…}"
        return "{" + ", ".join(f"{k}: {_fmt_value(x, depth + 1)}" for k, x in list(v.items())[:12]) + "}"
    return str(v)


def _table(headers: list[str], rows: Iterable[list[str]], cls: str = "data", raw: bool = False) -> str:
    """An HTML table; cells are escaped unless `raw` (then they are pre-built HTML)."""
    out = [f'<table class="{cls}"><thead><tr>' + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c if raw else e(c)}</td>" for c in r) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _kv_table(pairs: list[tuple[str, str]]) -> str:
    return _table(["quantity", "value"], [list(p) for p in pairs], cls="kv")


def _na(reason: Any) -> str:
    return f'<p class="na">not applicable: {e(reason)}</p>'


def _families(scheme: Any) -> set[str]:
    s = str(scheme or "").lower()
    return {f for f in ("ape", "rope") if f in s}


def _describe(m: dict) -> dict:
    d = m.get("describe")
    return d if isinstance(d, dict) else {}


def _last(vals: Any) -> Any:
    return vals[-1] if isinstance(vals, list) and vals else None


def _reason(m: dict, exp: str) -> str:
    na = m.get("not_applicable")
    if isinstance(na, dict) and na.get(exp):
        return str(na[exp])
    doc = m.get(exp)
    if isinstance(doc, dict) and "skipped" in doc:
        return str(doc["skipped"])
    return "no result in this run"


def _doc(m: dict, exp: str) -> dict | None:
    doc = m.get(exp)
    return doc if isinstance(doc, dict) and "skipped" not in doc else None


def _probe_sites(doc: dict) -> dict[str, dict]:
    """site -> probe result, for a single-site doc or a {"sites": {...}} doc."""
    if isinstance(doc.get("sites"), dict):
        return {str(k): v for k, v in doc["sites"].items() if isinstance(v, dict)}
    return {str(doc.get("site", "resid_post")): doc}


# ---------------------------------------------------------------- figures
def _content_baseline(res: dict) -> dict | None:
    cb = res.get("content_baseline")
    if not isinstance(cb, dict):
        return None
    if isinstance(cb.get("layers"), list):
        return cb
    L = len(res.get("layers") or [])
    if _num(cb.get("row_acc")) is None or _num(cb.get("col_acc")) is None:
        return None
    return {"layers": list(res["layers"]), "row_acc": [cb["row_acc"]] * L, "col_acc": [cb["col_acc"]] * L,
            "chance_row": res.get("chance_row"), "chance_col": res.get("chance_col")}


def render_figures(results: dict, out_dir: str | Path) -> dict[str, Path]:
    """Plot every model's available experiment docs to out_dir/figures/<slug>_<experiment>.png.

    Returns figure_key -> path. Missing experiments are skipped; a malformed doc is skipped
    with a warning (VitposError from the plot function), so the report still renders.
    """
    from vitpos.report import plots
    from vitpos.report.probe_plot import plot_probe_curves

    fig_dir = Path(out_dir) / "figures"
    out: dict[str, Path] = {}
    models = results.get("models") if isinstance(results, dict) else None

    def attempt(key: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> None:
        path = fig_dir / f"{key}.png"
        try:
            fn(*args, path, **kw)
        except VitposError as err:
            warnings.warn(f"figure {key} skipped: {err}", stacklevel=3)
            return
        out[key] = path

    for spec, m in (models or {}).items():
        if not isinstance(m, dict):
            continue
        safe_spec = plots.mathtext_safe(spec)
        probe = _doc(m, "probe")
        if probe is not None:
            sites = _probe_sites(probe)
            for site, res in sites.items():
                key = figure_key(spec, "probe" if len(sites) == 1 else f"probe_{model_slug(site)}")
                path = fig_dir / f"{key}.png"
                try:
                    plot_probe_curves(res, path, title=f"{safe_spec}: {plots.mathtext_safe(site)}",
                                      content_baseline=_content_baseline(res))
                except VitposError as err:
                    warnings.warn(f"figure {key} skipped: {err}", stacklevel=2)
                    continue
                out[key] = path
        if (doc := _doc(m, "ape_permute")) is not None:
            attempt(figure_key(spec, "ape_permute"), plots.plot_ape_permute, doc)
        if (doc := _doc(m, "rope_axis")) is not None:
            attempt(figure_key(spec, "rope_axis"), plots.plot_rope_axis, doc)
            if doc.get("recovery"):
                attempt(figure_key(spec, "recovery"), plots.plot_recovery, doc)
        if (doc := _doc(m, "rope_heads")) is not None:
            attempt(figure_key(spec, "rope_heads"), plots.plot_rope_heads, doc)
    return out


def _img(path: Path, alt: str) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return f'<p class="na">figure missing: {e(Path(path).name)}</p>'
    if not data.startswith(PNG_MAGIC):
        return f'<p class="na">figure is not a PNG: {e(Path(path).name)}</p>'
    b64 = base64.b64encode(data).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{b64}" alt="{e(alt)}">'
            f"<figcaption>{e(alt)}</figcaption></figure>")


# ---------------------------------------------------------------- per-experiment summaries (one line)
def _summary_sae(doc: dict) -> str:
    s = (f"{len(doc.get('row_features') or [])} row / {len(doc.get('col_features') or [])} col / "
         f"{len(doc.get('mixed_features') or [])} mixed features at layer {doc.get('layer', '?')} "
         f"(FVU {fnum(doc.get('fvu'))})")
    c = doc.get("causal")
    if isinstance(c, dict):
        s += (f"; removing them: Δ row-probe acc {fnum(c.get('row_drop'))}, Δ col-probe acc "
              f"{fnum(c.get('col_drop'))}, selectivity {fnum(c.get('selectivity'), 2)}")
    return s


def _summary_ape(doc: dict) -> str:
    parts = []
    for v, label in (("all", "all positional features"), ("row_only", "row only"), ("col_only", "col only"),
                     ("random_features", "random features")):
        x = doc.get(v)
        if isinstance(x, dict) and "drop_points" in x:
            parts.append(f"{label} {pts(x.get('drop_points'), x.get('drop_std'))}")
    return f"baseline top-1 {pct(doc.get('baseline_top1'))}; drop when permuting " + (", ".join(parts) or "n/a")


def _summary_axis(doc: dict, claim: str) -> str:
    conds = doc.get("conditions") or {}
    base = conds.get("baseline") or {}
    if claim == "C4":
        parts = []
        for axis in ("row", "col"):
            per_r = (doc.get("recovery") or {}).get(axis) or {}
            recs = ", ".join(f"R={r}: {fnum((v or {}).get('mean_rec'), 2)}" for r, v in per_r.items())
            if recs:
                parts.append(f"mean {axis} Rec {recs}")
        return "; ".join(parts) or "no recovery data"
    parts = []
    for c in ("no_row", "no_col"):
        x = conds.get(c)
        if isinstance(x, dict):
            parts.append(f"{c}: final-layer row {pct(_last(x.get('row_acc')))} (clean {pct(_last(base.get('row_acc')))}), "
                         f"col {pct(_last(x.get('col_acc')))} (clean {pct(_last(base.get('col_acc')))})")
    return "; ".join(parts) or "no conditions"


def _summary_heads(doc: dict) -> str:
    ph, lh = doc.get("primary_rebuilding_head"), doc.get("largest_drop_head")
    n = len(doc.get("layers") or []) * int(doc.get("num_heads") or 0)
    return (f"primary rebuilding head {_head(ph)}: drop {pts(_at(doc.get('drop_points'), doc, ph))}, "
            f"rank {doc.get('primary_head_drop_rank', '?')} of {n}; largest drop {_head(lh)}: "
            f"{pts(_at(doc.get('drop_points'), doc, lh))}")


def _head(lh: Any) -> str:
    return f"L{lh[0]} h{lh[1]}" if isinstance(lh, (list, tuple)) and len(lh) == 2 else "n/a"


def _at(grid: Any, doc: dict, lh: Any) -> Any:
    """grid[layer][head] for a [layer, head] pair (layer = a value of doc['layers'])."""
    try:
        return grid[list(doc["layers"]).index(lh[0])][int(lh[1])]
    except (TypeError, ValueError, IndexError, KeyError):
        return None


def _summary(exp: str, doc: dict, claim: str) -> str:
    if exp == "sae":
        return _summary_sae(doc)
    if exp == "ape_permute":
        return _summary_ape(doc)
    if exp == "rope_axis":
        return _summary_axis(doc, claim)
    if exp == "rope_heads":
        return _summary_heads(doc)
    return ""


# ---------------------------------------------------------------- headline table
def _claim_data(entry: dict, models: dict) -> str | None:
    if entry.get("data") is not None:
        return str(entry["data"])
    ds = {str(models[s].get("data")) for s in entry.get("models") or [] if isinstance(models.get(s), dict)}
    return ds.pop() if len(ds) == 1 else None


def _evidence_cell(entries: list[dict]) -> str:
    out = []
    for c in entries:
        block = f"<p>{e(c.get('evidence', ''))}</p>"
        nums = c.get("numbers")
        if isinstance(nums, dict) and nums:
            block += '<ul class="nums">' + "".join(
                f"<li><code>{e(k)}</code> = {e(_fmt_value(v))}</li>" for k, v in nums.items()) + "</ul>"
        if c.get("models"):
            block += f'<p class="small">models: {e(", ".join(map(str, c["models"])))}</p>'
        out.append(block)
    return "".join(out)


def _contrast_cell(claim: str, family: str, models: dict, data: str | None) -> str:
    """What the other scheme's models show for this claim's experiment (or why it does not apply)."""
    exp = CLAIM_EXPERIMENT[claim]
    items = []
    for spec, m in models.items():
        if not isinstance(m, dict) or family not in _families(_describe(m).get("scheme")):
            continue
        if data is not None and str(m.get("data")) != data:
            continue
        doc = _doc(m, exp)
        try:
            text = _summary(exp, doc, claim) if doc is not None else f"not applicable: {_reason(m, exp)}"
        except _RENDER_ERRORS as err:
            text = f"could not summarise {exp}: {err}"
        items.append(f"<li><b>{e(spec)}</b>: {e(text)}</li>")
    if not items:
        where = "in this run" if data is None else f"on {data}"
        return f'<p class="na">no {"APE" if family == "ape" else "RoPE"} model {e(where)}</p>'
    return '<ul class="contrast">' + "".join(items) + "</ul>"


def _badge(verdict: Any, prefix: str = "") -> str:
    v = str(verdict or "not evaluated")
    cls = re.sub(r"[^a-z]+", "-", v.lower()).strip("-")
    if cls not in ("supported", "not-supported", "not-applicable"):
        cls = "other"
    return f'<span class="badge {cls}">{e(prefix)}{e(v)}</span>'


def _headline(results: dict, models: dict) -> str:
    summary = results.get("summary") if isinstance(results.get("summary"), dict) else {}
    claims = [c for c in summary.get("claims") or [] if isinstance(c, dict)]
    datas: list[str] = []
    for m in models.values():
        if isinstance(m, dict) and str(m.get("data")) not in datas:
            datas.append(str(m.get("data")))
    groups: list[str | None] = [None]
    grouped = len(datas) > 1
    if grouped:  # one block per dataset that has claims; claims spanning datasets last
        with_claims = {_claim_data(c, models) for c in claims}
        groups = [d for d in datas if d in with_claims] + ([None] if None in with_claims else [])
        groups = groups or [None]
    ids = list(CLAIMS) + sorted({str(c.get("id")) for c in claims} - set(CLAIMS))
    rows = ['<table id="headline"><thead><tr><th>claim</th><th>APE evidence</th><th>RoPE evidence</th>'
            "<th>verdict</th></tr></thead><tbody>"]
    for g in groups:
        if grouped:
            label = f"data: {g}" if g is not None else "across datasets"
            rows.append(f'<tr class="group"><th colspan="4">{e(label)}</th></tr>')
        for cid in ids:
            entries = [c for c in claims if str(c.get("id")) == cid
                       and (not grouped or _claim_data(c, models) == g)]
            default_scheme, default_text = CLAIMS.get(cid, ("", ""))
            text = next((c.get("claim") for c in entries if c.get("claim")), default_text)
            cells = {}
            for fam in ("ape", "rope"):
                mine = [c for c in entries if str(c.get("scheme", default_scheme)).lower() == fam]
                if mine:
                    cells[fam] = _evidence_cell(mine)
                elif cid in CLAIM_EXPERIMENT:
                    cells[fam] = _contrast_cell(cid, fam, models, g)
                else:
                    cells[fam] = '<p class="na">—</p>'
            if entries:
                many = len(entries) > 1
                badges = " ".join(
                    _badge(c.get("verdict"), f"{str(c.get('scheme', '')).upper()}: " if many else "") for c in entries)
            else:
                badges = _badge("not evaluated")
            rows.append(f'<tr data-claim="{e(cid)}"><td><b>{e(cid)}</b> {e(text)}</td><td>{cells["ape"]}</td>'
                        f'<td>{cells["rope"]}</td><td class="verdict">{badges}</td></tr>')
    rows.append("</tbody></table>")
    return "".join(rows)


# ---------------------------------------------------------------- per-model tables
def _eval_top1(m: dict) -> Any:
    ev = m.get("eval")
    if not isinstance(ev, dict):
        return None
    return ev.get("top1", ev.get("test_top1"))


def _models_table(models: dict) -> str:
    rows = []
    for spec, m in models.items():
        if not isinstance(m, dict):
            continue
        d = _describe(m)
        grid = d.get("grid")
        grid_s = "×".join(map(str, grid)) if isinstance(grid, (list, tuple)) else ""
        ev = m.get("eval") if isinstance(m.get("eval"), dict) else {}
        top1 = pct(_eval_top1(m)) + (f" (n={ev['n']})" if ev.get("n") is not None else "")
        rows.append([f'<a href="#model-{e(model_slug(spec))}">{e(spec)}</a>', e(m.get("data")), e(d.get("scheme")),
                     e(grid_s), e(d.get("depth")), e(d.get("num_heads")), e(top1)])
    return _table(["model", "data", "scheme", "grid", "depth", "heads", "test top-1"], rows, cls="data models", raw=True)


def _sec_eval(doc: dict) -> str:
    html_ = f"<p>test top-1 <b>{pct(doc.get('top1', doc.get('test_top1')))}</b> on n = {e(doc.get('n', '?'))} images</p>"
    pg = doc.get("per_group")
    if isinstance(pg, dict) and pg:
        rows = []
        for g, v in pg.items():
            acc = v.get("top1", v.get("acc")) if isinstance(v, dict) else v
            rows.append([str(g), pct(acc) if _num(acc) is not None else _fmt_value(v)])
        html_ += _table(["class group", "top-1"], rows)
    return html_


def _sec_probe(doc: dict) -> str:
    out = []
    for site, res in _probe_sites(doc).items():
        layers = res.get("layers") or []

        def col(key: str, i: int, fmt: Callable[[Any], str] = pct) -> str:
            vals = res.get(key)
            return fmt(vals[i]) if isinstance(vals, list) and i < len(vals) else "n/a"

        sel = lambda v: pts(None if _num(v) is None else 100 * _num(v), signed=True)  # noqa: E731
        rows = [[str(l), col("row_acc", i), col("col_acc", i), col("row_control_acc", i), col("col_control_acc", i),
                 col("row_selectivity", i, sel), col("col_selectivity", i, sel)] for i, l in enumerate(layers)]
        cb = res.get("content_baseline") if isinstance(res.get("content_baseline"), dict) else {}
        out.append(f"<h4>site {e(site)}</h4><p>chance: row {pct(res.get('chance_row'))}, col {pct(res.get('chance_col'))}"
                   + (f"; content baseline (no positional input): row {pct(cb.get('row_acc'))}, "
                      f"col {pct(cb.get('col_acc'))}" if cb and _num(cb.get("row_acc")) is not None else "")
                   + "</p>")
        out.append(_table(["layer", "row acc", "col acc", "row control", "col control", "row selectivity",
                           "col selectivity"], rows))
    return "".join(out)


def _ids(v: Any, n: int = 12) -> str:
    v = list(v or [])
    return f"{len(v)}" + (f" ({', '.join(map(str, v[:n]))}{', …' if len(v) > n else ''})" if v else "")


def _sec_sae(doc: dict) -> str:
    pairs = [("architecture", f"{doc.get('arch', '?')}, k = {doc.get('k', '?')}, expansion {doc.get('expansion', '?')}×"),
             ("trained on", f"layer {doc.get('layer', '?')} {doc.get('site', '')}"),
             ("fraction of variance unexplained (FVU)", fnum(doc.get("fvu"))),
             ("L0 (active latents per token)", fnum(doc.get("l0"), 1)),
             ("dead latents", pct(doc.get("dead_frac"))),
             ("top-1 with SAE reconstruction spliced in", pct(doc.get("top1_spliced"))),
             ("top-1 change from splicing", pts(doc.get("top1_change_points"), signed=True)),
             ("row features", _ids(doc.get("row_features"))),
             ("column features", _ids(doc.get("col_features"))),
             ("mixed features", _ids(doc.get("mixed_features")))]
    c = doc.get("causal")
    if isinstance(c, dict):
        pairs += [("causal: row-probe drop on removing row features", fnum(c.get("row_drop"))),
                  ("causal: col-probe drop on removing col features", fnum(c.get("col_drop"))),
                  ("causal selectivity Δrow / (Δrow + Δcol)", fnum(c.get("selectivity"), 2))]
    return _kv_table(pairs)


def _sec_ape(doc: dict) -> str:
    from vitpos.report.plots import APE_VARIANTS

    fc = doc.get("feature_counts") if isinstance(doc.get("feature_counts"), dict) else {}
    head = (f"<p>{e(doc.get('model', ''))} layer {e(doc.get('layer', '?'))} {e(doc.get('site', ''))} on "
            f"{e(doc.get('data', ''))}: {e(doc.get('n_images', '?'))} images, seeds {e(_fmt_value(doc.get('seeds')))}; "
            f"baseline top-1 <b>{pct(doc.get('baseline_top1'))}</b>; positional features: "
            f"{e(fc.get('row', '?'))} row, {e(fc.get('col', '?'))} col</p>")
    rows = []
    for v in doc.get("variants") or APE_VARIANTS:
        x = doc.get(v)
        if not isinstance(x, dict):
            rows.append([str(v), "not run", "", "", ""])
            continue
        if "skipped" in x:
            rows.append([str(v), f"skipped: {x['skipped']}", "", "", ""])
            continue
        pg = x.get("per_group") if isinstance(x.get("per_group"), dict) else {}
        groups = "; ".join(f"{g}: {pts((gv or {}).get('drop_points'))}" for g, gv in pg.items()) or "—"
        sd = _num(x.get("top1_std"))
        t = _num(x.get("top1"))
        top1 = f"{100 * t:.1f} ± {100 * sd:.1f}%" if t is not None and sd is not None else pct(t)
        nf = x.get("n_features")
        rows.append([str(v), top1, pts(x.get("drop_points"), x.get("drop_std")), "—" if nf is None else str(nf), groups])
    return head + _table(["variant", "top-1", "drop", "features permuted", "drop per class group"],
                         rows)


def _sec_axis(doc: dict) -> str:
    conds = doc.get("conditions") if isinstance(doc.get("conditions"), dict) else {}
    base_top1 = _num((conds.get("baseline") or {}).get("top1"))
    rows = []
    for name, c in conds.items():
        if not isinstance(c, dict):
            continue
        t = _num(c.get("top1"))
        d = "—" if t is None or base_top1 is None or name == "baseline" else pts(100 * (t - base_top1), signed=True)
        rows.append([str(name), str(c.get("axis") or "—"), "—" if c.get("restore_from") is None else str(c["restore_from"]),
                     pct(t), d, pct(_last(c.get("row_acc"))), pct(_last(c.get("row_acc_orig_probe"))),
                     pct(_last(c.get("col_acc"))), pct(_last(c.get("col_acc_orig_probe")))])
    out = (f"<p>{e(doc.get('model', ''))} on {e(doc.get('data', ''))}, probes at {e(doc.get('site', 'resid_post'))}; "
           f"chance row {pct(doc.get('chance_row'))}, col {pct(doc.get('chance_col'))}. Probe accuracies at the "
           "final layer: <i>retrained</i> = decodable at all, <i>orig. probe</i> = readable by the clean-model probe.</p>")
    out += _table(["condition", "axis removed", "restore from", "top-1", "Δ top-1", "row (retrained)",
                   "row (orig. probe)", "col (retrained)", "col (orig. probe)"], rows)
    rec_rows = []
    for axis, per_r in (doc.get("recovery") or {}).items():
        for r, v in (per_r or {}).items():
            v = v or {}
            rec_rows.append([str(axis), str(r), fnum(v.get("mean_rec"), 2), fnum(_last(v.get("rec")), 2)])
    if rec_rows:
        out += "<p>Recovery Rec(ℓ) = (P_restore − P_off) / (P_clean − P_off); the study predicts 0 &lt; Rec &lt; 1.</p>"
        out += _table(["axis", "restore from R", "mean Rec after R", "Rec at final layer"], rec_rows)
    return out


def _sec_heads(doc: dict) -> str:
    ph, lh = doc.get("primary_rebuilding_head"), doc.get("largest_drop_head")
    n = len(doc.get("layers") or []) * int(doc.get("num_heads") or 0)
    pairs = [("axis removed / restore from", f"{doc.get('axis', '?')} / {doc.get('restore_from', '?')}"),
             ("baseline top-1", pct(doc.get("baseline_top1"))),
             ("primary rebuilding head", _head(ph)),
             ("its rebuilding score", fnum(_at(doc.get("rebuild_score"), doc, ph))),
             ("its axis index S (+1 row, −1 col)", fnum(_at(doc.get("axis_index"), doc, ph), 2)),
             ("top-1 drop when its rotations are ablated", pts(_at(doc.get("drop_points"), doc, ph))),
             ("its drop rank (1 = largest)", f"{doc.get('primary_head_drop_rank', '?')} of {n}"),
             ("largest-drop head", f"{_head(lh)}: {pts(_at(doc.get('drop_points'), doc, lh))}")]
    if doc.get("mean_ablate_drop_points") is not None:
        pairs.append(("primary head: drop when its output is mean-ablated",
                      pts(_at(doc.get("mean_ablate_drop_points"), doc, ph))))
    return _kv_table(pairs)


_SECTIONS: dict[str, Callable[[dict], str]] = {
    "eval": _sec_eval, "probe": _sec_probe, "sae": _sec_sae, "ape_permute": _sec_ape,
    "rope_axis": _sec_axis, "rope_heads": _sec_heads,
}
_FIGS = {"probe": ("probe",), "ape_permute": ("ape_permute",), "rope_axis": ("rope_axis", "recovery"),
         "rope_heads": ("rope_heads",)}


def _model_section(spec: str, m: dict, figures: dict[str, Path], used: set[str]) -> str:
    d = _describe(m)
    slug = model_slug(spec)
    info = ", ".join(f"{k} {_fmt_value(d[k])}" for k in ("scheme", "grid", "depth", "num_heads", "width")
                     if k in d)
    out = [f'<section id="model-{e(slug)}"><h2>{e(spec)}</h2><p>data: <code>{e(m.get("data"))}</code>; {e(info)}</p>']
    for exp in EXPERIMENTS:
        out.append(f'<section class="exp"><h3>{e(EXPERIMENT_TITLES[exp])}</h3>')
        doc = _doc(m, exp)
        if doc is None:
            out.append(_na(_reason(m, exp)))
        else:
            keys = [f"{slug}_{name}" for name in _FIGS.get(exp, ()) if f"{slug}_{name}" in figures]
            if exp == "probe":
                keys += sorted(k for k in figures if k.startswith(f"{slug}_probe_"))
            for k in keys:
                used.add(k)
                out.append(_img(figures[k], f"{spec}: {k[len(slug) + 1:].replace('_', ' ')}"))
            try:
                out.append(_SECTIONS[exp](doc))
            except _RENDER_ERRORS as err:
                out.append(f'<p class="na">could not render {e(exp)}: {e(type(err).__name__)}: {e(err)}</p>')
        out.append("</section>")
    out.append("</section>")
    return "".join(out)


# ---------------------------------------------------------------- page
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
.na{color:#666;font-style:italic}
.small{color:#555;font-size:.85em}
ul.nums,ul.contrast{margin:.2em 0;padding-left:1.2em;font-size:.88em}
figure{margin:.8em 0}figure img{max-width:100%;height:auto;border:1px solid #ddd}
figcaption{font-size:.85em;color:#555}
section.exp{margin-left:.5em;border-left:3px solid #e3e7ec;padding-left:.8em}
pre{background:#f4f5f7;padding:.7em;overflow-x:auto}
footer{margin-top:3em;border-top:1px solid #ccc;font-size:.85em;color:#444}
"""


def _reproduce(results: dict) -> str:
    cfg = results.get("config") if isinstance(results.get("config"), dict) else {}
    cmd = results.get("reproduce") or cfg.get("reproduce") or cfg.get("command")
    out = ['<section id="reproduce"><h2>How to reproduce</h2>']
    if cmd:
        cmd = " ".join(map(str, cmd)) if isinstance(cmd, list) else str(cmd)
        out.append(f"<p>Run:</p><pre><code>{e(cmd)}</code></pre>")
    else:
        out.append('<p class="na">no reproduce command was recorded; the configuration below defines the run.</p>')
    out.append(_versions(results))
    if cfg:
        out.append(f"<details><summary>configuration</summary><pre><code>{e(json.dumps(cfg, indent=2, default=str))}"
                   "</code></pre></details>")
    out.append("</section>")
    return "".join(out)


def _versions(results: dict) -> str:
    return ("<p>" + "; ".join(f"{k} <code>{e(results.get(k, 'unknown'))}</code>"
                              for k in ("vitpos_version", "torch_version", "timm_version")) +
            f"; seed <code>{e(results.get('seed', 'unknown'))}</code>; created <code>{e(results.get('created', 'unknown'))}"
            "</code></p>")


def _footer(results: dict) -> str:
    out = ["<footer>", _versions(results)]
    t = results.get("timings")
    if isinstance(t, dict) and t:
        rows = [[str(k), f"{_num(v):.1f} s" if _num(v) is not None else _fmt_value(v)] for k, v in t.items()]
        total = sum(_num(v) or 0.0 for v in t.values())
        rows.append(["total", f"{total:.1f} s"])
        out.append(_table(["stage", "time"], rows, cls="data timings"))
    out.append("</footer>")
    return "".join(out)


def _resolve_figures(results: dict, out_dir: Path, figures: dict | None) -> dict[str, Path]:
    if figures is None:
        recorded = results.get("figures")
        if isinstance(recorded, dict) and recorded:
            figures = recorded
        else:
            figures = render_figures(results, out_dir)
    out = {}
    for k, p in figures.items():
        p = Path(p)
        out[str(k)] = p if p.is_absolute() else out_dir / p
    return out


def render_report(results: dict, out_dir: str | Path, figures: dict[str, Path] | None = None) -> Path:
    """Write out_dir/report.html (atomically): one self-contained page with figures inlined.

    `figures`: figure_key -> PNG path (relative paths are under out_dir). When None, the
    results' own "figures" entry is used, or, if it has none, render_figures is called.
    Returns the report's path.
    """
    if not isinstance(results, dict):
        raise VitposError(f"results must be the results.json dict, got {type(results).__name__}")
    out_dir = Path(out_dir)
    figs = _resolve_figures(results, out_dir, figures)
    models = results.get("models") if isinstance(results.get("models"), dict) else {}
    datas = sorted({str(m.get("data")) for m in models.values() if isinstance(m, dict)})
    quick = ('<p class="na">quick mode: a seconds-long smoke run on tiny models; the numbers are not the study\'s.</p>'
             if results.get("quick") else "")
    desc = (f"This report compares where {len(models)} Vision Transformer(s) keep spatial position: absolute "
            "positional embeddings (APE) versus 2D rotary embeddings (RoPE). It checks the study's claims C1–C5 "
            "with linear row/column probes, sparse-autoencoder positional features and their permutation (APE), "
            "and removal and restoring of row/column rotations per layer and head (RoPE). Data: "
            f"{', '.join(datas) or 'n/a'}. Accuracies are percentages; drops are in top-1 points.")
    used: set[str] = set()
    body = [f"<header><h1>vitpos report: where ViTs keep position (APE vs RoPE)</h1><p>{e(desc)}</p>{quick}</header>",
            '<section id="claims"><h2>Claims C1–C5: APE vs RoPE</h2>', _headline(results, models), "</section>",
            '<section id="models"><h2>Models</h2>', _models_table(models), "</section>"]
    for spec, m in models.items():
        if isinstance(m, dict):
            body.append(_model_section(str(spec), m, figs, used))
    rest = [k for k in figs if k not in used]
    if rest:
        body.append('<section id="other-figures"><h2>Other figures</h2>'
                    + "".join(_img(figs[k], k) for k in rest) + "</section>")
    body += [_reproduce(results), _footer(results)]
    page = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>vitpos report</title><style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    path = out_dir / "report.html"
    with atomic_path(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return path
