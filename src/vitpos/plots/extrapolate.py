"""Figure for extrapolate: probe skill per layer and top-1 at the training size and larger grids."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vitpos.plots.sweeps import OKABE_ITO, mathtext_safe, new_figure, save_figure

if TYPE_CHECKING:
    from vitpos.results.extrapolate import ExtrapolateResult, SizeResult

_COLORS = [OKABE_ITO[k] for k in ("black", "blue", "vermillion", "green", "purple", "sky")]


def _label(size: SizeResult) -> str:
    g, px = size.grid or ["?", "?"], size.img_size or ["?", "?"]
    return f"{px[0]} px, grid {g[0]}x{g[1]} (x{float(size.scale):g})"


def plot_extrapolate(r: ExtrapolateResult, path: str | Path) -> Path:
    """Row and column probe skill above chance, (acc - chance) / (1 - chance), per layer, one line per
    input size (training size in black); a third panel shows top-1 per size with its Wilson interval."""
    layers, sizes = list(r.layers), r.sizes
    fig = new_figure(15.0, 5.2)
    axes = fig.subplots(1, 3)
    for ax, axis in zip(axes[:2], ("row", "col"), strict=True):
        for i, s in enumerate(sizes):
            ys, chance = (s.row_skill, s.chance_row) if axis == "row" else (s.col_skill, s.chance_col)
            if len(ys) != len(layers):
                continue
            ax.plot(layers, ys, "-o", color=_COLORS[i % len(_COLORS)], ms=3, lw=1.6,
                    label=f"{_label(s)}: chance {100 * float(chance):.0f}%")
        ax.axhline(0.0, color="0.5", ls=":", lw=1.2)
        ax.set_title(f"{axis} probe (retrained per size): skill above chance", fontsize=10)
        ax.set_xlabel("layer")
        ax.set_ylabel("(acc − chance) / (1 − chance)")
        ax.set_ylim(-0.05, 1.02)
        if layers:
            ax.set_xticks(layers)
        ax.grid(alpha=0.25)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    ax = axes[2]
    pts = [(i, s, s.top1) for i, s in enumerate(sizes) if s.top1 is not None]
    if pts:
        for i, s, top1 in pts:
            t = float(top1)
            ci = s.top1_ci
            err = [[t - float(ci[0])], [float(ci[1]) - t]] if ci is not None and len(ci) == 2 else None
            ax.errorbar([i], [t], yerr=err, fmt="o", color=_COLORS[i % len(_COLORS)], capsize=4)
            ax.annotate(f"{100 * t:.1f}%", (i, t), textcoords="offset points", xytext=(8, -3), fontsize=8)
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels([f"{(s.img_size or ['?'])[0]} px" for s in sizes])
        ax.set_ylim(0.0, 1.02)
    else:
        reason = str(r.top1_refused or "no top-1")
        ax.text(0.5, 0.5, "top-1 refused:\n" + reason[:120], ha="center", va="center", transform=ax.transAxes,
                fontsize=8, wrap=True)
    ax.set_title("top-1 per input size (95% Wilson interval)", fontsize=10)
    ax.set_ylabel("top-1")
    ax.grid(alpha=0.25, axis="y")
    how = [f"scheme {r.scheme}"]
    if r.ape:
        how.append("APE resampled (bicubic)")
    if r.rope_grid:
        how.append(f"RoPE grid {r.rope_grid}")
    fig.suptitle(mathtext_safe(f"{r.model} on {r.data}: larger grids than trained "
                               f"({', '.join(how)}; {r.n_images} images per size)"), fontsize=10)
    return save_figure(fig, path)
