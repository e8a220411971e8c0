"""Report rendering: figures are PNGs, the HTML is one well-formed, self-contained, escaped page.
Rendering from another working directory and the page in headless chromium are
integration/test_report_browser.py; the results documents come from conftest.make_results."""

from __future__ import annotations

import base64
import copy
import re
from html.parser import HTMLParser

import pytest

from conftest import APE, CLAIM_VERDICTS, GOLDEN, ROPE, XSS, XSS_DATA, make_results
from vitpos.errors import VitposError
from vitpos.plots import sweeps as plots
from vitpos.report.html import render_report
from vitpos.report.sections import PNG_MAGIC
from vitpos.results.ape_permute import VARIANTS, ApePermuteResult
from vitpos.results.base import Skipped
from vitpos.results.rope_axis import RopeAxisResult
from vitpos.results.rope_heads import RopeHeadsResult
from vitpos.study.results import HEADLINE_FIGURE, figure_key, model_slug

L, H = 4, 3  # toy depth and heads


# ---------------------------------------------------------------- fake results (JSON, and typed)
def ape_permute_doc() -> dict:
    def v(top1, drop, nf, groups=True):
        d = {"top1": top1, "top1_std": 0.01, "drop_points": drop, "drop_std": 1.2, "per_seed_top1": [top1],
             "n_features": nf, "per_group": {}}
        if groups:
            d["per_group"] = {"vertical": {"top1": top1 - 0.05, "drop_points": drop + 4},
                              "horizontal": {"top1": top1 + 0.05, "drop_points": drop - 4}}
        return d

    return {"model": APE, "layer": 2, "site": "resid_post", "data": "shapes", "n_images": 512, "seeds": [0, 1, 2],
            "baseline_top1": 0.912, "baseline_per_group": {}, "variants": list(VARIANTS),
            "all": v(0.639, 27.3, 40), "row_only": v(0.801, 11.1, 22), "col_only": v(0.79, 12.2, 18),
            "random_features": v(0.905, 0.7, 40, groups=False), "mean_ablate": v(0.70, 21.2, 40, groups=False),
            "all_positional": v(0.5, 41.2, 60),
            "pos_embed_shuffle": {"skipped": "model has no learned pos_embed <here>"},
            "feature_counts": {"row": 22, "col": 18}}


def ape_permute_result() -> ApePermuteResult:
    return ApePermuteResult.model_validate(ape_permute_doc())


def rope_axis_doc() -> dict:
    layers = list(range(L))
    clean = [0.6, 0.8, 0.9, 0.95]
    off = [0.25, 0.26, 0.3, 0.3]
    conds = {"baseline": {"row_acc": clean, "col_acc": clean, "row_acc_orig_probe": clean, "col_acc_orig_probe": clean,
                          "top1": 0.93, "per_group": {}, "axis": None, "restore_from": None},
             "no_row": {"row_acc": off, "col_acc": clean, "row_acc_orig_probe": off, "col_acc_orig_probe": clean,
                        "top1": 0.71, "per_group": {}, "axis": "row", "restore_from": None},
             "no_col": {"row_acc": clean, "col_acc": off, "row_acc_orig_probe": clean, "col_acc_orig_probe": off,
                        "top1": 0.72, "per_group": {}, "axis": "col", "restore_from": None},
             "no_both": {"row_acc": off, "col_acc": off, "row_acc_orig_probe": off, "col_acc_orig_probe": off,
                         "top1": 0.40, "per_group": {}, "axis": "both", "restore_from": None}}
    recovery = {"row": {}, "col": {}}
    for R in (1, 2):
        part = [off[i] if i < R else (off[i] + clean[i]) / 2 for i in layers]
        for axis in ("row", "col"):
            conds[f"restore_{axis}_R{R}"] = {f"{axis}_acc": part, f"{axis}_acc_orig_probe": [p - 0.1 for p in part],
                                             f"{'col' if axis == 'row' else 'row'}_acc": clean,
                                             f"{'col' if axis == 'row' else 'row'}_acc_orig_probe": clean,
                                             "top1": 0.85, "per_group": {}, "axis": axis, "restore_from": R}
            recovery[axis][str(R)] = {"layers": layers[R:], "rec": [0.5] * (L - R), "mean_rec": 0.5}
    return {"model": ROPE, "data": "shapes", "split": "test", "n_images": 100, "site": "resid_post", "layers": layers,
            "chance_row": 0.25, "chance_col": 0.25, "rope": {}, "conditions": conds, "recovery": recovery,
            "min_gap": 0.05}


def rope_axis_result() -> RopeAxisResult:
    return RopeAxisResult.model_validate(rope_axis_doc())


def rope_heads_doc() -> dict:
    drop = [[0.5 + layer + 0.1 * h for h in range(H)] for layer in range(L)]
    drop[2][1] = 9.5  # the primary rebuilding head has the largest drop
    rebuild = [[None] * H if layer < 2 else [0.05 * (h + 1) for h in range(H)] for layer in range(L)]
    rebuild[2][1] = 0.4
    axis_index = [[(-1) ** h * 0.3 * (layer % 3) for h in range(H)] for layer in range(L)]
    return {"model": ROPE, "data": "shapes", "axis": "row", "layers": list(range(L)), "num_heads": H,
            "restore_from": 2, "baseline_top1": 0.93, "baseline_top1_ci95": [0.9, 0.95], "n_top1_images": 500,
            "n_probe_images": 300, "recovery_restore": 0.6, "kl": {}, "drop_points": drop,
            "drop_ci95": [[[x - 1, x + 1] for x in r] for r in drop], "primary_margin_ci95": None,
            "mean_ablate_score": [[x / 2 if x is not None else None for x in r] for r in rebuild],
            "rebuild_score": rebuild, "axis_index": axis_index, "primary_rebuilding_head": [2, 1],
            "primary_head_drop_rank": 1, "largest_drop_head": [2, 1], "primary_head_drop_rank_after_R": 1,
            "largest_drop_head_after_R": [2, 1], "primary_is_largest_drop": True, "specialised_heads": []}


def rope_heads_result() -> RopeHeadsResult:
    return RopeHeadsResult.model_validate(rope_heads_doc())


# ---------------------------------------------------------------- HTML checks
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Checker(HTMLParser):
    """Tag balance (every non-void element closed in order) and the <img> sources."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.imgs: list[dict] = []
        self.counts: dict[str, int] = {}
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag == "img":
            self.imgs.append(dict(attrs))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            if tag in self.stack:
                while self.stack.pop() != tag:
                    pass
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def check_html(page: str) -> Checker:
    c = Checker()
    c.feed(page)
    c.close()
    assert not c.errors, c.errors[:5]
    assert c.stack == [], f"unclosed: {c.stack}"
    return c


def headline_rows(page: str) -> list[tuple[str, str]]:
    start = page.index('<table id="headline">')
    table = page[start:page.index("</table>", start)]
    return re.findall(r'<tr data-claim="(C\d)">(.*?)</tr>', table, flags=re.S)


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("fn, make", [(plots.plot_ape_permute, ape_permute_result),
                                      (plots.plot_rope_axis, rope_axis_result), (plots.plot_recovery, rope_axis_result),
                                      (plots.plot_rope_heads, rope_heads_result)])
def test_each_plot_writes_a_png(tmp_path, fn, make):
    path = fn(make(), tmp_path / "sub" / "fig.png")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert [p.name for p in path.parent.iterdir()] == ["fig.png"]  # no temp file left behind


def test_plots_tolerate_results_without_optional_parts(tmp_path):
    doc = ape_permute_doc()
    for v in ("row_only", "col_only", "all"):
        doc[v]["per_group"] = {}
    doc["mean_ablate"] = {"skipped": "no <latents>"}
    doc["model"] = "$weird$ name"  # must not be parsed as mathtext
    ape = ApePermuteResult.model_validate(doc)
    assert isinstance(ape.outcome("mean_ablate"), Skipped) and ape.variant("mean_ablate") is None
    assert plots.plot_ape_permute(ape, tmp_path / "a.png").read_bytes().startswith(PNG_MAGIC)
    axis = rope_axis_result()
    assert plots.restore_points(axis) == [1, 2]
    assert plots.plot_rope_axis(axis, tmp_path / "b.png", restore_from=1).read_bytes().startswith(PNG_MAGIC)
    heads = rope_heads_result().model_copy(update={"primary_rebuilding_head": None, "primary_head_drop_rank": None})
    assert plots.plot_rope_heads(heads, tmp_path / "c.png").read_bytes().startswith(PNG_MAGIC)


def test_rope_heads_rejects_misshaped_grid(tmp_path):
    heads = rope_heads_result()
    heads = heads.model_copy(update={"drop_points": heads.drop_points[:-1]})
    with pytest.raises(plots.VitposError, match="layers x heads"):
        plots.plot_rope_heads(heads, tmp_path / "x.png")


def test_draw_figures_names_and_skips(rendered):
    results, figs, _, out = rendered
    expected = {figure_key(APE, "probe"), figure_key(APE, "ape_permute"), figure_key(ROPE, "probe"),
                figure_key(ROPE, "rope_axis"), figure_key(ROPE, "rope_recovery"), figure_key(ROPE, "rope_heads"),
                figure_key(ROPE, "rope_prefix"), HEADLINE_FIGURE}
    assert set(figs) == expected  # the XSS model has no results that draw: nothing drawn
    for key, path in figs.items():
        assert results["figures"][key] == f"figures/{key}.png" and path == out / "figures" / f"{key}.png"
        assert re.fullmatch(r"[A-Za-z0-9._-]+\.png", path.name)
        assert path.read_bytes().startswith(PNG_MAGIC)
    slugs = {model_slug(s) for s in ("a:b", "a?b", "a/b", XSS)}
    assert len(slugs) == 4 and all(re.fullmatch(r"[A-Za-z0-9._-]+", s) for s in slugs)


def test_report_is_well_formed_and_self_contained(rendered):
    _, figs, page, out = rendered
    c = check_html(page)
    assert page.startswith("<!DOCTYPE html>")
    assert c.counts["table"] >= 8 and c.counts["section"] >= 3 * 7
    headline = page.index('<table id="headline">')
    assert page.index('alt="APE vs RoPE at a glance') < headline < page.index("<img", headline)
    assert len(c.imgs) == len(figs)
    for img in c.imgs:
        assert img["src"].startswith("data:image/png;base64,")
        assert base64.b64decode(img["src"].split(",", 1)[1], validate=True).startswith(PNG_MAGIC)
        assert img.get("alt")
    for bad in ("<link", "<script", "http://", "https://", "url("):
        assert bad not in page
    assert "figure missing" not in page
    assert [p.name for p in out.iterdir() if p.is_file()] == ["report.html"]


def test_headline_has_one_row_per_claim_with_verdict(rendered):
    _, _, page, _ = rendered
    rows = headline_rows(page)
    assert [cid for cid, _ in rows] == ["C1", "C2", "C3", "C4", "C5"]
    texts = {c["id"]: c for c in GOLDEN["summary"]["claims"]}
    for cid, row in rows:
        verdict = CLAIM_VERDICTS[cid]
        badge = re.search(r'<span class="badge ([a-z-]+)">([^<]*)</span>', row)
        assert badge and badge.group(2) == verdict and badge.group(1) == verdict.replace(" ", "-")
        assert texts[cid]["claim"].split(":")[0] in row
    # APE claims: the RoPE column says why the experiment does not apply to the RoPE model
    assert "no absolute position embedding" in dict(rows)["C2"]
    # RoPE claims: the APE column says why the experiment does not apply to the APE model
    assert "no rotary embedding" in dict(rows)["C5"]
    # the numbers behind a verdict are readable pairs, never a raw dict
    assert "{" not in re.sub(r"<[^>]+>", "", dict(rows)["C2"])
    assert "drop points: " in dict(rows)["C2"]


def test_json_text_is_escaped(rendered):
    _, _, page, _ = rendered
    assert XSS not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert XSS_DATA not in page and "cats&amp;dogs&lt;v2&gt;" in page
    assert "no patches &amp; &lt;no&gt; grid" in page


def test_not_applicable_and_numbers(rendered):
    _, _, page, _ = rendered
    text = "".join(check_html(page).text)
    for reason in ("no rotary embedding (scheme ape)", "no absolute position embedding (scheme rope)",
                   "no patches & <no> grid", "untrained"):
        assert f"not applicable: {reason}" in text
    ape = GOLDEN["models"]["builtin:ape"]
    assert f"{100 * ape['eval']['top1']:.1f}%" in text
    allv = ape["ape_permute"]["all"]
    assert f"{allv['drop_points']:.1f} ± {allv['drop_std']:.1f} pts" in text
    heads = GOLDEN["models"]["builtin:rope-axial"]["rope_heads"]
    lh = heads["primary_rebuilding_head"]
    assert f"L{lh[0]} h{lh[1]}" in text
    # the SAE section's causal rows agree with the claims table (they used to read n/a)
    sel = ape["sae"]["causal"]["ablate_row"]["selectivity"]
    assert f"{sel:.2f}" in text and "causal selectivity of the row features" in text
    assert "vitpos run --config study.yaml" in text
    assert "2.14.1" in text and "1.0.31" in text and "42.8 s" in text  # versions and total timing


def test_headline_groups_by_dataset(tmp_path):
    results = make_results(second_data="fashion")
    del results["models"][XSS]
    page = render_report(results, tmp_path).read_text()
    check_html(page)
    assert '<th colspan="4">data: shapes</th>' in page and '<th colspan="4">data: fashion</th>' in page
    assert "<img" not in page
    assert "no APE model on fashion" in page and "no RoPE model on shapes" in page


def test_malformed_results_are_refused_in_one_line(tmp_path):
    results = make_results()
    results["models"][ROPE]["rope_axis"]["conditions"] = "garbage"
    with pytest.raises(VitposError):
        render_report(results, tmp_path)
    results = make_results()
    results["format_version"] = 99
    with pytest.raises(VitposError, match="format version 99"):
        render_report(results, tmp_path)


def test_figure_missing_on_disk_is_said_in_place(rendered, tmp_path):
    original, _, _, out = rendered
    results = copy.deepcopy(original)
    key = next(iter(results["figures"]))
    results["figures"][key] = "figures/gone.png"
    page = render_report(results, out).read_text()
    assert page.count('src="data:image/png;base64,') == len(results["figures"]) - 1
    assert "figure missing: gone.png" in page
    render_report(original, out)  # restore the shared page


def test_checker_catches_unbalanced_tags():
    with pytest.raises(AssertionError):
        check_html("<table><tr><td>x</tr></table>")
    with pytest.raises(AssertionError):
        check_html("<section><p>x</p>")


def _poison(x):
    """Append the XSS payload to every string leaf (keys kept, so lookups still work)."""
    if isinstance(x, dict):
        return {k: _poison(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_poison(v) for v in x]
    return x + XSS if isinstance(x, str) else x


def test_every_json_string_is_escaped(tmp_path):
    results = make_results()
    for m in results["models"].values():
        m["describe"] = _poison(m["describe"])
        m["not_applicable"] = _poison(m["not_applicable"])
        m["data"] = _poison(m["data"])
    results["summary"] = _poison(results["summary"])
    results["reproduce"] = _poison(results["reproduce"])
    results["timings"][XSS] = 1.0
    results["models"][APE]["eval"]["per_group"][XSS] = 0.5
    page = render_report(results, tmp_path).read_text()
    check_html(page)
    assert "<script" not in page.lower()
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") > 20


def test_rope_axis_figure_shades_the_probe_intervals(monkeypatch, tmp_path):
    """Each retrained-probe curve with an interval per layer gets a shaded band spanning it, and the
    recovery legend carries mean Rec's interval; without intervals nothing is shaded."""
    from matplotlib.collections import PolyCollection

    figs = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figs.append(fig) or path)
    doc = rope_axis_doc()
    plots.plot_rope_axis(RopeAxisResult.model_validate(doc), tmp_path / "a.png")
    assert not [c for ax in figs[0].axes for c in ax.collections if isinstance(c, PolyCollection)]
    for c in doc["conditions"].values():
        for a in ("row", "col"):
            c[f"{a}_acc_ci95"] = [[v - 0.05, v + 0.05] for v in c[f"{a}_acc"]]
    for per_r in doc["recovery"].values():
        for r in per_r.values():
            r["mean_rec_ci95"] = [0.1, 0.9]
    result = RopeAxisResult.model_validate(doc)
    plots.plot_rope_axis(result, tmp_path / "b.png")
    bands = [c for ax in figs[1].axes for c in ax.collections if isinstance(c, PolyCollection)]
    assert bands and all(abs(float(b.get_paths()[0].vertices[:, 1].max()) - 1.0) < 0.06 for b in bands[:1])
    plots.plot_recovery(result, tmp_path / "c.png")
    labels = [t.get_text() for ax in figs[2].axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert labels and all("[0.10, 0.90]" in t for t in labels)


def test_seeds_with_the_same_line_share_one_item(tmp_path):
    """Three seeds of a RoPE model are one not-applicable item in an APE claim's RoPE column."""
    import copy as _copy

    results = make_results()
    del results["models"][XSS]
    for k in (1, 2):
        results["models"][f"{ROPE}-seed{k}"] = _copy.deepcopy(results["models"][ROPE])
    page = render_report(results, tmp_path).read_text()
    check_html(page)
    assert f"<b>{ROPE}, {ROPE}-seed1, {ROPE}-seed2" in page
    assert page.count(f"<b>{ROPE}-seed1") == 0  # never listed on its own with the same line


def _claim_row(page: str, cid: str) -> str:
    """The claims table's row of `cid` (its cells hold nested tables: up to its verdict cell's end)."""
    start = page.index(f'<tr data-claim="{cid}">')
    end = page.index('<td class="verdict">', start)
    return page[start:page.index("</td></tr>", end)]


def test_claims_row_reads_at_a_glance_and_folds_the_models(tmp_path):
    """A summary made by `claims.summarise` from typed results: each row shows the verdict, one
    sentence and the headline number per model family (interval, seeds it holds on); each model's
    reading and numbers fold below in <details>; a model spec's markup is escaped."""
    import html

    from vitpos.claims.summary import summarise
    from vitpos.claims.verdict import Summary
    from vitpos.study.results import ModelEntry

    odd = 'timm:vit"<b>&x'
    results = make_results()
    del results["models"][XSS]
    for spec in ("builtin:ape-seed1", odd):
        results["models"][spec] = copy.deepcopy(GOLDEN["models"]["builtin:ape"])
    entries = {spec: ModelEntry.from_json(m) for spec, m in results["models"].items()}
    summary = summarise(entries)
    results["summary"] = summary.model_dump(mode="json")
    page = render_report(results, tmp_path).read_text()
    check_html(page)
    assert odd not in page and html.escape(odd) in page
    c2 = next(c for c in Summary.model_validate(results["summary"]).claims if c.id == "C2")
    row = _claim_row(page, "C2")
    fold = row.index('<details class="nums"><summary>per model (3)')
    glance = row[:fold]
    assert f'<span class="badge {c2.verdict.replace(" ", "-")}">{c2.verdict}</span>' in row
    assert html.escape(c2.sentence) in glance
    assert [h.family for h in c2.headlines] == ["builtin:ape", odd]
    seeds, one = c2.headlines
    assert seeds.seeds_text() == f"holds on {seeds.holds}/2 seeds; family {seeds.family_result} ({seeds.family_reason})"
    assert seeds.family_result is not None and one.seeds_text() == c2.numbers[odd]["result"]
    for h in c2.headlines:
        assert f"<b>{html.escape(h.family)}</b>: {html.escape(h.value_text())}" in glance
    assert html.escape(seeds.seeds_text()) in glance
    # per-model numbers and texts only below the fold
    assert "drop points: " not in glance and "drop points: " in row[fold:]
    assert "top-1 drop when permuting" not in glance and "top-1 drop when permuting" in row[fold:]
    assert len(glance) < len(row) / 3  # the glance is a small part of the cell


def test_the_timings_table_does_not_count_the_run_total_as_a_stage(tmp_path):
    """The footer lists the stages computed in this run, their sum, and the run's wall clock: the wall
    clock (`total_this_run`) is not a stage (summed with them, the DINOv2 study's total read 11096 s for a
    5548 s run)."""
    results = make_results()
    results["timings"] = {"m/sae": 100.0, "m/ape_permute": 200.0, "validation": 10.0, "total_this_run": 320.0}
    page = render_report(results, tmp_path).read_text()
    footer = page[page.index("<footer>"):]
    assert "310.0 s" in footer and "this run, wall clock" in footer and "320.0 s" in footer
    assert "630.0 s" not in footer


def test_the_permutation_figure_draws_each_sets_nulls_beside_its_control(tmp_path, monkeypatch):
    """C2 reads the same-position swap: the per-model figure once drew only the matched random controls
    (the nulls were in a table only). The measured DINOv2 result has all three nulls."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "docs" / "measured" / "dinov2-tiles.results.json")
                     .read_text())
    ape = ApePermuteResult.model_validate(next(m["ape_permute"] for m in doc["models"].values()))
    assert ape.nulls
    order = plots.ape_bar_order(ape)
    names = [v for v, _ in order]
    for null, of in ape.nulls.items():  # each null right after its set's control, drawn as a null
        assert (null, "null") in order and names.index(null) > names.index(ape.controls[of]) > names.index(of)
    assert sorted(names) == sorted(ape.variant_names())  # every variant drawn once
    figs = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figs.append(fig) or Path(path))
    plots.plot_ape_permute(ape, tmp_path / "a.png")
    ticks = [t.get_text() for t in figs[0].axes[0].get_xticklabels()]
    assert ticks == names


def test_the_per_group_panel_draws_the_set_c2_reads_first(tmp_path, monkeypatch):
    """The permutation figure's second panel splits each set's drop by class group; it starts with the
    all-positional set (what C2 reads), not only all / row / col, which are all 0 on models whose row
    and col sets the label does not read (an empty panel)."""
    from vitpos.plots import sweeps

    seen = []
    real = sweeps.save_figure
    monkeypatch.setattr(sweeps, "save_figure", lambda fig, path: (seen.append(fig), real(fig, path))[1])
    doc = ape_permute_doc()
    for name in ("all_positional", "all"):
        doc[name]["per_group"] = {"vertical": {"top1": 0.5, "drop_points": 40.0},
                                  "horizontal": {"top1": 0.5, "drop_points": 42.0}}
    sweeps.plot_ape_permute(ApePermuteResult.model_validate(doc), tmp_path / "a.png")
    labels = [t.get_text() for t in seen[0].axes[1].get_xticklabels()]
    assert labels[0] == "all_positional" and "all" in labels
