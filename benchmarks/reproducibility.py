"""Do the headlines reproduce across torch thread counts? (issue 48, item 2)

Runs the same study twice in fresh output folders, once per thread count (default 1 and 2: torch's
intra-op threads via OMP_NUM_THREADS / MKL_NUM_THREADS, so float reductions, and with them the SAE
and the probes, may differ), then reads C1, C2 and C3's headline number per model with its 95 %
interval from each results.json and says whether each run's number lies inside the other run's
interval. A number outside is variance no interval of the README covers (the intervals resample
images only; issue 48).

    python benchmarks/reproducibility.py --out DIR [--models M1,M2] [--data pairs] [--threads 1,2]
                                          [--quick] [--config FILE] [--json FILE]

Default models: the zoo's seed-0 APE members and its two pure-RoPE members on `pairs` (what README
command 1 runs for C1-C3), with the layer sweep off (`sae_layers.enabled: false`, the single SAE
layer the README's C1 / C2 numbers read). The runs are whole `vitpos run`s (each also measures the
planted-model table): about an hour per thread count on 2 idle cores at full sizes; `--quick` runs
the smoke sizes. Runs resume: an existing output folder is reused stage by stage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from vitpos.claims.registry import BY_ID
from vitpos.claims.summary import headline_interval, headline_value

DEFAULT_MODELS = ("builtin:pairs-ape", "builtin:pairs-ape-sinit", "builtin:pairs-sincos",
                  "builtin:pairs-rope-axial", "builtin:pairs-rope-mixed")
CLAIMS = ("C1", "C2", "C3")


@dataclass(frozen=True)
class Headline:
    claim: str
    model: str
    number: str
    values: dict[str, float | None]  # thread count -> the headline number
    cis: dict[str, list[float] | None]  # thread count -> its 95 % interval

    def inside(self, a: str, b: str) -> bool | None:
        """Whether run a's number lies inside run b's interval (None: either is missing)."""
        v, ci = self.values[a], self.cis[b]
        return None if v is None or ci is None else ci[0] <= v <= ci[1]


def run_once(out: Path, threads: int, args: argparse.Namespace, config: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "vitpos.cli", "run", "--no-progress", "--out", str(out), "--models", args.models,
           "--data", args.data, "--config", str(config)] + (["--quick"] if args.quick else [])
    t = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: the run at {threads} thread(s) failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    return time.time() - t


def headlines(results: dict[str, dict], threads: list[str]) -> list[Headline]:
    """Each claim's headline per model, as each run's summary numbers give it."""
    out = []
    for cid in CLAIMS:
        claim = BY_ID[cid]
        per_run = {n: next((c for c in results[n]["summary"]["claims"] if c["id"] == cid), {}) for n in threads}
        models = sorted(set().union(*(c.get("numbers", {}) for c in per_run.values())))
        for m in models:
            nums = {n: per_run[n].get("numbers", {}).get(m, {}) for n in threads}
            out.append(Headline(cid, m, claim.headline.number,
                                {n: headline_value(claim, nums[n]) for n in threads},
                                {n: headline_interval(claim, nums[n]) for n in threads}))
    return out


def fmt(v: float | None, ci: list[float] | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3g}" + ("" if ci is None else f" [{ci[0]:.3g}, {ci[1]:.3g}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the runs (threads-N/ each)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--data", default="pairs")
    ap.add_argument("--threads", default="1,2", help="two thread counts, comma-separated")
    ap.add_argument("--quick", action="store_true", help="the smoke sizes (vitpos run --quick)")
    ap.add_argument("--config", type=Path, default=None, help="a run config (default: the layer sweep off)")
    ap.add_argument("--json", type=Path, default=None, help="write the table as JSON")
    args = ap.parse_args()
    threads = [t.strip() for t in args.threads.split(",") if t.strip()]
    if len(threads) != 2 or not all(t.isdigit() and int(t) >= 1 for t in threads) or threads[0] == threads[1]:
        sys.exit("error: --threads needs two different positive counts, e.g. --threads 1,2")
    args.out.mkdir(parents=True, exist_ok=True)
    config = args.config
    if config is None:
        config = args.out / "no-sweep.yaml"
        config.write_text("sae_layers:\n  enabled: false\n")
    seconds, results = {}, {}
    for n in threads:
        out = args.out / f"threads-{n}"
        seconds[n] = run_once(out, int(n), args, config)
        results[n] = json.loads((out / "results.json").read_text())
        print(f"threads {n}: {seconds[n]:.0f} s -> {out}", flush=True)
    a, b = threads
    rows = headlines(results, threads)
    print(f"\n| claim | model | headline | {a} thread(s) | {b} thread(s) | {a} inside {b}'s interval | "
          f"{b} inside {a}'s interval |\n|---|---|---|---|---|---|---|")
    for h in rows:
        print(f"| {h.claim} | {h.model} | {h.number} | {fmt(h.values[a], h.cis[a])} | {fmt(h.values[b], h.cis[b])} "
              f"| {h.inside(a, b)} | {h.inside(b, a)} |")
    both = [h for h in rows if h.inside(a, b) is not None]
    agree = sum(bool(h.inside(a, b) and h.inside(b, a)) for h in both)
    print(f"\n{agree} of {len(both)} headlines lie inside each other's intervals "
          f"(machine: {os.cpu_count()} CPUs; runs {', '.join(f'{n} thread(s) {seconds[n]:.0f} s' for n in threads)})")
    if args.json is not None:
        args.json.write_text(json.dumps({"threads": threads, "seconds": seconds, "quick": args.quick,
                                         "models": args.models, "data": args.data,
                                         "headlines": [asdict(h) | {"a_in_b": h.inside(a, b), "b_in_a": h.inside(b, a)}
                                                       for h in rows]}, indent=1))


if __name__ == "__main__":
    main()
