"""The ape_permute stage's report section and summary line (`vitpos.experiments.ape_permute`)."""

from __future__ import annotations

from vitpos.report.format import budget_text, ci, drop_or_why, drop_text, e, fmt_value, fnum, num, pct, pts, table
from vitpos.results.ape_permute import (
    BUDGET_VARIANTS,
    CONJ_VARIANTS,
    ApePermuteResult,
    Outcome,
    VariantResult,
    position_budget,
    prefix_scope,
)
from vitpos.results.ape_permute import CONTROLS as APE_CONTROLS
from vitpos.results.base import Skipped

APE_SET_LABELS = {"all_positional": "all positional (row+col+mixed)", "all": "row+col", "row_only": "row only",
                  "col_only": "col only"}
CONJ_LABEL = "conjunction-inclusive (positional + conjunction)"
BUDGET_LABELS = {**APE_SET_LABELS, "subspace_positional": "positional subspace (span of their decoder directions)",
                 "subspace_error": "SAE error term in that subspace", "conj_positional": CONJ_LABEL}
# issue 47 item 3: the two positional sets and the edit-norm-matched controls, (variant, label, what it is)
CONJ_ROWS = (("all_positional", "all positional (row+col+mixed)", "C2 reads it"),
             ("conj_positional", CONJ_LABEL, "reported; same permutations"),
             ("norm_all_positional", "edit-norm control of all positional",
              "drawn from every non-positional latent (conjunction ones included); C2 reads it"),
             ("norm_all_positional_no_conj", "edit-norm control of all positional",
              "drawn from latents in neither set"),
             ("norm_conj_positional", "edit-norm control of conjunction-inclusive",
              "drawn from latents in neither set"))


def summary(r: ApePermuteResult) -> str:
    parts = []
    controls = r.controls if r.controls is not None else {"all": "random_features"}
    for v, label in APE_SET_LABELS.items():
        x = r.outcome(v)
        if isinstance(x, VariantResult):
            c = controls.get(v)
            parts.append(f"{label} {drop_text(x)}" + (f" (control {drop_text(r.outcome(c))})" if c else ""))
    conj = r.outcome("conj_positional")
    if isinstance(conj, VariantResult):
        parts.append(f"conjunction-inclusive {drop_text(conj)} (edit-norm control outside both sets "
                     f"{drop_text(r.outcome('norm_conj_positional'))})")
    return f"baseline top-1 {pct(r.baseline_top1)}; drop when permuting " + (", ".join(parts) or "n/a")


def section(r: ApePermuteResult) -> str:
    fc = r.feature_counts
    base_ci = ci(r.baseline_top1_ci95, 100, 1, "%")
    head = (f"<p>{e(r.model)} layer {e(r.layer)} {e(r.site)} on {e(r.data)}: {e(r.n_images)} images, seeds "
            f"{e(fmt_value(r.seeds))}; baseline top-1 <b>{pct(r.baseline_top1)}</b>"
            f"{e(' ' + base_ci if base_ci else '')}; "
            f"positional features: {e(fc.get('row', '?'))} row, {e(fc.get('col', '?'))} col, "
            f"{e(fc.get('mixed', '?'))} mixed"
            + (f", and {e(fc['conj'])} conjunction latents (position within content)" if "conj" in fc else "")
            + ". Drops in top-1 points with their 95% paired-bootstrap interval over "
            "images (seeds pooled); C2 reads the all-positional set against its same-position cross-image swap (a "
            "null by construction); the matched random controls are reported beside it.</p>")
    pairs = []
    for kept, ctrl in (r.controls or APE_CONTROLS).items():
        k, c = r.outcome(kept), r.outcome(ctrl)
        if k is None and c is None:
            continue
        pairs.append([APE_SET_LABELS.get(kept, str(kept)), _nf(k), drop_or_why(k),
                      _budget_cell(r, kept), str(ctrl), _nf(c), drop_or_why(c), _note(c)])
    out = head
    if pairs:
        out += "<h4>each permuted set beside its matched random control</h4>"
        out += table(["permuted set", "features", "drop [95% CI]", "position budget [95% CI]", "control", "features",
                      "control drop [95% CI]", "note"], pairs)
    out += budget_section(r) + conj_section(r)
    if r.nulls:
        nrows = []
        for v, of in r.nulls.items():
            x, k = r.outcome(v), r.outcome(of)
            nrows.append([str(of), drop_or_why(k), fnum(_edit_norm(k), 3), str(v), drop_or_why(x),
                          fnum(_edit_norm(x), 3), _note(x)])
        out += ("<h4>nulls by construction (C2 reads the same-position swap)</h4>"
                + table(["permuted set", "drop [95% CI]", "edit norm", "null", "null drop [95% CI]", "edit norm",
                         "note"], nrows))
    rows = []
    for v in r.variant_names():
        x = r.outcome(v)
        if x is None:
            rows.append([str(v), "not run", "", "", "", ""])
            continue
        if isinstance(x, Skipped):
            rows.append([str(v), f"skipped: {x.skipped}", "", "", "", ""])
            continue
        groups = "; ".join(f"{g}: {pts(gv.drop_points)}" for g, gv in x.per_group.items()) or "—"
        sd, t = num(x.top1_std), num(x.top1)
        top1 = f"{100 * t:.1f} ± {100 * sd:.1f}%" if t is not None and sd is not None else pct(t)
        rows.append([str(v), top1, pts(x.drop_points, x.drop_std), ci(x.drop_ci95) or "—",
                     "—" if x.n_features is None else str(x.n_features), groups])
    return out + "<h4>every variant</h4>" + table(["variant", "top-1", "drop (± std over seeds)", "drop 95% CI",
                                                    "features permuted", "drop per class group"], rows)


def _nf(x: Outcome | None) -> str:
    return str(x.n_features) if isinstance(x, VariantResult) and x.n_features is not None else "—"


def _note(x: Outcome | None) -> str:
    return (x.note or "") if isinstance(x, VariantResult) else ""


def _edit_norm(x: Outcome | None) -> float | None:
    return x.edit_norm if isinstance(x, VariantResult) else None


def budget_section(r: ApePermuteResult) -> str:
    """The position budget: each edit's share of the APE-table shuffle's effect, and what the edits do
    to the prefix tokens."""
    if r.position_budget is None:
        return "<p>Position budget: not measured (a result written before it).</p>"
    shuffle = r.variant("pos_embed_shuffle")
    budgets = {v: position_budget(r, v) for v in BUDGET_VARIANTS}
    undefined = next((b.undefined for b in budgets.values() if b.share is None and b.undefined
                      and "shuffle" in b.undefined), None)
    rows = [[BUDGET_LABELS.get(v, v), drop_or_why(r.outcome(v)), budget_text(b), _note(r.outcome(v))]
            for v, b in budgets.items() if r.outcome(v) is not None]
    rank = "" if r.subspace_rank is None else f" The positional subspace has rank {e(r.subspace_rank)}."
    return ("<h4>position budget: the share of the APE-table shuffle's effect each edit reproduces</h4>"
            f"<p>drop(edit) / drop(APE-table shuffle) on the same images (shuffle: {e(drop_text(shuffle))}), "
            "with the 95% paired-bootstrap interval of the ratio over images (seeds pooled per image)"
            + ("" if undefined is None else f"; <b>undefined here</b>: {e(undefined)}") + f".{rank} "
            f"{_sentence(e(prefix_scope(r)))}.</p>"
            + table(["edit", "drop [95% CI]", "position budget [95% CI]", "note"], rows))


def conj_section(r: ApePermuteResult) -> str:
    """Issue 47 item 3: the all-positional and the conjunction-inclusive sets side by side (latents, drop,
    position budget, pooled over the SAE seeds where they were) with the edit-norm-matched controls, the one
    C2 reads and the two drawn from latents in neither set ("" for a result written before them)."""
    if all(r.outcome(v) is None for v in CONJ_VARIANTS):
        return ""
    rows = []
    for v, label, what in CONJ_ROWS:
        x = r.outcome(v)
        pooled = None if r.seed_pool is None else (r.seed_pool.budget or {}).get(v)
        rows.append([label, str(v), _nf(x), drop_or_why(x), _pooled_cell(r, v),
                     _budget_cell(r, v) if v in BUDGET_VARIANTS else "",
                     "" if pooled is None else budget_text(pooled), fnum(_edit_norm(x), 3),
                     what + (f"; {_note(x)}" if _note(x) else "")])
    return ("<h4>positional sets with conjunctions (issue 47 item 3)</h4><p>Conjunction latents fire for some "
            "content only at some positions (\"this object at top-left\"): silent on most tokens, their η² of "
            "position over all tokens is small and the positional typing misses them. The sae stage types them by "
            "the bias-adjusted η² of position over the images where the latent fires. The conjunction-inclusive set "
            "is permuted with the all-positional set's permutations; C2's rule still reads the all-positional set "
            "and its control drawn from every non-positional latent; the controls drawn from latents in neither set "
            "show whether that control's cost came from conjunction latents.</p>"
            + table(["set", "variant", "latents", "drop [95% CI]", "pooled over SAE seeds", "position budget",
                     "pooled budget", "edit norm", "what"], rows))


def _pooled_cell(r: ApePermuteResult, v: str) -> str:
    """`v`'s drop pooled over the SAE seeds, each seed's drop and latents ("—": not pooled)."""
    p = r.pooled(v)
    if p is None:
        return "—"
    return (f"{pts(p.drop_points)} {ci(p.drop_ci95)}".rstrip() + f" (per SAE seed {p.seeds_text()}; latents "
            + " / ".join(map(str, p.per_seed_n_features)) + ")")


def _budget_cell(r: ApePermuteResult, variant: str) -> str:
    """The edit's position budget, or "not measured" in a result written before it."""
    return "not measured" if r.position_budget is None else budget_text(position_budget(r, variant))


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]
