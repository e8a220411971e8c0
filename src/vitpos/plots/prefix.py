"""Figure for rope_prefix: probe accuracy per layer with patch -> prefix attention blocked."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.lines import Line2D

from vitpos.plots.sweeps import OKABE_ITO, mathtext_safe, new_figure, save_figure

if TYPE_CHECKING:
    from vitpos.results.rope_prefix import RopePrefixResult


def _floats(vals: Sequence[float | None], n: int) -> list[float] | None:
    """vals as n floats (None -> NaN), or None when it does not have that length."""
    if len(vals) != n:
        return None
    return [math.nan if v is None else float(v) for v in vals]


def plot_rope_prefix(r: RopePrefixResult, path: str | Path) -> Path:
    """Row and column probe accuracy vs layer (retrained probes) for the clean, axis-removed and
    restore conditions, each with the prefix route open (solid) and blocked (dashed); a third
    panel shows the clean model's attention mass of patch queries on the prefix per layer."""
    layers = list(r.layers)
    conds = r.conditions
    R = r.restore_from
    fig = new_figure(15.0, 5.6)
    axes = fig.subplots(1, 3)
    for ax, axis in zip(axes[:2], ("row", "col"), strict=True):
        handles = []
        pairs = (("baseline", "block", OKABE_ITO["black"]), (f"no_{axis}", f"no_{axis}_block", OKABE_ITO["blue"]),
                 (f"restore_{axis}_R{R}", f"restore_{axis}_R{R}_block", OKABE_ITO["green"]))
        for open_name, blocked_name, color in pairs:
            for name, ls in ((open_name, "-"), (blocked_name, "--")):
                c = conds.get(name)
                ys = None if c is None else _floats(c.row_acc if axis == "row" else c.col_acc, len(layers))
                if c is None or ys is None:
                    continue
                ax.plot(layers, ys, ls, color=color, marker="o" if ls == "-" else "s", ms=3, lw=1.6)
                handles.append(Line2D([], [], color=color, ls=ls, label=f"{name} (top-1 {_pct(c.top1)})"))
        chance = r.chance_row if axis == "row" else r.chance_col
        ax.axhline(float(chance), color="0.5", ls=":", lw=1.2)
        handles.append(Line2D([], [], color="0.5", ls=":", label=f"chance ({float(chance):.2f})"))
        ax.axvline(R - 0.5, color=OKABE_ITO["green"], ls="-.", lw=0.8, alpha=0.6)
        ax.set_title(f"{axis} position probe (retrained); dashed: prefix blocked", fontsize=10)
        ax.set_xlabel("layer")
        ax.set_ylabel("probe test accuracy")
        ax.set_ylim(0.0, 1.02)
        if layers:
            ax.set_xticks(layers)
        ax.grid(alpha=0.25)
        ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    ax = axes[2]
    mass = _floats(r.prefix_attention, len(layers))
    finite = [v for v in mass or [] if math.isfinite(v)]
    if mass is not None and finite:
        bars = ax.bar(layers, mass, color=OKABE_ITO["purple"])
        ax.bar_label(bars, labels=[f"{v:.3f}" for v in mass], fontsize=7)
        ax.set_xticks(layers)
        ax.set_ylim(0.0, min(1.0, max(0.05, 1.25 * max(finite))))  # small masses stay visible
    else:
        ax.text(0.5, 0.5, "no prefix attention data", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"clean attention of patch queries on the {r.num_prefix_tokens} prefix token(s)",
                 fontsize=10)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention mass")
    ax.grid(alpha=0.25, axis="y")
    fig.suptitle(mathtext_safe(f"{r.model}: prefix route blocked from layer {r.block_from}"
                               f" (restore conditions: rotations back and prefix blocked from R={R})"), fontsize=10)
    return save_figure(fig, path)


def _pct(v: float | None) -> str:
    return f"{100 * float(v):.1f}%" if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"
