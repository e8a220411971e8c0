"""The study's claims C1-C5, each with measured numbers and a verdict computed from them.

Verdict rules: the data below (`RULES_PREAMBLE`, `CLAIM_RULES`, one text per claim, and
`AGGREGATION`), recorded with every summary (`rules_text`) and shown in the report.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from vitpos.analysis.stats import seed_interval
from vitpos.experiments.rope_axis import MIN_ABOVE_CHANCE as MIN_ABOVE_CHANCE  # C3's layer rule, with its statistic
from vitpos.experiments.rope_axis import kept_fraction, median_recovery
from vitpos.experiments.rope_heads import SPECIALISED as SPECIALISED  # |S| of an axis-specialised head
from vitpos.experiments.rope_heads import closest_rival
from vitpos.study.results import ClaimVerdict, SeedSummary, Summary

SELECTIVE = 0.6
MIN_DROP = 10.0
CONTROL_FACTOR = 2.0
MIN_REMOVED = 0.7
MIN_KEPT = 0.7

CLAIM_TEXT = {
    "C1": "APE: sparse autoencoders recover causal row- and column-specific features.",
    "C2": "APE: permuting the positional features across patches drops top-1 by 24-31 points.",
    "C3": "RoPE: disabling the row (column) rotations removes decodable row (column) information independently.",
    "C4": "RoPE: once rotations are restored the information is partly rebuilt, in part by axis-specialised heads.",
    "C5": "RoPE: ablating the rotations of the primary rebuilding head reduces accuracy more than any other head.",
}


# --- the verdict rules, as data (thresholds are the constants above) -----------------------------
RULES_PREAMBLE = """(ours, since the study gives only its abstract; thresholds are module constants;
every measurement and control is defined in docs/methods.md):
  Each condition of a rule reads a 95 % interval [lo, hi] of its measurement (analysis/stats.py;
  a measurement without one counts as the interval [x, x]) and comes out true (the whole interval
  is on the rule's side of the threshold), false (the whole interval is on the other side) or
  undecided (the threshold lies inside the interval). Per model a claim `holds` when every
  condition is true, `fails` when any is false, and is `inconclusive` otherwise."""
CLAIM_RULES: dict[str, str] = {
    "C1": """  C1 (APE)  >= 1 row and >= 1 col SAE feature, and ablating each set is axis-selective
            downstream: the interval of the selectivity (paired bootstrap over the probes' test
            images) lies at or above SELECTIVE, for both sets.""",
    "C2": """  C2 (APE)  permuting ALL positional features (row + col + mixed: every live latent with
            eta2_pos >= min_eta2_pos) drops top-1 (interval: paired bootstrap over images, seeds
            pooled) by >= MIN_DROP points, and the drop's interval lies above CONTROL_FACTOR x
            the interval of its own control (as many live non-positional latents, matched in
            activation mass, permuted the same way); without that control the claim is
            inconclusive. Row+col, row-only and col-only are reported beside their own controls
            but do not enter the verdict (the 24-31 range is ImageNet's; whether the drop falls in
            it is stated, not required).""",
    "C3": """  C3 (RoPE) removing an axis removes >= MIN_REMOVED of its above-chance decodability
            (mean over layers of (base - off) / (base - chance), retrained probes, layers whose
            baseline is >= MIN_ABOVE_CHANCE above chance) while the other axis keeps >= MIN_KEPT
            of its above-chance decodability, for both axes: each fraction's interval (paired
            bootstrap over the probes' test images, rope_axis `removal`) lies at or above its
            threshold; fails if one lies below.""",
    "C4": """  C4 (RoPE) recovery after restoring is partial for both axes: the interval of the median over
            restore points R of mean Rec (paired bootstrap, rope_axis `median_recovery`; results
            without it: the point median) lies inside (0, 1), fails if it lies wholly at or
            below 0 or at or above 1; and the primary rebuilding head is axis-specialised: the
            interval of its |S| (from `axis_index_ci95`, bootstrap over the attention images)
            lies at or above 0.5, fails if below. Reported beside it, not in the rule: whether
            mean-ablating head outputs ranks the same heads (overlap of the top five, and whether
            the primary head is also first there).""",
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
    return "\n".join([RULES_PREAMBLE, *CLAIM_RULES.values(), AGGREGATION])


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


def _iv(iv: Interval | None, d: int = 2) -> str:
    return "" if iv is None or iv[0] == iv[1] else f" [{iv[0]:.{d}f}, {iv[1]:.{d}f}]"


def _c1(spec: str, sae: dict) -> dict:
    causal = sae.get("causal") or {}
    eff = {k: causal.get(f"ablate_{k}") or {} for k in ("row", "col")}
    sel = {k: eff[k].get("selectivity") for k in ("row", "col")}
    ci = {k: eff[k].get("selectivity_ci95") for k in ("row", "col")}
    iv = {k: bounds(sel[k], ci[k]) if sel[k] is not None else None for k in ("row", "col")}
    result = all_of(known(sae["n_row_features"] > 0 and sae["n_col_features"] > 0),
                    at_least(iv["row"], SELECTIVE), at_least(iv["col"], SELECTIVE))
    return {"result": result,
            "numbers": {"layer": sae["layer"], "n_row": sae["n_row_features"], "n_col": sae["n_col_features"],
                        "row_selectivity": sel["row"], "col_selectivity": sel["col"], "fvu": sae["fvu"],
                        "row_selectivity_ci95": ci["row"], "col_selectivity_ci95": ci["col"]},
            "text": f"{spec}: L{sae['layer']} SAE (FVU {sae['fvu']:.3f}) has {sae['n_row_features']} row / "
                    f"{sae['n_col_features']} col features; ablation selectivity row {_f(sel['row'])}{_iv(iv['row'])}, "
                    f"col {_f(sel['col'])}{_iv(iv['col'])} (needs >= {SELECTIVE})"}


def _f(v, d: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{d}f}"


C2_SETS = (("all_positional", "random_all_positional", "all positional (row+col+mixed)"),
           ("all", "random_features", "row+col"), ("row_only", "random_row", "row only"),
           ("col_only", "random_col", "col only"))  # permuted set, its control, label; the first decides C2


def _variant(ap: dict, name: str) -> dict:
    v = ap.get(name)
    return v if isinstance(v, dict) and "skipped" not in v else {}


def _drop(ap: dict, name: str) -> Interval | None:
    v = _variant(ap, name)
    return bounds(v.get("drop_points"), v.get("drop_ci95"))


def _c2(spec: str, ap: dict) -> dict:
    allv, rnd = _variant(ap, "all"), _variant(ap, "random_features")
    drop, ctrl = allv.get("drop_points"), rnd.get("drop_points")
    treated, control = _drop(ap, "all_positional"), _drop(ap, "random_all_positional")
    result = all_of(at_least(treated, MIN_DROP), exceeds(treated, control, CONTROL_FACTOR))
    allpos = _variant(ap, "all_positional").get("drop_points")
    in_range = allpos is not None and 24 <= allpos <= 31
    pe = _variant(ap, "pos_embed_shuffle").get("drop_points")
    note = _variant(ap, "random_all_positional").get("note")
    parts = []
    for kept, ctrl_name, label in C2_SETS:
        k, c = _variant(ap, kept), _variant(ap, ctrl_name)
        parts.append(f"{label} ({_n(k)}): {_f(k.get('drop_points'), 1)}{_iv(_drop(ap, kept), 1)} pts vs its control "
                     f"({_n(c)}) {_f(c.get('drop_points'), 1)}{_iv(_drop(ap, ctrl_name), 1)}")
    return {"result": result,
            "numbers": {"drop_points": drop, "random_control_drop": ctrl, "pos_embed_shuffle_drop": pe,
                        "all_positional_drop": allpos, "in_study_range": in_range,
                        "all_positional_drop_ci95": None if treated is None else list(treated),
                        "all_positional_control_drop": _variant(ap, "random_all_positional").get("drop_points"),
                        "all_positional_control_drop_ci95": None if control is None else list(control),
                        "n_all_positional": _variant(ap, "all_positional").get("n_features"),
                        "n_control": _variant(ap, "random_all_positional").get("n_features"), "control_note": note},
            "text": f"{spec}: top-1 drop when permuting " + "; ".join(parts) + f"; shuffled APE table {_f(pe, 1)}"
                    + (f" (control: {note})" if note else "")
                    + f"; C2 reads the all-positional set (needs >= {MIN_DROP:g} and > {CONTROL_FACTOR:g}x its control)"
                    f"{', within' if in_range else ', outside'} the study's 24-31"}


def _n(v: dict) -> str:
    n = v.get("n_features")
    return "n/a" if n is None else str(n)


def _c3(spec: str, ra: dict) -> dict:
    c = ra["conditions"]
    base = c["baseline"]
    chance = {"row": ra["chance_row"], "col": ra["chance_col"]}
    removal = ra.get("removal") or {}
    nums: dict[str, Any] = {}
    outcomes: list[Outcome] = []
    ivs: dict[str, Interval | None] = {}
    for a, b in (("row", "col"), ("col", "row")):
        off = c[f"no_{a}"]
        kept_own = kept_fraction(base[f"{a}_acc"], off[f"{a}_acc"], chance[a])
        kept_other = kept_fraction(base[f"{b}_acc"], off[f"{b}_acc"], chance[b])
        removed = None if kept_own is None else 1 - kept_own
        measured = removal.get(f"no_{a}") or {}
        rm, kp = f"no_{a}_{a}_removed", f"no_{a}_{b}_kept"
        nums[rm] = removed
        nums[kp] = kept_other
        nums[f"no_{a}_top1"] = off.get("top1")
        nums[f"{rm}_ci95"], nums[f"{kp}_ci95"] = measured.get("removed_ci95"), measured.get("kept_ci95")
        ivs[rm] = None if removed is None else bounds(removed, nums[f"{rm}_ci95"])
        ivs[kp] = None if kept_other is None else bounds(kept_other, nums[f"{kp}_ci95"])
        outcomes.extend((at_least(ivs[rm], MIN_REMOVED), at_least(ivs[kp], MIN_KEPT)))

    def frac(key: str) -> str:
        iv = ivs[key]
        return _pc(nums[key]) + ("" if iv is None or iv[0] == iv[1] else f" [{_pc(iv[0])}, {_pc(iv[1])}]")

    return {"result": all_of(*outcomes), "numbers": nums,
            "text": f"{spec}: no_row removes {frac('no_row_row_removed')} of above-chance row decodability, "
                    f"col keeps {frac('no_row_col_kept')}; no_col removes {frac('no_col_col_removed')} of col, "
                    f"row keeps {frac('no_col_row_kept')} (needs >= {_pc(MIN_REMOVED)} removed and >= "
                    f"{_pc(MIN_KEPT)} kept; top-1 {_f(base.get('top1'))} -> no_row "
                    f"{_f(nums['no_row_top1'])}, no_col {_f(nums['no_col_top1'])})"}


def _pc(v) -> str:
    return "n/a" if v is None else f"{100 * v:.0f}%"


def _c4(spec: str, ra: dict, rh: dict | None) -> dict:
    rec = {a: median_recovery(ra["recovery"][a]) for a in ("row", "col")}
    med = ra.get("median_recovery") or {}
    rec_ci = {a: (med.get(a) or {}).get("median_rec_ci95") for a in ("row", "col")}
    rec_iv = {a: bounds(rec[a], rec_ci[a]) for a in ("row", "col")}
    prim, S, S_ci = None, None, None
    if rh and rh.get("primary_rebuilding_head"):
        prim = rh["primary_rebuilding_head"]
        S = rh["axis_index"][prim[0]][prim[1]]
        cis = rh.get("axis_index_ci95")
        S_ci = cis[prim[0]][prim[1]] if cis else None
    S_iv = None if S is None else bounds(S, S_ci)
    result = all_of(inside(rec_iv["row"], 0.0, 1.0), inside(rec_iv["col"], 0.0, 1.0),
                    at_least(magnitude(S_iv), SPECIALISED))
    return {"result": result,
            "numbers": {"median_recovery_row": rec["row"], "median_recovery_col": rec["col"], "primary_head": prim,
                        "primary_axis_index": S,
                        "n_specialised_heads": len(rh.get("specialised_heads", [])) if rh else None,
                        # cross-check, reported beside the rule: the same heads under mean-ablation?
                        "top_heads_overlap": rh.get("top_heads_overlap") if rh else None,
                        "primary_tops_mean_ablation": _first_under(rh, prim, "mean_ablate"),
                        # and by its direct effect on the axis probes (iii); every pair of methods' top heads
                        "primary_tops_direct_effect": _first_under(rh, prim, "direct_effect"),
                        "top_heads_agreement": rh.get("top_heads_agreement") if rh else None,
                        "median_recovery_row_ci95": rec_ci["row"], "median_recovery_col_ci95": rec_ci["col"],
                        "primary_axis_index_ci95": S_ci},
            "text": f"{spec}: median recovery row {_f(rec['row'])}{_iv(rec_iv['row'])}, col "
                    f"{_f(rec['col'])}{_iv(rec_iv['col'])} (needs inside (0, 1)); primary rebuilding head "
                    f"{_head(prim)} axis index {_f(S)}{_iv(S_iv)} (needs |S| >= {SPECIALISED})"}


def _first_under(rh: dict | None, prim: list[int] | None, method: str) -> bool | None:
    """Whether the primary rebuilding head also tops another method's ranking (None: not measured)."""
    top = (rh or {}).get("top_heads")
    if prim is None or not top or not top.get(method):
        return None
    return list(prim) == list(top[method][0])


def _head(lh: list[int] | None) -> str:
    return f"L{lh[0]}H{lh[1]}" if lh else "n/a"


def _c5(spec: str, rh: dict) -> dict:
    prim, rank = rh.get("primary_rebuilding_head"), rh.get("primary_head_drop_rank")
    drop = rh["drop_points"][prim[0]][prim[1]] if prim else None
    cis = rh["drop_ci95"]
    big = rh["largest_drop_head"]
    n_heads = len(rh["layers"]) * rh["num_heads"]
    n_late = (len(rh["layers"]) - rh["restore_from"]) * rh["num_heads"]
    closest = closest_rival(rh.get("primary_margin_ci95"))
    rival = "" if closest is None else (f"; closest rival {_head(closest[0])}: margin {_ci(closest[1])} pts")
    return {"result": _c5_result(rh, prim),
            "numbers": {"primary_head": prim, "primary_drop_points": drop,
                        "primary_drop_ci95": cis[prim[0]][prim[1]] if cis and prim else None,
                        "drop_rank": rank, "largest_drop_head": big,
                        "drop_rank_among_layers_ge_R": rh.get("primary_head_drop_rank_after_R"),
                        "largest_drop_points": rh["drop_points"][big[0]][big[1]],
                        "largest_drop_ci95": cis[big[0]][big[1]] if cis else None,
                        "closest_rival_head": None if closest is None else closest[0],
                        "closest_rival_margin_ci95": None if closest is None else closest[1], "n_heads": n_heads,
                        **_c5_ablation_numbers(rh)},
            "text": f"{spec}: primary rebuilding head {_head(prim)} drops top-1 by {_f(drop, 1)} pts"
                    f"{'' if not (cis and prim) else ' ' + _ci(cis[prim[0]][prim[1]])}, rank {rank} of "
                    f"{n_heads} (largest: L{big[0]}H{big[1]}, {rh['drop_points'][big[0]][big[1]]:.1f} pts){rival}; "
                    f"rank {rh.get('primary_head_drop_rank_after_R')} among the {n_late} heads of layers >= "
                    f"R={rh['restore_from']}"}


def _ci(iv: list[float]) -> str:
    return f"[{iv[0]:.1f}, {iv[1]:.1f}]"


def _c5_result(rh: dict, prim: list[int] | None) -> Outcome:
    """The paired margins (`primary_margin_ci95`): every other head's below the primary's drop."""
    if prim is None:
        return FAILS
    margins = rh["primary_margin_ci95"]
    return all_positive([iv for row in margins for m in row if (iv := bounds(None, m)) is not None])


def _c5_ablation_numbers(rh: dict) -> dict:
    """Which ablation C5's verdict rests on ('identity': the head's rotations removed) and C5's
    outcome under each ablation rope_heads measured (`c5_ablations`; absent in older results)."""
    abl = rh.get("c5_ablations")
    out: dict = {"ablation": rh.get("c5_rests_on") or "identity"}
    if isinstance(abl, dict):
        out["outcome_under_ablation"] = {k: v.get("outcome") for k, v in abl.items() if isinstance(v, dict)}
    return out


SEED_SUFFIX = re.compile(r"-seed(\d+)$")
# the number each claim's seed summary averages (a key of the claim's per-model numbers)
HEADLINE_NUMBER = {"C1": "min_selectivity", "C2": "all_positional_drop", "C3": "min_removed",
                   "C4": "mean_median_recovery", "C5": "primary_drop_points"}


def model_family(spec: str) -> str:
    """Seeds of one model share a family: `NAME-seed<k>` belongs to `NAME` (seed 0 is `NAME`)."""
    return SEED_SUFFIX.sub("", spec)


def _headline(cid: str, nums: dict) -> float | None:
    pairs = {"C1": ("row_selectivity", "col_selectivity"), "C3": ("no_row_row_removed", "no_col_col_removed"),
             "C4": ("median_recovery_row", "median_recovery_col")}
    keys = pairs.get(cid, (HEADLINE_NUMBER[cid],))
    vals = [nums.get(k) for k in keys]
    xs = [float(v) for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v]
    if len(xs) < len(keys):
        return None  # a number the summary needs is missing or undefined on this seed
    return sum(xs) / 2 if cid == "C4" else min(xs)


def seed_summaries(cid: str, found: list[tuple[str, dict]]) -> dict[str, SeedSummary]:
    """Per model family with >= 2 seeds: on how many the claim holds, and the headline number's
    mean with a Student-t interval over the seeds."""
    families: dict[str, list[tuple[str, dict]]] = {}
    for spec, r in found:
        families.setdefault(model_family(spec), []).append((spec, r))
    out = {}
    for fam, members in families.items():
        if len(members) < 2:
            continue
        values = [_headline(cid, r["numbers"]) for _, r in members]
        known_values = [v for v in values if v is not None]
        mean, ci = seed_interval(known_values) if known_values else (None, None)
        out[fam] = SeedSummary(models=[spec for spec, _ in members],
                               holds=sum(r["result"] == HOLDS for _, r in members),
                               results=[r["result"] for _, r in members], number=HEADLINE_NUMBER[cid], values=values,
                               mean=mean, ci95=ci)
    return out


def _seed_text(seeds: dict[str, SeedSummary]) -> str:
    return "; ".join(f"{fam}: holds on {s.holds} of {len(s.models)} seeds, {s.number} {_f(s.mean)}"
                     f"{'' if s.ci95 is None else f' [{s.ci95[0]:.2f}, {s.ci95[1]:.2f}]'}" for fam, s in seeds.items())


def summarise(models: dict[str, dict]) -> Summary:
    """Verdicts per claim from the models' results (each entry as results.json holds it)."""
    claims: list[dict[str, Any]] = []
    per: dict[str, list[tuple[str, dict]]] = {c: [] for c in CLAIM_TEXT}
    for spec, m in models.items():
        if m.get("sae"):
            per["C1"].append((spec, _c1(spec, m["sae"])))
        if m.get("ape_permute"):
            per["C2"].append((spec, _c2(spec, m["ape_permute"])))
        if m.get("rope_axis"):
            per["C3"].append((spec, _c3(spec, m["rope_axis"])))
            per["C4"].append((spec, _c4(spec, m["rope_axis"], m.get("rope_heads"))))
        if m.get("rope_heads"):
            per["C5"].append((spec, _c5(spec, m["rope_heads"])))
    for cid, text in CLAIM_TEXT.items():
        scheme = CLAIM_SCHEME[cid]
        found = per[cid]
        seeds = seed_summaries(cid, found)
        evidence = "; ".join(r["text"] for _, r in found) or f"no {scheme.upper()} model was run"
        claims.append({
            "id": cid, "claim": text, "scheme": scheme, "verdict": aggregate([r["result"] for _, r in found]),
            "evidence": (f"over seeds: {_seed_text(seeds)}. " if seeds else "") + evidence, "seeds": seeds,
            "numbers": {spec: {**r["numbers"], "holds": r["result"] == HOLDS, "result": r["result"]}
                        for spec, r in found},
            "models": [spec for spec, _ in found],
        })
    return Summary(claims=[ClaimVerdict.model_validate(c) for c in claims], rules=rules_text())
