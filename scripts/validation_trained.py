"""Measure the trained planted cases (`vitpos.validation.trained_cases`) through the study's stages and
print their validation rows, the condition that decided each, C1 / C2 at every site of the sweep (APE
cases) and each row's evidence (C3 on the RoPE cases).

    PYTHONPATH=src .venv/bin/python scripts/validation_trained.py [--images 400] [--sae-images 1000]
        [--epochs 2] [--only trained:ape-where] [--json docs/measured/trained-planted.json]

Not part of the table every `vitpos run` appends: each case trains an SAE per swept site (minutes on 2
cores). The models ship as builtin:planted-trained-*; retrain them with `bash scripts/train_builtin.sh
planted`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from vitpos.claims.intervals import Interval
from vitpos.validation.table import case_rows, table_of
from vitpos.validation.trained_cases import (
    TRAINED_MODELS,
    SiteReading,
    TrainedSizes,
    measure_trained,
    site_readings,
    trained_case,
)


def _iv(x: Interval | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{(x[0] + x[1]) / 2:.{nd}f} [{x[0]:.{nd}f}, {x[1]:.{nd}f}]"


def _site_line(s: SiteReading) -> str:
    def failed(names: list[str]) -> str:
        return f" ({', '.join(names)})" if names else ""

    axes = "; ".join(f"{k} sel {_iv(s.selectivity[k], 2)} probe {_iv(s.probe_drop[k])} vs ctl "
                     f"{_iv(s.control_probe_drop[k])} top-1 {_iv(s.top1_drop[k])}" for k in ("row", "col"))
    budget = f"{s.budget} {s.budget_ci95}" + (f" ({s.budget_undefined})" if s.budget_undefined else "")
    return (f"  {s.site} (selected {s.selection_frequency:.0%}; {s.n_row} row / {s.n_col} col / {s.n_mixed} mixed): "
            f"C1 {s.c1}{failed(s.c1_failed)}; {axes}\n      C2 {s.c2}{failed(s.c2_failed)}: all-positional "
            f"({s.n_all_positional}) {_iv(s.all_positional_drop)} vs swap {_iv(s.swap_null_drop)}; APE shuffle "
            f"{s.ape_shuffle_drop}; budget {budget}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=TrainedSizes.test_images, help="test images of every stage")
    ap.add_argument("--sae-images", type=int, default=TrainedSizes.sae_images, help="training images per SAE")
    ap.add_argument("--epochs", type=int, default=TrainedSizes.sae_epochs, help="SAE epochs")
    ap.add_argument("--only", action="append", default=None, help="a case name (repeatable; default: all)")
    ap.add_argument("--out", type=Path, default=None, help="keep the stages' artifacts (SAEs) here")
    ap.add_argument("--json", type=Path, default=None, help="also write rows, per-site readings and timings here")
    args = ap.parse_args()
    sizes = TrainedSizes(test_images=args.images, sae_images=args.sae_images, sae_epochs=args.epochs)
    models = [m for m in TRAINED_MODELS if args.only is None or m.name in args.only]
    load = [round(x, 2) for x in os.getloadavg()]
    t_all = time.time()
    rows, per_case = [], {}
    for m in models:
        t0 = time.time()
        out = None if args.out is None else args.out / m.name.replace(":", "-")
        measured = measure_trained(m, sizes, out=out, log=print)
        case_rows_ = case_rows(trained_case(m, sizes), measured.inputs)
        rows += case_rows_
        sites = site_readings(m.spec, measured.inputs) if measured.inputs.sae_layers is not None else []
        top1 = None if measured.inputs.eval is None else measured.inputs.eval.top1
        print(f"\n{m.name} ({m.spec} on {m.data}, clean top-1 {top1}): {time.time() - t0:.0f} s, stages "
              + ", ".join(f"{k} {v:.0f} s" for k, v in measured.seconds.items()))
        for r in case_rows_:
            print(f"  {r.claim} planted {r.planted}: {r.verdict} ({'as planted' if r.passes else 'NOT as planted'}); "
                  "conditions " + ", ".join(f"{k} {v}" for k, v in r.conditions.items()))
            if not sites:  # no sweep (a RoPE case): the claim's own evidence
                print(f"    {r.evidence}")
        for s in sites:
            print(_site_line(s))
        per_case[m.name] = {"spec": m.spec, "data": m.data, "clean_top1": top1, "seconds": measured.seconds,
                            "sites": [s.model_dump(mode="json") for s in sites]}
    table = table_of(rows, sizes.test_images, tuple(range(sizes.seeds)))
    print("\n" + table.markdown())
    total = round(time.time() - t_all, 1)
    print(f"\n{sum(r.passes for r in rows)} of {len(rows)} rows as planted; {total} s; load average at start {load}, "
          f"at end {[round(x, 2) for x in os.getloadavg()]}")
    if args.json is not None:
        doc = {"created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "sizes": asdict(sizes),
               "seconds": total, "load_at_start": load, "load_at_end": [round(x, 2) for x in os.getloadavg()],
               "cpus": os.cpu_count(), "table": table.model_dump(mode="json"), "cases": per_case}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
