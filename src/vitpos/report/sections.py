"""Per-experiment pieces of the report: a one-line summary (headline contrast cells) and a section.

Rendered from the JSON of each typed result (the report may read results.json files written by
other runs); anything missing renders as a one-line reason instead of failing the page."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitpos.errors import VitposError
from vitpos.experiments.ape_permute import CONTROLS as APE_CONTROLS
from vitpos.experiments.ape_permute import variant_names
from vitpos.experiments.base import Result
from vitpos.experiments.registry import EXPERIMENTS
from vitpos.experiments.rope_heads import closest_rival
from vitpos.report.format import (
    ci,
    describe,
    dict_at,
    doc_of,
    e,
    fmt_value,
    fnum,
    kv_table,
    last,
    na,
    num,
    pct,
    probe_sites,
    pts,
    reason,
    table,
)
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


def _summary_sae(doc: dict) -> str:
    s = (f"{len(doc.get('row_features') or [])} row / {len(doc.get('col_features') or [])} col / "
         f"{len(doc.get('mixed_features') or [])} mixed features at layer {doc.get('layer', '?')} "
         f"(FVU {fnum(doc.get('fvu'))})")
    c = doc.get("causal")
    if isinstance(c, dict):
        row, col = c.get("ablate_row") or {}, c.get("ablate_col") or {}
        s += (f"; removing the row features: Δ row-probe acc {fnum(row.get('row_drop'))}, Δ col-probe acc "
              f"{fnum(row.get('col_drop'))} (selectivity {fnum(row.get('selectivity'), 2)} "
              f"{ci(row.get('selectivity_ci95'), digits=2)}); removing the col features: Δ col "
              f"{fnum(col.get('col_drop'))}, Δ row {fnum(col.get('row_drop'))} (selectivity "
              f"{fnum(col.get('selectivity'), 2)} {ci(col.get('selectivity_ci95'), digits=2)})")
    return s


APE_SET_LABELS = {"all_positional": "all positional (row+col+mixed)", "all": "row+col", "row_only": "row only",
                  "col_only": "col only"}


def _drop_text(x: Any) -> str:
    if not isinstance(x, dict) or "drop_points" not in x:
        return "n/a"
    return f"{pts(x.get('drop_points'))} {ci(x.get('drop_ci95'))}".rstrip()


def _summary_ape(doc: dict) -> str:
    parts = []
    given = doc.get("controls")
    controls: dict = given if isinstance(given, dict) else {"all": "random_features"}
    for v, label in APE_SET_LABELS.items():
        x = doc.get(v)
        if isinstance(x, dict) and "drop_points" in x:
            c = controls.get(v)
            parts.append(f"{label} {_drop_text(x)}" + (f" (control {_drop_text(doc.get(c))})" if c else ""))
    return f"baseline top-1 {pct(doc.get('baseline_top1'))}; drop when permuting " + (", ".join(parts) or "n/a")


def _summary_axis(doc: dict, claim: str) -> str:
    conds = doc.get("conditions") or {}
    base = conds.get("baseline") or {}
    if claim == "C4":
        parts = []
        medians = dict_at(doc, "median_recovery")
        for axis in ("row", "col"):
            per_r = (doc.get("recovery") or {}).get(axis) or {}
            recs = ", ".join(f"R={r}: {_rec_text(v)}" for r, v in per_r.items())
            if recs:
                med = medians.get(axis)
                parts.append(f"mean {axis} Rec {recs}" + (f" (median over R {_rec_text(med, 'median_rec')})"
                                                          if isinstance(med, dict) and len(per_r) > 1 else ""))
        return "; ".join(parts) or "no recovery data"
    parts = []
    removal = dict_at(doc, "removal")
    for c in ("no_row", "no_col"):
        x = conds.get(c)
        if isinstance(x, dict):
            parts.append(f"{c}: final-layer row {pct(last(x.get('row_acc')))} (clean "
                         f"{pct(last(base.get('row_acc')))}), col {pct(last(x.get('col_acc')))} (clean "
                         f"{pct(last(base.get('col_acc')))})" + _removal_text(c, removal.get(c)))
    return "; ".join(parts) or "no conditions"


def _rec_text(v: Any, key: str = "mean_rec") -> str:
    """A recovery with its paired interval, where measured."""
    v = v if isinstance(v, dict) else {}
    return f"{fnum(v.get(key), 2)} {ci(v.get(f'{key}_ci95'), digits=2)}".rstrip()


def _removal_text(cond: str, rem: Any) -> str:
    """C3's fractions of one no_<axis> condition with their intervals ("" in results without them)."""
    if not isinstance(rem, dict):
        return ""
    own = cond.removeprefix("no_")
    other = "col" if own == "row" else "row"
    return (f", {pct(rem.get('removed'))} {ci(rem.get('removed_ci95'), 100, 1, '%')} of above-chance {own} "
            f"decodability removed, {pct(rem.get('kept'))} {ci(rem.get('kept_ci95'), 100, 1, '%')} of {other} "
            "kept").replace("  ", " ")


def _summary_heads(doc: dict) -> str:
    ph, lh = doc.get("primary_rebuilding_head"), doc.get("largest_drop_head")
    n = len(doc.get("layers") or []) * int(doc.get("num_heads") or 0)
    return (f"primary rebuilding head {head_name(ph)}: drop {_head_drop(doc, ph)}, "
            f"rank {doc.get('primary_head_drop_rank', '?')} of {n}; largest drop {head_name(lh)}: "
            f"{_head_drop(doc, lh)}")


def _head_drop(doc: dict, lh: Any) -> str:
    """A head's top-1 drop with its interval, where measured."""
    return f"{pts(at(doc.get('drop_points'), doc, lh))} {ci(at(doc.get('drop_ci95'), doc, lh))}".rstrip()


def _closest_rival(doc: dict) -> str:
    """The head whose paired margin against the primary has the lowest lower end, and that margin."""
    rival = closest_rival(doc.get("primary_margin_ci95"))
    if rival is None:
        return "n/a"
    lh, m = rival
    return f"{head_name(lh)}: drop(primary) − drop({head_name(lh)}) {ci(m)} pts"


def head_name(lh: Any) -> str:
    return f"L{lh[0]} h{lh[1]}" if isinstance(lh, (list, tuple)) and len(lh) == 2 else "n/a"


def at(grid: Any, doc: dict, lh: Any) -> Any:
    """grid[layer][head] for a [layer, head] pair (layer = a value of doc['layers'])."""
    try:
        return grid[list(doc["layers"]).index(lh[0])][int(lh[1])]
    except (TypeError, ValueError, IndexError, KeyError):
        return None


def summary_line(exp: str, doc: dict, claim: str) -> str:
    if exp == "sae":
        return _summary_sae(doc)
    if exp == "ape_permute":
        return _summary_ape(doc)
    if exp == "rope_axis":
        return _summary_axis(doc, claim)
    if exp == "rope_heads":
        return _summary_heads(doc)
    return ""


def eval_top1(m: dict) -> Any:
    ev = m.get("eval")
    if not isinstance(ev, dict):
        return None
    return ev.get("top1", ev.get("test_top1"))


def models_table(models: dict) -> str:
    rows = []
    for spec, m in models.items():
        if not isinstance(m, dict):
            continue
        d = describe(m)
        grid = d.get("grid")
        grid_s = "×".join(map(str, grid)) if isinstance(grid, (list, tuple)) else ""
        ev = dict_at(m, "eval")
        top1 = pct(eval_top1(m)) + (f" (n={ev['n']})" if ev.get("n") is not None else "")
        hd = m.get("head")
        if isinstance(hd, dict):  # measured through a head on the pooled features (results.json `head`)
            top1 += f"; {e(hd.get('source', 'fitted'))} head on pooled features, l2 {e(hd.get('l2'))}"
        rows.append([f'<a href="#model-{e(model_slug(spec))}">{e(spec)}</a>', e(m.get("data")), e(d.get("scheme")),
                     e(grid_s), e(d.get("depth")), e(d.get("num_heads")), e(top1)])
    return table(["model", "data", "scheme", "grid", "depth", "heads", "test top-1"], rows, cls="data models", raw=True)


def _sec_eval(doc: dict) -> str:
    iv = ci(doc.get("top1_ci95"), 100, 1, "%")
    html_ = (f"<p>test top-1 <b>{pct(doc.get('top1', doc.get('test_top1')))}</b>"
             f"{f' (95% Wilson interval {iv})' if iv else ''} on n = {e(doc.get('n', '?'))} images</p>")
    pg = doc.get("per_group")
    if isinstance(pg, dict) and pg:
        rows = []
        for g, v in pg.items():
            acc = v.get("top1", v.get("acc")) if isinstance(v, dict) else v
            rows.append([str(g), pct(acc) if num(acc) is not None else fmt_value(v)])
        html_ += table(["class group", "top-1"], rows)
    return html_


def _sec_probe(doc: dict) -> str:
    out = []
    for site, res in probe_sites(doc).items():
        layers = res.get("layers") or []

        def col(key: str, i: int, fmt: Callable[[Any], str] = pct, res: dict = res) -> str:
            vals = res.get(key)
            return fmt(vals[i]) if isinstance(vals, list) and i < len(vals) else "n/a"

        def sel(v: Any) -> str:
            x = num(v)
            return pts(None if x is None else 100 * x, signed=True)
        rows = [[str(layer), col("row_acc", i), col("col_acc", i), col("row_control_acc", i), col("col_control_acc", i),
                 col("row_selectivity", i, sel), col("col_selectivity", i, sel)] for i, layer in enumerate(layers)]
        cb = dict_at(res, "content_baseline")
        out.append(f"<h4>site {e(site)}</h4><p>chance: row {pct(res.get('chance_row'))}, col "
                   f"{pct(res.get('chance_col'))}"
                   + (f"; content baseline (no positional input): row {pct(cb.get('row_acc'))}, "
                      f"col {pct(cb.get('col_acc'))}" if cb and num(cb.get("row_acc")) is not None else "")
                   + "</p>")
        out.append(table(["layer", "row acc", "col acc", "row control", "col control", "row selectivity",
                           "col selectivity"], rows))
    return "".join(out)


def ids(v: Any, n: int = 12) -> str:
    v = list(v or [])
    return f"{len(v)}" + (f" ({', '.join(map(str, v[:n]))}{', …' if len(v) > n else ''})" if v else "")


def _sec_sae(doc: dict) -> str:
    pairs = [("architecture",
              f"{doc.get('arch', '?')}, k = {doc.get('k', '?')}, expansion {doc.get('expansion', '?')}×"),
             ("trained on", f"layer {doc.get('layer', '?')} {doc.get('site', '')}"),
             ("fraction of variance unexplained (FVU)", fnum(doc.get("fvu"))),
             ("L0 (active latents per token)", fnum(doc.get("l0"), 1)),
             ("dead latents", pct(doc.get("dead_frac"))),
             ("top-1 with SAE reconstruction spliced in", pct(doc.get("top1_spliced"))),
             ("top-1 change from splicing", pts(doc.get("top1_change_points"), signed=True)),
             ("row features", ids(doc.get("row_features"))),
             ("column features", ids(doc.get("col_features"))),
             ("mixed features", ids(doc.get("mixed_features")))]
    c = doc.get("causal")
    if isinstance(c, dict):
        row, col = c.get("ablate_row") or {}, c.get("ablate_col") or {}
        pairs += [("causal: row-probe drop on removing row features",
                   f"{fnum(row.get('row_drop', row.get('skipped')))} {ci(row.get('row_drop_ci95'), digits=4)}"),
                  ("causal: col-probe drop on removing col features",
                   f"{fnum(col.get('col_drop', col.get('skipped')))} {ci(col.get('col_drop_ci95'), digits=4)}"),
                  ("causal selectivity of the row features Δrow / (|Δrow| + |Δcol|)",
                   f"{fnum(row.get('selectivity'), 2)} {ci(row.get('selectivity_ci95'), digits=2)}"),
                  ("causal selectivity of the col features Δcol / (|Δrow| + |Δcol|)",
                   f"{fnum(col.get('selectivity'), 2)} {ci(col.get('selectivity_ci95'), digits=2)}")]
        for kind, eff in (("row", row), ("col", col)):
            ctl = c.get(f"control_{kind}")
            if not isinstance(ctl, dict) or "top1_drop" not in eff and f"{kind}_drop" not in ctl:
                continue
            groups = "; ".join(f"{g}: {pts(v)}" for g, v in (eff.get("per_group_drop") or {}).items())
            pairs += [(f"removing the {kind} features: top-1 drop (per class group)",
                       f"{pts(eff.get('top1_drop'))} {ci(eff.get('top1_drop_ci95'), digits=1)}"
                       + (f" ({groups})" if groups else "")),
                      (f"matched random removal ({kind}): {kind}-probe drop, top-1 drop",
                       f"{fnum(ctl.get(f'{kind}_drop', ctl.get('skipped')))} "
                       f"{ci(ctl.get(f'{kind}_drop_ci95'), digits=4)}; {pts(ctl.get('top1_drop'))}"
                       + (f" — {ctl['note']}" if ctl.get("note") else "")),
                      (f"edit norm of the {kind} set vs its control",
                       f"{fnum(eff.get('edit_norm'), 3)} vs {fnum(ctl.get('edit_norm'), 3)}")]
    null = doc.get("eta2_null")
    if isinstance(null, dict):
        adm = "; ".join(f"{a.get('threshold')}: {a.get('row')} row / {a.get('col')} col / {a.get('mixed')} mixed"
                        for a in null.get("admitted") or [] if isinstance(a, dict))
        nt = null.get("null_thresholds") or {}
        pairs += [("η² null (positions shuffled within image): q99 row / col / pos",
                   f"{fnum(null.get('null_row_q'), 4)} / {fnum(null.get('null_col_q'), 4)} / "
                   f"{fnum(null.get('null_pos_q'), 4)}; the thresholds used lie "
                   f"{'above' if null.get('used_above_null') else 'NOT above'} the null"),
                  ("features admitted at the null-derived thresholds",
                   f"{nt.get('row')} row / {nt.get('col')} col / {nt.get('mixed')} mixed"),
                  ("features admitted per η² threshold", adm)]
    return kv_table(pairs + _sae_fidelity_pairs(doc)) + _sae_browser_link(doc)


def _sae_fidelity_pairs(doc: dict) -> list[tuple[str, str]]:
    """Fidelity beyond FVU / L0 / dead / splice (sae.json `fidelity`, `special_tokens`), when recorded."""
    pairs = []
    if doc.get("logit_kl") is not None:
        pairs.append(("logit KL(clean ‖ spliced), mean over images", fnum(doc.get("logit_kl"), 5)))
    fid = doc.get("fidelity")
    if isinstance(fid, dict):
        by = fid.get("dense_frac_by_threshold") or {}
        sens = ", ".join(f"{pct(v)} at {pct(num(t))}" for t, v in by.items()) if isinstance(by, dict) else ""
        pairs.append((f"dense latents (fire on > {pct(fid.get('dense_threshold'))} of held-out tokens)",
                      pct(fid.get("dense_frac")) + (f" ({sens})" if sens else "")))
        st = fid.get("stability")
        if isinstance(st, dict):
            pairs.append((f"seed stability: decoder directions of seed {st.get('seed')} matched one-to-one by seed "
                          f"{st.get('other_seed')} with cos ≥ {st.get('cos_threshold')}",
                          f"{pct(st.get('share_matched'))} (median matched cos {fnum(st.get('median_cos'), 2)}; the "
                          f"other seed's FVU {fnum(st.get('other_fvu'))})"))
    sp = doc.get("special_tokens")
    if isinstance(sp, dict):
        row = next((r for r in sp.get("layers") or [] if isinstance(r, dict) and r.get("layer") == doc.get("layer")),
                   None)
        if row is not None:
            prefix = ", ".join(f"{n} {fnum(r, 2)}×" for n, r in zip(sp.get("prefix") or [],
                                                                    row.get("prefix_norm_ratio") or [], strict=False))
            pairs.append(("prefix tokens (norm / median patch norm; never encoded)", prefix or "none"))
            pairs.append((f"high-norm outlier patch tokens (norm > {sp.get('k')}× median) at this layer",
                          f"{pct(row.get('outlier_share'))}, "
                          f"{'included in' if doc.get('include_special') else 'left out of'} training "
                          f"({doc.get('excluded_outlier_tokens', '?')} training tokens left out)"))
    return pairs


def _sae_browser_link(doc: dict) -> str:
    page = doc.get("browser")
    if not page:
        return ""
    from urllib.parse import quote

    return (f'<p>Latent browser (every latent: type, η² per axis, row × column map, top images with heatmaps): '
            f'<a href="{e(quote(str(page)))}">{e(page)}</a></p>')


def _sec_ape(doc: dict) -> str:
    counts = doc.get("feature_counts")
    fc: dict = counts if isinstance(counts, dict) else {}
    base_ci = ci(doc.get("baseline_top1_ci95"), 100, 1, "%")
    head = (f"<p>{e(doc.get('model', ''))} layer {e(doc.get('layer', '?'))} {e(doc.get('site', ''))} on "
            f"{e(doc.get('data', ''))}: {e(doc.get('n_images', '?'))} images, seeds {e(fmt_value(doc.get('seeds')))}; "
            f"baseline top-1 <b>{pct(doc.get('baseline_top1'))}</b>{e(' ' + base_ci if base_ci else '')}; positional "
            f"features: {e(fc.get('row', '?'))} row, {e(fc.get('col', '?'))} col, {e(fc.get('mixed', '?'))} mixed. "
            "Drops in top-1 points with their 95% paired-bootstrap interval over images (seeds pooled); C2 reads the "
            "all-positional set against its same-position cross-image swap (a null by construction); the matched "
            "random controls are reported beside it.</p>")
    given = doc.get("controls")
    controls: dict = given if isinstance(given, dict) else {}
    pairs = []
    for kept, ctrl in (controls or APE_CONTROLS).items():
        k, c = doc.get(kept), doc.get(ctrl)
        if not isinstance(k, dict) and not isinstance(c, dict):
            continue
        pairs.append([APE_SET_LABELS.get(kept, str(kept)), _nf(k), _drop_text(k) if _ran(k) else _why(k), str(ctrl),
                      _nf(c), _drop_text(c) if _ran(c) else _why(c), str((c or {}).get("note") or "")])
    out = head
    if pairs:
        out += "<h4>each permuted set beside its matched random control</h4>"
        out += table(["permuted set", "features", "drop [95% CI]", "control", "features", "control drop [95% CI]",
                      "note"], pairs)
    nulls = doc.get("nulls")
    if isinstance(nulls, dict) and nulls:
        nrows = []
        for v, of in nulls.items():
            x, k = doc.get(v), doc.get(of)
            nrows.append([str(of), _drop_text(k) if _ran(k) else _why(k), fnum((k or {}).get("edit_norm"), 3), str(v),
                          _drop_text(x) if _ran(x) else _why(x), fnum((x or {}).get("edit_norm"), 3),
                          str((x or {}).get("note") or "")])
        out += ("<h4>nulls by construction (C2 reads the same-position swap)</h4>"
                + table(["permuted set", "drop [95% CI]", "edit norm", "null", "null drop [95% CI]", "edit norm",
                         "note"], nrows))
    rows = []
    for v in variant_names(doc):
        x = doc.get(v)
        if not isinstance(x, dict):
            rows.append([str(v), "not run", "", "", "", ""])
            continue
        if "skipped" in x:
            rows.append([str(v), f"skipped: {x['skipped']}", "", "", "", ""])
            continue
        pg = dict_at(x, "per_group")
        groups = "; ".join(f"{g}: {pts((gv or {}).get('drop_points'))}" for g, gv in pg.items()) or "—"
        sd = num(x.get("top1_std"))
        t = num(x.get("top1"))
        top1 = f"{100 * t:.1f} ± {100 * sd:.1f}%" if t is not None and sd is not None else pct(t)
        nf = x.get("n_features")
        rows.append([str(v), top1, pts(x.get("drop_points"), x.get("drop_std")), ci(x.get("drop_ci95")) or "—",
                     "—" if nf is None else str(nf), groups])
    return out + "<h4>every variant</h4>" + table(["variant", "top-1", "drop (± std over seeds)", "drop 95% CI",
                                                    "features permuted", "drop per class group"], rows)


def _ran(x: Any) -> bool:
    return isinstance(x, dict) and "drop_points" in x


def _nf(x: Any) -> str:
    n = x.get("n_features") if isinstance(x, dict) else None
    return "—" if n is None else str(n)


def _why(x: Any) -> str:
    return f"skipped: {x['skipped']}" if isinstance(x, dict) and "skipped" in x else "not run"


def _sec_axis(doc: dict) -> str:
    conds = dict_at(doc, "conditions")
    base_top1 = num((conds.get("baseline") or {}).get("top1"))
    rows = []
    for name, c in conds.items():
        if not isinstance(c, dict):
            continue
        t = num(c.get("top1"))
        d = "—" if t is None or base_top1 is None or name == "baseline" else pts(100 * (t - base_top1), signed=True)
        rows.append([str(name), str(c.get("axis") or "—"),
                     "—" if c.get("restore_from") is None else str(c["restore_from"]),
                     pct(t), d, pct(last(c.get("row_acc"))), pct(last(c.get("row_acc_orig_probe"))),
                     pct(last(c.get("col_acc"))), pct(last(c.get("col_acc_orig_probe")))])
    out = (f"<p>{e(doc.get('model', ''))} on {e(doc.get('data', ''))}, probes at {e(doc.get('site', 'resid_post'))}; "
           f"chance row {pct(doc.get('chance_row'))}, col {pct(doc.get('chance_col'))}. Probe accuracies at the final "
           "layer: <i>retrained</i> = decodable at all, <i>orig. probe</i> = readable by the clean-model probe.</p>")
    out += table(["condition", "axis removed", "restore from", "top-1", "Δ top-1", "row (retrained)",
                   "row (orig. probe)", "col (retrained)", "col (orig. probe)"], rows)
    removal = dict_at(doc, "removal")
    rem_rows = []
    for c in ("no_row", "no_col"):
        rem = removal.get(c)
        if isinstance(rem, dict):
            own = c.removeprefix("no_")
            rem_rows.append([c, f"{pct(rem.get('removed'))} {ci(rem.get('removed_ci95'), 100, 1, '%')}".rstrip(),
                             f"{'col' if own == 'row' else 'row'}: "
                             f"{pct(rem.get('kept'))} {ci(rem.get('kept_ci95'), 100, 1, '%')}".rstrip()])
    if rem_rows:
        out += ("<p>C3: share of the baseline's above-chance decodability (mean over layers ≥ 5 points above chance "
                "of (P_cond − chance) / (P_base − chance), retrained probes) that removing an axis removes from "
                "that axis and keeps of the other; 95 % paired bootstrap over the probes' test images.</p>")
        out += table(["condition", "removed of its own axis", "kept of the other axis"], rem_rows)
    rec_rows = []
    for axis, per_r in (doc.get("recovery") or {}).items():
        for r, v in (per_r or {}).items():
            v = v or {}
            rec_rows.append([str(axis), str(r), _rec_text(v), fnum(last(v.get("rec")), 2)])
        med = dict_at(doc, "median_recovery").get(axis)
        if isinstance(med, dict):
            rec_rows.append([str(axis), "median over R (C4)", _rec_text(med, "median_rec"), "—"])
    if rec_rows:
        out += ("<p>Recovery Rec(ℓ) = (P_restore − P_off) / (P_clean − P_off); the study predicts 0 &lt; Rec &lt; 1. "
                "Intervals: 95 % paired bootstrap over the probes' test images.</p>")
        out += table(["axis", "restore from R", "mean Rec after R", "Rec at final layer"], rec_rows)
    out += _axis_calibrated(doc)
    return out


def _share_text(v: dict, key: str = "mean_share") -> str:
    return f"{fnum(v.get(key), 2)} {ci(v.get(key + '_ci95'), digits=2)}".rstrip()


def _axis_calibrated(doc: dict) -> str:
    """Issue 29's rope_axis additions: the count-matched rebuilt share (C4), the floored removal
    fractions and the MLP / relative-offset read-outs (C3); empty for results without them."""
    out = ""
    share_rows = []
    for axis, per_r in dict_at(doc, "count_matched").items():
        for r, v in (per_r or {}).items():
            v = v or {}
            gains = [g for g in v.get("clean_gain") or [] if g is not None]
            share_rows.append([str(axis), str(r), fnum(v.get("deficit"), 3), fnum(last(gains), 3), _share_text(v)])
        med = dict_at(doc, "median_rebuilt_share").get(axis)
        if isinstance(med, dict):
            share_rows.append([str(axis), "median over R (C4)", "—", "—", _share_text(med, "median_share")])
    if share_rows:
        out += ("<p>C4, count-matched: B(ℓ) = 1 − (P_clean(ℓ) − P_restore(ℓ)) / (P_clean(R−1) − P_off(R−1)), the share "
                "of the deficit at R that the restored layers close beyond what the same layers add in the clean model "
                "(its gain P_clean(ℓ) − P_clean(R−1)); 0 = the layers after R only do what they do anyway. 95 % paired "
                "bootstrap.</p>")
        out += table(["axis", "restore from R", "deficit at R−1", "clean gain by the last layer",
                      "mean rebuilt share after R"], share_rows)
    floored = dict_at(doc, "removal_floored")
    fl_rows = []
    for c in ("no_row", "no_col"):
        rem = floored.get(c)
        if isinstance(rem, dict):
            other = "col" if c == "no_row" else "row"
            kept = f"{pct(rem.get('kept'))} {ci(rem.get('kept_ci95'), 100, 1, '%')}".rstrip()
            fl_rows.append([c, f"{pct(rem.get('removed'))} {ci(rem.get('removed_ci95'), 100, 1, '%')}".rstrip(),
                            f"{other}: {kept}" + (" (interaction: above 100 %)" if rem.get("interaction") else "")])
    if fl_rows:
        floor = dict_at(doc, "content_floor")
        out += ("<p>C3 against each layer's content floor (the same model's no_both accuracy, at least chance; "
                f"row {', '.join(pct(f) for f in floor.get('row') or [])}; col "
                f"{', '.join(pct(f) for f in floor.get('col') or [])}).</p>")
        out += table(["condition", "removed of its own axis", "kept of the other axis"], fl_rows)
    ro = dict_at(doc, "readouts")
    acc = dict_at(ro, "accuracy")
    if acc:
        ch = dict_at(ro, "chance")
        rows = []
        for cond, by_layer in acc.items():
            for layer, kinds in (by_layer or {}).items():
                for kind, t in (kinds or {}).items():
                    rows.append([str(cond), str(layer), str(kind)] + [pct((t or {}).get(k))
                                                                        for k in ("row", "col", "drow", "dcol")])
        out += (f"<p>Read-outs beside the linear probes ({ro.get('n_images')} images, {ro.get('n_test_images')} "
                "of them held out): linear and MLP probes of absolute row / col and of the offsets Δrow / Δcol "
                "between two patch tokens of an image; chance "
                f"{', '.join(f'{k} {pct(v)}' for k, v in ch.items())}.</p>")
        out += table(["condition", "layer", "probe", "row", "col", "Δrow", "Δcol"], rows)
        rem_rows = []
        for c, kinds in dict_at(ro, "removal").items():
            for kind, v in (kinds or {}).items():
                v = v or {}
                rem_rows.append([str(c), str(kind)] + [f"{pct(v.get(k))} {ci(v.get(k + '_ci95'), 100, 1, '%')}".rstrip()
                                                       for k in ("removed", "kept", "removed_pair", "kept_pair")])
        out += table(["condition", "probe", "removed (own axis)", "kept (other axis)", "removed (own offset)",
                      "kept (other offset)"], rem_rows)
    return out


def _sec_heads(doc: dict) -> str:
    ph, lh = doc.get("primary_rebuilding_head"), doc.get("largest_drop_head")
    n = len(doc.get("layers") or []) * int(doc.get("num_heads") or 0)
    pairs = [("axis removed / restore from", f"{doc.get('axis', '?')} / {doc.get('restore_from', '?')}"),
             ("baseline top-1", f"{pct(doc.get('baseline_top1'))} {ci(doc.get('baseline_top1_ci95'), 100)}".rstrip()),
             ("primary rebuilding head", head_name(ph)),
             ("its rebuilding score", fnum(at(doc.get("rebuild_score"), doc, ph))),
             ("its axis index S (+1 row, −1 col)", f"{fnum(at(doc.get('axis_index'), doc, ph), 2)} "
                                                   f"{ci(at(doc.get('axis_index_ci95'), doc, ph), digits=2)}".rstrip()),
             ("top-1 drop when its rotations are ablated", _head_drop(doc, ph)),
             ("its drop rank (1 = largest)", f"{doc.get('primary_head_drop_rank', '?')} of {n}"),
             ("largest-drop head", f"{head_name(lh)}: {_head_drop(doc, lh)}"),
             ("closest rival (paired 95 % interval of the margin)", _closest_rival(doc))]
    per_head = doc.get("top1_images_per_head")
    if isinstance(per_head, list):  # adaptive top-1: say which drops rest on the screen only
        counts = [m for row in per_head if isinstance(row, list) for m in row]
        total = doc.get("n_top1_images")
        pairs.append(("top-1 images per head (adaptive top-1)",
                      f"every head on the first {doc.get('top1_screen_images', '?')}; "
                      f"{sum(m == total for m in counts)} of {len(counts)} heads still in the race on all {total} "
                      "(the others' drops and intervals rest on the screen)"))
    top = doc.get("top_heads")
    if isinstance(top, dict):
        frac = doc.get("top_heads_recovery_fraction") or {}
        for method, label in (("rebuild", "by fall in recovery, rotations removed"),
                              ("mean_ablate", "by fall in recovery, output mean-ablated"),
                              ("direct_effect", "by direct effect on the axis probes (output mean-ablated together)")):
            if method not in top:
                continue
            heads = ", ".join(head_name(lh) for lh in top.get(method) or []) or "n/a"
            pairs.append((f"top heads {label}", f"{heads} (together: {pct(frac.get(method))} of the recovery)"))
        agree = doc.get("top_heads_agreement") or {"rebuild~mean_ablate": doc.get("top_heads_overlap", "?")}
        k = len(top.get("rebuild") or [])
        for pair, count in agree.items():
            a, b = pair.split("~")
            pairs.append((f"heads in both top lists: {a} and {b}", f"{count} of {k}"))
    pairs += _heads_selection(doc)
    return kv_table(pairs) + _c5_ablations_table(doc)


def _c5_ablations_table(doc: dict) -> str:
    """C5 under each ablation of a head (rope_heads `c5_ablations`): the primary's drop and rank, the
    largest-drop head, the closest rival's paired margin and C5's outcome; the row the verdict rests on marked."""
    abl = doc.get("c5_ablations")
    if not isinstance(abl, dict) or not abl:
        return ""
    prim, rests = doc.get("primary_rebuilding_head"), doc.get("c5_rests_on")
    rows = []
    for name, a in abl.items():
        if not isinstance(a, dict):
            continue
        heads = [list(h) for h in a.get("heads") or []]
        drops, ivs = a.get("drop_points") or [], a.get("drop_ci95") or []

        def drop_of(lh: Any, heads=heads, drops=drops, ivs=ivs) -> str:
            i = heads.index(list(lh)) if isinstance(lh, list) and list(lh) in heads else None
            return "n/a" if i is None else f"{pts(drops[i])} {ci(ivs[i] if i < len(ivs) else None)}".rstrip()

        rival = closest_rival([a.get("margin_ci95") or []])
        big = a.get("largest_drop_head")
        rows.append([f"{name}{' (verdict)' if name == rests else ''}", str(a.get("description", "")),
                     str(len(heads)), drop_of(prim), f"{a.get('primary_drop_rank') or 'n/a'} of {len(heads)}",
                     f"{head_name(big)}: {drop_of(big)}",
                     "n/a" if rival is None else f"{head_name(heads[rival[0][1]])} {ci(rival[1])}",
                     str(a.get("outcome", "n/a"))])
    rule = doc.get("c5_ablation_heads_rule")
    return (f"<p>C5 under each ablation of one head (both axes; top-1 images, paired bootstrap): the identity row "
            f"is the sweep above; the others are measured on {e(rule or 'the heads listed')}. A constant shift is "
            "invisible between patches to a relative encoding (only the unrotated prefix tokens see it).</p>"
            + table(["ablation", "what", "heads", "primary's drop", "primary's rank", "largest drop",
                     "closest rival: drop(primary) − drop(rival)", "C5"], rows))


def _sweep_text(r: str, v: Any) -> str:
    v = v if isinstance(v, dict) else {}
    p = v.get("primary")
    share = (v.get("selection_frequency") or {}).get(f"L{p[0]}H{p[1]}") if isinstance(p, list) and len(p) == 2 else None
    return f"R={r}: {head_name(p)} ({pct(share)} of resamples)"


def _heads_selection(doc: dict) -> list[tuple[str, str]]:
    """Issue 29's rope_heads additions: how stable the primary choice is, S where the head rebuilds
    with its null threshold, and the share of the recovery it explains; none for older results."""
    pairs: list[tuple[str, str]] = []
    freq = doc.get("selection_frequency")
    if isinstance(freq, dict):
        pairs.append(("primary chosen over image resamples (bootstrap)",
                      ", ".join(f"{k} {pct(v)}" for k, v in sorted(freq.items(), key=lambda kv: -kv[1]))))
    sweep = doc.get("restore_sweep")
    if isinstance(sweep, dict):
        pairs.append(("primary at each restore point R", "; ".join(_sweep_text(r, v) for r, v in sweep.items())))
    if doc.get("axis_index_null_threshold") is not None:
        ph = doc.get("primary_rebuilding_head")
        pairs.append(("axis it rebuilds (larger fall in Rec)", str(doc.get("primary_axis") or "n/a")))
        pairs.append(("its S in the restore condition, signed to that axis",
                      f"{fnum(doc.get('primary_axis_index_matched'), 2)} "
                      f"{ci(doc.get('primary_axis_index_matched_ci95'), digits=2)}".rstrip()
                      + f" (restore S {fnum(at(doc.get('axis_index_restore'), doc, ph), 2)})"))
        q = doc.get("axis_index_null_quantiles") or {}
        pairs.append(("|S| null (relabelled rotary pairs): threshold at 0.95",
                      f"{fnum(doc.get('axis_index_null_threshold'), 3)} over {doc.get('axis_index_null_n')} draws; "
                      + ", ".join(f"q{k} {fnum(v, 2)}" for k, v in q.items())))
        pairs.append(("share of the recovery the primary explains",
                      f"{pct(doc.get('primary_recovery_share'))} "
                      f"{ci(doc.get('primary_recovery_share_ci95'), 100, 1, '%')}".rstrip()))
        tk = doc.get("top_heads_recovery_fraction_ci95") or {}
        frac = doc.get("top_heads_recovery_fraction") or {}
        pairs.append(("top heads' joint share (rotations removed)",
                      f"{pct(frac.get('rebuild'))} {ci(tk.get('rebuild'), 100, 1, '%')}".rstrip()))
    return pairs


def _sec_prefix(doc: dict) -> str:
    conds = dict_at(doc, "conditions")
    base_top1 = num((conds.get("baseline") or {}).get("top1"))
    rows = []
    for name, c in conds.items():
        if not isinstance(c, dict):
            continue
        t = num(c.get("top1"))
        d = "—" if t is None or base_top1 is None or name == "baseline" else pts(100 * (t - base_top1), signed=True)
        blocked = c.get("prefix_blocked_from")
        rows.append([str(name), str(c.get("axis") or "—"),
                     "—" if c.get("restore_from") is None else str(c["restore_from"]),
                     "—" if blocked is None else f"≥ {blocked}", pct(t), d, pct(last(c.get("row_acc"))),
                     pct(last(c.get("col_acc"))), pct(last(c.get("row_acc_orig_probe"))),
                     pct(last(c.get("col_acc_orig_probe")))])
    mass = ", ".join(f"L{i}: {pct(v)}" for i, v in enumerate(doc.get("prefix_attention") or []))
    out = (f"<p>{e(doc.get('model', ''))} on {e(doc.get('data', ''))}, {e(doc.get('n_images', '?'))} images, probes "
           f"at {e(doc.get('site', 'resid_post'))}; chance row {pct(doc.get('chance_row'))}, col "
           f"{pct(doc.get('chance_col'))}. Blocking: every patch query's attention to the "
           f"{e(doc.get('num_prefix_tokens', '?'))} prefix token(s) is set to 0 and renormalised over the patch keys; "
           "prefix queries keep attending everywhere. Clean attention mass of patch queries on the prefix, per layer "
           f"({e(doc.get('attn_images', '?'))} images): {e(mass or 'n/a')}. Probe accuracies at the final layer: "
           "<i>retrained</i> = decodable at all, <i>orig. probe</i> = readable by the clean-model probe.</p>")
    out += table(["condition", "axis removed", "restore from", "prefix blocked in layers", "top-1", "Δ top-1",
                   "row (retrained)", "col (retrained)", "row (orig. probe)", "col (orig. probe)"], rows)
    rec_rows = []
    for axis, v in (doc.get("recovery") or {}).items():
        v = v or {}
        op, bl = num((v.get("open") or {}).get("mean_rec")), num((v.get("blocked") or {}).get("mean_rec"))
        rec_rows.append([str(axis), str(doc.get("restore_from", "?")), fnum(op, 2), fnum(bl, 2),
                         "n/a" if op is None or bl is None else fnum(op - bl, 2)])
    if rec_rows:
        out += ("<p>Recovery after R, Rec(ℓ) = (P_restore − P_off) / (P_clean − P_off) with the clean model and "
                "the axis removed everywhere as references in both columns: what blocking the prefix from R takes "
                "away is the share of the rebuilding that goes through the prefix tokens.</p>")
        out += table(["axis", "restore from R", "mean Rec, prefix open", "mean Rec, prefix blocked from R",
                       "open − blocked"], rec_rows)
    return out


def _pts_ci(v: Any, iv: Any) -> str:
    """A drop in points with its 95 % interval (points)."""
    return "n/a" if num(v) is None else f"{pts(v, signed=True)} {ci(iv)}".rstrip()


def _sec_freq(doc: dict) -> str:
    conds = dict_at(doc, "conditions")
    layers = doc.get("layers") or []
    bands = []
    for axis, rows in dict_at(doc, "band_info").items():
        for b in rows or []:
            if isinstance(b, dict):
                bands.append([str(axis), str(b.get("name")), str(b.get("pairs")),
                              f"{fnum(b.get('freq_min'), 3)} – {fnum(b.get('freq_max'), 3)}"])
    out = (f"<p>{e(doc.get('model', ''))} ({e(doc.get('rope_kind', '?'))} RoPE) on {e(doc.get('data', ''))}, "
           f"{e(doc.get('n_images', '?'))} images ({e(doc.get('n_probe_test_images', '?'))} probe test images), "
           f"retrained probes at {e(doc.get('site', 'resid_post'))} of layers {e(', '.join(map(str, layers)))}; "
           f"chance row {pct(doc.get('chance_row'))}, col {pct(doc.get('chance_col'))}. Each axis' rotary pairs are "
           f"ranked by their frequency along it (radians per patch, folded into [0, π]; per layer and head for "
           f"mixed RoPE) and cut into {e(doc.get('bands', '?'))} equal-rank bands; a condition removes one axis in "
           "one band (or all: the axis) in one window of layers. Drops are clean minus condition, with 95 % paired "
           "bootstrap intervals (probe test images; top-1 images); share = the band's drop / the whole axis' drop in "
           "the same window.</p>")
    out += table(["axis", "band", "pairs per head", "frequency range (rad/patch)"], bands)
    rows = []
    for name, c in conds.items():
        if not isinstance(c, dict) or c.get("axis") is None:
            continue
        w = c.get("window") or []
        drops, cis, share = c.get("axis_drop_points") or [], c.get("axis_drop_ci95") or [], c.get("share") or []
        rows.append([str(name), str(c.get("axis")), str(c.get("band")),
                     f"{w[0]}–{w[1] - 1}" if len(w) == 2 else "?",
                     _pts_ci(last(drops), last(cis)), fnum(last(share), 2),
                     _pts_ci(c.get("top1_drop_points"), c.get("top1_drop_ci95"))])
    base = conds.get("baseline") or {}
    out += (f"<p>Clean: top-1 {pct(base.get('top1'))} {ci(base.get('top1_ci95'), 100)}, row probe "
            f"{pct(last(base.get('row_acc')))}, col probe {pct(last(base.get('col_acc')))} at layer "
            f"{e(last(layers))}.</p>")
    out += table(["condition", "axis", "band", "layers", f"fall of that axis' probe at layer {last(layers)}",
                  "share of the axis' fall", "top-1 drop"], rows)
    split_rows = []
    for sp in doc.get("splits") or []:
        if isinstance(sp, dict):
            w = sp.get("window") or []
            diffs = [_pts_ci(sp.get(f"high_minus_low_{k}_drop_points"), sp.get(f"high_minus_low_{k}_drop_ci95"))
                     for k in ("axis", "top1")]
            split_rows.append([str(sp.get("axis")), f"{w[0]}–{w[1] - 1}" if len(w) == 2 else "?", *diffs,
                               str(sp.get("position_in"))])
    if split_rows:
        out += ("<p>High band vs low band (Barbero et al.: in language models high frequencies carry position, low "
                "ones semantics): positive = removing the high band costs more.</p>")
        out += table(["axis", "layers", "Δ axis probe fall (high − low)", "Δ top-1 drop (high − low)",
                      "position carried by"], split_rows)
    return out


def _sec_extrapolate(doc: dict) -> str:
    rows = []
    for sz in doc.get("sizes") or []:
        if not isinstance(sz, dict):
            continue
        px, g = sz.get("img_size") or ["?"], sz.get("grid") or ["?", "?"]
        data_px = sz.get("data_px")
        top1 = "refused" if sz.get("top1") is None else f"{pct(sz.get('top1'))} {ci(sz.get('top1_ci'), 100, 1, '%')}"
        rows.append([f"{px[0]} px", f"{g[0]}×{g[1]}", "resized" if data_px is None else f"generated {data_px} px",
                     top1, pct(last(sz.get("row_acc"))), pct(last(sz.get("col_acc"))),
                     ", ".join(fnum(v, 2) for v in sz.get("row_skill") or []),
                     ", ".join(fnum(v, 2) for v in sz.get("col_skill") or [])])
    how = []
    if doc.get("ape"):
        how.append(f"APE {e(doc['ape'])}")
    if doc.get("rope_grid") == "extended":
        how.append("RoPE tables rebuilt with the trained grid step: the added rows / columns turn by unseen angles")
    elif doc.get("rope_grid") == "rescaled":
        how.append("RoPE tables rebuilt with the larger grid mapped onto the trained range (rescaled coordinates)")
    refused = doc.get("top1_refused")
    out = (f"<p>{e(doc.get('model', ''))} ({e(doc.get('scheme', '?'))}) on {e(doc.get('data', ''))}, "
           f"{e(doc.get('n_images', '?'))} images per size, probes at {e(doc.get('site', 'resid_post'))} retrained at "
           f"each size (as many classes as the grid has rows / columns). {'; '.join(how) or 'No positional encoding'}."
           " Skill = (acc − chance) / (1 − chance) per layer: 1 = every patch placed, 0 = chance."
           + (f" Top-1 refused: {e(refused)}" if refused else "") + "</p>")
    return out + table(["input", "grid", "data", "top-1 [95% CI]", "row acc (last layer)", "col acc (last layer)",
                        "row skill per layer", "col skill per layer"], rows)


SECTIONS: dict[str, Callable[[dict], str]] = {  # experiment name -> its section body
    "eval": _sec_eval, "probe": _sec_probe, "sae": _sec_sae, "ape_permute": _sec_ape,
    "rope_axis": _sec_axis, "rope_heads": _sec_heads, "rope_prefix": _sec_prefix, "rope_freq": _sec_freq,
    "extrapolate": _sec_extrapolate,
}
RENDER_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, VitposError)


def model_section(spec: str, entry: ModelEntry, figures: dict[str, Path], used: set[str]) -> str:
    """One model's section: per experiment (registry order) its declared figures, then its table."""
    m = entry.to_json()
    d = describe(m)
    slug = model_slug(spec)
    info = ", ".join(f"{k} {fmt_value(d[k])}" for k in ("scheme", "grid", "depth", "num_heads", "width")
                     if k in d)
    out = [f'<section id="model-{e(slug)}"><h2>{e(spec)}</h2><p>data: <code>{e(m.get("data"))}</code>; {e(info)}</p>']
    for exp in EXPERIMENTS:
        out.append(f'<section class="exp"><h3>{e(exp.title)}</h3>')
        result = entry.results.get(exp.name)
        doc = doc_of(m, exp.name)
        if doc is None or not isinstance(result, Result):
            out.append(na(reason(m, exp.name)))
        else:
            for fig in exp.figures(result):
                key = figure_key(spec, fig.name)
                if key in figures:
                    used.add(key)
                    out.append(img(figures[key], f"{spec}: {fig.caption}"))
            try:
                own = exp.section(result)  # the experiment's own section, else the report's renderer for it
                out.append(own if own is not None else SECTIONS[exp.name](doc))
            except RENDER_ERRORS as err:
                out.append(f'<p class="na">could not render {e(exp.name)}: {e(type(err).__name__)}: {e(err)}</p>')
        out.append("</section>")
    out.append("</section>")
    return "".join(out)
