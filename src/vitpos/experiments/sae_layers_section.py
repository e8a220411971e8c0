"""The sae_layers stage's report section and summary line (`vitpos.experiments.sae_layers`).

The section shows C1 and C2 at every swept site (the embedding first, then each block output) and over
the plausible ones, read by the claims' own rules: the report hands them in (`ClaimRules`), an
experiment never imports the claims. Beside C2, each site's position budget: the share of the
APE-table shuffle's effect its edits reproduce. Which images chose the plausible sites (half A) and
which the claims read there (half B) is said in the head, and each site's selecting drop (half A's)
has its column beside the drops read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vitpos.report.format import budget_text, ci, drop_or_why, e, fmt_value, fnum, pts, table
from vitpos.results.ape_permute import position_budget, prefix_scope
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.sae_layers import PLAUSIBLE, LayerPoint, SAELayersResult


def _c1_drop(n: Mapping[str, Any], axis: str, control: bool = False) -> str:
    """A layer's own-axis probe drop (or its matched control's) as C1 read it (`n`: its numbers there)."""
    key = f"{axis}_control_probe_drop" if control else f"{axis}_probe_drop"
    return f"{pts(n.get(key))} {ci(n.get(f'{key}_ci95'))}".rstrip()


def _sel(n: Mapping[str, Any], axis: str) -> str:
    return f"{fnum(n.get(f'{axis}_selectivity'), 2)} {ci(n.get(f'{axis}_selectivity_ci95'), digits=2)}".rstrip()


def _permuted(p: LayerPoint, variant: str) -> str:
    return "n/a" if p.permute is None else drop_or_why(p.permute.outcome(variant))


def _budget(p: LayerPoint, variant: str) -> str:
    if p.permute is None or p.permute.position_budget is None:
        return "not measured"  # a sweep written before the position budget
    return budget_text(position_budget(p.permute, variant))


def _prefix(r: SAELayersResult) -> str:
    """What the edits do to the prefix tokens at the embedding and at the block outputs (from the points)."""
    said = []
    for p in (next((p for p in r.points if p.site == "resid_pre"), None),
              next((p for p in r.points if p.site == "resid_post"), None)):
        if p is not None and p.permute is not None and p.permute.prefix_tokens:
            said.append(f"at {p.key}: {prefix_scope(p.permute)}")
    return (" Prefix tokens: " + "; ".join(e(x) for x in said) + ".") if said else ""


def _shuffle(r: SAELayersResult) -> str:
    """The APE-table shuffle's drop (the budget's denominator: an input edit, the same at every site) or why
    the budget is undefined."""
    p = next((p for p in r.points if p.permute is not None), None)
    if p is None or p.permute is None:
        return ""
    b = position_budget(p.permute, "all_positional")
    if b.share is None and b.undefined:
        return f" Position budget: undefined ({e(b.undefined)})."
    shuffle = drop_or_why(p.permute.outcome("pos_embed_shuffle"))
    return (f" Position budget: each edit's drop over the APE-table shuffle's ({e(shuffle)}, an input edit: measured "
            "anew at each site on the same images), with its paired-bootstrap interval over the images.")


def _sweep_images(r: SAELayersResult) -> str:
    """Which images the per-layer SAEs trained on and which C1's causal check read, where not the run's data."""
    p = next((p for p in r.points if p.sae is not None), None)
    if p is None or p.sae is None:
        return ""
    causal = p.sae.causal.data if p.sae.causal is not None else None
    norm = "" if r.sae_high_norm is None else f"; tokens over {r.sae_high_norm:g}x the median norm left out"
    if p.sae.data == r.data:
        return norm
    return f"; SAEs trained on {e(p.sae.data)} images, the causal check read on {e(causal or p.sae.data)}{norm}"


def section(r: SAELayersResult, rules: ClaimRules) -> str:
    # C1 and C2 at each site and over the plausible ones, read by the claims' own rules
    c1 = {p.key: rules.at_layer("C1", r.model, p) for p in r.points}
    c2 = {p.key: rules.at_layer("C2", r.model, p) for p in r.points}
    over = {name: rules.over_plausible([at[key].result for key in rules.plausible_sites(r)])
            for name, at in (("C1", c1), ("C2", c2))}
    plaus = ", ".join(f"{p.key} ({p.selection_frequency:.0%})" for p in r.points if p.key in r.plausible_sites)
    head = (f"<p>{e(r.model)} on {e(r.data)}: an SAE of its own at each of {e(r.layer_rule)} (embed: resid_pre of "
            "block 0, the APE-added tokens; L&lt;n&gt;: resid_post of block n; TopK k "
            f"{e(r.sae_k)}, expansion {e(r.sae_expansion)}, {e(r.sae_images)} training images x {e(r.sae_epochs)} "
            f"epochs, {e(r.sae_eval_images)} held-out images for the causal check{_sweep_images(r)}), and the "
            f"permutation of its positional features on {e(r.permute_images)} {e(r.data)} images (seeds "
            f"{e(fmt_value(r.seeds))}). The layer where "
            "position matters most for behaviour is the largest all-positional drop; its selection frequency is "
            f"bootstrapped over the {_selecting(r)} images (the same resample at every site; the embedding is one "
            f"more site). Plausible sites (chosen in at least {PLAUSIBLE:.0%} of the resamples): "
            f"<b>{e(plaus or 'none')}</b>; {e(r.selection_said(rule=True))}. "
            f"Over them C1 <b>{e(over['C1'])}</b> and C2 <b>{e(over['C2'])}</b> (a claim holds when it holds at "
            "every plausible site); the claims table reads the curve this way, the single-layer sae and ape_permute "
            f"stages are reported beside it.{_shuffle(r)}{_prefix(r)}</p>")
    rows = []
    for p in r.points:
        n = c1[p.key].numbers
        rows.append([p.key + (" *" if p.key in r.plausible_sites else ""), fnum(p.fvu),
                     f"{p.n_row} / {p.n_col} / {p.n_mixed}", c1[p.key].result, _c1_drop(n, "row"),
                     _c1_drop(n, "row", True), _c1_drop(n, "col"), _c1_drop(n, "col", True),
                     f"{_sel(n, 'row')}; {_sel(n, 'col')}", c2[p.key].result,
                     _permuted(p, "all_positional"), _permuted(p, "swap_all_positional"),
                     _permuted(p, "random_all_positional"), _budget(p, "all_positional"), _budget(p, "row_only"),
                     _budget(p, "col_only"), _budget(p, "subspace_positional"), _budget(p, "subspace_error"),
                     _selection_drop(r, p), f"{p.selection_frequency:.0%}"])
    return head + table(["site (* plausible)", "FVU", "row / col / mixed", "C1 here", "row set: row-probe drop",
                         "its control", "col set: col-probe drop", "its control", "selectivity row; col", "C2 here",
                         "all-positional drop", "same-position swap", "matched random",
                         "position budget: all positional", "row set", "col set", "positional subspace",
                         "SAE error in it", "selecting drop (half A)", "selected"], rows)


def _selecting(r: SAELayersResult) -> str:
    """Which images the selection bootstrap resampled: half A's, or (older sweeps) the verdict's own."""
    return "same" if r.held_out is None else f"{len(r.held_out.selection)} half-A"


def _selection_drop(r: SAELayersResult, p: LayerPoint) -> str:
    """The all-positional drop that selected the site (half A's), or why there is none."""
    if r.held_out is None:
        return "the drop read (same images)"
    if p.selection_drop is None:
        return "not measured (no positional latent)"
    return f"{pts(p.selection_drop)} {ci(p.selection_drop_ci95)}".rstrip()


def summary(r: SAELayersResult) -> str:
    """The plausible sites and each one's all-positional drop and position budget (C1 and C2 over them are
    the claims')."""
    drops = ", ".join(f"{p.key} ({p.selection_frequency:.0%}): {pts(p.all_positional_drop)} "
                      f"{ci(p.all_positional_drop_ci95)}".rstrip() + f", budget {_budget(p, 'all_positional')}"
                      for p in r.points if p.key in r.plausible_sites)
    return (f"{len(r.points)} sites swept; plausible sites, all-positional drop: {drops or 'none'} "
            f"({r.selection_said()})")
