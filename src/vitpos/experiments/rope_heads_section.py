"""The rope_heads stage's report section and summary line (`vitpos.experiments.rope_heads`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from vitpos.report.format import ci, e, fnum, kv_table, pct, pts, table
from vitpos.results.rope_heads import RopeHeadsResult, closest_rival

T = TypeVar("T")


def at(grid: Sequence[Sequence[T]] | None, layers: Sequence[int], lh: Sequence[int] | None) -> T | None:
    """grid[layer][head] for a [layer, head] pair (layer = a value of `layers`); None where absent."""
    if grid is None or lh is None or len(lh) != 2 or lh[0] not in layers:
        return None
    i, h = layers.index(lh[0]), int(lh[1])
    row = grid[i] if i < len(grid) else None
    return row[h] if row is not None and 0 <= h < len(row) else None


def head_name(lh: Sequence[int] | None) -> str:
    return f"L{lh[0]} h{lh[1]}" if lh is not None and len(lh) == 2 else "n/a"


def summary(r: RopeHeadsResult) -> str:
    ph, lh = r.primary_rebuilding_head, r.largest_drop_head
    n = len(r.layers) * r.num_heads
    return (f"primary rebuilding head {head_name(ph)}: drop {_head_drop(r, ph)}, "
            f"rank {fnum(r.primary_head_drop_rank)} of {n}; largest drop {head_name(lh)}: {_head_drop(r, lh)}")


def _head_drop(r: RopeHeadsResult, lh: Sequence[int] | None) -> str:
    """A head's top-1 drop with its interval, where measured."""
    return f"{pts(at(r.drop_points, r.layers, lh))} {ci(at(r.drop_ci95, r.layers, lh))}".rstrip()


def _closest_rival(r: RopeHeadsResult) -> str:
    """The head whose paired margin against the primary has the lowest lower end, and that margin."""
    rival = closest_rival(r.primary_margin_ci95)
    if rival is None:
        return "n/a"
    lh, m = rival
    return f"{head_name(lh)}: drop(primary) − drop({head_name(lh)}) {ci(m)} pts"


def section(r: RopeHeadsResult) -> str:
    ph, lh = r.primary_rebuilding_head, r.largest_drop_head
    n = len(r.layers) * r.num_heads
    pairs = [("axis removed / restore from", f"{r.axis} / {r.restore_from}"),
             ("baseline top-1", f"{pct(r.baseline_top1)} {ci(r.baseline_top1_ci95, 100)}".rstrip()),
             ("primary rebuilding head", head_name(ph)),
             ("its rebuilding score", fnum(at(r.rebuild_score, r.layers, ph))),
             ("its axis index S (+1 row, −1 col)", f"{fnum(at(r.axis_index, r.layers, ph), 2)} "
                                                   f"{ci(at(r.axis_index_ci95, r.layers, ph), digits=2)}".rstrip()),
             ("top-1 drop when its rotations are ablated", _head_drop(r, ph)),
             ("its drop rank (1 = largest)", f"{fnum(r.primary_head_drop_rank)} of {n}"),
             ("largest-drop head", f"{head_name(lh)}: {_head_drop(r, lh)}"),
             ("closest rival (paired 95 % interval of the margin)", _closest_rival(r))]
    if r.top1_images_per_head is not None:  # adaptive top-1: say which drops rest on the screen only
        counts = [m for row in r.top1_images_per_head for m in row]
        total = r.n_top1_images
        pairs.append(("top-1 images per head (adaptive top-1)",
                      f"every head on the first {r.top1_screen_images}; "
                      f"{sum(m == total for m in counts)} of {len(counts)} heads still in the race on all {total} "
                      "(the others' drops and intervals rest on the screen)"))
    top = r.top_heads
    if top is not None:
        frac = r.top_heads_recovery_fraction or {}
        for method, label in (("rebuild", "by fall in recovery, rotations removed"),
                              ("mean_ablate", "by fall in recovery, output mean-ablated"),
                              ("direct_effect", "by direct effect on the axis probes (output mean-ablated together)")):
            if method not in top:
                continue
            heads = ", ".join(head_name(h) for h in top[method]) or "n/a"
            pairs.append((f"top heads {label}", f"{heads} (together: {pct(frac.get(method))} of the recovery)"))
        agree = r.top_heads_agreement or {"rebuild~mean_ablate": r.top_heads_overlap}
        k = len(top.get("rebuild") or [])
        for pair, count in agree.items():
            a, b = pair.split("~")
            pairs.append((f"heads in both top lists: {a} and {b}", f"{count} of {k}"))
    pairs += _heads_selection(r)
    return kv_table(pairs) + _c5_ablations_table(r)


def _c5_ablations_table(r: RopeHeadsResult) -> str:
    """C5 under each ablation of a head (rope_heads `c5_ablations`): the primary's drop and rank, the
    largest-drop head, the closest rival's paired margin and C5's outcome; the row the verdict rests on marked."""
    if not r.c5_ablations:
        return ""
    prim, rests = r.primary_rebuilding_head, r.c5_rests_on
    rows = []
    for name, a in r.c5_ablations.items():
        heads = [list(h) for h in a.heads]

        def drop_of(lh: Sequence[int] | None, heads: list[list[int]] = heads, a=a) -> str:
            i = heads.index(list(lh)) if lh is not None and list(lh) in heads else None
            if i is None:
                return "n/a"
            return f"{pts(a.drop_points[i])} {ci(a.drop_ci95[i] if i < len(a.drop_ci95) else None)}".rstrip()

        rival = closest_rival([a.margin_ci95])
        rows.append([f"{name}{' (verdict)' if name == rests else ''}", a.description, str(len(heads)), drop_of(prim),
                     f"{a.primary_drop_rank or 'n/a'} of {len(heads)}",
                     f"{head_name(a.largest_drop_head)}: {drop_of(a.largest_drop_head)}",
                     "n/a" if rival is None else f"{head_name(heads[rival[0][1]])} {ci(rival[1])}", a.outcome])
    return (f"<p>C5 under each ablation of one head (both axes; top-1 images, paired bootstrap): the identity row "
            f"is the sweep above; the others are measured on {e(r.c5_ablation_heads_rule or 'the heads listed')}. A "
            "constant shift is invisible between patches to a relative encoding (only the unrotated prefix tokens see "
            "it).</p>"
            + table(["ablation", "what", "heads", "primary's drop", "primary's rank", "largest drop",
                     "closest rival: drop(primary) − drop(rival)", "C5"], rows))


def _heads_selection(r: RopeHeadsResult) -> list[tuple[str, str]]:
    """Issue 29's rope_heads additions: how stable the primary choice is, S where the head rebuilds
    with its null threshold, and the share of the recovery it explains; none for older results."""
    pairs: list[tuple[str, str]] = []
    if r.selection_frequency is not None:
        ranked = sorted(r.selection_frequency.items(), key=lambda kv: -kv[1])
        pairs.append(("primary chosen over image resamples (bootstrap)", ", ".join(f"{k} {pct(v)}" for k, v in ranked)))
    if r.restore_sweep is not None:
        sweep = []
        for k, v in r.restore_sweep.items():
            p = v.primary
            share = (v.selection_frequency or {}).get(f"L{p[0]}H{p[1]}") if p is not None and len(p) == 2 else None
            sweep.append(f"R={k}: {head_name(p)} ({pct(share)} of resamples)")
        pairs.append(("primary at each restore point R", "; ".join(sweep)))
    if r.axis_index_null_threshold is not None:
        ph = r.primary_rebuilding_head
        pairs.append(("axis it rebuilds (larger fall in Rec)", str(r.primary_axis or "n/a")))
        pairs.append(("its S in the restore condition, signed to that axis",
                      f"{fnum(r.primary_axis_index_matched, 2)} "
                      f"{ci(r.primary_axis_index_matched_ci95, digits=2)}".rstrip()
                      + f" (restore S {fnum(at(r.axis_index_restore, r.layers, ph), 2)})"))
        q = r.axis_index_null_quantiles or {}
        pairs.append(("|S| null (relabelled rotary pairs): threshold at 0.95",
                      f"{fnum(r.axis_index_null_threshold, 3)} over {r.axis_index_null_n} draws; "
                      + ", ".join(f"q{k} {fnum(v, 2)}" for k, v in q.items())))
        pairs.append(("share of the recovery the primary explains",
                      f"{pct(r.primary_recovery_share)} {ci(r.primary_recovery_share_ci95, 100, 1, '%')}".rstrip()))
        tk = r.top_heads_recovery_fraction_ci95 or {}
        frac = r.top_heads_recovery_fraction or {}
        pairs.append(("top heads' joint share (rotations removed)",
                      f"{pct(frac.get('rebuild'))} {ci(tk.get('rebuild'), 100, 1, '%')}".rstrip()))
    return pairs
