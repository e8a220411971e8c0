"""The linear probe (`LinearProbe`): multinomial logistic regression on standardised features, the
same objective as scikit-learn's LogisticRegression, fitted by `vitpos.analysis.lbfgs`. Its own
module so that the probe results (`vitpos.analysis.probe_results`), which hold fitted probes, and the
probe fitting (`vitpos.analysis.probes`), which returns those results, both sit above it."""

from __future__ import annotations

from typing import Any

import torch

from vitpos.analysis.lbfgs import all_finite, fit_softmax_heads, standardise_stats, standardised_design
from vitpos.errors import VitposError

EVAL_CHUNK_TOKENS = 65_536  # bounds the memory of one evaluation matmul


def folded(weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor, std: torch.Tensor):
    """Weights acting on raw features: ((x - m) / s) @ W + b == x @ (W / s) + (b - (m / s) @ W)."""
    w = weight / std[:, None]
    return w, bias - mean @ w


def check_features(features: Any, name: str = "features") -> torch.Tensor:
    if not isinstance(features, torch.Tensor):
        raise VitposError(f"{name} must be a torch.Tensor, got {type(features).__name__}")
    if not features.is_floating_point():
        raise VitposError(f"{name} must be a float tensor, got dtype {features.dtype}; cast with .float()")
    return features


class LinearProbe:
    """Multinomial logistic regression on standardised features; re-applicable across conditions.

    `position_labels` (optional, (num_patches,) int64) is the label of each patch position; with
    it, `fit` / `accuracy` take (num_images, num_patches, D) features and derive the labels.
    """

    def __init__(
        self,
        num_classes: int,
        l2: float = 1e-3,
        *,
        position_labels: torch.Tensor | None = None,
        max_iter: int = 200,
        tol: float = 1e-4,
    ):
        if int(num_classes) < 2:
            raise VitposError(f"a probe needs num_classes >= 2, got {num_classes}")
        if not (l2 >= 0.0):
            raise VitposError(f"l2 must be >= 0, got {l2}")
        self.num_classes = int(num_classes)
        self.l2 = float(l2)
        self.position_labels = None if position_labels is None else position_labels.detach().long().cpu()
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.weight: torch.Tensor | None = None  # (D, K), acts on standardised features
        self.bias: torch.Tensor | None = None  # (K,)
        self.mean: torch.Tensor | None = None  # (D,) training mean
        self.std: torch.Tensor | None = None  # (D,) training std

    # -- shapes --------------------------------------------------------------------------------

    def _tokens_and_labels(self, features: torch.Tensor, labels: torch.Tensor | None):
        features = check_features(features)
        if labels is None:
            if self.position_labels is None:
                raise VitposError("labels are required: this probe has no position_labels to derive them from")
            if features.ndim != 3 or features.shape[1] != self.position_labels.numel():
                raise VitposError(
                    f"features must be (num_images, {self.position_labels.numel()}, D) to derive position "
                    f"labels, got {tuple(features.shape)}"
                )
            labels = self.position_labels.to(features.device).expand(features.shape[0], -1)
        if tuple(labels.shape) != tuple(features.shape[:-1]):
            raise VitposError(
                f"labels shape {tuple(labels.shape)} must equal features shape without the last dim "
                f"{tuple(features.shape[:-1])}"
            )
        return features.reshape(-1, features.shape[-1]), labels.reshape(-1).long()

    def _require_fitted(self, d: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(weight, bias, mean, std) of a fitted probe; d, when given, must be the fitted width."""
        if self.weight is None or self.bias is None or self.mean is None or self.std is None:
            raise VitposError("this probe is not fitted; call fit() or build it with LinearProbe.from_state_dict()")
        if d is not None and d != self.weight.shape[0]:
            raise VitposError(f"features have D={d} but the probe was fitted on D={self.weight.shape[0]}")
        return self.weight, self.bias, self.mean, self.std

    # -- API -------------------------------------------------------------------------------------

    def fit(self, features: torch.Tensor, labels: torch.Tensor | None = None, *, device=None) -> LinearProbe:
        """Fit on (..., D) features with (...) labels (or position-derived labels, see class doc)."""
        x, y = self._tokens_and_labels(features, labels)
        if y.numel() == 0:
            raise VitposError("cannot fit a probe on zero tokens")
        if int(y.min()) < 0 or int(y.max()) >= self.num_classes:
            raise VitposError(f"labels must be in [0, {self.num_classes - 1}], got [{int(y.min())}, {int(y.max())}]")
        dev = torch.device(device) if device is not None else x.device
        x = x.to(dev, torch.float32)
        if not all_finite(x):
            raise VitposError("features contain NaN or inf; fix the activations before probing")
        mean, std = standardise_stats(x)
        xs = standardised_design(x, mean, std)
        ((w, b),) = fit_softmax_heads(
            xs, [y.to(dev)], [self.num_classes], [self.l2], max_iter=self.max_iter, tol=self.tol
        )
        self._set(w, b, mean, std)
        return self

    def _set(self, weight, bias, mean, std) -> None:
        self.weight, self.bias = weight.detach().cpu(), bias.detach().cpu()
        self.mean, self.std = mean.detach().cpu(), std.detach().cpu()

    @torch.no_grad()
    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """(..., K) logits for (..., D) features of any float dtype / device."""
        features = check_features(features)
        w, b = folded(*self._require_fitted(features.shape[-1]))
        w, b = w.to(features.device), b.to(features.device)
        x = features.reshape(-1, features.shape[-1])
        out = torch.cat(
            [torch.addmm(b, x[i : i + EVAL_CHUNK_TOKENS].float(), w) for i in range(0, x.shape[0], EVAL_CHUNK_TOKENS)]
        ) if x.shape[0] else x.new_zeros(0, self.num_classes, dtype=torch.float32)
        return out.reshape(*features.shape[:-1], self.num_classes)

    def direct_weight(self) -> torch.Tensor:
        """(D, K) weights acting on raw features without the offset: logits are linear in the
        features, so a component c of them (one head's output, say) moves the logits by
        c @ direct_weight(): its direct effect on the probe."""
        return folded(*self._require_fitted(None))[0]

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """(...) predicted labels for (..., D) features."""
        return self.logits(features).argmax(-1)

    def accuracy(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> float:
        """Fraction of tokens predicted correctly; labels derived from positions when omitted."""
        x, y = self._tokens_and_labels(features, labels)
        if y.numel() == 0:
            raise VitposError("cannot score a probe on zero tokens")
        return float((self.predict(x) == y.to(x.device)).float().mean())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """All tensors (safetensors-friendly): weight, bias, mean, std, l2, num_classes[, position_labels]."""
        weight, bias, mean, std = self._require_fitted(None)
        sd = {
            "weight": weight.clone(),
            "bias": bias.clone(),
            "mean": mean.clone(),
            "std": std.clone(),
            "l2": torch.tensor(self.l2, dtype=torch.float64),
            "num_classes": torch.tensor(self.num_classes, dtype=torch.int64),
        }
        if self.position_labels is not None:
            sd["position_labels"] = self.position_labels.clone()
        return sd

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor]) -> LinearProbe:
        missing = {"weight", "bias", "mean", "std", "l2", "num_classes"} - set(sd)
        if missing:
            raise VitposError(f"probe state dict lacks {sorted(missing)}; save it with LinearProbe.state_dict()")
        probe = cls(int(sd["num_classes"]), float(sd["l2"]), position_labels=sd.get("position_labels"))
        d, k = sd["weight"].shape
        if k != probe.num_classes or sd["bias"].shape != (k,) or sd["mean"].shape != (d,) or sd["std"].shape != (d,):
            raise VitposError("probe state dict has inconsistent shapes; re-save it with LinearProbe.state_dict()")
        probe._set(sd["weight"].float(), sd["bias"].float(), sd["mean"].float(), sd["std"].float())
        return probe
