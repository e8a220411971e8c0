"""Training vitpos' own ViTs: deterministic, resumable (a checkpoint after every epoch), atomic outputs."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from vitpos.data import load_split, tiles
from vitpos.data.base import require_classes
from vitpos.errors import VitposError
from vitpos.io import (
    check_finite,
    fault_point,
    read_json,
    read_safetensors,
    read_safetensors_metadata,
    validate_doc,
    write_json,
    write_safetensors,
)
from vitpos.models.checkpoint import save_own_model
from vitpos.models.own import OwnViT, OwnViTConfig, build_own_vit, decay_exempt
from vitpos.progress import progress_bar
from vitpos.runtime.memory import require_memory

QUICK_MODEL = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
QUICK_LIMITS = dict(train=256, val=128, test=128)
DEFAULT_EPOCHS, QUICK_EPOCHS = 3, 2
CHECKPOINT = "checkpoint"  # OUT/checkpoint/: model.safetensors, optim.safetensors, state.json


def _hparams(epochs: int, batch_size: int, lr: float, weight_decay: float, warmup_epochs: float, seed: int, data: str,
             quick: bool) -> dict:
    return dict(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                warmup_epochs=warmup_epochs, seed=seed, data=data, quick=quick)


def _input_transform(data: str, img_size: int | None):
    """None for built-in data (their native size); for an imagefolder, resize to `img_size` or,
    by default, to the images' own size."""
    from vitpos.data import imagefolder

    if not data.startswith(imagefolder.PREFIX):
        if img_size is not None:
            raise VitposError(f"--img-size applies to imagefolder data only; {data!r} has a fixed size "
                              "(drop --img-size)")
        return None
    if img_size is not None and not 8 <= img_size <= MAX_IMG_SIZE:
        raise VitposError(f"--img-size must lie in 8..{MAX_IMG_SIZE} (got {img_size})")
    if img_size is None and (native := imagefolder.native_size(data)) > MAX_IMG_SIZE:
        # checked before the model config (le=4096) would give a schema error after loading the images
        raise VitposError(f"{data}'s images are {native} px, more than an own ViT trains at ({MAX_IMG_SIZE} px at "
                          f"most); pass --img-size N (8..{MAX_IMG_SIZE}) to resize them")
    return imagefolder.default_transform(img_size or imagefolder.native_size(data))


MAX_IMG_SIZE = 1024  # --img-size's bound, and the largest native size trained at without one


def lr_at(step: int, total: int, warmup: int, base: float) -> float:
    """Linear warmup then cosine decay to 0; a pure function of the step so resumes match."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


@torch.no_grad()
def accuracy(model: torch.nn.Module, dataset, batch_size: int = 256) -> float:
    model.eval()
    correct = total = 0
    for x, y in dataset.batches(batch_size):
        correct += int((model(x).argmax(-1) == y).sum())
        total += len(y)
    return correct / max(1, total)


@torch.no_grad()
def group_accuracy(model: torch.nn.Module, dataset, batch_size: int = 256) -> dict[str, float]:
    """Top-1 within each of the data's class groups (e.g. the row-decided and column-decided classes)."""
    model.eval()
    hits, labels = [], []
    for x, y in dataset.batches(batch_size):
        hits.append(model(x).argmax(-1) == y)
        labels.append(y)
    hit, label = torch.cat(hits), torch.cat(labels)
    out = {}
    for group, classes in dataset.info.class_groups.items():
        members = torch.isin(label, torch.tensor(classes))
        out[group] = float(hit[members].float().mean()) if bool(members.any()) else float("nan")
    return out


def _save_optimizer(path: Path, opt: torch.optim.Optimizer) -> None:
    sd = opt.state_dict()
    tensors = {f"{i}.{k}": v for i, st in sd["state"].items() for k, v in st.items() if torch.is_tensor(v)}
    write_safetensors(path, tensors, metadata={"param_groups": json.dumps(sd["param_groups"])})


def _load_optimizer(path: Path, opt: torch.optim.Optimizer) -> None:
    fix = "pass --force to start the training over"
    tensors = read_safetensors(path, fix)
    try:
        groups = json.loads(read_safetensors_metadata(path, fix)["param_groups"])
        state: dict[int, dict] = {}
        for key, v in tensors.items():
            i, name = key.split(".", 1)
            state.setdefault(int(i), {})[name] = v
        params = [p for g in opt.param_groups for p in g["params"]]
        for i, st in state.items():  # Adam's moments must match their parameter exactly
            for name, v in st.items():
                if name != "step" and (v.shape != params[i].shape or v.dtype != params[i].dtype):
                    raise ValueError(f"state {i}.{name} is {v.dtype}{tuple(v.shape)}, the parameter "
                                     f"{params[i].dtype}{tuple(params[i].shape)}")
        check_finite(tensors, path, fix)
        opt.load_state_dict({"state": state, "param_groups": groups})
    except VitposError:
        raise
    except (KeyError, ValueError, TypeError, IndexError, AttributeError, RuntimeError) as e:
        raise VitposError(f"{path} is not the optimiser state of this run ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:160] if str(e) else ''}); {fix}") from None


class _TrainState(BaseModel):
    """OUT/checkpoint/state.json: where an interrupted training resumes."""

    model_config = ConfigDict(allow_inf_nan=False)
    run: dict[str, Any]
    epochs_done: int = Field(ge=0)
    seconds: float = Field(ge=0)
    history: list[dict[str, Any]]


class _TrainMetrics(BaseModel):
    """The keys of OUT/metrics.json a rerun of a finished training reports (the rest is free)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="allow")
    test_top1: float = Field(ge=0, le=1)
    val_top1: float = Field(ge=0, le=1)
    epochs: int = Field(ge=1)
    seconds: float = Field(ge=0)


def _load_model_state(path: Path, model: torch.nn.Module) -> None:
    fix = "pass --force to start the training over"
    state = read_safetensors(path, fix)
    check_finite(state, path, fix)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise VitposError(f"{path} does not fit this run's model ({str(e).splitlines()[0][:160]}); {fix}") from None


def _save_checkpoint(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
    """Commit one training checkpoint as a unit: OUT/checkpoint/ only ever holds a complete one.

    The three files (weights, optimizer, state.json) are written into a fresh
    OUT/checkpoint.tmp-*/ and swapped in by renames: checkpoint/ -> checkpoint.old/, then the
    temp folder -> checkpoint/, and the old one is deleted last. A kill at any point leaves the
    previous checkpoint or the new one, never new weights beside an old state.json (which made
    the rerun train that epoch again on top of the new weights). Why folders and renames rather
    than a state.json naming the sha256 of the files it commits: overwriting the files in place
    would still destroy the old checkpoint before the new one is complete (a mismatch could only
    be detected, and the run restarted from scratch), and a resume never has to verify anything.
    POSIX cannot rename a folder onto a non-empty one, hence two renames; a kill between them
    leaves only checkpoint.old/, which `_recover_checkpoint` puts back (that epoch is trained
    again). This guards against a process kill; power loss would also take fsyncs.
    """
    ckpt, old = out / CHECKPOINT, out / f"{CHECKPOINT}.old"
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{CHECKPOINT}.tmp-", dir=out))
    write_safetensors(tmp / "model.safetensors", model.state_dict())
    fault_point("ckpt-model")
    _save_optimizer(tmp / "optim.safetensors", opt)
    fault_point("ckpt-optim")
    write_json(tmp / "state.json", state)
    fault_point("ckpt-state")
    if ckpt.exists():
        os.replace(ckpt, old)
    fault_point("ckpt-aside")
    os.replace(tmp, ckpt)
    fault_point("ckpt-commit")
    shutil.rmtree(old, ignore_errors=True)


def _recover_checkpoint(out: Path) -> None:
    """Tidy what a kill inside `_save_checkpoint` left: uncommitted temp folders go, and a
    checkpoint moved aside whose successor never arrived is put back."""
    ckpt, old = out / CHECKPOINT, out / f"{CHECKPOINT}.old"
    for tmp in out.glob(f"{CHECKPOINT}.tmp-*"):
        shutil.rmtree(tmp)
    if old.exists():
        if ckpt.exists():
            shutil.rmtree(old)  # the swap finished; only the deletion was cut short
        else:
            os.replace(old, ckpt)


def _data_and_config(pe: str, data: str, quick: bool, model_overrides: dict | None, limits: dict, transform=None):
    """The train and val splits (through `transform`) and the model config they fix (image size,
    channels, classes; patch size and model sizes from the quick sizes and `model_overrides`)."""
    train_set = load_split(data, "train", seed=0, limit=limits.get("train"), transform=transform)
    val_set = load_split(data, "val", seed=0, limit=limits.get("val"), transform=transform)
    info = train_set.info
    require_classes(info, data)  # one class: 100 % top-1 from the first step, nothing learnt
    if info.image_size[0] != info.image_size[1]:
        raise VitposError(f"dataset {data!r} has non-square images {info.image_size}; own ViTs need square inputs")
    sized = {"patch_size": 4, **(QUICK_MODEL if quick else {}), **(model_overrides or {})}
    patch, size = sized["patch_size"], info.image_size[0]
    if isinstance(patch, int) and patch >= 1 and size < 2 * patch:  # one patch: no position to learn or to study
        # checked before divisibility: 1-px images would otherwise be told to pick a patch size that divides 1
        resize = -(-max(8, 2 * patch) // patch) * patch  # the smallest --img-size (8..) that holds 2 x 2 patches
        fixes = ([f"--img-size {resize} (or more) to resize them"] if data.startswith("imagefolder:") else []) + (
            [f"--patch-size {size // 2} or less"] if size >= 2 else [])
        raise VitposError(f"{data}'s {size}-px images with {patch}-px patches give a {size // patch} x "
                          f"{size // patch} patch grid; a position study needs at least 2 x 2 patches, so images of "
                          f"at least {2 * patch} px" + (" (2 px with 1-px patches)" if patch > 1 else "")
                          + (f": pass {' or '.join(fixes)}" if fixes else ": use larger images"))
    if not isinstance(patch, int) or patch < 1 or size % patch:
        raise VitposError(f"image size {size} is not divisible by the patch size {patch}; "
                          "pick a patch size that divides it")
    # the default (sincos) is what a model without a learned table records anyway (the zoo's recipes pass it)
    if (model_overrides or {}).get("ape_init", "sincos") != "sincos" and pe not in LEARNED_APE:
        raise VitposError(f"--ape-init sets the init of a learned position table; --pe {pe} has none (learned tables: "
                          f"{', '.join(LEARNED_APE)}); drop --ape-init")
    # model_validate: `pe` is a CLI string, checked against OwnViTConfig's Literal here.
    cfg = OwnViTConfig.model_validate(dict(pe=pe, img_size=info.image_size[0], in_chans=info.in_chans,
                                           num_classes=info.num_classes, **sized))
    if data == tiles.NAME and (cfg.img_size, cfg.patch_size) != (tiles.SIZE, tiles.TILE):
        raise VitposError(f"{data} is built of {tiles.TILE}-px tiles at {tiles.SIZE} px, so a model must patch it at "
                          f"exactly the tiles ({tiles.TILE}-px patches at {tiles.SIZE} px); this one has "
                          f"{cfg.patch_size}-px patches at {cfg.img_size} px, so its patches cross the tiles' borders "
                          f"and it learns the seams as content: pass --patch-size {tiles.TILE}, or other data")
    return train_set, val_set, cfg


LEARNED_APE = ("ape", "rope-ape", "rope-mixed-ape")  # encodings with a learned table (`ape-sincos`'s is frozen)


def training_bytes(cfg: OwnViTConfig, batch_size: int) -> int:
    """A lower estimate of the memory one training step takes: fp32 weights, gradients and AdamW's two
    moments (16 bytes a parameter), and the activations autograd keeps per block (the residual, norms,
    q/k/v, MLP hidden, and the attention matrix of every head)."""
    d, L, tokens = cfg.embed_dim, cfg.depth, cfg.grid[0] * cfg.grid[1] + 1
    hidden = int(d * cfg.mlp_ratio)
    params = L * (4 * d * d + 2 * d * hidden) + cfg.patch_size ** 2 * cfg.in_chans * d + tokens * d
    per_block = batch_size * tokens * (6 * d + 2 * hidden + 2 * cfg.num_heads * tokens)
    return 16 * params + 4 * L * per_block


def _finished(out: Path, run_doc: dict, force: bool) -> dict | None:
    """The metrics of a finished run of the same settings in `out` (None: train), after tidying an
    interrupted checkpoint swap and, with `force`, dropping what is there."""
    if out.is_dir():
        _recover_checkpoint(out)
    if force:
        (out / "metrics.json").unlink(missing_ok=True)
        shutil.rmtree(out / CHECKPOINT, ignore_errors=True)
    if (out / "metrics.json").exists() and not (out / "config.json").exists():
        raise VitposError(f"{out} holds a metrics.json but no config.json: not a finished vitpos training (its top-1 "
                          "is not this run's); pass another --out, or --force to train there anyway")
    if (out / "metrics.json").exists() and (out / "config.json").exists():
        done = read_json(out / "config.json", "pass --force to train it again")
        if isinstance(done, dict) and {k: v for k, v in done.items() if k != "classes"} == run_doc:
            fix = "pass --force to train it again"
            # the settings the run was started with: a damaged or other copy means the finished run cannot be
            # checked against this request, so its metrics are not printed as this request's
            if (out / "train_config.json").exists():
                started = read_json(out / "train_config.json", f"the finished run in {out} cannot be checked "
                                    f"against this request; {fix}, or pass another --out")
                if started != run_doc:
                    raise VitposError(f"{out}/train_config.json does not match {out}/config.json (other settings); "
                                      f"the finished run cannot be checked against this request; {fix}, or pass "
                                      "another --out")
            metrics = read_json(out / "metrics.json", fix)
            if not isinstance(metrics, dict):
                raise VitposError(f"{out}/metrics.json is not a vitpos training summary; {fix}")
            validate_doc(_TrainMetrics, metrics, out / "metrics.json", fix)  # never print a top-1 of 7.5 or NaN
            return metrics
        raise VitposError(f"{out} already holds a different trained model; pass another --out or --force")
    return None


def _optimizer(model: OwnViT, lr: float, weight_decay: float) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
    """AdamW with weight decay on matrices except the exempt ones (position tables, tokens); the
    trained parameters (for gradient clipping)."""
    skip = decay_exempt(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    decay = [p for n, p in named if p.ndim >= 2 and n not in skip and n.split(".")[0] not in skip]
    no_decay = [p for n, p in named if not (p.ndim >= 2 and n not in skip and n.split(".")[0] not in skip)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    return opt, params


def _resume(out: Path, run_doc: dict, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, float, list]:
    """(epochs done, seconds, history) of the checkpoint in `out` (loaded into model and opt), else a fresh start.
    A checkpoint that does not decode, parse or fit this run (state.json, weight or optimiser shapes) is one
    error line."""
    ckpt_dir = out / CHECKPOINT
    state_path = ckpt_dir / "state.json"
    if not state_path.exists():
        return 0, 0.0, []
    fix = "pass --force to start the training over"
    state = validate_doc(_TrainState, read_json(state_path, fix), state_path, fix)
    if state.run != run_doc:
        raise VitposError(f"{out} holds an interrupted run with other settings; pass another --out or --force")
    epochs = run_doc["train"]["epochs"]
    if state.epochs_done > epochs or len(state.history) != state.epochs_done:
        raise VitposError(f"{state_path} says {state.epochs_done} epochs done with {len(state.history)} in its "
                          f"history, of {epochs}; {fix}")
    _load_model_state(ckpt_dir / "model.safetensors", model)
    _load_optimizer(ckpt_dir / "optim.safetensors", opt)
    return state.epochs_done, state.seconds, state.history


@dataclass(frozen=True)
class _Schedule:
    steps_per_epoch: int
    total_steps: int
    warmup: int
    lr: float


def _train_epoch(model: torch.nn.Module, opt: torch.optim.Optimizer, params: list, train_set, epoch: int, seed: int,
                 batch_size: int, sched: _Schedule, step_done: Callable[[float], None]) -> float:
    """One epoch in the (seed, epoch) data order; `step_done(mean loss so far)` after each step;
    returns the epoch's mean training loss."""
    model.train()
    gen = torch.Generator().manual_seed(seed * 100003 + epoch)  # data order depends only on (seed, epoch)
    loss_sum = n_seen = 0.0
    for i, (x, y) in enumerate(train_set.batches(batch_size, shuffle=True, generator=gen)):
        for g in opt.param_groups:
            g["lr"] = lr_at(epoch * sched.steps_per_epoch + i, sched.total_steps, sched.warmup, sched.lr)
        loss = F.cross_entropy(model(x), y)
        if not bool(torch.isfinite(loss)):  # diverged: no checkpoint, no model, one line
            raise VitposError(f"training diverged: the loss is {float(loss.detach())} at epoch {epoch + 1}, "
                              f"step {i + 1} (--lr {sched.lr:g}); lower --lr and rerun with --force")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loss_sum += float(loss.detach()) * len(y)
        n_seen += len(y)
        step_done(loss_sum / n_seen)
    check_finite(dict(model.state_dict()), f"the model after epoch {epoch + 1}",
                 f"training diverged (--lr {sched.lr:g}); lower --lr and rerun with --force")
    return loss_sum / n_seen


def train(
    pe: str,
    out: str | Path,
    data: str = "shapes",
    epochs: int | None = None,
    seed: int = 0,
    batch_size: int = 128,
    lr: float = 1e-3,
    weight_decay: float = 0.05,
    warmup_epochs: float = 0.5,
    quick: bool = False,
    force: bool = False,
    progress: bool = True,
    model_overrides: dict | None = None,
    img_size: int | None = None,
) -> dict:
    """Train one own ViT into `out`; returns metrics. Rerunning the same command resumes or no-ops.

    epochs: default 3, or 2 with `quick` (tiny model and data); an explicit value is honoured either way.
    model_overrides: OwnViTConfig fields (embed_dim, depth, num_heads, mlp_ratio, patch_size, ape_init, ...).
    img_size: imagefolder data only: train at this size (default: the images' own size).
    """
    out = Path(out)
    limits = QUICK_LIMITS if quick else {}
    if epochs is None:
        epochs = QUICK_EPOCHS if quick else DEFAULT_EPOCHS
    if epochs < 1:
        raise VitposError(f"epochs must be at least 1 (got {epochs})")
    transform = _input_transform(data, img_size)
    train_set, val_set, cfg = _data_and_config(pe, data, quick, model_overrides, limits, transform)
    require_memory(training_bytes(cfg, batch_size), f"training a {cfg.depth}-block, {cfg.embed_dim}-wide model at "
                   f"batch size {batch_size}", "pass a smaller --embed-dim, --depth or --batch-size")
    hp = _hparams(epochs, batch_size, lr, weight_decay, warmup_epochs, seed, data, quick)
    run_doc = {"model": cfg.model_dump(), "train": hp}
    done = _finished(out, run_doc, force)
    if done is not None:
        return done

    torch.manual_seed(seed)
    model = build_own_vit(cfg)
    opt, params = _optimizer(model, lr, weight_decay)
    steps_per_epoch = math.ceil(len(train_set) / batch_size)
    sched = _Schedule(steps_per_epoch, epochs * steps_per_epoch, int(warmup_epochs * steps_per_epoch), lr)
    start_epoch, seconds, history = _resume(out, run_doc, model, opt)
    write_json(out / "train_config.json", run_doc)

    with progress_bar(enabled=progress) as bar:
        task = bar.add_task(f"train {pe}", total=sched.total_steps, completed=start_epoch * steps_per_epoch)
        for epoch in range(start_epoch, epochs):
            t0 = time.time()

            def step_done(mean_loss: float, epoch: int = epoch) -> None:
                bar.update(task, advance=1, description=f"train {pe} ep {epoch + 1}/{epochs} loss {mean_loss:.3f}")
            train_loss = _train_epoch(model, opt, params, train_set, epoch, seed, batch_size, sched, step_done)
            val = accuracy(model, val_set)
            seconds += time.time() - t0
            history.append({"epoch": epoch + 1, "train_loss": train_loss, "val_top1": val})
            _save_checkpoint(out, model, opt,
                             {"run": run_doc, "epochs_done": epoch + 1, "seconds": seconds, "history": history})

    test_set = load_split(data, "test", seed=0, limit=limits.get("test"), transform=transform)
    metrics = {
        "pe": pe, "data": data, "test_top1": accuracy(model, test_set),
        **({"group_top1": group_accuracy(model, test_set)} if train_set.info.class_groups else {}),
        "val_top1": history[-1]["val_top1"] if history else accuracy(model, val_set),
        "epochs": epochs, "seconds": round(seconds, 1), "seed": seed,
        "n_train": len(train_set), "n_test": len(test_set),
        "history": history,
    }
    # the class names: a model trained on an image folder is refused on data with other classes
    save_own_model(out, model, cfg, extra={"train": hp, "classes": list(train_set.info.class_names)})
    fault_point("final-model")
    write_json(out / "metrics.json", metrics)  # written last: its presence marks a finished run
    return metrics
