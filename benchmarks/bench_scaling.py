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

`--case vits16` measures instead the peak RSS of two study stages on a ViT-S/16 at 224 px (random
weights, 14x14 grid, 12 layers, D 384) over --eval-images (default 1000) synthetic images, each in a
fresh subprocess (target: peak RSS <= 2 GiB, whatever the number of layers and images):

  sae-eval   the SAE stage's held-out part (`vitpos.experiments.sae_heldout.evaluate_sae`) of a random
             TopK SAE (--sae-expansion, k 32) at blocks.<--sae-layer>.resid_post of
             timm:vit_small_patch16_224: capture, SAE metrics and feature scores, splice, and the
             causal check (clean probes on every later layer, one ablated forward per feature set;
             a random SAE may find no row / col features, so the 8 latents with the highest eta^2 of
             each axis stand in, to measure the ablations)
  rope-axis  `run_rope_axis` on timm:vit_small_patch16_rope_224 with --restore (default 6, as --quick)

    python benchmarks/bench_scaling.py --case vits16 [--eval-images 1000] [--batch-size N] [--sae-layer 0]
        [--sae-expansion 4] [--restore 6] [--stages sae-eval,rope-axis] [--threads 1] [--out FILE.json]

--batch-size is the images per forward and per SAE batch; default: the study's own
(`experiments.common.sweep_batch`: 256 images on 8x8 grids, as many patch tokens on larger ones, so
83 images at 14x14). A batch's own transients (a ViT-S/16 forward of 256 images at 224 px peaks
~0.9 GiB, an SAE pass over them more) do not grow with the images or layers, but at 256 images they
alone exceeded the 2 GiB target.
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


VITS16 = {"sae-eval": "timm:vit_small_patch16_224", "rope-axis": "timm:vit_small_patch16_rope_224"}


def _positional_stand_ins(scores, k: int = 8):
    """The scores with row / col features filled by the k highest-eta^2 latents where none passed the
    thresholds (a random SAE): the causal check then runs its ablated forwards, the memory under test."""
    import dataclasses

    if scores.row_features and scores.col_features:
        return scores
    top = {a: getattr(scores, f"eta2_{a}").argsort(descending=True)[:k].tolist() for a in ("row", "col")}
    return dataclasses.replace(scores, row_features=scores.row_features or top["row"],
                               col_features=scores.col_features or top["col"])


def vits16_worker(args) -> dict:
    """One study stage on a random-weight ViT-S/16 at 224 px over args.eval_images synthetic images."""
    import torch

    torch.set_num_threads(args.threads)
    from vitpos.data import dataset_info
    from vitpos.experiments.common import sweep_batch
    from vitpos.models import load_model
    from vitpos.models.surface import Site

    info = dataset_info("shapes")
    # class count = the data's, so the logits pass the classifier check and top-1 / splice run as in a study
    surface = load_model(f"{VITS16[args.stage]}?num_classes={info.num_classes}")
    ds = SyntheticImages(args.eval_images, surface.input_size, info)
    batch = sweep_batch(surface, args.batch_size)  # None: the study's default
    if args.stage == "sae-eval":
        from vitpos.experiments import sae_heldout
        from vitpos.sae import SAE, SAEConfig

        torch.manual_seed(0)
        sae = SAE(SAEConfig(d_in=surface.width, expansion=args.sae_expansion, k=32))
        scores_fn = sae_heldout.score_features
        sae_heldout.score_features = lambda *a, **k: _positional_stand_ins(scores_fn(*a, **k))
        site = Site(args.sae_layer, "resid_post")

        def run():
            return sae_heldout.evaluate_sae(surface, sae, site, ds, seed=0, logits=True, batch_size=batch)
    else:
        from vitpos.experiments.rope_axis import run_rope_axis

        def run():
            return run_rope_axis(surface, ds, n_images=args.eval_images, restore_points=[args.restore], seed=0,
                                 batch_size=batch)
    base = _rss_kib("VmRSS")
    exact = _reset_peak()
    c0, w0 = time.process_time(), time.perf_counter()
    run()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    peak = _rss_kib("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"stage": args.stage, "model": surface.spec, "images": args.eval_images, "batch": batch,
            "grid": list(surface.grid),
            "layers": surface.depth, "cpu_s": cpu, "wall_s": wall, "baseline_rss_mib": (base or 0) / 1024,
            "peak_rss_mib": (peak or 0) / 1024, "peak_over_baseline_mib": ((peak or 0) - (base or 0)) / 1024,
            "peak_exact": exact, "loadavg_1m": os.getloadavg()[0]}


def run_vits16(args, env: dict) -> list[dict]:
    """Each --stages entry in a fresh subprocess; prints a table and the verdict against 2 GiB."""
    rows = []
    for stage in args.stages.split(","):
        cmd = [sys.executable, __file__, "--case", "vits16", "--worker", stage, "--eval-images", str(args.eval_images),
               "--sae-layer", str(args.sae_layer), "--sae-expansion", str(args.sae_expansion),
               "--restore", str(args.restore), "--threads", str(args.threads)]
        if args.batch_size is not None:
            cmd += ["--batch-size", str(args.batch_size)]
        load0 = os.getloadavg()[0]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            raise SystemExit(f"{stage} failed")
        row = json.loads(r.stdout.strip().splitlines()[-1])
        row["loadavg_1m_before"] = load0
        rows.append(row)
        print(f"{stage:9s} {row['images']} images (batch {row['batch']})  peak RSS {row['peak_rss_mib']:7.0f} MiB "
              f"(+{row['peak_over_baseline_mib']:.0f} over {row['baseline_rss_mib']:.0f})  CPU {row['cpu_s']:.0f} s  "
              f"wall {row['wall_s']:.0f} s  load {load0:.1f} -> {row['loadavg_1m']:.1f}", flush=True)
    print()
    print("| stage | model | images | batch | peak RSS (MiB) | over baseline (MiB) | CPU s | wall s | load 1 min |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['stage']} | {r['model']} | {r['images']} | {r['batch']} | {r['peak_rss_mib']:.0f} | "
              f"{r['peak_over_baseline_mib']:.0f} | {r['cpu_s']:.0f} | {r['wall_s']:.0f} | "
              f"{r['loadavg_1m_before']:.1f}-{r['loadavg_1m']:.1f} |")
    for r in rows:
        ok = r["peak_rss_mib"] <= 2048
        print(f"{r['stage']}: peak RSS {r['peak_rss_mib']:.0f} MiB ({'<=' if ok else '>'} 2 GiB target)")
    return rows


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
    p.add_argument("--batch-size", type=int, default=None,
                   help="images per forward (default: 64 for the scaling case, the study's own for --case vits16)")
    p.add_argument("--shard-images", type=int, default=128)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--buffer-tokens", type=int, default=16384)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    p.add_argument("--workdir", default=None, help="where the stores go (default: a temp folder, removed after)")
    p.add_argument("--out", default=None)
    p.add_argument("--case", choices=["stream", "vits16"], default="stream",
                   help="stream: capture + SAE training at 1x..16x (default); vits16: study stages on ViT-S/16")
    p.add_argument("--eval-images", type=int, default=1000, help="vits16: images per stage")
    p.add_argument("--stages", default="sae-eval,rope-axis", help="vits16: stages to run")
    p.add_argument("--sae-layer", type=int, default=0, help="vits16: SAE site layer (0: the most later layers)")
    p.add_argument("--sae-expansion", type=int, default=4, help="vits16: SAE latents per model width")
    p.add_argument("--restore", type=int, default=6, help="vits16: rope-axis restore point")
    p.add_argument("--worker", choices=["capture", "sae", "sae-eval", "rope-axis"], default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.stage = args.worker
        print(json.dumps(vits16_worker(args) if args.case == "vits16" else worker(args)))
        return

    import torch

    if args.case == "vits16":
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
        if args.malloc == "fixed":
            env["MALLOC_MMAP_THRESHOLD_"] = str(2**20)
        rows = run_vits16(args, env)
        if args.out:
            from vitpos.io import write_json

            keys = ("eval_images", "batch_size", "stages", "sae_layer", "sae_expansion", "restore", "threads", "malloc")
            write_json(args.out, {"benchmark": "scaling-vits16", "settings": {k: getattr(args, k) for k in keys},
                                  "rows": rows, "torch": torch.__version__, "python": platform.python_version(),
                                  "machine": platform.machine(), "cpus": os.cpu_count()})
        return

    scales = [int(s) for s in args.scales.split(",")]
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="vitpos-bench-scaling-")
        args.workdir = tmp.name
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    if args.malloc == "fixed":
        env["MALLOC_MMAP_THRESHOLD_"] = str(2**20)
    if args.batch_size is None:
        args.batch_size = 64
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
