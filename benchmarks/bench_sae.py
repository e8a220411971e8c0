"""Benchmark: vitpos' TopK SAE trainer vs peers on the same activations.

    python benchmarks/bench_sae.py [--tokens N] [--d 128] [--expansion 8] [--k 32] [--out FILE.json]

Every trainer gets the same training tokens (same order, batch size, epochs), the same TopK
architecture, k, dictionary size and learning rate (``--saelens-lr`` gives SAELens its own: it
starts its decoder at norm 0.1 and never renormalises it, so the same lr is a ~10x larger relative
step there), and is scored with the same held-out FVU (Σ‖x − x̂‖² / Σ‖x − x̄‖² over tokens never
trained on). Peers:

* ``saelens``: SAELens' ``TopKTrainingSAE`` + ``SAETrainer`` (its defaults otherwise: AuxK,
  decoder-norm rescaling). It runs in a separate interpreter (``--saelens-python``, default
  ``/tmp/saelens-venv/bin/python``): SAELens pulls transformer-lens/transformers, which must
  never go into the project venv. Skipped, with the reason printed, when that interpreter or
  ``import sae_lens`` is missing.
* ``torch``: the textbook TopK loop written below (linear encoder/decoder, top-k + ReLU,
  MSE, Adam, decoder renorm, no AuxK).

Peers are fed activations pre-scaled to mean norm √D (what vitpos does internally), so the
learning rate means the same thing to all; FVU does not depend on that scale. Activations come
from ``vitpos.analysis.forward.capture_patch_tokens`` (builtin:ape, resid_post, layer 2, shapes) when it
works, otherwise from synthetic planted-sparse tokens of realistic size; the output says which.
Threads default to 1 and speed is compared on CPU seconds (wall time is reported too): on a
shared small machine wall time mostly measures waiting for a core.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

DEFAULT_SAELENS_PYTHON = "/tmp/saelens-venv/bin/python"


# --- data ------------------------------------------------------------------------------------


def synthetic_tokens(n: int, d: int, n_dirs: int, active: int, seed: int = 0) -> torch.Tensor:
    """Sparse non-negative (log-normal) combinations of `active` of `n_dirs` unit directions, plus a
    shared offset and small dense noise, scaled to mean norm √d. Built in chunks (bounded memory)."""
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(n_dirs, d, generator=g)
    dirs /= dirs.norm(dim=1, keepdim=True)
    # Zipf-like frequencies: a few common features, a long tail of rare ones (as in real models).
    freq = 1.0 / torch.arange(1, n_dirs + 1).float() ** 0.7
    offset = 0.5 * torch.randn(d, generator=g) / math.sqrt(d)
    out = torch.empty(n, d)
    for s in range(0, n, 8192):
        m = min(8192, n - s)
        idx = torch.multinomial(freq.expand(m, -1), active, replacement=False, generator=g)
        coef = torch.exp(0.5 * torch.randn(m, active, generator=g))
        out[s : s + m] = (coef.unsqueeze(-1) * dirs[idx]).sum(1) + 0.05 * torch.randn(m, d, generator=g) + offset
    return out * (math.sqrt(d) / out.norm(dim=1).mean())


def get_activations(args) -> tuple[torch.Tensor, str]:
    need = args.tokens + args.eval_tokens
    if args.source in ("auto", "model"):
        try:
            from vitpos.analysis.forward import capture_patch_tokens

            probe = capture_patch_tokens(spec=args.spec, site="resid_post", layer=2, data="shapes", split="train",
                                         n_images=1)
            n_images = math.ceil(need / probe.shape[1])
            acts = capture_patch_tokens(spec=args.spec, site="resid_post", layer=2, data="shapes", split="train",
                                        n_images=n_images)
            x = acts.reshape(-1, acts.shape[-1]).float()[:need]
            return x, (f"vitpos.analysis.forward {args.spec} resid_post layer 2, shapes/train, {n_images} images x "
                       f"{acts.shape[1]} patches")
        except Exception as e:  # any failure: fall back, and say why
            if args.source == "model":
                raise
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    else:
        why = "--source synthetic"
    x = synthetic_tokens(need, args.d, n_dirs=2 * args.expansion * args.d, active=args.k // 2)
    return x, (f"synthetic planted-sparse ({2 * args.expansion * args.d} dirs, {args.k // 2} active/token; model "
               f"capture unavailable: {why})")


def batches_of(x: torch.Tensor, b: int) -> list[torch.Tensor]:
    return [x[i : i + b] for i in range(0, len(x) - b + 1, b)]  # full batches only, same for all


@torch.no_grad()
def fvu_of(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    x, x_hat = x.double(), x_hat.double()
    return float((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())


# --- trainers --------------------------------------------------------------------------------


def run_vitpos(train, eval_x, args, lr) -> dict:
    from vitpos.sae import SAEConfig, sae_metrics, train_sae

    cfg = SAEConfig(arch="topk", d_in=train.shape[1], expansion=args.expansion, k=args.k, dead_steps=args.dead_tokens)
    c0 = time.process_time()
    sae, log = train_sae(batches_of(train, args.batch), cfg, epochs=args.epochs, lr=lr, device="cpu", progress=False)
    cpu = time.process_time() - c0
    m = sae_metrics(sae, batches_of(eval_x, 4096) or [eval_x])
    with torch.no_grad():
        check = fvu_of(eval_x, sae.decode(sae.encode(eval_x)))  # same scorer as the peers
    return {"trainer": "vitpos", "lr": lr, "seconds": log.seconds, "cpu_seconds": cpu, "tokens": log.tokens,
            "fvu": check, "l0": m["l0"],
            "dead_frac": m["dead_frac"], "fvu_sae_metrics": m["fvu"]}


def run_torch_peer(train, eval_x, args, lr) -> dict:
    """The textbook TopK SAE loop (dense codes, autograd everywhere, no AuxK)."""
    D, F, k = train.shape[1], args.expansion * train.shape[1], args.k
    g = torch.Generator().manual_seed(0)
    W_dec = torch.randn(F, D, generator=g)
    W_dec /= W_dec.norm(dim=1, keepdim=True)
    W_dec.requires_grad_()
    W_enc = W_dec.detach().T.clone().requires_grad_()
    b_enc = torch.zeros(F, requires_grad=True)
    batches = batches_of(train, args.batch)
    b_dec = batches[0].mean(0).clone().requires_grad_()
    opt = torch.optim.Adam([W_enc, b_enc, W_dec, b_dec], lr=lr)

    def forward(x):
        pre = (x - b_dec) @ W_enc + b_enc
        vals, idx = pre.topk(k, dim=1)
        z = torch.zeros_like(pre).scatter(1, idx, vals.relu())
        return z @ W_dec + b_dec, z

    t0, c0 = time.perf_counter(), time.process_time()
    tokens = 0
    for _ in range(args.epochs):
        for x in batches:
            x_hat, _ = forward(x)
            loss = (x_hat - x).pow(2).sum(1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                W_dec /= W_dec.norm(dim=1, keepdim=True)
            tokens += x.shape[0]
            float(loss.detach())  # log it, as every trainer here does
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    with torch.no_grad():
        x_hat, z = forward(eval_x)
    return {"trainer": "torch (textbook TopK)", "lr": lr, "seconds": seconds, "cpu_seconds": cpu, "tokens": tokens,
            "fvu": fvu_of(eval_x, x_hat),
            "l0": float((z != 0).sum(1).float().mean()), "dead_frac": float(((z != 0).sum(0) == 0).float().mean())}


def saelens_worker(data_file: str, params_file: str, out_file: str) -> None:
    """Runs inside the SAELens interpreter."""
    import logging
    import warnings

    from safetensors.torch import load_file

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    p = json.loads(Path(params_file).read_text())
    torch.set_num_threads(p["threads"])
    import sae_lens
    from sae_lens.config import LoggingConfig, SAETrainerConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer

    t = load_file(data_file)
    train, eval_x = t["train"], t["eval"]
    D = train.shape[1]
    cfg = TopKTrainingSAEConfig(d_in=D, d_sae=p["expansion"] * D, k=p["k"], dtype="float32", device="cpu",
                                use_sparse_activations=p["sparse"])
    sae = TopKTrainingSAE(cfg)
    batches = [train[i : i + p["batch"]] for i in range(0, len(train) - p["batch"] + 1, p["batch"])]
    n_steps = len(batches) * p["epochs"]

    def provider():
        for _ in range(p["epochs"]):
            yield from batches

    tcfg = SAETrainerConfig(total_training_samples=n_steps * p["batch"], train_batch_size_samples=p["batch"],
                            lr=p["lr"], lr_end=p["lr"] / 10,
                            device="cpu", dead_feature_window=max(1, p["dead_tokens"] // p["batch"]),
                            feature_sampling_window=max(1, n_steps), logger=LoggingConfig(log_to_wandb=False))
    trainer = SAETrainer(tcfg, sae, provider())
    t0, c0 = time.perf_counter(), time.process_time()
    sae = trainer.fit()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    with torch.no_grad():
        z = sae.encode(eval_x)
        z = z.to_dense() if z.is_sparse else z
        x_hat = sae.decode(z)
    res = {"trainer": f"saelens {sae_lens.__version__}" + (" (sparse acts)" if p["sparse"] else ""), "lr": p["lr"],
           "seconds": seconds,
           "cpu_seconds": cpu, "tokens": n_steps * p["batch"], "fvu": fvu_of(eval_x, x_hat),
           "l0": float((z != 0).sum(1).float().mean()),
           "dead_frac": float(((z != 0).sum(0) == 0).float().mean())}
    Path(out_file).write_text(json.dumps(res))


def run_saelens_peer(train, eval_x, args, lr, sparse: bool) -> dict:
    py = args.saelens_python
    if not Path(py).is_file():
        return {"trainer": "saelens",
                "skipped": f"no SAELens interpreter at {py} (make one: python3 -m venv, a .pth to "
                                                 "the project site-packages for torch, pip install sae-lens)"}
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        data, params, out = (os.path.join(tmp, n) for n in ("data.safetensors", "params.json", "out.json"))
        save_file({"train": train.contiguous(), "eval": eval_x.contiguous()}, data)
        Path(params).write_text(json.dumps({"expansion": args.expansion, "k": args.k, "batch": args.batch,
                                            "epochs": args.epochs,
                                            "lr": lr, "threads": args.threads, "dead_tokens": args.dead_tokens,
                                            "sparse": sparse}))
        proc = subprocess.run([py, __file__, "--_saelens-worker", data, params, out], capture_output=True, text=True)
        if proc.returncode != 0 or not Path(out).is_file():
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            errs = [ln for ln in lines if "Error" in ln.split(":")[0]] or lines[-1:] or ["no output"]
            return {"trainer": "saelens", "skipped": f"SAELens run failed: {errs[-1][:300]}"}
        return json.loads(Path(out).read_text())


# --- main ------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000, help="training tokens")
    ap.add_argument("--eval-tokens", type=int, default=20_000, help="held-out tokens")
    ap.add_argument("--d", type=int, default=128, help="width of synthetic activations (model activations keep theirs)")
    ap.add_argument("--expansion", type=int, default=8)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=None,
                    help="default: vitpos' default_lr(F) (2e-3 at F <= 768), used for every trainer")
    ap.add_argument("--saelens-lr", type=float, default=None,
                    help="SAELens' lr only (default: the same --lr); its own runner default is 3e-4: its decoder "
                         "starts at norm 0.1 and is not kept unit-norm, so one lr is not one step size for it and "
                         "the others")
    ap.add_argument("--dead-tokens", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per trainer, interleaved; best CPU / median wall time reported")
    ap.add_argument("--source", choices=["auto", "model", "synthetic"], default="auto")
    ap.add_argument("--spec", default="builtin:ape")
    ap.add_argument("--peers", default="saelens,torch", help="comma list of: saelens, saelens-sparse, torch")
    ap.add_argument("--saelens-python", default=os.environ.get("VITPOS_SAELENS_PYTHON", DEFAULT_SAELENS_PYTHON))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--_saelens-worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._saelens_worker:
        saelens_worker(*args._saelens_worker)
        return 0

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x, source = get_activations(args)
    train, eval_x = x[: args.tokens], x[args.tokens :]
    D = train.shape[1]
    F = args.expansion * D
    from vitpos.sae.train import default_lr

    lr = args.lr if args.lr is not None else default_lr(F)
    # Peers see what vitpos sees after its own input scaling (mean norm √D on the first batch).
    s = math.sqrt(D) / float(train[: args.batch].norm(dim=1).mean())
    print(f"activations: {source}")
    print(f"train {len(train)} x {D}, held-out {len(eval_x)}; TopK F={F} k={args.k} batch={args.batch} "
          f"epochs={args.epochs} lr={lr:.2e} threads={args.threads}", flush=True)

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in peers:
        if peer not in ("saelens", "saelens-sparse", "torch"):
            print(f"unknown peer {peer!r}; use saelens, saelens-sparse or torch", file=sys.stderr)
            return 2

    def run(name: str) -> dict:
        if name == "vitpos":
            return run_vitpos(train, eval_x, args, lr)
        if name == "torch":
            return run_torch_peer(train * s, eval_x * s, args, lr)
        return run_saelens_peer(train * s, eval_x * s, args, args.saelens_lr or lr, sparse=name == "saelens-sparse")

    # Interleaved repeats: load on a shared machine drifts, so no trainer gets all the quiet minutes.
    runs: dict[str, list[dict]] = {name: [] for name in ["vitpos", *peers]}
    for rep in range(args.repeat):
        for name in runs:
            if runs[name] and "skipped" in runs[name][-1]:
                continue
            r = run(name)
            runs[name].append(r)
            outcome = (f"{r['cpu_seconds']:.1f} CPU s, {r['seconds']:.1f} s wall, FVU {r['fvu']:.4f}" if "seconds" in r
                       else r["skipped"])
            print(f"  [{rep + 1}/{args.repeat}] {r['trainer']}: " + outcome, flush=True)
    results = []
    for rs in runs.values():
        if "skipped" in rs[-1]:
            results.append(rs[-1])
            continue
        # Best-of-N CPU time (the least disturbed run, as timeit does); median wall time.
        results.append(dict(rs[-1], seconds=sorted(r["seconds"] for r in rs)[len(rs) // 2],
                            cpu_seconds=min(r["cpu_seconds"] for r in rs),
                            all_seconds=[r["seconds"] for r in rs], all_cpu_seconds=[r["cpu_seconds"] for r in rs]))

    # Speed is judged on CPU seconds (one thread each): on a shared machine wall time mostly
    # measures waiting for a core. Wall numbers are reported too.
    ours = results[0]
    print(f"\n{'trainer':26s} {'lr':>7s} {'tok/CPU-s':>10s} {'tok/s wall':>10s} {'CPU s':>7s} {'wall s':>7s} "
          f"{'FVU':>7s} {'L0':>5s} {'dead':>6s} {'vitpos speed-up':>15s}")
    for r in results:
        if "skipped" in r:
            print(f"{r['trainer']:26s} skipped: {r['skipped']}")
            continue
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
        r["tokens_per_cpu_s"] = r["tokens"] / r["cpu_seconds"]
        if r is not ours:
            r["vitpos_speedup_cpu"] = r["cpu_seconds"] / ours["cpu_seconds"]  # >1: vitpos is faster
            r["vitpos_speedup_wall"] = r["seconds"] / ours["seconds"]
        speedup = f"{r['vitpos_speedup_cpu']:.2f}x ({r['vitpos_speedup_wall']:.2f}x wall)" if r is not ours else ""
        print(f"{r['trainer']:26s} {r['lr']:7.1e} {r['tokens_per_cpu_s']:10.0f} {r['tokens_per_s']:10.0f} "
              f"{r['cpu_seconds']:7.1f} {r['seconds']:7.1f} {r['fvu']:7.4f} {r['l0']:5.1f} {r['dead_frac']:6.1%} "
              f"{speedup:>15s}")
    verdicts = []
    for r in results[1:]:
        if "skipped" in r:
            continue
        same = abs(ours["fvu"] - r["fvu"]) <= 0.01
        better = ours["fvu"] < r["fvu"] - 0.01
        faster = ours["cpu_seconds"] < r["cpu_seconds"]
        fvu_word = "equal within 0.01" if same else (f"better by {r['fvu'] - ours['fvu']:.3f}" if better
                                                     else f"WORSE by {ours['fvu'] - r['fvu']:.3f}")
        verdicts.append(f"vs {r['trainer']}: {'faster' if faster else 'SLOWER'} ({r['vitpos_speedup_cpu']:.2f}x CPU "
                        f"time), held-out FVU {fvu_word}")
    # Equal-FVU comparison: the same vitpos setup (same lr) trained for the fewest epochs whose
    # held-out FVU is at least as good as the peer's final one, against the peer's CPU time.
    for r in results[1:]:
        if "skipped" in r or abs(r["fvu"] - ours["fvu"]) <= 0.01:  # already equal by the ±0.01 rule
            continue
        first = 1 if r["fvu"] > ours["fvu"] else args.epochs + 1
        for e in range(first, 4 * args.epochs + 1):
            q = run_vitpos(train, eval_x, argparse.Namespace(**{**vars(args), "epochs": e}), lr)
            print(f"  vitpos {e} epoch(s): {q['cpu_seconds']:.1f} CPU s, FVU {q['fvu']:.4f} (target {r['fvu']:.4f})",
                  flush=True)
            if q["fvu"] <= r["fvu"]:
                r["vitpos_at_equal_fvu"] = {"epochs": e, "fvu": q["fvu"], "cpu_seconds": q["cpu_seconds"],
                                            "seconds": q["seconds"], "speedup_cpu": r["cpu_seconds"] / q["cpu_seconds"]}
                verdicts.append(f"vs {r['trainer']} at equal FVU: vitpos reaches FVU {q['fvu']:.4f} <= {r['fvu']:.4f} "
                                f"after {e} epoch(s) in {q['cpu_seconds']:.1f} CPU s: "
                                f"{r['cpu_seconds'] / q['cpu_seconds']:.2f}x faster")
                break
        else:
            verdicts.append(f"vs {r['trainer']} at equal FVU: vitpos did not reach FVU {r['fvu']:.4f} within "
                            f"{4 * args.epochs} epochs")
    for v in verdicts:
        print(v)
    if args.out:
        settings = {k: v for k, v in vars(args).items() if k not in ("out", "_saelens_worker")}
        payload = {"source": source, "settings": settings, "lr": lr, "d_in": D, "d_sae": F, "torch": torch.__version__,
                   "results": results, "verdicts": verdicts}
        payload["settings"]["saelens_python"] = str(args.saelens_python)
        from vitpos.io import write_json

        write_json(args.out, payload)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
