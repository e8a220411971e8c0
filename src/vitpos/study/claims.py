"""The study's claims C1-C5, each with measured numbers and a verdict computed from them.

Verdict rules (ours, since the study gives only its abstract; thresholds are module constants):
  C1 (APE)  >= 1 row and >= 1 col SAE feature, and ablating each set is axis-selective
            downstream (selectivity >= SELECTIVE for both).
  C2 (APE)  permuting row+col features drops top-1 by >= MIN_DROP points and by more than
            CONTROL_FACTOR x the matched random-feature control (the 24-31 range is ImageNet's;
            whether our drop falls in it is stated, not required).
  C3 (RoPE) removing an axis removes >= MIN_REMOVED of its above-chance decodability
            (mean over layers of (base - off) / (base - chance), retrained probes, layers whose
            baseline is >= 0.05 above chance) while the other axis keeps >= MIN_KEPT of its
            above-chance decodability, for both axes.
  C4 (RoPE) mean recovery after restoring is partial (0 < Rec < 1) for both axes, and the
            primary rebuilding head is axis-specialised (|S| >= 0.5).
  C5 (RoPE) the primary rebuilding head has the largest top-1 drop of all heads.
A claim is `not applicable` where no model of its scheme ran.
"""

from __future__ import annotations

from statistics import median
from typing import Any

from vitpos.study.results import ClaimVerdict, Summary

SELECTIVE = 0.6
MIN_DROP = 10.0
CONTROL_FACTOR = 2.0
MIN_REMOVED = 0.7
MIN_KEPT = 0.7
MIN_ABOVE_CHANCE = 0.05

CLAIM_TEXT = {
    "C1": "APE: sparse autoencoders recover causal row- and column-specific features.",
    "C2": "APE: permuting the positional features across patches drops top-1 by 24-31 points.",
    "C3": "RoPE: disabling the row (column) rotations removes decodable row (column) information independently.",
    "C4": "RoPE: once rotations are restored the information is partly rebuilt, in part by axis-specialised heads.",
    "C5": "RoPE: ablating the rotations of the primary rebuilding head reduces accuracy more than any other head.",
}


CLAIM_SCHEME = {"C1": "ape", "C2": "ape", "C3": "rope", "C4": "rope", "C5": "rope"}


def claim_scheme(cid: str) -> str:
    return CLAIM_SCHEME.get(cid, "")


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _c1(spec: str, sae: dict) -> dict:
    causal = sae.get("causal") or {}
    sel = {k: (causal.get(f"ablate_{k}") or {}).get("selectivity") for k in ("row", "col")}
    ok = (sae["n_row_features"] > 0 and sae["n_col_features"] > 0
          and all(v is not None and v >= SELECTIVE for v in sel.values()))
    return {"ok": ok, "numbers": {"layer": sae["layer"], "n_row": sae["n_row_features"], "n_col": sae["n_col_features"],
                                  "row_selectivity": sel["row"], "col_selectivity": sel["col"], "fvu": sae["fvu"]},
            "text": f"{spec}: L{sae['layer']} SAE (FVU {sae['fvu']:.3f}) has {sae['n_row_features']} row / "
                    f"{sae['n_col_features']} col features; ablation selectivity row {_f(sel['row'])}, col "
                    f"{_f(sel['col'])}"}


def _f(v, d: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{d}f}"


def _c2(spec: str, ap: dict) -> dict:
    allv, rnd = ap.get("all", {}), ap.get("random_features", {})
    drop, ctrl = allv.get("drop_points"), rnd.get("drop_points")
    ok = drop is not None and drop >= MIN_DROP and (ctrl is None or drop > CONTROL_FACTOR * max(ctrl, 0.0))
    in_range = drop is not None and 24 <= drop <= 31
    pe = ap.get("pos_embed_shuffle", {}).get("drop_points")
    allpos = ap.get("all_positional", {}).get("drop_points")
    return {"ok": ok, "numbers": {"drop_points": drop, "random_control_drop": ctrl, "pos_embed_shuffle_drop": pe,
                                  "all_positional_drop": allpos, "in_study_range": in_range},
            "text": f"{spec}: permuting row+col features drops top-1 by {_f(drop, 1)} pts (random-feature control "
                    f"{_f(ctrl, 1)}; row+col+mixed positional features {_f(allpos, 1)}; shuffled APE table {_f(pe, 1)})"
                    f"{'; within' if in_range else '; outside'} the study's 24-31"}


def _above_chance_ratio(base: list[float], cond: list[float], chance: float) -> float | None:
    """Mean over layers of (cond - chance) / (base - chance), where base is clearly above chance."""
    return _mean([(c - chance) / (b - chance) for b, c in zip(base, cond, strict=True)
                  if b - chance >= MIN_ABOVE_CHANCE])


def _c3(spec: str, ra: dict) -> dict:
    c = ra["conditions"]
    base = c["baseline"]
    chance = {"row": ra["chance_row"], "col": ra["chance_col"]}
    nums, ok = {}, True
    for a, b in (("row", "col"), ("col", "row")):
        off = c[f"no_{a}"]
        kept_own = _above_chance_ratio(base[f"{a}_acc"], off[f"{a}_acc"], chance[a])
        kept_other = _above_chance_ratio(base[f"{b}_acc"], off[f"{b}_acc"], chance[b])
        removed = None if kept_own is None else 1 - kept_own
        nums[f"no_{a}_{a}_removed"] = removed
        nums[f"no_{a}_{b}_kept"] = kept_other
        nums[f"no_{a}_top1"] = off.get("top1")
        ok &= removed is not None and removed >= MIN_REMOVED and kept_other is not None and kept_other >= MIN_KEPT
    return {"ok": ok, "numbers": nums,
            "text": f"{spec}: no_row removes {_pc(nums['no_row_row_removed'])} of above-chance row decodability, col "
                    f"keeps {_pc(nums['no_row_col_kept'])}; no_col removes {_pc(nums['no_col_col_removed'])} of col, "
                    f"row keeps {_pc(nums['no_col_row_kept'])} (top-1 {_f(base.get('top1'))} -> no_row "
                    f"{_f(nums['no_row_top1'])}, no_col {_f(nums['no_col_top1'])})"}


def _pc(v) -> str:
    return "n/a" if v is None else f"{100 * v:.0f}%"


def _head(lh) -> str:
    """A [layer, head] pair as LxHy ("n/a" when there is none)."""
    return f"L{lh[0]}H{lh[1]}" if lh else "n/a"


def _c4(spec: str, ra: dict, rh: dict | None) -> dict:
    rec = {a: median([r["mean_rec"] for r in ra["recovery"][a].values() if r["mean_rec"] is not None] or [float("nan")])
           for a in ("row", "col")}
    partial = all(0 < v < 1 for v in rec.values())
    prim, S = None, None
    if rh and rh.get("primary_rebuilding_head"):
        prim = rh["primary_rebuilding_head"]
        S = rh["axis_index"][prim[0]][prim[1]]
    specialised = S is not None and abs(S) >= 0.5
    return {"ok": partial and specialised,
            "numbers": {"median_recovery_row": rec["row"], "median_recovery_col": rec["col"], "primary_head": prim,
                        "primary_axis_index": S,
                        "n_specialised_heads": len(rh.get("specialised_heads", [])) if rh else None},
            "text": f"{spec}: median recovery row {_f(rec['row'])}, col {_f(rec['col'])}; primary rebuilding head "
                    f"{_head(prim)} axis index {_f(S)}"}


def _c5(spec: str, rh: dict) -> dict:
    prim, rank = rh.get("primary_rebuilding_head"), rh.get("primary_head_drop_rank")
    drop = rh["drop_points"][prim[0]][prim[1]] if prim else None
    big = rh["largest_drop_head"]
    return {"ok": bool(rh.get("primary_is_largest_drop")),
            "numbers": {"primary_head": prim, "primary_drop_points": drop, "drop_rank": rank, "largest_drop_head": big,
                        "drop_rank_among_layers_ge_R": rh.get("primary_head_drop_rank_after_R"),
                        "largest_drop_points": rh["drop_points"][big[0]][big[1]],
                        "n_heads": len(rh["layers"]) * rh["num_heads"]},
            "text": f"{spec}: primary rebuilding head {_head(prim)} drops top-1 by "
                    f"{_f(drop, 1)} pts, rank {rank} of {len(rh['layers']) * rh['num_heads']} (largest: "
                    f"L{big[0]}H{big[1]}, {rh['drop_points'][big[0]][big[1]]:.1f} pts); rank "
                    f"{rh.get('primary_head_drop_rank_after_R')} among the "
                    f"{(len(rh['layers']) - rh['restore_from']) * rh['num_heads']} heads of layers >= "
                    f"R={rh['restore_from']}"}


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
        if not found:
            verdict = "not applicable"
        else:
            n_ok = sum(r["ok"] for _, r in found)
            verdict = "supported" if n_ok == len(found) else ("not supported" if n_ok == 0 else "partly supported")
        claims.append({
            "id": cid, "claim": text, "scheme": scheme, "verdict": verdict,
            "evidence": "; ".join(r["text"] for _, r in found) or f"no {scheme.upper()} model was run",
            "numbers": {spec: {**r["numbers"], "holds": r["ok"]} for spec, r in found},
            "models": [spec for spec, _ in found],
        })
    rules = (__doc__ or "").split("Verdict rules", 1)[1].strip()
    return Summary(claims=[ClaimVerdict.model_validate(c) for c in claims], rules=rules)
