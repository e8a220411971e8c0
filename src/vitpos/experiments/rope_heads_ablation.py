"""rope_heads' top-1 head ablations (C5): per-image correctness with each head's rotations removed
(`head_drops`, the adaptive race `in_the_race` / `screen_cut`), and C5 under the counterfactual
ablations (`c5_under_ablations`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, NamedTuple

import torch

from vitpos.analysis.forward import predict
from vitpos.analysis.stats import LEVEL, bootstrap_means
from vitpos.errors import VitposError
from vitpos.experiments.common import sweep_batch
from vitpos.experiments.rope_heads_analysis import _column_intervals, _grid
from vitpos.hooks import head_means, mean_ablate_heads, remove_rope, rope_coordinates
from vitpos.models.surface import ModelSurface
from vitpos.results.rope_heads import C5Ablation
from vitpos.rope import CoordEdit
from vitpos.runtime.device import trimmed


def _ablate(surface: ModelSurface, layer: int, head: int):
    return remove_rope(surface, {"row": [head], "col": [head]}, layers=[layer])


class HeadDrops(NamedTuple):
    """Per-image top-1 correctness: intact (n,) and with each head's rotations removed (L, H, n).

    measured: (L, H) images per head, always the first ones (adaptive top-1: a head out of the race
    after the screen has only the screen's images; its other entries are meaningless); None: all n.
    screened: images in the adaptive top-1 screen (every head saw them); None: no screen ran."""

    clean: torch.Tensor
    ablated: torch.Tensor
    measured: torch.Tensor | None = None
    screened: int | None = None

    @property
    def base_top1(self) -> float:
        return float(self.clean.float().mean())

    def counts(self) -> list[list[int]]:
        L, H, n = self.ablated.shape
        return [[n] * H for _ in range(L)] if self.measured is None else self.measured.tolist()

    def drops(self) -> list[list[float]]:
        """100 x (top-1 intact - top-1 ablated) per [layer][head], on the images the head was measured on."""
        return [[100.0 * (float(self.clean[:m].float().mean()) - float(row[:m].float().mean()))
                 for row, m in zip(layer, ms, strict=True)]
                for layer, ms in zip(self.ablated, self.counts(), strict=True)]

    def _grouped(self, per_image: torch.Tensor, level: float) -> list[list[float] | None]:
        """Column intervals of a (n, L*H) per-image difference, each column over its head's first m
        images; one set of resamples per m (heads measured on the same images stay paired)."""
        flat_m = [m for ms in self.counts() for m in ms]
        out: list[list[float] | None] = [None] * len(flat_m)
        for m in sorted(set(flat_m)):
            cols = [i for i, mi in enumerate(flat_m) if mi == m]
            for i, iv in zip(cols, _column_intervals(bootstrap_means(per_image[:m, cols]), level), strict=True):
                out[i] = iv
        return out

    def drop_intervals(self, level: float = LEVEL) -> list[list[list[float]]]:
        """Paired bootstrap interval of each head's drop (points): one set of image resamples for
        every head (every head measured on as many images), each resample's drop recomputed on the
        same images intact and ablated."""
        L, H, n = self.ablated.shape
        per_image = (self.clean.double().unsqueeze(0) - self.ablated.double().reshape(L * H, n)).T  # (n, L*H)
        return _grid(self._grouped(per_image, level), L, H)

    def raced(self, cut: int, keep: Iterable[tuple[int, int]] = ()) -> HeadDrops:
        """What the adaptive race measures, from these exhaustive results: every head on the first `cut`
        images, the rest only for the heads `in_the_race` after them (with `keep`)."""
        L, H, n = self.ablated.shape
        if cut >= n:
            return self
        race = in_the_race(HeadDrops(self.clean[:cut], self.ablated[..., :cut]), keep)
        measured = torch.tensor([[n if (li, h) in race else cut for h in range(H)] for li in range(L)])
        return HeadDrops(self.clean, self.ablated, measured, cut)

    def margin_intervals(self, primary: tuple[int, int], level: float = LEVEL) -> list[list[list[float] | None]]:
        """Interval of drop(primary) - drop(head) per head (points; None at the primary): per
        image that is correct_ablated(head) - correct_ablated(primary), the intact run cancels; over
        the images both were measured on (the primary always stays in the race)."""
        L, H, n = self.ablated.shape
        flat = self.ablated.double().reshape(L * H, n)
        per_image = (flat - flat[primary[0] * H + primary[1]]).T  # (n, L*H)
        grid: list[list[list[float] | None]] = list(_grid(self._grouped(per_image, level), L, H))
        grid[primary[0]][primary[1]] = None
        return grid


def in_the_race(screen: HeadDrops, keep: Iterable[tuple[int, int]] = (), level: float = LEVEL) -> set[tuple[int, int]]:
    """Adaptive top-1: after the screen, the heads still worth the remaining images: the leader
    (largest drop), every head whose drop interval reaches the leader's lower end (it could still be
    the largest), and `keep` (the primary rebuilding head, whose margins C5 reads)."""
    drops, ivs = screen.drops(), screen.drop_intervals(level)
    L, H = len(drops), len(drops[0])
    lead = max((drops[li][h], li, h) for li in range(L) for h in range(H))
    floor = ivs[lead[1]][lead[2]][0]
    return {(li, h) for li in range(L) for h in range(H) if ivs[li][h][1] >= floor} | {(k[0], k[1]) for k in keep}


@torch.no_grad()
def head_drops(surface: ModelSurface, dataset, shared_prefix: bool = True, batch_size: int | None = None,
               on_head: Callable[[int, int], None] | None = None, screen: int | None = None,
               keep: Iterable[tuple[int, int]] = ()) -> HeadDrops:
    """Per-image top-1 correctness intact and with all of a head's rotations removed, per head.

    shared_prefix: per batch, the clean stream is computed once, block by block, and each head of
    layer l runs blocks >= l from it; False: a full forward of the data per head.
    screen (adaptive top-1): every head on the first batches up to >= `screen` images, the rest only
    for the heads `in_the_race` (with `keep`); None: every head on every image. Both paths give the
    same numbers (the unshared one measures everything, then forgets what the race dropped)."""
    L, Hh = surface.depth, surface.num_heads
    batch_size = sweep_batch(surface, batch_size)
    if not shared_prefix:
        preds, labels = predict(surface, dataset, batch_size)
        ablated_rows = []
        for li in range(L):
            for h in range(Hh):
                p, y = predict(surface, dataset, batch_size, context=lambda li=li, h=h: _ablate(surface, li, h))
                ablated_rows.append(p == y)
                if on_head:
                    on_head(li, h)
        full = HeadDrops(preds == labels, torch.stack(ablated_rows).reshape(L, Hh, -1))
        return full.raced(screen_cut(len(labels), batch_size, screen), keep)
    surface.check_classifier(dataset.info)  # as predict: the drops are top-1
    dev = surface.device
    ablated: dict[tuple[int, int], list[torch.Tensor]] = {(li, h): [] for li in range(L) for h in range(Hh)}
    clean, labels = [], []
    cut = screen_cut(len(dataset), batch_size, screen)
    race: set[tuple[int, int]] | None = None  # None: every head runs
    seen = 0
    for x, y in trimmed(dataset.batches(batch_size)):  # 24+ forwards a batch: hand freed memory back
        if race is None and seen >= cut:
            y_seen = torch.cat(labels)
            race = in_the_race(HeadDrops(torch.cat(clean) == y_seen, torch.stack(
                [torch.cat(ablated[li, h]) == y_seen for li in range(L) for h in range(Hh)]).reshape(L, Hh, -1)), keep)
        t = surface.embed_tokens(x.to(dev, non_blocking=True))
        for li in range(L):
            for h in range(Hh):
                if race is not None and (li, h) not in race:
                    ablated[li, h].append(torch.zeros_like(y, dtype=torch.long) - 1)  # not measured: never correct
                    continue
                with _ablate(surface, li, h):
                    ablated[li, h].append(surface.forward_from(li, t).argmax(-1).cpu())
            t = surface.run_blocks(t, li, li + 1)
        clean.append(surface.head_from(t).argmax(-1).cpu())
        labels.append(y)
        seen += len(y)
    y_all = torch.cat(labels)
    rows = []
    for li in range(L):
        for h in range(Hh):
            rows.append(torch.cat(ablated[li, h]) == y_all)
            if on_head:
                on_head(li, h)
    measured = None if race is None else torch.tensor(
        [[len(y_all) if (li, h) in race else cut for h in range(Hh)] for li in range(L)])
    return HeadDrops(torch.cat(clean) == y_all, torch.stack(rows).reshape(L, Hh, -1), measured,
                     None if race is None else cut)


RACE_GUESS = 2  # heads the plan assumes stay in the adaptive top-1 race (the leader and the primary)


def screen_cut(n: int, batch_size: int, screen: int | None) -> int:
    """Images in the adaptive top-1 screen: whole batches, the first that reach `screen` (n: no screen,
    which `screen` None or 0 asks for)."""
    if not screen or screen >= n:
        return n
    return min(n, -(-max(1, screen) // batch_size) * batch_size)


# --- C5 under counterfactual ablations (issue 29, item 4) -------------------------------------------------
# Removing a head's rotations (the identity rotation) puts every key at offset 0: off-distribution. The same
# ranking under other ablations of the head says whether C5's outcome is about the head's role or about that
# shock: its rotations recomputed from another patch's coordinates (swap), from coordinates shifted by half
# the grid (shift: a relative encoding cannot see it between patches, only against the unrotated prefix
# tokens; a near-null control), jittered per patch (jitter), rescaled as DINOv3's augmentation does
# (rescale), and its output replaced by its mean (mean_output). C5's verdict rests on 'identity'.

C5_RESTS_ON = "identity"


C5_ABLATIONS = ("identity", "swap", "shift", "jitter", "rescale", "mean_output")


C5_JITTER = 0.5  # patches (std, per patch and axis)


C5_RESCALE = 2.0  # DINOv3's rescale_coords default: coordinates x [1/2, 2]; here the far end, x 2


def c5_coord_edits(grid: tuple[int, int], seed: int = 0) -> dict[str, CoordEdit]:
    """The coordinate ablations of C5, on both axes of the head's rotations."""
    H, W = grid
    return {"swap": CoordEdit("swap", seed=seed), "shift": CoordEdit("shift", offset=(H / 2, W / 2)),
            "jitter": CoordEdit("jitter", sigma=C5_JITTER, seed=seed),
            "rescale": CoordEdit("rescale", factor=C5_RESCALE)}


def c5_heads(measured: HeadDrops, primary: tuple[int, int] | None, k: int | None) -> list[tuple[int, int]]:
    """The heads C5 is measured on under the other ablations: every head (k None), else the top k
    by the identity drop and the primary, in (layer, head) order."""
    L, H, _ = measured.ablated.shape
    if k is None:
        return [(li, h) for li in range(L) for h in range(H)]
    drops = measured.drops()
    top = sorted(((drops[li][h], li, h) for li in range(L) for h in range(H)), reverse=True)[:max(0, k)]
    return sorted({(li, h) for _, li, h in top} | ({primary} if primary else set()))


def c5_heads_rule(k: int | None) -> str:
    return ("every head" if k is None else
            f"the primary and the top {k} heads by the identity drop (the others not measured under the other "
            "ablations)")


def _c5_entry(description: str, heads: list[tuple[int, int]], clean: torch.Tensor, ablated: torch.Tensor,
              primary: tuple[int, int] | None, level: float = LEVEL) -> C5Ablation:
    """Drops, paired intervals and C5's margins over `heads` from per-image correctness: clean (n,),
    ablated (k, n) in the order of `heads`."""
    c, a = clean.double(), ablated.double()
    drop_iv = _column_intervals(bootstrap_means((c.unsqueeze(0) - a).T), level)
    drops = [100.0 * (float(c.mean()) - float(row.mean())) for row in a]
    # ties broken as run_rope_heads ranks (largest (drop, layer, head) first), so the identity entry's rank
    # is `primary_head_drop_rank`
    order = sorted(range(len(heads)), key=lambda i: (drops[i], heads[i]), reverse=True)
    p = None if primary is None else heads.index(primary)
    margins: list[list[float] | None] = [None] * len(heads)
    if p is not None:
        margins = [None if i == p else iv for i, iv in enumerate(
            _column_intervals(bootstrap_means((a - a[p]).T), level))]
    others = [iv for iv in margins if iv is not None]
    outcome: Literal["holds", "fails", "inconclusive"] = (
        "fails" if p is None or any(iv[1] < 0 for iv in others)
        else "holds" if all(iv[0] > 0 for iv in others) else "inconclusive")
    return C5Ablation(description=description, heads=[list(h) for h in heads], n_images=int(c.numel()),
                      drop_points=drops, drop_ci95=drop_iv, margin_ci95=margins,
                      primary_drop_rank=None if p is None else 1 + order.index(p),
                      largest_drop_head=list(heads[order[0]]), outcome=outcome)


@torch.no_grad()
def c5_under_ablations(surface: ModelSurface, dataset, measured: HeadDrops, primary: tuple[int, int] | None,
                       heads: list[tuple[int, int]], seed: int = 0, shared_prefix: bool = True,
                       batch_size: int | None = None) -> dict[str, C5Ablation]:
    """C5 under each ablation (C5_ABLATIONS): 'identity' from the identity sweep (`measured`, every
    head, today's numbers), the others measured on `heads` over all of `dataset`'s images (the
    same images as the sweep, paired). mean_output: the head's output at patch tokens replaced by
    its mean over these images (`hooks.head_means`, one clean pass).

    shared_prefix: per batch the clean stream is computed once, block by block (up to the last
    layer of `heads`), and each ablated head of layer l runs blocks >= l from it; False: a full
    forward per head and ablation."""
    L, Hh, n = measured.ablated.shape
    counts = measured.counts()
    # adaptive top-1: only the heads measured on every image (the race, with the primary) are paired here
    ident_heads = [(li, h) for li in range(L) for h in range(Hh) if counts[li][h] == n or (li, h) == primary]
    out: dict[str, C5Ablation] = {"identity": _c5_entry(
        "rotations removed (identity rotation: every key at offset 0)", ident_heads, measured.clean,
        torch.stack([measured.ablated[li, h] for li, h in ident_heads]), primary)}
    batch_size = sweep_batch(surface, batch_size)
    dev = next(surface.model.parameters()).device
    means = head_means(surface, (x for x, _ in dataset.batches(batch_size)), sorted({li for li, _ in heads}))
    edits = c5_coord_edits(surface.grid, seed) if coordinate_edits(surface) else {}

    def context(kind: str, li: int, h: int):
        if kind == "mean_output":
            return mean_ablate_heads(surface, {li: [h]}, means)
        return rope_coordinates(surface, edits[kind], layers=[li], heads=[h])

    kinds = [*edits, "mean_output"]
    rows: dict[tuple[str, int, int], list[torch.Tensor]] = {(k, li, h): [] for k in kinds for li, h in heads}
    labels = []
    if shared_prefix:
        last = max(li for li, _ in heads)
        for x, y in trimmed(dataset.batches(batch_size)):
            t = surface.embed_tokens(x.to(dev, non_blocking=True))
            for li in range(last + 1):
                for kind in kinds:
                    for lh in heads:
                        if lh[0] == li:
                            with context(kind, lh[0], lh[1]):
                                rows[kind, lh[0], lh[1]].append(surface.forward_from(li, t).argmax(-1).cpu())
                if li < last:
                    t = surface.run_blocks(t, li, li + 1)
            labels.append(y)
        y_all = torch.cat(labels)
        correct = {key: torch.cat(v) == y_all for key, v in rows.items()}
    else:
        correct = {}
        for kind in kinds:
            for li, h in heads:
                p, y_all = predict(surface, dataset, batch_size, context=lambda k=kind, li=li, h=h: context(k, li, h))
                correct[kind, li, h] = p == y_all
    clean = measured.clean
    descriptions = {k: f"rotations recomputed: {e.describe()}" for k, e in edits.items()}
    descriptions["mean_output"] = "output (patch tokens) replaced by its mean over the images"
    for kind in kinds:
        out[kind] = _c5_entry(descriptions[kind], heads, clean,
                              torch.stack([correct[kind, li, h] for li, h in heads]), primary)
    return out


def coordinate_edits(surface: ModelSurface) -> bool:
    """Whether the family recomputes its rotations from edited coordinates (timm RoPE families and
    vitpos' own); the others (Hugging Face DINOv3) get the mean-output ablation only."""
    try:
        surface.rope_coords()
    except VitposError:
        return False
    return True
