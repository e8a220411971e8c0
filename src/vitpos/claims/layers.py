"""A claim read over the SAE layer sweep (sae_layers): the per-model rule at every swept layer, and
the model's result over the plausible layers (chosen as the largest all-positional drop in at least
the threshold's share of the bootstrap resamples): holds when it holds at every one, fails when it
fails at all of them, else inconclusive (the verdict would rest on an unstable choice of layer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vitpos.claims.base import ModelClaim
from vitpos.claims.intervals import FAILS, HOLDS, INCONCLUSIVE, Outcome
from vitpos.claims.rules import Thresholds
from vitpos.claims.verdict import ConditionReading, Number
from vitpos.results.sae_layers import LayerPoint, SAELayersResult

# the per-model rule at one swept layer: its outcome and its conditions' readings there
AtLayer = Callable[[LayerPoint], tuple[Outcome, tuple[ConditionReading, ...]]]


def layer_reader(at_layer: Callable[[str, LayerPoint, Thresholds], ModelClaim], spec: str, t: Thresholds) -> AtLayer:
    """A claim's reading at one swept layer (its `at_layer`) as `over_curve` takes it: result and conditions."""
    def at(p: LayerPoint) -> tuple[Outcome, tuple[ConditionReading, ...]]:
        r = at_layer(spec, p, t)
        return r.result, r.conditions
    return at


def plausible_layers(sweep: SAELayersResult, threshold: float) -> list[int]:
    """The swept layers chosen as the largest all-positional drop in >= threshold of the resamples."""
    return [p.layer for p in sweep.points if p.selection_frequency >= threshold]


def over_plausible(at: Sequence[str]) -> Outcome:
    """Holds when the rule holds at every plausible layer, fails when it fails at all (or none is
    plausible), else inconclusive."""
    return (HOLDS if at and all(r == HOLDS for r in at) else
            FAILS if not at or all(r == FAILS for r in at) else INCONCLUSIVE)


def over_curve(spec: str, single: ModelClaim | None, sweep: SAELayersResult, at_layer: AtLayer, t: Thresholds,
               threshold: str, stage: str) -> ModelClaim:
    """The claim read over the sweep's plausible layers (`at_layer`: its per-model rule at each;
    `threshold`: the rule set's plausible-layer share). The single-layer reading (`single`: the `stage`
    stage's) keeps its numbers and text beside it. The model's one condition is `plausible_layers`,
    which records every plausible layer's condition outcomes (`L<layer>.<condition>`)."""
    readings = {p.layer: at_layer(p) for p in sweep.points}
    per = {layer: r[0] for layer, r in readings.items()}
    plaus = plausible_layers(sweep, t[threshold])
    result = over_plausible([per[layer] for layer in plaus])
    freq = {p.layer: p.selection_frequency for p in sweep.points}
    nums: dict[str, Any] = {**(single.numbers if single is not None else {}),
                            "read_over": "the plausible layers of the sae_layers sweep",
                            "sweep_layers": list(sweep.layers), "plausible_layers": plaus,
                            "selection_frequency": {str(k): v for k, v in freq.items()},
                            "per_layer_result": {str(k): v for k, v in per.items()},
                            "selected_layer": sweep.selected_layer,
                            "single_layer": None if single is None else single.numbers.get("layer"),
                            "single_layer_result": None if single is None else single.result}
    where = ", ".join(f"L{layer} (selected in {freq[layer]:.0%}): {per[layer]}" for layer in plaus) or "none"
    others = ", ".join(f"L{k}: {v}" for k, v in per.items() if k not in plaus)
    text = (f"{spec}: {result} over the layer sweep ({sweep.layer_rule}), read at its plausible layers (chosen as "
            f"the largest all-positional drop in >= {t[threshold]:.0%} of the bootstrap resamples): "
            f"{where}" + (f"; other layers {others}" if others else "")
            + ("" if single is None else f". Single layer (the {stage} stage's, "
               f"{single.result}): {single.text.removeprefix(f'{spec}: ')}"))
    read: dict[str, Number] = {threshold: t[threshold], "plausible_layers": plaus}
    for layer in plaus:
        read.update({f"L{layer}.{c.name}": c.outcome for c in readings[layer][1]})
    return ModelClaim(result, nums, text, (ConditionReading(name="plausible_layers", outcome=result, numbers=read),))
