"""Streaming SAE training and held-out metrics.

Batches are consumed one at a time (never concatenated), so memory is bounded by one batch plus
the model. ``batches`` is either an iterable of token tensors ((B, D) or (B, N, D)) or a callable
returning a fresh iterator per epoch (the way to get several epochs from a generator).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypedDict, Unpack

import torch
from torch import Tensor

from vitpos.errors import VitposError
from vitpos.runtime import device as rdevice
from vitpos.runtime import dist as rdist
from vitpos.runtime.options import RunOptions
from vitpos.sae.checkpoint import StaleCheckpointError, load_train_state, save_train_state
from vitpos.sae.model import SAE, SAEConfig, StepOutput

Batches = Iterable[Tensor] | Callable[[], Iterable[Tensor]]


@dataclass
class TrainLog:
    """What happened during training; per-step lists are aligned with ``step``."""

    lr: float
    device: str
    steps: int = 0
    tokens: int = 0
    epochs_done: int = 0
    seconds: float = 0.0
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    fvu: list[float] = field(default_factory=list)
    l0: list[float] = field(default_factory=list)
    aux_loss: list[float] = field(default_factory=list)
    dead_frac: list[float] = field(default_factory=list)  # dead by the dead_steps rule
    eval: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tokens_per_s"] = self.tokens_per_s
        return d


def default_lr(d_sae: int) -> float:
    """2e-3 up to 768 latents, ∝ 1/√F above (2e-3·√(768/F): 7.1e-4 at 6144, 4.3e-4 at 16384).

    The 1/√F scaling is sparsify's; its constant (2e-4 at 16384 latents, i.e. 9.2e-4 at 768) is
    tuned for long LLM runs and under-trains the few-epoch runs on a few hundred thousand tokens
    done here. Measured on builtin:ape layer-2 resid_post tokens (benchmarks/bench_sae.py: 100k tokens,
    F = 768, k = 32, 384 steps of 1024 tokens, about 4 epochs, with the TopK encoder init
    ``vitpos.sae.model.ENC_INIT_SCALE``; held-out FVU / dead latents): 1e-3 -> 0.0118 / 5%,
    2e-3 -> 0.0065 / 11%, 4e-3 -> 0.0052 / 26%, 8e-3 -> 0.0065 / 56%. 2e-3 keeps most of the
    dictionary alive; the cap stops smaller dictionaries from climbing into the dead-latent regime."""
    return 2e-3 * min(1.0, math.sqrt(768 / d_sae))


def _tokens(batch: Any, d_in: int) -> Tensor:
    x = torch.as_tensor(batch)
    if x.ndim < 2 or x.shape[-1] != d_in:
        raise VitposError(f"SAE batches must be (B, {d_in}) or (B, N, {d_in}) tensors, got shape {tuple(x.shape)}")
    return x.reshape(-1, d_in)


def _pass_factory(batches: Batches) -> tuple[Callable[[], Iterator[Tensor]], bool]:
    """(fresh-iterator factory, whether passes can be repeated)."""
    if isinstance(batches, Tensor):
        return (lambda: iter([batches])), True
    if callable(batches):
        return (lambda: iter(batches())), True
    if isinstance(batches, Iterator):
        return (lambda: batches), False  # a generator: one pass only
    return (lambda: iter(batches)), True


def _progress(enabled: bool, total: int | None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("SAE"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("fvu {task.fields[fvu]:.4f}  L0 {task.fields[l0]:.1f}  dead {task.fields[dead]:.1%}"),
        TimeElapsedColumn(),
        disable=not enabled,
        transient=False,
    )


@dataclass(frozen=True)
class TrainSettings:
    """How `train_sae` trains (what it trains is the SAEConfig).

    steps: exactly this many optimiser steps, starting new passes as needed (None: `epochs` passes);
    epochs: passes over the batches; lr: Adam's (None: `default_lr(F)`); device: auto|cpu|cuda
    (None: the options' device, else auto); amp: none|bf16|fp16 autocast of the forward (None: the
    options'); checkpoint_dir / checkpoint_every: rank 0 saves the full training state there every so
    many steps and at the end, and a rerun resumes from it (None: the options'); distributed: DDP
    over an initialised process group's ranks (None: detect)."""

    steps: int | None = None
    epochs: int = 1
    lr: float | None = None
    device: str | torch.device | None = None
    amp: str | None = None
    checkpoint_dir: str | Path | None = None
    checkpoint_every: int | None = None
    distributed: bool | None = None


class TrainOverrides(TypedDict, total=False):
    """`TrainSettings` fields given to `train_sae` as keywords (they replace the settings' values)."""

    steps: int | None
    epochs: int
    lr: float | None
    device: str | torch.device | None
    amp: str | None
    checkpoint_dir: str | Path | None
    checkpoint_every: int | None
    distributed: bool | None


@dataclass(frozen=True)
class _Resolved:
    """TrainSettings with the options' values filled in and checked."""

    steps: int | None
    epochs: int
    lr: float
    dev: torch.device
    amp: str | None
    checkpoint_dir: str | Path | None
    checkpoint_every: int
    parallel: bool


def _resolve(s: TrainSettings, opts: RunOptions, cfg: SAEConfig, repeatable: bool) -> _Resolved:
    if s.epochs < 1:
        raise VitposError(f"epochs must be >= 1, got {s.epochs}")
    if s.steps is not None and s.steps < 1:
        raise VitposError(f"steps must be >= 1, got {s.steps}")
    if s.steps is None and s.epochs > 1 and not repeatable:
        raise VitposError("several epochs need re-iterable batches: pass a list or a function returning a fresh "
                          "iterator")
    dev = rdevice.resolve_device(s.device if s.device is not None else (opts.device or "auto"))
    amp = s.amp if s.amp is not None else opts.amp
    rdevice.autocast_dtype(amp, dev)  # validates amp for the device
    lr = default_lr(cfg.d_sae) if s.lr is None else float(s.lr)
    if not (lr > 0 and math.isfinite(lr)):
        raise VitposError(f"lr must be a positive number, got {lr}")
    return _Resolved(
        steps=s.steps, epochs=s.epochs, lr=lr, dev=dev, amp=amp,
        checkpoint_dir=s.checkpoint_dir if s.checkpoint_dir is not None else opts.checkpoint_dir,
        checkpoint_every=int(s.checkpoint_every if s.checkpoint_every is not None else opts.checkpoint_every or 0),
        parallel=bool(s.distributed or (s.distributed is None and rdist.current().enabled)))


def _resume(r: _Resolved, opts: RunOptions, sae: SAE, opt: torch.optim.Optimizer, since_fired: Tensor, log: TrainLog,
            run_key: dict, factory: Callable[[], Iterator[Tensor]], repeatable: bool) -> tuple[int, int]:
    """(pass index, batches consumed in it) to continue from: a checkpoint's in `r.checkpoint_dir`, else (0, 0)."""
    assert r.checkpoint_dir is not None
    try:
        pos = load_train_state(r.checkpoint_dir, sae, opt, since_fired, log, run=run_key)
    except StaleCheckpointError:
        if not opts.restart_on_mismatch:
            raise
        pos = None  # stale scratch of other settings (refused before anything was loaded): start over
        log.notes.append(f"ignored the checkpoint in {r.checkpoint_dir}: it was made with other settings")
    epoch0 = skip = 0
    if pos is not None:
        epoch0, skip = pos
        log.notes.append(f"resumed from {r.checkpoint_dir} at step {log.steps}")
        if repeatable:
            # Advance a per-epoch batch source (which may reseed its shuffle on every call, eagerly
            # or once iterated) past the passes already done: start each and take one batch.
            for _ in range(epoch0):
                next(iter(factory()), None)
    rdist.barrier()
    return epoch0, skip


OnStep = Callable[[int, dict[str, float]], bool | None]


def train_sae(batches: Batches, cfg: SAEConfig, settings: TrainSettings | None = None, *, progress: bool = True,
              eval_batches: Batches | None = None, on_step: OnStep | None = None, options: RunOptions | None = None,
              **overrides: Unpack[TrainOverrides]) -> tuple[SAE, TrainLog]:
    """Train an SAE on a stream of token activations, as `settings` (`TrainSettings`; keyword
    `overrides` of its fields, e.g. ``epochs=2, lr=3e-3``, replace its values) say.

    Runs ``epochs`` passes over ``batches``; if ``steps`` is given it instead runs exactly that
    many optimiser steps, starting new passes as needed (a one-shot generator that runs out
    stops training early, noted in the log). Adam at ``lr`` (default ``default_lr(F)``), the
    decoder kept unit-norm with the parallel gradient component projected out. Latents silent
    for ``cfg.dead_steps`` tokens are "dead" and get the AuxK loss (TopK/BatchTopK); for ReLU
    they are only reported. ``on_step(step, metrics)`` may return True to stop. With
    ``eval_batches`` the log's ``eval`` holds ``sae_metrics`` on them. Deterministic on CPU for
    a fixed ``cfg.seed`` and batch order.

    Scaling (docs/distributed.md): under an initialised process group with several ranks every rank
    must get the same global batches; each trains on its slice with DDP and the steps equal
    single-process steps on the global batches (``vitpos.sae.parallel``). A rerun with a
    ``checkpoint_dir`` resumes from its state (skipping the batches already consumed). ``options``
    (a CLI's :class:`~vitpos.runtime.options.RunOptions`) supplies what the settings leave None, plus
    the checkpoint's extra run identity and whether a checkpoint of other settings is skipped
    (``restart_on_mismatch``) instead of refused.
    """
    opts = options if options is not None else RunOptions()
    s = replace(settings if settings is not None else TrainSettings(), **overrides)
    factory, repeatable = _pass_factory(batches)
    r = _resolve(s, opts, cfg, repeatable)
    t = _Trainer(cfg, r, opts)
    start = (0, 0) if r.checkpoint_dir is None else _resume(r, opts, t.sae, t.opt, t.since_fired, t.log, t.run_key,
                                                            factory, repeatable)
    total = r.steps
    if total is None and hasattr(batches, "__len__") and not isinstance(batches, Tensor):
        total = len(batches) * r.epochs  # type: ignore[arg-type]
    t0 = time.perf_counter()
    with _progress(progress, total) as bar:
        end_pos = t.passes(factory, repeatable, start, bar, bar.add_task("train", total=total, fvu=float("nan"),
                                                                          l0=0.0, dead=0.0), on_step)
    if r.checkpoint_dir is not None:
        t.save_state(*end_pos)
    if r.dev.type == "cuda":
        torch.cuda.synchronize(r.dev)
    sae, log = t.sae, t.log
    log.seconds = time.perf_counter() - t0
    sae.eval()
    if eval_batches is not None:
        log.eval = sae_metrics(sae, eval_batches)
    if s.device is None and opts.device is not None and r.dev.type != "cpu":
        sae.cpu()  # an options (CLI --device) choice covers training only; callers' models live on the CPU
    return sae, log


class _Trainer:
    """One training run's state (the SAE, Adam, the log, steps since each latent fired, DDP) and its
    two units: `step` (one optimiser step on one batch) and `passes` (the epochs / steps loop)."""

    def __init__(self, cfg: SAEConfig, r: _Resolved, opts: RunOptions):
        self.cfg, self.r = cfg, r
        self.sae = sae = SAE(cfg).to(r.dev)
        sae.train()
        self.opt = torch.optim.Adam(sae.parameters(), lr=r.lr)
        self.log = TrainLog(lr=r.lr, device=str(r.dev))
        self.since_fired = torch.zeros(cfg.d_sae, dtype=torch.long, device=r.dev)
        self.par: Any = None
        if r.parallel:
            from vitpos.sae.parallel import ParallelStep

            self.par = ParallelStep(sae, r.dev)
        # Not the world size: a DDP step equals the single-process step, so a checkpoint resumes on any
        # number of ranks (equal up to float rounding).
        self.run_key = {"lr": r.lr, "steps": r.steps, "epochs": r.epochs,
                        **({"caller": opts.checkpoint_key} if opts.checkpoint_key else {})}
        self.piece = 1 << 62  # tokens per forward piece: the whole batch until a CUDA OOM halves it

    def save_state(self, pass_index: int, batch_in_pass: int) -> None:
        if self.r.checkpoint_dir is not None and rdist.is_main():
            save_train_state(self.r.checkpoint_dir, self.sae, self.opt, self.since_fired, self.log, epoch=pass_index,
                             batch_in_pass=batch_in_pass, run=self.run_key)

    def passes(self, factory: Callable[[], Iterator[Tensor]], repeatable: bool, start: tuple[int, int], bar: Any,
               task: Any, on_step: OnStep | None) -> tuple[int, int]:
        """Train from `start` (pass index, batches of it already consumed) until the epochs or steps
        are done, `on_step` says stop or the batches run out; returns where a rerun continues."""
        r, log, steps = self.r, self.log, self.r.steps
        epoch, skip = start
        end_pos = start
        bar.update(task, completed=log.steps)
        stop = steps is not None and log.steps >= steps
        while not stop:
            if steps is None and epoch >= r.epochs:
                break
            if epoch > 0 and not repeatable:
                log.notes.append(f"batches ran out after {log.steps} of {steps} steps (a one-shot iterator)")
                break
            n_seen = 0
            for batch in factory():
                n_seen += 1
                if skip:  # resume: these batches were consumed before the checkpoint
                    skip -= 1
                    continue
                m = self.step(batch)
                bar.update(task, advance=1, fvu=m["fvu"], l0=m["l0"], dead=m["dead_frac"])
                if r.checkpoint_every and log.steps % r.checkpoint_every == 0:
                    self.save_state(epoch, n_seen)
                if on_step is not None and on_step(log.steps, m):
                    stop = True
                if stop or (steps is not None and log.steps >= steps):
                    stop = True
                    break
            if n_seen == 0:
                if log.steps == 0:
                    raise VitposError("no training batches: the batch source yielded nothing")
                break
            epoch += 1
            log.epochs_done = epoch
            end_pos = (epoch - 1, n_seen) if stop else (epoch, 0)
        return end_pos

    def _amp(self):
        return rdevice.autocast(self.r.dev, self.r.amp)

    def _fwd_bwd(self, x: Tensor, dead: Tensor, size: int) -> StepOutput:
        sae, cfg = self.sae, self.cfg
        self.opt.zero_grad(set_to_none=True)
        with self._amp():
            if size >= x.shape[0]:
                out = sae.step(x, dead)
                out.loss.backward()
                return out
            from vitpos.sae.parallel import micro_step  # gradient accumulation equal to the whole batch

            return micro_step(sae, x, dead, -(-x.shape[0] // size), cfg.arch, cfg.aux_coeff, cfg.l1_coeff)

    def _note_shrink(self, old: int, new: int) -> None:
        self.log.notes.append(f"step {self.log.steps + 1}: out of memory at {old} tokens per forward, continuing with "
                              f"{new} (gradients accumulated: same step)")

    def step(self, batch: Any) -> dict[str, float]:
        """One optimiser step on one batch: forward / backward (DDP, or pieces after a CUDA OOM), the
        decoder projection and renorm, dead-latent bookkeeping, the log's per-step metrics."""
        sae, cfg, par, log, since_fired = self.sae, self.cfg, self.par, self.log, self.since_fired
        x = _tokens(batch, cfg.d_in).to(self.r.dev, torch.float32, non_blocking=True)
        if par is not None:
            x = par.local(x)
        if log.steps == 0:
            (par.initialize if par is not None else sae.initialize)(x)
        dead = since_fired >= cfg.dead_steps
        if par is not None:
            with self._amp():
                loss, info = par.run(x, dead, cfg.arch, cfg.aux_coeff, cfg.l1_coeff)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
        else:
            info, self.piece = rdevice.retry_on_oom(partial(self._fwd_bwd, x, dead), min(self.piece, x.shape[0]),
                                                    on_shrink=self._note_shrink)
        sae.project_decoder_grad_()
        self.opt.step()
        sae.normalize_decoder_()
        n_tok = int(info.n)  # global tokens of this step
        with torch.no_grad():
            since_fired += n_tok
            since_fired.masked_fill_(info.fired, 0)
            if cfg.arch == "batchtopk" and info.min_act is not None:
                _update_threshold(sae, info.min_act, log.steps)
        log.steps += 1
        log.tokens += n_tok
        m = {
            "loss": float(info.loss.detach()),
            "fvu": float(info.fvu.detach()),
            "l0": float(info.l0),
            "aux_loss": float(info.aux_loss.detach()),
            "dead_frac": float(dead.float().mean()),
        }
        log.step.append(log.steps)
        for key, v in m.items():
            getattr(log, key).append(v)
        if not all(math.isfinite(v) for v in m.values()):
            raise VitposError(f"SAE training diverged at step {log.steps} (loss {m['loss']}); lower lr")
        return m


@torch.no_grad()
def _update_threshold(sae: SAE, min_act: Tensor, step: int) -> None:
    """BatchTopK inference threshold: running mean of each batch's smallest selected activation,
    turning into an EMA (β = 0.999) once past 1000 steps so late, settled batches dominate."""
    w = max(1.0 / (step + 1), 1e-3)
    if float(sae.threshold) < 0:
        sae.threshold.copy_(min_act)
    else:
        sae.threshold.mul_(1 - w).add_(w * min_act)


@torch.no_grad()
def sae_metrics(sae: SAE, batches: Batches) -> dict[str, float]:
    """Held-out metrics in activation units, accumulated streaming in float64.

    fvu = Σ‖x − x̂‖² / Σ‖x − x̄‖² with x̄ the mean over all held-out tokens; l0 = mean number of
    nonzero latents per token; dead_frac = fraction of latents never nonzero on these tokens;
    mse = Σ‖x − x̂‖² / (tokens · D). Uses the inference encoder (``sae.encode``).
    """
    was_training = sae.training
    sae.eval()
    factory, _ = _pass_factory(batches)
    D, F = sae.d_in, sae.d_sae
    dev = sae.W_dec.device
    n = 0
    sse = torch.zeros((), dtype=torch.float64, device=dev)
    nnz = torch.zeros((), dtype=torch.float64, device=dev)
    fired = torch.zeros(F, dtype=torch.bool, device=dev)
    shift: Tensor | None = None
    sum_d = torch.zeros(D, dtype=torch.float64, device=dev)
    sum_d2 = torch.zeros((), dtype=torch.float64, device=dev)
    try:
        for batch in factory():
            x = _tokens(batch, D).to(dev, torch.float32)
            if x.shape[0] == 0:
                continue
            z = sae.encode(x)
            x_hat = sae.decode(z)
            xd = x.double()
            sse += (xd - x_hat.double()).pow(2).sum()
            nz = z != 0
            nnz += nz.sum()
            fired |= nz.any(0)
            if shift is None:
                # Shifting by the first batch mean avoids cancellation in Σ‖x‖² − n‖x̄‖².
                shift = xd.mean(0)
            d = xd - shift
            sum_d += d.sum(0)
            sum_d2 += d.pow(2).sum()
            n += x.shape[0]
    finally:
        sae.train(was_training)
    if n == 0:
        raise VitposError("no held-out tokens to evaluate the SAE on")
    total_var = float(sum_d2 - sum_d.pow(2).sum() / n)
    sse_f = float(sse)
    fvu = sse_f / total_var if total_var > 0 else float("nan")
    return {
        "fvu": fvu,
        "l0": float(nnz) / n,
        "dead_frac": 1.0 - float(fired.double().mean()),
        "mse": sse_f / (n * D),
        "tokens": n,
    }
