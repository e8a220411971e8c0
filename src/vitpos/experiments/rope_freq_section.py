"""The rope_freq stage's report section and summary line (`vitpos.experiments.rope_freq`)."""

from __future__ import annotations

from collections.abc import Sequence

from vitpos.report.format import ci, e, fnum, last, num, pct, pts, table
from vitpos.results.rope_freq import RopeFreqResult


def _pts_ci(v: float | None, iv: list[float] | None) -> str:
    """A drop in points with its 95 % interval (points)."""
    return "n/a" if num(v) is None else f"{pts(v, signed=True)} {ci(iv)}".rstrip()


def _window(w: Sequence[int] | None) -> str:
    return f"{w[0]}–{w[1] - 1}" if w is not None and len(w) == 2 else "?"


def section(r: RopeFreqResult) -> str:
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


def summary(r: RopeFreqResult) -> str:
    """Which band carries each axis' position in each window (high minus low band, axis probe fall)."""
    parts = [f"{sp.axis} layers {_window(sp.window)}: position in the {sp.position_in} band "
             f"(high − low {_pts_ci(sp.high_minus_low_axis_drop_points, sp.high_minus_low_axis_drop_ci95)})"
             for sp in r.splits]
    return "; ".join(parts) or "no band split measured"
