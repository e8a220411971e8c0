"""A claim read over the SAE layer sweep (sae_layers): the per-model rule at every swept site, and
the model's result over the plausible sites (chosen as the largest all-positional drop in at least
the threshold's share of the bootstrap resamples): holds when it holds at every one, fails when it
fails at all of them, else inconclusive (the verdict would rest on an unstable choice of site).
Sites are named by their key (`LayerPoint.key`): "embed" (resid_pre of block 0, swept since issue 47)
and "L<layer>" (a block output); the rule is the same at every site.

Held out (issue 47 item 4): the selection frequencies come from half A of the sweep's permutation images,
the numbers each site's rule reads from half B (`SAESweepResult.held_out`), so the site is not chosen on
the outcome the verdict reads; sweeps written before it chose and read on the same images, and the
numbers and text say which."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vitpos.claims.base import ModelClaim
from vitpos.claims.intervals import FAILS, HOLDS, INCONCLUSIVE, Outcome
from vitpos.claims.rules import Thresholds
from vitpos.claims.verdict import ConditionReading, Number
from vitpos.results.sae_layers import LayerPoint, SAELayersResult

# the per-model rule at one swept layer: its reading there (outcome, numbers, conditions)
AtLayer = Callable[[LayerPoint], ModelClaim]


def layer_reader(at_layer: Callable[[str, LayerPoint, Thresholds], ModelClaim], spec: str, t: Thresholds) -> AtLayer:
    """A claim's reading at one swept layer (its `at_layer`) as `over_curve` takes it."""
    def at(p: LayerPoint) -> ModelClaim:
        return at_layer(spec, p, t)
    return at


def headline_site(sweep: SAELayersResult, plausible: Sequence[str]) -> str | None:
    """The site whose numbers a claim read over the sweep reports: the selected site (largest all-positional
    drop on the selecting images, half A) where it is plausible, else the first plausible site; with none
    plausible, the selected site (None: no site has a drop)."""
    return plausible[0] if plausible and sweep.selected_site not in plausible else sweep.selected_site


def plausible_sites(sweep: SAELayersResult, threshold: float) -> list[str]:
    """The swept sites' keys chosen as the largest all-positional drop in >= threshold of the resamples (of
    half A's images: `LayerPoint.selection_frequency`)."""
    return [p.key for p in sweep.points if p.selection_frequency >= threshold]


def over_plausible(at: Sequence[str]) -> Outcome:
    """Holds when the rule holds at every plausible layer, fails when it fails at all (or none is
    plausible), else inconclusive."""
    return (HOLDS if at and all(r == HOLDS for r in at) else
            FAILS if not at or all(r == FAILS for r in at) else INCONCLUSIVE)


def over_curve(spec: str, single: ModelClaim | None, sweep: SAELayersResult, at_layer: AtLayer, t: Thresholds,
               threshold: str, stage: str) -> ModelClaim:
    """The claim read over the sweep's plausible layers (`at_layer`: its per-model rule at each;
    `threshold`: the rule set's plausible-layer share). The single-layer reading (`single`: the `stage`
    stage's) keeps its text beside it and its numbers under `single_layer_numbers`; the numbers (and so the
    headline) are those read at `headline_site` (a plausible site), so the headline is a number the verdict
    read, not the single layer's. The model's one condition is `plausible_layers`,
    which records every plausible site's condition outcomes (`<key>.<condition>`: `embed.<condition>`,
    `L<layer>.<condition>`)."""
    readings = {p.key: at_layer(p) for p in sweep.points}
    per = {key: r.result for key, r in readings.items()}
    plaus = plausible_sites(sweep, t[threshold])
    result = over_plausible([per[key] for key in plaus])
    freq = {p.key: p.selection_frequency for p in sweep.points}
    site = headline_site(sweep, plaus)
    single_nums = single.numbers if single is not None else {}
    nums: dict[str, Any] = {**(readings[site].numbers if site is not None else single_nums),
                            "headline_site": site, "single_layer_numbers": dict(single_nums),
                            "read_over": "the plausible sites of the sae_layers sweep",
                            "site_selection": sweep.selection_said(rule=True),
                            "selection_images": None if sweep.held_out is None else len(sweep.held_out.selection),
                            "verdict_images": None if sweep.held_out is None else len(sweep.held_out.verdict),
                            "sweep_layers": list(sweep.layers), "sweep_sites": sweep.sites, "plausible_sites": plaus,
                            "selection_frequency": dict(freq),
                            "per_site_result": dict(per),
                            "selected_site": sweep.selected_site,
                            "single_layer": None if single is None else single.numbers.get("layer"),
                            "single_layer_result": None if single is None else single.result}
    where = ", ".join(f"{key} (selected in {freq[key]:.0%}): {per[key]}" for key in plaus) or "none"
    others = ", ".join(f"{k}: {v}" for k, v in per.items() if k not in plaus)
    text = (f"{spec}: {result} over the layer sweep ({sweep.layer_rule}), read at its plausible sites (chosen as "
            f"the largest all-positional drop in >= {t[threshold]:.0%} of the bootstrap resamples; "
            f"{sweep.selection_said()}): "
            f"{where}" + (f"; other layers {others}" if others else "")
            + ("" if single is None else f". Single layer (the {stage} stage's, "
               f"{single.result}): {single.text.removeprefix(f'{spec}: ')}"))
    read: dict[str, Number] = {threshold: t[threshold], "plausible_sites": plaus}
    for key in plaus:
        read.update({f"{key}.{c.name}": c.outcome for c in readings[key].conditions})
    return ModelClaim(result, nums, text, (ConditionReading(name="plausible_layers", outcome=result, numbers=read),))
