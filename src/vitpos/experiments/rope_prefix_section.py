"""The rope_prefix stage's report section and summary line (`vitpos.experiments.rope_prefix`)."""

from __future__ import annotations

from vitpos.report.format import axis_acc, delta_top1, e, fnum, num, pct, table
from vitpos.results.rope_prefix import RopePrefixResult


def section(r: RopePrefixResult) -> str:
    conds = r.conditions
    base = conds.get("baseline")
    base_top1 = num(base.top1) if base is not None else None
    rows = []
    for name, c in conds.items():
        t = num(c.top1)
        blocked = c.prefix_blocked_from
        rows.append([str(name), str(c.axis or "—"), "—" if c.restore_from is None else str(c.restore_from),
                     "—" if blocked is None else f"≥ {blocked}", pct(t), delta_top1(name, t, base_top1),
                     pct(axis_acc(c, "row")), pct(axis_acc(c, "col")), pct(axis_acc(c, "row", orig=True)),
                     pct(axis_acc(c, "col", orig=True))])
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


def summary(r: RopePrefixResult) -> str:
    """Mean recovery per axis with the prefix tokens open and blocked from the restore point."""
    parts = [f"{axis} mean Rec {fnum(v.open.mean_rec, 2)} open, {fnum(v.blocked.mean_rec, 2)} with the prefix "
             f"blocked from R={r.restore_from}" for axis, v in r.recovery.items()]
    return "; ".join(parts) or "no recovery data"
