"""Figures as pure functions of result documents: each writes one PNG (atomically) and returns its path.

Below the experiments in the layering: experiments declare which of these they draw, the
report embeds the files. No pyplot global state: every figure is a matplotlib `Figure` on Agg.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "plot_ape_permute": "vitpos.plots.sweeps", "plot_rope_axis": "vitpos.plots.sweeps",
    "plot_recovery": "vitpos.plots.sweeps", "plot_rope_heads": "vitpos.plots.sweeps",
    "mathtext_safe": "vitpos.plots.sweeps",
    "plot_probe_curves": "vitpos.plots.probe", "plot_headline": "vitpos.plots.headline",
    "plot_feature_maps": "vitpos.plots.features",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # lazy: importing an experiment does not pull in matplotlib until a figure is drawn
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vitpos.plots' has no attribute {name!r}")
