"""SAE steps split over ranks (DistributedDataParallel) or over pieces of a batch, equal to whole-batch steps.

``train_sae`` uses :class:`ParallelStep` when a process group with more than one rank is active.
Every rank sees the same stream of *global* batches and trains on its contiguous slice
(``torch.tensor_split(x, world)[rank]``). DDP all-reduces (averages) the gradients; to make the
averaged gradient equal the single-process gradient of the whole global batch:

* the batch FVU's denominator (total variance of the batch) is the *global* one, computed with two
  small all-reduces (sum -> mean, then squared deviations), and each rank's loss is rescaled from
  its local denominator to the global one, times the world size (DDP divides by it);
* the ReLU L1 term (a mean over tokens) is rescaled by local/global token counts likewise;
* the data-dependent init (input scale, geometric-median ``b_dec``) is computed on the all-gathered
  global first batch on every rank, then broadcast from rank 0 for certainty;
* "fired" masks are all-reduced, so the dead-latent counters and hence the AuxK masks are the same
  on every rank; BatchTopK's smallest selected activation is all-reduced with MIN.

TopK and ReLU steps then match single-process training up to float summation order. BatchTopK
selects its top k·n activations within each rank's slice (as other DDP SAE trainers do), which is
not the global selection: close, not equal. The decoder unit-norm projection runs after the
all-reduced gradients, on identical weights, so weights stay in sync without extra traffic.

``micro_step`` is the same idea within one process: a batch that does not fit in GPU memory runs
in pieces whose gradients accumulate to the whole batch's. Both add up each piece's (or rank's)
metrics the same way (``combine``), with every FVU scored against ``batch_total_variance``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from vitpos.errors import VitposError
from vitpos.sae.model import SAE, StepOutput, batch_total_variance


def _rescaled_loss(out: StepOutput, r_tv, r_n, arch: str, aux_coeff: float, l1_coeff: float) -> Tensor:
    """A piece's loss as its share of the whole batch's loss (FVU terms over the whole batch's
    total variance, means over the whole batch's tokens)."""
    if arch == "relu":
        return out.fvu * r_tv + l1_coeff * out.l1 * r_n
    return (out.fvu + aux_coeff * out.aux_loss) * r_tv


def _sums(out: StepOutput, tv: Tensor) -> Tensor:
    """(fvu·tv, aux_loss·tv, l0·n, l1·n) of a piece scored against its own total variance ``tv``,
    in float64: what adds up over the pieces (or ranks) of a batch."""
    return torch.stack([(out.fvu.detach() * tv).double(), (out.aux_loss.detach() * tv).double(),
                        (out.l0 * out.n).double(), (out.l1.detach() * out.n).double()])


def combine(sums: Tensor, total_variance: Tensor, n, fired: Tensor, min_act: Tensor | None, arch: str,
            aux_coeff: float, l1_coeff: float) -> StepOutput:
    """The whole batch's output from its pieces' (or ranks') added-up ``_sums``: FVU terms over the
    whole batch's ``total_variance``, means over its ``n`` tokens."""
    fvu = (sums[0] / total_variance.double()).float()
    aux_loss = (sums[1] / total_variance.double()).float()
    l0 = (sums[2] / n).float()
    l1 = (sums[3] / n).float()
    loss = fvu + (l1_coeff * l1 if arch == "relu" else aux_coeff * aux_loss)
    return StepOutput(loss=loss, fvu=fvu, aux_loss=aux_loss, l1=l1, l0=l0, fired=fired, min_act=min_act, n=int(n))


def micro_step(sae: SAE, x: Tensor, dead: Tensor, pieces: int, arch: str, aux_coeff: float,
               l1_coeff: float) -> StepOutput:
    """Forward + backward of the batch ``x`` in ``pieces`` contiguous pieces, accumulating into the
    parameters' ``.grad`` a gradient equal (up to rounding) to that of the whole batch at once, for
    TopK and ReLU (BatchTopK then selects per piece). What the trainer falls back to when a batch
    does not fit in GPU memory; returns the whole batch's output like ``SAE.step`` (without x_hat)."""
    with torch.no_grad():
        tv_g = batch_total_variance(x.to(sae.W_enc.dtype) * sae.scale)
    n = x.shape[0]
    sums = torch.zeros(4, dtype=torch.float64, device=x.device)
    fired = torch.zeros(sae.d_sae, dtype=torch.bool, device=x.device)
    mins = []
    for piece in torch.tensor_split(x, pieces):
        if piece.shape[0] == 0:
            continue
        with torch.no_grad():
            tv_p = batch_total_variance(piece.to(sae.W_enc.dtype) * sae.scale)
        out = sae.step(piece, dead, total_variance=tv_p)
        _rescaled_loss(out, tv_p / tv_g, piece.shape[0] / n, arch, aux_coeff, l1_coeff).backward()
        with torch.no_grad():
            sums += _sums(out, tv_p)
            fired |= out.fired
            if out.min_act is not None:
                mins.append(out.min_act.detach().reshape(1))
    return combine(sums, tv_g, n, fired, torch.cat(mins).min() if mins else None, arch, aux_coeff, l1_coeff)


class _Step(nn.Module):
    """What DDP wraps: one training forward of the SAE (sparse path, no dense codes)."""

    def __init__(self, sae: SAE):
        super().__init__()
        self.sae = sae

    def forward(self, x: Tensor, dead: Tensor, total_variance: Tensor) -> StepOutput:  # type: ignore[override]
        return self.sae.step(x, dead, total_variance=total_variance)


class ParallelStep:
    """DDP-wrapped training step of ``sae`` on this rank's slice of every global batch."""

    def __init__(self, sae: SAE, device: torch.device):
        if not (dist.is_available() and dist.is_initialized()):
            raise VitposError("ParallelStep needs an initialised process group (launch with torchrun)")
        self.sae = sae
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = device
        ids = [device.index] if device.type == "cuda" else None
        # DDP syncs buffers (scale, threshold) from rank 0 at every forward (they are equal anyway).
        self.ddp = nn.parallel.DistributedDataParallel(_Step(sae), device_ids=ids)

    # -- data
    def local(self, x: Tensor) -> Tensor:
        """This rank's contiguous slice of a global batch."""
        if x.shape[0] < self.world:
            raise VitposError(f"a batch of {x.shape[0]} tokens cannot be split over {self.world} ranks; "
                              "use batches of at least world-size tokens")
        return torch.tensor_split(x, self.world)[self.rank]

    def _gather(self, x: Tensor) -> Tensor:
        n = torch.tensor([x.shape[0]], device=x.device)
        sizes = [torch.zeros_like(n) for _ in range(self.world)]
        dist.all_gather(sizes, n)
        top = int(max(int(s) for s in sizes))
        pad = torch.zeros((top, x.shape[1]), dtype=x.dtype, device=x.device)
        pad[: x.shape[0]] = x
        parts = [torch.empty_like(pad) for _ in range(self.world)]
        dist.all_gather(parts, pad)
        return torch.cat([p[: int(s)] for p, s in zip(parts, sizes, strict=True)])

    @torch.no_grad()
    def initialize(self, x_local: Tensor) -> None:
        """Data-dependent init on the global first batch, identical on every rank."""
        self.sae.initialize(self._gather(x_local))
        for t in (self.sae.b_dec, self.sae.scale):
            dist.broadcast(t.data, src=0)

    # -- step
    @torch.no_grad()
    def _global_tv(self, xs: Tensor) -> tuple[Tensor, Tensor, float]:
        """(local total variance as the model computes it, global total variance, global n)."""
        tv_local = batch_total_variance(xs)
        s = torch.cat([xs.double().sum(0), xs.new_tensor([xs.shape[0]], dtype=torch.float64)])
        dist.all_reduce(s)
        n_g = float(s[-1])
        mean_g = (s[:-1] / n_g).to(xs.dtype)
        q = (xs - mean_g).double().pow(2).sum().reshape(1)
        dist.all_reduce(q)
        return tv_local, q.to(xs.dtype).clamp_min(1e-12)[0], n_g

    def run(self, x: Tensor, dead: Tensor, arch: str, aux_coeff: float, l1_coeff: float) -> tuple[Tensor, StepOutput]:
        """Forward through DDP on the local slice ``x``; returns (loss to backward, the global batch's output)."""
        xs = x.to(self.sae.W_enc.dtype) * self.sae.scale
        tv_l, tv_g, n_g = self._global_tv(xs)
        n_l = x.shape[0]
        out: StepOutput = self.ddp(x, dead, tv_l)
        loss = _rescaled_loss(out, (tv_l / tv_g) * self.world, (n_l / n_g) * self.world, arch, aux_coeff, l1_coeff)
        with torch.no_grad():
            sums = _sums(out, tv_l)
            dist.all_reduce(sums)
            fired = out.fired.to(torch.int32)
            dist.all_reduce(fired)
            min_act = None
            if arch == "batchtopk":
                m = out.min_act
                m = torch.tensor([float("inf")], device=x.device) if m is None else m.detach().reshape(1).float()
                dist.all_reduce(m, op=dist.ReduceOp.MIN)
                min_act = None if not torch.isfinite(m).all() else m[0]
            return loss, combine(sums, tv_g, n_g, fired > 0, min_act, arch, aux_coeff, l1_coeff)


__all__ = ["ParallelStep", "combine", "micro_step"]
