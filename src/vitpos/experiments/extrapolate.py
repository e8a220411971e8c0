"""Resolution extrapolation: position probes and top-1 at grids larger than the model was trained on.

The model runs at its training size and at larger grids (each `scale` times the training grid,
rounded to whole patches) on a copy resized by timm's own code (`ModelSurface.at_size`, i.e.
`set_input_size`): an APE table is resampled to the new grid (`resample_abs_pos_embed`, bicubic:
interpolation, the way timm fine-tunes at another size); rotary tables are rebuilt for the new grid
as the model computes them. naver's RoPE ViTs (axial, mixed) and vitpos' own keep their grid step,
so the added rows / columns turn by angles never seen in training (`rope_grid` "extended"); EVA-02
(ref_feat_shape) and DINOv3 (normalised coordinates) map the larger grid onto the trained range
("rescaled"), which `rope_grid` records by comparing the tables.

Data: `shapes` is generated at the matching size (its 32 px times the grid ratio: the shapes keep
their size in pixels and patches, the canvas grows); data with fixed images are resized to the new
input (content grows with the image).

Per size: row / column probes on resid_post patch tokens per layer, retrained at that size (as many
classes as the grid has rows / columns: chance 1/H, 1/W), and top-1 with a Wilson interval, refused
(None and the reason) when the model's outputs are not logits over the data's classes. Chance differs
between sizes, so sizes are compared by the skill above chance, (acc - chance) / (1 - chance):
1 = every patch placed, 0 = chance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import torch
from pydantic import Field

from vitpos.analysis.kept import Keep
from vitpos.analysis.probes import DEFAULT_L2_GRID, ProbeTokens, fit_probe_tokens, probe_sample
from vitpos.analysis.stats import accuracy_interval
from vitpos.data.resolve import data_name, dataset_at_size, generated_size
from vitpos.errors import VitposError
from vitpos.experiments import extrapolate_section
from vitpos.experiments.base import Done, Experiment, Figure, Settings, SplitSizes, StageInput, StagePlan
from vitpos.experiments.common import SWEEP_TRAIN_TOKENS, capture_condition
from vitpos.models.surface import ModelSurface, Site
from vitpos.progress import progress_bar
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.extrapolate import ExtrapolateResult


def skill(acc: float, chance: float) -> float:
    return (acc - chance) / (1.0 - chance)


def grid_at(surface: ModelSurface, scale: float) -> tuple[int, int]:
    """The training grid times `scale`, rounded to whole patches."""
    return round(surface.grid[0] * scale), round(surface.grid[1] * scale)


MAX_SCALE = 8.0  # grids beyond 8x the training grid (64x the tokens) are refused, not attempted


def fixed_size_problem(data: str) -> str | None:
    """Why `data` cannot be extrapolated (it exists only at the model's own input size), or None."""
    from vitpos.data import dataset_info

    if not dataset_info(data).fixed_size:
        return None
    return (f"{data_name(data)} is defined only at the model's own input size: there is no larger grid of it to "
            "extrapolate to")


def check_scales(surface: ModelSurface, scales: Sequence[float], flag: str = "--scales",
                 data: object = None) -> list[float]:
    """Sorted scales, each giving a distinct grid of at least 2 x 2 other than the training grid (and,
    for generated data, a canvas the generator can draw on)."""
    if isinstance(data, str) and (problem := fixed_size_problem(data)) is not None:
        raise VitposError(f"{problem}; pass data that can be made at other sizes (e.g. natural for tiles)")
    grids = {surface.grid: 1.0}
    native = generated_size(data) if isinstance(data, str) else None
    for s in sorted(scales):
        if not math.isfinite(s) or s > MAX_SCALE:
            raise VitposError(f"{flag} {s:g}: scales above {MAX_SCALE:g} are refused (the token count grows as the "
                              "square); pass scales like 1.5,2")
        g = grid_at(surface, s)
        if native is not None and s != 1.0:
            from vitpos.data.shapes import MIN_SIZE

            px = round(native[0] * g[0] / surface.grid[0])
            if px < MIN_SIZE:
                raise VitposError(f"{flag} {s:g}: shapes at {s:g}x would be drawn at {px} px, below the {MIN_SIZE} px "
                                  "two separated shapes need; pass larger scales, e.g. 1.5,2")
        if s <= 0 or min(g) < 2:
            raise VitposError(f"{flag} {s:g}: the grid {surface.grid} times {s:g} must keep at least 2 rows and "
                              "columns (pass scales > 0, e.g. 1.5,2)")
        if g in grids:
            twin = "the training grid (always run)" if grids[g] == 1.0 else f"the grid of {grids[g]:g} too"
            raise VitposError(f"{flag} {s:g} gives the grid {g}, {twin}, for {surface.spec}; pass scales giving "
                              "distinct grids")
        grids[g] = s
    return sorted(scales)


def rope_grid(base: ModelSurface, resized: ModelSurface) -> Literal["extended", "rescaled"]:
    """"extended" when the larger grid's rotary table holds the training grid's table at the same
    (row, col) positions (the grid step is kept), else "rescaled" (the new grid is mapped onto the old range)."""
    old, new = base.rope_table(), resized.rope_table()
    (H, W), W2 = base.grid, resized.grid[1]
    if resized.grid[0] < H or W2 < W:
        raise VitposError("rope_grid compares a grid with a larger one")
    r, c = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    same = torch.allclose(new[..., (r * W2 + c).reshape(-1), :], old, atol=1e-5, rtol=1e-5)
    return "extended" if same else "rescaled"


def size_schedule(surface: ModelSurface, scales: Sequence[float]) -> list[tuple[float, tuple[int, int]]]:
    """The sizes run_extrapolate runs and plan_extrapolate counts, in order: (scale, grid), the
    training size first, then each scale by size."""
    return [(scale, grid_at(surface, scale)) for scale in (1.0, *sorted(scales))]


def measure_size(surface: ModelSurface, dataset, seed: int = 0, top1: bool = True,
                 max_train_tokens: int | None = SWEEP_TRAIN_TOKENS) -> dict:
    """Row / column probe accuracy per layer (resid_post patch tokens, retrained on this grid) and,
    when `top1`, the top-1, its Wilson interval and per-group accuracies on `dataset`."""
    layers = list(range(surface.depth))
    sample = probe_sample(len(dataset), surface.num_patches, seed=seed, max_train_tokens=max_train_tokens)
    keep = {Site(layer, "resid_post"): Keep.probe(sample) for layer in layers}
    kept, labels, logits, _ = capture_condition(surface, dataset, None, keep, check_classifier=top1)
    row, col = [], []
    with kept:
        for layer in layers:
            site = Site(layer, "resid_post")
            tokens = ProbeTokens.from_whole(sample, kept.tokens(str(site)), kept.images(str(site)), keep[site].images)
            res = fit_probe_tokens(tokens, surface.grid, control=False)
            row.append(res.row_acc)
            col.append(res.col_acc)
    H, W = surface.grid
    out: dict[str, Any] = {"row_acc": row, "col_acc": col, "chance_row": 1 / H, "chance_col": 1 / W,
                           "row_skill": [skill(a, 1 / H) for a in row], "col_skill": [skill(a, 1 / W) for a in col],
                           "top1": None, "top1_ci": None, "per_group": None}
    if top1:
        from vitpos.analysis.forward import accuracy_report

        preds = logits.argmax(-1)
        rep = accuracy_report(preds, labels, dataset.info)
        out.update(top1=rep["top1"], top1_ci=accuracy_interval(preds == labels), per_group=rep["per_group"])
    return out


def run_extrapolate(surface: ModelSurface, data: str = "shapes", n_images: int = 300,
                    scales: Sequence[float] | None = None, split: str = "test", seed: int = 0,
                    out: str | Path | None = None, progress: bool = False) -> ExtrapolateResult:
    """Probes and top-1 at the training size and at each scale of the grid (None: the surface's
    `extrapolation_scales`), n_images images per size; writes extrapolate.json/.png into `out`."""
    scales = check_scales(surface, surface.extrapolation_scales if scales is None else scales, data=data)
    native = generated_size(data)
    base_set = dataset_at_size(surface, data, split, None, limit=n_images, seed=seed)
    refused = surface.classifier_problem(base_set.info, data_name(data))
    rows: list[dict] = []
    grid_kind: Literal["extended", "rescaled"] | None = None
    with progress_bar(enabled=progress) as bar:
        schedule = size_schedule(surface, scales)
        task = bar.add_task("extrapolate", total=len(schedule))
        for scale, g in schedule:
            # shapes at the grid ratio: the shapes keep their pixels per patch
            data_px = None if native is None else round(native[0] * g[0] / surface.grid[0])
            if scale == 1.0:
                sized, dataset = surface, base_set
            else:
                ph, pw = surface.patch_size
                sized = surface.at_size((g[0] * ph, g[1] * pw))
                dataset = dataset_at_size(sized, data, split, data_px, limit=n_images, seed=seed)
                if grid_kind is None and surface.has_rope:
                    grid_kind = rope_grid(surface, sized)
            res = measure_size(sized, dataset, seed=seed, top1=refused is None)
            rows.append({"scale": sized.grid[0] / surface.grid[0], "img_size": list(sized.input_size[1:]),
                         "grid": list(sized.grid), "data_px": data_px, **res})
            bar.update(task, advance=1, description=f"extrapolate {sized.grid[0]}x{sized.grid[1]}")
    result = ExtrapolateResult.model_validate({
        "model": surface.spec, "data": data_name(data), "split": split, "n_images": len(base_set),
        "site": "resid_post", "layers": list(range(surface.depth)), "scheme": surface.scheme,
        "ape": "resampled to the new grid (timm resample_abs_pos_embed, bicubic)" if surface.has_ape else None,
        "rope_grid": grid_kind, "top1_refused": refused, "sizes": rows})
    if out is not None:
        ExtrapolateExperiment().write(result, out)
    return result


def plan_extrapolate(settings: ExtrapolateSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
    """What run_extrapolate(n_images=settings.images, scales=settings.scales) computes, walking
    its `size_schedule`: one forward of the images per size and a probe fit per layer and size (larger
    grids: more tokens per image, counted as image x block evaluations all the same)."""
    n, L = sizes.n("test", settings.images), surface.depth
    scales = surface.extrapolation_scales if settings.scales is None else settings.scales
    # block evaluations are timed at the training grid's cost; larger grids have more tokens per image
    plan = StagePlan(note="the larger grids' blocks take longer than the estimate")
    for _, (H, W) in size_schedule(surface, scales):
        plan += StagePlan.full(n, L) + StagePlan.probe_fits(L, n, H * W, SWEEP_TRAIN_TOKENS, len(DEFAULT_L2_GRID))
    return plan


class ExtrapolateSettings(Settings):
    """`extrapolate:` in the run config."""

    QUICK = {"images": 100}
    images: int = Field(default=300, ge=8, description="test-split images per size, split by image into probe "
                        "train/test")
    scales: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = Field(
        default=None, min_length=1, description="grid scales run besides the training size; None = the model's own "
        "(vitpos' models 1.25, 1.5: 32 -> 40, 48 px; timm models 1.5, 2)")


class ExtrapolateExperiment(Experiment[ExtrapolateResult, ExtrapolateSettings]):
    name = "extrapolate"
    version = 1
    title = "Resolution extrapolation: probes and top-1 at larger grids"
    result_type = ExtrapolateResult
    settings_type = ExtrapolateSettings

    def applies_to(self, surface: ModelSurface) -> str | None:
        return None if surface.resizable else f"{type(surface).__name__} cannot be resized to another input size"

    def applies_to_data(self, data: str) -> str | None:
        return fixed_size_problem(data)

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done],
                       quick: bool) -> ExtrapolateSettings:
        settings = cast(ExtrapolateSettings, self.settings_of(config))
        if settings.scales is None:  # explicit in the cache key: the scales define the result
            settings = settings.updated(scales=list(surface.extrapolation_scales))
        return settings

    def check(self, settings: ExtrapolateSettings, surface: ModelSurface, data: str, sizes: SplitSizes | None) -> None:
        scales = settings.scales
        check_scales(surface, surface.extrapolation_scales if scales is None else scales, "extrapolate.scales",
                     data=data)

    def plan(self, settings: ExtrapolateSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        return plan_extrapolate(settings, surface, sizes)

    def run_stage(self, surface: ModelSurface, stage: StageInput[ExtrapolateSettings]) -> ExtrapolateResult:
        s = stage.settings
        return run_extrapolate(surface, data=stage.data, n_images=s.images, scales=s.scales, seed=stage.seed,
                               progress=stage.progress)

    def figures(self, result: ExtrapolateResult) -> list[Figure]:
        from vitpos import plots  # matplotlib is imported when a figure is drawn, not with the experiment

        return [Figure("extrapolate", "row / column probe skill above chance per layer and top-1 at the training "
                       "size and larger grids", lambda r, p: plots.plot_extrapolate(r, p))]

    def section(self, result: ExtrapolateResult, claims: ClaimRules) -> str:
        return extrapolate_section.section(result)

    def summary(self, result: ExtrapolateResult, claim: str) -> str:
        return extrapolate_section.summary(result)
