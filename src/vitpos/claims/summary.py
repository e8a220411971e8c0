"""The claims' summary of a run: per registered claim, its verdict over the models, one sentence, the
headline number per model family with its interval and the seeds it holds on, per model the numbers
and conditions its rule read, and the sensitivity of the verdict to each of its thresholds.

The verdict rules are data (`RULES_PREAMBLE`, each claim's `rule`, the rule set's thresholds,
`AGGREGATION`), recorded with every summary (`rules_text`) and shown in the report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from vitpos.analysis.stats import seed_interval
from vitpos.claims.base import Claim, ModelClaim
from vitpos.claims.inputs import ClaimInputs, ModelResults, model_family
from vitpos.claims.intervals import FAILS, HOLDS, INCONCLUSIVE, aggregate, all_of, bounds, measured_at_least
from vitpos.claims.registry import CLAIMS, rule_set
from vitpos.claims.rules import RuleSet, Thresholds, sensitivity
from vitpos.claims.verdict import ClaimVerdict, FamilyHeadline, SeedSummary, Summary

RULES_PREAMBLE = """(ours, since the study gives only its abstract; every claim reads its thresholds from
the versioned rule set `claims.registry.rule_set()` (named C1.x ... C5.x below; the summary records its
version and hash, and each threshold's sensitivity curve); every measurement and control is defined
in docs/methods.md):
  Each condition of a rule reads a 95 % interval [lo, hi] of its measurement (analysis/stats.py;
  a measurement without one counts as the interval [x, x]) and comes out true (the whole interval
  is on the rule's side of the threshold), false (the whole interval is on the other side) or
  undecided (the threshold lies inside the interval). Per model a claim `holds` when every
  condition is true, `fails` when any is false, and is `inconclusive` otherwise."""
AGGREGATION = """Aggregation over the models of the claim's scheme: `supported` when it holds for every model,
`partly supported` when it holds for some but not all, `not supported` when it holds for none and
fails for at least one, `inconclusive` when it is inconclusive for every model. A claim is
`not applicable` where no model of its scheme ran. `numbers[model]` records `result` (holds /
fails / inconclusive) and `holds` (result == holds)."""
FAMILY_RULE = """Model families (`NAME`, `NAME-seed1`, ...: independently trained seeds), beside the per-seed results
and not entering the verdict above: a family `holds` when the claim holds on every seed and, where
the claim's headline number has one threshold (C1: C1.selective, C2: C2.min_drop), the seeds'
Student-t interval of that number lies at or above it; it `fails` when the claim fails on every seed
or that interval lies below the threshold; otherwise it is `inconclusive`."""


def rules_text(rules: RuleSet | None = None) -> str:
    """The verdict rules as one text (what the summary records as `rules`)."""
    rules = rule_set() if rules is None else rules
    values = "\n".join(f"  {t.name} = {t.value:g} {t.unit} ({t.source}): {t.meaning}" for t in rules.thresholds)
    return "\n".join([RULES_PREAMBLE, *(c.rule for c in CLAIMS), f"Rule set version {rules.version} "
                      f"(claims/rules.py, hash {rules.digest()}):", values, AGGREGATION, FAMILY_RULE])


# --- seeds, model families and the headline number ---------------------------------------------------
def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def headline_value(claim: Claim, nums: Mapping[str, Any]) -> float | None:
    """The claim's headline number on one model from its numbers (None: a part is missing or undefined)."""
    h = claim.headline
    parts = h.parts_of(nums)
    xs = [x for k in parts if (x := _number(nums.get(k))) is not None]
    if len(xs) < len(parts):
        return None  # a number the summary needs is missing or undefined on this seed
    return sum(xs) / 2 if h.how == "mean" else min(xs)


def headline_interval(claim: Claim, nums: Mapping[str, Any]) -> list[float] | None:
    """The headline number's 95 % interval on one model, from its parts' intervals (the smaller of
    two: the ends' minima; the mean of two: the ends' means); None where no part has one."""
    h = claim.headline
    cis = [nums.get(k) for k in h.ci_keys(nums)]
    if headline_value(claim, nums) is None or all(bounds(None, ci) is None for ci in cis):
        return None
    ivs = [bounds(nums.get(k), ci) for k, ci in zip(h.parts_of(nums), cis, strict=True)]
    if any(iv is None or not all(map(math.isfinite, iv)) for iv in ivs):
        return None
    los, his = [iv[0] for iv in ivs if iv], [iv[1] for iv in ivs if iv]
    if h.how == "mean":
        return [sum(los) / len(los), sum(his) / len(his)]
    return [min(los), min(his)]


def _families(found: Sequence[tuple[str, ModelClaim]]) -> dict[str, list[tuple[str, ModelClaim]]]:
    families: dict[str, list[tuple[str, ModelClaim]]] = {}
    for spec, r in found:
        families.setdefault(model_family(spec), []).append((spec, r))
    return families


def family_result(claim: Claim, results: Sequence[str], ci: Sequence[float] | None,
                  t: Thresholds) -> tuple[str, str]:
    """A model family's result by `FAMILY_RULE` from its seeds' results and the seeds' interval of the
    headline number, with the reason in words: the seeds' conjunction and, where the headline has a
    threshold, the interval read against it as any condition reads one (`measured_at_least`)."""
    n, holds, fails = len(results), results.count(HOLDS), results.count(FAILS)
    seeds = HOLDS if holds == n else FAILS if fails == n else INCONCLUSIVE
    name = claim.headline.threshold
    if name is None:
        return seeds, f"{holds}/{n} seeds hold; {claim.id}'s headline has no single threshold"
    thr, iv = t[name], None if ci is None else (float(ci[0]), float(ci[1]))
    on_interval = measured_at_least(iv, thr)
    verb = {HOLDS: "clears", FAILS: "below"}.get(on_interval, "straddles")
    where = "no seed interval" if iv is None else f"seed interval [{iv[0]:.3g}, {iv[1]:.3g}] {verb} {name} {thr:g}"
    return all_of(seeds, on_interval), f"{holds}/{n} seeds hold; {where}"


def seed_summaries(claim: Claim, found: Sequence[tuple[str, ModelClaim]],
                   t: Thresholds | None = None) -> dict[str, SeedSummary]:
    """Per model family with >= 2 seeds: on how many the claim holds, the headline number's mean
    with a Student-t interval over the seeds, and (given the thresholds `t`) the family's result."""
    out = {}
    for fam, members in _families(found).items():
        if len(members) < 2:
            continue
        values = [headline_value(claim, r.numbers) for _, r in members]
        known_values = [v for v in values if v is not None]
        mean, ci = seed_interval(known_values) if known_values else (None, None)
        lo, hi = claim.headline.range or (-math.inf, math.inf)
        if ci is not None:  # a t-interval over two or three seeds can leave the number's range: cut it there
            ci = [max(ci[0], lo), min(ci[1], hi)]
        results = [r.result for _, r in members]
        fam_result, reason = family_result(claim, results, ci, t) if t is not None else (None, None)
        out[fam] = SeedSummary(models=[spec for spec, _ in members], holds=results.count(HOLDS), results=results,
                               number=claim.headline.number, values=values, mean=mean, ci95=ci,
                               family_result=fam_result, family_reason=reason)
    return out


def headline_gap(claim: Claim, nums: Mapping[str, Any]) -> str:
    """Why a model has no headline number, in words: the reason its rule read nothing, where the
    numbers say it (the claim's `headline_gap`), else that it is undefined."""
    return claim.headline_gap(nums) or "a number its rule reads is undefined on this model"


def family_headlines(claim: Claim, found: Sequence[tuple[str, ModelClaim]],
                     seeds: Mapping[str, SeedSummary]) -> list[FamilyHeadline]:
    """The claim's headline number per model family: one model's number with its own interval, or
    the seeds' mean with their Student-t interval (`seeds`), and on how many seeds the claim holds."""
    out = []
    h = claim.headline
    for fam, members in _families(found).items():
        s = seeds.get(fam)
        first = members[0][1].numbers
        fam_result = reason = None
        n_sae = first.get("n_sae_seeds")
        sources = first.get("interval_sources")
        sites = {r.numbers.get("headline_site") for _, r in members}  # read over the layer sweep: where
        site = sites.pop() if len(sites) == 1 else "per seed"
        if s is not None:
            value, ci, fam_result, reason = s.mean, s.ci95, s.family_result, s.family_reason
            sources = None if sources is None else ["model_seeds"]  # each seed's number pooled over its SAE seeds
        else:
            value, ci = headline_value(claim, first), headline_interval(claim, first)
        out.append(FamilyHeadline(family=fam, models=[spec for spec, _ in members],
                                  results=[r.result for _, r in members],
                                  holds=sum(r.result == HOLDS for _, r in members), number=h.number,
                                  label=h.label, unit=h.unit, value=value, ci95=ci,
                                  why_undefined=None if value is not None else headline_gap(claim, first),
                                  family_result=fam_result, family_reason=reason,
                                  sae_seeds=n_sae if isinstance(n_sae, int) else None,
                                  site=site if isinstance(site, str) else None,
                                  interval_sources=[str(x) for x in sources] if isinstance(sources, list) else None))
    return out


def claim_sentence(claim: Claim, results: Sequence[str], t: Thresholds) -> str:
    """The claim's reading in one sentence: on how many models it holds, and what it needs."""
    scheme = {"ape": "APE", "rope": "RoPE"}.get(claim.scheme, "its")
    if not results:
        return f"No {scheme} model was run."
    n, fails, unsure = len(results), results.count(FAILS), results.count(INCONCLUSIVE)
    rest = ", ".join(p for p in (f"fails on {fails}" if fails else "", f"inconclusive on {unsure}" if unsure else "")
                     if p)
    return (f"Holds on {results.count(HOLDS)} of {n} {scheme} model{'s' if n > 1 else ''}"
            f"{f' ({rest})' if rest else ''}: it needs that {claim.gist(t)}.")


def read_models(claim: Claim, models: Mapping[str, ClaimInputs], t: Thresholds) -> list[tuple[str, ModelClaim]]:
    """The claim's reading of every model that ran what it reads, in the models' order."""
    return [(spec, r) for spec, m in models.items() if (r := claim.read(spec, m, models, t)) is not None]


def verdict(claim: Claim, models: Mapping[str, ClaimInputs], rules: RuleSet) -> ClaimVerdict:
    """One claim over the models: its verdict, sentence, headlines, per-model numbers and conditions,
    and (a claim with thresholds in the rule set) its sensitivity curves."""
    t = rules.values()
    found = read_models(claim, models, t)
    seeds = seed_summaries(claim, found, t)
    results = [r.result for _, r in found]
    out = ClaimVerdict(
        id=claim.id, claim=claim.text, scheme=claim.scheme, verdict=aggregate(results),
        sentence=claim_sentence(claim, results, t), headlines=family_headlines(claim, found, seeds),
        notes=claim.notes(found, seeds), details={spec: r.text for spec, r in found}, seeds=seeds,
        numbers={spec: {**r.numbers, "holds": r.result == HOLDS, "result": r.result} for spec, r in found},
        conditions={spec: list(r.conditions) for spec, r in found}, models=[spec for spec, _ in found])
    if found and rules.of(claim.id):
        measured = set().union(*(m.measured() for m in models.values()))

        def reader(spec: str, m: ClaimInputs, vals: Thresholds) -> str | None:
            r = claim.read(spec, m, models, vals)
            return None if r is None else r.result

        out.sensitivity = sensitivity(claim.id, models, reader, aggregate, rules, measured=measured)
    return out


def summarise(models: Mapping[str, ModelResults | ClaimInputs]) -> Summary:
    """Verdicts per registered claim from the models' typed results (a study's model entries, or
    `ClaimInputs`)."""
    inputs = {spec: ClaimInputs.of(m) for spec, m in models.items()}
    rules = rule_set()
    return Summary(claims=[verdict(c, inputs, rules) for c in CLAIMS], rules=rules_text(rules),
                   rules_version=rules.version, rules_hash=rules.digest(), rule_set=rules)


__all__ = ["AGGREGATION", "FAMILY_RULE", "RULES_PREAMBLE", "claim_sentence", "family_headlines", "family_result",
           "headline_gap", "headline_value", "read_models", "rules_text", "seed_summaries", "summarise", "verdict"]
