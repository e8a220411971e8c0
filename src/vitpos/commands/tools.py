"""The tool commands: `train`, `zoo list / train`, `eval`, `head`, `models`, `capture` and `browse`
(the per-experiment commands are `vitpos.commands.experiments`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import typer
from rich.table import Table

from vitpos.commands.options import (
    AMP,
    CHECKPOINT,
    COUNT_MAX,
    DATA,
    DEVICE,
    HEAD,
    MODEL,
    OUT,
    PRETRAINED,
    PROGRESS,
    load_surface,
    seed_option,
)
from vitpos.commands.printing import out_console
from vitpos.errors import VitposError


def _positive_finite(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a positive finite number (got {value})")
    return value


def _sites(text: str) -> str:
    """--sites: a comma list without empty items or repeats, normalised ('a, b' -> 'a,b')."""
    from vitpos.lists import comma_items

    return ",".join(comma_items(text, "--sites", "blocks.1.resid_post"))


def train(
    pe: str = typer.Option(..., "--pe", help="ape | ape-sincos | rope-axial | rope-mixed | rope-ape | none"),
    out: Path = OUT,
    data: str = DATA,
    epochs: int | None = typer.Option(None, "--epochs", min=1, max=1000, help="default 3, or 2 with --quick (1..1000)"),
    seed: int = seed_option(),
    batch_size: int = typer.Option(128, "--batch-size", min=1, max=COUNT_MAX, help=">= 1"),
    lr: float = typer.Option(1e-3, "--lr", callback=_positive_finite, help="AdamW peak learning rate (> 0, finite)"),
    quick: bool = typer.Option(False, "--quick", help="seconds-long smoke run (tiny model, tiny data)"),
    force: bool = typer.Option(False, "--force", help="discard an earlier run in --out"),
    progress: bool = PROGRESS,
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


def zoo_train(
    name: str = typer.Argument(..., help="a member, e.g. pairs-rope-axial or pairs-ape-seed1 (see `vitpos zoo list`)"),
    out: Path = OUT,
    force: bool = typer.Option(False, "--force", help="discard an earlier run in --out"),
    progress: bool = PROGRESS,
):
    """Retrain one zoo member with its exact recipe (deterministic on CPU with one thread; resumable)."""
    from vitpos import zoo

    zoo.parse(name)  # one clear error for an unknown member, before any work
    from vitpos.io import require_out_dir

    require_out_dir(out)
    m = zoo.train_member(name, out, progress=progress, force=force)
    out_console.print(f"{name}: test top-1 {m['test_top1']:.4f} ({m['epochs']} epochs, {m['seconds']:.0f} s) -> {out}")


def eval_cmd(
    model: str = MODEL,
    data: str = DATA,
    split: Literal["train", "val", "test"] = typer.Option("test", "--split"),
    out: Path | None = typer.Option(None, "--out", "-o"),
    pretrained: bool = PRETRAINED,
    checkpoint: Path | None = CHECKPOINT,
    limit: int | None = typer.Option(None, "--limit", min=1, max=COUNT_MAX,
                                     help="evaluate on the first N images (>= 1)"),
    head: Path | None = HEAD,
    progress: bool = PROGRESS,
):
    """Top-1 accuracy of a model on a split; writes OUT/eval.json with test_top1."""
    from vitpos.analysis.forward import evaluate
    from vitpos.data.resolve import dataset_for
    from vitpos.io import write_json

    if limit is not None and limit < 1:
        raise VitposError(f"--limit must be at least 1 (got {limit})")
    surface = load_surface(model, pretrained, checkpoint, head, data, top1=True)
    ds = dataset_for(surface, data, split, limit=limit)
    rep = evaluate(surface, ds, progress=progress)
    doc = {"model": model, "data": data, "split": split, f"{split}_top1": rep["top1"], **rep}
    if head is not None:
        doc["head"] = str(head)
    if out is not None:
        write_json(Path(out) / "eval.json", doc)
    out_console.print(f"{model} on {data}/{split}: top-1 {rep['top1']:.4f} (n={rep['n']})")


def head_cmd(
    model: str = MODEL,
    data: str = DATA,
    out: Path = OUT,
    images: int = typer.Option(4000, "--images", min=2, max=COUNT_MAX,
                               help="train-split images to fit on (>= 2); val and test "
                               "splits: images // 4 each"),
    seed: int = seed_option(),
    pretrained: bool = PRETRAINED,
    checkpoint: Path | None = CHECKPOINT,
    progress: bool = PROGRESS,
):
    """Fit a linear classifier on the model's pooled pre-logit features: OUT/head.safetensors + head.json.

    For backbones without a classifier (DINOv2/v3, EVA-02, CLIP towers) or one for other data;
    pass OUT as --head to eval, sae, intervene (and probe), or under `heads:` in a run config."""
    from vitpos.analysis.heads import fit_head
    from vitpos.io import require_out_dir

    require_out_dir(out)
    surface = load_surface(model, pretrained, checkpoint)
    h = fit_head(surface, data=data, n_images=images, seed=seed, out=out, progress=progress).info
    out_console.print(f"head on {model} pooled features, {data}: val top-1 {h.val_top1:.4f}, test top-1 "
                      f"{h.test_top1:.4f} (l2 {h.l2:g}, {h.n_train_images} train images, {h.num_classes} classes) "
                      f"-> {out}")


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


def capture(
    model: str = MODEL,
    sites: str = typer.Option("resid_post", "--sites", help="comma list: resid_post (all layers) or blocks.L.site"),
    data: str = DATA,
    split: Literal["train", "val", "test"] = typer.Option("train", "--split"),
    out: Path = OUT,
    limit: int | None = typer.Option(None, "--limit", min=1, max=COUNT_MAX, help="first N images only (>= 1)"),
    batch_size: int = typer.Option(128, "--batch-size", min=1, max=COUNT_MAX, help=">= 1"),
    dtype: Literal["float32", "float16", "bfloat16"] = typer.Option("float32", "--dtype", help="storage dtype"),
    shard_images: int = typer.Option(256, "--shard-images", min=1, max=COUNT_MAX, help=">= 1"),
    force: bool = typer.Option(False, "--force"),
    pretrained: bool = PRETRAINED,
    checkpoint: Path | None = CHECKPOINT,
    progress: bool = PROGRESS,
    device: str = DEVICE,
    amp: str = AMP,
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
        surface = load_surface(model, pretrained, checkpoint)
        info = capture_to_store(surface, data, split, sites, out, limit=limit, batch_size=batch_size, dtype=dtype,
                                shard_images=shard_images, force=force, progress=progress, device=dev, amp=amp,
                                keep_prefix=keep_prefix)
    if env.is_main:
        ranks = f" on {env.world_size} ranks" if env.enabled else ""
        out_console.print(f"captured {info['num_images']} images x {len(info['sites'])} sites{ranks} -> {out}")


def browse(
    sae_dir: Path = typer.Argument(..., help="the --out folder of `vitpos sae` (sae.json + sae.safetensors)"),
    out: Path = OUT,
    images: int | None = typer.Option(None, "--images", min=2, help="held-out test images to browse with (>= 2; "
                                      "default: as many as the SAE was scored on)"),
    top_k: int = typer.Option(8, "--top-k", min=1, help="top activating images shown per latent (>= 1)"),
    pretrained: bool = PRETRAINED,
    checkpoint: Path | None = CHECKPOINT,
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



def register(app: typer.Typer, zoo_app: typer.Typer) -> None:
    """Add the tool commands to `app` and its `zoo` group."""
    app.command()(train)
    zoo_app.command("list")(zoo_list)
    zoo_app.command("train")(zoo_train)
    app.command("eval")(eval_cmd)
    app.command("head")(head_cmd)
    app.command()(models)
    app.command()(capture)
    app.command()(browse)
