"""Figures as pure functions of typed results: each writes one PNG (atomically) and returns its path.

Experiments declare which of these they draw (the result types are imported for type checking
only; the headline figure, above the experiments, reads several), the report embeds the files.
No pyplot global state: every figure is a matplotlib `Figure` on Agg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy __getattr__ below returns, for type checkers
    from vitpos.plots.extrapolate import plot_extrapolate
    from vitpos.plots.features import plot_feature_maps
    from vitpos.plots.freq import plot_rope_freq
    from vitpos.plots.headline import plot_headline
    from vitpos.plots.layers import plot_sae_layers
    from vitpos.plots.prefix import plot_rope_prefix
    from vitpos.plots.probe import plot_probe_curves
    from vitpos.plots.sweeps import mathtext_safe, plot_ape_permute, plot_recovery, plot_rope_axis, plot_rope_heads

_EXPORTS = {
    "plot_ape_permute": "vitpos.plots.sweeps", "plot_rope_axis": "vitpos.plots.sweeps",
    "plot_recovery": "vitpos.plots.sweeps", "plot_rope_heads": "vitpos.plots.sweeps",
    "mathtext_safe": "vitpos.plots.sweeps",
    "plot_probe_curves": "vitpos.plots.probe", "plot_headline": "vitpos.plots.headline",
    "plot_feature_maps": "vitpos.plots.features", "plot_rope_prefix": "vitpos.plots.prefix",
    "plot_rope_freq": "vitpos.plots.freq",
    "plot_extrapolate": "vitpos.plots.extrapolate", "plot_sae_layers": "vitpos.plots.layers",
}
# A literal list (type checkers cannot evaluate sorted(_EXPORTS)); test_report checks it matches _EXPORTS.
__all__ = ["mathtext_safe", "plot_ape_permute", "plot_extrapolate", "plot_feature_maps", "plot_headline",
           "plot_probe_curves", "plot_recovery", "plot_rope_axis", "plot_rope_freq", "plot_rope_heads",
           "plot_rope_prefix", "plot_sae_layers"]


def __getattr__(name: str) -> Any:
    # lazy: importing an experiment does not pull in matplotlib until a figure is drawn
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vitpos.plots' has no attribute {name!r}")
