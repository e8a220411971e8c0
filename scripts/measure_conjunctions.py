"""Issue 47 item 3: the conjunction typing and the conjunction-inclusive C2 variants on the trained planted model
whose label is position (`builtin:planted-trained-ape-where`, shapes). Runs the eval, sae (at the sae stage's
layer of the v7 measurement, block 0's output; 3 SAE seeds) and ape_permute stages at the v7 sizes and prints
(and writes to OUT/conj47.json) the latent counts per SAE seed, the drops of both positional sets, their
position budgets and the edit-norm-matched controls.

    PYTHONPATH=src nice -n 19 python scripts/measure_conjunctions.py OUT
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from vitpos.models import load_model
from vitpos.results.sae_run import SAEResult
from vitpos.study.config import RunConfig
from vitpos.validation.trained_cases import run_stages

SPEC, DATA = "builtin:planted-trained-ape-where", "shapes"
VARIANTS = ("all_positional", "conj_positional", "swap_all_positional", "random_all_positional", "norm_all_positional",
            "norm_all_positional_no_conj", "norm_conj_positional", "pos_embed_shuffle")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("error: give the output folder: scripts/measure_conjunctions.py OUT", file=sys.stderr)
        return 2
    out = Path(argv[1])
    torch.set_num_threads(2)
    sae = {"images": 500, "eval_images": 300, "epochs": 2, "expansion": 4, "k": 32, "layer": 0, "stability": False,
           "browse": False}
    cfg = RunConfig.model_validate({"models": [SPEC], "data": [DATA], "seed": 0, "eval_images": 300, "sae": sae,
                                    "ape_permute": {"images": 300, "seeds": 1}})
    t0, load = time.time(), os.getloadavg()
    m = run_stages(load_model(SPEC), DATA, cfg, out, ("eval", "sae", "ape_permute"), log=print)
    s, ap = m.inputs.sae, m.inputs.ape_permute
    if not isinstance(s, SAEResult) or ap is None:
        print("error: the sae and ape_permute stages gave no result", file=sys.stderr)
        return 2
    res: dict[str, Any] = {"seconds": m.seconds, "wall": round(time.time() - t0, 1), "load_at_start": load,
                           "load_at_end": os.getloadavg()}
    res["sae_counts"] = {f"seed{sd}": {"row": r, "col": c, "mixed": x, "conj": j} for sd, r, c, x, j in [
        (0, s.n_row_features, s.n_col_features, s.n_mixed_features, s.n_conj_features),
        *((r.seed, r.n_row_features, r.n_col_features, r.n_mixed_features, r.n_conj_features)
          for r in (s.seed_pool.runs if s.seed_pool else []))]}
    null = s.eta2_null
    res["eta2_null_conj"] = None if null is None else [null.null_conj_q, null.null_conj_max]
    for v in VARIANTS:
        x, p = ap.variant(v), ap.pooled(v)
        res[v] = (str(ap.outcome(v)) if x is None else {"n": x.n_features, "drop": x.drop_points, "ci": x.drop_ci95,
                                                        "edit_norm": x.edit_norm, "note": x.note})
        if p is not None:
            res[v + "_pooled"] = {"drop": p.drop_points, "ci": p.drop_ci95, "per_seed": p.per_seed,
                                  "n_per_seed": p.per_seed_n_features}
    keep = ("all_positional", "conj_positional")
    res["budget"] = {k: b.model_dump() for k, b in (ap.position_budget or {}).items() if k in keep}
    if ap.seed_pool is not None and ap.seed_pool.budget:
        res["budget_pooled"] = {k: b.model_dump() for k, b in ap.seed_pool.budget.items() if k in keep}
    text = json.dumps(res, indent=1)
    print(text)
    (out / "conj47.json").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
