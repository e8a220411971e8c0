"""The study's claims C1-C5, each with measured numbers and a verdict computed from them.

Verdict rules: the data below (`RULES_PREAMBLE`, `CLAIM_RULES`, one text per claim, and
`AGGREGATION`), recorded with every summary (`rules_text`) and shown in the report.

Claims read the experiments' typed results (`ClaimInputs`: a `ModelEntry`'s sae, ape_permute,
rope_axis, rope_heads, probe and eval results), and the summary they give is typed too: per claim
a verdict, one sentence, the headline number per model family with its interval and the seeds it
holds on (`FamilyHeadline`), and the per-model numbers and text that fold below it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from vitpos.analysis.stats import seed_interval
from vitpos.results.ape_permute import ApePermuteResult, VariantResult
from vitpos.results.base import Result, Skipped
from vitpos.results.common import MIN_GAP, ProbedCondition, Recovery
from vitpos.results.evaluation import EvalResult
from vitpos.results.probe import ProbeSiteResult
from vitpos.results.rope_axis import MIN_ABOVE_CHANCE as MIN_ABOVE_CHANCE  # C3's layer rule, with its statistic
from vitpos.results.rope_axis import RopeAxisResult, floored_kept, kept_fraction
from vitpos.results.rope_axis import median_recovery as _median_recovery
from vitpos.results.rope_heads import SPECIALISED as SPECIALISED  # |S| of an axis-specialised head
from vitpos.results.rope_heads import RopeHeadsResult, closest_rival
from vitpos.results.sae_layers import LayerPoint, SAELayersResult
from vitpos.results.sae_run import AblationEffect, GivenSAEResult, SAEResult
from vitpos.study.results import ClaimVerdict, FamilyHeadline, ModelEntry, SeedSummary, Summary
from vitpos.study.rules import RULES, sensitivity

SELECTIVE = RULES.values()["C1.selective"]
MIN_DROP = RULES.values()["C2.min_drop"]
CONTROL_FACTOR = RULES.values()["C2.null_factor"]
MIN_REMOVED = 0.7
MIN_KEPT = 0.7
MIN_HEAD_SHARE = 0.25  # C4: the primary rebuilding head explains at least this share of the recovery

CLAIM_TEXT = {
    "C1": "APE: sparse autoencoders recover causal row- and column-specific features.",
    "C2": "APE: permuting the positional features across patches drops top-1 by 24-31 points.",
    "C3": "RoPE: disabling the row (column) rotations removes decodable row (column) information independently.",
    "C4": "RoPE: once rotations are restored the information is partly rebuilt, in part by axis-specialised heads.",
    "C5": "RoPE: ablating the rotations of the primary rebuilding head reduces accuracy more than any other head.",
}


# --- the verdict rules, as data (thresholds are the constants above) -----------------------------
RULES_PREAMBLE = """(ours, since the study gives only its abstract; C1 and C2 read their thresholds from
the versioned rule set `study.rules.RULES` (named C1.x / C2.x below; the summary records its version
and hash, and each threshold's sensitivity curve), C3-C5 from module constants; every measurement
and control is defined in docs/methods.md):
  Each condition of a rule reads a 95 % interval [lo, hi] of its measurement (analysis/stats.py;
  a measurement without one counts as the interval [x, x]) and comes out true (the whole interval
  is on the rule's side of the threshold), false (the whole interval is on the other side) or
  undecided (the threshold lies inside the interval). Per model a claim `holds` when every
  condition is true, `fails` when any is false, and is `inconclusive` otherwise."""
CLAIM_RULES: dict[str, str] = {
    "C1": """  C1 (APE)  >= 1 row and >= 1 col SAE feature, and for each set (row, col) removing it at the
            SAE's site (intervals: paired bootstrap over the held-out images) is
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
            drop in >= C1.plausible_layer of the bootstrap resamples over images): holds when it holds
            at every one, fails when it fails at all, else inconclusive; the single SAE layer's
            reading (the sae stage's) is reported beside it.""",
    "C2": """  C2 (APE)  permuting ALL positional features (row + col + mixed: every live latent with
            eta2_pos >= min_eta2_pos) drops top-1 (interval: paired bootstrap over images, seeds
            pooled) by >= C2.min_drop points, and the drop's interval lies above C2.null_factor x
            that of the same-position cross-image swap of the same set (another image's codes at
            the same patch: content moves, position stays, so it is null by construction for
            positional features); without that null the claim is inconclusive. Reported beside
            it, not in the rule: the matched random controls (count and mass, and edit size:
            not nulls on a spatial task), the crossed design (row features moved by whole
            columns, col features by whole rows: ~0 for real row / col features), each edit's
            norm, the drop per class group and as a fraction of the position gain (clean minus
            the `none` model's top-1 on the same data, where one ran), and whether the drop falls
            in the study's 24-31 (ImageNet's range: stated, not required). Where the layer sweep
            ran, read over its plausible layers as C1 (C2.plausible_layer), the ape_permute stage's
            single layer beside it.""",
    "C3": """  C3 (RoPE) removing an axis removes >= MIN_REMOVED of its decodability above each layer's
            content floor while the other axis keeps >= MIN_KEPT of its own, for both axes: the
            fractions mean over layers of (base - off) / (base - floor) (retrained probes, layers
            whose baseline is >= MIN_ABOVE_CHANCE above the floor), the floor of a layer = the same
            model's no_both accuracy there (no rotations: what content alone gives), never below
            chance; each fraction's interval (paired bootstrap over the probes' test images,
            rope_axis `removal_floored`) lies at or above its threshold, fails if one lies below;
            and a small MLP probe (rope_axis `readouts`) finds the axis removed too (its removed
            fraction's interval >= MIN_REMOVED). Kept above 100 % is reported as an interaction.
            Reported beside it: the fractions above chance, the floor from the matched `none`
            model's probes, and the relative-offset (Δrow, Δcol) read-outs. Results written before
            the floors read the fractions above chance.""",
    "C4": """  C4 (RoPE) recovery after restoring is partial, against a count-matched reference: for both
            axes the interval of the median over restore points R of the mean rebuilt share
            B(l) = 1 - (P_clean(l) - P_restore(l)) / (P_clean(R-1) - P_off(R-1)), l >= R (the share
            of the deficit at R that the restored layers close beyond what the same layers add in
            the clean model; paired bootstrap, rope_axis `median_rebuilt_share`) lies inside (0, 1),
            fails if it lies wholly at or below 0 or at or above 1; and the primary rebuilding head
            is specialised on the axis it rebuilds, where it rebuilds: its axis index S measured in
            the restore condition, signed to the axis whose recovery it carries (+ row, - col;
            `primary_axis_index_matched`, bootstrap over the attention images), lies at or above
            the null threshold (the 0.95 quantile of |S| with each head's rotary pairs relabelled
            at random, `axis_index_null_threshold`), fails if below; and it explains at least
            MIN_HEAD_SHARE of the recovery (its fall in Rec / Rec, paired bootstrap,
            `primary_recovery_share`). Results written before these fall back to median Rec inside
            (0, 1) and the clean-attention |S| >= 0.5. Reported beside the rule, not in it: median
            Rec, how often the primary head would be chosen again over image resamples
            (`selection_frequency`), the top-k heads' joint share with its interval, and whether
            mean-ablating head outputs ranks the same heads.""",
    "C5": """  C5 (RoPE) the primary rebuilding head has the largest top-1 drop of all heads: for every other
            head, the interval of drop(primary) - drop(head) (paired bootstrap over the same
            top-1 images, `primary_margin_ci95`) lies above 0; fails if one lies below 0.
            The verdict rests on the identity ablation (the head's rotations removed; numbers
            `ablation`); the same rule under the counterfactual ablations (rope_heads
            `c5_ablations`: swap, shift, jitter, rescale, mean output) is reported as
            `outcome_under_ablation`, not read by the verdict.""",
}
AGGREGATION = """Aggregation over the models of the claim's scheme: `supported` when it holds for every model,
`partly supported` when it holds for some but not all, `not supported` when it holds for none and
fails for at least one, `inconclusive` when it is inconclusive for every model. A claim is
`not applicable` where no model of its scheme ran. `numbers[model]` records `result` (holds /
fails / inconclusive) and `holds` (result == holds)."""


def rules_text() -> str:
    """The verdict rules as one text (what the summary records as `rules`)."""
    values = "\n".join(f"  {t.name} = {t.value:g} {t.unit} ({t.source}): {t.meaning}" for t in RULES.thresholds)
    return "\n".join([RULES_PREAMBLE, *CLAIM_RULES.values(), f"Rule set version {RULES.version} "
                      f"(study/rules.py, hash {RULES.digest()}):", values, AGGREGATION])


CLAIM_SCHEME = {"C1": "ape", "C2": "ape", "C3": "rope", "C4": "rope", "C5": "rope"}


def claim_scheme(cid: str) -> str:
    return CLAIM_SCHEME.get(cid, "")


Outcome = Literal["holds", "fails", "inconclusive"]
HOLDS: Outcome = "holds"
FAILS: Outcome = "fails"
INCONCLUSIVE: Outcome = "inconclusive"
Interval = tuple[float, float]


def bounds(point: Any, ci: Any = None) -> Interval | None:
    """A measurement's interval: its 95 % interval where one was measured, else [point, point];
    None where the measurement itself is missing."""
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
        return float(ci[0]), float(ci[1])
    if isinstance(point, (int, float)) and not isinstance(point, bool):
        return float(point), float(point)
    return None


def at_least(iv: Interval | None, threshold: float) -> Outcome:
    """x >= threshold: true if the whole interval is, false if none of it is; a missing measurement is false."""
    if iv is None:
        return FAILS
    return HOLDS if iv[0] >= threshold else (FAILS if iv[1] < threshold else INCONCLUSIVE)


def exceeds(iv: Interval | None, control: Interval | None, factor: float = 1.0) -> Outcome:
    """x > factor * max(control, 0) for every value of both intervals (true), for none (false), else
    undecided; a missing x is false, a missing control undecided (nothing to compare with)."""
    if iv is None:
        return FAILS
    if control is None:
        return INCONCLUSIVE
    if iv[0] > factor * max(control[1], 0.0):
        return HOLDS
    return FAILS if iv[1] <= factor * max(control[0], 0.0) else INCONCLUSIVE


def largest(iv: Interval | None, others: list[Interval]) -> Outcome:
    """x is the largest: its interval lies above every other's (true), below some other's (false)."""
    if iv is None:
        return FAILS
    if not others or iv[0] > max(o[1] for o in others):
        return HOLDS
    return FAILS if iv[1] < max(o[0] for o in others) else INCONCLUSIVE


def inside(iv: Interval | None, lo: float, hi: float) -> Outcome:
    """lo < x < hi: true if the whole interval is strictly inside, false if it lies wholly at or
    beyond one end, else undecided; a missing or undefined (NaN) measurement is false."""
    if iv is None or iv[0] != iv[0] or iv[1] != iv[1]:
        return FAILS
    if lo < iv[0] and iv[1] < hi:
        return HOLDS
    return FAILS if iv[1] <= lo or iv[0] >= hi else INCONCLUSIVE


def magnitude(iv: Interval | None) -> Interval | None:
    """The interval of |x| from that of x."""
    if iv is None:
        return None
    lo, hi = iv
    if lo >= 0:
        return lo, hi
    return (-hi, -lo) if hi <= 0 else (0.0, max(-lo, hi))


def all_positive(margins: list[Interval]) -> Outcome:
    """Every difference is > 0 (each interval above 0: true), some is < 0 (an interval below 0:
    false), else undecided. Requiring every interval at once is an intersection-union test, so
    `holds` needs no multiplicity correction; `fails` is read per comparison."""
    if any(m[1] < 0 for m in margins):
        return FAILS
    return HOLDS if all(m[0] > 0 for m in margins) else INCONCLUSIVE


def known(ok: bool) -> Outcome:
    """A condition decided on point values (no interval yet)."""
    return HOLDS if ok else FAILS


def all_of(*outcomes: Outcome) -> Outcome:
    if FAILS in outcomes:
        return FAILS
    return HOLDS if all(o == HOLDS for o in outcomes) else INCONCLUSIVE


def aggregate(results: list[Outcome]) -> str:
    """The claim's verdict over the models that ran it (see the module docstring)."""
    if not results:
        return "not applicable"
    n_hold = results.count(HOLDS)
    if n_hold == len(results):
        return "supported"
    if n_hold:
        return "partly supported"
    return "not supported" if FAILS in results else "inconclusive"




# --- what the claims read of one model -------------------------------------------------------------
SAEReading = SAEResult | GivenSAEResult  # a trained SAE's result, or what is measured of a given (planted) one


@dataclass(frozen=True)
class ClaimInputs:
    """The typed results the claims read of one model (None: not run, or skipped), and the model's
    scheme and data (which `none` model is its position-free match)."""

    sae: SAEReading | None = None
    ape_permute: ApePermuteResult | None = None
    rope_axis: RopeAxisResult | None = None
    rope_heads: RopeHeadsResult | None = None
    probe: ProbeSiteResult | None = None
    eval: EvalResult | None = None
    scheme: str | None = None
    data: str | None = None
    sae_layers: SAELayersResult | None = None  # the layer sweep: C1 and C2 are read over its plausible layers

    @classmethod
    def of(cls, model: ModelEntry | ClaimInputs) -> ClaimInputs:
        if isinstance(model, ClaimInputs):
            return model
        r = model.results
        return cls(sae=_typed(r, "sae", SAEResult), ape_permute=_typed(r, "ape_permute", ApePermuteResult),
                   rope_axis=_typed(r, "rope_axis", RopeAxisResult),
                   rope_heads=_typed(r, "rope_heads", RopeHeadsResult),
                   probe=_typed(r, "probe", ProbeSiteResult), eval=_typed(r, "eval", EvalResult),
                   scheme=model.describe.scheme, data=model.data,
                   sae_layers=_typed(r, "sae_layers", SAELayersResult))


R = TypeVar("R", bound=Result)


def _typed(results: Mapping[str, Result | Skipped], name: str, cls: type[R]) -> R | None:
    r = results.get(name)
    return r if isinstance(r, cls) else None


@dataclass(frozen=True)
class ModelClaim:
    """One claim's reading of one model: its outcome, the numbers the rule read (as the summary's
    `numbers` records them) and the same in words."""

    result: Outcome
    numbers: dict[str, Any] = field(default_factory=dict)
    text: str = ""


def _as_json(model: BaseModel, name: str) -> Any:
    """A free-form (dict) field as results.json holds it: non-finite floats become None there."""
    return model.model_dump(mode="json", include={name}).get(name)


def _finite(*vs: Any) -> bool:
    try:
        return all(v is not None and math.isfinite(float(v)) for v in vs)
    except (TypeError, ValueError):
        return False


# A number that cannot be right (NaN: e.g. Rec when removing the rotations removed nothing) prints as
# n/a, never as "nan"; the rule already reads it as unknown.
def _iv(iv: Interval | None, d: int = 2) -> str:
    return "" if iv is None or iv[0] == iv[1] or not _finite(*iv) else f" [{iv[0]:.{d}f}, {iv[1]:.{d}f}]"


def _pts(v: Any) -> float | None:
    return 100 * float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _pts_iv(point: Any, ci: Any) -> Interval | None:
    """A fraction and its interval as points."""
    iv = bounds(point, ci)
    return None if iv is None else (100 * iv[0], 100 * iv[1])


def _measured_at_least(iv: Interval | None, threshold: float) -> Outcome:
    """As at_least, but a measurement that was not made is undecided, not false."""
    return INCONCLUSIVE if iv is None else at_least(iv, threshold)


def _f(v, d: int = 2) -> str:
    return f"{v:.{d}f}" if _finite(v) else "n/a"


# --- C1 ---------------------------------------------------------------------------------------------
AXES = ("row", "col")


def _own_drop(eff: AblationEffect | None, k: str) -> tuple[float | None, list[float] | None]:
    """A removal's own-axis probe drop (a fraction) and its interval."""
    if eff is None:
        return None, None
    return (eff.row_drop, eff.row_drop_ci95) if k == "row" else (eff.col_drop, eff.col_drop_ci95)


def _c1(spec: str, sae: SAEReading, t: Mapping[str, float] | None = None) -> ModelClaim:
    t = RULES.values() if t is None else t
    causal = sae.causal
    eff = {k: None if causal is None else causal.effect(k) for k in AXES}
    ctl = {k: None if causal is None else causal.control(k) for k in AXES}
    sel = {k: None if (e := eff[k]) is None else e.selectivity for k in AXES}
    ci = {k: None if (e := eff[k]) is None else e.selectivity_ci95 for k in AXES}
    iv = {k: bounds(sel[k], ci[k]) if sel[k] is not None else None for k in AXES}
    own = {k: _pts_iv(*_own_drop(eff[k], k)) for k in AXES}
    own_ctl = {k: _pts_iv(*_own_drop(ctl[k], k)) for k in AXES}
    top1 = {k: None if (e := eff[k]) is None else bounds(e.top1_drop, e.top1_drop_ci95) for k in AXES}
    both = bool(sae.n_row_features > 0 and sae.n_col_features > 0)
    conds: list[Outcome] = [known(both)]
    for k in AXES:
        conds.extend((at_least(iv[k], t["C1.selective"]), at_least(own[k], t["C1.min_probe_drop"]),
                      exceeds(own[k], own_ctl[k], t["C1.control_factor"]),  # a missing own drop is false
                      _measured_at_least(top1[k], t["C1.min_top1_drop"])))
    null = sae.eta2_null
    nums: dict[str, Any] = {"layer": sae.layer, "n_row": sae.n_row_features, "n_col": sae.n_col_features,
                            "row_selectivity": sel["row"], "col_selectivity": sel["col"], "fvu": sae.fvu,
                            "row_selectivity_ci95": ci["row"], "col_selectivity_ci95": ci["col"]}
    for k in AXES:
        e, c = eff[k], ctl[k]
        nums[f"{k}_probe_drop"] = _pts(_own_drop(e, k)[0])
        own_k, ctl_k = own[k], own_ctl[k]
        nums[f"{k}_probe_drop_ci95"] = None if own_k is None else list(own_k)
        nums[f"{k}_control_probe_drop"] = _pts(_own_drop(c, k)[0])
        nums[f"{k}_control_probe_drop_ci95"] = None if ctl_k is None else list(ctl_k)
        nums[f"{k}_top1_drop"] = None if e is None else e.top1_drop
        nums[f"{k}_top1_drop_ci95"] = None if e is None else e.top1_drop_ci95
        nums[f"{k}_top1_drop_per_group"] = None if e is None else e.per_group_drop
        nums[f"{k}_control_top1_drop"] = None if c is None else c.top1_drop
        nums[f"{k}_edit_norm"] = None if e is None else e.edit_norm
        nums[f"{k}_control_edit_norm"] = None if c is None else c.edit_norm
        nums[f"{k}_control_note"] = None if c is None else c.note
    nums["eta2_null_thresholds"] = None if null is None else null.null_thresholds.model_dump(mode="json")
    nums["eta2_thresholds_above_null"] = None if null is None else null.used_above_null

    def axis(k: str) -> str:
        return (f"{k} set: selectivity {_f(sel[k])}{_iv(iv[k])}, {k}-probe drop {_f(nums[f'{k}_probe_drop'], 1)}"
                f"{_iv(own[k], 1)} pts vs control {_f(nums[f'{k}_control_probe_drop'], 1)}{_iv(own_ctl[k], 1)}, "
                f"top-1 drop {_f(nums[f'{k}_top1_drop'], 1)}{_iv(top1[k], 1)} pts (control "
                f"{_f(nums[f'{k}_control_top1_drop'], 1)})")

    return ModelClaim(all_of(*conds), nums,
                      f"{spec}: L{sae.layer} SAE (FVU {sae.fvu:.3f}) has {sae.n_row_features} row / "
                      f"{sae.n_col_features} col features; {axis('row')}; {axis('col')} (needs selectivity >= "
                      f"{t['C1.selective']:g}, probe drop >= {t['C1.min_probe_drop']:g} pts and > "
                      f"{t['C1.control_factor']:g}x its control, top-1 drop >= {t['C1.min_top1_drop']:g} pts)")


# --- C2 ---------------------------------------------------------------------------------------------
C2_SETS = (("all_positional", "random_all_positional", "all positional (row+col+mixed)"),
           ("all", "random_features", "row+col"), ("row_only", "random_row", "row only"),
           ("col_only", "random_col", "col only"))  # permuted set, its control, label; the first decides C2
C2_NULLS = ("swap_all_positional", "crossed", "norm_all_positional")


def _drop(v: VariantResult | None) -> Interval | None:
    return None if v is None else bounds(v.drop_points, v.drop_ci95)


def _points(v: VariantResult | None) -> float | None:
    return None if v is None else v.drop_points


def _n(v: VariantResult | None) -> str:
    return "n/a" if v is None or v.n_features is None else str(v.n_features)


def _c2(spec: str, ap: ApePermuteResult, t: Mapping[str, float] | None = None,
        none_top1: float | None = None) -> ModelClaim:
    t = RULES.values() if t is None else t
    allpos_v, control_v = ap.variant("all_positional"), ap.variant("random_all_positional")
    treated, control = _drop(allpos_v), _drop(control_v)
    nulls = {v: ap.variant(v) for v in C2_NULLS}
    null = _drop(nulls["swap_all_positional"])
    result = all_of(at_least(treated, t["C2.min_drop"]), exceeds(treated, null, t["C2.null_factor"]))
    allpos = _points(allpos_v)
    in_range = allpos is not None and t["C2.study_low"] <= allpos <= t["C2.study_high"]
    pe = _points(ap.variant("pos_embed_shuffle"))
    note = None if control_v is None else control_v.note
    clean = ap.baseline_top1
    gain = None if none_top1 is None or clean is None else 100 * (clean - none_top1)
    frac = None if gain is None or allpos is None or gain <= 0 else allpos / gain
    parts = []
    for kept, ctrl_name, label in C2_SETS:
        k, c = ap.variant(kept), ap.variant(ctrl_name)
        parts.append(f"{label} ({_n(k)}): {_f(_points(k), 1)}{_iv(_drop(k), 1)} pts vs its control "
                     f"({_n(c)}) {_f(_points(c), 1)}{_iv(_drop(c), 1)}")
    null_text = "; ".join(f"{v} {_f(_points(x), 1)}{_iv(_drop(x), 1)}" for v, x in nulls.items())
    crossed, norm = nulls["crossed"], nulls["norm_all_positional"]
    nums = {"drop_points": _points(ap.variant("all")), "random_control_drop": _points(ap.variant("random_features")),
            "pos_embed_shuffle_drop": pe, "all_positional_drop": allpos, "in_study_range": in_range,
            "all_positional_drop_ci95": None if treated is None else list(treated),
            "all_positional_control_drop": _points(control_v),
            "all_positional_control_drop_ci95": None if control is None else list(control),
            "n_all_positional": None if allpos_v is None else allpos_v.n_features,
            "n_control": None if control_v is None else control_v.n_features, "control_note": note,
            "swap_null_drop": _points(nulls["swap_all_positional"]),
            "swap_null_drop_ci95": None if null is None else list(null),
            "crossed_drop": _points(crossed), "crossed_drop_ci95": None if crossed is None else crossed.drop_ci95,
            "norm_control_drop": _points(norm), "norm_control_drop_ci95": None if norm is None else norm.drop_ci95,
            "all_positional_edit_norm": None if allpos_v is None else allpos_v.edit_norm,
            "norm_control_edit_norm": None if norm is None else norm.edit_norm,
            "all_positional_drop_per_group": {} if allpos_v is None else {
                g: v.drop_points for g, v in allpos_v.per_group.items()},
            "position_gain_points": gain, "drop_fraction_of_position_gain": frac}
    text = (f"{spec}: top-1 drop when permuting " + "; ".join(parts) + f"; nulls: {null_text}"
            + f"; shuffled APE table {_f(pe, 1)}"
            + (f" (control: {note})" if note else "")
            + ("" if frac is None or gain is None else f"; the all-positional drop is {frac:.0%} of the position gain "
               f"({gain:.1f} pts over the none model)")
            + f"; C2 reads the all-positional set (needs >= {t['C2.min_drop']:g} and > "
              f"{t['C2.null_factor']:g}x its same-position swap)"
            f"{', within' if in_range else ', outside'} the study's "
            f"{t['C2.study_low']:g}-{t['C2.study_high']:g}")
    return ModelClaim(result, nums, text)


# --- C1 and C2 over the layer sweep (sae_layers) ----------------------------------------------------
def _at_layer(cid: str, spec: str, p: LayerPoint, t: Mapping[str, float]) -> Outcome:
    """The claim's per-model rule at one swept layer, re-read from the typed results it measured
    there (a point written without them: the result the sweep recorded)."""
    if cid == "C1":
        return _c1(spec, p.sae, t).result if p.sae is not None else _outcome(p.c1)
    return _c2(spec, p.permute, t).result if p.permute is not None else _outcome(p.c2)


def _outcome(v: str) -> Outcome:
    return HOLDS if v == HOLDS else FAILS if v == FAILS else INCONCLUSIVE


def plausible_layers(sweep: SAELayersResult, threshold: float) -> list[int]:
    """The swept layers chosen as the largest all-positional drop in >= threshold of the resamples."""
    return [p.layer for p in sweep.points if p.selection_frequency >= threshold]


def over_curve(cid: str, spec: str, single: ModelClaim | None, sweep: SAELayersResult,
               t: Mapping[str, float] | None = None) -> ModelClaim:
    """C1 or C2 read over the sweep's plausible layers (the per-model rule at each): holds when it holds
    at every one, fails when it fails at all, else inconclusive. The single-layer reading (`single`:
    the sae / ape_permute stages') keeps its numbers and text beside it."""
    t = RULES.values() if t is None else t
    per = {p.layer: _at_layer(cid, spec, p, t) for p in sweep.points}
    plaus = plausible_layers(sweep, t[f"{cid}.plausible_layer"])
    at = [per[layer] for layer in plaus]
    result: Outcome = (HOLDS if at and all(r == HOLDS for r in at) else
                       FAILS if not at or all(r == FAILS for r in at) else INCONCLUSIVE)
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
            f"the largest all-positional drop in >= {t[f'{cid}.plausible_layer']:.0%} of the bootstrap resamples): "
            f"{where}" + (f"; other layers {others}" if others else "")
            + ("" if single is None else f". Single layer (the {'sae' if cid == 'C1' else 'ape_permute'} stage's, "
               f"{single.result}): {single.text.removeprefix(f'{spec}: ')}"))
    return ModelClaim(result, nums, text)


def _c1_model(spec: str, m: ClaimInputs, t: Mapping[str, float] | None = None) -> ModelClaim | None:
    """C1 of one model: over the layer sweep where it ran, else at the sae stage's layer (None: neither ran)."""
    single = None if m.sae is None else _c1(spec, m.sae, t)
    return single if m.sae_layers is None else over_curve("C1", spec, single, m.sae_layers, t)


def _c2_model(spec: str, m: ClaimInputs, t: Mapping[str, float] | None = None,
              none_top1: float | None = None) -> ModelClaim | None:
    """C2 of one model: over the layer sweep where it ran, else at the ape_permute stage's layer."""
    single = None if m.ape_permute is None else _c2(spec, m.ape_permute, t, none_top1=none_top1)
    return single if m.sae_layers is None else over_curve("C2", spec, single, m.sae_layers, t)


# --- C3 ---------------------------------------------------------------------------------------------
def _acc(cond: ProbedCondition | ProbeSiteResult, axis: str) -> list[float]:
    return cond.row_acc if axis == "row" else cond.col_acc


def _c3(spec: str, ra: RopeAxisResult, none_probe: ProbeSiteResult | None = None) -> ModelClaim:
    c = ra.conditions
    base = c["baseline"]
    chance = {"row": ra.chance_row, "col": ra.chance_col}
    removal = ra.removal or {}
    floored = ra.removal_floored  # issue 29: per-layer content floors; None in older results
    mlp = (ra.readouts.removal if ra.readouts is not None else None) or None
    nums: dict[str, Any] = {}
    outcomes: list[Outcome] = []
    ivs: dict[str, Interval | None] = {}
    for a, b in (("row", "col"), ("col", "row")):
        off = c[f"no_{a}"]
        kept_own = kept_fraction(_acc(base, a), _acc(off, a), chance[a])
        kept_other = kept_fraction(_acc(base, b), _acc(off, b), chance[b])
        removed = None if kept_own is None else 1 - kept_own
        measured = removal.get(f"no_{a}")
        rm, kp = f"no_{a}_{a}_removed", f"no_{a}_{b}_kept"
        nums[rm] = removed
        nums[kp] = kept_other
        nums[f"no_{a}_top1"] = off.top1
        nums[f"{rm}_ci95"] = None if measured is None else measured.removed_ci95
        nums[f"{kp}_ci95"] = None if measured is None else measured.kept_ci95
        ivs[rm] = None if removed is None else bounds(removed, nums[f"{rm}_ci95"])
        ivs[kp] = None if kept_other is None else bounds(kept_other, nums[f"{kp}_ci95"])
        if floored is None:  # results before the floors: fractions above chance
            outcomes.extend((at_least(ivs[rm], MIN_REMOVED), at_least(ivs[kp], MIN_KEPT)))
            continue
        fl = floored.get(f"no_{a}")
        for num, (point, ci) in ((f"{rm}_floored", (None, None) if fl is None else (fl.removed, fl.removed_ci95)),
                                 (f"{kp}_floored", (None, None) if fl is None else (fl.kept, fl.kept_ci95))):
            nums[num], nums[f"{num}_ci95"] = point, ci
            ivs[num] = None if point is None else bounds(point, ci)
        nums[f"{kp}_interaction"] = bool(fl is not None and fl.interaction)
        outcomes.extend((at_least(ivs[f"{rm}_floored"], MIN_REMOVED), at_least(ivs[f"{kp}_floored"], MIN_KEPT)))
        if mlp is not None:  # the MLP probe must find the axis removed too (not only linearly hidden)
            m = (mlp.get(f"no_{a}") or {}).get("mlp")
            fracs = [(None, None)] * 4 if m is None else m.fractions()
            for num, (point, ci) in zip((f"{rm}_mlp", f"{kp}_mlp", f"{rm}_pair_mlp", f"{kp}_pair_mlp"), fracs,
                                        strict=True):
                nums[num], nums[f"{num}_ci95"] = point, ci
                ivs[num] = None if point is None else bounds(point, ci)
            outcomes.append(at_least(ivs[f"{rm}_mlp"], MIN_REMOVED))
        if none_probe is not None and len(_acc(none_probe, a)) == len(_acc(base, a)):
            # reported beside the rule: the floor from the matched `none` model's probes, layer by layer
            floor = [max(chance[a], f) for f in _acc(none_probe, a)]
            kept_none, _ = floored_kept(_acc(base, a), _acc(off, a), floor)
            nums[f"{rm}_none_floor"] = None if kept_none is None else 1 - kept_none
    return ModelClaim(all_of(*outcomes), nums, _c3_text(spec, nums, ivs, floored is not None, mlp is not None,
                                                        base.top1))


def _c3_text(spec: str, nums: Mapping[str, Any], ivs: Mapping[str, Interval | None], floors: bool, mlp: bool,
             top1: float | None) -> str:
    def frac(key: str) -> str:
        iv = ivs.get(key)
        return _pc(nums.get(key)) + ("" if iv is None or iv[0] == iv[1] else f" [{_pc(iv[0])}, {_pc(iv[1])}]")

    text = (f"{spec}: no_row removes {frac('no_row_row_removed')} of above-chance row decodability, "
            f"col keeps {frac('no_row_col_kept')}; no_col removes {frac('no_col_col_removed')} of col, "
            f"row keeps {frac('no_col_row_kept')}")
    if not floors:
        text += f" (needs >= {_pc(MIN_REMOVED)} removed and >= {_pc(MIN_KEPT)} kept"
    else:
        text += ("; above each layer's content floor (the model's no_both accuracy): no_row removes "
                 f"{frac('no_row_row_removed_floored')} of row, col keeps {frac('no_row_col_kept_floored')}"
                 f"{' (an interaction: above 100%)' if nums.get('no_row_col_kept_interaction') else ''}; no_col "
                 f"removes {frac('no_col_col_removed_floored')} of col, row keeps {frac('no_col_row_kept_floored')}"
                 f"{' (an interaction: above 100%)' if nums.get('no_col_row_kept_interaction') else ''}")
        if mlp:
            text += (f"; an MLP probe finds {frac('no_row_row_removed_mlp')} of row and "
                     f"{frac('no_col_col_removed_mlp')} of col removed (relative offsets: Δrow "
                     f"{frac('no_row_row_removed_pair_mlp')}, Δcol {frac('no_col_col_removed_pair_mlp')} removed)")
        if "no_row_row_removed_none_floor" in nums:
            text += (f"; against the matched none model's floor: row {_pc(nums.get('no_row_row_removed_none_floor'))}, "
                     f"col {_pc(nums.get('no_col_col_removed_none_floor'))} removed")
        text += (f" (needs >= {_pc(MIN_REMOVED)} removed above the floor{' and by the MLP probe' if mlp else ''}, "
                 f">= {_pc(MIN_KEPT)} kept")
    return text + (f"; top-1 {_f(top1)} -> no_row {_f(nums['no_row_top1'])}, no_col "
                   f"{_f(nums['no_col_top1'])})")


def matched_none(spec: str, models: Mapping[str, ClaimInputs]) -> ProbeSiteResult | None:
    """The `probe` result of the `none` model matched to a RoPE model (`_none_model`), if one ran."""
    none = _none_model(models, models[spec].data, spec, lambda m: m.probe is not None)
    return None if none is None else none.probe


def _rank(v: int | None) -> str:
    return "n/a" if v is None else str(v)


def _pc(v) -> str:
    return f"{100 * v:.0f}%" if _finite(v) else "n/a"


def _pc_iv(iv: Interval | None) -> str:
    return "" if iv is None or iv[0] == iv[1] or not _finite(*iv) else f" [{_pc(iv[0])}, {_pc(iv[1])}]"


# --- C4 ---------------------------------------------------------------------------------------------
def median_recovery(per_r: Mapping[str, Recovery]) -> float:
    """C4's median over restore points of mean Rec (rope_axis `median_recovery`) of typed recoveries."""
    return _median_recovery({r: {"mean_rec": x.mean_rec} for r, x in per_r.items()})


def _c4(spec: str, ra: RopeAxisResult, rh: RopeHeadsResult | None) -> ModelClaim:
    # None where no restore point has a mean Rec: an undefined number is null in results.json, not NaN
    rec = {a: m if _finite(m := median_recovery(ra.recovery[a])) else None for a in AXES}
    med = ra.median_recovery or {}
    rec_ci = {a: None if (m := med.get(a)) is None else m.median_rec_ci95 for a in AXES}
    rec_iv = {a: bounds(rec[a], rec_ci[a]) for a in AXES}
    shares = ra.median_rebuilt_share  # the count-matched reading (issue 29); None in older results
    share = {a: (None, None) if (s := (shares or {}).get(a)) is None else (s.median_share, s.median_share_ci95)
             for a in AXES}
    share_iv = {a: bounds(*share[a]) for a in AXES}
    prim, S, S_ci = None, None, None
    if rh is not None and rh.primary_rebuilding_head:
        prim = rh.primary_rebuilding_head
        S = rh.axis_index[prim[0]][prim[1]]
        cis = rh.axis_index_ci95
        S_ci = cis[prim[0]][prim[1]] if cis else None
    S_iv = None if S is None else bounds(S, S_ci)
    threshold = None if rh is None else rh.axis_index_null_threshold
    matched = None if rh is None else rh.primary_axis_index_matched
    matched_iv = None if matched is None or rh is None else bounds(matched, rh.primary_axis_index_matched_ci95)
    head_share = None if rh is None else rh.primary_recovery_share
    head_share_iv = None if head_share is None or rh is None else bounds(head_share, rh.primary_recovery_share_ci95)
    if shares is not None:
        recovered = (inside(share_iv["row"], 0.0, 1.0), inside(share_iv["col"], 0.0, 1.0))
    else:  # results before the count-matched reference: Rec itself
        recovered = (inside(rec_iv["row"], 0.0, 1.0), inside(rec_iv["col"], 0.0, 1.0))
    if threshold is not None:
        head = (at_least(matched_iv, float(threshold)), at_least(head_share_iv, MIN_HEAD_SHARE))
    else:  # results before the restore-condition S: |S| of clean attention against the round number
        head = (at_least(magnitude(S_iv), SPECIALISED),)
    text = (f"{spec}: median recovery row {_f(rec['row'])}{_iv(rec_iv['row'])}, col "
            f"{_f(rec['col'])}{_iv(rec_iv['col'])}")
    if shares is not None:
        text += (f"; count-matched rebuilt share row {_f(share['row'][0])}{_iv(share_iv['row'])}, "
                 f"col {_f(share['col'][0])}{_iv(share_iv['col'])} (needs inside (0, 1))")
    else:
        text += " (needs inside (0, 1))"
    if threshold is not None and rh is not None:
        text += (f"; primary rebuilding head {_head(prim)} (chosen in {_pc(rh.primary_selection_frequency)} of image "
                 f"resamples) carries {rh.primary_axis or 'n/a'}: its axis index where it rebuilds, signed to that "
                 "axis, "
                 f"{_f(matched)}{_iv(matched_iv)} (needs >= the null's {_f(threshold, 3)}), and it explains "
                 f"{_pc(head_share)}{_pc_iv(head_share_iv)} of the recovery (needs >= {_pc(MIN_HEAD_SHARE)}); "
                 f"clean-attention axis index {_f(S)}{_iv(S_iv)}")
    else:
        text += f"; primary rebuilding head {_head(prim)} axis index {_f(S)}{_iv(S_iv)} (needs |S| >= {SPECIALISED})"
    nums = {"median_recovery_row": rec["row"], "median_recovery_col": rec["col"], "primary_head": prim,
            "primary_axis_index": S,
            "n_specialised_heads": None if rh is None else len(rh.specialised_heads),
            # cross-check, reported beside the rule: the same heads under mean-ablation?
            "top_heads_overlap": None if rh is None else rh.top_heads_overlap,
            "primary_tops_mean_ablation": _first_under(rh, prim, "mean_ablate"),
            # and by its direct effect on the axis probes (iii); every pair of methods' top heads
            "primary_tops_direct_effect": _first_under(rh, prim, "direct_effect"),
            "top_heads_agreement": None if rh is None else rh.top_heads_agreement,
            "median_recovery_row_ci95": rec_ci["row"], "median_recovery_col_ci95": rec_ci["col"],
            "primary_axis_index_ci95": S_ci,
            # issue 29: what the rule reads now
            "median_rebuilt_share_row": share["row"][0], "median_rebuilt_share_col": share["col"][0],
            "median_rebuilt_share_row_ci95": share["row"][1], "median_rebuilt_share_col_ci95": share["col"][1],
            "primary_axis": None if rh is None else rh.primary_axis, "primary_axis_index_matched": matched,
            "primary_axis_index_matched_ci95": None if rh is None else rh.primary_axis_index_matched_ci95,
            "axis_index_null_threshold": threshold,
            "primary_selection_frequency": None if rh is None else rh.primary_selection_frequency,
            "primary_recovery_share": head_share,
            "primary_recovery_share_ci95": None if rh is None else rh.primary_recovery_share_ci95}
    return ModelClaim(all_of(*recovered, *head), nums, text)


def _first_under(rh: RopeHeadsResult | None, prim: list[int] | None, method: str) -> bool | None:
    """Whether the primary rebuilding head also tops another method's ranking (None: not measured)."""
    top = None if rh is None else rh.top_heads
    if prim is None or not top or not top.get(method):
        return None
    return list(prim) == list(top[method][0])


def _head(lh: list[int] | None) -> str:
    return f"L{lh[0]}H{lh[1]}" if lh else "n/a"


# --- C5 ---------------------------------------------------------------------------------------------
def _c5(spec: str, rh: RopeHeadsResult) -> ModelClaim:
    prim, rank = rh.primary_rebuilding_head, rh.primary_head_drop_rank
    drop = rh.drop_points[prim[0]][prim[1]] if prim else None
    cis = rh.drop_ci95
    big = rh.largest_drop_head
    n_heads = len(rh.layers) * rh.num_heads
    n_late = (len(rh.layers) - rh.restore_from) * rh.num_heads
    closest = closest_rival(rh.primary_margin_ci95)
    rival = "" if closest is None else (f"; closest rival {_head(closest[0])}: margin {_ci(closest[1])} pts")
    nums = {"primary_head": prim, "primary_drop_points": drop,
            "primary_drop_ci95": cis[prim[0]][prim[1]] if cis and prim else None,
            "drop_rank": rank, "largest_drop_head": big,
            "drop_rank_among_layers_ge_R": rh.primary_head_drop_rank_after_R,
            "largest_drop_points": rh.drop_points[big[0]][big[1]],
            "largest_drop_ci95": cis[big[0]][big[1]] if cis else None,
            "closest_rival_head": None if closest is None else closest[0],
            "closest_rival_margin_ci95": None if closest is None else closest[1], "n_heads": n_heads,
            **_c5_ablation_numbers(rh)}
    text = (f"{spec}: primary rebuilding head {_head(prim)} drops top-1 by {_f(drop, 1)} pts"
            f"{'' if not (cis and prim) else ' ' + _ci(cis[prim[0]][prim[1]])}, rank {_rank(rank)} of "
            f"{n_heads} (largest: L{big[0]}H{big[1]}, {rh.drop_points[big[0]][big[1]]:.1f} pts){rival}; "
            f"rank {_rank(rh.primary_head_drop_rank_after_R)} among the {n_late} heads of layers >= "
            f"R={rh.restore_from}")
    return ModelClaim(_c5_result(rh, prim), nums, text)


def _ci(iv: list[float]) -> str:
    return f"[{iv[0]:.1f}, {iv[1]:.1f}]"


def _c5_result(rh: RopeHeadsResult, prim: list[int] | None) -> Outcome:
    margins = rh.primary_margin_ci95
    if prim is None or margins is None:
        return FAILS
    return c5_outcome(margins)


def c5_outcome(margins: list[list[list[float] | None]]) -> Outcome:
    """C5 from the paired margins drop(primary) - drop(head) (`primary_margin_ci95`, None at the
    primary): holds when every other head's interval lies above 0, fails when one lies below."""
    return all_positive([iv for row in margins for m in row if (iv := bounds(None, m)) is not None])


def _c5_ablation_numbers(rh: RopeHeadsResult) -> dict[str, Any]:
    """Which ablation C5's verdict rests on ('identity': the head's rotations removed) and C5's
    outcome under each ablation rope_heads measured (`c5_ablations`; absent in older results)."""
    out: dict[str, Any] = {"ablation": rh.c5_rests_on or "identity"}
    if rh.c5_ablations is not None:
        out["outcome_under_ablation"] = {k: v.outcome for k, v in rh.c5_ablations.items()}
    return out


# --- seeds, model families and the headline number ---------------------------------------------------
SEED_SUFFIX = re.compile(r"-seed(\d+)$")
# the number each claim's seed summary averages (a key of the claim's per-model numbers)
HEADLINE_NUMBER = {"C1": "min_selectivity", "C2": "all_positional_drop", "C3": "min_removed",
                   "C4": "mean_median_recovery", "C5": "primary_drop_points"}
# the per-model numbers it is made of, and how: the smaller of the two, their mean, or the one number
_HEADLINE_PARTS: dict[str, tuple[tuple[str, ...], Literal["min", "mean", "one"]]] = {
    "C1": (("row_selectivity", "col_selectivity"), "min"),
    "C2": (("all_positional_drop",), "one"),
    "C3": (("no_row_row_removed", "no_col_col_removed"), "min"),
    "C4": (("median_recovery_row", "median_recovery_col"), "mean"),
    "C5": (("primary_drop_points",), "one")}
_PRIMARY_DROP_CI = {"primary_drop_points": "primary_drop_ci95"}  # the one number whose interval key differs
HEADLINE_LABEL = {"C1": "smaller of the row and col sets' causal selectivity",
                  "C2": "top-1 drop permuting all positional features",
                  "C3": "smaller share of its own axis' above-chance decodability an axis' removal removes",
                  "C4": "mean of the row and col median recovery after restoring",
                  "C5": "top-1 drop ablating the primary rebuilding head"}
HEADLINE_UNIT = {"C1": "fraction", "C2": "points", "C3": "fraction", "C4": "fraction", "C5": "points"}
# where a headline number can lie at all: a selectivity own / (|own| + |other|) in [-1, 1], a top-1 drop in
# points in [-100, 100]; removed shares and recoveries have no such bound (kept > 100 % happens)
HEADLINE_RANGE: dict[str, tuple[float, float]] = {"C1": (-1.0, 1.0), "C2": (-100.0, 100.0), "C5": (-100.0, 100.0)}


def model_family(spec: str) -> str:
    """Seeds of one model share a family: `NAME-seed<k>` belongs to `NAME` (seed 0 is `NAME`)."""
    return SEED_SUFFIX.sub("", spec)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def _headline(cid: str, nums: Mapping[str, Any]) -> float | None:
    keys, how = _HEADLINE_PARTS[cid]
    xs = [x for k in keys if (x := _number(nums.get(k))) is not None]
    if len(xs) < len(keys):
        return None  # a number the summary needs is missing or undefined on this seed
    return sum(xs) / 2 if how == "mean" else min(xs)


def _headline_interval(cid: str, nums: Mapping[str, Any]) -> list[float] | None:
    """The headline number's 95 % interval on one model, from its parts' intervals (the smaller of
    two: the ends' minima; the mean of two: the ends' means); None where no part has one."""
    keys, how = _HEADLINE_PARTS[cid]
    cis = [nums.get(_PRIMARY_DROP_CI.get(k, f"{k}_ci95")) for k in keys]
    if _headline(cid, nums) is None or all(bounds(None, ci) is None for ci in cis):
        return None
    ivs = [bounds(nums.get(k), ci) for k, ci in zip(keys, cis, strict=True)]
    if any(iv is None or not all(map(math.isfinite, iv)) for iv in ivs):
        return None
    los, his = [iv[0] for iv in ivs if iv], [iv[1] for iv in ivs if iv]
    if how == "mean":
        return [sum(los) / len(los), sum(his) / len(his)]
    return [min(los), min(his)]


def _families(found: list[tuple[str, ModelClaim]]) -> dict[str, list[tuple[str, ModelClaim]]]:
    families: dict[str, list[tuple[str, ModelClaim]]] = {}
    for spec, r in found:
        families.setdefault(model_family(spec), []).append((spec, r))
    return families


def seed_summaries(cid: str, found: list[tuple[str, ModelClaim]]) -> dict[str, SeedSummary]:
    """Per model family with >= 2 seeds: on how many the claim holds, and the headline number's
    mean with a Student-t interval over the seeds."""
    out = {}
    for fam, members in _families(found).items():
        if len(members) < 2:
            continue
        values = [_headline(cid, r.numbers) for _, r in members]
        known_values = [v for v in values if v is not None]
        mean, ci = seed_interval(known_values) if known_values else (None, None)
        lo, hi = HEADLINE_RANGE.get(cid, (-math.inf, math.inf))
        if ci is not None:  # a t-interval over two or three seeds can leave the number's range: cut it there
            ci = [max(ci[0], lo), min(ci[1], hi)]
        out[fam] = SeedSummary(models=[spec for spec, _ in members], holds=sum(r.result == HOLDS for _, r in members),
                               results=[r.result for _, r in members], number=HEADLINE_NUMBER[cid], values=values,
                               mean=mean, ci95=ci)
    return out


def family_headlines(cid: str, found: list[tuple[str, ModelClaim]],
                     seeds: Mapping[str, SeedSummary]) -> list[FamilyHeadline]:
    """The claim's headline number per model family: one model's number with its own interval, or
    the seeds' mean with their Student-t interval (`seeds`), and on how many seeds the claim holds."""
    out = []
    for fam, members in _families(found).items():
        s = seeds.get(fam)
        if s is not None:
            value, ci = s.mean, s.ci95
        else:
            value, ci = _headline(cid, members[0][1].numbers), _headline_interval(cid, members[0][1].numbers)
        first = members[0][1].numbers
        out.append(FamilyHeadline(family=fam, models=[spec for spec, _ in members],
                                  results=[r.result for _, r in members],
                                  holds=sum(r.result == HOLDS for _, r in members), number=HEADLINE_NUMBER[cid],
                                  label=HEADLINE_LABEL[cid], unit=HEADLINE_UNIT[cid], value=value, ci95=ci,
                                  why_undefined=None if value is not None else headline_gap(cid, first)))
    return out


def headline_gap(cid: str, nums: Mapping[str, Any]) -> str:
    """Why a model has no headline number, in words: the reason its rule read nothing, where the
    numbers say it (no feature set to remove, nothing removed to recover), else that it is undefined."""
    if cid == "C1":
        missing = [axis for axis in ("row", "col") if nums.get(f"n_{axis}") == 0]
        if missing:
            return f"its SAE has no {' and no '.join(missing)} feature set to remove"
    if cid == "C2" and nums.get("n_all_positional") == 0:
        return "its SAE has no positional features to permute"
    if cid == "C4" and nums.get("median_recovery_row") is None and nums.get("median_recovery_col") is None:
        return (f"removing the rotations lowers no layer's decodability by >= {100 * MIN_GAP:g} pts: nothing "
                "to recover, recovery undefined")
    if cid == "C5" and nums.get("primary_head") is None:
        return "no head has a defined rebuilding score (recovery undefined), so there is no primary head to ablate"
    return "a number its rule reads is undefined on this model"


def _rule_gist(cid: str) -> str:
    t = RULES.values()
    return {
        "C1": (f"removing the row (col) feature set is axis-selective (>= {t['C1.selective']:g}), lowers its own "
               f"probe by >= {t['C1.min_probe_drop']:g} pts and > {t['C1.control_factor']:g}x a matched random "
               f"removal, and top-1 by >= {t['C1.min_top1_drop']:g} pts"),
        "C2": (f"permuting all positional features drops top-1 by >= {t['C2.min_drop']:g} pts and > "
               f"{t['C2.null_factor']:g}x the same-position swap"),
        "C3": (f"removing an axis' rotations removes >= {_pc(MIN_REMOVED)} of its decodability above the content "
               f"floor while the other axis keeps >= {_pc(MIN_KEPT)}"),
        "C4": (f"restoring the rotations rebuilds part, not all, of the information, and the primary rebuilding "
               f"head is specialised on its axis and carries >= {_pc(MIN_HEAD_SHARE)} of the recovery"),
        "C5": "ablating the primary rebuilding head drops top-1 more than ablating any other head (paired margins)",
    }.get(cid, "")


def claim_sentence(cid: str, results: list[Outcome]) -> str:
    """The claim's reading in one sentence: on how many models it holds, and what it needs."""
    scheme = {"ape": "APE", "rope": "RoPE"}.get(CLAIM_SCHEME.get(cid, ""), "its")
    if not results:
        return f"No {scheme} model was run."
    n, fails, unsure = len(results), results.count(FAILS), results.count(INCONCLUSIVE)
    rest = ", ".join(p for p in (f"fails on {fails}" if fails else "", f"inconclusive on {unsure}" if unsure else "")
                     if p)
    return (f"Holds on {results.count(HOLDS)} of {n} {scheme} model{'s' if n > 1 else ''}"
            f"{f' ({rest})' if rest else ''}: it needs that {_rule_gist(cid)}.")


def none_top1(models: Mapping[str, ClaimInputs], data: str | None, spec: str | None = None) -> float | None:
    """Clean top-1 of a model without position on the same data (`_none_model`), if one ran."""
    none = _none_model(models, data, spec, lambda m: m.eval is not None)
    return None if none is None or none.eval is None else float(none.eval.top1)


def _none_model(models: Mapping[str, ClaimInputs], data: str | None, spec: str | None,
                measured: Callable[[ClaimInputs], bool]) -> ClaimInputs | None:
    """The model without position (scheme `none`) on the same data with the measurement `measured` asks
    for: the one of `spec`'s training seed (`-seed<k>` suffix) where it ran, else the first (each seed's
    position gain is its own: the zoo's `none` seeds reach 72.1 / 71.0 / 63.4 %). Found by scheme, not by
    name, so that every model gets its `none` (`pairs-rope-mixed-ape` has no `pairs-none-ape`)."""
    nones = [(s, m) for s, m in models.items() if m.scheme == "none" and m.data == data and measured(m)]
    same = [m for s, m in nones if spec is not None and seed_of(s) == seed_of(spec)]
    return same[0] if same else nones[0][1] if nones else None


def seed_of(spec: str) -> int:
    """The training seed a shipped model's name says (`NAME-seed<k>`; seed 0 is `NAME`)."""
    m = SEED_SUFFIX.search(spec)
    return int(m.group(1)) if m else 0


# claims whose per-model rule reads the rule set's thresholds: their sensitivity curves are computed
def _c1_outcome(spec: str, m: ClaimInputs, t: Mapping[str, float]) -> Outcome | None:
    return None if (r := _c1_model(spec, m, t)) is None else r.result


def _c2_outcome(spec: str, m: ClaimInputs, t: Mapping[str, float]) -> Outcome | None:
    return None if (r := _c2_model(spec, m, t)) is None else r.result


RULE_READERS = {"C1": _c1_outcome, "C2": _c2_outcome}


def primary_over_seeds(found: list[tuple[str, ModelClaim]]) -> str:
    """How often each head is the primary rebuilding head over the trained seeds of a model family
    (issue 29: the selection's stability across seeds, beside its bootstrap over images)."""
    parts = []
    for fam, members in _families(found).items():
        heads = [_head(r.numbers.get("primary_head")) for _, r in members]
        if len(heads) >= 2:
            counts = {h: heads.count(h) for h in dict.fromkeys(heads)}
            parts.append(f"{fam}: " + ", ".join(f"{h} on {n} of {len(heads)} seeds" for h, n in counts.items()))
    return "primary rebuilding head over seeds: " + "; ".join(parts)


def _per_model(models: Mapping[str, ClaimInputs]) -> dict[str, list[tuple[str, ModelClaim]]]:
    """Each claim's reading of every model that ran its experiments, in the models' order."""
    per: dict[str, list[tuple[str, ModelClaim]]] = {c: [] for c in CLAIM_TEXT}
    for spec, m in models.items():
        if (c1 := _c1_model(spec, m)) is not None:
            per["C1"].append((spec, c1))
        if (c2 := _c2_model(spec, m, none_top1=none_top1(models, m.data, spec))) is not None:
            per["C2"].append((spec, c2))
        if m.rope_axis is not None:
            per["C3"].append((spec, _c3(spec, m.rope_axis, matched_none(spec, models))))
            per["C4"].append((spec, _c4(spec, m.rope_axis, m.rope_heads)))
        if m.rope_heads is not None:
            per["C5"].append((spec, _c5(spec, m.rope_heads)))
    return per


def summarise(models: Mapping[str, ModelEntry | ClaimInputs]) -> Summary:
    """Verdicts per claim from the models' typed results (a study's `ModelEntry`s, or `ClaimInputs`)."""
    inputs = {spec: ClaimInputs.of(m) for spec, m in models.items()}
    measured = {"sae_layers"} if any(m.sae_layers is not None for m in inputs.values()) else set()
    claims = []
    for cid, found in _per_model(inputs).items():
        seeds = seed_summaries(cid, found)
        results: list[Outcome] = [r.result for _, r in found]
        notes = [primary_over_seeds(found)] if cid == "C4" and seeds else []
        claim = ClaimVerdict(
            id=cid, claim=CLAIM_TEXT[cid], scheme=CLAIM_SCHEME[cid], verdict=aggregate(results),
            sentence=claim_sentence(cid, results), headlines=family_headlines(cid, found, seeds), notes=notes,
            details={spec: r.text for spec, r in found}, seeds=seeds,
            numbers={spec: {**r.numbers, "holds": r.result == HOLDS, "result": r.result} for spec, r in found},
            models=[spec for spec, _ in found])
        if cid in RULE_READERS and found:
            claim.sensitivity = sensitivity(cid, inputs, RULE_READERS[cid], aggregate, measured=measured)
        claims.append(claim)
    return Summary(claims=claims, rules=rules_text(), rules_version=RULES.version, rules_hash=RULES.digest(),
                   rule_set=RULES)
