"""Per-experiment pieces of the report: a one-line summary (headline contrast cells) and a section.

Rendered from the typed results (`vitpos.experiments.*`), so pyright checks every field a section
reads. A measurement a result lacks (an optional field that is None, a `Skipped` result or variant)
renders as a one-line reason; anything else that goes wrong raises (the report is never silently
half-empty)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from vitpos.claims.c1 import CLAIM as C1
from vitpos.claims.c2 import CLAIM as C2
from vitpos.claims.layers import over_plausible, plausible_layers
from vitpos.errors import VitposError
from vitpos.experiments.registry import EXPERIMENTS
from vitpos.report.format import ci, e, fmt_value, fnum, kv_table, last, na, num, pct, pts, table
from vitpos.results.ape_permute import CONTROLS as APE_CONTROLS
from vitpos.results.ape_permute import ApePermuteResult, Outcome, VariantResult
from vitpos.results.base import Result, Skipped
from vitpos.results.common import ProbedCondition, Recovery
from vitpos.results.evaluation import EvalResult
from vitpos.results.extrapolate import ExtrapolateResult
from vitpos.results.probe import MultiSiteProbeResult, ProbeSiteResult, probe_sites
from vitpos.results.rope_axis import AxisRemoval, MedianRecovery, RopeAxisResult
from vitpos.results.rope_freq import RopeFreqResult
from vitpos.results.rope_heads import RopeHeadsResult, closest_rival
from vitpos.results.rope_prefix import RopePrefixResult
from vitpos.results.sae_layers import PLAUSIBLE, LayerPoint, SAELayersResult
from vitpos.results.sae_run import AblationEffect, RemovalControl, SAEResult
from vitpos.sae.special import OUTLIER_K
from vitpos.study.results import ModelEntry, figure_key, model_slug

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T = TypeVar("T")
R = TypeVar("R", bound=Result)


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


# ---------------------------------------------------------------- small typed readers
def _axis_acc(c: ProbedCondition | None, axis: str, orig: bool = False) -> float | None:
    """A condition's final-layer probe accuracy for one axis (retrained, or the clean model's probe)."""
    if c is None:
        return None
    if orig:
        return last(c.row_acc_orig_probe if axis == "row" else c.col_acc_orig_probe)
    return last(c.row_acc if axis == "row" else c.col_acc)


def at(grid: Sequence[Sequence[T]] | None, layers: Sequence[int], lh: Sequence[int] | None) -> T | None:
    """grid[layer][head] for a [layer, head] pair (layer = a value of `layers`); None where absent."""
    if grid is None or lh is None or len(lh) != 2 or lh[0] not in layers:
        return None
    i, h = layers.index(lh[0]), int(lh[1])
    row = grid[i] if i < len(grid) else None
    return row[h] if row is not None and 0 <= h < len(row) else None


def head_name(lh: Sequence[int] | None) -> str:
    return f"L{lh[0]} h{lh[1]}" if lh is not None and len(lh) == 2 else "n/a"


def ids(v: Sequence[int] | None, n: int = 12) -> str:
    v = list(v or [])
    return f"{len(v)}" + (f" ({', '.join(map(str, v[:n]))}{', …' if len(v) > n else ''})" if v else "")


# ---------------------------------------------------------------- one-line summaries (headline contrast cells)
def _effect(x: AblationEffect | Skipped | None) -> AblationEffect | None:
    return x if isinstance(x, AblationEffect) else None


def _summary_sae(r: SAEResult) -> str:
    s = (f"{len(r.row_features)} row / {len(r.col_features)} col / {len(r.mixed_features)} mixed features at "
         f"layer {r.layer} (FVU {fnum(r.fvu)})")
    if r.causal is None:
        return s
    parts = []
    for axis, other, features, effect in (("row", "col", r.row_features, r.causal.ablate_row),
                                          ("col", "row", r.col_features, r.causal.ablate_col)):
        e_ = _effect(effect)
        if e_ is None:
            why = effect.skipped if isinstance(effect, Skipped) else "not measured"
            parts.append(f"no {axis} features to remove" if not features else f"removing the {axis} features: {why}")
            continue
        own, cross = (e_.row_drop, e_.col_drop) if axis == "row" else (e_.col_drop, e_.row_drop)
        sel = f"{fnum(e_.selectivity, 2)} {ci(e_.selectivity_ci95, digits=2)}".rstrip()
        parts.append(f"removing the {axis} features: Δ {axis}-probe acc {fnum(own)}, Δ {other}-probe acc "
                     f"{fnum(cross)} (selectivity {sel})")
    return s + "; " + "; ".join(parts)


APE_SET_LABELS = {"all_positional": "all positional (row+col+mixed)", "all": "row+col", "row_only": "row only",
                  "col_only": "col only"}


def _drop_text(x: Outcome | None) -> str:
    if not isinstance(x, VariantResult):
        return "n/a"
    return f"{pts(x.drop_points)} {ci(x.drop_ci95)}".rstrip()


def _summary_ape(r: ApePermuteResult) -> str:
    parts = []
    controls = r.controls if r.controls is not None else {"all": "random_features"}
    for v, label in APE_SET_LABELS.items():
        x = r.outcome(v)
        if isinstance(x, VariantResult):
            c = controls.get(v)
            parts.append(f"{label} {_drop_text(x)}" + (f" (control {_drop_text(r.outcome(c))})" if c else ""))
    return f"baseline top-1 {pct(r.baseline_top1)}; drop when permuting " + (", ".join(parts) or "n/a")


def _rec_text(v: Recovery) -> str:
    """A mean recovery with its paired interval, where measured."""
    return f"{fnum(v.mean_rec, 2)} {ci(v.mean_rec_ci95, digits=2)}".rstrip()


def _median_rec_text(v: MedianRecovery) -> str:
    return f"{fnum(v.median_rec, 2)} {ci(v.median_rec_ci95, digits=2)}".rstrip()


def _summary_axis(r: RopeAxisResult, claim: str) -> str:
    conds = r.conditions
    base = conds.get("baseline")
    if claim == "C4":
        parts = []
        medians = r.median_recovery or {}
        for axis in ("row", "col"):
            per_r = r.recovery.get(axis) or {}
            recs = ", ".join(f"R={k}: {_rec_text(v)}" for k, v in per_r.items())
            if recs:
                med = medians.get(axis)
                parts.append(f"mean {axis} Rec {recs}" + (f" (median over R {_median_rec_text(med)})"
                                                          if med is not None and len(per_r) > 1 else ""))
        return "; ".join(parts) or "no recovery data"
    parts = []
    removal = r.removal or {}
    for c in ("no_row", "no_col"):
        x = conds.get(c)
        if x is not None:
            parts.append(f"{c}: final-layer row {pct(_axis_acc(x, 'row'))} (clean "
                         f"{pct(_axis_acc(base, 'row'))}), col {pct(_axis_acc(x, 'col'))} (clean "
                         f"{pct(_axis_acc(base, 'col'))})" + _removal_text(c, removal.get(c)))
    return "; ".join(parts) or "no conditions"


def _removal_text(cond: str, rem: AxisRemoval | None) -> str:
    """C3's fractions of one no_<axis> condition with their intervals ("" in results without them)."""
    if rem is None:
        return ""
    own = cond.removeprefix("no_")
    other = "col" if own == "row" else "row"
    return (f", {pct(rem.removed)} {ci(rem.removed_ci95, 100, 1, '%')} of above-chance {own} "
            f"decodability removed, {pct(rem.kept)} {ci(rem.kept_ci95, 100, 1, '%')} of {other} "
            "kept").replace("  ", " ")


def _summary_heads(r: RopeHeadsResult) -> str:
    ph, lh = r.primary_rebuilding_head, r.largest_drop_head
    n = len(r.layers) * r.num_heads
    return (f"primary rebuilding head {head_name(ph)}: drop {_head_drop(r, ph)}, "
            f"rank {fnum(r.primary_head_drop_rank)} of {n}; largest drop {head_name(lh)}: {_head_drop(r, lh)}")


def _head_drop(r: RopeHeadsResult, lh: Sequence[int] | None) -> str:
    """A head's top-1 drop with its interval, where measured."""
    return f"{pts(at(r.drop_points, r.layers, lh))} {ci(at(r.drop_ci95, r.layers, lh))}".rstrip()


def _closest_rival(r: RopeHeadsResult) -> str:
    """The head whose paired margin against the primary has the lowest lower end, and that margin."""
    rival = closest_rival(r.primary_margin_ci95)
    if rival is None:
        return "n/a"
    lh, m = rival
    return f"{head_name(lh)}: drop(primary) − drop({head_name(lh)}) {ci(m)} pts"


def summary_line(result: Result, claim: str) -> str:
    """One line of a result's headline numbers for `claim` ("" for results without one)."""
    if isinstance(result, SAEResult):
        return _summary_sae(result)
    if isinstance(result, ApePermuteResult):
        return _summary_ape(result)
    if isinstance(result, RopeAxisResult):
        return _summary_axis(result, claim)
    if isinstance(result, RopeHeadsResult):
        return _summary_heads(result)
    return ""


# ---------------------------------------------------------------- the models table
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


# ---------------------------------------------------------------- sections, one per experiment
def _sec_eval(r: EvalResult) -> str:
    iv = ci(r.top1_ci95, 100, 1, "%")
    html_ = (f"<p>test top-1 <b>{pct(r.top1)}</b>{f' (95% Wilson interval {iv})' if iv else ''} on n = {e(r.n)} "
             "images</p>")
    if r.per_group:
        html_ += table(["class group", "top-1"], [[str(g), pct(acc)] for g, acc in r.per_group.items()])
    return html_


def _sec_probe(r: ProbeSiteResult | MultiSiteProbeResult) -> str:
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


def _probe_body(r: Result) -> str:
    if not isinstance(r, (ProbeSiteResult, MultiSiteProbeResult)):
        raise VitposError(f"the probe section got a {type(r).__name__}")
    return _sec_probe(r)


def _sec_sae(r: SAEResult) -> str:
    pairs = [("architecture", f"{r.arch}, k = {r.k}, expansion {r.expansion}×"),
             ("trained on", f"layer {r.layer} {r.site}, {r.data} images"),
             ("fraction of variance unexplained (FVU)", fnum(r.fvu)),
             ("L0 (active latents per token)", fnum(r.l0, 1)),
             ("dead latents", pct(r.dead_frac)),
             ("top-1 with SAE reconstruction spliced in", pct(r.top1_spliced)),
             ("top-1 change from splicing", pts(r.top1_change_points, signed=True)),
             ("row features", ids(r.row_features)),
             ("column features", ids(r.col_features)),
             ("mixed features", ids(r.mixed_features))]
    c = r.causal
    if c is not None:
        row, col = _effect(c.ablate_row), _effect(c.ablate_col)
        pairs += [("causal check read", f"{c.data or r.data} held-out images"
                   + (" (labelled; the SAE's own have no labels)" if c.data not in (None, r.data) else "")),
                  ("causal: row-probe drop on removing row features",
                   f"{fnum(row and row.row_drop)} {ci(row and row.row_drop_ci95, digits=4)}"),
                  ("causal: col-probe drop on removing col features",
                   f"{fnum(col and col.col_drop)} {ci(col and col.col_drop_ci95, digits=4)}"),
                  ("causal selectivity of the row features Δrow / (|Δrow| + |Δcol|)",
                   f"{fnum(row and row.selectivity, 2)} {ci(row and row.selectivity_ci95, digits=2)}"),
                  ("causal selectivity of the col features Δcol / (|Δrow| + |Δcol|)",
                   f"{fnum(col and col.selectivity, 2)} {ci(col and col.selectivity_ci95, digits=2)}")]
        for kind, eff in (("row", row), ("col", col)):
            ctl = c.control_row if kind == "row" else c.control_col
            if ctl is not None:
                pairs += _removal_pairs(kind, eff, ctl)
    null = r.eta2_null
    if null is not None:
        adm = "; ".join(f"{a.threshold}: {a.row} row / {a.col} col / {a.mixed} mixed" for a in null.admitted)
        nt = null.null_thresholds
        pairs += [("η² null (positions shuffled within image): q99 row / col / pos",
                   f"{fnum(null.null_row_q, 4)} / {fnum(null.null_col_q, 4)} / "
                   f"{fnum(null.null_pos_q, 4)}; the thresholds used lie "
                   f"{'above' if null.used_above_null else 'NOT above'} the null"),
                  ("features admitted at the null-derived thresholds",
                   f"{nt.row} row / {nt.col} col / {nt.mixed} mixed"),
                  ("features admitted per η² threshold", adm)]
    return kv_table(pairs + _sae_fidelity_pairs(r)) + _sae_grid(r) + _sae_browser_link(r)


def _sae_grid(r: SAEResult) -> str:
    """The sae stage's seeds x dictionary sizes (`sae.seeds`, `sae.expansions`): every SAE's fit and
    positional-feature counts, and each same-size seed pair's decoder matching (whole dictionary and
    the positional sets), so a reader sees whether the features C1 / C2 read recur across seeds."""
    g = r.sweep
    if g is None:
        return ""
    runs = [[f"{x.seed}{' *' if x.main else ''}", f"×{x.expansion} ({x.d_sae})", fnum(x.fvu), fnum(x.l0, 1),
             pct(x.dead_frac), f"{x.n_row_features} / {x.n_col_features} / {x.n_mixed_features}"] for x in g.runs]
    cos = sorted({t for m in g.stability for t in m.stable_frac}, key=float)
    pairs = [[f"{m.seeds[0]} vs {m.seeds[1]}", str(m.d_sae), fnum(m.mean_cos, 2), fnum(m.median_cos, 2),
              *(pct(m.stable_frac.get(t)) for t in cos), pct(m.row_agreement), pct(m.col_agreement)]
             for m in g.stability]
    out = (f"<h4>seeds × dictionary sizes</h4><p>Every SAE of the grid trains on the same tokens with the same "
           f"settings but its seed and size, and is scored on the same {e(g.eval_images)} held-out images; C1 and "
           "C2 read the starred one. Seed pairs of one size are matched one-to-one by decoder direction (Hungarian "
           "on cosine); a latent is stable when its match reaches the cosine (each threshold shown); a positional "
           "set agrees when a row (col) latent's match is a row (col) latent of the other seed.</p>")
    out += table(["seed", "size (latents)", "FVU", "L0", "dead", "row / col / mixed"], runs)
    if pairs:
        out += table(["seeds", "latents", "mean cos", "median cos", *(f"stable at cos ≥ {t}" for t in cos),
                      "row latents matched to a row latent", "col latents matched to a col latent"], pairs)
    return out


def _own_drop(x: AblationEffect, kind: str) -> tuple[float, list[float] | None]:
    """The drop of the probe of the removed set's own axis, with its interval."""
    return (x.row_drop, x.row_drop_ci95) if kind == "row" else (x.col_drop, x.col_drop_ci95)


def _removal_pairs(kind: str, eff: AblationEffect | None, ctl: RemovalControl | Skipped) -> list[tuple[str, str]]:
    """The top-1 read-out of removing one feature set beside its matched random removal (issue 28)."""
    control = ctl if isinstance(ctl, RemovalControl) else None
    if (eff is None or eff.top1_drop is None) and control is None:
        return []  # written before the top-1 read-out existed
    groups = "; ".join(f"{g}: {pts(v)}" for g, v in ((eff and eff.per_group_drop) or {}).items())
    own, own_ci = _own_drop(control, kind) if control is not None else (None, None)
    return [(f"removing the {kind} features: top-1 drop (per class group)",
             f"{pts(eff and eff.top1_drop)} {ci(eff and eff.top1_drop_ci95, digits=1)}"
             + (f" ({groups})" if groups else "")),
            (f"matched random removal ({kind}): {kind}-probe drop, top-1 drop",
             f"{fnum(own)} {ci(own_ci, digits=4)}; {pts(control and control.top1_drop)}"
             + (f" — {control.note}" if control is not None and control.note else "")),
            (f"edit norm of the {kind} set vs its control",
             f"{fnum(eff and eff.edit_norm, 3)} vs {fnum(control and control.edit_norm, 3)}")]


def _sae_fidelity_pairs(r: SAEResult) -> list[tuple[str, str]]:
    """Fidelity beyond FVU / L0 / dead / splice (`fidelity`, `special_tokens`), when recorded."""
    pairs = []
    if r.logit_kl is not None:
        pairs.append(("logit KL(clean ‖ spliced), mean over images", fnum(r.logit_kl, 5)))
    fid = r.fidelity
    if fid is not None:
        sens = ", ".join(f"{pct(v)} at {pct(num(t))}" for t, v in fid.dense_frac_by_threshold.items())
        pairs.append((f"dense latents (fire on > {pct(fid.dense_threshold)} of held-out tokens)",
                      pct(fid.dense_frac) + (f" ({sens})" if sens else "")))
        st = fid.stability
        if st is not None:
            pairs.append((f"seed stability: decoder directions of seed {st.seed} matched one-to-one by seed "
                          f"{st.other_seed} with cos ≥ {st.cos_threshold}",
                          f"{pct(st.share_matched)} (median matched cos {fnum(st.median_cos, 2)}; the "
                          f"other seed's FVU {fnum(st.other_fvu)})"))
    sp = r.special_tokens
    if sp is not None:
        row = next((x for x in sp.layers if x.layer == r.layer), None)
        if row is not None:
            prefix = ", ".join(f"{n} {fnum(v, 2)}×" for n, v in zip(sp.prefix, row.prefix_norm_ratio, strict=False))
            pairs.append(("prefix tokens (norm / median patch norm; never encoded)", prefix or "none"))
            by_k = ", ".join(f"{num(k):g}×: {pct(v)}" for k, v in (row.outlier_share_by_k or {}).items()
                             if num(k) is not None and num(k) != sp.k)
            pairs.append((f"held-out patch tokens with norm > {sp.k:g}× median at this layer",
                          pct(row.outlier_share) + (f" ({by_k})" if by_k else "")))
            pairs.append(("training's high-norm rule", _training_rule(r)))
    return pairs


def _training_rule(r: SAEResult) -> str:
    """Which patch tokens the SAE's training left out, by its own factor (the held-out statistics
    above are at the report's factor, which may differ: DINOv2's config trains at 4x)."""
    t = r.training
    factor = t.high_norm_factor if t is not None and t.high_norm_factor is not None else OUTLIER_K
    rule = f"norm > {factor:g}× the median training-token norm (> {fnum(r.outlier_threshold, 3)})"
    if r.include_special:
        return f"none left out (include_special): tokens with {rule} trained on"
    return f"tokens with {rule} left out: {r.excluded_outlier_tokens} per epoch"


def _sae_browser_link(r: SAEResult) -> str:
    if not r.browser:
        return ""
    from urllib.parse import quote

    return (f'<p>Latent browser (every latent: type, η² per axis, row × column map, top images with heatmaps): '
            f'<a href="{e(quote(r.browser))}">{e(r.browser)}</a></p>')


def _sec_ape(r: ApePermuteResult) -> str:
    fc = r.feature_counts
    base_ci = ci(r.baseline_top1_ci95, 100, 1, "%")
    head = (f"<p>{e(r.model)} layer {e(r.layer)} {e(r.site)} on {e(r.data)}: {e(r.n_images)} images, seeds "
            f"{e(fmt_value(r.seeds))}; baseline top-1 <b>{pct(r.baseline_top1)}</b>"
            f"{e(' ' + base_ci if base_ci else '')}; "
            f"positional features: {e(fc.get('row', '?'))} row, {e(fc.get('col', '?'))} col, "
            f"{e(fc.get('mixed', '?'))} mixed. Drops in top-1 points with their 95% paired-bootstrap interval over "
            "images (seeds pooled); C2 reads the all-positional set against its same-position cross-image swap (a "
            "null by construction); the matched random controls are reported beside it.</p>")
    pairs = []
    for kept, ctrl in (r.controls or APE_CONTROLS).items():
        k, c = r.outcome(kept), r.outcome(ctrl)
        if k is None and c is None:
            continue
        pairs.append([APE_SET_LABELS.get(kept, str(kept)), _nf(k), _drop_or_why(k), str(ctrl), _nf(c),
                      _drop_or_why(c), _note(c)])
    out = head
    if pairs:
        out += "<h4>each permuted set beside its matched random control</h4>"
        out += table(["permuted set", "features", "drop [95% CI]", "control", "features", "control drop [95% CI]",
                      "note"], pairs)
    if r.nulls:
        nrows = []
        for v, of in r.nulls.items():
            x, k = r.outcome(v), r.outcome(of)
            nrows.append([str(of), _drop_or_why(k), fnum(_edit_norm(k), 3), str(v), _drop_or_why(x),
                          fnum(_edit_norm(x), 3), _note(x)])
        out += ("<h4>nulls by construction (C2 reads the same-position swap)</h4>"
                + table(["permuted set", "drop [95% CI]", "edit norm", "null", "null drop [95% CI]", "edit norm",
                         "note"], nrows))
    rows = []
    for v in r.variant_names():
        x = r.outcome(v)
        if x is None:
            rows.append([str(v), "not run", "", "", "", ""])
            continue
        if isinstance(x, Skipped):
            rows.append([str(v), f"skipped: {x.skipped}", "", "", "", ""])
            continue
        groups = "; ".join(f"{g}: {pts(gv.drop_points)}" for g, gv in x.per_group.items()) or "—"
        sd, t = num(x.top1_std), num(x.top1)
        top1 = f"{100 * t:.1f} ± {100 * sd:.1f}%" if t is not None and sd is not None else pct(t)
        rows.append([str(v), top1, pts(x.drop_points, x.drop_std), ci(x.drop_ci95) or "—",
                     "—" if x.n_features is None else str(x.n_features), groups])
    return out + "<h4>every variant</h4>" + table(["variant", "top-1", "drop (± std over seeds)", "drop 95% CI",
                                                    "features permuted", "drop per class group"], rows)


def _drop_or_why(x: Outcome | None) -> str:
    if isinstance(x, VariantResult):
        return _drop_text(x)
    return f"skipped: {x.skipped}" if isinstance(x, Skipped) else "not run"


def _nf(x: Outcome | None) -> str:
    return str(x.n_features) if isinstance(x, VariantResult) and x.n_features is not None else "—"


def _note(x: Outcome | None) -> str:
    return (x.note or "") if isinstance(x, VariantResult) else ""


def _edit_norm(x: Outcome | None) -> float | None:
    return x.edit_norm if isinstance(x, VariantResult) else None


def _delta_top1(name: str, t: float | None, base_top1: float | None) -> str:
    return "—" if t is None or base_top1 is None or name == "baseline" else pts(100 * (t - base_top1), signed=True)


def _sec_axis(r: RopeAxisResult) -> str:
    conds = r.conditions
    base = conds.get("baseline")
    base_top1 = num(base.top1) if base is not None else None
    rows = []
    for name, c in conds.items():
        t = num(c.top1)
        rows.append([str(name), str(c.axis or "—"), "—" if c.restore_from is None else str(c.restore_from),
                     pct(t), _delta_top1(name, t, base_top1), pct(_axis_acc(c, "row")),
                     pct(_axis_acc(c, "row", orig=True)), pct(_axis_acc(c, "col")),
                     pct(_axis_acc(c, "col", orig=True))])
    out = (f"<p>{e(r.model)} on {e(r.data)}, probes at {e(r.site)}; chance row {pct(r.chance_row)}, col "
           f"{pct(r.chance_col)}. Probe accuracies at the final layer: <i>retrained</i> = decodable at all, "
           "<i>orig. probe</i> = readable by the clean-model probe.</p>")
    out += table(["condition", "axis removed", "restore from", "top-1", "Δ top-1", "row (retrained)",
                   "row (orig. probe)", "col (retrained)", "col (orig. probe)"], rows)
    removal = r.removal or {}
    rem_rows = []
    for c in ("no_row", "no_col"):
        rem = removal.get(c)
        if rem is not None:
            own = c.removeprefix("no_")
            rem_rows.append([c, f"{pct(rem.removed)} {ci(rem.removed_ci95, 100, 1, '%')}".rstrip(),
                             f"{'col' if own == 'row' else 'row'}: "
                             f"{pct(rem.kept)} {ci(rem.kept_ci95, 100, 1, '%')}".rstrip()])
    if rem_rows:
        out += ("<p>C3: share of the baseline's above-chance decodability (mean over layers ≥ 5 points above chance "
                "of (P_cond − chance) / (P_base − chance), retrained probes) that removing an axis removes from "
                "that axis and keeps of the other; 95 % paired bootstrap over the probes' test images.</p>")
        out += table(["condition", "removed of its own axis", "kept of the other axis"], rem_rows)
    rec_rows = []
    medians = r.median_recovery or {}
    for axis, per_r in r.recovery.items():
        for k, v in per_r.items():
            rec_rows.append([str(axis), str(k), _rec_text(v), fnum(last(v.rec), 2)])
        med = medians.get(axis)
        if med is not None:
            rec_rows.append([str(axis), "median over R (C4)", _median_rec_text(med), "—"])
    if rec_rows:
        out += ("<p>Recovery Rec(ℓ) = (P_restore − P_off) / (P_clean − P_off); the study predicts 0 &lt; Rec &lt; 1. "
                "Intervals: 95 % paired bootstrap over the probes' test images.</p>")
        out += table(["axis", "restore from R", "mean Rec after R", "Rec at final layer"], rec_rows)
    return out + _axis_calibrated(r)


def _share_text(share: float | None, iv: list[float] | None) -> str:
    return f"{fnum(share, 2)} {ci(iv, digits=2)}".rstrip()


def _axis_calibrated(r: RopeAxisResult) -> str:
    """Issue 29's rope_axis additions: the count-matched rebuilt share (C4), the floored removal
    fractions and the MLP / relative-offset read-outs (C3); empty for results without them."""
    out = ""
    share_rows = []
    medians = r.median_rebuilt_share or {}
    for axis, per_r in (r.count_matched or {}).items():
        for k, v in per_r.items():
            gains = [g for g in v.clean_gain if g is not None]
            share_rows.append([str(axis), str(k), fnum(v.deficit, 3), fnum(last(gains), 3),
                               _share_text(v.mean_share, v.mean_share_ci95)])
        med = medians.get(axis)
        if med is not None:
            share_rows.append([str(axis), "median over R (C4)", "—", "—",
                               _share_text(med.median_share, med.median_share_ci95)])
    if share_rows:
        out += ("<p>C4, count-matched: B(ℓ) = 1 − (P_clean(ℓ) − P_restore(ℓ)) / (P_clean(R−1) − P_off(R−1)), the share "
                "of the deficit at R that the restored layers close beyond what the same layers add in the clean model "
                "(its gain P_clean(ℓ) − P_clean(R−1)); 0 = the layers after R only do what they do anyway. 95 % paired "
                "bootstrap.</p>")
        out += table(["axis", "restore from R", "deficit at R−1", "clean gain by the last layer",
                      "mean rebuilt share after R"], share_rows)
    floored = r.removal_floored or {}
    fl_rows = []
    for c in ("no_row", "no_col"):
        rem = floored.get(c)
        if rem is not None:
            other = "col" if c == "no_row" else "row"
            kept = f"{pct(rem.kept)} {ci(rem.kept_ci95, 100, 1, '%')}".rstrip()
            fl_rows.append([c, f"{pct(rem.removed)} {ci(rem.removed_ci95, 100, 1, '%')}".rstrip(),
                            f"{other}: {kept}" + (" (interaction: above 100 %)" if rem.interaction else "")])
    if fl_rows:
        floor = r.content_floor or {}
        out += ("<p>C3 against each layer's content floor (the same model's no_both accuracy, at least chance; "
                f"row {', '.join(pct(f) for f in floor.get('row') or [])}; col "
                f"{', '.join(pct(f) for f in floor.get('col') or [])}).</p>")
        out += table(["condition", "removed of its own axis", "kept of the other axis"], fl_rows)
    ro = r.readouts
    if ro is not None and ro.accuracy:
        rows = []
        for cond, by_layer in ro.accuracy.items():
            for layer, kinds in by_layer.items():
                for kind, t in kinds.items():
                    rows.append([str(cond), str(layer), str(kind)]
                                + [pct(t.get(k)) for k in ("row", "col", "drow", "dcol")])
        out += (f"<p>Read-outs beside the linear probes ({ro.n_images} images, {ro.n_test_images} "
                "of them held out): linear and MLP probes of absolute row / col and of the offsets Δrow / Δcol "
                "between two patch tokens of an image; chance "
                f"{', '.join(f'{k} {pct(v)}' for k, v in ro.chance.items())}.</p>")
        out += table(["condition", "layer", "probe", "row", "col", "Δrow", "Δcol"], rows)
        rem_rows = []
        for c, kinds in ro.removal.items():
            for kind, v in kinds.items():
                rem_rows.append([str(c), str(kind)] + [f"{pct(p)} {ci(iv, 100, 1, '%')}".rstrip()
                                                       for p, iv in v.fractions()])
        out += table(["condition", "probe", "removed (own axis)", "kept (other axis)", "removed (own offset)",
                      "kept (other offset)"], rem_rows)
    return out


def _sec_heads(r: RopeHeadsResult) -> str:
    ph, lh = r.primary_rebuilding_head, r.largest_drop_head
    n = len(r.layers) * r.num_heads
    pairs = [("axis removed / restore from", f"{r.axis} / {r.restore_from}"),
             ("baseline top-1", f"{pct(r.baseline_top1)} {ci(r.baseline_top1_ci95, 100)}".rstrip()),
             ("primary rebuilding head", head_name(ph)),
             ("its rebuilding score", fnum(at(r.rebuild_score, r.layers, ph))),
             ("its axis index S (+1 row, −1 col)", f"{fnum(at(r.axis_index, r.layers, ph), 2)} "
                                                   f"{ci(at(r.axis_index_ci95, r.layers, ph), digits=2)}".rstrip()),
             ("top-1 drop when its rotations are ablated", _head_drop(r, ph)),
             ("its drop rank (1 = largest)", f"{fnum(r.primary_head_drop_rank)} of {n}"),
             ("largest-drop head", f"{head_name(lh)}: {_head_drop(r, lh)}"),
             ("closest rival (paired 95 % interval of the margin)", _closest_rival(r))]
    if r.top1_images_per_head is not None:  # adaptive top-1: say which drops rest on the screen only
        counts = [m for row in r.top1_images_per_head for m in row]
        total = r.n_top1_images
        pairs.append(("top-1 images per head (adaptive top-1)",
                      f"every head on the first {r.top1_screen_images}; "
                      f"{sum(m == total for m in counts)} of {len(counts)} heads still in the race on all {total} "
                      "(the others' drops and intervals rest on the screen)"))
    top = r.top_heads
    if top is not None:
        frac = r.top_heads_recovery_fraction or {}
        for method, label in (("rebuild", "by fall in recovery, rotations removed"),
                              ("mean_ablate", "by fall in recovery, output mean-ablated"),
                              ("direct_effect", "by direct effect on the axis probes (output mean-ablated together)")):
            if method not in top:
                continue
            heads = ", ".join(head_name(h) for h in top[method]) or "n/a"
            pairs.append((f"top heads {label}", f"{heads} (together: {pct(frac.get(method))} of the recovery)"))
        agree = r.top_heads_agreement or {"rebuild~mean_ablate": r.top_heads_overlap}
        k = len(top.get("rebuild") or [])
        for pair, count in agree.items():
            a, b = pair.split("~")
            pairs.append((f"heads in both top lists: {a} and {b}", f"{count} of {k}"))
    pairs += _heads_selection(r)
    return kv_table(pairs) + _c5_ablations_table(r)


def _c5_ablations_table(r: RopeHeadsResult) -> str:
    """C5 under each ablation of a head (rope_heads `c5_ablations`): the primary's drop and rank, the
    largest-drop head, the closest rival's paired margin and C5's outcome; the row the verdict rests on marked."""
    if not r.c5_ablations:
        return ""
    prim, rests = r.primary_rebuilding_head, r.c5_rests_on
    rows = []
    for name, a in r.c5_ablations.items():
        heads = [list(h) for h in a.heads]

        def drop_of(lh: Sequence[int] | None, heads: list[list[int]] = heads, a=a) -> str:
            i = heads.index(list(lh)) if lh is not None and list(lh) in heads else None
            if i is None:
                return "n/a"
            return f"{pts(a.drop_points[i])} {ci(a.drop_ci95[i] if i < len(a.drop_ci95) else None)}".rstrip()

        rival = closest_rival([a.margin_ci95])
        rows.append([f"{name}{' (verdict)' if name == rests else ''}", a.description, str(len(heads)), drop_of(prim),
                     f"{a.primary_drop_rank or 'n/a'} of {len(heads)}",
                     f"{head_name(a.largest_drop_head)}: {drop_of(a.largest_drop_head)}",
                     "n/a" if rival is None else f"{head_name(heads[rival[0][1]])} {ci(rival[1])}", a.outcome])
    return (f"<p>C5 under each ablation of one head (both axes; top-1 images, paired bootstrap): the identity row "
            f"is the sweep above; the others are measured on {e(r.c5_ablation_heads_rule or 'the heads listed')}. A "
            "constant shift is invisible between patches to a relative encoding (only the unrotated prefix tokens see "
            "it).</p>"
            + table(["ablation", "what", "heads", "primary's drop", "primary's rank", "largest drop",
                     "closest rival: drop(primary) − drop(rival)", "C5"], rows))


def _heads_selection(r: RopeHeadsResult) -> list[tuple[str, str]]:
    """Issue 29's rope_heads additions: how stable the primary choice is, S where the head rebuilds
    with its null threshold, and the share of the recovery it explains; none for older results."""
    pairs: list[tuple[str, str]] = []
    if r.selection_frequency is not None:
        ranked = sorted(r.selection_frequency.items(), key=lambda kv: -kv[1])
        pairs.append(("primary chosen over image resamples (bootstrap)", ", ".join(f"{k} {pct(v)}" for k, v in ranked)))
    if r.restore_sweep is not None:
        sweep = []
        for k, v in r.restore_sweep.items():
            p = v.primary
            share = (v.selection_frequency or {}).get(f"L{p[0]}H{p[1]}") if p is not None and len(p) == 2 else None
            sweep.append(f"R={k}: {head_name(p)} ({pct(share)} of resamples)")
        pairs.append(("primary at each restore point R", "; ".join(sweep)))
    if r.axis_index_null_threshold is not None:
        ph = r.primary_rebuilding_head
        pairs.append(("axis it rebuilds (larger fall in Rec)", str(r.primary_axis or "n/a")))
        pairs.append(("its S in the restore condition, signed to that axis",
                      f"{fnum(r.primary_axis_index_matched, 2)} "
                      f"{ci(r.primary_axis_index_matched_ci95, digits=2)}".rstrip()
                      + f" (restore S {fnum(at(r.axis_index_restore, r.layers, ph), 2)})"))
        q = r.axis_index_null_quantiles or {}
        pairs.append(("|S| null (relabelled rotary pairs): threshold at 0.95",
                      f"{fnum(r.axis_index_null_threshold, 3)} over {r.axis_index_null_n} draws; "
                      + ", ".join(f"q{k} {fnum(v, 2)}" for k, v in q.items())))
        pairs.append(("share of the recovery the primary explains",
                      f"{pct(r.primary_recovery_share)} {ci(r.primary_recovery_share_ci95, 100, 1, '%')}".rstrip()))
        tk = r.top_heads_recovery_fraction_ci95 or {}
        frac = r.top_heads_recovery_fraction or {}
        pairs.append(("top heads' joint share (rotations removed)",
                      f"{pct(frac.get('rebuild'))} {ci(tk.get('rebuild'), 100, 1, '%')}".rstrip()))
    return pairs


def _sec_prefix(r: RopePrefixResult) -> str:
    conds = r.conditions
    base = conds.get("baseline")
    base_top1 = num(base.top1) if base is not None else None
    rows = []
    for name, c in conds.items():
        t = num(c.top1)
        blocked = c.prefix_blocked_from
        rows.append([str(name), str(c.axis or "—"), "—" if c.restore_from is None else str(c.restore_from),
                     "—" if blocked is None else f"≥ {blocked}", pct(t), _delta_top1(name, t, base_top1),
                     pct(_axis_acc(c, "row")), pct(_axis_acc(c, "col")), pct(_axis_acc(c, "row", orig=True)),
                     pct(_axis_acc(c, "col", orig=True))])
    mass = ", ".join(f"L{i}: {pct(v)}" for i, v in enumerate(r.prefix_attention))
    out = (f"<p>{e(r.model)} on {e(r.data)}, {e(r.n_images)} images, probes at {e(r.site)}; chance row "
           f"{pct(r.chance_row)}, col {pct(r.chance_col)}. Blocking: every patch query's attention to the "
           f"{e(r.num_prefix_tokens)} prefix token(s) is set to 0 and renormalised over the patch keys; prefix queries "
           "keep attending everywhere. Clean attention mass of patch queries on the prefix, per layer "
           f"({e(r.attn_images)} images): {e(mass or 'n/a')}. Probe accuracies at the final layer: "
           "<i>retrained</i> = decodable at all, <i>orig. probe</i> = readable by the clean-model probe.</p>")
    out += table(["condition", "axis removed", "restore from", "prefix blocked in layers", "top-1", "Δ top-1",
                   "row (retrained)", "col (retrained)", "row (orig. probe)", "col (orig. probe)"], rows)
    rec_rows = []
    for axis, v in r.recovery.items():
        op, bl = num(v.open.mean_rec), num(v.blocked.mean_rec)
        rec_rows.append([str(axis), str(r.restore_from), fnum(op, 2), fnum(bl, 2),
                         "n/a" if op is None or bl is None else fnum(op - bl, 2)])
    if rec_rows:
        out += ("<p>Recovery after R, Rec(ℓ) = (P_restore − P_off) / (P_clean − P_off) with the clean model and "
                "the axis removed everywhere as references in both columns: what blocking the prefix from R takes "
                "away is the share of the rebuilding that goes through the prefix tokens.</p>")
        out += table(["axis", "restore from R", "mean Rec, prefix open", "mean Rec, prefix blocked from R",
                       "open − blocked"], rec_rows)
    return out


def _pts_ci(v: float | None, iv: list[float] | None) -> str:
    """A drop in points with its 95 % interval (points)."""
    return "n/a" if num(v) is None else f"{pts(v, signed=True)} {ci(iv)}".rstrip()


def _window(w: Sequence[int] | None) -> str:
    return f"{w[0]}–{w[1] - 1}" if w is not None and len(w) == 2 else "?"


def _sec_freq(r: RopeFreqResult) -> str:
    conds = r.conditions
    layers = r.layers
    bands = [[str(axis), str(b.name), str(b.pairs), f"{fnum(b.freq_min, 3)} – {fnum(b.freq_max, 3)}"]
             for axis, rows in r.band_info.items() for b in rows]
    out = (f"<p>{e(r.model)} ({e(r.rope_kind)} RoPE) on {e(r.data)}, {e(r.n_images)} images "
           f"({e(r.n_probe_test_images)} probe test images), retrained probes at {e(r.site)} of layers "
           f"{e(', '.join(map(str, layers)))}; chance row {pct(r.chance_row)}, col {pct(r.chance_col)}. Each axis' "
           "rotary pairs are ranked by their frequency along it (radians per patch, folded into [0, π]; per layer and "
           f"head for mixed RoPE) and cut into {e(r.bands)} equal-rank bands; a condition removes one axis in one band "
           "(or all: the axis) in one window of layers. Drops are clean minus condition, with 95 % paired bootstrap "
           "intervals (probe test images; top-1 images); share = the band's drop / the whole axis' drop in the same "
           "window.</p>")
    out += table(["axis", "band", "pairs per head", "frequency range (rad/patch)"], bands)
    rows = []
    for name, c in conds.items():
        if c.axis is None:
            continue
        rows.append([str(name), str(c.axis), str(c.band), _window(c.window),
                     _pts_ci(last(c.axis_drop_points or []), last(c.axis_drop_ci95 or [])),
                     fnum(last(c.share or []), 2), _pts_ci(c.top1_drop_points, c.top1_drop_ci95)])
    base = conds.get("baseline")
    out += (f"<p>Clean: top-1 {pct(base and base.top1)} {ci(base and base.top1_ci95, 100)}, row probe "
            f"{pct(last(base.row_acc) if base else None)}, col probe {pct(last(base.col_acc) if base else None)} at "
            f"layer {e(last(layers))}.</p>")
    out += table(["condition", "axis", "band", "layers", f"fall of that axis' probe at layer {last(layers)}",
                  "share of the axis' fall", "top-1 drop"], rows)
    split_rows = [[str(sp.axis), _window(sp.window),
                   _pts_ci(sp.high_minus_low_axis_drop_points, sp.high_minus_low_axis_drop_ci95),
                   _pts_ci(sp.high_minus_low_top1_drop_points, sp.high_minus_low_top1_drop_ci95), str(sp.position_in)]
                  for sp in r.splits]
    if split_rows:
        out += ("<p>High band vs low band (Barbero et al.: in language models high frequencies carry position, low "
                "ones semantics): positive = removing the high band costs more.</p>")
        out += table(["axis", "layers", "Δ axis probe fall (high − low)", "Δ top-1 drop (high − low)",
                      "position carried by"], split_rows)
    return out


def _sec_extrapolate(r: ExtrapolateResult) -> str:
    rows = []
    for sz in r.sizes:
        px, g = sz.img_size or ["?"], sz.grid or ["?", "?"]
        top1 = "refused" if sz.top1 is None else f"{pct(sz.top1)} {ci(sz.top1_ci, 100, 1, '%')}"
        rows.append([f"{px[0]} px", f"{g[0]}×{g[1]}", "resized" if sz.data_px is None else f"generated {sz.data_px} px",
                     top1, pct(last(sz.row_acc)), pct(last(sz.col_acc)),
                     ", ".join(fnum(v, 2) for v in sz.row_skill), ", ".join(fnum(v, 2) for v in sz.col_skill)])
    how = []
    if r.ape:
        how.append(f"APE {e(r.ape)}")
    if r.rope_grid == "extended":
        how.append("RoPE tables rebuilt with the trained grid step: the added rows / columns turn by unseen angles")
    elif r.rope_grid == "rescaled":
        how.append("RoPE tables rebuilt with the larger grid mapped onto the trained range (rescaled coordinates)")
    out = (f"<p>{e(r.model)} ({e(r.scheme)}) on {e(r.data)}, {e(r.n_images)} images per size, probes at {e(r.site)} "
           "retrained at each size (as many classes as the grid has rows / columns). "
           f"{'; '.join(how) or 'No positional encoding'}. Skill = (acc − chance) / (1 − chance) per layer: 1 = every "
           "patch placed, 0 = chance." + (f" Top-1 refused: {e(r.top1_refused)}" if r.top1_refused else "") + "</p>")
    return out + table(["input", "grid", "data", "top-1 [95% CI]", "row acc (last layer)", "col acc (last layer)",
                        "row skill per layer", "col skill per layer"], rows)


def _c1_drop(n: Mapping[str, Any], axis: str, control: bool = False) -> str:
    """A layer's own-axis probe drop (or its matched control's) as C1 read it (`n`: its numbers there)."""
    key = f"{axis}_control_probe_drop" if control else f"{axis}_probe_drop"
    return f"{pts(n.get(key))} {ci(n.get(f'{key}_ci95'))}".rstrip()


def _sel(n: Mapping[str, Any], axis: str) -> str:
    return f"{fnum(n.get(f'{axis}_selectivity'), 2)} {ci(n.get(f'{axis}_selectivity_ci95'), digits=2)}".rstrip()


def _permuted(p: LayerPoint, variant: str) -> str:
    return "n/a" if p.permute is None else _drop_or_why(p.permute.outcome(variant))


def _sweep_images(r: SAELayersResult) -> str:
    """Which images the per-layer SAEs trained on and which C1's causal check read, where not the run's data."""
    p = next((p for p in r.points if p.sae is not None), None)
    if p is None or p.sae is None:
        return ""
    causal = p.sae.causal.data if p.sae.causal is not None else None
    norm = "" if r.sae_high_norm is None else f"; tokens over {r.sae_high_norm:g}x the median norm left out"
    if p.sae.data == r.data:
        return norm
    return f"; SAEs trained on {e(p.sae.data)} images, the causal check read on {e(causal or p.sae.data)}{norm}"


def _sec_sae_layers(r: SAELayersResult) -> str:
    # C1 and C2 at each layer and over the plausible ones, read by the claims' own rules
    c1 = {p.layer: C1.at_layer(r.model, p) for p in r.points}
    c2 = {p.layer: C2.at_layer(r.model, p) for p in r.points}
    over = {name: over_plausible([at[layer].result for layer in plausible_layers(r, PLAUSIBLE)])
            for name, at in (("C1", c1), ("C2", c2))}
    plaus = ", ".join(f"L{p.layer} ({p.selection_frequency:.0%})" for p in r.points if p.layer in r.plausible_layers)
    head = (f"<p>{e(r.model)} on {e(r.data)}: an SAE of its own at each of {e(r.layer_rule)} (resid_post, TopK k "
            f"{e(r.sae_k)}, expansion {e(r.sae_expansion)}, {e(r.sae_images)} training images x {e(r.sae_epochs)} "
            f"epochs, {e(r.sae_eval_images)} held-out images for the causal check{_sweep_images(r)}), and the "
            f"permutation of its positional features on {e(r.permute_images)} {e(r.data)} images (seeds "
            f"{e(fmt_value(r.seeds))}). The layer where "
            "position matters most for behaviour is the largest all-positional drop; its selection frequency is "
            "bootstrapped over the images (the same resample at every layer). Plausible layers (chosen in at least "
            f"{PLAUSIBLE:.0%} of the resamples): <b>{e(plaus or 'none')}</b>. Over them C1 <b>{e(over['C1'])}</b> "
            f"and C2 <b>{e(over['C2'])}</b> (a claim holds when it holds at every plausible layer); the claims "
            "table reads the curve this way, the single-layer sae and ape_permute stages are reported beside it.</p>")
    rows = []
    for p in r.points:
        n = c1[p.layer].numbers
        rows.append([f"L{p.layer}" + (" *" if p.layer in r.plausible_layers else ""), fnum(p.fvu),
                     f"{p.n_row} / {p.n_col} / {p.n_mixed}", c1[p.layer].result, _c1_drop(n, "row"),
                     _c1_drop(n, "row", True), _c1_drop(n, "col"), _c1_drop(n, "col", True),
                     f"{_sel(n, 'row')}; {_sel(n, 'col')}", c2[p.layer].result,
                     _permuted(p, "all_positional"), _permuted(p, "swap_all_positional"),
                     _permuted(p, "random_all_positional"), f"{p.selection_frequency:.0%}"])
    return head + table(["layer (* plausible)", "FVU", "row / col / mixed", "C1 here", "row set: row-probe drop",
                         "its control", "col set: col-probe drop", "its control", "selectivity row; col", "C2 here",
                         "all-positional drop", "same-position swap", "matched random", "selected"], rows)


# ---------------------------------------------------------------- dispatch and the model's section
@dataclass(frozen=True)
class Section(Generic[R]):
    """One experiment's section body: a function of its typed result (pyright checks the pair)."""

    result_type: type[R]
    body: Callable[[R], str]

    def __call__(self, result: Result) -> str:
        if not isinstance(result, self.result_type):
            raise VitposError(f"a {self.result_type.__name__} section got a {type(result).__name__}")
        return self.body(result)


SECTIONS: dict[str, Section[Any]] = {  # experiment name -> its section body
    "eval": Section(EvalResult, _sec_eval), "probe": Section(Result, _probe_body),
    "sae": Section(SAEResult, _sec_sae), "ape_permute": Section(ApePermuteResult, _sec_ape),
    "rope_axis": Section(RopeAxisResult, _sec_axis), "rope_heads": Section(RopeHeadsResult, _sec_heads),
    "rope_prefix": Section(RopePrefixResult, _sec_prefix), "rope_freq": Section(RopeFreqResult, _sec_freq),
    "extrapolate": Section(ExtrapolateResult, _sec_extrapolate),
    "sae_layers": Section(SAELayersResult, _sec_sae_layers),
}


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
            own = exp.section(result)  # the experiment's own section, else the report's renderer for it
            if own is None:
                section = SECTIONS.get(exp.name)
                own = section(result) if section is not None else _generic_section(result)
            out.append(own)
        out.append("</section>")
    out.append("</section>")
    return "".join(out)
