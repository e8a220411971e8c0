"""Settings that change how a command's work runs (not what it computes), passed down explicitly.

A CLI command builds one :class:`RunOptions` and hands it as ``options=`` to the library call that
does the work (``vitpos sae`` -> ``run_sae`` -> ``train_sae``); there is no ambient state. A
function's own explicit argument (e.g. ``train_sae(device=...)``) wins over the options' value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunOptions:
    """How to run: device, mixed precision and checkpointing of a command's training and capture."""

    device: str | None = None
    """``auto | cpu | cuda | cuda:N`` for capture forwards and SAE training; None: the model's own
    device for capture, ``auto`` for training. A model trained on a device chosen here is moved back
    to the CPU afterwards, where callers keep their models."""

    amp: str | None = None
    """``none | bf16 | fp16`` autocast of the forwards (None: none); weights and losses stay float32."""

    checkpoint_dir: str | None = None
    """Folder of the resumable training state (``train-state.safetensors``); None: no checkpoints."""

    checkpoint_every: int = 0
    """Save the training state every N optimiser steps (0: only at the end of training)."""

    checkpoint_key: dict[str, Any] | None = None
    """Extra run identity a resumed checkpoint must match, on top of the trainer's own settings
    (e.g. the CLI's model, layer, data and batch settings)."""

    restart_on_mismatch: bool = False
    """A checkpoint made with other settings: start over (with a note in the log) instead of an error."""


__all__ = ["RunOptions"]
