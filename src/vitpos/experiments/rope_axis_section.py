"""The rope_axis stage's report section and summary line (`vitpos.experiments.rope_axis`)."""

from __future__ import annotations

from vitpos.report.format import axis_acc, ci, delta_top1, e, fnum, last, num, pct, table
from vitpos.results.common import Recovery
from vitpos.results.rope_axis import AxisRemoval, MedianRecovery, RopeAxisResult


def _rec_text(v: Recovery) -> str:
    """A mean recovery with its paired interval, where measured."""
    return f"{fnum(v.mean_rec, 2)} {ci(v.mean_rec_ci95, digits=2)}".rstrip()


def _median_rec_text(v: MedianRecovery) -> str:
    return f"{fnum(v.median_rec, 2)} {ci(v.median_rec_ci95, digits=2)}".rstrip()


def summary(r: RopeAxisResult, claim: str) -> str:
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
            parts.append(f"{c}: final-layer row {pct(axis_acc(x, 'row'))} (clean "
                         f"{pct(axis_acc(base, 'row'))}), col {pct(axis_acc(x, 'col'))} (clean "
                         f"{pct(axis_acc(base, 'col'))})" + _removal_text(c, removal.get(c)))
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


def section(r: RopeAxisResult) -> str:
    conds = r.conditions
    base = conds.get("baseline")
    base_top1 = num(base.top1) if base is not None else None
    rows = []
    for name, c in conds.items():
        t = num(c.top1)
        rows.append([str(name), str(c.axis or "—"), "—" if c.restore_from is None else str(c.restore_from),
                     pct(t), delta_top1(name, t, base_top1), pct(axis_acc(c, "row")),
                     pct(axis_acc(c, "row", orig=True)), pct(axis_acc(c, "col")),
                     pct(axis_acc(c, "col", orig=True))])
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
