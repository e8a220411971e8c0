"""Benchmark: vitpos' TopK SAE trainer vs peers, CPU time to reach equal held-out FVU.

    python benchmarks/bench_sae.py [--tokens N] [--epochs 8] [--lrs 1e-3,2e-3,4e-3,8e-3] [--out FILE.json]

Every trainer gets the same training tokens (same order, batch size), the same TopK architecture,
k and dictionary size, and is scored by one function on the same held-out tokens (FVU =
Σ‖x − x̂‖² / Σ‖x − x̄‖²). Each trainer runs its own small lr sweep (``--lrs``; ``--saelens-lrs``
for SAELens, whose decoder starts at norm 0.1 and is not kept unit-norm, so its lr scale
differs) for ``--epochs`` passes, and its held-out FVU is recorded ``--evals-per-epoch`` times
per pass against the process CPU seconds spent training so far (the scoring itself is not
counted). The comparison is at equal FVU: a target FVU is fixed (1 + ``--tol`` times the worse
of the best FVUs reached, so both curves really pass it), and each trainer's CPU seconds to reach
it are interpolated (linear in log FVU) on the curve of its fastest lr. Dead latents (never
active on the held-out tokens) are reported at that point. Peers:

* ``sparsify``: EleutherAI sparsify's ``SparseCoder`` (``eai-sparsify``), driven the way its
  ``Trainer.fit`` drives it for ``loss_fn="fvu"`` (b_dec = first batch mean, decoder renormalised
  before each step, parallel gradient removed), with Adam at a constant lr (its trainer's
  1000-step warm-up is longer than these runs) and its default ``auxk_alpha = 0``. Runs in its
  own interpreter (``--sparsify-python``, default ``/tmp/sparsify-venv/bin/python``) with
  ``SPARSIFY_DISABLE_TRITON=1`` (the eager CPU decoder).
* ``saelens``: SAELens' ``TopKTrainingSAE`` + ``SAETrainer`` (its defaults otherwise: AuxK,
  decoder-norm rescaling), in its own interpreter (``--saelens-python``, default
  ``/tmp/saelens-venv/bin/python``).
* ``torch``: the textbook TopK loop written below (linear encoder/decoder, top-k + ReLU,
  MSE, Adam, decoder renorm, no AuxK).
* ``vitpos-noaux``: vitpos with ``aux_coeff=0`` (sparsify's default), to show what AuxK costs.
* ``sparsify-auxk``: sparsify with AuxK on as vitpos has it by default (``auxk_alpha`` = vitpos'
  ``aux_coeff`` 1/32, dead after ``--dead-tokens`` tokens, the dead mask kept as its ``Trainer``
  keeps it). Its AuxK trains only the decoder (its fused encoder drops the pre-activations'
  gradient); vitpos' trains the dead latents' encoder rows too, as Gao et al. do.

Besides the common target, the run prints like-for-like pairs: vitpos vs ``sparsify-auxk`` (both
with AuxK) and ``vitpos-noaux`` vs ``sparsify`` (both without), each at its own equal FVU.

A peer whose interpreter or package is missing is skipped with the reason printed. Peers are fed
activations pre-scaled to mean norm √D (what vitpos does internally), so an lr means the same step
to all; FVU does not depend on that scale. Activations come from
``vitpos.analysis.forward.capture_patch_tokens`` (builtin:ape, resid_post, layer 2, shapes) when it
works, otherwise from synthetic planted-sparse tokens of realistic size; the output says which.
Threads default to 1: on a shared small machine wall time mostly measures waiting for a core.
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
DEFAULT_SPARSIFY_PYTHON = "/tmp/sparsify-venv/bin/python"
AUX_COEFF = 1 / 32  # vitpos' default SAEConfig.aux_coeff, given to sparsify-auxk (checked in main)
PEERS = ("sparsify", "sparsify-auxk", "saelens", "torch", "vitpos-noaux")
# like-for-like pairs (ours, peer): the same loss, AuxK on or off in both
LIKE_FOR_LIKE = (("vitpos", "sparsify-auxk"), ("vitpos-noaux", "sparsify"))


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


# --- held-out curves -------------------------------------------------------------------------


class Recorder:
    """Held-out FVU every ``every`` steps against the CPU/wall seconds spent training so far.

    ``feed`` hands a trainer one pass of batches; a point is taken when the trainer asks for the
    next batch, i.e. after the previous optimiser step. The scoring's own time is not counted."""

    def __init__(self, eval_x: torch.Tensor, every: int, batch: int):
        self.eval_x, self.every, self.batch = eval_x, max(1, every), batch
        self.score = None  # set by the trainer: () -> (x_hat, active (N, F) bool)
        self.points: list[dict] = []
        self.handed = 0
        self.c0 = self.w0 = 0.0
        self.paused_cpu = self.paused_wall = 0.0

    def start(self) -> None:
        self.c0, self.w0 = time.process_time(), time.perf_counter()

    @torch.no_grad()
    def point(self) -> None:
        if self.points and self.points[-1]["steps"] == self.handed:
            return
        c, w = time.process_time(), time.perf_counter()
        x_hat, active = self.score()  # type: ignore[misc]
        self.points.append({"steps": self.handed, "tokens": self.handed * self.batch,
                            "cpu_seconds": c - self.c0 - self.paused_cpu, "seconds": w - self.w0 - self.paused_wall,
                            "fvu": fvu_of(self.eval_x, x_hat), "l0": float(active.sum(1).float().mean()),
                            "dead_frac": float((~active.any(0)).float().mean())})
        self.paused_cpu += time.process_time() - c
        self.paused_wall += time.perf_counter() - w

    def feed(self, batches: list[torch.Tensor]):
        for x in batches:
            if self.handed and self.handed % self.every == 0:
                self.point()
            self.handed += 1
            yield x


def reach(points: list[dict], target: float) -> dict | None:
    """CPU seconds at which a curve first reaches ``target`` FVU (linear in log FVU between the
    two points around it), with the dead fraction of the first point at or below it."""
    prev = None
    for p in points:
        if p["fvu"] <= target:
            cpu = p["cpu_seconds"]
            if prev is not None and prev["fvu"] > p["fvu"]:
                t = math.log(prev["fvu"] / target) / math.log(prev["fvu"] / p["fvu"])
                cpu = prev["cpu_seconds"] + t * (p["cpu_seconds"] - prev["cpu_seconds"])
            return {"cpu_seconds": cpu, "dead_frac": p["dead_frac"], "l0": p["l0"], "fvu_at_point": p["fvu"]}
        prev = p
    return None


def fastest(runs: list[dict], target: float) -> dict | None:
    """The run (lr) of one trainer that reaches ``target`` in the fewest CPU seconds."""
    best = None
    for r in runs:
        got = reach(r["points"], target)
        if got is not None and (best is None or got["cpu_seconds"] < best["cpu_seconds"]):
            best = dict(got, lr=r["lr"], trainer=r["trainer"])
    return best


def best_fvu(runs: list[dict]) -> float:
    return min(p["fvu"] for r in runs for p in r["points"])


# --- trainers --------------------------------------------------------------------------------


def run_vitpos(train, eval_x, args, lr, aux: bool = True) -> dict:
    from unittest import mock

    import vitpos.sae.train as vtrain
    from vitpos.sae import SAEConfig, train_sae

    cfg = SAEConfig(arch="topk", d_in=train.shape[1], expansion=args.expansion, k=args.k, dead_steps=args.dead_tokens,
                    **({} if aux else {"aux_coeff": 0.0}))
    batches = batches_of(train, args.batch)
    rec = Recorder(eval_x, len(batches) // args.evals_per_epoch, args.batch)
    made: list = []

    class Seen(vtrain.SAE):  # the model train_sae builds, so the recorder can score it mid-run
        def __init__(self, c):
            super().__init__(c)
            made.append(self)

    def score():
        z = made[0].encode(eval_x)
        return made[0].decode(z), z != 0

    rec.score = score
    rec.start()
    with mock.patch.object(vtrain, "SAE", Seen):
        train_sae(lambda: rec.feed(batches), cfg, epochs=args.epochs, lr=lr, device="cpu", progress=False)
    rec.point()
    return {"trainer": "vitpos" if aux else "vitpos, no AuxK", "lr": lr, "points": rec.points}


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

    def score():
        x_hat, z = forward(eval_x)
        return x_hat, z != 0

    rec = Recorder(eval_x, len(batches) // args.evals_per_epoch, args.batch)
    rec.score = score
    rec.start()
    for _ in range(args.epochs):
        for x in rec.feed(batches):
            x_hat, _ = forward(x)
            loss = (x_hat - x).pow(2).sum(1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                W_dec /= W_dec.norm(dim=1, keepdim=True)
            float(loss.detach())  # log it, as every trainer here does
    rec.point()
    return {"trainer": "torch (textbook TopK)", "lr": lr, "points": rec.points}


def sparsify_worker(p: dict, train, eval_x) -> dict:
    """Runs inside the sparsify interpreter: SparseCoder driven as sparsify's Trainer.fit does
    (with ``p["auxk"]``: its AuxK loss and dead mask, as its Trainer computes them)."""
    import importlib.metadata

    from sparsify import SparseCoder, SparseCoderConfig

    D = train.shape[1]
    torch.manual_seed(0)
    sae = SparseCoder(D, SparseCoderConfig(expansion_factor=p["expansion"], k=p["k"]), "cpu", dtype=torch.float32)
    opt = torch.optim.Adam(sae.parameters(), lr=p["lr"])
    batches = batches_of(train, p["batch"])
    since_fired = torch.zeros(sae.num_latents, dtype=torch.long)

    def score():
        out = sae(eval_x)
        active = torch.zeros(len(eval_x), sae.num_latents, dtype=torch.bool)
        active.scatter_(1, out.latent_indices, out.latent_acts > 0)
        return out.sae_out, active

    rec = Recorder(eval_x, len(batches) // p["evals_per_epoch"], p["batch"])
    rec.score = score
    rec.start()
    for _ in range(p["epochs"]):
        for x in rec.feed(batches):
            if rec.handed == 1:
                sae.b_dec.data = x.mean(0)
            sae.set_decoder_norm_to_unit_norm()
            if p["auxk"]:
                out = sae(x, dead_mask=since_fired > p["dead_tokens"])
                loss = out.fvu + p["aux_coeff"] * out.auxk_loss
            else:
                out = sae(x)
                loss = out.fvu
            loss.backward()
            sae.remove_gradient_parallel_to_decoder_directions()
            opt.step()
            opt.zero_grad()
            if p["auxk"]:
                did_fire = torch.zeros(sae.num_latents, dtype=torch.bool)
                did_fire[out.latent_indices.flatten()] = True
                since_fired += len(x)
                since_fired[did_fire] = 0
            float(loss.detach())
    rec.point()
    name = f"sparsify {importlib.metadata.version('eai-sparsify')}"
    return {"trainer": f"{name} + AuxK" if p["auxk"] else name, "lr": p["lr"], "points": rec.points}


def saelens_worker(p: dict, train, eval_x) -> dict:
    """Runs inside the SAELens interpreter."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import sae_lens
    from sae_lens.config import LoggingConfig, SAETrainerConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer

    D = train.shape[1]
    cfg = TopKTrainingSAEConfig(d_in=D, d_sae=p["expansion"] * D, k=p["k"], dtype="float32", device="cpu")
    sae = TopKTrainingSAE(cfg)
    batches = batches_of(train, p["batch"])
    n_steps = len(batches) * p["epochs"]
    rec = Recorder(eval_x, len(batches) // p["evals_per_epoch"], p["batch"])

    def score():
        z = sae.encode(eval_x)
        z = z.to_dense() if z.is_sparse else z
        return sae.decode(z), z != 0

    def provider():
        for _ in range(p["epochs"]):
            yield from rec.feed(batches)

    tcfg = SAETrainerConfig(total_training_samples=n_steps * p["batch"], train_batch_size_samples=p["batch"],
                            lr=p["lr"], lr_end=p["lr"] / 10, device="cpu",
                            dead_feature_window=max(1, p["dead_tokens"] // p["batch"]),
                            feature_sampling_window=max(1, n_steps), logger=LoggingConfig(log_to_wandb=False))
    trainer = SAETrainer(tcfg, sae, provider())
    rec.score = score
    rec.start()
    trainer.fit()
    rec.point()
    return {"trainer": f"saelens {sae_lens.__version__}", "lr": p["lr"], "points": rec.points}


def worker_main(kind: str, data_file: str, params_file: str, out_file: str) -> None:
    from safetensors.torch import load_file

    p = json.loads(Path(params_file).read_text())
    torch.set_num_threads(p["threads"])
    t = load_file(data_file)
    fn = sparsify_worker if kind.startswith("sparsify") else saelens_worker
    Path(out_file).write_text(json.dumps(fn(p, t["train"], t["eval"])))


PEER_PYTHON = {"sparsify": ("sparsify_python", "pip install eai-sparsify"),
               "sparsify-auxk": ("sparsify_python", "pip install eai-sparsify"),
               "saelens": ("saelens_python", "pip install sae-lens")}


def run_in_interpreter(kind: str, train, eval_x, args, lr) -> dict:
    attr, how = PEER_PYTHON[kind]
    py = getattr(args, attr)
    if not Path(py).is_file():
        return {"trainer": kind, "lr": lr,
                "skipped": f"no {kind} interpreter at {py} (make one: python3 -m venv, a .pth naming the project "
                           f"site-packages for torch, {how})"}
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        data, params, out = (os.path.join(tmp, n) for n in ("data.safetensors", "params.json", "out.json"))
        save_file({"train": train.contiguous(), "eval": eval_x.contiguous()}, data)
        Path(params).write_text(json.dumps({"expansion": args.expansion, "k": args.k, "batch": args.batch,
                                            "epochs": args.epochs, "evals_per_epoch": args.evals_per_epoch,
                                            "lr": lr, "threads": args.threads, "dead_tokens": args.dead_tokens,
                                            "auxk": kind == "sparsify-auxk", "aux_coeff": AUX_COEFF}))
        env = dict(os.environ, SPARSIFY_DISABLE_TRITON="1")
        proc = subprocess.run([py, __file__, "--_worker", kind, data, params, out], capture_output=True, text=True,
                              env=env)
        if proc.returncode != 0 or not Path(out).is_file():
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            errs = [ln for ln in lines if "Error" in ln.split(":")[0]] or lines[-1:] or ["no output"]
            return {"trainer": kind, "lr": lr, "skipped": f"{kind} run failed: {errs[-1][:300]}"}
        return json.loads(Path(out).read_text())


# --- main ------------------------------------------------------------------------------------


def floats(s: str) -> list[float]:
    return [float(v) for v in s.split(",") if v.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000, help="training tokens")
    ap.add_argument("--eval-tokens", type=int, default=20_000, help="held-out tokens")
    ap.add_argument("--d", type=int, default=128, help="width of synthetic activations (model activations keep theirs)")
    ap.add_argument("--expansion", type=int, default=8)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--evals-per-epoch", type=int, default=4, help="held-out FVU points per pass")
    ap.add_argument("--lrs", type=floats, default=floats("1e-3,2e-3,4e-3,8e-3"),
                    help="lr sweep of vitpos, sparsify and the torch loop")
    ap.add_argument("--saelens-lrs", type=floats, default=floats("5e-4,1e-3,2e-3,4e-3"),
                    help="SAELens' lr sweep (its decoder starts at norm 0.1 and is not renormalised)")
    ap.add_argument("--tol", type=float, default=0.05,
                    help="target FVU = (1 + tol) x the worse of the best FVUs reached")
    ap.add_argument("--dead-tokens", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--source", choices=["auto", "model", "synthetic"], default="auto")
    ap.add_argument("--spec", default="builtin:ape")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help="comma list of: sparsify, sparsify-auxk (with vitpos' AuxK settings), saelens, torch, "
                         "vitpos-noaux (vitpos with aux_coeff 0, as sparsify's default auxk_alpha 0)")
    ap.add_argument("--saelens-python", default=os.environ.get("VITPOS_SAELENS_PYTHON", DEFAULT_SAELENS_PYTHON))
    ap.add_argument("--sparsify-python", default=os.environ.get("VITPOS_SPARSIFY_PYTHON", DEFAULT_SPARSIFY_PYTHON))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--_worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker:
        worker_main(*args._worker)
        return 0

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in peers:
        if peer not in PEERS:
            print(f"error: unknown peer {peer!r}; use some of {', '.join(PEERS)}", file=sys.stderr)
            return 2
    from vitpos.sae import SAEConfig

    if SAEConfig(d_in=1, k=1).aux_coeff != AUX_COEFF:
        print("error: bench_sae's AUX_COEFF no longer equals vitpos' default aux_coeff; update it", file=sys.stderr)
        return 2
    x, source = get_activations(args)
    train, eval_x = x[: args.tokens], x[args.tokens :]
    D = train.shape[1]
    F = args.expansion * D
    # Peers see what vitpos sees after its own input scaling (mean norm √D on the first batch).
    s = math.sqrt(D) / float(train[: args.batch].norm(dim=1).mean())
    print(f"activations: {source}")
    print(f"train {len(train)} x {D}, held-out {len(eval_x)}; TopK F={F} k={args.k} batch={args.batch} "
          f"epochs={args.epochs} threads={args.threads}; lrs {args.lrs} (SAELens {args.saelens_lrs})", flush=True)

    def run(name: str, lr: float) -> dict:
        if name in ("vitpos", "vitpos-noaux"):
            return run_vitpos(train, eval_x, args, lr, aux=name == "vitpos")
        if name == "torch":
            return run_torch_peer(train * s, eval_x * s, args, lr)
        return run_in_interpreter(name, train * s, eval_x * s, args, lr)

    # Interleaved over lrs: load on a shared machine drifts, so no trainer gets all the quiet minutes.
    names = ["vitpos", *peers]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    skipped: dict[str, str] = {}
    n_lrs = max(len(args.lrs), len(args.saelens_lrs))
    for i in range(n_lrs):
        for name in names:
            lrs = args.saelens_lrs if name == "saelens" else args.lrs
            if name in skipped or i >= len(lrs):
                continue
            r = run(name, lrs[i])
            if "skipped" in r:
                skipped[name] = r["skipped"]
                print(f"  {name}: skipped: {r['skipped']}", flush=True)
                continue
            runs[name].append(r)
            last = r["points"][-1]
            print(f"  {r['trainer']} lr {r['lr']:.1e}: {last['cpu_seconds']:.1f} CPU s, {last['seconds']:.1f} s wall, "
                  f"final FVU {last['fvu']:.4f}, best {min(p['fvu'] for p in r['points']):.4f}, "
                  f"dead {last['dead_frac']:.1%}", flush=True)
    done = [n for n in names if runs[n]]
    if "vitpos" not in done:
        print("vitpos produced no run", file=sys.stderr)
        return 1
    bests = {n: best_fvu(runs[n]) for n in done}

    def row(name: str, target: float) -> dict:
        got = fastest(runs[name], target)
        return {"trainer": runs[name][0]["trainer"], "target_fvu": target, "best_fvu": bests[name],
                **(got or {"cpu_seconds": None})}

    # One common target every trainer reaches, then each peer against vitpos at the lowest FVU both reach.
    common = (1 + args.tol) * max(bests.values())
    table = [row(n, common) for n in done]
    ours = table[0]
    print(f"\nEqual held-out FVU {common:.4f} (= {1 + args.tol:g} x the worst trainer's best "
          f"{max(bests.values()):.4f}):")
    print(f"{'trainer':24s} {'best lr':>8s} {'CPU s':>7s} {'vitpos speed-up':>15s} {'dead':>6s} {'L0':>5s} "
          f"{'best FVU':>8s}")
    for r in table:
        up = r["cpu_seconds"] / ours["cpu_seconds"] if r is not ours else None
        r["vitpos_speedup_cpu"] = up
        print(f"{r['trainer']:24s} {r['lr']:8.1e} {r['cpu_seconds']:7.2f} {'' if up is None else f'{up:.2f}x':>15s} "
              f"{r['dead_frac']:6.1%} {r['l0']:5.1f} {r['best_fvu']:8.4f}")
    def pair(ours_name: str, n: str) -> dict:
        target = (1 + args.tol) * max(bests[ours_name], bests[n])
        a, b = row(ours_name, target), row(n, target)
        up = b["cpu_seconds"] / a["cpu_seconds"]
        print(f"{a['trainer']} vs {b['trainer']} at FVU {target:.4f}: {a['cpu_seconds']:.2f} CPU s (lr {a['lr']:.0e}, "
              f"dead {a['dead_frac']:.1%}) vs {b['cpu_seconds']:.2f} CPU s (lr {b['lr']:.0e}, dead "
              f"{b['dead_frac']:.1%}): vitpos {up:.2f}x {'faster' if up >= 1 else 'SLOWER'}")
        return {"ours": a["trainer"], "peer": b["trainer"], "target_fvu": target, "vitpos": a, "peer_run": b,
                "vitpos_speedup_cpu": up}

    print("\nvitpos (default: AuxK on) against each peer, at the lowest FVU both reach:")
    pairs = [pair("vitpos", n) for n in done[1:] if n != "vitpos-noaux"]
    print("\nlike for like (AuxK on in both, or off in both):")
    like = [pair(a, b) for a, b in LIKE_FOR_LIKE if a in done and b in done]
    for n, why in skipped.items():
        print(f"{n}: skipped: {why}")
    if args.out:
        settings = {k: v for k, v in vars(args).items() if k not in ("out", "_worker")}
        settings.update(saelens_python=str(args.saelens_python), sparsify_python=str(args.sparsify_python))
        payload = {"source": source, "settings": settings, "d_in": D, "d_sae": F, "torch": torch.__version__,
                   "load_avg": os.getloadavg(), "common_fvu": common, "table": table, "pairs": pairs,
                   "like_for_like": like,
                   "skipped": skipped, "runs": runs}
        from vitpos.io import write_json

        write_json(args.out, payload)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
