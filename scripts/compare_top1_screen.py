"""Adaptive top-1 (`rope_heads.top1_screen_images`) against the exhaustive sweep on the shipped zoo.

For each seed-0 RoPE member: every head's rotations removed on the rope_heads stage's top-1 images
(the test split's first `--images`), every head on every image (exhaustive). The adaptive race is
then derived from those same per-image results, exactly as `head_drops` would run it (every head on
the screen's images, the rest only for the heads `in_the_race`), so both sides see identical numbers
where they overlap. Compared: the largest-drop head, and C5's outcome with each head in turn taken as
the primary rebuilding head (whatever the rebuild measurement picks, it is one of them), plus every
head's drop. The per-image results are written beside the weights digest to
tests/golden/top1_screen/<member>.npz, which tests/unit/test_top1_screen_zoo.py reads.

Usage: python scripts/compare_top1_screen.py [--images 2000] [--screens 250,500,1000]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from vitpos.data.resolve import dataset_for
from vitpos.experiments.common import sweep_batch
from vitpos.experiments.rope_heads_ablation import head_drops, screen_cut
from vitpos.models.spec import load_model
from vitpos.study.top1_screen import compare, largest

MEMBERS = ("pairs-rope-axial", "pairs-rope-mixed", "pairs-rope-mixed-ape")
GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "top1_screen"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--images", type=int, default=2000, help="top-1 images (the rope_heads stage's default)")
    ap.add_argument("--screens", default="250,500,1000")
    args = ap.parse_args()
    GOLDEN.mkdir(parents=True, exist_ok=True)
    report = {}
    for member in MEMBERS:
        surface = load_model(f"builtin:{member}")
        data = dataset_for(surface, "pairs", "test", limit=args.images)
        t0 = time.time()
        full = head_drops(surface, data)
        seconds = time.time() - t0
        np.savez_compressed(GOLDEN / f"{member}.npz", digest=surface.weights_digest(),
                            clean=np.packbits(full.clean.numpy()),
                            ablated=np.packbits(full.ablated.numpy(), axis=-1), shape=np.array(full.ablated.shape))
        batch = sweep_batch(surface)
        rows = [compare(full, screen_cut(args.images, batch, int(s))) for s in args.screens.split(",")]
        report[member] = {"exhaustive_seconds": round(seconds, 1), "largest": largest(full.drops()),
                          "base_top1": full.base_top1, "screens": rows}
        print(json.dumps({member: report[member]}, indent=1), flush=True)
    (GOLDEN / "comparison.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
