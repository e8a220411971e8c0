"""E6-E7 (C4, C5): which heads are axis-specialised, which rebuild position, which matter for accuracy.

Per (layer, head):
  axis_index  S = (A_row - A_col) / (A_row + A_col) in [-1, 1], A_a = mean over patch queries of
              KL(attention clean || attention with axis a removed for this head only)
              (+1: the head's pattern depends on row offsets only; -1: column only; |S| >= 0.5 = specialised)
  rebuild_score  in the restore setting (axis removed in layers < R, restored from R on), the fall
              in mean recovery Rec over layers >= R when this head's rotation stays removed too
              (0 for heads in layers < R, whose rotation is removed anyway: reported as null)
  drop_points  100 x (top-1 intact - top-1 with all of this head's rotations removed)
primary_rebuilding_head = argmax rebuild_score; C5 holds when it also has the largest drop.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from vitpos import plots
from vitpos.analysis.forward import predict
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.experiments.base import Done, Experiment, Figure, Result, StageInput
from vitpos.experiments.common import check_restore_points, condition_context, probe_condition, recovery, require_rope
from vitpos.hooks import capture, remove_rope
from vitpos.models.surface import Axis, ModelSurface, Site
from vitpos.progress import progress_bar

EPS = 1e-12
AXES = ("row", "col", "both")


class RopeHeadsResult(Result):
    """Per-head matrices are indexed [layer][head] over `layers` x `num_heads`."""

    model: str
    data: str
    axis: str
    layers: list[int]
    num_heads: int
    restore_from: int
    baseline_top1: float
    n_top1_images: int
    n_probe_images: int
    recovery_restore: float
    axis_index: list[list[float]]
    kl: dict[str, list[list[float]]]
    rebuild_score: list[list[float | None]]  # None for heads in layers < R
    drop_points: list[list[float]]
    primary_rebuilding_head: list[int] | None
    primary_head_drop_rank: int | None
    largest_drop_head: list[int]
    primary_head_drop_rank_after_R: int | None
    largest_drop_head_after_R: list[int] | None
    primary_is_largest_drop: bool
    specialised_heads: list[list[int]]


def _kl_rows(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) along the last axis (attention distributions)."""
    return (p * (torch.log(p + EPS) - torch.log(q + EPS))).sum(-1)


@torch.no_grad()
def axis_index(surface: ModelSurface, images: torch.Tensor) -> tuple[list[list[float]], dict]:
    """Behavioural axis specialisation of every head from attention patterns."""
    npt = surface.num_prefix_tokens
    L, Hh = surface.depth, surface.num_heads
    with capture(surface, "attn_pattern") as c:
        surface(images)
    clean = {layer: c[str(Site(layer, "attn_pattern"))] for layer in range(L)}
    A = {a: torch.zeros(L, Hh) for a in ("row", "col")}
    for layer in range(L):
        for h in range(Hh):
            for a in ("row", "col"):
                site = Site(layer, "attn_pattern")
                with remove_rope(surface, {a: [h]}, layers=[layer]), capture(surface, [site]) as c2:
                    surface(images)
                p = clean[layer][:, h, npt:]  # patch queries
                q = c2[str(site)][:, h, npt:]
                A[a][layer, h] = _kl_rows(p, q).mean()
    S = (A["row"] - A["col"]) / (A["row"] + A["col"] + EPS)
    return S.tolist(), {"kl_row": A["row"].tolist(), "kl_col": A["col"].tolist()}


def run_rope_heads(surface: ModelSurface, data: str = "shapes", axis: str = "both", restore_from: int | None = None,
                   n_probe_images: int = 500, n_top1_images: int = 2000, n_attn_images: int = 64,
                   split: str = "test", seed: int = 0, out: str | Path | None = None,
                   progress: bool = False) -> RopeHeadsResult:
    require_rope(surface)
    if axis not in AXES:
        raise VitposError(f"unknown --axis {axis!r}; use row, col or both")
    L, Hh = surface.depth, surface.num_heads
    if restore_from is not None:
        check_restore_points(surface, [restore_from], "--restore-from")
    R = restore_from if restore_from is not None else max(1, L // 2)
    axes_of: dict[str, tuple[Axis, ...]] = {"row": ("row",), "col": ("col",), "both": ("row", "col")}
    axes = axes_of[axis]
    probe_set = dataset_for(surface, data, split, limit=n_probe_images)
    top1_set = dataset_for(surface, data, split, limit=n_top1_images)
    surface.check_classifier(top1_set.info, data_name(data))  # before any work: the drops are top-1
    attn_images = next(iter(dataset_for(surface, data, split, limit=n_attn_images).batches(n_attn_images)))[0]
    later = list(range(R, L))
    steps = 2 + L * Hh + len(later) * Hh + 1
    with progress_bar(enabled=progress) as bar:
        task = bar.add_task("rope-heads", total=steps)
        S, kl = axis_index(surface, attn_images)
        bar.update(task, advance=1, description="rope-heads: baseline probes")
        # recovery reference points: clean, axis off everywhere, and the plain restore setting
        clean_fit = probe_condition(surface, probe_set, None, seed=seed, layers=later)
        clean, base_probes = clean_fit["doc"], clean_fit["probes"]
        off = probe_condition(surface, probe_set, condition_context(surface, axes), base_probes, seed=seed,
                              layers=later)["doc"]
        restored = probe_condition(surface, probe_set, condition_context(surface, axes, R), base_probes, seed=seed,
                                   layers=later)["doc"]
        bar.update(task, advance=1)

        def mean_rec(doc) -> float:
            vals = [recovery(clean[f"{a}_acc"], off[f"{a}_acc"], doc[f"{a}_acc"], R, later)["mean_rec"] for a in axes]
            vals = [v for v in vals if v is not None]
            return sum(vals) / len(vals) if vals else float("nan")

        rec_restore = mean_rec(restored)
        rebuild: list[list[float | None]] = [[None] * Hh for _ in range(L)]
        for layer in later:
            for h in range(Hh):
                ctx = condition_context(surface, axes, R, extra={layer: {a: [h] for a in axes}})
                doc = probe_condition(surface, probe_set, ctx, base_probes, seed=seed, layers=later)["doc"]
                rebuild[layer][h] = rec_restore - mean_rec(doc)
                bar.update(task, advance=1, description=f"rope-heads: rebuild L{layer}H{h}")
        preds, labels = predict(surface, top1_set)
        base_top1 = float((preds == labels).float().mean())
        drops = [[0.0] * Hh for _ in range(L)]
        for layer in range(L):
            for h in range(Hh):
                p, y = predict(surface, top1_set, context=lambda layer=layer, h=h: remove_rope(
                    surface, {"row": [h], "col": [h]}, layers=[layer]))
                drops[layer][h] = 100.0 * (base_top1 - float((p == y).float().mean()))
                bar.update(task, advance=1, description=f"rope-heads: ablate L{layer}H{h}")
    flat = [(rebuild[layer][h], layer, h) for layer in later for h in range(Hh)
            if rebuild[layer][h] == rebuild[layer][h]]
    primary = max(flat)[1:] if flat else None
    order = sorted(((drops[layer][h], layer, h) for layer in range(L) for h in range(Hh)), reverse=True)
    largest = order[0][1:]
    rank = None if primary is None else 1 + [o[1:] for o in order].index(primary)
    order_late = [o for o in order if o[1] >= R]  # heads that can rebuild (layers >= R) only
    rank_late = None if primary is None else 1 + [o[1:] for o in order_late].index(primary)
    result = RopeHeadsResult.model_validate({
        "model": surface.spec, "data": data_name(data), "axis": axis, "layers": list(range(L)), "num_heads": Hh,
        "restore_from": R, "baseline_top1": base_top1, "n_top1_images": len(top1_set),
        "n_probe_images": len(probe_set), "recovery_restore": rec_restore,
        "axis_index": S, "kl": kl, "rebuild_score": rebuild, "drop_points": drops,
        "primary_rebuilding_head": None if primary is None else list(primary),
        "primary_head_drop_rank": rank, "largest_drop_head": list(largest),
        "primary_head_drop_rank_after_R": rank_late,
        "largest_drop_head_after_R": list(order_late[0][1:]) if order_late else None,
        "primary_is_largest_drop": primary is not None and tuple(primary) == tuple(largest),
        "specialised_heads": [[layer, h] for layer in range(L) for h in range(Hh) if abs(S[layer][h]) >= 0.5],
    })
    if out is not None:
        RopeHeadsExperiment().write(result, out)
    return result


class RopeHeadsExperiment(Experiment[RopeHeadsResult]):
    name = "rope_heads"
    title = "RoPE per-head roles and ablation (C4, C5)"
    claims = ("C4", "C5")
    result_type = RopeHeadsResult

    def applies_to(self, surface: ModelSurface) -> str | None:
        return None if surface.has_rope else f"no rotary embedding (scheme {surface.scheme})"

    def stage_settings(self, config, surface: ModelSurface, prior: Mapping[str, Done], quick: bool) -> dict:
        return config.rope_heads.model_dump()

    def run_stage(self, surface: ModelSurface, stage: StageInput) -> RopeHeadsResult:
        s = stage.settings
        return run_rope_heads(surface, data=stage.data, axis=s["axis"], restore_from=s["restore_from"],
                              n_probe_images=s["probe_images"], n_top1_images=s["top1_images"],
                              n_attn_images=s["attn_images"], seed=stage.seed)

    def figures(self, result: RopeHeadsResult) -> list[Figure]:
        return [Figure("rope_heads", "axis index, rebuilding score and top-1 drop per head",
                       lambda r, p: plots.plot_rope_heads(r.to_json(), p))]
