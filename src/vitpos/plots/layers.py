"""The sae_layers figure: C1 and C2 per SAE site (the embedding first) beside their controls, the position
budget, and each site's selection frequency."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitpos.plots.sweeps import CYCLE, OKABE_ITO, mathtext_safe, new_figure, save_figure
from vitpos.results.ape_permute import position_budget

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from vitpos.results.sae_layers import LayerPoint, SAELayersResult
    from vitpos.results.sae_run import AblationEffect


def _v(x: Any, scale: float = 1.0) -> float:
    return float("nan") if not isinstance(x, (int, float)) or isinstance(x, bool) else scale * float(x)


def _err(point: float, ci: Any, scale: float = 1.0) -> tuple[float, float]:
    """(down, up) of an error bar from a 95 % interval (0 where none was measured)."""
    if not isinstance(ci, (list, tuple)) or len(ci) != 2 or math.isnan(point):
        return 0.0, 0.0
    lo, hi = _v(ci[0], scale), _v(ci[1], scale)
    return (0.0 if math.isnan(lo) else max(point - lo, 0.0)), (0.0 if math.isnan(hi) else max(hi - point, 0.0))


def _line(ax: Axes, xs: list[int], pts: list[tuple[float, Any]], label: str, color: str, style: str = "-",
          scale: float = 1.0) -> None:
    ys = [_v(p, scale) for p, _ in pts]
    errs = [_err(y, ci, scale) for y, (_, ci) in zip(ys, pts, strict=True)]
    ax.errorbar(xs, ys, yerr=[[e[0] for e in errs], [e[1] for e in errs]], label=label, color=color, ls=style,
                marker="o", ms=4, capsize=3, lw=1.2)


def _own(eff: AblationEffect | None, axis: str) -> tuple[Any, Any]:
    """A removal's own-axis probe drop (a fraction) and its interval, in points."""
    if eff is None:
        return None, None
    drop, ci = (eff.row_drop, eff.row_drop_ci95) if axis == "row" else (eff.col_drop, eff.col_drop_ci95)
    return None if drop is None else 100 * drop, None if ci is None else [100 * ci[0], 100 * ci[1]]


def _c1(p: LayerPoint, axis: str) -> tuple[tuple[Any, Any], tuple[Any, Any], tuple[Any, Any]]:
    """(own-axis probe drop, its matched control's, selectivity), each (point, 95 % interval), as C1
    reads them: from the SAE's causal check at the layer (older sweeps: the numbers they recorded)."""
    causal = None if p.sae is None else p.sae.causal
    if causal is not None:
        eff, ctl = causal.effect(axis), causal.control(axis)
        sel = (None, None) if eff is None else (eff.selectivity, eff.selectivity_ci95)
        return _own(eff, axis), _own(ctl, axis), sel
    n = p.c1_numbers
    return ((n.get(f"{axis}_probe_drop"), n.get(f"{axis}_probe_drop_ci95")),
            (n.get(f"{axis}_control_probe_drop"), n.get(f"{axis}_control_probe_drop_ci95")),
            (n.get(f"{axis}_selectivity"), n.get(f"{axis}_selectivity_ci95")))


def plot_sae_layers(r: SAELayersResult, path: str | Path) -> Path:
    """Five panels over the swept sites (the embedding first, then each block output): C1's own-axis
    probe drops (row set on the row probe, col set on the col probe) beside their matched random
    removals; C1's selectivity; C2's all-positional top-1 drop beside its same-position swap null and
    its matched random control; the selection frequency of each site (plausible sites in colour); the
    position budget (each edit's share of the APE-table shuffle's effect). Error bars: the 95 % intervals."""
    xs = list(range(len(r.points)))
    keys = [p.key for p in r.points]
    fig = new_figure(11.0, 10.6)
    (a1, a2), (a3, a4), (a5, a6) = fig.subplots(3, 2, sharex=True)
    colors = {"row": OKABE_ITO["blue"], "col": OKABE_ITO["orange"]}
    for axis in ("row", "col"):
        c1 = [_c1(p, axis) for p in r.points]
        _line(a1, xs, [c[0] for c in c1], f"{axis} set: {axis}-probe drop", colors[axis])
        _line(a1, xs, [c[1] for c in c1], f"{axis} set's matched random removal", colors[axis], "--")
        _line(a2, xs, [c[2] for c in c1], f"{axis} set", colors[axis])
    a1.set_ylabel("own-axis probe drop (points)")
    a1.set_title("C1: removing the row / col features", fontsize=10)
    a2.set_ylabel("selectivity own / (|row| + |col|)")
    a2.set_title("C1: axis selectivity", fontsize=10)
    variants = (("all_positional", "all positional", CYCLE[0], "-"),
                ("swap_all_positional", "same-position swap (null)", "0.45", "--"),
                ("random_all_positional", "matched random latents", "0.65", ":"))
    for name, label, color, style in variants:
        pts = []
        for p in r.points:
            v = None if p.permute is None else p.permute.variant(name)
            pts.append((None, None) if v is None else (v.drop_points, v.drop_ci95))
        _line(a3, xs, pts, label, color, style)
    a3.set_ylabel("top-1 drop (points)")
    a3.set_title("C2: permuting the positional features", fontsize=10)
    plaus = set(r.plausible_sites)
    a4.bar(xs, [p.selection_frequency for p in r.points], color=[CYCLE[2] if k in plaus else "0.75" for k in keys],
           edgecolor="black", linewidth=0.6)
    a4.set_ylim(0, 1)
    a4.set_ylabel("selection frequency")
    over = "images" if r.held_out is None else f"half A's {len(r.held_out.selection)} images"
    a4.set_title(f"how often a site has the largest all-positional drop\n(bootstrap over {over}; colour: plausible)",
                 fontsize=10)
    budgets = (("all_positional", "all positional", CYCLE[0], "-"), ("row_only", "row set", colors["row"], "--"),
               ("col_only", "col set", colors["col"], "--"), ("subspace_positional", "positional subspace", "0.3", ":"),
               ("subspace_error", "SAE error in that subspace", "0.6", ":"))
    for name, label, color, style in budgets:
        shares = []
        for p in r.points:
            b = None if p.permute is None else position_budget(p.permute, name)
            shares.append((None, None) if b is None else (b.share, b.share_ci95))
        _line(a5, xs, shares, label, color, style, scale=100.0)
    a5.axhline(100, color="0.5", lw=0.8, ls="--")
    a5.set_ylabel("share of the APE-shuffle drop (%)")
    a5.set_title("position budget: drop(edit) / drop(APE-table shuffle)", fontsize=10)
    a6.axis("off")
    for ax in (a1, a2, a3, a4, a5):
        ax.axhline(0, color="black", lw=0.8)
        ax.grid(axis="y", alpha=0.3)
        ax.set_xticks(xs, keys)
    for ax in (a4, a5):
        ax.set_xlabel("SAE site (embed: resid_pre of block 0; L<n>: resid_post of block n)")
        ax.tick_params(labelbottom=True)
    for ax in (a1, a2, a3, a5):
        ax.legend(fontsize=7)
    # the claims' results over the curve are in the claims table; older sweeps recorded their own
    said = "" if r.c1 is None or r.c2 is None else f"C1 {r.c1.result}, C2 {r.c2.result} over "
    fig.suptitle(mathtext_safe(f"{r.model}: {said}the plausible sites {r.plausible_sites} ({r.layer_rule})"),
                 fontsize=9, color="0.3")
    return save_figure(fig, path)
