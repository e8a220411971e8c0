"""Figure for rope_freq: what removing one band of an axis' rotary frequencies costs, per layer window."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitpos.plots.sweeps import OKABE_ITO, mathtext_safe, new_figure, save_figure

if TYPE_CHECKING:
    from vitpos.results.rope_freq import RopeFreqResult

_COLORS = [OKABE_ITO["sky"], OKABE_ITO["yellow"], OKABE_ITO["vermillion"], OKABE_ITO["green"], OKABE_ITO["purple"],
           OKABE_ITO["orange"]]


def _bar(value: Any, ci: Any) -> tuple[float, float, float]:
    """(points, down, up) of a drop in points and its [lo, hi] interval; NaN / 0 where missing."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return math.nan, 0.0, 0.0
    v = float(value)
    if isinstance(ci, list) and len(ci) == 2 and all(isinstance(c, (int, float)) for c in ci):
        return v, max(0.0, v - ci[0]), max(0.0, ci[1] - v)
    return v, 0.0, 0.0


def plot_rope_freq(r: RopeFreqResult, path: str | Path) -> Path:
    """Per axis (rows of panels): the fall of that axis' probe accuracy at the last probed layer
    (left) and the top-1 drop (right), in points, bars per frequency band (lowest first, then the
    whole axis) grouped by layer window, with 95 % paired-bootstrap intervals."""
    conds, info = r.conditions, r.band_info
    windows = [tuple(w) for w in r.windows]
    last = r.layers[-1] if r.layers else "?"
    fig = new_figure(13.0, 8.0)
    panels = fig.subplots(2, 2, squeeze=False)
    for row, axis in enumerate(("row", "col")):
        bands = info.get(axis) or []
        width = 0.8 / max(1, len(bands))
        for c, (what, title) in enumerate((("axis", f"fall of {axis} probe accuracy at layer {last}"),
                                           ("top1", "top-1 drop"))):
            ax = panels[row][c]
            for i, band in enumerate(bands):
                xs, ys, err = [], [], [[], []]
                for k, (s, e) in enumerate(windows):
                    entry = conds.get(f"no_{axis}_{band.name}_L{s}-{e - 1}")
                    if entry is None:
                        continue
                    if what == "axis":
                        drops, cis = entry.axis_drop_points or [], entry.axis_drop_ci95 or []
                        v, lo, hi = _bar(drops[-1] if drops else None, cis[-1] if cis else None)
                    else:
                        v, lo, hi = _bar(entry.top1_drop_points, entry.top1_drop_ci95)
                    xs.append(k + (i - (len(bands) - 1) / 2) * width)
                    ys.append(v)
                    err[0].append(lo)
                    err[1].append(hi)
                rng = f" ({band.freq_min:.2g}–{band.freq_max:.2g} rad/patch)"
                ax.bar(xs, ys, width, yerr=err, capsize=2, color=_COLORS[i % len(_COLORS)], edgecolor="0.3",
                       linewidth=0.5, label=f"{band.name}{rng}")
            ax.axhline(0.0, color="0.5", lw=0.8)
            ax.set_xticks(range(len(windows)), [f"layers {s}–{e - 1}" for s, e in windows])
            ax.set_ylabel("points")
            ax.set_title(f"{axis} removed in one band: {title}", fontsize=10)
            ax.grid(alpha=0.25, axis="y")
            ax.legend(fontsize=7, title="band removed", title_fontsize=7)
    fig.suptitle(mathtext_safe(f"{r.model} ({r.rope_kind} RoPE): one axis removed in one "
                               f"band of its frequencies, per layer window; {r.n_images} images"),
                 fontsize=10)
    return save_figure(fig, path)
