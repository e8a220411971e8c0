"""Benchmark: does capture and SAE training stream? Time per step and peak memory vs dataset size.

For each size (default 1x, 4x, 16x of --images) two stages run, each in a fresh subprocess so that
the peak-memory reading belongs to that stage alone:

  capture  vitpos.store.capture.capture_to_store (what `vitpos capture` runs) of one site of a model over
           the first N train images, into a float32 store (shards of --shard-images images)
  sae      vitpos.sae.train_sae for one epoch over that store, streamed with the store's shuffled
           iter_tokens (bounded buffer), --batch-tokens tokens per step

Per stage: time per step (capture step = one forward batch + its share of the shard writes; SAE step
= one optimiser step including reading its tokens), by process CPU time (default; `--clock wall`
also recorded), and peak memory = peak RSS during the stage minus the RSS just before it (Linux:
the kernel's VmHWM after resetting it through /proc/self/clear_refs; elsewhere ru_maxrss, which
cannot be reset and so only bounds it). The model and the interpreter are loaded before the
baseline. Default images are `synthetic`: random images made batch by batch, so the dataset itself
takes no memory (a built-in `--data shapes` split is generated in memory, ~3 KB per image, and its
pages become resident during the pass: that is the dataset, not the pipeline under test). By
default the workers run with a fixed glibc mmap threshold (`--malloc fixed`, 1 MiB) so that freed
large blocks go back to the OS and RSS follows live memory; with glibc's adaptive threshold
(`--malloc default`) RSS also keeps freed heap and creeps up a few MiB over the first hundred steps.
Streaming means both columns stay flat from 1x to 16x; the script prints the ratio 16x / 1x per
column (target <= 1.25 for memory; time per step within the machine's noise).

    python benchmarks/bench_scaling.py [--model builtin:ape] [--data synthetic] [--site blocks.1.resid_post]
        [--malloc fixed|default] [--images 1024] [--scales 1,4,16] [--batch-size 64] [--shard-images 128]
        [--batch-tokens 2048] [--buffer-tokens 16384] [--threads 1] [--clock cpu|wall] [--workdir DIR] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class SyntheticImages:
    """N random images made batch by batch (seeded by position): a dataset that itself takes no
    memory, so the capture measurement sees the pipeline alone. Same interface as vitpos' datasets."""

    def __init__(self, n: int, input_size, info, start: int = 0):
        self.n, self.input_size, self.info, self.start, self.split = n, tuple(input_size), info, start, "train"

    def __len__(self) -> int:
        return self.n

    def subset(self, n):
        return self if n is None or n >= self.n else SyntheticImages(n, self.input_size, self.info, self.start)

    def batches(self, batch_size: int, shuffle: bool = False, generator=None):
        import torch

        for i in range(0, self.n, batch_size):
            b = min(batch_size, self.n - i)
            g = torch.Generator().manual_seed(self.start + i)
            yield torch.randn(b, *self.input_size, generator=g), torch.zeros(b, dtype=torch.int64)


def worker(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from vitpos.data.resolve import dataset_for
    from vitpos.models import load_model
    from vitpos.sae import SAEConfig, train_sae
    from vitpos.store.capture import capture_to_store
    from vitpos.store.reader import ActivationStore

    store_dir = Path(args.workdir) / f"store-{args.n}"
    if args.stage == "capture":
        surface = load_model(args.model)
        if args.data == "synthetic":
            from vitpos.data import dataset_info

            ds = SyntheticImages(args.n, surface.input_size, dataset_info("shapes"))
        else:
            ds = dataset_for(surface, args.data, "train", limit=args.n)
        if len(ds) < args.n:
            raise SystemExit(f"{args.data} has only {len(ds)} train images; lower --images or --scales")
        # warm-up (allocator, kernels) outside the measurement
        capture_to_store(surface, ds.subset(args.batch_size), "train", args.site, Path(args.workdir) / "warm",
                         batch_size=args.batch_size, shard_images=args.shard_images, force=True, progress=False)
        steps = -(-args.n // args.batch_size)

        def run():
            capture_to_store(surface, ds, "train", args.site, store_dir, batch_size=args.batch_size,
                             shard_images=args.shard_images, force=True, progress=False)
    else:
        store = ActivationStore(store_dir)
        site = store.sites[0]
        d = store.d[site]
        cfg = SAEConfig(d_in=d, expansion=8, k=32)
        n_tokens = store.num_images * store.num_patches
        steps = n_tokens // args.batch_tokens

        def batches():
            it = store.iter_tokens(site, args.batch_tokens, shuffle=True, seed=0, buffer_tokens=args.buffer_tokens)
            for acts, *_ in it:
                if acts.shape[0] == args.batch_tokens:  # a short tail batch is not a comparable step
                    yield acts

        train_sae([torch.randn(args.batch_tokens, d)] * 2, cfg, steps=2, progress=False)  # warm-up
        def run():
            train_sae(batches, cfg, epochs=1, progress=False)
    base = _rss_kib("VmRSS")
    exact = _reset_peak()
    c0, w0 = time.process_time(), time.perf_counter()
    run()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    peak = _rss_kib("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"stage": args.stage, "images": args.n, "steps": steps, "cpu_s": cpu, "wall_s": wall,
            "cpu_ms_per_step": 1000 * cpu / steps, "wall_ms_per_step": 1000 * wall / steps,
            "baseline_rss_mib": (base or 0) / 1024, "peak_rss_mib": (peak or 0) / 1024,
            "peak_over_baseline_mib": ((peak or 0) - (base or 0)) / 1024, "peak_exact": exact}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="builtin:ape")
    p.add_argument("--data", default="synthetic", help="synthetic (random images made per batch) or a dataset name")
    p.add_argument("--malloc", choices=["fixed", "default"], default="fixed",
                   help="fixed: MALLOC_MMAP_THRESHOLD_=1 MiB in the workers (glibc returns freed large blocks at "
                        "once, so RSS tracks live memory); default: glibc's adaptive threshold (RSS also holds freed "
                        "heap)")
    p.add_argument("--site", default="blocks.1.resid_post")
    p.add_argument("--images", type=int, default=1024,
                   help="images at scale 1x (8 shards: the shuffle buffer reaches its steady state)")
    p.add_argument("--scales", default="1,4,16")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--shard-images", type=int, default=128)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--buffer-tokens", type=int, default=16384)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    p.add_argument("--workdir", default=None, help="where the stores go (default: a temp folder, removed after)")
    p.add_argument("--out", default=None)
    p.add_argument("--worker", choices=["capture", "sae"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.stage = args.worker
        print(json.dumps(worker(args)))
        return

    import torch

    scales = [int(s) for s in args.scales.split(",")]
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="vitpos-bench-scaling-")
        args.workdir = tmp.name
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    if args.malloc == "fixed":
        env["MALLOC_MMAP_THRESHOLD_"] = str(2**20)
    rows = []
    try:
        for s in scales:
            n = args.images * s
            for stage in ("capture", "sae"):
                cmd = [sys.executable, __file__, "--worker", stage, "--n", str(n), "--workdir", args.workdir,
                       "--model", args.model, "--data", args.data, "--site", args.site,
                       "--batch-size", str(args.batch_size), "--shard-images", str(args.shard_images),
                       "--batch-tokens", str(args.batch_tokens), "--buffer-tokens", str(args.buffer_tokens),
                       "--threads", str(args.threads)]
                r = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if r.returncode != 0:
                    sys.stderr.write(r.stderr)
                    raise SystemExit(f"{stage} at {s}x failed")
                row = json.loads(r.stdout.strip().splitlines()[-1])
                row["scale"] = s
                rows.append(row)
                print(f"{stage:8s} {s:>3d}x  {n:6d} images  {row['steps']:5d} steps  "
                      f"{row[args.clock + '_ms_per_step']:8.2f} ms/step ({args.clock})  "
                      f"peak +{row['peak_over_baseline_mib']:7.1f} MiB over {row['baseline_rss_mib']:.0f} MiB",
                      flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    key = args.clock + "_ms_per_step"
    print()
    print(f"| stage | scale | images | steps | {args.clock} ms/step | wall ms/step | peak RSS over baseline (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['stage']} | {r['scale']}x | {r['images']} | {r['steps']} | {r[key]:.2f} | "
              f"{r['wall_ms_per_step']:.2f} | {r['peak_over_baseline_mib']:.1f} |")
    verdict = {}
    for stage in ("capture", "sae"):
        rs = [r for r in rows if r["stage"] == stage]
        lo, hi = rs[0], rs[-1]
        t_ratio = hi[key] / lo[key]
        m_ratio = hi["peak_over_baseline_mib"] / max(lo["peak_over_baseline_mib"], 1e-9)
        verdict[stage] = {"time_per_step_ratio": t_ratio, "peak_memory_ratio": m_ratio,
                          "memory_flat": m_ratio <= 1.25}
        print(f"{stage}: {hi['scale']}x / {lo['scale']}x time per step {t_ratio:.2f}, peak memory {m_ratio:.2f} "
              f"({'flat' if m_ratio <= 1.25 else 'NOT flat'})")
    if args.out:
        from vitpos.io import write_json

        write_json(args.out,
                   {"benchmark": "scaling",
                    "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "n", "stage")},
                              "rows": rows, "verdict": verdict, "torch": torch.__version__,
                    "python": platform.python_version(),
                              "machine": platform.machine()})


if __name__ == "__main__":
    main()
