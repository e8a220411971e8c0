"""Own-model checkpoints: `model.safetensors` (weights) + `config.json` (OwnViTConfig + provenance)."""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import ValidationError

from vitpos.errors import VitposError
from vitpos.io import check_finite, read_json_object, read_safetensors, write_json, write_safetensors
from vitpos.models.own import OwnViTConfig, build_own_vit


def save_own_model(out_dir: str | Path, model: torch.nn.Module, cfg: OwnViTConfig, extra: dict | None = None) -> None:
    out_dir = Path(out_dir)
    write_safetensors(out_dir / "model.safetensors", model.state_dict(), metadata={"format": "pt"})
    write_json(out_dir / "config.json", {"model": cfg.model_dump(), **(extra or {})})


def read_own_config(model_dir: str | Path) -> OwnViTConfig:
    path = Path(model_dir) / "config.json"
    doc = read_json_object(path, "retrain with `vitpos train`")
    try:
        return OwnViTConfig.model_validate(doc["model"] if "model" in doc else doc)
    except (ValidationError, KeyError, TypeError) as e:
        raise VitposError(f"{path} is not a vitpos model config ({str(e).splitlines()[0]}); "
                          "retrain with `vitpos train`") from None


def load_own_model(model_dir: str | Path) -> tuple[torch.nn.Module, OwnViTConfig]:
    """Rebuild the model from config.json and load weights strictly (safetensors: no unpickling)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise VitposError(f"model directory {model_dir} does not exist; train one with `vitpos train --out "
                          f"{model_dir}`")
    cfg = read_own_config(model_dir)
    try:
        model = build_own_vit(cfg)
    except (ValueError, AssertionError, RuntimeError, ZeroDivisionError) as e:
        raise VitposError(f"{model_dir}/config.json describes a model that cannot be built ({str(e).splitlines()[0]}); "
                          "retrain with `vitpos train`") from None
    file = model_dir / "model.safetensors"
    state = read_safetensors(file, "retrain with `vitpos train`")
    bad = sorted(k for k, t in state.items() if not t.is_floating_point() and not k.endswith("num_batches_tracked"))
    if bad:
        raise VitposError(f"{file}: tensor {bad[0]!r} is {state[bad[0]].dtype}, not floating point; retrain with "
                          "`vitpos train`")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise VitposError(f"{file} does not match its config.json ({str(e).splitlines()[0]}); retrain with "
                          "`vitpos train`") from None
    check_finite(state, file, "the model is broken (a diverged training?); retrain with `vitpos train`")
    return model.eval(), cfg
