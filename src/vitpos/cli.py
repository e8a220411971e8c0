"""The `vitpos` command: thin wrappers that parse, call one library function and print."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vitpos.errors import VitposError
from vitpos.study.config import SEED_MAX

if TYPE_CHECKING:
    from vitpos.results.sae_run import SAEResult

COUNT_MAX = 10**9  # the largest count (images, tokens, batch, layer) an option takes: huge values are refused

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Where do Vision Transformers keep spatial position? Probes, SAEs and causal tests for APE "
                       "and RoPE ViTs.")
intervene_app = typer.Typer(no_args_is_help=True,
                            help="Causal tests: ape-permute, rope-axis, rope-heads, rope-prefix, rope-freq.")
app.add_typer(intervene_app, name="intervene")
zoo_app = typer.Typer(no_args_is_help=True,
                      help="The matched positional-encoding zoo on `pairs`: list it, or retrain any member")
app.add_typer(zoo_app, name="zoo")
console = Console(stderr=True)
out_console = Console(markup=False, highlight=False)

ModelOpt = typer.Option(..., "--model", "-m",
                        help="builtin:NAME, a directory from `vitpos train`, or timm:NAME[?kw=v&...]")
PretrainedOpt = typer.Option(False, "--pretrained", help="timm: load hub weights with timm's own loader")
CheckpointOpt = typer.Option(None, "--checkpoint", help="timm: local .safetensors weights")
DataOpt = typer.Option("shapes", "--data", "-d",
                       help="shapes | pairs | digits | fashion | natural | tiles | imagefolder:PATH")
OutOpt = typer.Option(..., "--out", "-o", help="output directory")
ProgressOpt = typer.Option(True, "--progress/--no-progress", help="progress bars")
DeviceOpt = typer.Option("auto", "--device",
                         help="auto | cpu | cuda (cuda:N); under torchrun each rank takes cuda:LOCAL_RANK")
def _int_list(text: str, flag: str) -> list[int]:
    """A comma list of layer numbers: empty items and repeats refused (`vitpos.lists`)."""
    from vitpos.lists import parsed_items

    return parsed_items(text, flag, "2,3", int, "layer numbers")


def _sites(text: str) -> str:
    """--sites: a comma list without empty items or repeats, normalised ('a, b' -> 'a,b')."""
    from vitpos.lists import comma_items

    return ",".join(comma_items(text, "--sites", "blocks.1.resid_post"))


def _positive_finite(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a positive finite number (got {value})")
    return value


HeadOpt = typer.Option(None, "--head", help="a head fitted by `vitpos head` (DIR with head.json): the classifier "
                       "every top-1 is measured with (for headless backbones)")
SplitOpt = typer.Option("test", "--split")
AmpOpt = typer.Option("none", "--amp", help="autocast: none | bf16 | fp16 (fp16 needs CUDA)")


def _surface(model: str, pretrained: bool = False, checkpoint: Path | None = None, head: Path | None = None,
             data: str | None = None, top1: bool = False):
    """The model; with --head, that head (checked against the model's weights and the data's classes)
    as its classifier. top1: the command measures top-1, so a classifier that does not fit the data
    is refused here, before any work."""
    from vitpos.data import dataset_info
    from vitpos.models import load_model
    from vitpos.models.head import Head

    surface = load_model(model, pretrained=pretrained, checkpoint=checkpoint)
    info = dataset_info(data) if data is not None and (head is not None or top1) else None
    if head is not None:
        surface = surface.with_head(Head.load(head), info, data)
    if top1 and info is not None:
        surface.check_classifier(info, data)
    return surface


@app.command()
def train(
    pe: str = typer.Option(..., "--pe", help="ape | ape-sincos | rope-axial | rope-mixed | rope-ape | none"),
    out: Path = OutOpt,
    data: str = DataOpt,
    epochs: int | None = typer.Option(None, "--epochs", min=1, max=1000, help="default 3, or 2 with --quick (1..1000)"),
    seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help=f"0..{SEED_MAX}"),
    batch_size: int = typer.Option(128, "--batch-size", min=1, max=COUNT_MAX, help=">= 1"),
    lr: float = typer.Option(1e-3, "--lr", callback=_positive_finite, help="AdamW peak learning rate (> 0, finite)"),
    quick: bool = typer.Option(False, "--quick", help="seconds-long smoke run (tiny model, tiny data)"),
    force: bool = typer.Option(False, "--force", help="discard an earlier run in --out"),
    progress: bool = ProgressOpt,
    embed_dim: int | None = typer.Option(None, "--embed-dim", min=8, max=4096, help="width (default 96; 32 --quick)"),
    depth: int | None = typer.Option(None, "--depth", min=1, max=64, help="blocks (default 6; 2 --quick)"),
    heads: int | None = typer.Option(None, "--heads", min=1, max=64, help="attention heads (default 4; 2 --quick)"),
    mlp_ratio: float | None = typer.Option(None, "--mlp-ratio", min=0.25, max=16.0,
                                           help="MLP width / width (default 2)"),
    patch_size: int | None = typer.Option(None, "--patch-size", min=1, max=64, help="patch side in px (default 4)"),
    img_size: int | None = typer.Option(None, "--img-size", help="imagefolder only: train at this size (default: the "
                                        "images' own size)"),
    ape_init: str | None = typer.Option(None, "--ape-init", help="learned APE's init: sincos (default) | trunc_normal"),
):
    """Train one of vitpos' own ViTs; rerunning the same command resumes an interrupted run."""
    from vitpos.models.own import PE_CHOICES
    from vitpos.train import train as run_train

    if pe not in PE_CHOICES:
        raise VitposError(f"unknown --pe {pe!r}; use one of {', '.join(PE_CHOICES)}")
    if epochs is not None and epochs < 1:
        raise VitposError("--epochs must be at least 1")
    if batch_size < 1:
        raise VitposError(f"--batch-size must be at least 1 (got {batch_size})")
    if not lr > 0:
        raise VitposError(f"--lr must be a positive number (got {lr})")
    from vitpos.io import require_out_dir

    require_out_dir(out)
    sizes = dict(embed_dim=embed_dim, depth=depth, num_heads=heads, mlp_ratio=mlp_ratio, patch_size=patch_size,
                 ape_init=ape_init)
    overrides = {k: v for k, v in sizes.items() if v is not None}
    if ape_init is not None and ape_init not in ("sincos", "trunc_normal"):
        raise VitposError(f"unknown --ape-init {ape_init!r}; use sincos or trunc_normal")
    width = embed_dim if embed_dim is not None else (32 if quick else 96)
    n_heads = heads if heads is not None else (2 if quick else 4)
    if width % n_heads or (pe.startswith("rope") and (width // n_heads) % 4):
        raise VitposError(f"--embed-dim {width} must split into {n_heads} heads"
                          + (" of a dimension divisible by 4 (2D RoPE)" if pe.startswith("rope") else "")
                          + "; change --embed-dim or --heads")
    m = run_train(pe, out, data=data, epochs=epochs, seed=seed, batch_size=batch_size, lr=lr, quick=quick,
                  force=force, progress=progress, model_overrides=overrides or None, img_size=img_size)
    out_console.print(f"{pe} on {data}: test top-1 {m['test_top1']:.4f}, val top-1 {m['val_top1']:.4f} "
                      f"({m['epochs']} epochs, {m['seconds']:.0f} s) -> {out}")


@zoo_app.command("list")
def zoo_list():
    """Every zoo member: its encoding, whether it ships, its test top-1 (per class group), and whether
    it was trained with the current recipe."""
    from rich import box

    from vitpos import zoo
    from vitpos.io import read_json
    from vitpos.models.spec import BUILTIN_DIR

    # fits 80 columns: the member's name says its encoding and seed (docs/zoo.md), so no encoding column
    t = Table("member", "top-1 %", "content/vert/horiz %", "recipe", box=box.SIMPLE_HEAD,
              caption="A spec is builtin:<member>; '-': not shipped yet (train it: vitpos zoo train MEMBER "
                      "--out DIR).\nrecipe 'epochs: 4 (12)': shipped with 4 epochs, the recipe now says 12.",
              caption_justify="left")
    for col in t.columns[:3]:
        col.no_wrap = True  # a member's name is what users copy; the numbers read as one row
    for name in zoo.members():
        metrics = BUILTIN_DIR / name / "metrics.json"
        m = read_json(metrics) if metrics.is_file() else {}
        groups = m.get("group_top1") or {}
        t.add_row(name, f"{100 * m['test_top1']:.1f}" if m else "-",
                  "/".join(f"{100 * groups[g]:.1f}" for g in ("content", "vertical", "horizontal") if g in groups)
                  or "-",
                  ("; ".join(zoo.recipe_differences(name, BUILTIN_DIR / name)) or "current") if m else "-")
    out_console.print(t)


@zoo_app.command("train")
def zoo_train(
    name: str = typer.Argument(..., help="a member, e.g. pairs-rope-axial or pairs-ape-seed1 (see `vitpos zoo list`)"),
    out: Path = OutOpt,
    force: bool = typer.Option(False, "--force", help="discard an earlier run in --out"),
    progress: bool = ProgressOpt,
):
    """Retrain one zoo member with its exact recipe (deterministic on CPU with one thread; resumable)."""
    from vitpos import zoo

    zoo.parse(name)  # one clear error for an unknown member, before any work
    from vitpos.io import require_out_dir

    require_out_dir(out)
    m = zoo.train_member(name, out, progress=progress, force=force)
    out_console.print(f"{name}: test top-1 {m['test_top1']:.4f} ({m['epochs']} epochs, {m['seconds']:.0f} s) -> {out}")


@app.command("eval")
def eval_cmd(
    model: str = ModelOpt,
    data: str = DataOpt,
    split: Literal["train", "val", "test"] = SplitOpt,
    out: Path | None = typer.Option(None, "--out", "-o"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    limit: int | None = typer.Option(None, "--limit", min=1, max=COUNT_MAX,
                                     help="evaluate on the first N images (>= 1)"),
    head: Path | None = HeadOpt,
    progress: bool = ProgressOpt,
):
    """Top-1 accuracy of a model on a split; writes OUT/eval.json with test_top1."""
    from vitpos.analysis.forward import evaluate
    from vitpos.data.resolve import dataset_for
    from vitpos.io import write_json

    if limit is not None and limit < 1:
        raise VitposError(f"--limit must be at least 1 (got {limit})")
    surface = _surface(model, pretrained, checkpoint, head, data, top1=True)
    ds = dataset_for(surface, data, split, limit=limit)
    rep = evaluate(surface, ds, progress=progress)
    doc = {"model": model, "data": data, "split": split, f"{split}_top1": rep["top1"], **rep}
    if head is not None:
        doc["head"] = str(head)
    if out is not None:
        write_json(Path(out) / "eval.json", doc)
    out_console.print(f"{model} on {data}/{split}: top-1 {rep['top1']:.4f} (n={rep['n']})")


@app.command("head")
def head_cmd(
    model: str = ModelOpt,
    data: str = DataOpt,
    out: Path = OutOpt,
    images: int = typer.Option(4000, "--images", min=2, max=COUNT_MAX,
                               help="train-split images to fit on (>= 2); val and test "
                               "splits: images // 4 each"),
    seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help=f"0..{SEED_MAX}"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    progress: bool = ProgressOpt,
):
    """Fit a linear classifier on the model's pooled pre-logit features: OUT/head.safetensors + head.json.

    For backbones without a classifier (DINOv2/v3, EVA-02, CLIP towers) or one for other data;
    pass OUT as --head to eval, sae, intervene (and probe), or under `heads:` in a run config."""
    from vitpos.analysis.heads import fit_head
    from vitpos.io import require_out_dir

    require_out_dir(out)
    surface = _surface(model, pretrained, checkpoint)
    h = fit_head(surface, data=data, n_images=images, seed=seed, out=out, progress=progress).info
    out_console.print(f"head on {model} pooled features, {data}: val top-1 {h.val_top1:.4f}, test top-1 "
                      f"{h.test_top1:.4f} (l2 {h.l2:g}, {h.n_train_images} train images, {h.num_classes} classes) "
                      f"-> {out}")


@app.command()
def models(families: bool = typer.Option(False, "--families", help="run each family's output-match gate on a toy "
                                                                   "model and print its status (seconds)")):
    """List the shipped models and the timm families vitpos supports."""
    from vitpos.io import read_json
    from vitpos.models.spec import BUILTIN_DIR, available_builtins

    if families:
        _print_families()
        return

    t = Table("model", "pe", "data", "test top-1")
    for name in available_builtins():
        m = read_json(BUILTIN_DIR / name / "metrics.json")
        t.add_row(f"builtin:{name}", m.get("pe", "?"), m.get("data", "?"), f"{m.get('test_top1', float('nan')):.4f}")
    out_console.print(t)
    out_console.print("timm: VisionTransformer (vit_*, deit_*, deit3_*, vit_*_reg*) and Eva "
                      "(vit_*_rope_*, vit_*_rope_mixed_*, vit_*_rope_ape_*, eva02_*, vit_*_dinov3)")
    out_console.print("hf (pip install 'vitpos[hf]'): ViTModel, DeiTModel, Dinov2Model, Dinov2WithRegistersModel (and "
                      "their *ForImageClassification), DINOv3ViTModel, CLIPVisionModel, SiglipVisionModel; "
                      "`vitpos models --families` runs each family's gate")


def _print_families() -> None:
    """`vitpos models --families`: every timm and Hugging Face family with its gate status, run now."""
    from vitpos.models.gates import family_rows, gate_family, hf_available

    t = Table("family", "positional encoding", "prefix tokens", "gate")
    t.columns[0].no_wrap = True  # the class name is what users type after hf:
    for name, pe, prefix, spec in family_rows():
        if name.startswith("hf ") and not hf_available():
            t.add_row(name, pe, prefix, "skipped: transformers not installed (pip install 'vitpos[hf]')")
            continue
        g = gate_family(spec, name)
        failed = "; ".join(c.detail for c in g.checks if not c.passed)
        t.add_row(name, pe, prefix, g.status if g.passed else f"{g.status} ({failed})")
    out_console.print(t)


@app.command()
def capture(
    model: str = ModelOpt,
    sites: str = typer.Option("resid_post", "--sites", help="comma list: resid_post (all layers) or blocks.L.site"),
    data: str = DataOpt,
    split: Literal["train", "val", "test"] = typer.Option("train", "--split"),
    out: Path = OutOpt,
    limit: int | None = typer.Option(None, "--limit", min=1, max=COUNT_MAX, help="first N images only (>= 1)"),
    batch_size: int = typer.Option(128, "--batch-size", min=1, max=COUNT_MAX, help=">= 1"),
    dtype: Literal["float32", "float16", "bfloat16"] = typer.Option("float32", "--dtype", help="storage dtype"),
    shard_images: int = typer.Option(256, "--shard-images", min=1, max=COUNT_MAX, help=">= 1"),
    force: bool = typer.Option(False, "--force"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    progress: bool = ProgressOpt,
    device: str = DeviceOpt,
    amp: str = AmpOpt,
    keep_prefix: bool = typer.Option(False, "--keep-prefix", help="also store the prefix tokens (CLS, registers), "
                                     "e.g. for `vitpos sae --store ... --include-special`"),
):
    """Stream activations of a dataset to disk shards (resumable, memory bounded).

    Under torchrun (several ranks) each rank captures its block of the split and rank 0 merges
    the manifests (docs/distributed.md)."""
    from vitpos.runtime.device import autocast_dtype
    from vitpos.runtime.dist import distributed
    from vitpos.store.capture import capture_to_store

    if batch_size < 1 or shard_images < 1:
        raise VitposError(f"--batch-size and --shard-images must be at least 1 (got {batch_size}, {shard_images})")
    sites = _sites(sites)
    with distributed(device) as (env, dev):
        autocast_dtype(amp, dev)
        surface = _surface(model, pretrained, checkpoint)
        info = capture_to_store(surface, data, split, sites, out, limit=limit, batch_size=batch_size, dtype=dtype,
                                shard_images=shard_images, force=force, progress=progress, device=dev, amp=amp,
                                keep_prefix=keep_prefix)
    if env.is_main:
        ranks = f" on {env.world_size} ranks" if env.enabled else ""
        out_console.print(f"captured {info['num_images']} images x {len(info['sites'])} sites{ranks} -> {out}")


@app.command()
def probe(
    model: str = ModelOpt,
    sites: str = typer.Option("resid_post", "--sites"),
    data: str = DataOpt,
    out: Path = OutOpt,
    images: int = typer.Option(1000, "--images", min=2, max=COUNT_MAX,
                               help="number of test-split images, split by image into probe train/test (>= 2)"),
    seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help=f"0..{SEED_MAX}"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    head: Path | None = typer.Option(None, "--head", help="accepted like the other commands' --head and checked "
                                        "against the model and data; probes read patch tokens, so it changes nothing"),
    progress: bool = ProgressOpt,
    device: str = DeviceOpt,
    amp: str = AmpOpt,
):
    """Linear row/column probes per layer: OUT/probe.json and OUT/probe.png."""
    from vitpos.experiments.probe import run_probe
    from vitpos.results.probe import probe_sites

    sites = _sites(sites)
    surface = _surface(model, pretrained, checkpoint, head, data)
    result = run_probe(surface, data=data, sites=sites, n_images=images, seed=seed, out=out, progress=progress,
                       device=device, amp=amp)
    res = next(iter(probe_sites(result).values())).to_json()
    t = Table("layer", "row acc", "col acc", "row sel", "col sel")
    for i, layer in enumerate(res["layers"]):
        t.add_row(str(layer), f"{res['row_acc'][i]:.3f}", f"{res['col_acc'][i]:.3f}",
                  f"{res['row_selectivity'][i]:.3f}", f"{res['col_selectivity'][i]:.3f}")
    out_console.print(t)
    out_console.print(f"chance row {res['chance_row']:.3f}, col {res['chance_col']:.3f}; content baseline row "
                      f"{res['content_baseline']['row_acc']:.3f}, col {res['content_baseline']['col_acc']:.3f} -> "
                      f"{out}")


@app.command()
def sae(
    model: str = ModelOpt,
    layer: int = typer.Option(..., "--layer", min=0, max=COUNT_MAX,
                              help="block index whose site is encoded (0..depth-1)"),
    site: Literal["resid_post", "resid_pre", "attn_out", "mlp_out"] = typer.Option("resid_post", "--site"),
    data: str = DataOpt,
    out: Path = OutOpt,
    arch: Literal["topk", "batchtopk", "relu"] = typer.Option("topk", "--arch"),
    k: int = typer.Option(32, "--k", min=1, max=COUNT_MAX, help="active latents per token for topk / batchtopk (>= 1)"),
    expansion: int = typer.Option(8, "--expansion", min=1, max=256, help="latents = expansion x width (1..256)"),
    images: int = typer.Option(4000, "--images", min=1, max=COUNT_MAX,
                               help="training images (their patch tokens); unused with --store (>= 1)"),
    epochs: int = typer.Option(4, "--epochs", min=1, max=1000, help="1..1000"),
    eval_images: int = typer.Option(1000, "--eval-images", min=2, max=COUNT_MAX,
                                    help="held-out test images for the metrics, feature "
                                    "scores, splice and causal check (>= 2)"),
    seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help=f"0..{SEED_MAX}"),
    store: Path | None = typer.Option(None, "--store", help="train on this `vitpos capture` store (train split, same "
                                         "model and site) instead of capturing into OUT/acts/"),
    lr: float | None = typer.Option(None, "--lr", callback=_positive_finite,
                                     help="Adam learning rate (> 0; default: 2e-3, ∝ 1/√F above 768 latents)"),
    batch_tokens: int = typer.Option(4096, "--batch-tokens", min=1, max=COUNT_MAX,
                                     help="tokens per training step (>= 1)"),
    buffer_tokens: int = typer.Option(65536, "--buffer-tokens", min=0, max=COUNT_MAX,
                                       help="shuffle buffer (tokens held in memory while streaming; 0 = none)"),
    force: bool = typer.Option(False, "--force"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    head: Path | None = HeadOpt,
    progress: bool = ProgressOpt,
    device: str = DeviceOpt,
    amp: str = AmpOpt,
    checkpoint_every: int = typer.Option(500, "--checkpoint-every", min=0, max=COUNT_MAX,
                                         help="save the training state to OUT/train-state/ "
                                         "every N steps (0: only at the end); a rerun resumes from it"),
    stability_seed: int | None = typer.Option(None, "--stability-seed", min=0, max=SEED_MAX,
                                              help=f"also train an SAE with this seed (0..{SEED_MAX}) on the "
                                              "same tokens and report the share of decoder directions it reproduces "
                                              "(cos >= 0.9, one-to-one matching); doubles the training time"),
    include_special: bool = typer.Option(False, "--include-special", help="train on the special tokens too: CLS / "
                                         "register tokens and high-norm outlier patch tokens (norm > 5x the median); "
                                         "default: left out, see sae.json special_tokens"),
):
    """Train an SAE on one layer's patch tokens, streamed from an activation store; OUT/sae.safetensors, sae.json,
    features.png."""
    from vitpos.experiments.sae_run import run_sae
    from vitpos.runtime.device import autocast_dtype
    from vitpos.runtime.dist import barrier, distributed
    from vitpos.runtime.options import RunOptions

    _check_sae_options(lr, batch_tokens, buffer_tokens, images, epochs, checkpoint_every, seed, stability_seed)
    with distributed(device) as (env, dev):
        autocast_dtype(amp, dev)
        state_dir = out / "train-state"
        if force and env.is_main and (state_dir / "train-state.safetensors").exists():
            (state_dir / "train-state.safetensors").unlink()
        barrier()
        # The options carry device/amp/checkpointing down to train_sae; under torchrun every rank runs
        # the same command (same global batches, DDP inside train_sae; capture into OUT/acts is sharded).
        key = {"model": model, "checkpoint": str(checkpoint), "layer": layer, "site": site, "data": data,
               "store": str(store), "images": images, "batch_tokens": batch_tokens, "buffer_tokens": buffer_tokens}
        options = RunOptions(device=str(dev), amp=amp, checkpoint_dir=str(state_dir), checkpoint_every=checkpoint_every,
                             checkpoint_key=key, restart_on_mismatch=True)
        surface = _surface(model, pretrained, checkpoint, head, data)
        doc, _ = run_sae(surface, layer, site=site, data=data, arch=arch, k=k, expansion=expansion,
                         n_train_images=images, n_eval_images=eval_images, epochs=epochs, seed=seed, out=out,
                         progress=progress and env.is_main, force=force, store=store,
                         lr=lr, batch_tokens=batch_tokens, buffer_tokens=buffer_tokens, options=options,
                         stability_seed=stability_seed, include_special=include_special)
    if env.is_main:
        _print_sae(doc, out)


def _check_sae_options(lr: float | None, batch_tokens: int, buffer_tokens: int, images: int, epochs: int,
                       checkpoint_every: int, seed: int, stability_seed: int | None) -> None:
    """`vitpos sae`'s numeric options, one VitposError each (typer's bounds do not reach library callers)."""
    if lr is not None and not lr > 0:
        raise VitposError(f"--lr must be a positive number (got {lr})")
    if batch_tokens < 1 or buffer_tokens < 0:
        raise VitposError(f"--batch-tokens must be >= 1 and --buffer-tokens >= 0 (got {batch_tokens}, {buffer_tokens})")
    if images < 1 or epochs < 1:
        raise VitposError(f"--images and --epochs must be at least 1 (got {images}, {epochs})")
    if checkpoint_every < 0:
        raise VitposError(f"--checkpoint-every must be >= 0 (got {checkpoint_every})")
    for flag, value in (("--seed", seed), ("--stability-seed", stability_seed)):
        if value is not None and not 0 <= value <= SEED_MAX:
            raise VitposError(f"{flag} {value} is outside 0..{SEED_MAX}; pass a seed in that range")
    if stability_seed is not None and stability_seed == seed:
        raise VitposError(f"--stability-seed must differ from --seed (both {seed}); e.g. --stability-seed {seed + 1}")


def _print_sae(doc: SAEResult, out: Path) -> None:
    """`vitpos sae`'s summary: fit, splice, feature counts, and the fidelity numbers when measured."""
    splice = ("spliced top-1 not measured (no classifier for this data: fit one with `vitpos head` and pass --head)"
              if doc.top1_change_points is None else f"spliced top-1 change {doc.top1_change_points:+.1f} pts")
    out_console.print(f"SAE L{doc.layer} {doc.site}: FVU {doc.fvu:.3f}, L0 {doc.l0:.1f}, dead {doc.dead_frac:.1%}, "
                      f"{splice}; {doc.n_row_features} row, "
                      f"{doc.n_col_features} col, {doc.n_mixed_features} mixed features -> {out}")
    fid = doc.fidelity
    if fid is not None:
        stab = ("" if fid.stability is None else f"; seed {fid.stability.other_seed} reproduces "
                f"{fid.stability.share_matched:.1%} of the decoder directions (cos >= {fid.stability.cos_threshold})")
        out_console.print(f"dense latents (firing > {fid.dense_threshold:.0%}) {fid.dense_frac:.1%}; outlier tokens "
                          f"{'included' if doc.include_special else 'left out'}: {doc.excluded_outlier_tokens or 0} of "
                          f"the training tokens above {doc.outlier_threshold:.3g}{stab}")


@app.command()
def browse(
    sae_dir: Path = typer.Argument(..., help="the --out folder of `vitpos sae` (sae.json + sae.safetensors)"),
    out: Path = OutOpt,
    images: int | None = typer.Option(None, "--images", min=2, help="held-out test images to browse with (>= 2; "
                                      "default: as many as the SAE was scored on)"),
    top_k: int = typer.Option(8, "--top-k", min=1, help="top activating images shown per latent (>= 1)"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
):
    """A self-contained HTML page of every SAE latent (type, η² per axis, firing, row x column map, top images with
    heatmaps, class groups); OUT/index.html, no network or server needed."""
    from vitpos.browse import browse_sae, sae_doc
    from vitpos.models import load_model

    doc = sae_doc(sae_dir)
    surface = load_model(str(doc.get("model")), pretrained=pretrained, checkpoint=checkpoint)
    res = browse_sae(surface, sae_dir, out, images=images, top_k=top_k, doc=doc)
    c = res["counts"]
    out_console.print(f"{res['latents']} latents ({c['row']} row, {c['col']} col, {c['mixed']} mixed) over "
                      f"{res['images']} images, {res['thumbnails']} thumbnails, {res['bytes'] / 1e6:.1f} MB -> "
                      f"{res['page']}")


@app.command()
def extrapolate(
    model: str = ModelOpt,
    data: str = DataOpt,
    out: Path = OutOpt,
    images: int = typer.Option(300, "--images", min=8, max=COUNT_MAX, help="test images per size (>= 8)"),
    scales: str | None = typer.Option(None, "--scales", help="comma list of grid scales besides the training size "
                                      "(default: 1.25,1.5 for vitpos' models, 1.5,2 for timm models)"),
    seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help=f"0..{SEED_MAX}"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    head: Path | None = HeadOpt,
    progress: bool = ProgressOpt,
):
    """Probes per layer and top-1 at the training size and larger grids (APE resampled, RoPE rebuilt);
    OUT/extrapolate.json. A classifier that does not fit the data: probes only, top-1 refused."""
    from vitpos.experiments.extrapolate import run_extrapolate

    surface = _surface(model, pretrained, checkpoint, head, data)
    doc = run_extrapolate(surface, data=data, n_images=images, scales=_float_list(scales, "--scales"), seed=seed,
                          out=out, progress=progress)
    t = Table("input", "grid", "top-1", "row acc by layer", "col acc by layer")
    for sz in doc.sizes:
        t.add_row(f"{sz.img_size[0]} px", f"{sz.grid[0]}x{sz.grid[1]}", "refused" if sz.top1 is None else
                  f"{sz.top1:.3f}", " ".join(f"{v:.2f}" for v in sz.row_acc), " ".join(f"{v:.2f}" for v in sz.col_acc))
    out_console.print(t)
    note = f"top-1 refused: {doc.top1_refused}; " if doc.top1_refused else ""
    out_console.print(f"{note}rope grid {doc.rope_grid or 'n/a'} -> {out}")


def _float_list(text: str | None, flag: str) -> list[float] | None:
    from vitpos.lists import parsed_items

    if text is None:
        return None
    vals = parsed_items(text, flag, "1.5,2", float, "numbers")
    if not all(math.isfinite(v) and v > 0 for v in vals):
        raise VitposError(f"{flag} {text!r}: pass a comma list of positive numbers, e.g. 1.5,2")
    return vals


@intervene_app.command("ape-permute")
def ape_permute(
    model: str = ModelOpt,
    sae_dir: Path = typer.Option(..., "--sae", help="directory written by `vitpos sae`"),
    data: str = DataOpt,
    out: Path = OutOpt,
    images: int = typer.Option(2000, "--images", min=1, max=COUNT_MAX, help=">= 1"),
    seeds: int = typer.Option(3, "--seeds", min=1, max=100, help="number of random seeds (1..100)"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    head: Path | None = HeadOpt,
    progress: bool = ProgressOpt,
):
    """Permute the SAE's positional features across patches; OUT/ape_permute.json and .png."""
    from vitpos.experiments.ape_permute import run_ape_permute
    from vitpos.sae import SAE
    from vitpos.sae.description import load_sae_doc

    surface = _surface(model, pretrained, checkpoint, head, data, top1=True)
    if not surface.has_ape:
        raise VitposError(f"{model} has no absolute position embedding (scheme {surface.scheme}); ape-permute needs "
                          "an APE model")
    sae_doc = load_sae_doc(sae_dir)
    doc = run_ape_permute(surface, SAE.load(sae_dir), sae_doc, data=data, n_images=images, seeds=tuple(range(seeds)),
                          out=out, progress=progress).to_json()
    t = Table("variant", "top-1", "drop (points)", "features")
    t.add_row("baseline", f"{doc['baseline_top1']:.3f}", "", "")
    for v in doc["variants"]:
        r = doc[v]
        if "skipped" in r:
            t.add_row(v, "-", f"skipped: {r['skipped']}", "")
        else:
            t.add_row(v, f"{r['top1']:.3f}", f"{r['drop_points']:.1f} ± {r['drop_std']:.1f}",
                      str(r["n_features"] or ""))
    out_console.print(t)


@intervene_app.command("rope-axis")
def rope_axis(
    model: str = ModelOpt,
    data: str = DataOpt,
    out: Path = OutOpt,
    images: int = typer.Option(1000, "--images", min=2, max=COUNT_MAX, help=">= 2"),
    restore: str | None = typer.Option(None, "--restore",
                                       help="comma list of R in 1..depth-1, the first layer whose rotations come back "
                                       "(default: every one)"),
    seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help=f"0..{SEED_MAX}"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    head: Path | None = HeadOpt,
    progress: bool = ProgressOpt,
):
    """Row/col decodability per layer with RoPE axes removed and restored; OUT/rope_axis.json."""
    from vitpos.experiments.rope_axis import run_rope_axis

    surface = _surface(model, pretrained, checkpoint, head, data, top1=True)
    Rs = None if restore is None else _int_list(restore, "--restore")
    doc = run_rope_axis(surface, data=data, n_images=images, restore_points=Rs, seed=seed, out=out,
                        progress=progress).to_json()
    _print_conditions(doc)
    out_console.print(f"chance row {doc['chance_row']:.3f}, col {doc['chance_col']:.3f} -> {out}")


@intervene_app.command("rope-heads")
def rope_heads(
    model: str = ModelOpt,
    data: str = DataOpt,
    out: Path = OutOpt,
    axis: Literal["row", "col", "both"] = typer.Option("both", "--axis"),
    restore_from: int | None = typer.Option(None, "--restore-from", min=1, max=COUNT_MAX,
                                                 help="R of the restore setting, 1..depth-1 (default depth//2)"),
    top1_images: int = typer.Option(2000, "--top1-images", min=1, max=COUNT_MAX,
                                    help="test images for every head's top-1 drop"),
    top1_screen: int = typer.Option(
        500, "--top1-screen", min=0, max=COUNT_MAX,
        help="adaptive top-1: every head on this many images (whole batches), the rest only for heads still in "
             "the race; 0: every head on every image"),
    c5_ablation_heads: int = typer.Option(8, "--c5-ablation-heads", min=1, max=COUNT_MAX,
                                          help="C5's side ablations (swap, shift, jitter, rescale, mean output) on "
                                          "the primary and this many top heads by the identity drop; a number >= "
                                          "the model's heads: every head"),
    seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help=f"0..{SEED_MAX}"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    head: Path | None = HeadOpt,
    progress: bool = ProgressOpt,
):
    """Axis specialisation, rebuilding score and ablation drop of every head; OUT/rope_heads.json."""
    from vitpos.experiments.rope_heads import run_rope_heads

    surface = _surface(model, pretrained, checkpoint, head, data, top1=True)
    doc = run_rope_heads(surface, data=data, axis=axis, restore_from=restore_from, seed=seed, out=out,
                         progress=progress, n_top1_images=top1_images, top1_screen=top1_screen,
                         c5_ablation_heads=c5_ablation_heads).to_json()
    p = doc["primary_rebuilding_head"]
    out_console.print(f"primary rebuilding head L{p[0]}H{p[1]} (drop rank {doc['primary_head_drop_rank']} of "
                      f"{len(doc['layers']) * doc['num_heads']}); largest drop L{doc['largest_drop_head'][0]}H"
                      f"{doc['largest_drop_head'][1]} -> {out}" if p else f"no rebuilding head found -> {out}")
    if doc.get("top1_images_per_head"):
        counts = [m for row in doc["top1_images_per_head"] for m in row]
        out_console.print(f"adaptive top-1: every head on {doc['top1_screen_images']} images, "
                          f"{sum(m == doc['n_top1_images'] for m in counts)} of {len(counts)} heads on all "
                          f"{doc['n_top1_images']}")


@intervene_app.command("rope-prefix")
def rope_prefix(
    model: str = ModelOpt,
    data: str = DataOpt,
    out: Path = OutOpt,
    images: int = typer.Option(500, "--images", min=2, max=COUNT_MAX, help=">= 2"),
    restore_from: int | None = typer.Option(None, "--restore-from", min=1, max=COUNT_MAX,
                                            help="R of the restore conditions, 1..depth-1 (default depth//2)"),
    block_from: int = typer.Option(0, "--block-from", min=0, max=COUNT_MAX,
                                   help="first layer with patch -> prefix attention blocked, 0..depth-1 (0: all)"),
    attn_images: int = typer.Option(64, "--attn-images", min=1, max=COUNT_MAX,
                                    help="images for the clean prefix attention (>= 1)"),
    seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help=f"0..{SEED_MAX}"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    head: Path | None = HeadOpt,
    progress: bool = ProgressOpt,
):
    """Block patch -> CLS/register attention under clean, axis-removed and restore conditions; OUT/rope_prefix.json."""
    from vitpos.experiments.rope_prefix import run_rope_prefix

    surface = _surface(model, pretrained, checkpoint, head, data, top1=True)
    doc = run_rope_prefix(surface, data=data, n_images=images, restore_from=restore_from, block_from=block_from,
                          n_attn_images=attn_images, seed=seed, out=out, progress=progress).to_json()
    _print_conditions(doc)
    rec = "; ".join(f"{a} mean Rec open {_fmt(r['open']['mean_rec'])}, blocked {_fmt(r['blocked']['mean_rec'])}"
                    for a, r in doc["recovery"].items())
    mass = " ".join(f"{v:.3f}" for v in doc["prefix_attention"])
    out_console.print(f"prefix attention by layer {mass}; R={doc['restore_from']}: {rec} -> {out}")


@intervene_app.command("rope-freq")
def rope_freq(
    model: str = ModelOpt,
    data: str = DataOpt,
    out: Path = OutOpt,
    images: int = typer.Option(300, "--images", min=2, max=COUNT_MAX, help=">= 2"),
    bands: int = typer.Option(3, "--bands", min=2, help="equal-rank bands of each axis' frequencies (3: low/mid/high)"),
    windows: str | None = typer.Option(None, "--windows", help="layer windows START:STOP[,...] (layers START..STOP-1); "
                                       "default: first half, second half, all layers"),
    layers: str | None = typer.Option(None, "--layers", help="probed layers, e.g. 2,5 (default: each window's last)"),
    seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help=f"0..{SEED_MAX}"),
    pretrained: bool = PretrainedOpt,
    checkpoint: Path | None = CheckpointOpt,
    head: Path | None = HeadOpt,
    progress: bool = ProgressOpt,
):
    """One RoPE axis removed in one band of its frequencies, per layer window: that axis' probe and top-1;
    OUT/rope_freq.json."""
    from vitpos.experiments.rope_freq import parse_windows, run_rope_freq

    wins = parse_windows(windows)
    probed = None if layers is None else _int_list(layers, "--layers")
    surface = _surface(model, pretrained, checkpoint, head, data, top1=True)
    doc = run_rope_freq(surface, data=data, n_images=images, bands=bands, windows=wins, layers=probed, seed=seed,
                        out=out, progress=progress).to_json()
    t = Table("condition", "top-1 drop (pts)", f"fall of the axis' probe at layer {doc['layers'][-1]} (pts)", "share")
    for name, c in doc["conditions"].items():
        if c["axis"] is not None:
            t.add_row(name, f"{c['top1_drop_points']:+.1f}", f"{c['axis_drop_points'][-1]:+.1f}",
                      _fmt(c["share"][-1]))
    out_console.print(t)
    splits = "; ".join(f"{s['axis']} L{s['window'][0]}-{s['window'][1] - 1}: high - low "
                       f"{s['high_minus_low_axis_drop_points']:+.1f} pts ({s['position_in']})" for s in doc["splits"])
    out_console.print(f"{splits} -> {out}")


def _print_conditions(doc: dict) -> None:
    """rope-axis' and rope-prefix' conditions: top-1 and the row / col probe accuracy per layer."""
    t = Table("condition", "top-1", "row acc by layer", "col acc by layer")
    for name, c in doc["conditions"].items():
        t.add_row(name, f"{c['top1']:.3f}", " ".join(f"{v:.2f}" for v in c["row_acc"]),
                  " ".join(f"{v:.2f}" for v in c["col_acc"]))
    out_console.print(t)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


@app.command()
def run(
    out: Path = typer.Option(Path("vitpos-out"), "--out", "-o", help="output directory (results.json, report.html)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML or TOML settings; unknown keys are errors"),
    models: str | None = typer.Option(None, "--models", help="comma list of model specs (default: the shipped ones)"),
    data: str | None = typer.Option(None, "--data", "-d", help="comma list: pairs (the encoding zoo; the "
                            "default), shapes (the default of --quick), fashion, natural, tiles, imagefolder:PATH"),
    quick: bool = typer.Option(False, "--quick", help="small image counts: a minutes-long smoke run"),
    force: bool = typer.Option(False, "--force", help="recompute every stage"),
    pretrained: bool = typer.Option(False, "--pretrained", help="timm models: hub weights"),
    seed: int | None = typer.Option(None, "--seed"),
    model_seeds: int | None = typer.Option(None, "--model-seeds", help="shipped models per encoding: training "
                                           "seeds 0..N-1, N in 1..3 (default 1)"),
    top1_screen: int | None = typer.Option(
        None, "--top1-screen", min=0, max=COUNT_MAX,
        help="rope_heads' adaptive top-1: every head on this many images, the rest only for heads still in the "
             "race (default 500, rope_heads.top1_screen_images); 0: every head on every image"),
    progress: bool = ProgressOpt,
    plan: bool = typer.Option(False, "--plan", help="print what the run would compute per model and stage (image "
                              "forwards, block evaluations, probe fits, estimated time) and exit; writes nothing"),
):
    """Run the whole study (eval, probes, SAE, APE and RoPE tests) and write results.json + report.html."""
    from vitpos.report.html import render_report
    from vitpos.study.config import load_config
    from vitpos.study.run import run_study

    overrides = {"models": _spec_list(models, "--models", "builtin:ape"), "data": _spec_list(data, "--data", "shapes"),
                 "seed": seed, "pretrained": pretrained or None, "model_seeds": model_seeds,
                 "rope_heads": None if top1_screen is None else {"top1_screen_images": top1_screen}}
    cfg = load_config(config, overrides, quick)
    if plan:
        _print_plan(out, cfg, quick, force)
        return
    cmd = "vitpos run " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "vitpos run"
    t0 = __import__("time").time()
    results = run_study(out, cfg, quick=quick, force=force, progress=progress, reproduce=cmd,
                        log=lambda msg: console.print(msg, highlight=False, markup=False, soft_wrap=True))
    render_report(results, out)
    t = Table("claim", "verdict", "headline per model family (95% interval)", "in one sentence")
    for c in results.summary.claims:
        t.add_row(c.id, c.verdict, escape("\n".join(h.text() for h in c.headlines)), escape(c.sentence))
    out_console.print(t)
    out_console.print(f"per-model numbers: folded under each claim in {out}/report.html", highlight=False)
    out_console.print(f"done in {__import__('time').time() - t0:.0f} s -> {out}/results.json, {out}/report.html")


def _spec_list(text: str | None, flag: str, example: str) -> list[str] | None:
    """A comma list option: None when not given; empty, with an empty entry or a repeat is an error, not the
    default."""
    from vitpos.lists import comma_items

    if text is None:
        return None
    if not text.strip():
        raise VitposError(f"{flag} is empty; name at least one, e.g. {flag} {example} (or leave {flag} out for the "
                          "defaults)")
    return comma_items(text, flag, example)


def _print_plan(out: Path, cfg, quick: bool, force: bool) -> None:
    from vitpos.study.run import plan_study

    study_plan = plan_study(out, cfg, quick=quick, force=force)
    header = ("model", "stage", "image-forwards", "block evals", "probe fits", "SAE tokens", "est.", "note")
    rows = []
    for s in study_plan.stages:
        p = s.plan
        if p is None:
            rows.append((s.model, s.stage, "", "", "", "", s.status, s.note))
            continue
        est = "" if s.seconds is None else f"{s.seconds:,.0f} s"
        rows.append((s.model, s.stage, f"{p.forwards:,}", f"{p.blocks:,}", f"{p.fits:,}", f"{p.sae_tokens:,}", est,
                     s.note))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for r in [header, *rows]:  # plain columns: the plan is meant to be pasted and diffed
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=False))]
        out_console.print("  ".join(cells + [r[-1]]).rstrip(), soft_wrap=True)
    for model, problem in study_plan.data_problems.items():
        out_console.print(f"warning: {model}: the stages would stop: {_one_line(problem)}", soft_wrap=True)
    out_console.print(study_plan.summary(), soft_wrap=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; every expected failure ends as one `error: ...` line on stderr and exit code 2,
    and leaves --out as the command found it (what it created there is removed; an interrupt keeps
    it, so that rerunning the command resumes)."""
    from vitpos.errors import OutputBusyError
    from vitpos.io import OutputGuard

    args = list(sys.argv[1:] if argv is None else argv)
    guard = OutputGuard(None)
    try:
        guard = OutputGuard(_out_arg(args), keep=_resume_points(args))
        code = app(args=args, standalone_mode=False)
        # typer (0.29 here) turns Ctrl-C into Exit(130) and, outside standalone mode, *returns* an Exit's
        # code instead of raising it (every command returns None): without this, an interrupt was a
        # silent exit 0
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            raise KeyboardInterrupt if code == 130 else SystemExit(code)
    except OutputBusyError as e:  # another process writes there: leave everything alone
        _fail(_one_line(str(e)))
    except VitposError as e:
        _fail(_one_line(str(e)) + _kept(guard.restore()))
    except KeyboardInterrupt:
        console.print("interrupted; rerun the same command to resume", highlight=False, markup=False)
        sys.exit(130)
    except OSError as e:  # full disk, permission, a path that is a file: the environment, not a bug
        kept = _kept(guard.restore())
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        _fail(f"{e.strerror or e}{where}; check that the output location is a writable directory with free space"
              + kept)
    except Exception as e:
        if type(e).__name__ not in ("Exit", "NoArgsIsHelpError", "Abort"):
            guard.restore()
        _usage_or_raise(e)


def _resume_points(args: list[str]) -> tuple[str, ...]:
    """What a failed command keeps in --out: `vitpos run`'s finished stages (OUT/stages, their files under
    OUT/artifacts), which a rerun resumes from; every other command's output is removed."""
    command = next((a for a in args if not a.startswith("-")), None)
    return ("stages", "artifacts") if command == "run" else ()


def _kept(paths: list[Path]) -> str:
    """The error line's tail when a failed run kept its finished stages."""
    if not paths:
        return ""
    return f"; the stages finished before it are kept ({paths[0]}): rerun the same command to resume from them"


def _out_arg(args: list[str]) -> Path | None:
    """The --out / -o folder named on the command line (None: none); an empty one is refused."""
    value = None
    for i, a in enumerate(args):
        if a == "--":
            break
        if a in ("--out", "-o") and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith("--out="):
            value = a[len("--out="):]
        elif a.startswith("-o") and len(a) > 2 and not a.startswith("--"):
            value = a[2:]
    if value is not None and not value.strip():
        raise VitposError("--out is empty; name an output folder, e.g. --out results")
    if value is None and args[:1] == ["run"]:
        value = "vitpos-out"  # run's default
    if value is not None and Path(value).is_symlink() and not Path(value).exists():
        target = os.readlink(value)
        raise VitposError(f"--out {value} is a link to {target}, which does not exist; create {target} "
                          "or pass another --out")
    return Path(value) if value is not None else None


def _usage_or_raise(e: Exception) -> None:
    """typer's own errors (it vendors click and does not re-export their classes: matched by name)."""
    kind = type(e).__name__
    ctx = getattr(e, "ctx", None)
    if kind == "NoArgsIsHelpError" and ctx is not None:  # bare `vitpos` / `vitpos intervene`: the help
        out_console.print(ctx.get_help())
        sys.exit(0)
    if kind == "Abort":
        console.print("interrupted; rerun the same command to resume", highlight=False, markup=False)
        sys.exit(130)
    if kind == "Exit":
        sys.exit(getattr(e, "exit_code", 0))
    if hasattr(e, "format_message") and hasattr(e, "exit_code"):  # UsageError, BadParameter, NoSuchOption...
        cmd = ctx.command_path if ctx is not None else "vitpos"
        _fail(f"{_one_line(e.format_message())} (see `{cmd} --help`)")  # type: ignore[attr-defined]
    if kind == "SafetensorError":  # safetensors reports a full disk or a truncated file as its own type
        _fail(f"could not read or write a .safetensors file ({_one_line(str(e))}); check free disk space and "
              "that the file is complete")
    raise e


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
