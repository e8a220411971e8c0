"""Figures and the self-contained HTML report, rendered from the experiment JSON documents."""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "render_report": "vitpos.report.html", "render_figures": "vitpos.report.html",
    "model_slug": "vitpos.report.html", "figure_key": "vitpos.report.html",
    "plot_ape_permute": "vitpos.report.plots", "plot_rope_axis": "vitpos.report.plots",
    "plot_recovery": "vitpos.report.plots", "plot_rope_heads": "vitpos.report.plots",
    "plot_probe_curves": "vitpos.report.probe_plot", "plot_feature_maps": "vitpos.report.feature_plot",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # lazy: importing vitpos.report does not pull in matplotlib
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vitpos.report' has no attribute {name!r}")
