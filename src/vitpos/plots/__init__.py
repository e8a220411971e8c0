"""Figures as pure functions of typed results: each writes one PNG (atomically) and returns its path.

Plots read only the results layer (`vitpos.results`): experiments declare which of these they draw,
the headline figure reads several experiments' results, the report embeds the files. No pyplot
global state: every figure is a matplotlib `Figure` on Agg.
"""

from __future__ import annotations

from vitpos.plots.extrapolate import plot_extrapolate
from vitpos.plots.features import plot_feature_maps
from vitpos.plots.freq import plot_rope_freq
from vitpos.plots.headline import plot_headline
from vitpos.plots.layers import plot_sae_layers
from vitpos.plots.prefix import plot_rope_prefix
from vitpos.plots.probe import plot_probe_curves
from vitpos.plots.sweeps import mathtext_safe, plot_ape_permute, plot_recovery, plot_rope_axis, plot_rope_heads

__all__ = ["mathtext_safe", "plot_ape_permute", "plot_extrapolate", "plot_feature_maps", "plot_headline",
           "plot_probe_curves", "plot_recovery", "plot_rope_axis", "plot_rope_freq", "plot_rope_heads",
           "plot_rope_prefix", "plot_sae_layers"]
