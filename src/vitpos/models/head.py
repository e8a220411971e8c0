"""A linear classifier on a model's pooled pre-logit features: what a headless backbone is scored with.

Real pretrained backbones (DINOv2/v3, EVA-02, CLIP towers) mostly ship without a classifier: their
output is the pooled feature vector, not class logits. `vitpos head` fits a softmax classifier on
those pooled features (``ModelSurface.pooled_features``: timm's ``forward_head(..., pre_logits=True)``,
so CLS, average or whatever the model pools) and writes it as

  DIR/head.safetensors  weight (K, D), bias (K,): logits = pooled @ weight.T + bias, acting on the
                        raw pooled features (the fit's standardisation folded in)
  DIR/head.json         HeadInfo: the model spec and weights digest, the data and its classes, the
                        feature site, the chosen l2, val / test top-1, image counts

``surface.with_head(head)`` returns a surface whose outputs are ``head(pooled)``, so every top-1 a
study or a command measures goes through the head. A head is refused on another model's weights or
on data with other classes (`check_head`).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from vitpos.errors import VitposError
from vitpos.io import (
    check_finite,
    load_typed,
    read_safetensors,
    read_safetensors_metadata,
    write_json,
    write_safetensors,
)

if TYPE_CHECKING:
    from vitpos.data.base import DatasetInfo

HEAD_FORMAT = "vitpos-head"
HEAD_JSON = "head.json"
HEAD_WEIGHTS = "head.safetensors"
FEATURE_SITE = "pre_logits"


class HeadTarget(Protocol):
    """What `check_head` reads of a model (a `ModelSurface` is one; the surface imports this module,
    so naming the protocol here keeps the import one-way)."""

    spec: str

    def weights_digest(self) -> str: ...


class HeadInfo(BaseModel):
    """head.json: which model and data the head belongs to, and how well it does."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    format: Literal["vitpos-head"] = HEAD_FORMAT
    version: int = 1
    model: str  # the model spec it was fitted on
    weights: str  # ModelSurface.weights_digest() of that model
    data: str
    classes: list[str] = Field(min_length=1)
    num_classes: int = Field(ge=1)
    width: int = Field(ge=1)  # pooled feature size D
    feature_site: Literal["pre_logits"] = FEATURE_SITE
    l2: float = Field(ge=0)
    l2_grid: list[float]
    val_top1_by_l2: list[float]
    val_top1: float = Field(ge=0, le=1)
    test_top1: float = Field(ge=0, le=1)
    n_train_images: int = Field(ge=0, le=10**12)
    n_val_images: int = Field(ge=0, le=10**12)
    n_test_images: int = Field(ge=0, le=10**12)
    seed: int = Field(ge=0)

    @model_validator(mode="after")
    def _classes_match(self) -> HeadInfo:
        if len(self.classes) != self.num_classes:
            raise ValueError(f"num_classes is {self.num_classes} but classes names {len(self.classes)}")
        return self


class Head:
    """logits = pooled @ weight.T + bias on raw pooled features (B, D) -> (B, K)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, info: HeadInfo):
        if weight.ndim != 2 or bias.shape != (weight.shape[0],):
            raise VitposError(f"a head needs weight (K, D) and bias (K,), got {tuple(weight.shape)} and "
                              f"{tuple(bias.shape)}")
        if weight.shape != (info.num_classes, info.width):
            raise VitposError(f"head weight {tuple(weight.shape)} does not match its head.json ({info.num_classes} "
                              f"classes x width {info.width}); refit it with `vitpos head`")
        self.weight = weight.detach().float().cpu()
        self.bias = bias.detach().float().cpu()
        self.info = info

    @property
    def num_classes(self) -> int:
        return self.info.num_classes

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        w, b = self.weight.to(pooled.device), self.bias.to(pooled.device)
        return torch.addmm(b, pooled.float(), w.T)

    def digest(self) -> str:
        """sha256 (16 hex) of the head's weights and info: keys study stages measured through it."""
        import hashlib

        h = hashlib.sha256(self.info.model_dump_json().encode())
        for t in (self.weight, self.bias):
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]

    def save(self, out: str | Path) -> None:
        out = Path(out)
        write_safetensors(out / HEAD_WEIGHTS, {"weight": self.weight, "bias": self.bias},
                          metadata={"format": HEAD_FORMAT, "weights": self.info.weights})
        write_json(out / HEAD_JSON, self.info.model_dump(mode="json"))

    @classmethod
    def load(cls, path: str | Path) -> Head:
        path = Path(path)
        if not (path / HEAD_JSON).is_file() or not (path / HEAD_WEIGHTS).is_file():
            raise VitposError(f"{path} holds no head ({HEAD_JSON} + {HEAD_WEIGHTS}); fit one with "
                              f"`vitpos head --model SPEC --data DATA --out {path}`")
        refit = "refit it with `vitpos head`"
        info = load_typed(HeadInfo, path / HEAD_JSON, f"it is not a vitpos head; {refit}")
        file = path / HEAD_WEIGHTS
        state = read_safetensors(file, refit)
        if set(state) != {"weight", "bias"}:
            raise VitposError(f"{file} holds {sorted(state)}, not weight and bias; {refit}")
        for name, t in state.items():
            if not t.is_floating_point():
                raise VitposError(f"{file}: tensor {name!r} is {t.dtype}, not floating point; {refit}")
        # the weights file names the model it belongs to: a head.safetensors copied beside another
        # model's head.json is refused (files written before the digest was recorded carry none)
        owner = read_safetensors_metadata(file, refit).get("weights")
        if owner is not None and owner != info.weights:
            raise VitposError(f"{file} was fitted on weights digest {owner}, but {HEAD_JSON} beside it says "
                              f"{info.weights}: the two files belong to different heads; {refit}")
        check_finite(state, file, f"the head is broken; {refit}")
        return cls(state["weight"], state["bias"], info)


def check_head(head: Head, surface: HeadTarget, info: DatasetInfo | None = None, data: str | None = None) -> None:
    """One-line VitposError unless `head` was fitted on this model's weights (and on `data`'s classes)."""
    hi = head.info
    spec, on = shlex.quote(surface.spec), shlex.quote(data or hi.data)
    refit = f"fit one with `vitpos head --model {spec} --data {on} --out DIR`"
    if hi.weights != surface.weights_digest():
        raise VitposError(f"the head was fitted on {hi.model} (weights digest {hi.weights}), not on {surface.spec} "
                          f"(weights digest {surface.weights_digest()}); {refit}")
    if info is not None and tuple(hi.classes) != tuple(info.class_names):
        what = f"{len(info.class_names)} classes" if len(info.class_names) != hi.num_classes else "other classes"
        raise VitposError(f"the head was fitted on {hi.data} ({hi.num_classes} classes: {', '.join(hi.classes[:4])}"
                          f"{', ...' if hi.num_classes > 4 else ''}) but {data or info.name} has {what} "
                          f"({', '.join(info.class_names[:4])}{', ...' if len(info.class_names) > 4 else ''}); {refit}")
    if data is not None and info is not None and data != hi.data and not data.startswith("imagefolder:"):
        raise VitposError(f"the head was fitted on data {hi.data!r}, not {data!r}; {refit}")


__all__ = ["FEATURE_SITE", "HEAD_JSON", "HEAD_WEIGHTS", "Head", "HeadInfo", "check_head"]
