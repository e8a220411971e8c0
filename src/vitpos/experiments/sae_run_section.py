"""The sae stage's report section and summary line (`vitpos.experiments.sae_run`)."""

from __future__ import annotations

from collections.abc import Sequence

from vitpos.report.format import ci, e, fnum, kv_table, num, pct, pts, table
from vitpos.results.base import Skipped
from vitpos.results.sae_run import AblationEffect, RemovalControl, SAEResult
from vitpos.sae.special import OUTLIER_K


def ids(v: Sequence[int] | None, n: int = 12) -> str:
    v = list(v or [])
    return f"{len(v)}" + (f" ({', '.join(map(str, v[:n]))}{', …' if len(v) > n else ''})" if v else "")


def _effect(x: AblationEffect | Skipped | None) -> AblationEffect | None:
    return x if isinstance(x, AblationEffect) else None


def summary(r: SAEResult) -> str:
    conj = "" if r.conj_features is None else f" (+ {len(r.conj_features)} conjunction)"
    s = (f"{len(r.row_features)} row / {len(r.col_features)} col / {len(r.mixed_features)} mixed features{conj} at "
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


def section(r: SAEResult) -> str:
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
    if r.conj_features is not None:  # issue 47 item 3 (a result written before it has none)
        t = r.thresholds
        pairs.append(("conjunction features (position within content: bias-adjusted η² of position over the "
                      f"images where the latent fires ≥ {fnum(t.get('min_eta2_conj'), 2)}, on ≥ "
                      f"{fnum(t.get('min_conj_images'), 0)} images; not row / col / mixed)", ids(r.conj_features)))
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
        if null.null_conj_q is not None:
            pairs.append(("conjunction statistic under the same shuffle: q99 / max",
                          f"{fnum(null.null_conj_q, 4)} / {fnum(null.null_conj_max, 4)}"))
    return kv_table(pairs + _sae_fidelity_pairs(r)) + _seed_pool(r) + _sae_grid(r) + _sae_browser_link(r)


def _seed_pool(r: SAEResult) -> str:
    """The SAE seeds C1 reads (issue 48): each seed's latents and removals, and the pooled removals C1's
    rule reads (mean over seeds; intervals over SAE seeds x images)."""
    pool = r.seed_pool
    if pool is None:
        return ""
    counts = [(r.n_row_features, r.n_col_features, r.n_mixed_features, r.n_conj_features, r.fvu),
              *((x.n_row_features, x.n_col_features, x.n_mixed_features, x.n_conj_features, x.fvu)
                for x in pool.runs)]
    rows = []
    for i, (sd, (n_row, n_col, n_mixed, n_conj, fvu)) in enumerate(zip(pool.seeds, counts, strict=True)):
        cells = [str(sd), fnum(fvu), f"{n_row} / {n_col} / {n_mixed}", "n/a" if n_conj is None else str(n_conj)]
        for kind in ("row", "col"):
            p = pool.effect(kind)
            cells.append("n/a" if p is None else fnum(p.per_seed_selectivity[i], 2))
        rows.append(cells)
    pooled = ["pooled", "", "", ""]
    for kind in ("row", "col"):
        p = pool.effect(kind)
        pooled.append("n/a" if p is None else f"{fnum(p.selectivity, 2)} {ci(p.selectivity_ci95, digits=2)}")
    return (f"<h4>SAE seeds C1 reads</h4><p>{len(pool.seeds)} SAEs trained at this site on the same tokens (seeds "
            f"{', '.join(map(str, pool.seeds))}); each types its own latents and removes its own sets. C1's rule "
            "reads the pooled numbers: the mean over seeds, intervals over SAE seeds × images (hierarchical "
            "bootstrap); each seed's value is reported, not required.</p>"
            + table(["seed", "FVU", "row / col / mixed", "conjunction", "row-set selectivity", "col-set selectivity"],
                    [*rows, pooled]))


def _sae_grid(r: SAEResult) -> str:
    """The sae stage's seeds x dictionary sizes (`sae.seeds`, `sae.expansions`): every SAE's fit and
    positional-feature counts, and each same-size seed pair's decoder matching (whole dictionary and
    the positional sets), so a reader sees whether the features C1 / C2 read recur across seeds."""
    g = r.sweep
    if g is None:
        return ""
    runs = [[f"{x.seed}{' *' if x.main else ''}", f"×{x.expansion} ({x.d_sae})", fnum(x.fvu), fnum(x.l0, 1),
             pct(x.dead_frac), f"{x.n_row_features} / {x.n_col_features} / {x.n_mixed_features}",
             "n/a" if x.n_conj_features is None else str(x.n_conj_features)] for x in g.runs]
    cos = sorted({t for m in g.stability for t in m.stable_frac}, key=float)
    pairs = [[f"{m.seeds[0]} vs {m.seeds[1]}", str(m.d_sae), fnum(m.mean_cos, 2), fnum(m.median_cos, 2),
              *(pct(m.stable_frac.get(t)) for t in cos), pct(m.row_agreement), pct(m.col_agreement)]
             for m in g.stability]
    out = (f"<h4>seeds × dictionary sizes</h4><p>Every SAE of the grid trains on the same tokens with the same "
           f"settings but its seed and size, and is scored on the same {e(g.eval_images)} held-out images; C1 and "
           "C2 read the starred one. Seed pairs of one size are matched one-to-one by decoder direction (Hungarian "
           "on cosine); a latent is stable when its match reaches the cosine (each threshold shown); a positional "
           "set agrees when a row (col) latent's match is a row (col) latent of the other seed.</p>")
    out += table(["seed", "size (latents)", "FVU", "L0", "dead", "row / col / mixed", "conjunction"], runs)
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
