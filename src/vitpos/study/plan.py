"""`vitpos run --plan`: what the study will compute, per model and stage, before it runs.

Each experiment counts its own work from its settings (`Experiment.plan` -> StagePlan: image
forwards, block evaluations, probe fits, SAE tokens); stages already in OUT's cache count as
cached. The time is an estimate: the counts times a throughput measured on the spot on the model's
device (a few small batches: seconds per embedded image and per image-block, one small probe fit
for the fits' cost per token and head) and, for SAE training, a FLOP ratio to the measured block.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from vitpos.errors import VitposError
from vitpos.experiments.base import SplitSizes, StagePlan
from vitpos.models.surface import ModelSurface

TIMING_IMAGES = 8  # images per timed batch: seconds on a CPU even for a ViT-B/16 at 224 px


@dataclass(frozen=True)
class Throughput:
    """Measured costs on one device; `seconds(plan)` is the estimate for a stage."""

    device: str
    embed_s: float  # per image: patch embedding and the head
    block_s: float  # per image and block
    fit_work_s: float  # per training token and softmax head of a probe fit
    sae_token_s_per_latent: float  # per SAE training token and latent (FLOP ratio to the block)
    cpu_share: float = 1.0  # CPU time / (wall x threads) of the fastest block timing; 1 on GPU

    def seconds(self, plan: StagePlan) -> float:
        return (plan.forwards * self.embed_s + plan.blocks * self.block_s + plan.fit_work * self.fit_work_s
                + plan.sae_work * self.sae_token_s_per_latent)


def _block_flops_per_token(surface: ModelSurface) -> float:
    """Multiply-adds x 2 of one block per token: its linear layers plus q.k and attention.v."""
    linear = sum(m.in_features * m.out_features for m in surface.block(0).modules() if isinstance(m, nn.Linear))
    tokens = surface.num_prefix_tokens + surface.num_patches
    return 2.0 * linear + 4.0 * tokens * surface.width


MIN_TIMING_S = 0.3  # timed batches repeat until their total passes this: one 10-ms batch is a coin toss
MAX_REPEATS = 100
BUSY_SHARE = 0.6  # below this share of its threads' time, the timing is said to be taken on a busy CPU
# while every repeat so far was starved (share < BUSY_SHARE), keep timing up to this long for one that got
# the CPU: a burst of other work at the first model's timing once gave 44 image-blocks/s (others ~3,800)
# and a 12.1 h estimate for a ~30 min run
MAX_BUSY_TIMING_S = 3.0


@torch.no_grad()
def measure_throughput(surface: ModelSurface, images: int = TIMING_IMAGES, repeats: int = 3,
                       min_seconds: float = MIN_TIMING_S) -> Throughput:
    """Time batches of random images through the model (after a warm-up), at least `repeats` and
    until `min_seconds` have passed, and one probe fit at the sweeps' size; wall-clock seconds, the
    fastest repeat (as timeit does): with the mean of two, a burst of other work (load 9) once gave
    26 image-blocks/s for one zoo model and 1,933 for its twin, and a 51 h estimate for the default
    run. While every repeat was starved of CPU it goes on (up to MAX_BUSY_TIMING_S). On CPU the
    process time of that repeat is kept too: a share of its threads' time well under 1
    says the CPU was busy with other work, and the plan says so beside its estimate."""
    dev = surface.device
    g = torch.Generator().manual_seed(0)
    x = torch.randn(images, *surface.input_size, generator=g).to(dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    surface.forward_from(0, surface.embed_tokens(x[:2]))  # warm-up (kernels, caches)
    t_embed = t_blocks = float("inf")
    share, spent, n = 1.0, 0.0, 0
    while n < repeats or ((spent < min_seconds or (share < BUSY_SHARE and spent < MAX_BUSY_TIMING_S))
                          and n < MAX_REPEATS):
        sync()
        t0 = time.perf_counter()
        tokens = surface.embed_tokens(x)
        surface.head_from(tokens)  # the head's cost (on the embedding: same shapes)
        sync()
        t1, c1 = time.perf_counter(), time.process_time()
        surface.run_blocks(tokens, 0)
        sync()
        t2, c2 = time.perf_counter(), time.process_time()
        t_embed = min(t_embed, t1 - t0)
        if t2 - t1 < t_blocks:
            t_blocks = t2 - t1
            share = min(1.0, (c2 - c1) / ((t2 - t1) * torch.get_num_threads())) if dev.type == "cpu" else 1.0
        spent, n = spent + t2 - t0, n + 1
    block_s = t_blocks / (images * surface.depth)
    tokens_per_image = surface.num_prefix_tokens + surface.num_patches
    # SAE step per token and latent: encode + decode, forward and backward ~ 12 * width flops
    sae = 12.0 * surface.width / _block_flops_per_token(surface) * block_s / tokens_per_image
    return Throughput(str(dev), t_embed / images, block_s, measure_fit(surface), sae, cpu_share=share)


def measure_fit(surface: ModelSurface, seed: int = 0) -> float:
    """Seconds per training token and head of one sweep-sized probe fit (on CPU, as the sweeps fit)
    on synthetic features of the model's width and grid: a row and a column direction per position
    under unit noise, about as separable as a middle layer's patch tokens."""
    from vitpos.analysis.probes import fit_position_probes
    from vitpos.experiments.common import SWEEP_TRAIN_TOKENS

    H, W = surface.grid
    if min(H, W) < 2:
        return 0.0
    N, D = surface.num_patches, surface.width
    n = max(4, -(-SWEEP_TRAIN_TOKENS * 4 // (3 * N)))  # enough images for the sweeps' token cap
    g = torch.Generator().manual_seed(seed)
    rows, cols = torch.randn(H, D, generator=g), torch.randn(W, D, generator=g)
    pos = (rows[:, None, :] + cols[None, :, :]).reshape(N, D) * (2.0 / D**0.5)
    feats = pos + torch.randn(n, N, D, generator=g)
    t0 = time.perf_counter()
    res = fit_position_probes(feats, surface.grid, control=False, l2_grid=(1e-2, 1e-1),
                              max_train_tokens=SWEEP_TRAIN_TOKENS)
    return (time.perf_counter() - t0) / max(1, 6 * res.n_train_tokens)  # 2 x 2 heads on the path, 2 refit


def split_sizes(data: str) -> SplitSizes:
    """Sizes of the splits the study reads (train: SAE and head; val: head; test: the rest); None if unknown."""
    from vitpos.data import load_split

    if data in ("shapes", "digits"):
        from vitpos.data import digits, shapes

        sizes = (shapes if data == "shapes" else digits).SPLIT_SIZES
        return SplitSizes(train=sizes["train"], test=sizes["test"], val=sizes["val"])
    out = {}
    for split in ("train", "test", "val"):
        try:
            out[split] = len(load_split(data, split))
        except (VitposError, OSError):
            out[split] = None
    return SplitSizes(**out)


@dataclass
class PlannedStage:
    model: str
    data: str
    stage: str
    plan: StagePlan | None  # None: not applicable or not countable (see note)
    status: str  # "run" | "cached" | "n/a"
    note: str = ""
    seconds: float | None = None


@dataclass
class StudyPlan:
    stages: list[PlannedStage] = field(default_factory=list)
    throughput: dict[str, Throughput] = field(default_factory=dict)  # model key -> measured
    data_problems: dict[str, str] = field(default_factory=dict)  # model key -> why its data would be refused
    validation_cached: bool = False  # the planted-model validation table (not timed: seconds on a CPU)

    def to_run(self) -> list[PlannedStage]:
        return [s for s in self.stages if s.status == "run" and s.plan is not None]

    def total(self) -> StagePlan:
        out = StagePlan()
        for s in self.to_run():
            assert s.plan is not None
            out = out + StagePlan(s.plan.forwards, s.plan.blocks, s.plan.fits, s.plan.fit_work, s.plan.sae_tokens,
                                  s.plan.sae_work)
        return out

    def seconds(self) -> float | None:
        secs = [s.seconds for s in self.to_run()]
        return None if not secs or any(v is None for v in secs) else sum(v for v in secs if v is not None)

    def summary(self) -> str:
        t = self.total()
        models = len({s.model for s in self.stages})
        n_run, n_cached = len(self.to_run()), sum(s.status == "cached" for s in self.stages)
        if n_run == 0 and n_cached and not self.data_problems and self.validation_cached:
            return f"plan: {models} model(s), nothing to run: all {n_cached} stage(s) and the validation table cached"
        secs = self.seconds()
        rates = "; ".join(_rates(list(self.throughput.values())))
        est = "time not estimated" if secs is None else f"estimated {_duration(secs)}"
        est += f" ({rates})" if rates and secs is not None else ""
        busy = min((tp.cpu_share for tp in self.throughput.values()), default=1.0)
        if secs is not None and busy < BUSY_SHARE:
            est += (f"; timed on a busy CPU (this process got {busy:.0%} of its threads' time): the estimate "
                    "assumes that load, and an idle machine is faster")
        line = (f"plan: {models} model(s), {n_run} stage(s) to run, {n_cached} cached: {t.forwards:,} image-forwards, "
                f"{t.blocks:,} block evaluations, {t.fits:,} probe fits, {t.sae_tokens:,} SAE tokens; {est}")
        if not self.validation_cached:
            line += "; then the planted-model validation table (not in the estimate: 1-3 min on a 2-core CPU)"
        if self.data_problems:
            line += f"; {len(self.data_problems)} model(s) cannot read their data (see --plan)"
        return line


def _rates(measured: list[Throughput]) -> list[str]:
    """Measured image-blocks/s per device: one number, or the range over models."""
    out = []
    for dev in sorted({tp.device for tp in measured}):
        rates = sorted(1.0 / tp.block_s for tp in measured if tp.device == dev and tp.block_s > 0)
        if rates:
            span = f"{rates[0]:,.0f}" if len(rates) == 1 else f"{rates[0]:,.0f}-{rates[-1]:,.0f}"
            out.append(f"{span} image-blocks/s on {dev}")
    return out


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


Measure = Callable[[ModelSurface], Throughput]
