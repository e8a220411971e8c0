"""Top-1 accuracy of a surface on a dataset split, optionally under a hook context."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager

import torch

from vitpos.capture import forward_batches


def accuracy_report(preds: torch.Tensor, labels: torch.Tensor, info) -> dict:
    """top1 plus per-class and per-class-group accuracies (fractions in [0, 1])."""
    correct = (preds == labels).float()
    per_class = {}
    for c, name in enumerate(info.class_names):
        mask = labels == c
        if mask.any():
            per_class[name] = float(correct[mask].mean())
    groups = {}
    for g, ids in info.class_groups.items():
        mask = torch.isin(labels, torch.tensor(ids))
        if mask.any():
            groups[g] = float(correct[mask].mean())
    return {"top1": float(correct.mean()), "n": int(len(labels)), "per_class": per_class, "per_group": groups}


@torch.no_grad()
def predict(surface, dataset, batch_size: int = 256, context: Callable[[], ContextManager] | None = None,
            progress: bool = False, desc: str = "eval") -> tuple[torch.Tensor, torch.Tensor]:
    preds, labels = [], []
    with context() if context else nullcontext():
        for _, y, logits in forward_batches(surface, dataset, batch_size, progress, desc):
            preds.append(logits.argmax(-1))
            labels.append(y)
    return torch.cat(preds), torch.cat(labels)


def evaluate(surface, dataset, batch_size: int = 256, context=None, progress: bool = False) -> dict:
    preds, labels = predict(surface, dataset, batch_size, context, progress)
    return accuracy_report(preds, labels, dataset.info)
