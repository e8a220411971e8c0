"""Benchmark: CPU milliseconds per TopK SAE optimiser step, vitpos vs sparsify, at fixed dead fractions.

    python benchmarks/bench_sae_step.py [--dead 0,0.2,0.4] [--steps 100] [--rounds 3] [--threads 1] \
        [--sparsify-python PY] [--out FILE.json]

``bench_sae.py`` compares whole training runs at equal held-out FVU; this one isolates the cost of
one step (forward, backward, decoder constraint, Adam) on the same (1024, 96) batches of synthetic
sparse tokens, F = 768, k = 32, one thread by default, so a change to the step shows up without the noise of
a learning curve. vitpos is timed with AuxK off and with AuxK on a fixed random set of dead latents
(``--dead`` fractions of F; what AuxK costs grows with them); sparsify's ``SparseCoder`` (no AuxK,
its default; ``SPARSIFY_DISABLE_TRITON=1``) runs in its own interpreter, as in ``bench_sae.py``.
Each figure is the median over ``--rounds`` rounds of ``--steps`` steps, after 5 warm-up steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

DEFAULT_SPARSIFY_PYTHON = "/tmp/sparsify-venv/bin/python"
D, F, N, K = 96, 768, 1024, 32


def batches(n: int) -> list[torch.Tensor]:
    """Sparse non-negative mixtures of 200 fixed directions plus noise: realistic TopK work."""
    g = torch.Generator().manual_seed(0)
    basis = torch.randn(200, D, generator=g)
    out = []
    for _ in range(n):
        c = torch.randn(N, 200, generator=g).relu() * (torch.rand(N, 200, generator=g) < 0.05)
        out.append(c @ basis + 0.1 * torch.randn(N, D, generator=g))
    return out


def time_steps(step, xs: list[torch.Tensor], steps: int, rounds: int) -> float:
    for x in xs[:5]:
        step(x)
    per_round = []
    for _ in range(rounds):
        t = time.process_time()
        for i in range(steps):
            step(xs[i % len(xs)])
        per_round.append(1000 * (time.process_time() - t) / steps)
    return statistics.median(per_round)


def vitpos_ms(dead_frac: float, aux_coeff: float, steps: int, rounds: int) -> float:
    from vitpos.sae import SAEConfig
    from vitpos.sae.model import SAE

    sae = SAE(SAEConfig(d_in=D, expansion=F // D, k=K, aux_coeff=aux_coeff))
    opt = torch.optim.Adam(sae.parameters(), lr=4e-3)
    xs = batches(20)
    sae.initialize(xs[0])
    dead = torch.zeros(F, dtype=torch.bool)
    dead[torch.randperm(F, generator=torch.Generator().manual_seed(1))[: round(dead_frac * F)]] = True

    def step(x):
        opt.zero_grad(set_to_none=True)
        sae.step(x, dead).loss.backward()
        sae.project_decoder_grad_()
        opt.step()
        sae.normalize_decoder_()

    return time_steps(step, xs, steps, rounds)


def sparsify_ms(steps: int, rounds: int) -> float:
    """Runs inside the sparsify interpreter: its Trainer.fit step for the FVU loss, no AuxK."""
    from sparsify import SparseCoder, SparseCoderConfig

    sae = SparseCoder(D, SparseCoderConfig(expansion_factor=F // D, k=K), "cpu", dtype=torch.float32)
    opt = torch.optim.Adam(sae.parameters(), lr=4e-3)
    xs = batches(20)
    sae.b_dec.data = xs[0].mean(0)

    def step(x):
        sae.set_decoder_norm_to_unit_norm()
        sae(x).fvu.backward()
        sae.remove_gradient_parallel_to_decoder_directions()
        opt.step()
        opt.zero_grad()

    return time_steps(step, xs, steps, rounds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dead", default="0,0.2,0.4", help="dead fractions of F for vitpos with AuxK")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    ap.add_argument("--sparsify-python", default=os.environ.get("VITPOS_SPARSIFY_PYTHON", DEFAULT_SPARSIFY_PYTHON))
    ap.add_argument("--_sparsify_worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args._sparsify_worker:
        print(json.dumps({"ms": sparsify_ms(args.steps, args.rounds)}))
        return 0
    try:
        fracs = [float(v) for v in args.dead.split(",") if v.strip()]
    except ValueError:
        fracs = []
    if not fracs or any(not 0 <= f < 1 for f in fracs):
        print(f"error: --dead must be comma-separated fractions in [0, 1), got {args.dead!r}", file=sys.stderr)
        return 2
    load0 = os.getloadavg()[0]
    print(f"ms per step (median of {args.rounds} x {args.steps} steps, {args.threads} thread(s); N={N} D={D} F={F} "
          f"k={K}); load average {load0:.2f}")
    vitpos_ms(0.5, 1 / 32, 20, 1)  # the process' first steps pay one-off set-up: not counted for any figure
    ms: dict[str, float | None] = {"vitpos_noaux": vitpos_ms(0.0, 0.0, args.steps, args.rounds)}
    print(f"  vitpos, no AuxK:             {ms['vitpos_noaux']:6.2f}")
    for f in fracs:
        key = f"vitpos_auxk_dead{f:g}"
        ms[key] = vitpos_ms(f, 1 / 32, args.steps, args.rounds)
        print(f"  vitpos, AuxK, {f:4.0%} dead:     {ms[key]:6.2f}")
    ms["sparsify"] = None
    rc = 0
    if not os.path.isfile(args.sparsify_python):
        print(f"  sparsify: skipped: no interpreter at {args.sparsify_python} (see bench_sae.py)")
    else:
        proc = subprocess.run([args.sparsify_python, __file__, "--_sparsify_worker", "--steps", str(args.steps),
                               "--rounds", str(args.rounds), "--threads", str(args.threads)], capture_output=True,
                              text=True, env=dict(os.environ, SPARSIFY_DISABLE_TRITON="1"))
        if proc.returncode != 0:
            err = proc.stderr.strip().splitlines()
            print(f"  sparsify: failed: {err[-1] if err else proc.returncode}")
            rc = 1
        else:
            ms["sparsify"] = json.loads(proc.stdout.strip().splitlines()[-1])["ms"]
            print(f"  sparsify (no AuxK, default): {ms['sparsify']:6.2f}")
    load1 = os.getloadavg()[0]
    print(f"load average at the end {load1:.2f}")
    if args.out:
        from vitpos.io import write_json

        write_json(args.out, {"ms_per_step": ms, "threads": args.threads, "steps": args.steps, "rounds": args.rounds,
                              "shape": {"N": N, "D": D, "F": F, "k": K}, "load_avg": [load0, load1],
                              "torch": torch.__version__})
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
