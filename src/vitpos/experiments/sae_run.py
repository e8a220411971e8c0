"""E2 (C1): an SAE on one layer's patch tokens, its positional features, and whether they are causal.

Training streams from an on-disk activation store (``vitpos.store``): either one given with
``store=`` (made by ``vitpos capture``; checked against the model, site and data) or the train split
captured by ``run_sae`` itself into ``OUT/acts/`` (resumable; a temp folder when there is no OUT).
Memory during training is the store reader's bounded shuffle buffer plus one batch, whatever the
number of training images. Held-out metrics, feature scores and the causal check run on the
``n_eval_images`` test images; their capture keeps only what those read (``evaluate_sae``): the SAE
site through an on-disk store, the later layers' probe tokens, so memory does not grow with layers.

Causal check (METHODS): subtract the row features' contribution at the SAE's layer and re-read
position downstream with the clean model's probes: row accuracy should drop while column holds;
selectivity = d_row / (d_row + d_col) (col features mirrored). Uncertainty: the probes' test images
are resampled (paired: clean and ablated on the same resample; each image's token accuracy, averaged
over the later layers) for 95 % intervals of both drops and the selectivity (`selectivity_intervals`).
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch

from vitpos.analysis.probes import DEFAULT_L2_GRID
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.experiments import sae_run_section
from vitpos.experiments.base import Done, Experiment, SplitSizes, StageInput, StagePlan
from vitpos.experiments.checks import check_data, check_expansions
from vitpos.experiments.common import SWEEP_TRAIN_TOKENS, sae_config, sweep_batch
from vitpos.experiments.sae_causal import REMOVALS, RemovalImages, pool_causal
from vitpos.experiments.sae_heldout import HELD_OUT_PASSES, HeldOut, evaluate_sae
from vitpos.experiments.sae_seeds import run_sweep, sweep_grid
from vitpos.experiments.sae_settings import SAESettings, SAEStageSettings
from vitpos.experiments.sae_store import _capture_train_store, open_train_store
from vitpos.io import artifact_path, read_json, relative_artifact, write_json
from vitpos.models.surface import ModelSurface, Site
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.sae_run import INTERVAL_SOURCES, CausalCheck, SAEResult, SAESeedPool, SAESeedRun, SAETraining
from vitpos.runtime.options import RunOptions
from vitpos.sae import SAE, SAEConfig, TrainSettings, train_sae
from vitpos.sae.special import (
    OUTLIER_K,
    SpecialTokens,
    drop_outliers,
    mix_prefix,
    norm_threshold,
    special_token_report,
    store_norms,
)
from vitpos.sae.stream import DEFAULT_BUFFER_TOKENS, store_batches
from vitpos.sae.train import default_lr

EDITABLE_SAE_SITES = ("resid_pre", "resid_post", "attn_out", "mlp_out")
DENSE_THRESHOLD = 0.1  # fires on > 10 % of held-out tokens: "dense" (sensitivity at 5 % and 20 % alongside)
DENSE_SENSITIVITY = (0.05, 0.1, 0.2)
STABLE_COS = 0.9  # a latent is reproduced by another seed when its matched decoder direction has cos >= 0.9
# The SAE stage's version: its cache key (SAEExperiment.version) and the run key an SAE dir is
# reused under (`run_sae`), so bumping it retrains the SAE rather than reloading an older one.
# 2 (issue 28): the causal check adds the removal controls and top-1, the held-out scoring the eta2 null;
# 3 (issue 48): the extra SAE seeds C1 reads (`claim_seeds`), each with its own causal check, pooled; 4 (issue 47
# item 3): the conjunction latents of every SAE seed (`conj_features`) and their eta2 null (no older number moves)
SAE_VERSION = 4
SEEDS_DIR = "seeds"  # the extra SAE seeds' weights: <SAE folder>/seeds/seed<k>


def choose_sae_layer(probe_doc: dict, depth: int) -> int:
    """The layer whose patch tokens hold the most of BOTH axes (max of min(row, col) accuracy),
    excluding the last layer so the causal check has downstream layers; earliest on ties."""
    accs = [min(r, c) for r, c in zip(probe_doc["row_acc"], probe_doc["col_acc"], strict=True)]
    layers = probe_doc["layers"]
    cands = [(accs[i], -layer) for i, layer in enumerate(layers) if layer < depth - 1] or [(accs[0], -layers[0])]
    return -max(cands)[1]


@dataclass(frozen=True)
class SAEJob:
    """What one `run_sae` trains: the checked settings, the SAE's config and the given store (None:
    run_sae captures the train split itself)."""

    surface: ModelSurface
    site: Site
    data: Any
    cfg: SAEConfig
    lr: float
    epochs: int
    batch_tokens: int
    buffer_tokens: int | None
    seed: int
    n_train_images: int
    high_norm: float | None
    include_special: bool
    stability_seed: int | None
    given: Any  # the ActivationStore of `store=`, or None
    with_prefix: bool  # prefix tokens are mixed into the training batches
    causal_data: Any = None  # the causal check's images when not `data` (None: `data`'s held-out images)
    # held-out images the result was measured on (run_sae sets it): a finished run measured on another
    # number is not served (the key once named the training only, so a changed eval size was)
    n_eval_images: int | None = None
    claim_seeds: int = 1  # SAE seeds C1 reads: this one and seed + 1 .. seed + claim_seeds - 1 (issue 48)

    def extra_seeds(self) -> list[int]:
        """The extra SAE seeds C1 reads beside `seed`."""
        return [self.seed + j for j in range(1, self.claim_seeds)]

    def run_key(self) -> dict[str, Any]:
        """The settings that identify this SAE: a finished run under the same key is reused."""
        s, given, high_norm = self.surface, self.given, self.high_norm
        return {"version": SAE_VERSION, "model": s.spec, "weights": s.weights_digest(), "layer": self.site.layer,
                "site": self.site.name, "data": data_name(self.data), "sae": self.cfg.model_dump(),
                "n_train_images": given.num_images if given is not None else self.n_train_images,
                "epochs": self.epochs, "batch_tokens": self.batch_tokens, "lr": self.lr,
                "buffer_tokens": self.buffer_tokens,
                "train_store": str(given.dir.resolve()) if given is not None else "own capture",
                **({"high_norm": high_norm} if high_norm is not None else {}),
                **({"head": s.head.digest()} if s.head is not None else {}),
                "special_tokens": "included" if self.include_special else
                f"outliers excluded (norm > {high_norm or OUTLIER_K:g}x median)",
                **({"stability_seed": self.stability_seed} if self.stability_seed is not None else {}),
                **({"causal_data": data_name(self.causal_data)} if self.causal_data is not None else {}),
                **({"held_out_images": self.n_eval_images} if self.n_eval_images is not None else {}),
                **({"claim_seeds": self.claim_seeds} if self.claim_seeds > 1 else {})}


def sae_job(surface: ModelSurface, layer: int, site: str, data, arch: str, k: int, expansion: int,
            n_train_images: int, epochs: int, batch_tokens: int, seed: int, store: str | Path | None,
            buffer_tokens: int | None, lr: float | None, high_norm: float | None, stability_seed: int | None,
            include_special: bool) -> SAEJob:
    """run_sae's settings checked (one VitposError each) into the job it trains."""
    if site not in EDITABLE_SAE_SITES:
        raise VitposError(f"SAE site must be one of {', '.join(EDITABLE_SAE_SITES)} (got {site!r})")
    for what, value in (("seed", seed), ("stability seed", stability_seed)):
        # the CLI takes 0..SEED_MAX; derived seeds (run seed + 1, sweep seeds) may lie above it, never outside int64
        if value is not None and not 0 <= value < 2**63:
            raise VitposError(f"the SAE {what} {value} is outside 0..2^63-1; pass a seed in 0..2^32-1")
    if not 0 <= layer < surface.depth:
        raise VitposError(f"--layer {layer} is outside 0..{surface.depth - 1}")
    cfg = sae_config(surface, arch, k, expansion, seed)
    lr = default_lr(cfg.d_sae) if lr is None else float(lr)
    s = Site(layer, site)
    given = open_train_store(store, surface, s, data) if store is not None else None
    with_prefix = include_special and surface.num_prefix_tokens > 0
    if with_prefix and given is not None and not given.has_prefix:
        raise VitposError(f"--include-special trains on the prefix tokens too, but --store {given.dir} has none; "
                          "recapture it with `vitpos capture ... --keep-prefix` or drop --include-special")
    n_images = given.num_images if given is not None else n_train_images
    if n_images * surface.num_patches < batch_tokens:
        need = -(-batch_tokens // surface.num_patches)
        raise VitposError(f"{n_images} training images give {n_images * surface.num_patches} patch tokens, fewer "
                          f"than one training batch (--batch-tokens {batch_tokens}); use at least {need} images or a "
                          "smaller --batch-tokens")
    return SAEJob(surface, s, data, cfg, lr, epochs, batch_tokens, buffer_tokens, seed, n_train_images, high_norm,
                  include_special, stability_seed, given, with_prefix)


def _finished(out: Path | None, job: SAEJob) -> tuple[SAEResult, SAE] | None:
    """The result and SAE a finished run under `job`'s key left in `out` (None: none there, or damaged)."""
    if out is None or not (out / "sae.json").exists() or not (out / "sae.safetensors").exists():
        return None
    try:  # a damaged or other run's sae.json / weights: trained again (and rewritten)
        doc = read_json(out / "sae.json")
        if isinstance(doc, dict) and doc.get("run") == job.run_key():
            _load_seeds(out, doc)
            sae_prev = SAE.load(out)
            if sae_prev.model_weights in (None, job.surface.weights_digest()):
                return SAEResult.model_validate(doc), sae_prev
    except (VitposError, ValueError, KeyError, TypeError):
        pass
    return None


def _load_seeds(out: Path, doc: dict) -> None:
    """Load every extra SAE seed that sae.json names from `out`: VitposError when one is missing or damaged,
    so `_finished` trains the run again instead of what reads it refusing a truncated seed later."""
    pool = doc.get("seed_pool") or {}
    for r in pool.get("runs", []):
        SAE.load(out / r["dir"])


@dataclass(frozen=True)
class Trained:
    """What `train_job` leaves: the SAE (and the stability seed's), its training log and how it streamed."""

    sae: SAE
    other: SAE | None  # the stability seed's SAE (None: not trained)
    tokens: int
    seconds: float
    training: SAETraining
    outlier_threshold: float  # norm above which a patch token is an outlier
    cut: float | None  # the threshold training and the splice apply (None: outliers included)
    excluded: int  # training tokens left out as outliers (per epoch)
    extra: dict[int, SAE] = field(default_factory=dict)  # the extra SAE seeds C1 reads, by seed (issue 48)


def train_job(job: SAEJob, out: Path | None, keep_acts: bool, progress: bool, force: bool,
              options: RunOptions | None) -> Trained:
    """Train `job`'s SAE (and its stability seed's) streaming from its store, or from the train split
    captured into out/acts (kept when `keep_acts`) or a temp folder."""
    s, given, seed = str(job.site), job.given, job.seed
    with tempfile.TemporaryDirectory(prefix="vitpos-sae-acts-") as tmp:
        if given is not None:
            train_store = given
        else:
            acts_dir = out / "acts" if out is not None and keep_acts else Path(tmp) / "acts"
            train_store = _capture_train_store(job.surface, job.site, job.data, job.n_train_images, acts_dir,
                                               progress, force, options, keep_prefix=job.with_prefix)
        batches = store_batches(train_store, s, job.batch_tokens, seed=seed, buffer_tokens=job.buffer_tokens)
        norms = store_norms(train_store, s)
        thr = norm_threshold(norms, k=job.high_norm or OUTLIER_K)
        cut = None if job.include_special else thr
        excluded = 0 if job.include_special else int((norms > thr).sum())
        del norms
        passes = itertools.count()

        def train_batches(b=batches):
            out = drop_outliers(b(), cut, [0])
            return mix_prefix(out, train_store, s, seed + next(passes)) if job.with_prefix else out

        t0 = time.time()
        settings = TrainSettings(epochs=job.epochs, lr=job.lr)
        sae, log = train_sae(train_batches, job.cfg, settings, progress=progress, options=options)
        seconds = time.time() - t0

        def train_other(other_seed: int) -> SAE:
            """The SAE trained with another seed on the same tokens (the stability SAE, an extra claim seed)."""
            b2 = store_batches(train_store, s, job.batch_tokens, seed=other_seed, buffer_tokens=job.buffer_tokens)
            opts = options if options is not None else RunOptions()
            # no checkpointing (the folder holds the main SAE's state); the RNG left as the main run leaves it
            with torch.random.fork_rng(devices=[]):
                sae2, _ = train_sae(lambda: train_batches(b2), job.cfg.model_copy(update={"seed": other_seed}),
                                    settings, progress=progress, options=RunOptions(device=opts.device, amp=opts.amp))
            return sae2

        other = None if job.stability_seed is None else train_other(job.stability_seed)
        # the extra claim seeds, trained as the stability SAE is: seed + 1 is that SAE, not trained twice
        extra = {sd: other if other is not None and sd == job.stability_seed else train_other(sd)
                 for sd in job.extra_seeds()}
    high = job.high_norm
    training = SAETraining(
        train_store=str(train_store.dir) if given is not None or (out is not None and keep_acts) else None,
        train_images=train_store.num_images, lr=job.lr, buffer_tokens=job.buffer_tokens,
        reader_peak_bytes=batches.peak_reader_bytes, reader_bound_bytes=batches.bound_bytes(),
        max_batch_tokens=batches.max_batch_tokens, dropped_tail_tokens=batches.dropped_tokens,
        high_norm_factor=high, high_norm_threshold=thr if high is not None else None,
        excluded_high_norm_tokens=excluded if high is not None else None)
    return Trained(sae, other, log.tokens, seconds, training, thr, cut, excluded, extra)


def run_sae(surface: ModelSurface, layer: int, site: str = "resid_post", data: str = "shapes", arch: str = "topk",
            k: int = 32, expansion: int = 8, n_train_images: int = 4000, n_eval_images: int = 1000, epochs: int = 4,
            batch_tokens: int = 4096, seed: int = 0, out: str | Path | None = None, progress: bool = False,
            force: bool = False, store: str | Path | None = None, buffer_tokens: int | None = DEFAULT_BUFFER_TOKENS,
            lr: float | None = None, keep_acts: bool = True, options: RunOptions | None = None,
            high_norm: float | None = None, stability_seed: int | None = None,
            include_special: bool = False, causal_data: Any = None, claim_seeds: int = 1) -> tuple[SAEResult, SAE]:
    """Train (or reload, when `out` already holds the same run) an SAE and score its features.

    Training tokens stream from `store` (all of its images; `n_train_images` is then unused) or,
    without one, from the first `n_train_images` train images captured into `out/acts/` (kept for
    reuse unless `keep_acts=False`). Each epoch is a fresh buffered shuffle (`buffer_tokens`).
    `options` (device, amp, checkpointing) reach the capture and `train_sae`.

    Special tokens (`vitpos.sae.special`): patch tokens with norm > OUTLIER_K x the median training-token
    norm are left out of training and passed through the splice unchanged, and prefix tokens (CLS,
    registers) are never trained on, unless `include_special`: then outliers are trained on and the
    prefix tokens are mixed into the training batches (their share of a batch is P / N; the store
    must keep them: `vitpos capture --keep-prefix`, or run_sae's own capture). Feature scores,
    held-out metrics and the splice stay on patch tokens. `high_norm` (None: OUTLIER_K) sets the
    outlier rule's factor (e.g. 4 for DINOv2's high-norm artifact tokens). Per-layer prefix / outlier statistics of
    the held-out images go to sae.json. `stability_seed`: a
    second SAE is trained with that seed on the same tokens and its decoder matched to this one's
    (`seed_stability`); it is not saved. `causal_data`: labelled images for C1's causal check (its probe
    read-outs, top-1 and controls; as many test images as the held-out set) when `data` has no labels, e.g.
    `tiles` for an SAE on `natural` crops; the latents are still typed on `data`. `claim_seeds` (issue 48):
    SAEs of seeds seed + 1 .. seed + claim_seeds - 1 are trained as the stability SAE is (seed + 1 is that
    one), saved under out/seeds/seed<k>, and each gets its own latents and causal check on the same held-out
    images; `seed_pool` holds them and C1's removals pooled over the seeds (`pool_causal`)."""
    from vitpos import plots  # matplotlib is imported when a figure is drawn, not with the experiment

    job = sae_job(surface, layer, site, data, arch, k, expansion, n_train_images, epochs, batch_tokens, seed, store,
                  buffer_tokens, lr, high_norm, stability_seed, include_special)
    if claim_seeds < 1:
        raise VitposError(f"claim_seeds must be >= 1 (got {claim_seeds})")
    job = replace(job, n_eval_images=n_eval_images, claim_seeds=claim_seeds)
    if causal_data is not None and data_name(causal_data) != data_name(data):
        job = replace(job, causal_data=causal_data)
    out = Path(out) if out is not None else None
    if not force and (done := _finished(out, job)) is not None:
        return done
    eval_set = dataset_for(surface, data, "test", limit=n_eval_images)
    trained = train_job(job, out, keep_acts, progress, force, options)
    # top-1 and the splice need class logits; a headless model without a head skips them
    no_logits = surface.classifier_problem(eval_set.info, data_name(data))
    causal_set = (None if job.causal_data is None else
                  dataset_for(surface, job.causal_data, "test", limit=n_eval_images))
    keeps: list[dict[str, RemovalImages]] = [{}]  # per SAE seed: the causal check's per-image effects
    held = evaluate_sae(surface, trained.sae, job.site, eval_set, seed=seed, logits=no_logits is None,
                        outlier_threshold=trained.cut, others=[trained.other] if trained.other is not None else [],
                        causal_set=causal_set, keep=keeps[0] if trained.extra else None)
    special = special_token_report(surface, eval_set, batch_size=sweep_batch(surface))
    result = sae_result(job, trained, held, special)
    runs = []
    for sd, other in trained.extra.items():  # each extra seed: its own latents and causal check, same images
        keeps.append({})
        h = evaluate_sae(surface, other, job.site, eval_set, seed=seed, logits=no_logits is None,
                         outlier_threshold=trained.cut, causal_set=causal_set, with_splice=False, keep=keeps[-1])
        runs.append(SAESeedRun.model_validate({
            "seed": sd, "dir": f"{SEEDS_DIR}/seed{sd}", "fvu": h.metrics["fvu"], **SAESeedRun.of(h.scores),
            "causal": None if h.causal is None else CausalCheck.model_validate(h.causal)}))
    if runs:
        pooled = pool_causal([result.causal, *(r.causal for r in runs)], keeps)
        result = result.model_copy(update={"seed_pool": SAESeedPool(
            seeds=[seed, *trained.extra], interval_sources=list(INTERVAL_SOURCES), runs=runs,
            ablate_row=pooled["ablate_row"], ablate_col=pooled["ablate_col"], control_row=pooled["control_row"],
            control_col=pooled["control_col"])})
    if out is not None:
        trained.sae.save(out, model_weights=surface.weights_digest())
        for sd, other in trained.extra.items():
            other.save(out / SEEDS_DIR / f"seed{sd}", model_weights=surface.weights_digest())
        write_json(out / "feature_scores.json", held.scores.to_json())
        write_json(out / "sae.json", result.to_json())
        plots.plot_feature_maps(held.scores, out / "features.png")
    return result, trained.sae


def sae_result(job: SAEJob, trained: Trained, held: HeldOut, special: SpecialTokens) -> SAEResult:
    """sae.json of a trained SAE from what was measured on the held-out images."""
    sae, other, scores = trained.sae, trained.other, held.scores
    stability = None
    if other is not None:
        stability = {**seed_stability(sae, other), "seed": job.seed, "other_seed": job.stability_seed,
                     "other_fvu": held.other_metrics[0]["fvu"]}
    fire = scores.fire_rate
    fidelity = {"dense_threshold": DENSE_THRESHOLD, "dense_frac": float((fire > DENSE_THRESHOLD).float().mean()),
                "dense_frac_by_threshold": {f"{t:g}": float((fire > t).float().mean()) for t in DENSE_SENSITIVITY},
                "stability": stability}
    cfg = job.cfg
    return SAEResult.model_validate({
        "run": job.run_key(), "model": job.surface.spec, "layer": job.site.layer, "site": job.site.name,
        "data": data_name(job.data), "arch": cfg.arch, "k": cfg.k, "expansion": cfg.expansion, "d_sae": cfg.d_sae,
        **held.metrics, "logit_kl": held.logit_kl, "top1": held.top1, "top1_spliced": held.top1_spliced,
        "top1_change_points": held.top1_change_points, "train_tokens": trained.tokens,
        "train_seconds": round(trained.seconds, 1), "training": trained.training,
        **SAEResult.of(scores),
        "thresholds": vars(scores.thresholds) if hasattr(scores.thresholds, "__dict__") else str(scores.thresholds),
        "causal": held.causal, "eta2_null": held.eta2_null, "fidelity": fidelity, "special_tokens": special,
        "outlier_threshold": trained.outlier_threshold, "include_special": job.include_special,
        "excluded_outlier_tokens": trained.excluded,
    })


def seed_stability(a: SAE, b: SAE, cos_threshold: float = STABLE_COS) -> dict[str, float]:
    """Decoder directions of `a` and `b` matched one-to-one (maximum total cosine, scipy's
    linear_sum_assignment; F x F, fine to F ~ 16k): share of a's latents whose match has
    cos >= cos_threshold, and the median matched cosine."""
    from scipy.optimize import linear_sum_assignment

    da = torch.nn.functional.normalize(a.W_dec.detach().double().cpu(), dim=1)
    db = torch.nn.functional.normalize(b.W_dec.detach().double().cpu(), dim=1)
    cos = (da @ db.T).numpy()
    rows, cols = linear_sum_assignment(cos, maximize=True)
    matched = torch.from_numpy(cos[rows, cols])
    return {"cos_threshold": cos_threshold, "share_matched": float((matched >= cos_threshold).double().mean()),
            "median_cos": float(matched.median())}


SAE_BATCH_TOKENS = 4096  # run_sae's default batch, the one the study's sae stage trains with


def stability_seed(settings: SAESettings, seed: int) -> int | None:
    """The seed of the stage's seed-stability SAE (None: `stability` off)."""
    return seed + 1 if settings.stability else None


def is_sweep(settings: SAESettings) -> bool:
    """The stage trains the seeds x sizes grid (`sae.seeds` > 1 or `sae.expansions`)."""
    return settings.seeds > 1 or bool(settings.expansions)


def stage_saes(settings: SAESettings, seed: int) -> list[tuple[int, int, str]]:
    """(expansion, seed, role) of every SAE the sae stage trains, in order: run_sae's ("main"), its
    seed-stability SAE ("stability"), the extra claim seeds it does not already have ("claim": seed + 1 ..
    seed + claim_seeds - 1 but the stability seed), then the sweep grid's others ("sweep", `sweep_grid`)."""
    out = [(settings.expansion, seed, "main")]
    other = stability_seed(settings, seed)
    if other is not None:
        out.append((settings.expansion, other, "stability"))
    out += [(settings.expansion, seed + j, "claim") for j in range(1, settings.claim_seeds) if seed + j != other]
    if is_sweep(settings):
        out += [(exp, sd, "sweep") for exp, sd, main in sweep_grid(settings, seed) if not main]
    return out


class SAEExperiment(Experiment[SAEResult, SAEStageSettings]):
    name = "sae"
    version = SAE_VERSION
    title = "Sparse autoencoder"
    claims = ("C1",)
    result_type = SAEResult
    settings_type = SAESettings
    scheme = "ape"
    requires = ("probe",)

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done],
                       quick: bool) -> SAEStageSettings:
        sae = cast(SAESettings, self.settings_of(config))
        if sae.layer is not None:
            return sae.stage(sae.layer)
        return sae.stage(choose_sae_layer(prior["probe"].result.to_json(), surface.depth))

    def plan_settings(self, config, surface: ModelSurface, planned, quick: bool) -> SAEStageSettings:
        return cast(SAESettings, self.settings_of(config)).stage(None)  # the probes' choice: not known yet

    def check(self, settings: SAEStageSettings, surface: ModelSurface, data: str, sizes: SplitSizes | None) -> None:
        s, L = settings, surface.depth
        sae_config(surface, s.arch, s.k, s.expansion)
        check_expansions(surface, s.arch, s.k, s.expansions, "sae.expansions")
        if s.data is not None:
            check_data(surface, s.data, "sae.data")
        if s.layer is not None and not 0 <= s.layer < L:
            raise VitposError(f"sae.layer {s.layer} is outside 0..{L - 1}; pass a layer of the model")
        if sizes is not None:
            try:
                n = sizes.n("train", s.images)
            except ValueError:
                n = None
            if n is not None and n * surface.num_patches < SAE_BATCH_TOKENS:
                need = -(-SAE_BATCH_TOKENS // surface.num_patches)
                raise VitposError(f"sae.images {n} give {n * surface.num_patches} patch tokens, fewer than one SAE "
                                  f"batch ({SAE_BATCH_TOKENS}); set sae.images to at least {need}")

    def plan(self, settings: SAEStageSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        L, N = surface.depth, surface.num_patches
        layer, note = settings.layer, "upper bound: both row and col features found"
        if layer is None:
            layer, note = L // 2, f"{note}; layer chosen from the probes, counted at {L // 2}"
        n_train = sizes.n("train", settings.images)
        n_eval = sizes.n("test", settings.eval_images)
        later = L - layer - 1
        # train capture (it stops after the SAE's layer: vitpos.store.capture), the held-out passes and,
        # with later layers, the causal check's removals
        out = StagePlan.full(n_train, layer + 1) + StagePlan.full(n_eval, L, HELD_OUT_PASSES +
                                                                  (len(REMOVALS) if later else 0))
        out += StagePlan.probe_fits(later, n_eval, N, SWEEP_TRAIN_TOKENS, len(DEFAULT_L2_GRID))
        if settings.browse:  # the browser's two passes stop at the SAE's layer (the second: winners only)
            out += StagePlan(forwards=2 * n_eval, blocks=2 * n_eval * (layer + 1))
        saes = stage_saes(settings, 0)  # what run_stage trains, whatever its seed
        extra = [exp for exp, _, role in saes if role == "sweep"]
        if extra:  # the sweep's other SAEs: trained on the same store, scored on a held-out capture to the layer
            out += StagePlan.full(n_eval, layer + 1)
            note += f"; plus {len(extra)} sweep SAEs (seeds x sizes)"
        tokens = n_train * N * settings.epochs  # per SAE: every training token of every epoch (an upper bound)
        work = sum(tokens * exp * surface.width for exp, _, _ in saes)
        n_claim = settings.claim_seeds - 1
        if n_claim:  # issue 48: each extra claim seed's held-out capture, removals and clean probe refits
            per_seed = StagePlan.full(n_eval, L, 1 + (len(REMOVALS) if later else 0))
            per_seed += StagePlan.probe_fits(later, n_eval, N, SWEEP_TRAIN_TOKENS, len(DEFAULT_L2_GRID))
            out += StagePlan(per_seed.forwards * n_claim, per_seed.blocks * n_claim, per_seed.fits * n_claim,
                             per_seed.fit_work * n_claim)
            trained = sum(role == "claim" for _, _, role in saes)
            note += (f"; plus {n_claim} extra SAE seed(s) for C1/C2 ({trained} trained, "
                     f"{n_claim - trained} the stability SAE), each {n_eval} images x {L} blocks x "
                     f"{1 + (len(REMOVALS) if later else 0)} passes + {later} probe fits")
        return out + StagePlan(sae_tokens=tokens * len(saes), sae_work=work, note=note)

    def run_stage(self, surface: ModelSurface, stage: StageInput[SAEStageSettings]) -> SAEResult:
        s = stage.settings
        if s.layer is None:
            raise VitposError("the sae stage runs at a layer: give sae.layer, or run the probe stage first")
        # sae.data: the SAE (its training, held-out metrics and feature scores) may read other images than the
        # run's labelled data, e.g. natural crops for a model measured on fashion; C1's causal check reads the run's
        data = s.data or stage.data
        sweep = is_sweep(s)
        result, sae = run_sae(surface, s.layer, site=s.site, data=data, arch=s.arch, k=s.k,
                              expansion=s.expansion, n_train_images=s.images, n_eval_images=s.eval_images,
                              epochs=s.epochs, seed=stage.seed, out=stage.out, progress=stage.progress, lr=s.lr,
                              keep_acts=sweep, high_norm=s.high_norm,
                              stability_seed=stability_seed(s, stage.seed),
                              include_special=s.include_special, claim_seeds=s.claim_seeds,
                              causal_data=stage.data)  # dropped by run_sae where the SAE reads the run's data itself
        # sae_dir relative to the output folder: a copied output folder reads its own SAE, never the original's
        update: dict[str, Any] = {"sae_dir": relative_artifact(stage.root, stage.out),
                                  "layer_choice": s.layer_choice}
        if sweep:
            site = Site(s.layer, s.site)
            acts = Path(stage.out) / "acts"

            def train_store():
                return _capture_train_store(surface, site, data, s.images, acts, stage.progress, False)

            update["sweep"] = run_sweep(surface, site, data, sae, train_store, settings=s, seed=stage.seed,
                                        out=Path(stage.out) / "sweep", progress=stage.progress)
            import shutil

            shutil.rmtree(acts, ignore_errors=True)  # the training store is scratch once every SAE is trained
        if s.browse:
            from vitpos.browse import PAGE, browse_sae

            # the page's header reads the seed grid too (positional agreement), which sae.json does not hold
            browse_sae(surface, stage.out, stage.out / "browse", images=s.eval_images, data=data,
                       doc=result.model_copy(update=update).to_json())
            # relative to the study's folder, where report.html is: the study writes each stage to
            # OUT/artifacts/<model slug>/<experiment>
            update["browser"] = str(Path("artifacts", stage.out.parent.name, stage.out.name, "browse", PAGE))
        return result.model_copy(update=update)

    def artifacts_ready(self, result: SAEResult, root: Path | None = None) -> bool:
        if result.sae_dir is None or not (artifact_path(root, result.sae_dir) / "sae.safetensors").is_file():
            return False
        folder = artifact_path(root, result.sae_dir)
        try:  # a truncated or damaged SAE is retrained like a missing one, never refused by what reads it
            SAE.load(folder)
            for r in result.seed_pool.runs if result.seed_pool is not None else []:
                SAE.load(folder / r.dir)
        except VitposError:
            return False
        return result.browser is None or (artifact_path(root, result.sae_dir) / "browse" / "index.html").is_file()

    def section(self, result: SAEResult, claims: ClaimRules) -> str:
        return sae_run_section.section(result)

    def summary(self, result: SAEResult, claim: str) -> str:
        return sae_run_section.summary(result)
