"""Benchmark: capture overhead of `vitpos capture` (resid_post at every layer) vs a bare forward.

Three passes over the same dataset split (same loading, same batches, eval mode, no grad):
  bare     the model's forward only
  hooks    the same with vitpos' capture hooks on every layer (pop_batch per batch), nothing written
  store    vitpos.store.capture.capture_to_store (what `vitpos capture` runs): hooks + shards on disk,
           once per storage dtype
Passes are timed in interleaved rounds; the best round gives img/s and time / bare (interference only slows a
round); the target reads the median round (issue 16: not the best).
The clock is the process CPU time by default (`--clock cpu`: it does not count time spent
descheduled by other jobs; with one thread it equals wall time on an idle machine, but it also
leaves out waits on the disk), or wall time (`--clock wall`); both are recorded.
Reported: images/s, time ratio vs bare (target for store: <= 1.10x) and the bytes on disk per
stored activation value = shard bytes / (images x patches x D x layers).

Default data: a generated imagefolder of random PNGs (the `imagefolder:PATH` path, with the timm
model's own preprocessing); `--data shapes` etc. also work for models of matching input size.

    python benchmarks/bench_capture.py [--model SPEC] [--images 96] [--batch-size 32]
                                       [--dtypes float32,float16] [--rounds 4] [--threads 1] [--clock cpu|wall]
                                       [--out FILE.json]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image

from vitpos.data.resolve import dataset_for
from vitpos.hooks import capture
from vitpos.io import read_json, write_json
from vitpos.models import load_model
from vitpos.models.surface import expand_sites
from vitpos.store.capture import capture_to_store, tokens_first

DEFAULT_MODEL = "timm:vit_small_patch16_224?img_size=64&patch_size=8&num_classes=10"


def make_imagefolder(root: Path, n: int, size: int, classes: int = 4, seed: int = 0) -> str:
    """root/train/cK/i.png random RGB images: every image lands in the train split."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        d = root / "train" / f"c{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(d / f"{i:05d}.png")
    return f"imagefolder:{root}"


def bare_pass(surface, ds, batch_size: int) -> None:
    with torch.no_grad():
        for x, _ in ds.batches(batch_size):
            surface(x)


def hooks_pass(surface, ds, batch_size: int, sites: str) -> None:
    site_list = expand_sites(sites, surface.depth)
    keys = [str(s) for s in site_list]
    with torch.no_grad(), capture(surface, site_list) as cache:
        for x, _ in ds.batches(batch_size):
            surface(x)
            for k in keys:
                tokens_first(cache.pop_batch(k))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="any vitpos model SPEC (random weights for timm:)")
    ap.add_argument("--data", default=None, help="dataset name (default: a generated imagefolder)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--images", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--dtypes", default="float32,float16", help="storage dtypes to time")
    ap.add_argument("--sites", default="resid_post")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved timing rounds; the best is kept")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--workdir", default=None, help="where stores are written (default: a temp folder)")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu", help="process CPU time or wall time")
    ap.add_argument("--out", default=None, help="write the results as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    surface = load_model(args.model)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        data = args.data or make_imagefolder(tmp / "images", args.images, size=surface.input_size[-1])
        ds = dataset_for(surface, data, args.split, limit=args.images)
        n = len(ds)
        layers = len(expand_sites(args.sites, surface.depth))

        passes = {"bare": lambda: bare_pass(surface, ds, args.batch_size),
                  "hooks": lambda: hooks_pass(surface, ds, args.batch_size, args.sites)}
        for dt in dtypes:
            passes[f"store-{dt}"] = (lambda dt=dt: capture_to_store(
                surface, data, args.split, args.sites, tmp / f"store-{dt}", limit=args.images,
                batch_size=args.batch_size, dtype=dt, force=True, progress=False))

        # warm-up: one batch through the model (allocator, kernels); not timed
        bare_pass(surface, ds.subset(args.batch_size), args.batch_size)
        times: dict[str, dict[str, list[float]]] = {k: {"cpu": [], "wall": []} for k in passes}
        for _ in range(args.rounds):
            for k, fn in passes.items():
                w0, c0 = time.perf_counter(), time.process_time()
                fn()
                times[k]["wall"].append(time.perf_counter() - w0)
                times[k]["cpu"].append(time.process_time() - c0)
        secs = {k: min(v[args.clock]) for k, v in times.items()}
        wall = {k: min(v["wall"]) for k, v in times.items()}
        med = {k: statistics.median(v[args.clock]) for k, v in times.items()}  # the target reads the median round

        disk = {}
        for dt in dtypes:
            store = tmp / f"store-{dt}"
            m = read_json(store / "manifest.json")
            shard_bytes = sum(p.stat().st_size for p in store.glob("shard-*.safetensors"))
            values = m["num_images"] * m["num_patches"] * sum(m["d"].values())
            disk[dt] = {"shard_bytes": shard_bytes, "values": values, "bytes_per_value": shard_bytes / values,
                        "bytes_per_image": shard_bytes / m["num_images"], "num_shards": len(m["shards"])}

    rows = []
    for k, s in secs.items():
        dt = k.split("-", 1)[1] if k.startswith("store-") else None
        rows.append({"pass": k, "seconds": s, "images_per_s": n / s, "ratio_vs_bare": s / secs["bare"],
                     "median_seconds": med[k], "median_ratio_vs_bare": med[k] / med["bare"],
                     "wall_seconds": wall[k], "wall_ratio_vs_bare": wall[k] / wall["bare"], "round_seconds": times[k],
                     "bytes_per_value": disk[dt]["bytes_per_value"] if dt else None})
    store_ratios = [r["median_ratio_vs_bare"] for r in rows if r["pass"].startswith("store-")]
    ok = bool(store_ratios) and max(store_ratios) <= 1.10  # on the median round, not the best

    print(f"capture of {args.sites} ({layers} layers) from {args.model}: {n} images of {data.split(':')[0]}, "
          f"batch {args.batch_size}, grid {surface.grid[0]}x{surface.grid[1]}, D {surface.width}, "
          f"threads {args.threads}, best of {args.rounds} rounds, {args.clock} clock")
    print(f"{'pass':<16} {'img/s':>8} {'time / bare':>12} {'median / bare':>14} {'wall / bare':>12} "
          f"{'bytes/value':>12}")
    for r in rows:
        bpv = f"{r['bytes_per_value']:.4f}" if r["bytes_per_value"] is not None else "-"
        print(f"{r['pass']:<16} {r['images_per_s']:>8.2f} {r['ratio_vs_bare']:>11.3f}x "
              f"{r['median_ratio_vs_bare']:>13.3f}x {r['wall_ratio_vs_bare']:>11.3f}x {bpv:>12}")
    for dt, d in disk.items():
        print(f"{dt}: {d['shard_bytes']:,} shard bytes for {d['values']:,} values ({d['bytes_per_image'] / 2**20:.2f} "
              "MiB/image)")
    print(f"target store time <= 1.10x bare (median round, every dtype): {'MET' if ok else 'NOT MET'}")

    if args.out:
        write_json(args.out, {
            "benchmark": "capture", "model": args.model, "data": data.split(":")[0] if args.data is None else data,
            "images": n, "batch_size": args.batch_size, "sites": args.sites, "layers": layers,
            "grid": list(surface.grid), "width": surface.width, "threads": args.threads, "rounds": args.rounds,
            "clock": args.clock, "rows": rows, "disk": disk, "target_ratio": 1.10, "target_met": ok,
            "python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
        })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
