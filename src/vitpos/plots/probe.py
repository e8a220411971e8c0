"""Plot of linear position-probe accuracy per layer (the probe.json payload)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitpos.errors import VitposError
from vitpos.io import atomic_path

_REQUIRED = ("layers", "row_acc", "col_acc", "chance_row", "chance_col")
_COLORS = {"row": "tab:blue", "col": "tab:orange"}


def _check(results: Any, what: str) -> dict:
    if not isinstance(results, dict):
        raise VitposError(f"{what} must be a dict in the probe.json layout, got {type(results).__name__}")
    missing = [k for k in _REQUIRED if k not in results]
    if missing:
        raise VitposError(f"{what} lacks keys {missing}; pass the dict from LayerProbeResults.to_json()")
    n = len(results["layers"])
    for key in ("row_acc", "col_acc", "row_control_acc", "col_control_acc"):
        if key in results and results[key] is not None and len(results[key]) != n:
            raise VitposError(f"{what}[{key!r}] has {len(results[key])} values for {n} layers; regenerate probe.json")
    return results


def _series(results: dict, key: str) -> list[float] | None:
    """The values of `key`, or None when absent or all null (e.g. control disabled)."""
    vals = results.get(key)
    if vals is None or all(v is None for v in vals):
        return None
    return [float("nan") if v is None else float(v) for v in vals]


def _required_series(results: dict, key: str, what: str) -> list[float]:
    vals = _series(results, key)
    if vals is None:
        raise VitposError(f"{what}[{key!r}] has no values; regenerate probe.json")
    return vals


def plot_probe_curves(
    results_json: dict,
    path: str | Path,
    title: str | None = None,
    content_baseline: dict | None = None,
) -> Path:
    """Row and column probe test accuracy vs layer, saved as PNG at `path` (atomically).

    Solid: probe accuracy; faint: control-task accuracy; dashed: chance (1/H, 1/W);
    dotted: `content_baseline` (same keys, e.g. probes on position-scrambled inputs).
    """
    # Figure without pyplot: no global backend state, renders with Agg.
    from matplotlib.figure import Figure

    res = _check(results_json, "results_json")
    base = _check(content_baseline, "content_baseline") if content_baseline is not None else None

    fig = Figure(figsize=(6.4, 4.0), dpi=120)
    ax = fig.add_subplot(1, 1, 1)
    layers = list(res["layers"])
    for axis in ("row", "col"):
        color = _COLORS[axis]
        ax.plot(layers, _required_series(res, f"{axis}_acc", "results_json"), "-o", color=color, ms=3,
                label=f"{axis} probe")
        ctrl = _series(res, f"{axis}_control_acc")
        if ctrl is not None:
            ax.plot(layers, ctrl, "-", color=color, alpha=0.3, lw=1, label=f"{axis} control")
        if base is not None:
            base_acc = _required_series(base, f"{axis}_acc", "content_baseline")
            ax.plot(list(base["layers"]), base_acc, ":", color=color, lw=1.5, label=f"{axis} content baseline")
        ax.axhline(float(res[f"chance_{axis}"]), ls="--", color=color, lw=0.8, alpha=0.7,
                   label=f"chance {axis}")
    ax.set_xlabel("layer")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.0, 1.02)
    if layers:
        ax.set_xticks(layers)
    site = res.get("site")
    ax.set_title(title if title is not None else (f"position probes ({site})" if site else "position probes"))
    ax.grid(alpha=0.25)
    ax.legend(fontsize=7, loc="best", ncol=2)
    fig.tight_layout()

    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path
