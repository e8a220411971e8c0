"""E3 (C2): permute APE's positional features across patches and measure top-1.

Per image, a permutation pi of patch positions; with F the chosen SAE latents,
    x'_n = x_n + sum_{f in F} (z_{pi(n), f} - z_{n, f}) d_f
at the SAE's site: only the span of F's decoder directions changes, the SAE error term and
prefix tokens are untouched, and the identity permutation is an exact no-op.
Variants: all (row+col features, random pi), row_only (row features, pi shuffles whole rows),
col_only (col features, pi shuffles whole columns), all_positional (row + col + mixed
positional latents, random pi: position carried by latents tied to both axes), random_features (as many live
non-positional latents, matched in activation mass, random pi), mean_ablate (F replaced by its
mean over patches), pos_embed_shuffle (the input APE table itself permuted: SAE-free).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from pydantic import BaseModel

from vitpos import plots
from vitpos.analysis.forward import accuracy_report, capture_layers, predict
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.experiments.base import Done, Experiment, Figure, Result, Skipped, StageInput
from vitpos.experiments.common import require_ape, sae_edit
from vitpos.hooks import edit
from vitpos.models.surface import ModelSurface, Site
from vitpos.progress import progress_bar
from vitpos.sae import SAE

VARIANTS = ("all", "row_only", "col_only", "all_positional", "random_features", "mean_ablate", "pos_embed_shuffle")


class GroupDrop(BaseModel):
    top1: float
    drop_points: float


class VariantResult(BaseModel):
    """Top-1 under one intervention, mean (and std) over seeds; drops in points vs the baseline."""

    top1: float
    top1_std: float
    drop_points: float
    drop_std: float
    per_seed_top1: list[float]
    n_features: int | None  # latents moved (None: the SAE-free APE-table shuffle)
    per_group: dict[str, GroupDrop]


Outcome = VariantResult | Skipped


class ApePermuteResult(Result):
    model: str
    layer: int
    site: str
    data: str
    n_images: int
    seeds: list[int]
    baseline_top1: float
    baseline_per_group: dict[str, float]
    variants: list[str]
    feature_counts: dict[str, int]
    all: Outcome
    row_only: Outcome
    col_only: Outcome
    all_positional: Outcome
    random_features: Outcome
    mean_ablate: Outcome
    pos_embed_shuffle: Outcome

    def variant(self, name: str) -> VariantResult | None:
        v = getattr(self, name)
        return v if isinstance(v, VariantResult) else None


def permute_features(x: torch.Tensor, z: torch.Tensor, sae: SAE, ids: list[int], perm: torch.Tensor) -> torch.Tensor:
    """x, z: (B, N, D), (B, N, F); perm (B, N): patch n takes the features of patch perm[b, n]."""
    c = sae.feature_contribution(z, ids)
    moved = torch.gather(c, 1, perm.unsqueeze(-1).expand_as(c))
    return x + (moved - c)


def random_perms(kind: str, B: int, grid: tuple[int, int], g: torch.Generator) -> torch.Tensor:
    """(B, N) permutations: 'all' any, 'row' shuffles whole rows, 'col' shuffles whole columns."""
    H, W = grid
    idx = torch.arange(H * W).reshape(H, W)
    out = []
    for _ in range(B):
        if kind == "all":
            out.append(torch.randperm(H * W, generator=g))
        elif kind == "row":
            out.append(idx[torch.randperm(H, generator=g)].flatten())
        else:
            out.append(idx[:, torch.randperm(W, generator=g)].flatten())
    return torch.stack(out)


def matched_random_features(mass: torch.Tensor, positional: list[int], live: torch.Tensor, g: torch.Generator,
                            pool: int = 5) -> list[int]:
    """For each positional latent, a random non-positional live latent among the `pool` closest in mass."""
    pos = set(positional)
    cands = [f for f in torch.nonzero(live).flatten().tolist() if f not in pos]
    if len(cands) < len(positional):
        return []
    chosen: list[int] = []
    for f in positional:
        free = [c for c in cands if c not in chosen]
        free.sort(key=lambda c: abs(float(mass[c] - mass[f])))
        near = free[:pool]
        chosen.append(near[int(torch.randint(len(near), (1,), generator=g))])
    return chosen


@torch.no_grad()
def feature_mass(surface: ModelSurface, sae: SAE, site: Site, dataset,
                 n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean activation per latent over patch tokens (decoder columns are unit-norm) and per-latent
    mean code (for mean ablation), from the first n images."""
    acts = capture_layers(surface, dataset.subset(n), [site], check_classifier=False)[0][str(site)]
    z = sae.encode(acts.reshape(-1, acts.shape[-1]))
    return z.mean(0), (z != 0).float().mean(0)


def check_sae_matches(surface: ModelSurface, sae_doc: Mapping) -> None:
    """An SAE is only meaningful on the model (and weights) whose activations it was trained on."""
    model = sae_doc.get("model")
    if model is not None and model != surface.spec:
        raise VitposError(f"the SAE was trained on {model!r}, not {surface.spec!r}; train one on this model with "
                          f"`vitpos sae --model {surface.spec} ...` or pass --model {model}")
    weights = (sae_doc.get("run") or {}).get("weights")
    if weights is not None and weights != surface.weights_digest():
        raise VitposError(f"the SAE was trained on other weights of {surface.spec} (digest {weights}, now "
                          f"{surface.weights_digest()}); retrain it with `vitpos sae --model {surface.spec} ...`")


def run_ape_permute(surface: ModelSurface, sae: SAE, sae_doc: Mapping, data: str = "shapes", n_images: int = 2000,
                    seeds: tuple[int, ...] = (0, 1, 2), split: str = "test", out: str | Path | None = None,
                    progress: bool = False) -> ApePermuteResult:
    """`sae_doc`: the SAE's sae.json (layer, site and the row / col / mixed feature lists)."""
    require_ape(surface)
    check_sae_matches(surface, sae_doc)
    layer, site_name = int(sae_doc["layer"]), sae_doc.get("site", "resid_post")
    site = Site(layer, site_name)
    row, col = list(sae_doc["row_features"]), list(sae_doc["col_features"])
    mixed = list(sae_doc.get("mixed_features", []))
    dataset = dataset_for(surface, data, split, limit=n_images)
    surface.check_classifier(dataset.info, data_name(data))  # before any work: every number here is a top-1
    mean_code, fire = feature_mass(surface, sae, site, dataset)
    info = dataset.info
    preds, labels = predict(surface, dataset)
    base = accuracy_report(preds, labels, info)
    npt = surface.num_prefix_tokens

    def run_edit(sites_fns: dict) -> dict:
        p, y = predict(surface, dataset, context=lambda: edit(surface, sites_fns))
        return accuracy_report(p, y, info)

    def permuting(ids: list[int], kind: str, seed: int):
        g = torch.Generator().manual_seed(seed)
        return sae_edit(surface, sae,
                        lambda x, z: permute_features(x, z, sae, ids, random_perms(kind, x.shape[0], surface.grid, g)))

    per_variant: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    skipped: dict[str, str] = {}
    with progress_bar(enabled=progress) as bar:
        task = bar.add_task("ape-permute", total=len(VARIANTS) * len(seeds))
        for seed in seeds:
            g = torch.Generator().manual_seed(10_000 + seed)
            plan = {
                "all": (row + col, "all"), "row_only": (row, "row"), "col_only": (col, "col"),
                "all_positional": (row + col + mixed, "all"),
                "random_features": (matched_random_features(mean_code, row + col, fire >= 0.005, g), "all"),
            }
            for v, (ids, kind) in plan.items():
                if not ids:
                    skipped[v] = ("no features of this kind" if v != "random_features"
                                  else "not enough live non-positional latents")
                else:
                    per_variant[v].append(run_edit({site: permuting(ids, kind, seed)}))
                bar.update(task, advance=1)
            if row + col:
                ids = row + col
                mean_c = sae.feature_contribution(mean_code, ids)  # mean contribution over patches, (D,)
                fn = sae_edit(surface, sae, lambda x, z, ids=ids, m=mean_c: x - sae.feature_contribution(z, ids) + m)
                per_variant["mean_ablate"].append(run_edit({site: fn}))
            else:
                skipped["mean_ablate"] = "no positional features"
            bar.update(task, advance=1)
            pe = surface.patch_pos_embed()
            gp = torch.Generator().manual_seed(20_000 + seed)

            def shuffle_pe(t, pe=pe, gp=gp):
                perm = random_perms("all", t.shape[0], surface.grid, gp)
                moved = pe[perm]  # (B, N, D)
                return torch.cat([t[:, :npt], t[:, npt:] - pe + moved], dim=1)
            per_variant["pos_embed_shuffle"].append(run_edit({Site(None, "embed"): shuffle_pe}))
            bar.update(task, advance=1)

    doc = {"model": surface.spec, "layer": layer, "site": site_name, "data": data_name(data), "n_images": len(dataset),
           "seeds": list(seeds), "baseline_top1": base["top1"], "baseline_per_group": base["per_group"],
           "variants": list(VARIANTS), "feature_counts": {"row": len(row), "col": len(col), "mixed": len(mixed)}}
    n_feats = {"all": len(row + col), "row_only": len(row), "col_only": len(col),
               "all_positional": len(row + col + mixed),
               "random_features": len(row + col),
               "mean_ablate": len(row + col), "pos_embed_shuffle": None}
    for v in VARIANTS:
        runs = per_variant[v]
        if not runs:
            doc[v] = {"skipped": skipped.get(v, "not run")}
            continue
        t = torch.tensor([r["top1"] for r in runs])
        groups = {}
        for gname in base["per_group"]:
            gt = torch.tensor([r["per_group"][gname] for r in runs])
            groups[gname] = {"top1": float(gt.mean()),
                             "drop_points": 100 * (base["per_group"][gname] - float(gt.mean()))}
        doc[v] = {"top1": float(t.mean()), "top1_std": float(t.std()) if len(t) > 1 else 0.0,
                  "drop_points": 100 * (base["top1"] - float(t.mean())),
                  "drop_std": 100 * float(t.std()) if len(t) > 1 else 0.0,
                  "per_seed_top1": t.tolist(), "n_features": n_feats[v], "per_group": groups}
    result = ApePermuteResult.model_validate(doc)
    if out is not None:
        ApePermuteExperiment().write(result, out)
    return result


class ApePermuteExperiment(Experiment[ApePermuteResult]):
    name = "ape_permute"
    title = "APE positional-feature permutation (C2)"
    claims = ("C2",)
    result_type = ApePermuteResult
    requires = ("sae",)

    def applies_to(self, surface: ModelSurface) -> str | None:
        return None if surface.has_ape else f"no absolute position embedding (scheme {surface.scheme})"

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done], quick: bool) -> dict:
        return {**config.ape_permute.model_dump(), "sae": dict(prior["sae"].settings)}

    def run_stage(self, surface: ModelSurface, stage: StageInput) -> ApePermuteResult:
        sae_doc = stage.prior["sae"].result.to_json()
        s = stage.settings
        return run_ape_permute(surface, SAE.load(sae_doc["sae_dir"]), sae_doc, data=stage.data, n_images=s["images"],
                               seeds=tuple(range(s["seeds"])))

    def figures(self, result: ApePermuteResult) -> list[Figure]:
        return [Figure("ape_permute", "top-1 drop per permuted feature set, with controls",
                       lambda r, p: plots.plot_ape_permute(r.to_json(), p))]

