"""Benchmark: the latent browser's page size and the collection pass's memory at ~4 096 latents.

    python benchmarks/bench_browse.py [--expansion 43] [--images 1000] [--split test] [--no-page] [--out F.json]
    /usr/bin/time -v python benchmarks/bench_browse.py --images 15625 --split train --no-page   # 1 M tokens

An untrained SAE (``--arch`` topk, k = 32, or relu) of ``--expansion`` x 96 latents (43 x 96 = 4 128,
the nearest to 4 096 that builtin:ape's width allows) on builtin:ape's layer-1 patch tokens. An
untrained TopK SAE leaves most latents silent (about a quarter of the top-k slots filled); an
untrained ReLU SAE fires about half its latents on every token, so every top-k slot is filled and
the page is at its largest for that many latents. ``--no-page`` runs the collection pass alone
(`vitpos.browse.collect.collect`): with ``/usr/bin/time -v`` its maximum resident set is the
pass's peak memory; ``--baseline`` runs only the same forwards to the SAE's layer (no SAE, no
bookkeeping), for the difference. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--expansion", type=int, default=43)
    ap.add_argument("--arch", default="topk", help="relu: every latent fires, so every top-k slot is filled")
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--split", default="test")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--no-page", action="store_true")
    ap.add_argument("--baseline", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()

    from vitpos.data.resolve import dataset_for
    from vitpos.models import load_model
    from vitpos.models.surface import Site
    from vitpos.sae import SAE, SAEConfig

    surface = load_model("builtin:ape")
    dataset = dataset_for(surface, "shapes", args.split, limit=args.images)
    sae = SAE(SAEConfig(arch=args.arch, d_in=surface.width, expansion=args.expansion, k=32, seed=0)).eval()
    site = Site(1, "resid_post")
    res: dict = {"latents": sae.d_sae, "images": len(dataset), "tokens": len(dataset) * surface.num_patches,
                 "threads": torch.get_num_threads()}
    t0 = time.time()
    if args.baseline:  # the same forwards (to the SAE's layer, same batches) without the SAE or the bookkeeping
        from vitpos.browse.collect import _Reached, _site_tokens, batch_images
        from vitpos.hooks import capture

        got: dict = {}

        def sink(key, t):
            got["x"] = t
            raise _Reached

        with torch.no_grad(), capture(surface, [site], to_cpu=False, sink=sink):
            for x, _ in dataset.batches(batch_images(surface.num_patches, sae.d_sae)):
                _site_tokens(surface, x, got)
    elif args.no_page:
        from vitpos.browse.collect import collect

        col = collect(surface, sae, site, dataset, top_k=args.top_k)
        res["state_bytes"] = col.peak_state_bytes
        res["filled_slots"] = int((col.top_image >= 0).sum())
    else:
        from vitpos.browse import browse_sae

        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / "sae"
            sae.save(d)
            doc = {"model": surface.spec, "layer": 1, "site": "resid_post", "data": "shapes", "arch": "topk", "k": 32,
                   "tokens": len(dataset) * surface.num_patches, "run": {"weights": surface.weights_digest()}}
            (d / "sae.json").write_text(json.dumps(doc))
            info = browse_sae(surface, d, Path(tmp) / "page", images=args.images, top_k=args.top_k, doc=doc)
        res.update({k: info[k] for k in ("bytes", "thumbnails", "filled_slots", "state_bytes")})
    res["seconds"] = round(time.time() - t0, 1)
    line = json.dumps(res)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
