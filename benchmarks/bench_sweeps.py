"""Benchmark: the causal sweeps (rope-heads, rope-axis) with the shared prefix vs every condition
from the input (`shared_prefix=False`, the code before issue 16).

Both paths run on the same model and data; their results must agree (every float within 1e-5;
they are in fact bit-identical), the table gives process CPU time, the ratio old / new, and the
image-forwards, image x block evaluations and probe fits each path really did (counted with hooks),
beside what `Experiment.plan` predicts. Then the plan of a ViT-B/16 study on 2000 images, with
the time estimated from a throughput measured here (wall clock, like `vitpos run --plan`).

Default model: timm `vit_small_patch16_rope_224` with random weights (12 layers, 6 heads, D 384)
at 32 px with 8 px patches (a 4 x 4 grid), on `shapes` test images: minutes on one core.

    python benchmarks/bench_sweeps.py [--model SPEC] [--top1-images 32] [--probe-images 40]
        [--attn-images 8] [--axis-images 40] [--threads 1] [--skip-vitb] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from contextlib import contextmanager

import timm
import torch

import vitpos.experiments.common as common
from vitpos.data.resolve import dataset_for
from vitpos.experiments.base import SplitSizes, StagePlan
from vitpos.experiments.rope_axis import plan_rope_axis, run_rope_axis
from vitpos.experiments.rope_heads import run_rope_heads
from vitpos.experiments.rope_heads_plan import plan_rope_heads
from vitpos.io import write_json
from vitpos.models import load_model

DEFAULT_MODEL = "timm:vit_small_patch16_rope_224?img_size=32&patch_size=8&num_classes=4"
VIT_B = "timm:vit_base_patch16_rope_mixed_224"


@contextmanager
def counting(surface):
    """Images through the patch embedding, image x block evaluations and probe fits, as they happen."""
    counts = {"forwards": 0, "blocks": 0, "fits": 0}
    real_fit = common.fit_probe_tokens  # the sweeps fit on what their bounded captures kept

    def fit(*args, **kw):
        counts["fits"] += 1
        return real_fit(*args, **kw)

    def add(key, n):
        counts[key] += n

    common.fit_probe_tokens = fit
    handles = [surface.model.patch_embed.register_forward_hook(lambda m, a, out: add("forwards", a[0].shape[0]))]
    handles += [b.register_forward_pre_hook(lambda m, a: add("blocks", a[0].shape[0])) for b in surface.model.blocks]
    try:
        yield counts
    finally:
        common.fit_probe_tokens = real_fit
        for h in handles:
            h.remove()


def max_difference(a, b, path: str = "") -> tuple[float, str]:
    """Largest |a - b| over the floats of two result documents (inf where the structure differs)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return float("inf"), path
        return max((max_difference(a[k], b[k], f"{path}/{k}") for k in a), default=(0.0, path))
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return float("inf"), path
        pairs = enumerate(zip(a, b, strict=True))
        return max((max_difference(x, y, f"{path}[{i}]") for i, (x, y) in pairs), default=(0.0, path))
    if isinstance(a, float) and isinstance(b, float):
        if a != a and b != b:
            return 0.0, path
        return abs(a - b), path
    return (0.0, path) if a == b else (float("inf"), path)


def timed(fn):
    t0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - t0, time.perf_counter() - w0


def run_sweep(name: str, surface, data, args) -> dict:
    sizes = SplitSizes(test=None)
    if name == "rope_heads":
        settings = {"axis": "both", "restore_from": None, "probe_images": args.probe_images,
                    "top1_images": args.top1_images, "attn_images": args.attn_images}

        def go(shared):
            return run_rope_heads(surface, data, n_probe_images=args.probe_images, n_top1_images=args.top1_images,
                                  n_attn_images=args.attn_images, shared_prefix=shared)
        plan = plan_rope_heads
    else:
        settings = {"images": args.axis_images, "restore": None}

        def go(shared):
            return run_rope_axis(surface, data, n_images=args.axis_images, shared_prefix=shared)
        plan = plan_rope_axis
    row: dict = {"sweep": name, "settings": settings}
    docs = {}
    for label, shared in (("old", False), ("shared", True)):
        with counting(surface) as counts:
            result, cpu, wall = timed(lambda shared=shared: go(shared))
        p: StagePlan = plan(settings, surface, sizes, shared_prefix=shared)
        docs[label] = result.to_json()
        row[label] = {"cpu_s": cpu, "wall_s": wall, **counts,
                      "planned": {"forwards": p.forwards, "blocks": p.blocks, "fits": p.fits},
                      "plan_matches": (p.forwards, p.blocks, p.fits) == (counts["forwards"], counts["blocks"],
                                                                       counts["fits"])}
        print(f"  {name} {label}: {cpu:.1f} s CPU ({wall:.1f} s wall), {counts['forwards']:,} forwards, "
              f"{counts['blocks']:,} blocks, {counts['fits']} fits", flush=True)
    diff, where = max_difference(docs["old"], docs["shared"])
    row["max_abs_difference"] = diff
    row["where"] = where
    row["bit_identical"] = diff == 0.0  # NaN == NaN counted equal (recovery is NaN where undefined)
    row["cpu_ratio"] = row["old"]["cpu_s"] / row["shared"]["cpu_s"]
    row["block_ratio"] = row["old"]["blocks"] / row["shared"]["blocks"]
    return row


def vitb_plan(measure: bool) -> dict:
    """Plan of a ViT-B/16 (rope-mixed, 224 px) study with 2000 images per stage (eval, probe,
    rope_axis images and rope_heads top-1 images; rope_heads probes on its default 500)."""
    from vitpos.experiments.registry import BY_NAME
    from vitpos.study.config import RunConfig
    from vitpos.study.plan import measure_throughput

    cfg = RunConfig.model_validate({"models": [VIT_B], "eval_images": 2000, "probe": {"images": 2000},
                                    "rope_axis": {"images": 2000}, "rope_heads": {"top1_images": 2000}})
    torch.manual_seed(0)
    surface = load_model(VIT_B)
    tp = measure_throughput(surface) if measure else None
    sizes = SplitSizes(train=None, test=None)
    rows = []
    for name in ("eval", "probe", "rope_axis", "rope_heads"):
        exp = BY_NAME[name]
        settings = exp.plan_settings(cfg, surface, {}, False)
        plans = {"shared": exp.plan(settings, surface, sizes)}
        if name == "rope_axis":
            plans["old"] = plan_rope_axis(settings, surface, sizes, shared_prefix=False)
        elif name == "rope_heads":
            plans["old"] = plan_rope_heads(settings, surface, sizes, shared_prefix=False)
            # adaptive top-1 (--top1-screen): every head on the first 256 images, then the heads in the race
            plans["screen 256"] = plan_rope_heads({**settings, "top1_screen_images": 256}, surface, sizes)
        for label, p in plans.items():
            rows.append({"stage": name, "path": label, "forwards": p.forwards, "blocks": p.blocks, "fits": p.fits,
                         "est_s": None if tp is None else tp.seconds(p)})
    return {"model": VIT_B, "rows": rows,
            "throughput": None if tp is None else {"device": tp.device, "block_s": tp.block_s, "embed_s": tp.embed_s,
                                                   "fit_work_s": tp.fit_work_s}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--data", default="shapes")
    ap.add_argument("--top1-images", type=int, default=32)
    ap.add_argument("--probe-images", type=int, default=40)
    ap.add_argument("--attn-images", type=int, default=8)
    ap.add_argument("--axis-images", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-vitb", action="store_true", help="no ViT-B/16 plan (it builds the model and times it)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    surface = load_model(args.model)
    data = dataset_for(surface, args.data, "test", limit=max(args.top1_images, args.probe_images, args.axis_images,
                                                               args.attn_images))
    load = os.getloadavg()
    print(f"{args.model}: depth {surface.depth}, heads {surface.num_heads}, grid {surface.grid}; "
          f"{args.threads} thread(s); load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    rows = [run_sweep("rope_heads", surface, data, args), run_sweep("rope_axis", surface, data, args)]
    load_after = os.getloadavg()
    print()
    print(f"{'sweep':<11} {'old CPU s':>9} {'new CPU s':>9} {'ratio':>6} {'old fwd':>8} {'new fwd':>8} "
          f"{'old blocks':>10} {'new blocks':>10} {'old fits':>8} {'new fits':>8} {'max |diff|':>10} plan=count")
    for r in rows:
        o, n = r["old"], r["shared"]
        print(f"{r['sweep']:<11} {o['cpu_s']:>9.1f} {n['cpu_s']:>9.1f} {r['cpu_ratio']:>5.2f}x {o['forwards']:>8,} "
              f"{n['forwards']:>8,} {o['blocks']:>10,} {n['blocks']:>10,} {o['fits']:>8} {n['fits']:>8} "
              f"{r['max_abs_difference']:>10.1e} {o['plan_matches'] and n['plan_matches']}")
    print(f"load before {load[0]:.2f}, after {load_after[0]:.2f} (1-min average); "
          f"results bit-identical: {all(r['bit_identical'] for r in rows)}")
    doc = {"model": args.model, "threads": args.threads, "load_before": load, "load_after": load_after,
           "torch": torch.__version__, "timm": timm.__version__, "python": sys.version.split()[0],
           "machine": platform.machine(), "sweeps": rows}
    if not args.skip_vitb:
        vb = vitb_plan(measure=True)
        doc["vit_b16_plan"] = vb
        tp = vb["throughput"]
        print(f"\n{VIT_B}, 2000 images per stage (rope_heads probes 500, attention 64), "
              f"{1 / tp['block_s']:.1f} image-blocks/s measured here on {tp['device']} (wall clock):")
        print(f"{'stage':<11} {'path':<10} {'forwards':>10} {'blocks':>12} {'fits':>6} {'est.':>10}")
        for r in vb["rows"]:
            est = "" if r["est_s"] is None else f"{r['est_s'] / 3600:.1f} h"
            print(f"{r['stage']:<11} {r['path']:<10} {r['forwards']:>10,} {r['blocks']:>12,} {r['fits']:>6} {est:>10}")
    if args.out:
        write_json(args.out, json.loads(json.dumps(doc, default=str)))
    ok = all(r["max_abs_difference"] <= 1e-5 and r["old"]["plan_matches"] and r["shared"]["plan_matches"]
             for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
