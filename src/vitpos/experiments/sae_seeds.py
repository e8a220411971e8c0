"""The SAE stage's seeds x dictionary-sizes grid (`sae.seeds`, `sae.expansions`) and seed stability.

The study's SAE (seed = the run's seed, `sae.expansion`) is the one C1 and C2 read; the sweep trains
the other SAEs of the grid on the same training store (same tokens, same epochs, lr by size,
high-norm exclusion alike), scores each on the same held-out images (FVU, L0, dead fraction, row /
col / mixed feature counts by the study's thresholds) and, per size, matches every pair of seeds by
decoder direction (`vitpos.sae.stability`). Extra SAEs are not spliced into the model and have no
causal check: they say how much of the dictionary (and of its positional sets) a second seed
reproduces, not whether it is causal.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitpos.errors import VitposError
from vitpos.experiments.sae_settings import SAESettings
from vitpos.models.surface import ModelSurface, Site
from vitpos.results.sae_run import SAESweep, SweepRun
from vitpos.sae import SAE, SAEConfig, sae_metrics, score_features, train_sae
from vitpos.sae.stability import seed_match
from vitpos.sae.stream import DEFAULT_BUFFER_TOKENS, median_token_norm, store_batches
from vitpos.sae.train import default_lr


def _eval_store(surface: ModelSurface, site: Site, data, n_eval: int, folder: Path):
    from vitpos.experiments.common import sweep_batch
    from vitpos.store.capture import capture_to_store
    from vitpos.store.reader import ActivationStore

    capture_to_store(surface, data, "test", str(site), folder, limit=n_eval, batch_size=sweep_batch(surface),
                     force=True, progress=False)
    return ActivationStore(folder)


def sweep_axes(settings: SAESettings, seed: int) -> tuple[list[int], list[int]]:
    """The grid's seeds (seed..seed+seeds-1) and dictionary sizes (`expansions`, else [expansion])."""
    seeds = [seed + j for j in range(settings.seeds)]
    return seeds, list(dict.fromkeys(settings.expansions or [settings.expansion]))


def sweep_grid(settings: SAESettings, seed: int) -> list[tuple[int, int, bool]]:
    """(expansion, seed, main) of every SAE of the grid, in the order run_sweep trains them; main: the
    study's SAE (seed `seed`, size `expansion`), trained by run_sae and not again."""
    seeds, sizes = sweep_axes(settings, seed)
    return [(exp, sd, (exp, sd) == (settings.expansion, seed)) for exp, sd in itertools.product(sizes, seeds)]


def run_sweep(surface: ModelSurface, site: Site, data, main_sae: SAE, train_store: Callable[[], Any], *,
              settings: SAESettings, seed: int, out: Path | None = None, progress: bool = False,
              batch_tokens: int = 4096, buffer_tokens: int | None = DEFAULT_BUFFER_TOKENS) -> SAESweep:
    """Train the grid's other SAEs (seeds seed..seed+seeds-1 x expansions) on `train_store()`, score
    them on `settings.eval_images` held-out images, and match seeds per size."""
    seeds, sizes = sweep_axes(settings, seed)
    if len(seeds) < 2 and len(sizes) < 2:
        raise VitposError("an SAE sweep needs sae.seeds >= 2 or two sae.expansions")
    store = train_store()
    key = str(site)
    factor = settings.high_norm
    max_norm = None if factor is None else factor * median_token_norm(store, key)
    n_eval = settings.eval_images
    saes: dict[tuple[int, int], SAE] = {}
    runs: list[SweepRun] = []
    scores_of: dict[tuple[int, int], Any] = {}
    with tempfile.TemporaryDirectory(prefix="vitpos-sae-sweep-") as tmp:
        held = _eval_store(surface, site, data, n_eval, Path(tmp) / "eval")

        def score(sae: SAE):
            metrics = sae_metrics(sae, lambda: (a.reshape(-1, a.shape[-1]) for a, _, _ in held.iter_images(key, 64)))
            feats = score_features(sae, (a for a, _, _ in held.iter_images(key, 64)), surface.grid)
            return metrics, feats

        for exp, sd, main in sweep_grid(settings, seed):
            t0 = time.time()
            if main:
                sae = main_sae
            else:
                cfg = SAEConfig.model_validate({"arch": settings.arch, "d_in": surface.width, "expansion": exp,
                                                "k": settings.k, "seed": sd})
                lr = default_lr(cfg.d_sae) if settings.lr is None else settings.lr
                batches = store_batches(store, key, batch_tokens, seed=sd, buffer_tokens=buffer_tokens,
                                        max_norm=max_norm)
                sae, _ = train_sae(batches, cfg, epochs=settings.epochs, lr=lr, progress=progress)
                if out is not None:
                    sae.save(out / f"x{exp}-seed{sd}")
            secs = time.time() - t0
            metrics, feats = score(sae)
            saes[(exp, sd)] = sae
            scores_of[(exp, sd)] = feats
            runs.append(SweepRun(seed=sd, expansion=exp, d_sae=sae.d_sae, main=main, fvu=metrics["fvu"],
                                 l0=metrics["l0"], dead_frac=metrics["dead_frac"],
                                 n_row_features=len(feats.row_features), n_col_features=len(feats.col_features),
                                 n_mixed_features=len(feats.mixed_features),
                                 n_conj_features=len(feats.conj_features),
                                 train_seconds=None if main else round(secs, 1)))
    stability = []
    for exp in sizes:
        for a, b in itertools.combinations(seeds, 2):
            fa, fb = scores_of[(exp, a)], scores_of[(exp, b)]
            stability.append(seed_match(saes[(exp, a)].W_dec, saes[(exp, b)].W_dec, (a, b),
                                        rows=(fa.row_features, fb.row_features),
                                        cols=(fa.col_features, fb.col_features)))
    return SAESweep(seeds=seeds, expansions=sizes, eval_images=n_eval, runs=runs, stability=stability)


__all__ = ["run_sweep", "sweep_axes", "sweep_grid"]
