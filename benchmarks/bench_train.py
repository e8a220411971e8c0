"""Benchmark: training images/s of each own ViT (--pe) vs a bare timm VisionTransformer of the same size.

Own models are built at the default OwnViTConfig size (32x32 input, patch 4, its width, depth,
heads and MLP ratio); the peer is `timm.create_model('vit_small_patch16_224', pretrained=False, ...)`
reshaped to the same size (a plain APE ViT, timm's fastest path). Both take the same training step
as `vitpos train` (AdamW with decay/no-decay groups, cross-entropy, grad-norm clip 1.0) on the same
shapes batches. Models are timed in interleaved rounds and the best round is kept (on a shared
machine, interference only ever slows a round down). By default the clock is the process CPU time
(`--clock cpu`; with one thread it equals wall time on an idle machine, and it does not count time
spent descheduled by other jobs); `--clock wall` uses wall time. Both are recorded. ratio = own
img/s / peer img/s (1.0 = as fast as bare timm).

    python benchmarks/bench_train.py [--steps 12] [--rounds 6] [--batch-size 128] [--threads 1] [--clock cpu|wall]
        [--out FILE.json]
"""

from __future__ import annotations

import argparse
import platform
import time

import timm
import torch
import torch.nn.functional as F

from vitpos.data import load_split
from vitpos.io import write_json
from vitpos.models.own import PE_CHOICES, OwnViTConfig, build_own_vit

PEER = "timm:vit_small_patch16_224"


def peer_model(cfg: OwnViTConfig) -> torch.nn.Module:
    return timm.create_model("vit_small_patch16_224", pretrained=False, img_size=cfg.img_size,
                             patch_size=cfg.patch_size, in_chans=cfg.in_chans, embed_dim=cfg.embed_dim,
                             depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio,
                             num_classes=cfg.num_classes)


def make_step(model: torch.nn.Module):
    """The training step of vitpos.train, as a closure over one model and its optimizer."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.05},
                             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=1e-3)
    model.train()

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return float(loss.detach())

    return step


def time_steps(step, batches: list, n: int) -> dict[str, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        step(*batches[i % len(batches)])
    return {"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12, help="timed steps per model (split over the rounds)")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved timing rounds; the best round is kept")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (the same for every model)")
    ap.add_argument("--pe", default=",".join(PE_CHOICES), help="comma list of --pe to time")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu", help="process CPU time or wall time")
    ap.add_argument("--out", default=None, help="write the results as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    per_round = max(1, args.steps // args.rounds)

    cfg0 = OwnViTConfig(pe="ape")
    ds = load_split("shapes", "train", seed=0, limit=4 * args.batch_size)
    batches = list(ds.batches(args.batch_size))

    names = [p.strip() for p in args.pe.split(",") if p.strip()]
    steps, n_params = {}, {}
    for name in ["peer", *names]:
        torch.manual_seed(0)
        model = peer_model(cfg0) if name == "peer" else build_own_vit(cfg0.model_copy(update={"pe": name}))
        n_params[name] = sum(p.numel() for p in model.parameters())
        steps[name] = make_step(model)
        time_steps(steps[name], batches, args.warmup)

    rates: dict[str, dict[str, list[float]]] = {n: {"cpu": [], "wall": []} for n in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            t = time_steps(step, batches, per_round)
            for clock in ("cpu", "wall"):
                rates[name][clock].append(per_round * args.batch_size / t[clock])
    ips = {n: max(r[args.clock]) for n, r in rates.items()}
    wall = {n: max(r["wall"]) for n, r in rates.items()}

    rows = [{"model": n if n == "peer" else f"own --pe {n}", "pe": None if n == "peer" else n,
             "images_per_s": ips[n], "ratio_vs_peer": ips[n] / ips["peer"], "params": n_params[n],
             "wall_images_per_s": wall[n], "wall_ratio_vs_peer": wall[n] / wall["peer"],
             "round_images_per_s": rates[n]} for n in ["peer", *names]]
    size = (f"{cfg0.img_size}x{cfg0.img_size}/p{cfg0.patch_size}, width {cfg0.embed_dim}, depth {cfg0.depth}, "
            f"{cfg0.num_heads} heads, mlp {cfg0.mlp_ratio:g}")
    print(f"training throughput, {size}; batch {args.batch_size}, threads {args.threads}, "
          f"{args.rounds} rounds x {per_round} steps (best round), {args.clock} clock")
    print(f"{'model':<22} {'params':>9} {'img/s':>9} {'ratio vs peer':>14} {'wall img/s':>11} {'wall ratio':>11}")
    for r in rows:
        print(f"{r['model']:<22} {r['params']:>9,} {r['images_per_s']:>9.1f} {r['ratio_vs_peer']:>14.3f} "
              f"{r['wall_images_per_s']:>11.1f} {r['wall_ratio_vs_peer']:>11.3f}")
    print(f"peer = {PEER} (pretrained=False) at the same size")

    if args.out:
        write_json(args.out, {
            "benchmark": "train", "peer": PEER, "config": cfg0.model_dump(exclude={"pe"}),
            "batch_size": args.batch_size,
            "threads": args.threads, "rounds": args.rounds, "steps_per_round": per_round, "warmup": args.warmup,
            "clock": args.clock, "rows": rows, "python": platform.python_version(), "torch": torch.__version__,
            "timm": timm.__version__,
        })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
