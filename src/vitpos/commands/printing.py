"""What the commands print: their result tables and summaries (stdout), and the consoles they print on."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from vitpos.results.sae_run import SAEResult

console = Console(stderr=True)
out_console = Console(markup=False, highlight=False)


def fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def print_conditions(doc: dict) -> None:
    """rope-axis' and rope-prefix' conditions: top-1 and the row / col probe accuracy per layer."""
    t = Table("condition", "top-1", "row acc by layer", "col acc by layer")
    for name, c in doc["conditions"].items():
        t.add_row(name, f"{c['top1']:.3f}", " ".join(f"{v:.2f}" for v in c["row_acc"]),
                  " ".join(f"{v:.2f}" for v in c["col_acc"]))
    out_console.print(t)


def print_probe(res: dict, out: Path) -> None:
    t = Table("layer", "row acc", "col acc", "row sel", "col sel")
    for i, layer in enumerate(res["layers"]):
        t.add_row(str(layer), f"{res['row_acc'][i]:.3f}", f"{res['col_acc'][i]:.3f}",
                  f"{res['row_selectivity'][i]:.3f}", f"{res['col_selectivity'][i]:.3f}")
    out_console.print(t)
    out_console.print(f"chance row {res['chance_row']:.3f}, col {res['chance_col']:.3f}; content baseline row "
                      f"{res['content_baseline']['row_acc']:.3f}, col {res['content_baseline']['col_acc']:.3f} -> "
                      f"{out}")


def print_sae(doc: SAEResult, out: Path) -> None:
    """`vitpos sae`'s summary: fit, splice, feature counts, and the fidelity numbers when measured."""
    splice = ("spliced top-1 not measured (no classifier for this data: fit one with `vitpos head` and pass --head)"
              if doc.top1_change_points is None else f"spliced top-1 change {doc.top1_change_points:+.1f} pts")
    out_console.print(f"SAE L{doc.layer} {doc.site}: FVU {doc.fvu:.3f}, L0 {doc.l0:.1f}, dead {doc.dead_frac:.1%}, "
                      f"{splice}; {doc.n_row_features} row, "
                      f"{doc.n_col_features} col, {doc.n_mixed_features} mixed features -> {out}")
    fid = doc.fidelity
    if fid is not None:
        stab = ("" if fid.stability is None else f"; seed {fid.stability.other_seed} reproduces "
                f"{fid.stability.share_matched:.1%} of the decoder directions (cos >= {fid.stability.cos_threshold})")
        out_console.print(f"dense latents (firing > {fid.dense_threshold:.0%}) {fid.dense_frac:.1%}; outlier tokens "
                          f"{'included' if doc.include_special else 'left out'}: {doc.excluded_outlier_tokens or 0} of "
                          f"the training tokens above {doc.outlier_threshold:.3g}{stab}")


def print_ape_permute(doc: dict) -> None:
    t = Table("variant", "top-1", "drop (points)", "features")
    t.add_row("baseline", f"{doc['baseline_top1']:.3f}", "", "")
    for v in doc["variants"]:
        r = doc[v]
        if "skipped" in r:
            t.add_row(v, "-", f"skipped: {r['skipped']}", "")
        else:
            t.add_row(v, f"{r['top1']:.3f}", f"{r['drop_points']:.1f} ± {r['drop_std']:.1f}",
                      str(r["n_features"] or ""))
    out_console.print(t)


def print_rope_heads(doc: dict, out: Path) -> None:
    p = doc["primary_rebuilding_head"]
    out_console.print(f"primary rebuilding head L{p[0]}H{p[1]} (drop rank {doc['primary_head_drop_rank']} of "
                      f"{len(doc['layers']) * doc['num_heads']}); largest drop L{doc['largest_drop_head'][0]}H"
                      f"{doc['largest_drop_head'][1]} -> {out}" if p else f"no rebuilding head found -> {out}")
    if doc.get("top1_images_per_head"):
        counts = [m for row in doc["top1_images_per_head"] for m in row]
        out_console.print(f"adaptive top-1: every head on {doc['top1_screen_images']} images, "
                          f"{sum(m == doc['n_top1_images'] for m in counts)} of {len(counts)} heads on all "
                          f"{doc['n_top1_images']}")


def print_rope_prefix(doc: dict, out: Path) -> None:
    print_conditions(doc)
    rec = "; ".join(f"{a} mean Rec open {fmt(r['open']['mean_rec'])}, blocked {fmt(r['blocked']['mean_rec'])}"
                    for a, r in doc["recovery"].items())
    mass = " ".join(f"{v:.3f}" for v in doc["prefix_attention"])
    out_console.print(f"prefix attention by layer {mass}; R={doc['restore_from']}: {rec} -> {out}")


def print_rope_freq(doc: dict, out: Path) -> None:
    t = Table("condition", "top-1 drop (pts)", f"fall of the axis' probe at layer {doc['layers'][-1]} (pts)", "share")
    for name, c in doc["conditions"].items():
        if c["axis"] is not None:
            t.add_row(name, f"{c['top1_drop_points']:+.1f}", f"{c['axis_drop_points'][-1]:+.1f}", fmt(c["share"][-1]))
    out_console.print(t)
    splits = "; ".join(f"{s['axis']} L{s['window'][0]}-{s['window'][1] - 1}: high - low "
                       f"{s['high_minus_low_axis_drop_points']:+.1f} pts ({s['position_in']})" for s in doc["splits"])
    out_console.print(f"{splits} -> {out}")


def print_extrapolate(doc, out: Path) -> None:
    t = Table("input", "grid", "top-1", "row acc by layer", "col acc by layer")
    for sz in doc.sizes:
        t.add_row(f"{sz.img_size[0]} px", f"{sz.grid[0]}x{sz.grid[1]}", "refused" if sz.top1 is None else
                  f"{sz.top1:.3f}", " ".join(f"{v:.2f}" for v in sz.row_acc), " ".join(f"{v:.2f}" for v in sz.col_acc))
    out_console.print(t)
    note = f"top-1 refused: {doc.top1_refused}; " if doc.top1_refused else ""
    out_console.print(f"{note}rope grid {doc.rope_grid or 'n/a'} -> {out}")
