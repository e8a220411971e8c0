"""C1 (APE): sparse autoencoders recover causal row- and column-specific features."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vitpos.claims import text as tx
from vitpos.claims.base import Condition, Headline, ModelClaim, RuleClaim
from vitpos.claims.inputs import ClaimInputs, SAEReading
from vitpos.claims.intervals import (
    Interval,
    Outcome,
    all_of,
    as_list,
    at_least,
    bounds,
    exceeds,
    known,
    measured_at_least,
    outcome,
)
from vitpos.claims.layers import AtLayer, layer_reader, over_curve
from vitpos.claims.rules import FACTORS, POINTS, Threshold, Thresholds
from vitpos.claims.verdict import Number
from vitpos.results.sae_layers import PLAUSIBLE, LayerPoint
from vitpos.results.sae_run import AblationEffect, PooledEffect, RemovalControl

AXES = ("row", "col")
PLAUSIBLE_SWEEP = (0.01, PLAUSIBLE, 0.1, 0.2, 0.3)  # the plausible-layer share's sensitivity range (C1 and C2)

THRESHOLDS = (
    Threshold(name="C1.selective", claim="C1", value=0.6, unit="fraction",
              meaning="selectivity of each set's removal (own-axis probe drop / both drops) at least this",
              sweep=(0.5, 0.6, 0.7, 0.8, 0.9, 0.95)),
    Threshold(name="C1.min_probe_drop", claim="C1", value=5.0, unit="points",
              meaning="each set's removal lowers its own axis' downstream probe accuracy by at least this",
              sweep=POINTS),
    Threshold(name="C1.control_factor", claim="C1", value=2.0, unit="x",
              meaning="... and by more than this times its matched random-latent removal does", sweep=FACTORS),
    Threshold(name="C1.min_top1_drop", claim="C1", value=5.0, unit="points",
              meaning="each set's removal lowers top-1 by at least this (the features are used by the model)",
              sweep=POINTS),
    Threshold(name="C1.plausible_layer", claim="C1", value=PLAUSIBLE, unit="fraction",
              meaning="with the layer sweep (sae_layers): a layer chosen as the largest all-positional drop in at "
              "least this share of the bootstrap resamples is plausible; C1 must hold at every plausible layer",
              sweep=PLAUSIBLE_SWEEP, needs="sae_layers"),
)

RULE = """  C1 (APE)  >= 1 row and >= 1 col SAE feature, and for each set (row, col) removing it at the
            SAE's site is (each number the mean over the sae stage's SAE training seeds,
            sae.claim_seeds: every seed's SAE types its own latents and removes its own sets;
            intervals: a hierarchical bootstrap, seeds then held-out images within each seed; the
            claim must hold on this pooled interval, each seed's value is reported beside it, not
            required; one seed: the paired bootstrap over images)
            (a) axis-selective downstream: selectivity >= C1.selective;
            (b) large: the own-axis probe drop (points, mean over later layers) >= C1.min_probe_drop;
            (c) above its control: that drop > C1.control_factor x the own-axis drop of a matched
                random-latent removal (as many live non-positional latents, matched on RMS code:
                the size of what removing them subtracts); no control measured: undecided;
            (d) used by the model: top-1 drops by >= C1.min_top1_drop points (no top-1, e.g. a
                headless model without a head: undecided).
            The control's top-1 drop and the drops per class group are reported beside the rule
            (removing content latents moves the label of a spatial task, so it is no null there).
            Where the layer sweep ran (sae_layers: an SAE and this rule at every layer), the model's
            result is this rule read over the plausible layers (chosen as the largest all-positional
            drop in >= C1.plausible_layer of the bootstrap resamples over half A of the sweep's
            permutation images; the permutation numbers read there come from the other half, B, so
            the layer is not chosen on the outcome read): holds when it holds at every one, fails
            when it fails at all, else inconclusive; the single SAE layer's reading (the sae
            stage's) is reported beside it."""


Effect = AblationEffect | PooledEffect  # one SAE's removal, or the removal pooled over SAE seeds (issue 48)


def _effects(sae: SAEReading) -> tuple[dict[str, Effect | None], dict[str, Effect | None]]:
    """Each set's removal and its matched control as the rule reads them: pooled over the SAE seeds where
    there are several (`seed_pool`), else the one SAE's."""
    pool, causal = sae.seed_pool, sae.causal
    if pool is not None:
        return {k: pool.effect(k) for k in AXES}, {k: pool.control(k) for k in AXES}
    return ({k: None if causal is None else causal.effect(k) for k in AXES},
            {k: None if causal is None else causal.control(k) for k in AXES})


def _own_drop(eff: Effect | None, k: str) -> tuple[float | None, list[float] | None]:
    """A removal's own-axis probe drop (a fraction) and its interval."""
    if eff is None:
        return None, None
    return (eff.row_drop, eff.row_drop_ci95) if k == "row" else (eff.col_drop, eff.col_drop_ci95)


@dataclass(frozen=True)
class View:
    """What C1's conditions read of one SAE, per axis (intervals in the rule's units)."""

    sae: SAEReading
    selectivity: dict[str, Interval | None]
    own: dict[str, Interval | None]  # own-axis probe drop, points
    control: dict[str, Interval | None]  # the matched random removal's own-axis drop, points
    top1: dict[str, Interval | None]  # top-1 drop, points

    @classmethod
    def of(cls, sae: SAEReading) -> View:
        eff, ctl = _effects(sae)
        sel = {k: None if (e := eff[k]) is None or e.selectivity is None else bounds(e.selectivity, e.selectivity_ci95)
               for k in AXES}
        return cls(sae, sel, {k: tx.pts_iv(*_own_drop(eff[k], k)) for k in AXES},
                   {k: tx.pts_iv(*_own_drop(ctl[k], k)) for k in AXES},
                   {k: None if (e := eff[k]) is None else bounds(e.top1_drop, e.top1_drop_ci95) for k in AXES})


def _per_axis(name: str, ivs: dict[str, Interval | None], test: Callable[[Interval | None, float], Outcome],
              threshold: str, t: Thresholds) -> tuple[Outcome, dict[str, Number]]:
    """A condition read on the row and the col set: holds when it holds on both."""
    nums: dict[str, Number] = {threshold: t[threshold], **{f"{k}_{name}": as_list(ivs[k]) for k in AXES}}
    return all_of(*(test(ivs[k], t[threshold]) for k in AXES)), nums


def _above_control(v: View, t: Thresholds) -> tuple[Outcome, dict[str, Number]]:
    """Each set's own-axis probe drop exceeds C1.control_factor x its matched random removal's (a
    missing drop is false, a missing control undecided)."""
    factor = t["C1.control_factor"]
    nums: dict[str, Number] = {"C1.control_factor": factor}
    for k in AXES:
        nums[f"{k}_probe_drop"], nums[f"{k}_control_probe_drop"] = as_list(v.own[k]), as_list(v.control[k])
    return all_of(*(exceeds(v.own[k], v.control[k], factor) for k in AXES)), nums


CONDITIONS: tuple[Condition[View], ...] = (
    Condition("feature_sets", "its SAE has >= 1 row and >= 1 col feature",
              lambda v, t: (known(v.sae.n_row_features > 0 and v.sae.n_col_features > 0),
                            {"n_row": v.sae.n_row_features, "n_col": v.sae.n_col_features}), precondition=True),
    Condition("selective", "each set's removal is axis-selective (>= C1.selective)",
              lambda v, t: _per_axis("selectivity", v.selectivity, at_least, "C1.selective", t)),
    Condition("probe_drop", "each set's removal lowers its own-axis probe by >= C1.min_probe_drop points",
              lambda v, t: _per_axis("probe_drop", v.own, at_least, "C1.min_probe_drop", t)),
    Condition("above_control", "... by more than C1.control_factor x its matched random-latent removal",
              _above_control),
    Condition("top1_drop", "each set's removal lowers top-1 by >= C1.min_top1_drop points (not measured: undecided)",
              lambda v, t: _per_axis("top1_drop", v.top1, measured_at_least, "C1.min_top1_drop", t)),
)


def _per_seed(pool_eff: PooledEffect | None, what: str, scale: float = 1.0) -> list[float | None] | None:
    """Each SAE seed's value of a pooled removal (`per_seed_<what>`), times `scale`."""
    if pool_eff is None:
        return None
    return [None if x is None else scale * x for x in getattr(pool_eff, f"per_seed_{what}")]


def _seed_text(pool_eff: PooledEffect | None, what: str, digits: int, scale: float = 1.0) -> str:
    vals = _per_seed(pool_eff, what, scale)
    return "" if vals is None else " (per SAE seed " + " / ".join(tx.f(x, digits) for x in vals) + ")"


def _removal_numbers(eff: Mapping[str, Effect | None], ctl: Mapping[str, Effect | None],
                     suffix: str) -> dict[str, Any]:
    """Each set's removal and its control as the summary records them, the keys ending in `suffix`: "" for
    the run seed's SAE alone (the keys results.json had before issue 48), "_pooled" for what the rule reads
    (pooled over the SAE seeds; the run seed's where there is one)."""
    nums: dict[str, Any] = {}
    for k in AXES:
        e, c = eff[k], ctl[k]
        own_k, ctl_k = tx.pts_iv(*_own_drop(e, k)), tx.pts_iv(*_own_drop(c, k))
        nums[f"{k}_selectivity{suffix}"] = None if e is None else e.selectivity
        nums[f"{k}_selectivity{suffix}_ci95"] = None if e is None else e.selectivity_ci95
        nums[f"{k}_probe_drop{suffix}"] = tx.pts(_own_drop(e, k)[0])
        nums[f"{k}_probe_drop{suffix}_ci95"] = None if own_k is None else list(own_k)
        nums[f"{k}_control_probe_drop{suffix}"] = tx.pts(_own_drop(c, k)[0])
        nums[f"{k}_control_probe_drop{suffix}_ci95"] = None if ctl_k is None else list(ctl_k)
        nums[f"{k}_top1_drop{suffix}"] = None if e is None else e.top1_drop
        nums[f"{k}_top1_drop{suffix}_ci95"] = None if e is None else e.top1_drop_ci95
        nums[f"{k}_control_top1_drop{suffix}"] = None if c is None else c.top1_drop
    return nums


def _describe(spec: str, v: View, t: Thresholds) -> tuple[dict[str, Any], str]:
    sae = v.sae
    causal = sae.causal
    eff, ctl = _effects(sae)  # what the rule reads: pooled over the SAE seeds where there are several
    # the run seed's own removals (its SAE is the one the sae stage always trained): the keys as before issue 48,
    # and what is reported of it alone (per class group, edit sizes, the control's note)
    eff0: dict[str, Effect | None] = {k: None if causal is None else causal.effect(k) for k in AXES}
    ctl0: dict[str, Effect | None] = {k: None if causal is None else causal.control(k) for k in AXES}
    pool = sae.seed_pool
    pe = {k: None if pool is None else pool.effect(k) for k in AXES}
    pc = {k: None if pool is None else pool.control(k) for k in AXES}
    sel = {k: None if (e := eff[k]) is None else e.selectivity for k in AXES}
    ci = {k: None if (e := eff[k]) is None else e.selectivity_ci95 for k in AXES}
    iv = {k: bounds(sel[k], ci[k]) if sel[k] is not None else None for k in AXES}
    own, own_ctl, top1 = v.own, v.control, v.top1
    null = sae.eta2_null
    nums: dict[str, Any] = {"layer": sae.layer, "n_row": sae.n_row_features, "n_col": sae.n_col_features,
                            "fvu": sae.fvu, **_removal_numbers(eff0, ctl0, ""),
                            **_removal_numbers(eff, ctl, "_pooled")}
    for k in AXES:
        e0, c0 = eff0[k], ctl0[k]
        nums[f"{k}_top1_drop_per_group"] = None if not isinstance(e0, AblationEffect) else e0.per_group_drop
        nums[f"{k}_edit_norm"] = None if not isinstance(e0, AblationEffect) else e0.edit_norm
        nums[f"{k}_control_edit_norm"] = None if not isinstance(c0, AblationEffect) else c0.edit_norm
        nums[f"{k}_control_note"] = None if not isinstance(c0, RemovalControl) else c0.note
        if pool is not None:  # each SAE seed's own value beside the pooled one (reported, not required)
            nums[f"{k}_selectivity_per_sae_seed"] = _per_seed(pe[k], "selectivity")
            nums[f"{k}_probe_drop_per_sae_seed"] = _per_seed(pe[k], f"{k}_drop", 100.0)
            nums[f"{k}_control_probe_drop_per_sae_seed"] = _per_seed(pc[k], f"{k}_drop", 100.0)
            nums[f"{k}_top1_drop_per_sae_seed"] = _per_seed(pe[k], "top1_drop")
    nums["n_sae_seeds"] = 1 if pool is None else len(pool.seeds)
    nums["sae_seeds"] = None if pool is None else list(pool.seeds)
    nums["interval_sources"] = ["images"] if pool is None else list(pool.interval_sources)
    if pool is not None:
        nums["n_row_per_sae_seed"] = [sae.n_row_features, *(r.n_row_features for r in pool.runs)]
        nums["n_col_per_sae_seed"] = [sae.n_col_features, *(r.n_col_features for r in pool.runs)]
    nums["eta2_null_thresholds"] = None if null is None else null.null_thresholds.model_dump(mode="json")
    nums["eta2_thresholds_above_null"] = None if null is None else null.used_above_null

    def axis(k: str) -> str:
        return (f"{k} set: selectivity {tx.f(sel[k])}{tx.iv(iv[k])}{_seed_text(pe[k], 'selectivity', 2)}, {k}-probe "
                f"drop {tx.f(nums[f'{k}_probe_drop_pooled'], 1)}{tx.iv(own[k], 1)}"
                f"{_seed_text(pe[k], f'{k}_drop', 1, 100.0)} pts vs control "
                f"{tx.f(nums[f'{k}_control_probe_drop_pooled'], 1)}{tx.iv(own_ctl[k], 1)}, top-1 drop "
                f"{tx.f(nums[f'{k}_top1_drop_pooled'], 1)}{tx.iv(top1[k], 1)} pts (control "
                f"{tx.f(nums[f'{k}_control_top1_drop_pooled'], 1)})")

    where = f"L{sae.layer}" + ("" if sae.site == "resid_post" else f" {sae.site}")  # the embedding: L0 resid_pre
    seeds = ""
    if pool is not None:
        counts = zip(pool.seeds, nums["n_row_per_sae_seed"], nums["n_col_per_sae_seed"], strict=True)
        seeds = (f"; removals pooled over {len(pool.seeds)} SAE seeds ("
                 + ", ".join(f"seed {sd}: {r} row / {c} col" for sd, r, c in counts)
                 + "), intervals over SAE seeds x images")
    return nums, (f"{spec}: {where} SAE (FVU {sae.fvu:.3f}) has {sae.n_row_features} row / "
                  f"{sae.n_col_features} col features{seeds}; {axis('row')}; {axis('col')} (needs selectivity >= "
                  f"{t['C1.selective']:g}, probe drop >= {t['C1.min_probe_drop']:g} pts and > "
                  f"{t['C1.control_factor']:g}x its control, top-1 drop >= {t['C1.min_top1_drop']:g} pts)")


class C1(RuleClaim[View]):
    id = "C1"
    text = "APE: sparse autoencoders recover causal row- and column-specific features."
    scheme = "ape"
    rule = RULE
    thresholds = THRESHOLDS
    rule_conditions = CONDITIONS
    # the parts are the pooled selectivities the rule reads (issue 48; one SAE seed: the run seed's own)
    headline = Headline(number="min_selectivity", label="smaller of the row and col sets' causal selectivity",
                        unit="fraction", parts=("row_selectivity_pooled", "col_selectivity_pooled"), how="min",
                        range=(-1.0, 1.0), threshold="C1.selective",
                        legacy_parts=("row_selectivity", "col_selectivity"))

    def view(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs]) -> View | None:
        return None if model.sae is None else View.of(model.sae)

    def describe(self, spec: str, x: View, t: Thresholds) -> tuple[dict[str, Any], str]:
        return _describe(spec, x, t)

    def at(self, spec: str, sae: SAEReading, t: Thresholds | None = None) -> ModelClaim:
        """C1 of one SAE (the sae stage's, or one layer's of the sweep)."""
        return self.read_view(spec, View.of(sae), self.defaults() if t is None else t)

    def at_layer(self, spec: str, p: LayerPoint, t: Thresholds | None = None) -> ModelClaim:
        """C1 at one swept layer, from the typed results measured there (a point written without them:
        the result the sweep recorded then)."""
        if p.sae is not None:
            return self.at(spec, p.sae, t)
        return ModelClaim(outcome(p.c1), dict(p.c1_numbers))

    def _layer(self, spec: str, t: Thresholds) -> AtLayer:
        return layer_reader(self.at_layer, spec, t)

    def read(self, spec: str, model: ClaimInputs, models: Mapping[str, ClaimInputs],
             t: Thresholds) -> ModelClaim | None:
        """Over the layer sweep where it ran, else at the sae stage's layer (None: neither ran)."""
        single = None if model.sae is None else self.at(spec, model.sae, t)
        if model.sae_layers is None:
            return single
        return over_curve(spec, single, model.sae_layers, self._layer(spec, t), t, "C1.plausible_layer", "sae")

    def gist(self, t: Thresholds) -> str:
        return (f"removing the row (col) feature set is axis-selective (>= {t['C1.selective']:g}), lowers its own "
                f"probe by >= {t['C1.min_probe_drop']:g} pts and > {t['C1.control_factor']:g}x a matched random "
                f"removal, and top-1 by >= {t['C1.min_top1_drop']:g} pts")

    def headline_gap(self, numbers: Mapping[str, Any]) -> str | None:
        missing = [axis for axis in AXES if numbers.get(f"n_{axis}") == 0]
        return f"its SAE has no {' and no '.join(missing)} feature set to remove" if missing else None


CLAIM = C1()
