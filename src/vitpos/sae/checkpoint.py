"""Resumable SAE training state: one atomic safetensors file per checkpoint.

``CKPT_DIR/train-state.safetensors`` holds the SAE tensors (``sae.*``), the Adam state
(``opt.<param index>.<name>``), the dead-latent counters (``since_fired``) and, in the header
metadata, the config, optimiser param groups, the position in the batch stream (epoch, batches
consumed in that pass) and the training log so far. It is written by rank 0 only (temp file +
rename: a killed write leaves the previous checkpoint), and read by every rank on resume.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from vitpos.errors import VitposError
from vitpos.io import write_safetensors

STATE_FILE = "train-state.safetensors"
FORMAT = "vitpos.sae-train-state/1"
_SAE_TENSORS = ("W_enc", "b_enc", "W_dec", "b_dec", "scale", "threshold")


class StaleCheckpointError(VitposError):
    """The checkpoint folder holds the state of a different SAE run (config or training settings
    differ); raised before anything is loaded, so a caller may start over instead."""


def checkpoint_file(ckpt_dir: str | Path) -> Path:
    return Path(ckpt_dir) / STATE_FILE


def save_train_state(ckpt_dir: str | Path, sae, opt: torch.optim.Optimizer, since_fired: torch.Tensor, log,
                     *, epoch: int, batch_in_pass: int, run: dict[str, Any]) -> Path:
    tensors: dict[str, torch.Tensor] = {f"sae.{n}": getattr(sae, n) for n in _SAE_TENSORS}
    sd = opt.state_dict()
    for pid, st in sd["state"].items():
        for name, v in st.items():
            t = v if isinstance(v, torch.Tensor) else torch.tensor(v)
            tensors[f"opt.{pid}.{name}"] = t.reshape(1) if t.ndim == 0 else t
    tensors["since_fired"] = since_fired
    meta = {
        "format": FORMAT,
        "config": json.dumps(sae.cfg.model_dump()),
        "run": json.dumps(run, sort_keys=True),
        "param_groups": json.dumps(sd["param_groups"]),
        "scalar_state": json.dumps(sorted(k for k in tensors if k.startswith("opt.") and _was_scalar(sd, k))),
        "epoch": str(epoch),
        "batch_in_pass": str(batch_in_pass),
        "log": json.dumps({f.name: getattr(log, f.name) for f in fields(log)}),
    }
    file = checkpoint_file(ckpt_dir)
    write_safetensors(file, tensors, metadata=meta)
    return file


def _was_scalar(sd: dict, key: str) -> bool:
    _, pid, name = key.split(".", 2)
    v = sd["state"][int(pid)][name]
    return not isinstance(v, torch.Tensor) or v.ndim == 0


def load_train_state(ckpt_dir: str | Path, sae, opt: torch.optim.Optimizer, since_fired: torch.Tensor, log,
                     *, run: dict[str, Any]) -> tuple[int, int] | None:
    """Restore a checkpoint into the given objects; returns (epoch, batch_in_pass), or None when
    there is none. A checkpoint of a different run (config, lr, batch settings) raises
    :class:`StaleCheckpointError`."""
    file = checkpoint_file(ckpt_dir)
    if not file.is_file():
        return None
    try:
        with safe_open(str(file), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        raise VitposError(f"{file} is not a readable checkpoint ({e}); delete it (or pass --force) to start "
                          "over") from e
    if meta.get("format") != FORMAT:
        raise VitposError(f"{file} is not a vitpos SAE training checkpoint; delete it or use another folder")
    if (json.loads(meta["config"]) != sae.cfg.model_dump()
            or json.loads(meta["run"]) != json.loads(json.dumps(run, sort_keys=True))):
        raise StaleCheckpointError(f"{file} belongs to a different SAE run (config or training settings differ); "
                                   "pass --force or another output folder")
    dev = sae.W_enc.device
    with torch.no_grad():
        for n in _SAE_TENSORS:
            getattr(sae, n).copy_(tensors[f"sae.{n}"])
        since_fired.copy_(tensors["since_fired"])
    scalars = set(json.loads(meta.get("scalar_state", "[]")))
    state: dict[int, dict[str, Any]] = {}
    for k, t in tensors.items():
        if not k.startswith("opt."):
            continue
        _, pid, name = k.split(".", 2)
        v = t.reshape(()) if k in scalars else t
        # Adam keeps 'step' on the CPU unless capturable/fused; moments live with the parameters.
        state.setdefault(int(pid), {})[name] = v if name == "step" else v.to(dev)
    opt.load_state_dict({"state": state, "param_groups": json.loads(meta["param_groups"])})
    saved = json.loads(meta["log"])
    for f in fields(log):
        if f.name in saved and f.name != "device":
            setattr(log, f.name, saved[f.name])
    return int(meta["epoch"]), int(meta["batch_in_pass"])
