"""E1: how much row and column information each layer holds (linear probes), with controls.

Content baseline (METHODS): the same probes on the patch embeddings with any absolute embedding
subtracted — content only, no positional input — since on real images content alone predicts
position (centred garments, sky at the top).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from pydantic import Field

from vitpos.analysis.forward import capture_layers
from vitpos.analysis.probes import DEFAULT_L2_GRID, fit_position_probes, probe_layers
from vitpos.data.resolve import dataset_for
from vitpos.experiments import probe_section
from vitpos.experiments.base import Experiment, Figure, Settings, SplitSizes, StageInput, StagePlan
from vitpos.experiments.checks import check_probe_images, images_of
from vitpos.models.surface import ModelSurface, Site, expand_sites
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.probe import MultiSiteProbeResult, ProbeResults, ProbeSiteResult, probe_sites

MAX_IN_MEMORY_BYTES = 3 * 2**30
PROBE_TRAIN_TOKENS = 20000  # position-balanced training tokens per probe (ample for <= 768 dims)


def content_features(surface: ModelSurface, dataset, batch_size: int = 256) -> torch.Tensor:
    """(n, N, D) patch tokens at the embedding with the absolute embedding removed."""
    acts, _, _ = capture_layers(surface, dataset, [Site(None, "embed")], batch_size=batch_size, check_classifier=False)
    feats = acts["embed"]
    if surface.has_ape:
        feats = feats - surface.patch_pos_embed().unsqueeze(0).to(feats.device, feats.dtype)
    return feats


def layer_chunk(surface: ModelSurface, n_images: int) -> int:
    """Layers captured per forward pass of the data by layer_features (bounded memory)."""
    per_layer = n_images * surface.num_patches * surface.width * 4
    return max(1, int(MAX_IN_MEMORY_BYTES // max(1, per_layer)))


def layer_features(surface: ModelSurface, dataset, site: str, layers: list[int], batch_size: int = 256,
                   context=None, progress: bool = False) -> dict[int, torch.Tensor]:
    """{layer: (n, N, D)} for one site name at each layer, in as few forward passes as memory allows."""
    chunk = layer_chunk(surface, len(dataset))
    out: dict[int, torch.Tensor] = {}
    for start in range(0, len(layers), chunk):
        group = layers[start:start + chunk]
        acts, _, _ = capture_layers(surface, dataset, [Site(layer, site) for layer in group], batch_size=batch_size,
                                    context=context, progress=progress, desc=f"capture {site}",
                                    check_classifier=False)
        out.update({layer: acts[str(Site(layer, site))] for layer in group})
    return out


def run_probe(surface: ModelSurface, data: str = "shapes", sites: str = "resid_post", n_images: int = 1000,
              split: str = "test", seed: int = 0, out: str | Path | None = None, progress: bool = False,
              device: str | torch.device | None = None, amp: str | None = None) -> ProbeResults:
    """Probe every layer of each site; writes probe.json and probe.png into `out` when given.

    ``device`` (auto|cpu|cuda) runs the model forwards and the probe fits there (the model is moved
    back afterwards); ``amp`` (none|bf16|fp16) autocasts the forwards only, fits stay float32."""
    from vitpos.runtime.device import autocast, resolve_device

    if device is not None or amp is not None:
        dev = resolve_device(device)
        amp_ctx = autocast(dev, amp)
        home = surface.device
        surface.to(dev)
        try:
            with amp_ctx:
                return _run_probe(surface, data, sites, n_images, split, seed, out, progress, fit_device=dev)
        finally:
            surface.to(home)
    return _run_probe(surface, data, sites, n_images, split, seed, out, progress, fit_device=None)


def _run_probe(surface: ModelSurface, data: str, sites: str, n_images: int, split: str, seed: int,
               out: str | Path | None, progress: bool, fit_device=None) -> ProbeResults:
    dataset = dataset_for(surface, data, split, limit=n_images)
    site_names = sorted({s.name for s in expand_sites(sites, surface.depth)}, key=sites.find)
    content = fit_position_probes(content_features(surface, dataset), surface.grid, seed=seed,
                                   max_train_tokens=PROBE_TRAIN_TOKENS, device=fit_device)
    baseline = {"row_acc": content.row_acc, "col_acc": content.col_acc,
                "note": "patch embeddings minus any APE: position predictable from content alone"}
    results = {}
    for name in site_names:
        # Probed sites are per-layer sites (a global site has layer None and is not probed per layer).
        layers = sorted(cast(int, s.layer) for s in expand_sites(sites, surface.depth) if s.name == name)
        feats = layer_features(surface, dataset, name, layers, progress=progress)
        res = probe_layers(feats, surface.grid, seed=seed, max_train_tokens=PROBE_TRAIN_TOKENS,
                           device=fit_device).to_json(name)
        res["content_baseline"] = baseline
        res["n_images"] = len(dataset)
        results[name] = res
    typed = {name: ProbeSiteResult.model_validate(res) for name, res in results.items()}
    result: ProbeResults = (typed[site_names[0]] if len(site_names) == 1
                            else MultiSiteProbeResult(sites=typed))
    if out is not None:
        ProbeExperiment().write(result, out)
    return result


class ProbeSettings(Settings):
    """`probe:` in the run config."""

    QUICK = {"images": 200}
    images: int = Field(default=1000, ge=2, description="test-split images, split by image into probe train/test")


class ProbeExperiment(Experiment[ProbeResults, ProbeSettings]):
    name = "probe"
    version = 1
    title = "Linear position probes"
    result_type = ProbeSiteResult
    settings_type = ProbeSettings

    def plan(self, settings: ProbeSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        n, L = sizes.n("test", settings.images), surface.depth
        passes = -(-L // layer_chunk(surface, n))
        # the content baseline's capture at the embedding runs the whole model, then resid_post per chunk
        return (StagePlan.full(n, L, 1 + passes)
                + StagePlan.probe_fits(1 + L, n, surface.num_patches, PROBE_TRAIN_TOKENS, len(DEFAULT_L2_GRID), True))

    def check(self, settings: ProbeSettings, surface: ModelSurface, data: str, sizes: SplitSizes | None) -> None:
        check_probe_images(images_of(sizes, "test", settings.images), "probe.images")

    def run_stage(self, surface: ModelSurface, stage: StageInput[ProbeSettings]) -> ProbeResults:
        return run_probe(surface, data=stage.data, n_images=stage.settings.images, seed=stage.seed)

    def load(self, doc):
        return MultiSiteProbeResult.model_validate(doc) if "sites" in doc else super().load(doc)

    def figures(self, result: ProbeResults) -> list[Figure]:
        sites = probe_sites(result)
        return [Figure("probe" if len(sites) == 1 else f"probe_{name}",
                       f"row / column probe accuracy per layer at {name}",
                       lambda r, p, name=name: _plot_site(probe_sites(r)[name], p))
                for name in sites]

    def section(self, result: ProbeResults, claims: ClaimRules) -> str:
        return probe_section.section(result)

    def summary(self, result: ProbeResults, claim: str) -> str:
        return probe_section.summary(result)


def _plot_site(res: ProbeSiteResult, path: Path):
    from vitpos import plots  # matplotlib is imported when a figure is drawn, not with the experiment

    return plots.plot_probe_curves(res, path)
