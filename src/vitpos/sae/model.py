"""Sparse autoencoders over ViT token activations: TopK (+AuxK), BatchTopK and ReLU/L1.

Conventions (shared with EleutherAI sparsify / SAELens):

* ``W_dec`` is (F, D): row f is the decoder direction d_f, kept unit-norm during training.
* ``W_enc`` is (F, D) in ``nn.Linear`` weight layout, so the encoder matrix is ``W_enc`` and the
  decoder matrix is ``W_dec.T``; the init "encoder = decoderᵀ" means ``W_enc ∝ W_dec``: equal for
  ReLU, scaled by ``ENC_INIT_SCALE`` for TopK/BatchTopK (see there).
* Inputs are multiplied by a stored scalar ``scale`` (mean token norm -> √D when ``normalize``),
  then ``b_dec`` is subtracted before encoding and added back after decoding. Codes ``z`` live in
  those normalised units; ``encode``/``decode``/``feature_contribution`` take and return
  activation units, so callers never see the scale.

The TopK/BatchTopK training path never forms the dense (N, F) code matrix on the backward pass:
only the selected k latents per token carry gradient, so the encoder and decoder gradients are
gathered/scattered with ``embedding_bag`` (O(N·k·D) instead of O(N·F·D)): `vitpos.sae.sparse`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as Fn
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from vitpos.errors import VitposError
from vitpos.io import write_safetensors
from vitpos.sae.sparse import Sparse, SparseDecode, SparseEncode, topk_flat, topk_rows

WEIGHTS_FILE = "sae.safetensors"
FORMAT = "vitpos.sae/1"
_TENSORS = ("W_enc", "b_enc", "W_dec", "b_dec", "scale", "threshold")

ENC_INIT_SCALE = 3**-0.5
"""TopK/BatchTopK initial encoder rows: ``W_enc = ENC_INIT_SCALE · W_dec`` (unit-norm decoder rows).

This is EleutherAI sparsify's init: its encoder is a default ``nn.Linear`` (uniform ±1/√D rows, of
norm ≈ 1/√3) and its decoder the unit-normalised copy. Top-k selection does not see the scale, but
Adam's steps are absolute, so a smaller encoder turns faster relative to its size; and at 1.0 the
first reconstructions overshoot (first-batch FVU above 1 at k/D = 1/3). Measured on builtin:ape
layer-2 tokens (benchmarks/bench_sae.py, F = 768, k = 32, lr 4e-3): held-out FVU after 1/2/4/8
epochs 0.0271/0.0146/0.0074/0.0036 at 1.0 and 0.0173/0.0098/0.0054/0.0030 at 1/√3, the curve of
sparsify itself (0.0186/0.0104/0.0053/0.0031); more latents go dead on the way (41 % vs 14 % after
8 epochs; sparsify 45 %). ReLU/L1 keeps 1.0: there the encoder scale trades against ``l1_coeff``."""


class SAEConfig(BaseModel):
    """Architecture and training-loss settings of one SAE (JSON-serialisable)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: Literal["topk", "batchtopk", "relu"] = "topk"
    d_in: int = Field(gt=0)
    expansion: int = Field(default=8, gt=0)
    k: int = Field(default=32, gt=0, description="active latents per token (topk) / mean per token (batchtopk)")
    l1_coeff: float = Field(default=1e-3, ge=0, description="relu only: weight of Σ_f z_f‖d_f‖ (mean over tokens)")
    aux_k: int | None = Field(default=None, gt=0, description="AuxK latents per token; None = d_in // 2")
    aux_coeff: float = Field(default=1 / 32, ge=0)
    dead_steps: int = Field(default=100_000, gt=0, description="tokens since a latent last fired before it counts dead")
    normalize: bool = True
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> SAEConfig:
        if self.arch != "relu" and self.k > self.d_sae:
            raise ValueError(f"k={self.k} exceeds the dictionary size {self.d_sae}")
        return self

    @property
    def d_sae(self) -> int:
        return self.expansion * self.d_in

    @property
    def aux_k_eff(self) -> int:
        return self.aux_k if self.aux_k is not None else max(1, self.d_in // 2)

    @classmethod
    def parse(cls, d: dict[str, Any]) -> SAEConfig:
        """Validate a dict (e.g. from sae.json or a CLI) into a config, as a one-line VitposError."""
        try:
            return cls.model_validate(d)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "config"
            raise VitposError(f"invalid SAE config: {where}: {first['msg']}; fix that field") from e


class StepOutput(NamedTuple):
    """One training forward of an SAE (:meth:`SAE.step`), or the whole batch's when it ran in pieces
    or over ranks (``vitpos.sae.parallel``). Losses are in normalised units."""

    loss: Tensor  # what training minimises: fvu + aux_coeff·aux_loss (TopK/BatchTopK) or fvu + l1_coeff·l1 (ReLU)
    fvu: Tensor  # Σ‖x̂ − x‖² / total variance of the batch
    aux_loss: Tensor  # AuxK loss (0 without dead latents or with aux_coeff 0)
    l1: Tensor  # ReLU: mean over tokens of Σ_f z_f‖d_f‖ (0 otherwise)
    l0: Tensor  # mean number of active latents per token
    fired: Tensor  # bool (F,): latents active in this batch
    min_act: Tensor | None  # smallest selected activation (BatchTopK's threshold estimate)
    n: int  # tokens in the batch
    x_hat: Tensor | None = None  # reconstruction (..., D) in activation units; None for an aggregate
    z: Tensor | None = None  # dense codes (..., F) when asked for (``dense_codes=True``)


def batch_total_variance(xs: Tensor) -> Tensor:
    """Σ‖x − x̄‖² over a batch of tokens ``xs`` (N, D) (x̄ its mean): the batch FVU's denominator,
    detached and clamped away from zero. The one definition; pass its value as ``SAE.step``'s
    ``total_variance`` to score a piece of a batch against a known denominator."""
    return (xs - xs.mean(0)).pow(2).sum().detach().clamp_min(1e-12)


def geometric_median(x: Tensor, iters: int = 30, tol: float = 1e-6) -> Tensor:
    """Weiszfeld iterations: robust centre of a batch (what sparsify initialises b_dec to)."""
    x = x.double()
    m = x.mean(0)
    for _ in range(iters):
        w = 1.0 / (x - m).norm(dim=1).clamp_min(1e-12)
        new = (w[:, None] * x).sum(0) / w.sum()
        done = (new - m).norm() <= tol * (m.norm() + 1e-12)
        m = new
        if done:
            break
    return m.float()


# ---------------------------------------------------------------------------------------------
class SAE(nn.Module):
    """A sparse autoencoder ``x ≈ decode(encode(x))`` with unit-norm decoder directions."""

    scale: Tensor  # buffers (register_buffer in __init__), declared for the type checker
    threshold: Tensor

    def __init__(self, cfg: SAEConfig):
        super().__init__()
        self.cfg = cfg
        F, D = cfg.d_sae, cfg.d_in
        gen = torch.Generator().manual_seed(cfg.seed)
        W = torch.randn(F, D, generator=gen)
        W = W / W.norm(dim=1, keepdim=True)
        self.W_dec = nn.Parameter(W)
        self.W_enc = nn.Parameter(W * (1.0 if cfg.arch == "relu" else ENC_INIT_SCALE))
        self.b_enc = nn.Parameter(torch.zeros(F))
        self.b_dec = nn.Parameter(torch.zeros(D))
        self.register_buffer("scale", torch.tensor(1.0))
        # BatchTopK inference threshold; negative = not estimated yet (fall back to batch top-k).
        self.register_buffer("threshold", torch.tensor(-1.0))

    # -- shape helpers ------------------------------------------------------------------------
    @property
    def d_in(self) -> int:
        return self.cfg.d_in

    @property
    def d_sae(self) -> int:
        return self.cfg.d_sae

    def _flat(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_in:
            raise VitposError(
                f"SAE expects activations with last dim {self.d_in}, got shape {tuple(x.shape)}; "
                "use the SAE trained on this site/layer"
            )
        return x.reshape(-1, self.d_in).to(device=self.W_enc.device, dtype=self.W_enc.dtype)

    # -- initialisation from data -------------------------------------------------------------
    @torch.no_grad()
    def initialize(self, x: Tensor) -> None:
        """Set the input scale and the tied bias from a first batch of tokens (activation units)."""
        x = self._flat(x)
        if self.cfg.normalize:
            mean_norm = float(x.norm(dim=1).mean())
            if not math.isfinite(mean_norm) or mean_norm <= 0:
                raise VitposError("the first training batch has zero or non-finite norm; check the activations")
            self.scale.fill_(math.sqrt(self.d_in) / mean_norm)
        self.b_dec.copy_(geometric_median(x * self.scale))

    # -- decoder constraint (sparsify / SAELens) ----------------------------------------------
    @torch.no_grad()
    def normalize_decoder_(self) -> None:
        self.W_dec.div_(self.W_dec.norm(dim=1, keepdim=True).clamp_min(torch.finfo(self.W_dec.dtype).eps))

    @torch.no_grad()
    def project_decoder_grad_(self) -> None:
        """Remove the gradient component parallel to each (unit) decoder direction."""
        g = self.W_dec.grad
        if g is not None:
            g.sub_((g * self.W_dec).sum(1, keepdim=True) * self.W_dec)

    # -- inference ----------------------------------------------------------------------------
    def _pre(self, x: Tensor) -> tuple[Tensor, Tensor]:
        xc = self._flat(x) * self.scale - self.b_dec
        return xc, Fn.linear(xc, self.W_enc, self.b_enc)

    def _activate(self, pre: Tensor) -> Tensor:
        arch = self.cfg.arch
        if arch == "relu":
            return pre.relu()
        if arch == "batchtopk" and float(self.threshold) >= 0:
            return pre * (pre > self.threshold)
        if arch == "batchtopk":
            flat = topk_flat(pre, self.cfg.k * pre.shape[0])
            vals = pre.reshape(-1).take(flat)
            return pre.new_zeros(pre.numel()).scatter(0, flat, vals.relu()).view_as(pre)
        vals, idx = topk_rows(pre, self.cfg.k)
        return pre.new_zeros(pre.shape).scatter(1, idx, vals.relu())

    def encode(self, x: Tensor) -> Tensor:
        """Activations (..., D) -> sparse codes (..., F) as a dense tensor (inference rule)."""
        lead = x.shape[:-1]
        _, pre = self._pre(x)
        return self._activate(pre).reshape(*lead, self.d_sae)

    def decode(self, z: Tensor) -> Tensor:
        """Codes (..., F) -> reconstruction (..., D) in activation units."""
        return (z @ self.W_dec + self.b_dec) / self.scale

    def feature_contribution(self, z: Tensor, ids) -> Tensor:
        """Σ_{f ∈ ids} z_f d_f in activation units (excludes b_dec), so that
        ``decode(z) == feature_contribution(z, all) + b_dec / scale`` and patching
        ``x - contrib(z_n, ids) + contrib(z_m, ids)`` moves only the span of those directions."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=z.device).reshape(-1)
        return (z.index_select(-1, ids) @ self.W_dec.index_select(0, ids)) / self.scale

    # -- training-capable forward -------------------------------------------------------------
    def forward(self, x: Tensor, dead_mask: Tensor | None = None) -> tuple[Tensor, Tensor, dict[str, Any]]:
        """x (..., D) -> (x_hat (..., D) activation units, z (..., F), aux_info).

        aux_info: ``loss`` (what training minimises), ``fvu`` (batch FVU, normalised units),
        ``aux_loss`` (AuxK, 0 without dead latents), ``l1``, ``l0``, ``fired`` (bool (F,):
        latents active in this batch), ``min_act`` (smallest selected activation; BatchTopK).
        In training mode BatchTopK selects the top k·N activations of the batch; in eval mode
        it uses the estimated threshold, like ``encode``.
        """
        out = self.step(x, dead_mask, dense_codes=True)
        info = {"fired": out.fired, "min_act": out.min_act, "l0": out.l0, "l1": out.l1, "fvu": out.fvu,
                "aux_loss": out.aux_loss, "loss": out.loss}
        return out.x_hat, out.z, info  # type: ignore[return-value]

    def step(self, x: Tensor, dead_mask: Tensor | None = None, *, dense_codes: bool = False,
             total_variance: Tensor | None = None) -> StepOutput:
        """One training-capable forward: x (..., D) -> :class:`StepOutput` (see :meth:`forward`).

        ``dense_codes=False`` (what the trainer uses) skips the dense (N, F) code matrix, which
        nothing on the sparse path needs (``z`` is then None). ``total_variance`` is the FVU and
        AuxK denominator (as sparsify's ``total_variance=``); None: this batch's own,
        ``batch_total_variance`` of the normalised tokens."""
        lead = x.shape[:-1]
        xs = self._flat(x) * self.scale
        xc = xs - self.b_dec
        n, F = xc.shape[0], self.d_sae
        info: dict[str, Any] = {}
        tv = batch_total_variance(xs) if total_variance is None else total_variance
        zero = xs.new_zeros(())
        sparse_path = self.cfg.arch == "topk" or (self.cfg.arch == "batchtopk" and self.training)

        if sparse_path:
            with torch.no_grad():
                pre = torch.addmm(self.b_enc, xc, self.W_enc.T)
                if self.cfg.arch == "topk":
                    sel, idx = topk_rows(pre, self.cfg.k)
                    sp = Sparse.from_topk(idx, F)
                    sel = sel.reshape(-1)
                else:
                    sp = Sparse.from_flat(topk_flat(pre, self.cfg.k * n), n, F)
                    sel = sp.take(pre)
            vals = SparseEncode.apply(xc, self.W_enc, self.b_enc, sp, sel).relu()
            xs_hat = SparseDecode.apply(vals, self.W_dec, sp) + self.b_dec
            z = sp.dense(vals) if dense_codes else None
            active = vals.detach() > 0
            # bincount and where instead of boolean indexing: same results, several times faster on CPU
            info["fired"] = torch.bincount(sp.cols, weights=active.to(torch.float32), minlength=F) > 0
            n_active = active.sum()
            info["min_act"] = torch.where(active, vals.detach(), torch.inf).min() if bool(n_active) else None
            info["l0"] = n_active / n
            info["l1"] = zero
        else:
            pre = Fn.linear(xc, self.W_enc, self.b_enc)
            z = self._activate(pre)
            xs_hat = z @ self.W_dec + self.b_dec
            nz = z.detach() != 0
            info["fired"] = nz.any(0)
            info["min_act"] = None
            info["l0"] = nz.sum() / n
            info["l1"] = (z * self.W_dec.norm(dim=1)).sum(1).mean()

        err = xs_hat - xs
        fvu = err.pow(2).sum() / tv
        aux = zero
        if dead_mask is not None and sparse_path and self.cfg.aux_coeff > 0 and bool(dead_mask.any()):
            aux = self._auxk_loss(pre, xc, err.detach(), dead_mask, tv)
        if self.cfg.arch == "relu":
            loss = fvu + self.cfg.l1_coeff * info["l1"]
        else:
            loss = fvu + self.cfg.aux_coeff * aux
        x_hat = (xs_hat / self.scale).reshape(*lead, self.d_in)
        return StepOutput(loss=loss, fvu=fvu, aux_loss=aux, l1=info["l1"], l0=info["l0"], fired=info["fired"],
                          min_act=info["min_act"], n=n, x_hat=x_hat, z=z.reshape(*lead, F) if z is not None else None)

    def _auxk_loss(self, pre: Tensor, xc: Tensor, err: Tensor, dead_mask: Tensor, tv: Tensor) -> Tensor:
        """AuxK (Gao et al. 2024): the top aux_k dead latents predict the residual x - x̂.

        Runs on the dead latents' own rows (``index_select`` carries the gradient back), so its
        backward costs O(N·dead·D) instead of a dense O(N·F·D) product over the whole dictionary."""
        dead = dead_mask.nonzero().squeeze(1)
        k_aux = min(self.cfg.aux_k_eff, dead.numel())
        with torch.no_grad():
            sel, j = topk_rows(pre.index_select(1, dead), k_aux)
            sp = Sparse.from_topk(j, dead.numel())
        W_enc, b_enc, W_dec = (p.index_select(0, dead) for p in (self.W_enc, self.b_enc, self.W_dec))
        vals = SparseEncode.apply(xc, W_enc, b_enc, sp, sel.reshape(-1)).relu()
        e_hat = SparseDecode.apply(vals, W_dec, sp)
        # Down-weight when fewer dead latents than aux_k exist, as sparsify does.
        weight = min(dead.numel() / self.cfg.aux_k_eff, 1.0)
        return weight * (e_hat + err).pow(2).sum() / tv  # err = x̂ - x, so target -err

    # -- persistence --------------------------------------------------------------------------
    def to_config_dict(self) -> dict[str, Any]:
        return self.cfg.model_dump()

    model_weights: str | None = None  # weights digest of the model whose activations it encodes (if known)

    def save(self, path: str | Path, model_weights: str | None = None) -> Path:
        """Write the weights (config in the metadata) to ``path/sae.safetensors`` (or ``path`` if it
        ends in .safetensors), atomically. Returns the file written. model_weights: the weights
        digest of the model it was trained on (ModelSurface.weights_digest()), kept in the file's
        metadata so that weights paired with another model are refused on load."""
        path = Path(path)
        file = path if path.suffix == ".safetensors" else path / WEIGHTS_FILE
        tensors = {name: getattr(self, name) for name in _TENSORS}
        meta = {"format": FORMAT, "config": json.dumps(self.to_config_dict())}
        owner = model_weights or self.model_weights
        if owner is not None:
            meta["weights"] = owner
        write_safetensors(file, tensors, metadata=meta)
        return file

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device | None = None) -> SAE:
        """Load a saved SAE from its folder or its .safetensors file."""
        path = Path(path)
        file = path / WEIGHTS_FILE if path.is_dir() else path
        if not file.is_file():
            raise VitposError(f"no SAE weights at {file}; train one first or pass the folder holding {WEIGHTS_FILE}")
        try:
            with safe_open(str(file), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise VitposError(f"{file} is not a readable SAE file ({e}); re-train or re-copy it") from e
        if meta.get("format") != FORMAT or "config" not in meta:
            raise VitposError(f"{file} is not a vitpos SAE (format {meta.get('format')!r}); point at an SAE saved by "
                              "vitpos")
        try:
            cfg_dict = json.loads(meta["config"])
        except json.JSONDecodeError as e:
            raise VitposError(f"{file} has a corrupt config in its metadata; re-train or re-copy it") from e
        if not isinstance(cfg_dict, dict):
            raise VitposError(f"{file} has a corrupt config in its metadata; re-train or re-copy it")
        sae = cls(SAEConfig.parse(cfg_dict))
        sae.model_weights = meta.get("weights")
        expected = {name: getattr(sae, name).shape for name in _TENSORS}
        for name, shape in expected.items():
            t = tensors.get(name)
            if t is None or t.shape != shape:
                got = None if t is None else tuple(t.shape)
                raise VitposError(f"{file}: tensor {name} is {got}, expected {tuple(shape)}; the file is corrupt, "
                                  "re-train it")
            if not t.is_floating_point() or not bool(torch.isfinite(t).all()):
                raise VitposError(f"{file}: tensor {name} is {t.dtype} or holds NaN / infinite values; the file is "
                                  "corrupt, re-train it")
        with torch.no_grad():
            for name in _TENSORS:
                getattr(sae, name).copy_(tensors[name])
        return sae.to(device) if device is not None else sae
