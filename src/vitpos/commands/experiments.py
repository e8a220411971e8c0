"""The per-experiment commands: `probe`, `sae`, `extrapolate` and `intervene ape-permute / rope-axis /
rope-heads / rope-prefix / rope-freq`. Each one's options are its experiment's settings (their
defaults, bounds and help: `vitpos.commands.options`) and the shared option group; what only the
command takes (where to read an SAE, the device, a training store) is a typed subclass of those
settings below, so that a default lives in one place."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import Field

from vitpos.commands.options import Common, settings_command
from vitpos.commands.printing import (
    out_console,
    print_ape_permute,
    print_conditions,
    print_extrapolate,
    print_probe,
    print_rope_freq,
    print_rope_heads,
    print_rope_prefix,
    print_sae,
)
from vitpos.errors import VitposError
from vitpos.experiments.ape_permute import ApePermuteSettings
from vitpos.experiments.extrapolate import ExtrapolateSettings
from vitpos.experiments.probe import ProbeSettings
from vitpos.experiments.rope_axis import RopeAxisSettings
from vitpos.experiments.rope_freq import RopeFreqSettings, parse_windows
from vitpos.experiments.rope_heads_plan import RopeHeadsSettings
from vitpos.experiments.rope_prefix import RopePrefixSettings
from vitpos.experiments.sae_settings import SAESettings
from vitpos.study.config import SEED_MAX

DEVICE_HELP = "auto | cpu | cuda (cuda:N); under torchrun each rank takes cuda:LOCAL_RANK"
AMP_HELP = "autocast: none | bf16 | fp16 (fp16 needs CUDA)"


class ProbeOptions(ProbeSettings):
    """`vitpos probe`: the probe stage's settings, the sites and where to run."""

    sites: str = Field(default="resid_post", description="comma list: resid_post (all layers) or blocks.L.site")
    device: str = Field(default="auto", description=DEVICE_HELP)
    amp: str = Field(default="none", description=AMP_HELP)


class SAEOptions(SAESettings):
    """`vitpos sae`: the sae stage's settings (its layer given) and the training run's."""

    store: Path | None = Field(default=None, description="train on this `vitpos capture` store (train split, same "
                               "model and site) instead of capturing into OUT/acts/; --images is then unused")
    batch_tokens: int = Field(default=4096, ge=1, description="tokens per training step")
    buffer_tokens: int = Field(default=65536, ge=0, description="shuffle buffer (tokens held in memory while "
                               "streaming; 0 = none)")
    checkpoint_every: int = Field(default=500, ge=0, description="save the training state to OUT/train-state/ every "
                                  "N steps (0: only at the end); a rerun resumes from it")
    stability_seed: int | None = Field(default=None, ge=0, le=SEED_MAX, description="also train an SAE with this "
                                       "seed on the same tokens and report the share of decoder directions it "
                                       "reproduces (cos >= 0.9, one-to-one matching); doubles the training time")
    force: bool = Field(default=False, description="retrain, discarding an earlier run in --out")
    device: str = Field(default="auto", description=DEVICE_HELP)
    amp: str = Field(default="none", description=AMP_HELP)


class ApePermuteOptions(ApePermuteSettings):
    """`vitpos intervene ape-permute`: the stage's settings and the SAE to permute."""

    sae_dir: Path = Field(description="directory written by `vitpos sae`")


def probe(c: Common, s: ProbeOptions) -> None:
    from vitpos.experiments.probe import run_probe
    from vitpos.lists import comma_items
    from vitpos.results.probe import probe_sites

    sites = ",".join(comma_items(s.sites, "--sites", "blocks.1.resid_post"))
    result = run_probe(c.surface(), data=c.data, sites=sites, n_images=s.images, seed=c.seed, out=c.out,
                       progress=c.progress, device=s.device, amp=s.amp)
    print_probe(next(iter(probe_sites(result).values())).to_json(), c.out)


def sae(c: Common, s: SAEOptions) -> None:
    """Train an SAE on one layer's patch tokens, streamed from an activation store."""
    from vitpos.experiments.sae_run import run_sae
    from vitpos.runtime.device import autocast_dtype
    from vitpos.runtime.dist import barrier, distributed
    from vitpos.runtime.options import RunOptions

    if s.stability_seed is not None and s.stability_seed == c.seed:
        raise VitposError(f"--stability-seed must differ from --seed (both {c.seed}); e.g. --stability-seed "
                          f"{c.seed + 1}")
    assert s.layer is not None  # a required option
    with distributed(s.device) as (env, dev):
        autocast_dtype(s.amp, dev)
        state_dir = c.out / "train-state"
        if s.force and env.is_main and (state_dir / "train-state.safetensors").exists():
            (state_dir / "train-state.safetensors").unlink()
        barrier()
        # The options carry device/amp/checkpointing down to train_sae; under torchrun every rank runs
        # the same command (same global batches, DDP inside train_sae; capture into OUT/acts is sharded).
        key = {"model": c.model, "checkpoint": str(c.checkpoint), "layer": s.layer, "site": s.site, "data": c.data,
               "store": str(s.store), "images": s.images, "batch_tokens": s.batch_tokens,
               "buffer_tokens": s.buffer_tokens}
        options = RunOptions(device=str(dev), amp=s.amp, checkpoint_dir=str(state_dir),
                             checkpoint_every=s.checkpoint_every, checkpoint_key=key, restart_on_mismatch=True)
        doc, _ = run_sae(c.surface(), s.layer, site=s.site, data=c.data, arch=s.arch, k=s.k, expansion=s.expansion,
                         n_train_images=s.images, n_eval_images=s.eval_images, epochs=s.epochs, seed=c.seed,
                         out=c.out, progress=c.progress and env.is_main, force=s.force, store=s.store, lr=s.lr,
                         batch_tokens=s.batch_tokens, buffer_tokens=s.buffer_tokens, options=options,
                         high_norm=s.high_norm, stability_seed=s.stability_seed, include_special=s.include_special,
                         claim_seeds=s.claim_seeds)
    if env.is_main:
        print_sae(doc, c.out)


def extrapolate(c: Common, s: ExtrapolateSettings) -> None:
    from vitpos.experiments.extrapolate import run_extrapolate

    doc = run_extrapolate(c.surface(), data=c.data, n_images=s.images, scales=s.scales, seed=c.seed, out=c.out,
                          progress=c.progress)
    print_extrapolate(doc, c.out)


def ape_permute(c: Common, s: ApePermuteOptions) -> None:
    from vitpos.experiments.ape_permute import run_ape_permute_seeds
    from vitpos.sae.description import load_sae_doc

    surface = c.surface(top1=True)
    if not surface.has_ape:
        raise VitposError(f"{c.model} has no absolute position embedding (scheme {surface.scheme}); ape-permute "
                          "needs an APE model")
    sae_doc = load_sae_doc(s.sae_dir)
    # the SAE seeds `vitpos sae --claim-seeds` trained beside it are permuted too, and pooled (`seed_pool`)
    doc = run_ape_permute_seeds(surface, s.sae_dir, sae_doc, data=c.data, n_images=s.images,
                                seeds=tuple(range(s.seeds)), out=c.out, progress=c.progress).to_json()
    print_ape_permute(doc)


def rope_axis(c: Common, s: RopeAxisSettings) -> None:
    from vitpos.experiments.rope_axis import run_rope_axis

    doc = run_rope_axis(c.surface(top1=True), data=c.data, n_images=s.images, restore_points=s.restore, seed=c.seed,
                        out=c.out, progress=c.progress, readout_images=s.readout_images,
                        readout_layer_list=s.readout_layers).to_json()
    print_conditions(doc)
    out_console.print(f"chance row {doc['chance_row']:.3f}, col {doc['chance_col']:.3f} -> {c.out}")


def rope_heads(c: Common, s: RopeHeadsSettings) -> None:
    from vitpos.experiments.rope_heads import run_rope_heads

    doc = run_rope_heads(c.surface(top1=True), data=c.data, axis=s.axis, restore_from=s.restore_from,
                         n_probe_images=s.probe_images, n_top1_images=s.top1_images, n_attn_images=s.attn_images,
                         seed=c.seed, out=c.out, progress=c.progress, top1_screen=s.top1_screen_images,
                         sweep_restore=s.sweep_restore, c5_ablation_heads=s.c5_ablation_heads).to_json()
    print_rope_heads(doc, c.out)


def rope_prefix(c: Common, s: RopePrefixSettings) -> None:
    from vitpos.experiments.rope_prefix import run_rope_prefix

    doc = run_rope_prefix(c.surface(top1=True), data=c.data, n_images=s.images, restore_from=s.restore_from,
                          block_from=s.block_from, n_attn_images=s.attn_images, seed=c.seed, out=c.out,
                          progress=c.progress).to_json()
    print_rope_prefix(doc, c.out)


def rope_freq(c: Common, s: RopeFreqSettings) -> None:
    from vitpos.experiments.rope_freq import run_rope_freq

    doc = run_rope_freq(c.surface(top1=True), data=c.data, n_images=s.images, bands=s.bands, windows=s.windows,
                        layers=s.layers, seed=c.seed, out=c.out, progress=c.progress).to_json()
    print_rope_freq(doc, c.out)


def register(app: typer.Typer, intervene: typer.Typer) -> None:
    """Add the per-experiment commands to `app` and its `intervene` group."""
    settings_command(app, "probe", ProbeOptions, probe, help="Linear row/column probes per layer: OUT/probe.json "
                     "and OUT/probe.png.")
    settings_command(app, "sae", SAEOptions, sae, required=("layer",),
                     skip=("data", "seeds", "expansions", "stability", "browse"),
                     help="Train an SAE on one layer's patch tokens, streamed from an activation store; "
                     "OUT/sae.safetensors, sae.json, features.png.")
    settings_command(app, "extrapolate", ExtrapolateSettings, extrapolate,
                     help="Probes per layer and top-1 at the training size and larger grids (APE resampled, RoPE "
                     "rebuilt); OUT/extrapolate.json. A classifier that does not fit the data: probes only.")
    settings_command(intervene, "ape-permute", ApePermuteOptions, ape_permute, flags={"sae_dir": ("--sae",)},
                     required=("sae_dir",), seed=False,
                     help="Permute the SAE's positional features across patches; OUT/ape_permute.json and .png.")
    settings_command(intervene, "rope-axis", RopeAxisSettings, rope_axis,
                     help="Row/col decodability per layer with RoPE axes removed and restored; OUT/rope_axis.json.")
    settings_command(intervene, "rope-heads", RopeHeadsSettings, rope_heads,
                     flags={"top1_screen_images": ("--top1-screen-images", "--top1-screen")},
                     help="Axis specialisation, rebuilding score and ablation drop of every head; "
                     "OUT/rope_heads.json.")
    settings_command(intervene, "rope-prefix", RopePrefixSettings, rope_prefix,
                     help="Block patch -> CLS/register attention under clean, axis-removed and restore conditions; "
                     "OUT/rope_prefix.json.")
    settings_command(intervene, "rope-freq", RopeFreqSettings, rope_freq, parsers={"windows": parse_windows},
                     help="One RoPE axis removed in one band of its frequencies, per layer window: that axis' probe "
                     "and top-1; OUT/rope_freq.json.")
