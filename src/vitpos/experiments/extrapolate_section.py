"""The extrapolate stage's report section and summary line (`vitpos.experiments.extrapolate`)."""

from __future__ import annotations

from vitpos.report.format import ci, e, fnum, last, pct, table
from vitpos.results.extrapolate import ExtrapolateResult


def section(r: ExtrapolateResult) -> str:
    rows = []
    for sz in r.sizes:
        px, g = sz.img_size or ["?"], sz.grid or ["?", "?"]
        top1 = "refused" if sz.top1 is None else f"{pct(sz.top1)} {ci(sz.top1_ci, 100, 1, '%')}"
        rows.append([f"{px[0]} px", f"{g[0]}×{g[1]}", "resized" if sz.data_px is None else f"generated {sz.data_px} px",
                     top1, pct(last(sz.row_acc)), pct(last(sz.col_acc)),
                     ", ".join(fnum(v, 2) for v in sz.row_skill), ", ".join(fnum(v, 2) for v in sz.col_skill)])
    how = []
    if r.ape:
        how.append(f"APE {e(r.ape)}")
    if r.rope_grid == "extended":
        how.append("RoPE tables rebuilt with the trained grid step: the added rows / columns turn by unseen angles")
    elif r.rope_grid == "rescaled":
        how.append("RoPE tables rebuilt with the larger grid mapped onto the trained range (rescaled coordinates)")
    out = (f"<p>{e(r.model)} ({e(r.scheme)}) on {e(r.data)}, {e(r.n_images)} images per size, probes at {e(r.site)} "
           "retrained at each size (as many classes as the grid has rows / columns). "
           f"{'; '.join(how) or 'No positional encoding'}. Skill = (acc − chance) / (1 − chance) per layer: 1 = every "
           "patch placed, 0 = chance." + (f" Top-1 refused: {e(r.top1_refused)}" if r.top1_refused else "") + "</p>")
    return out + table(["input", "grid", "data", "top-1 [95% CI]", "row acc (last layer)", "col acc (last layer)",
                        "row skill per layer", "col skill per layer"], rows)


def summary(r: ExtrapolateResult) -> str:
    """Top-1 and the last layer's row / column probe accuracy at each input size."""
    return "; ".join(f"{(sz.img_size or ['?'])[0]} px: top-1 {'refused' if sz.top1 is None else pct(sz.top1)}, "
                     f"row {pct(last(sz.row_acc))}, col {pct(last(sz.col_acc))}" for sz in r.sizes)
