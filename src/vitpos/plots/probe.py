"""Plot of linear position-probe accuracy per layer (a typed probe result, one site)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vitpos.errors import VitposError
from vitpos.io import atomic_path

if TYPE_CHECKING:
    from vitpos.results.probe import ProbeSiteResult

_COLORS = {"row": "tab:blue", "col": "tab:orange"}


def _series(vals: Sequence[float | None]) -> list[float] | None:
    """The values as floats (None -> NaN), or None when all are null (e.g. control disabled)."""
    if all(v is None for v in vals):
        return None
    return [float("nan") if v is None else float(v) for v in vals]


def plot_probe_curves(result: ProbeSiteResult, path: str | Path, title: str | None = None,
                      content_baseline: bool = True) -> Path:
    """Row and column probe test accuracy vs layer, saved as PNG at `path` (atomically).

    Solid: probe accuracy; faint: control-task accuracy; dashed: chance (1/H, 1/W); dotted: the
    content baseline (probes on the patch tokens without their positional input; `content_baseline`).
    """
    # Figure without pyplot: no global backend state, renders with Agg.
    from matplotlib.figure import Figure

    layers = list(result.layers)
    n = len(layers)
    curves = {"row": (result.row_acc, result.row_control_acc, result.content_baseline.row_acc, result.chance_row),
              "col": (result.col_acc, result.col_control_acc, result.content_baseline.col_acc, result.chance_col)}
    for axis, (acc, ctrl, _, _) in curves.items():
        for what, vals in ((f"{axis}_acc", acc), (f"{axis}_control_acc", ctrl)):
            if len(vals) != n:
                raise VitposError(f"the probe result's {what} has {len(vals)} values for {n} layers; rerun the probe")

    fig = Figure(figsize=(6.4, 4.0), dpi=120)
    ax = fig.add_subplot(1, 1, 1)
    for axis, (acc, ctrl, base, chance) in curves.items():
        color = _COLORS[axis]
        series = _series(acc)
        if series is None:
            raise VitposError(f"the probe result's {axis}_acc has no values; rerun the probe")
        ax.plot(layers, series, "-o", color=color, ms=3, label=f"{axis} probe")
        ctrl_series = _series(ctrl)
        if ctrl_series is not None:
            ax.plot(layers, ctrl_series, "-", color=color, alpha=0.3, lw=1, label=f"{axis} control")
        if content_baseline:
            ax.plot(layers, [float(base)] * n, ":", color=color, lw=1.5, label=f"{axis} content baseline")
        ax.axhline(float(chance), ls="--", color=color, lw=0.8, alpha=0.7, label=f"chance {axis}")
    ax.set_xlabel("layer")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.0, 1.02)
    if layers:
        ax.set_xticks(layers)
    site = result.site
    ax.set_title(title if title is not None else (f"position probes ({site})" if site else "position probes"))
    ax.grid(alpha=0.25)
    ax.legend(fontsize=7, loc="best", ncol=2)
    fig.tight_layout()

    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path
