"""Figures for the typed results of ape_permute, rope_axis and rope_heads.

Pure rendering: each function reads one result, draws it with matplotlib's Agg canvas (no
pyplot state) and writes a PNG atomically. Colours are the Okabe-Ito colour-blind-safe set.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib as mpl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from vitpos.errors import VitposError
from vitpos.io import atomic_path

if TYPE_CHECKING:  # the results these figures draw (annotations only)
    from vitpos.results.ape_permute import ApePermuteResult, VariantResult
    from vitpos.results.rope_axis import RopeAxisResult
    from vitpos.results.rope_heads import RopeHeadsResult

# Okabe-Ito palette
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7",
}
CYCLE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
_COND_COLORS = {
    "baseline": OKABE_ITO["black"], "no_row": OKABE_ITO["blue"], "no_col": OKABE_ITO["orange"],
    "no_both": OKABE_ITO["purple"], "restore": OKABE_ITO["green"],
}
_RESTORE = re.compile(r"^restore_(row|col)_R(\d+)$")
DPI = 110


def mathtext_safe(text: Any) -> str:
    """Text for a matplotlib title: `$` escaped so names never trigger mathtext parsing."""
    return str(text).replace("$", r"\$")


def _num(v: Any) -> float:
    """float(v), NaN for None / non-numbers."""
    try:
        return float("nan") if v is None else float(v)
    except (TypeError, ValueError):
        return float("nan")


def _series(vals: Any) -> list[float] | None:
    if not isinstance(vals, (list, tuple)) or not vals or all(v is None for v in vals):
        return None
    return [_num(v) for v in vals]


def new_figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return path


def _pct(v: Any) -> str:
    x = _num(v)
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


# ---------------------------------------------------------------- ape_permute
def ape_bar_order(r: ApePermuteResult) -> list[tuple[str, str]]:
    """(variant, kind) in plotting order, kind "set", "control" or "null": each permuted set followed by
    its matched random control (`controls`) and its nulls by construction (`nulls`: the same-position swap
    C2 reads, the crossed design, the edit-norm-matched set), then the remaining variants in `variants` order."""
    out: list[tuple[str, str]] = []
    for kept, ctrl in (r.controls or {}).items():
        out.append((str(kept), "set"))
        if r.outcome(ctrl) is not None:
            out.append((str(ctrl), "control"))
        out += [(str(null), "null") for null, of in (r.nulls or {}).items()
                if of == kept and r.outcome(null) is not None]
    seen = {v for v, _ in out}
    return out + [(str(v), "set") for v in r.variants if v not in seen]


def drop_error(entry: VariantResult) -> tuple[float, float, float]:
    """(drop, down, up): the error bar is the 95 % interval where measured, else ± drop_std."""
    d = _num(entry.drop_points)
    ci = entry.drop_ci95
    if ci is not None and len(ci) == 2 and not math.isnan(d):
        return d, max(d - _num(ci[0]), 0.0), max(_num(ci[1]) - d, 0.0)
    e = _num(entry.drop_std)
    e = 0.0 if math.isnan(e) else e
    return d, e, e


def plot_ape_permute(r: ApePermuteResult, path: str | Path) -> Path:
    """Bars of the top-1 drop (points) per permutation variant, each permuted set beside its matched
    random control (grey, //) and its nulls by construction (white, xx); error bars are the 95 % bootstrap
    interval (± drop_std for results without one). A second panel with the per-group drops (vertical vs
    horizontal) for all / row_only / col_only when available."""
    order = ape_bar_order(r)
    names, drops, lows, highs, notes, colors, hatches = [], [], [], [], [], [], []
    pair = -1
    for v, kind in order:
        entry = r.variant(v)
        names.append(v)
        pair += 1 if kind == "set" else 0
        colors.append({"control": "0.75", "null": "white"}.get(kind, CYCLE[pair % len(CYCLE)]))
        hatches.append({"control": "//", "null": "xx"}.get(kind, ""))
        if entry is None:
            drops.append(0.0)
            lows.append(0.0)
            highs.append(0.0)
            notes.append("skipped" if r.outcome(v) is not None else "missing")
        else:
            d, lo, hi = drop_error(entry)
            drops.append(d)
            lows.append(lo)
            highs.append(hi)
            notes.append(None)
    groups: list[str] = []
    # the per-group panel: the all-positional set C2 reads, then every other set that ran (a skipped one draws no bars)
    parts = {v: r.variant(v) for v in ("all_positional", "all", "row_only", "col_only") if r.outcome(v) is not None}
    for x in parts.values():
        for g in x.per_group if x is not None else ():
            if g not in groups:
                groups.append(g)
    two = bool(groups)
    fig = new_figure(13.0 if two else 8.5, 4.6)
    axes = fig.subplots(1, 2 if two else 1, squeeze=False)[0]
    ax = axes[0]
    x = list(range(len(names)))
    ax.bar(x, drops, yerr=[lows, highs], capsize=4, color=colors, edgecolor="black", linewidth=0.6, hatch=hatches)
    for i, note in enumerate(notes):
        if note:
            ax.text(i, 0, note, ha="center", va="bottom", rotation=90, fontsize=8, color="0.35")
        elif not math.isnan(drops[i]):
            ax.text(i, drops[i] + highs[i], f"{drops[i]:.1f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("top-1 drop (points, 95% CI)")
    ax.set_xlabel("intervention; after each permuted set: grey //, its matched random control;\n"
                  "white xx, its nulls by construction (C2 reads swap_all_positional)")
    ax.grid(axis="y", alpha=0.3)
    model = mathtext_safe(r.model)
    where = mathtext_safe(f"layer {r.layer} {r.site}".strip())
    ax.set_title(f"Permuting positional features ({where})\nbaseline top-1 {_pct(r.baseline_top1)}",
                 fontsize=10)
    if two:
        ax2 = axes[1]
        width = 0.8 / len(groups)
        for j, g in enumerate(groups):
            vals = [_num(gd.drop_points if x is not None and (gd := x.per_group.get(g)) is not None else None)
                    for x in parts.values()]
            pos = [i + (j - (len(groups) - 1) / 2) * width for i in range(len(parts))]
            ax2.bar(pos, vals, width=width, label=g, color=CYCLE[(j + 1) % len(CYCLE)],
                    edgecolor="black", linewidth=0.6, hatch=["", "//", "..", "xx"][j % 4])
        ax2.axhline(0, color="black", lw=0.8)
        ax2.set_xticks(range(len(parts)), list(parts))
        ax2.set_ylabel("top-1 drop (points)")
        ax2.set_xlabel("permuted feature set")
        ax2.set_title("Drop per class group", fontsize=10)
        ax2.legend(title="class group", fontsize=8)
        ax2.grid(axis="y", alpha=0.3)
    if model:
        fig.suptitle(model, fontsize=9, color="0.3")
    return save_figure(fig, path)


# ---------------------------------------------------------------- rope_axis
def restore_points(r: RopeAxisResult) -> list[int]:
    """The sorted restore layers R present as restore_<axis>_R<k> conditions."""
    rs = {int(m.group(2)) for name in r.conditions if (m := _RESTORE.match(name))}
    return sorted(rs)


def _band(cis: Sequence[Sequence[float] | None] | None, n: int) -> tuple[list[float], list[float]] | None:
    """Lower and upper ends of per-layer [lo, hi] intervals; None unless every layer has one."""
    if cis is None or len(cis) != n:
        return None
    ends = [c for c in cis if c is not None and len(c) == 2]
    if len(ends) != n:
        return None
    return [_num(c[0]) for c in ends], [_num(c[1]) for c in ends]


def plot_rope_axis(r: RopeAxisResult, path: str | Path, restore_from: int | None = None) -> Path:
    """Row and column probe accuracy vs layer for baseline / no_row / no_col / no_both and the
    restore-at-R curves (R = `restore_from`, default the middle R present). Solid: probe
    retrained on each condition (decodable at all), shaded: its 95 % interval; dashed: the original
    probe (readable by it)."""
    layers = list(r.layers)
    conds = r.conditions
    rs = restore_points(r)
    if restore_from is None and rs:
        restore_from = rs[len(rs) // 2]
    fig = new_figure(11.5, 6.0)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, axis in zip(axes, ("row", "col"), strict=True):
        shown = ["baseline", "no_row", "no_col", "no_both"]
        if restore_from is not None:
            shown.append(f"restore_{axis}_R{restore_from}")
        handles = []
        for name in shown:
            c = conds.get(name)
            if c is None:
                continue
            color = _COND_COLORS["restore" if name.startswith("restore") else name]
            drawn = False
            retrained, orig = (c.row_acc, c.row_acc_orig_probe) if axis == "row" else (c.col_acc, c.col_acc_orig_probe)
            for vals, ls in ((retrained, "-"), (orig, "--")):
                ys = _series(vals)
                if ys is not None and len(ys) == len(layers):
                    ax.plot(layers, ys, ls, color=color, marker="o" if ls == "-" else None, ms=3, lw=1.6)
                    drawn = True
            band = _band(c.row_acc_ci95 if axis == "row" else c.col_acc_ci95, len(layers))
            if band is not None:  # 95 % interval of the retrained probe (bootstrap over its test images)
                ax.fill_between(layers, band[0], band[1], color=color, alpha=0.15, lw=0)
            if drawn:
                label = f"{name} (top-1 {_pct(c.top1)})"
                handles.append(Line2D([], [], color=color, lw=2, label=label))
        chance = r.chance_row if axis == "row" else r.chance_col
        ax.axhline(_num(chance), color="0.5", ls=":", lw=1.2)
        handles.append(Line2D([], [], color="0.5", ls=":", label=f"chance ({_num(chance):.2f})"))
        if restore_from is not None:
            ax.axvline(restore_from - 0.5, color=_COND_COLORS["restore"], ls="-.", lw=0.8, alpha=0.6)
            handles.append(Line2D([], [], color=_COND_COLORS["restore"], ls="-.", lw=0.8,
                                  label=f"rotations restored from layer {restore_from}"))
        handles += [Line2D([], [], color="0.2", ls="-", label="retrained probe: decodable at all"),
                    Line2D([], [], color="0.2", ls="--", label="original probe: readable by it")]
        ax.set_title(f"{axis} position probe", fontsize=10)
        ax.set_xlabel("layer")
        ax.set_ylim(0.0, 1.02)
        if layers:
            ax.set_xticks(layers)
        ax.grid(alpha=0.25)
        ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    axes[0].set_ylabel("probe test accuracy")
    sub = f", restored from R={restore_from}" if restore_from is not None else ""
    fig.suptitle(mathtext_safe(f"{r.model}: RoPE axis removal ({r.site}{sub})"), fontsize=10)
    return save_figure(fig, path)


def plot_recovery(r: RopeAxisResult, path: str | Path) -> Path:
    """Rec(ℓ) vs layer, one curve per restore point R (its mean Rec and 95 % interval in the
    legend), one panel per axis, with 0 and 1 lines."""
    fig = new_figure(10.5, 4.2)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, axis in zip(axes, ("row", "col"), strict=True):
        per_r = r.recovery.get(axis) or {}
        for i, (R, entry) in enumerate(sorted(per_r.items(), key=lambda kv: _num(kv[0]))):
            ys = _series(entry.rec)
            xs = entry.layers
            if ys is None or not xs or len(xs) != len(ys):
                continue
            iv = entry.mean_rec_ci95
            span = f" [{_num(iv[0]):.2f}, {_num(iv[1]):.2f}]" if iv is not None and len(iv) == 2 else ""
            ax.plot(xs, ys, "-o", ms=3, color=CYCLE[i % len(CYCLE)],
                    label=f"R={R} (mean {_num(entry.mean_rec):.2f}{span})")
        ax.axhline(0.0, color="black", lw=0.9, ls="--")
        ax.axhline(1.0, color="black", lw=0.9, ls="--")
        ax.text(1.0, 1.0, " full recovery", transform=ax.get_yaxis_transform(), fontsize=7, va="bottom", ha="right")
        ax.text(1.0, 0.0, " none", transform=ax.get_yaxis_transform(), fontsize=7, va="bottom", ha="right")
        ax.set_title(f"{axis} information rebuilt after restoring rotations", fontsize=10)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.25)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, title="restore from", loc="best")
        else:
            ax.text(0.5, 0.5, f"no {axis} recovery data", ha="center", va="center", transform=ax.transAxes)
    axes[0].set_ylabel("Rec(ℓ) = (P_restore − P_off) / (P_clean − P_off)")
    fig.suptitle(mathtext_safe(f"{r.model}: recovery of removed position information"), fontsize=10)
    return save_figure(fig, path)


# ---------------------------------------------------------------- rope_heads
def _grid(m: Any, n_layers: int, n_heads: int, what: str) -> list[list[float]]:
    if not isinstance(m, list) or len(m) != n_layers or any(
            not isinstance(row, list) or len(row) != n_heads for row in m):
        raise VitposError(f"rope_heads[{what!r}] must be {n_layers}x{n_heads} (layers x heads); regenerate it")
    return [[_num(v) for v in row] for row in m]


def _row_of(layers: list, layer: Any) -> int | None:
    try:
        return layers.index(layer)
    except ValueError:
        return None


TOP_HEADS = 12


def _drop_bars(ax, result: RopeHeadsResult, layers: list, H: int, cis: Any) -> None:
    """The TOP_HEADS largest per-head drops with their 95 % intervals (error bars), primary head marked."""
    drops = _grid(result.drop_points, len(layers), H, "drop_points")
    if not (isinstance(cis, list) and len(cis) == len(layers) and all(
            isinstance(row, list) and len(row) == H and all(isinstance(iv, list) and len(iv) == 2 for iv in row)
            for row in cis)):
        raise VitposError(f"rope_heads['drop_ci95'] must be {len(layers)}x{H} intervals [lo, hi]; regenerate it")
    ranked = sorted(((drops[r][h], r, h) for r in range(len(layers)) for h in range(H)
                     if drops[r][h] == drops[r][h]), reverse=True)
    prim = result.primary_rebuilding_head
    keep = ranked[:TOP_HEADS]
    # the primary head is always drawn, in its rank order, whatever its rank
    keep += [x for x in ranked[TOP_HEADS:] if isinstance(prim, (list, tuple)) and [layers[x[1]], x[2]] == list(prim)]
    ranked = keep
    for i, (d, r, h) in enumerate(ranked):
        iv = cis[r][h]
        is_prim = isinstance(prim, (list, tuple)) and [layers[r], h] == list(prim)
        color = OKABE_ITO["vermillion"] if is_prim else "0.35"
        ax.errorbar(d, i, xerr=[[d - iv[0]], [iv[1] - d]], fmt="o", color=color, capsize=3, ms=5)
    ax.set_yticks(range(len(ranked)), [f"L{layers[r]} h{h}" for _, r, h in ranked], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0.0, color="0.6", lw=0.8)
    ax.set_xlabel("top-1 drop (points), 95 % interval")
    ax.set_title(f"largest {min(len(ranked), TOP_HEADS)} head drops (primary in vermillion)", fontsize=9)


def plot_rope_heads(r: RopeHeadsResult, path: str | Path) -> Path:
    """Heat maps layer x head of axis_index (-1 col .. +1 row), rebuild_score and drop_points,
    with the primary rebuilding head (star) and the largest-drop head (square) marked."""
    layers = list(r.layers)
    L, H = len(layers), r.num_heads
    panels = [("axis index S (+1 row, −1 col)", _grid(r.axis_index, L, H, "axis_index"),
               dict(cmap="PuOr_r", vmin=-1.0, vmax=1.0)),
              ("rebuilding score (fall in Rec; grey = not scored)", _grid(r.rebuild_score, L, H, "rebuild_score"),
               dict(cmap="viridis")),
              ("top-1 drop, rotations ablated (points)", _grid(r.drop_points, L, H, "drop_points"),
               dict(cmap="cividis"))]
    cis = r.drop_ci95
    fig = new_figure(4.0 * (len(panels) + (cis is not None)) + 0.6, max(3.8, 0.32 * L + 2.4))
    axes = fig.subplots(1, len(panels) + (cis is not None), squeeze=False)[0]
    axes, bars = (axes[:-1], axes[-1]) if cis is not None else (axes, None)
    marks = []
    for lh, marker, color, label in ((r.primary_rebuilding_head, "*", OKABE_ITO["vermillion"],
                                      "primary rebuilding head"),
                                     (r.largest_drop_head, "s", OKABE_ITO["sky"], "largest-drop head")):
        if lh is not None and len(lh) == 2 and (row := _row_of(layers, lh[0])) is not None:
            marks.append((row, int(lh[1]), marker, color, f"{label} (L{lh[0]} h{lh[1]})"))
    for ax, (title, grid, kw) in zip(axes, panels, strict=True):
        cmap = kw.pop("cmap")
        cm = mpl.colormaps[cmap].with_extremes(bad="0.85")
        im = ax.imshow(grid, cmap=cm, aspect="auto", interpolation="nearest", **kw)
        fig.colorbar(im, ax=ax, shrink=0.85)
        for row, h, marker, color, label in marks:
            ax.plot(h, row, marker, ms=13 if marker == "*" else 15, mfc="none" if marker == "s" else color,
                    mec=color if marker == "s" else "black", mew=2.0 if marker == "s" else 0.8, label=label)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("head")
        ax.set_xticks(range(H))
        ax.set_yticks(range(L), [str(layer) for layer in layers])
    axes[0].set_ylabel("layer")
    if marks:
        fig.legend(*axes[-1].get_legend_handles_labels(), fontsize=8, loc="outside lower center", ncol=len(marks))
    if cis is not None:
        _drop_bars(bars, r, layers, H, cis)
    fig.suptitle(mathtext_safe(f"{r.model}: per-head RoPE roles (axis {r.axis}, restore from {r.restore_from}; "
                               f"baseline top-1 {_pct(r.baseline_top1)})"), fontsize=10)
    return save_figure(fig, path)
