"""Which frequencies carry position: remove one RoPE axis in one band of its frequencies only.

Each axis' rotary pairs are ranked by their frequency along it (radians per patch, folded into
[0, pi]: `RopeAxisMap.axis_pairs`; per layer and head for mixed RoPE) and cut into `bands` equal-rank
bands (3: low, mid, high). A condition removes one axis in one band (that axis' coordinate set to 0
in those pairs only, in q and k alike; every other channel keeps its rotation bit for bit) in one
window of layers [start, stop), or in every band (`all`: the axis removed, the reference). Probes
on resid_post patch tokens at the probed layers (default: the last layer of each window) and top-1.

In language models high frequencies build sharp positional heads while low ones act as semantic
channels (Barbero et al., arXiv 2410.06205). The ViT reading: per axis and window, the fall in that
axis' decodability at the final layer when its high band is removed minus the fall when its low
band is removed, with a paired-bootstrap 95 % interval over the probe test images (positive: high
frequencies carry more position), and the same difference for the top-1 drop (paired over images).

Shared prefix: a window [s, e) agrees with the clean model before s and with the same band's
longest window from s before e, so it runs only blocks >= s (or >= e) from that condition's
residual stream and copies its fits of earlier layers (the same numbers, fewer forwards and fits).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from vitpos.analysis.probes import DEFAULT_L2_GRID
from vitpos.analysis.stats import accuracy_interval, paired_bootstrap_diff
from vitpos.data.resolve import data_name, dataset_for
from vitpos.errors import VitposError
from vitpos.experiments import rope_freq_section
from vitpos.experiments.base import Experiment, Figure, Settings, SplitSizes, StageInput, StagePlan
from vitpos.experiments.checks import check_probe_images, images_of
from vitpos.experiments.common import SWEEP_TRAIN_TOKENS, advance, probe_condition, require_rope
from vitpos.hooks import remove_rope
from vitpos.models.surface import AXES, Axis, FreqBand, ModelSurface
from vitpos.progress import progress_bar
from vitpos.results.claim_rules import ClaimRules
from vitpos.results.common import MIN_GAP
from vitpos.results.rope_freq import BandInfo, BandSplit, Condition, RopeFreqResult

Window = tuple[int, int]  # layers [start, stop)


def band_names(count: int) -> list[str]:
    """Band labels, lowest frequencies first."""
    return {2: ["low", "high"], 3: ["low", "mid", "high"]}.get(count, [f"b{i}" for i in range(count)])


@dataclass(frozen=True)
class Spec:
    """One condition: `axis` removed in band `band` (None: every band) in layers [start, stop)."""

    axis: Axis
    band: int | None
    window: Window
    count: int

    @property
    def name(self) -> str:
        label = "all" if self.band is None else band_names(self.count)[self.band]
        return f"no_{self.axis}_{label}_L{self.window[0]}-{self.window[1] - 1}"

    def context(self, surface: ModelSurface) -> Callable[[], AbstractContextManager]:
        band = None if self.band is None else FreqBand(self.band, self.count)
        return lambda: remove_rope(surface, {self.axis: None}, layers=range(*self.window), band=band)


def default_windows(depth: int) -> list[Window]:
    """First half, second half, every layer."""
    half = max(1, depth // 2)
    return [(0, half), (half, depth), (0, depth)] if depth > 1 else [(0, depth)]


def default_layers(windows: list[Window]) -> list[int]:
    """The last layer of each window."""
    return sorted({stop - 1 for _, stop in windows})


def check_settings(surface: ModelSurface, bands: int, windows: list[Window], layers: list[int]) -> None:
    L = surface.depth
    bad = [w for w in windows if not 0 <= w[0] < w[1] <= L]
    if bad:
        raise VitposError(f"--windows {','.join(f'{s}:{e}' for s, e in bad)}: a window START:STOP needs "
                          f"0 <= START < STOP <= {L} for {surface.spec} (depth {L}; layers START..STOP-1)")
    if not windows:
        raise VitposError("--windows is empty: give at least one START:STOP")
    off = [layer for layer in layers if not 0 <= layer < L]
    if off or not layers:
        raise VitposError(f"--layers {','.join(map(str, off)) or '(none)'}: probed layers must lie in 0..{L - 1} "
                          f"for {surface.spec}")
    twice = [f"--windows {s}:{e}" for s, e in sorted({w for w in windows if windows.count(w) > 1})]
    twice += [f"--layers {x}" for x in sorted({x for x in layers if layers.count(x) > 1})]
    if twice:
        raise VitposError(f"{twice[0]} is given twice; give each window and probed layer once")
    amap = surface.rope_axis_map()
    fewest = min(len(amap.axis_pairs(a, 0, 0)[0]) for a in AXES)
    if not 2 <= bands <= fewest:
        raise VitposError(f"--bands {bands}: use 2..{fewest} ({surface.spec} has {fewest} rotary pairs per head on "
                          "its smaller axis; a band needs at least one)")


def schedule(windows: list[Window]) -> list[tuple[int, Window, list[Window]]]:
    """Per window start s: (s, its longest window from s, the shorter ones from s, shortest first)."""
    out = []
    for s in sorted({w[0] for w in windows}):
        group = sorted({w for w in windows if w[0] == s}, key=lambda w: -w[1])
        out.append((s, group[0], sorted(group[1:], key=lambda w: w[1])))
    return out


def band_info(surface: ModelSurface, count: int) -> dict[str, list[BandInfo]]:
    amap = surface.rope_axis_map()
    layer_heads = [(0, 0)] if amap.kind == "axial" else [(li, h) for li in range(surface.depth)
                                                         for h in range(surface.num_heads)]
    out: dict[str, list[BandInfo]] = {}
    for a in AXES:
        rows = []
        for index in [*range(count), None]:
            freqs = []
            for li, h in layer_heads:
                pairs, f = amap.axis_pairs(a, li, h)
                chosen = set(pairs) if index is None else set(amap.band_pairs(a, li, h, FreqBand(index, count)))
                freqs += [float(v) for p, v in zip(pairs, f.tolist(), strict=True) if p in chosen]
            n_pairs = len(freqs) // len(layer_heads)
            rows.append(BandInfo(name="all" if index is None else band_names(count)[index], index=index,
                                 pairs=n_pairs, freq_min=min(freqs), freq_max=max(freqs)))
        out[a] = rows
    return out


def run_rope_freq(surface: ModelSurface, data: str = "shapes", n_images: int = 300, bands: int = 3,
                  windows: list[Window] | None = None, layers: list[int] | None = None, split: str = "test",
                  seed: int = 0, out: str | Path | None = None, progress: bool = False,
                  shared_prefix: bool = True) -> RopeFreqResult:
    """bands: equal-rank bands per axis (2..pairs per head); windows: layer windows (start, stop)
    (None: first half, second half, all layers); layers: probed layers (None: each window's last)."""
    require_rope(surface)
    L = surface.depth
    wins = list(dict.fromkeys((int(s), int(e)) for s, e in windows)) if windows is not None else default_windows(L)
    check_settings(surface, bands, wins, layers if layers is not None else default_layers(wins))
    probed = sorted(set(layers)) if layers is not None else default_layers(wins)
    dataset = dataset_for(surface, data, split, limit=n_images)
    surface.check_classifier(dataset.info, data_name(data))  # before any work: every condition has a top-1
    info = band_info(surface, bands)
    families: list[tuple[Axis, int | None]] = [(a, b) for a in AXES for b in [*range(bands), None]]
    plan = schedule(wins)
    starts = [s for s, _, _ in plan if s > 0]
    kw = {"seed": seed, "layers": probed, "per_image": True}
    done: dict[str, dict] = {}
    with progress_bar(enabled=progress) as bar:
        task = bar.add_task("rope-freq", total=1 + len(families) * len(wins))
        base = probe_condition(surface, dataset, None, keep_pre=(starts[0] if starts and shared_prefix else None), **kw)
        base_probes = base["probes"]
        base_start = base.pop("start", None)
        done["baseline"] = base
        bar.update(task, advance=1)
        for s, longest, shorter in plan:
            if shared_prefix and s > 0:
                assert base_start is not None
                if s > base_start.layer:  # the clean blocks up to s
                    base_start = advance(surface, base_start, s)
            for axis, band in families:
                head = Spec(axis, band, longest, bands)
                if not shared_prefix:
                    for w in (longest, *shorter):
                        spec = Spec(axis, band, w, bands)
                        done[spec.name] = probe_condition(surface, dataset, spec.context(surface), base_probes, **kw)
                        bar.update(task, advance=1, description=f"rope-freq {spec.name}")
                    continue
                res = probe_condition(surface, dataset, head.context(surface), base_probes,
                                      start=base_start if s > 0 else None, reuse=base if s > 0 else None,
                                      keep_pre=shorter[0][1] if shorter else None, **kw)
                done[head.name] = res
                bar.update(task, advance=1, description=f"rope-freq {head.name}")
                for w in shorter:
                    kid = Spec(axis, band, w, bands)
                    if w[1] > res["start"].layer:  # the longest window's blocks up to this one's stop
                        res["start"] = advance(surface, res["start"], w[1], head.context(surface))
                    done[kid.name] = probe_condition(surface, dataset, kid.context(surface), base_probes,
                                                     start=res["start"], reuse=res, **kw)
                    bar.update(task, advance=1, description=f"rope-freq {kid.name}")
                res.pop("start", None)  # free the stream before the next family
    specs = [Spec(a, b, w, bands) for a, b in families for w in wins]
    conditions = {"baseline": _condition(base, None, None)}
    whole = {(spec.axis, spec.window): done[spec.name] for spec in specs if spec.band is None}
    for spec in specs:
        conditions[spec.name] = _condition(done[spec.name], spec, base, whole[(spec.axis, spec.window)])
    splits = [_split(done, a, w, bands, probed) for a in AXES for w in wins]
    H, W = surface.grid
    n_test = int(next(iter(base["per_image"].values()))["row"].numel())
    result = RopeFreqResult(
        model=surface.spec, data=data_name(data), split=split, n_images=len(dataset), n_probe_test_images=n_test,
        site="resid_post", layers=probed, windows=[list(w) for w in wins], bands=bands,
        rope_kind=surface.rope_axis_map().kind, chance_row=1 / H, chance_col=1 / W, band_info=info,
        conditions=conditions, splits=splits, min_gap=MIN_GAP)
    if out is not None:
        RopeFreqExperiment().write(result, out)
    return result


def _condition(res: Mapping[str, Any], spec: Spec | None, base: Mapping[str, Any] | None = None,
               whole: Mapping[str, Any] | None = None) -> Condition:
    doc = res["doc"]
    correct = res["correct"].float()
    fields: dict[str, Any] = {k: doc[k] for k in ("row_acc", "col_acc", "row_acc_orig_probe", "col_acc_orig_probe")}
    fields.update(top1=doc["top1"], top1_ci95=accuracy_interval(correct), axis=None, band=None, window=None,
                  top1_drop_points=None, top1_drop_ci95=None, axis_drop_points=None, axis_drop_ci95=None, share=None)
    if spec is None or base is None or whole is None:
        return Condition.model_validate(fields)
    a, layers = spec.axis, res["layers"]
    drop = [c - v for c, v in zip(base["doc"][f"{a}_acc"], doc[f"{a}_acc"], strict=True)]
    ref = [c - v for c, v in zip(base["doc"][f"{a}_acc"], whole["doc"][f"{a}_acc"], strict=True)]
    fields.update(
        axis=a, band="all" if spec.band is None else band_names(spec.count)[spec.band], window=list(spec.window),
        top1_drop_points=100 * (base["doc"]["top1"] - doc["top1"]),
        top1_drop_ci95=_points(paired_bootstrap_diff(base["correct"].float(), correct)),
        axis_drop_points=[100 * v for v in drop],
        axis_drop_ci95=[_points(paired_bootstrap_diff(base["per_image"][li][a], res["per_image"][li][a]))
                        for li in layers],
        share=[None if r < MIN_GAP else d / r for d, r in zip(drop, ref, strict=True)])
    return Condition.model_validate(fields)


def _points(iv: list[float]) -> list[float]:
    """An interval of fractions in points."""
    return [100 * iv[0], 100 * iv[1]]


def _split(done: Mapping[str, Mapping[str, Any]], axis: Axis, window: Window, bands: int,
           layers: list[int]) -> BandSplit:
    """high minus low at the last probed layer: drop(high) - drop(low) = P_low - P_high per image."""
    hi, lo = (done[Spec(axis, b, window, bands).name] for b in (bands - 1, 0))
    layer = layers[-1]
    pos = hi["doc"][f"{axis}_acc"][-1], lo["doc"][f"{axis}_acc"][-1]
    pos_ci = paired_bootstrap_diff(lo["per_image"][layer][axis], hi["per_image"][layer][axis])
    top_ci = paired_bootstrap_diff(lo["correct"].float(), hi["correct"].float())
    where = "high" if pos_ci[0] > 0 else "low" if pos_ci[1] < 0 else "unresolved"
    return BandSplit(axis=axis, window=list(window), layer=layer,
                     high_minus_low_axis_drop_points=100 * (pos[1] - pos[0]),
                     high_minus_low_axis_drop_ci95=_points(pos_ci),
                     high_minus_low_top1_drop_points=100 * (lo["doc"]["top1"] - hi["doc"]["top1"]),
                     high_minus_low_top1_drop_ci95=_points(top_ci), position_in=where)


def plan_rope_freq(settings: RopeFreqSettings, surface: ModelSurface, sizes: SplitSizes,
                   shared_prefix: bool = True) -> StagePlan:
    """What run_rope_freq(n_images=settings.images, bands=, windows=, layers=) computes. Refits
    under a condition search at most 2 L2 values (the clean model's row and column choices)."""
    n, L, N = sizes.n("test", settings.images), surface.depth, surface.num_patches
    wins = list(dict.fromkeys((int(s), int(e)) for s, e in settings.windows)) if settings.windows else \
        default_windows(L)
    probed = sorted(set(settings.layers)) if settings.layers else default_layers(wins)
    families = 2 * (settings.bands + 1)

    def fits(from_layer: int, l2_values: int = 2) -> StagePlan:
        count = sum(1 for layer in probed if layer >= from_layer)
        return StagePlan.probe_fits(count, n, N, SWEEP_TRAIN_TOKENS, l2_values)

    plan = StagePlan.full(n, L) + fits(0, len(DEFAULT_L2_GRID))  # the clean model
    if not shared_prefix:
        for _ in range(families * len(wins)):
            plan += StagePlan.full(n, L) + fits(0)
        return plan
    starts = [s for s, _, _ in schedule(wins) if s > 0]
    if starts:  # the clean stream moved from the first start to the last
        plan += StagePlan(blocks=n * (starts[-1] - starts[0]))
    for s, _, shorter in schedule(wins):
        one = (StagePlan.full(n, L) if s == 0 else StagePlan(blocks=n * (L - s))) + fits(s)
        if shorter:  # the longest window's stream moved from the first shorter stop to the last
            one += StagePlan(blocks=n * (shorter[-1][1] - shorter[0][1]))
        for _, e in shorter:
            one += StagePlan(blocks=n * (L - e)) + fits(e)
        for _ in range(families):
            plan += one
    return plan


def parse_windows(text: str | None) -> list[Window] | None:
    """'0:3,3:6' -> [(0, 3), (3, 6)]; None -> None (the defaults); empty, an empty item or a window
    given twice is refused (`vitpos.lists`)."""
    from vitpos.lists import check_distinct, comma_items

    if text is None:
        return None
    out: list[Window] = []
    for part in comma_items(text, "--windows", "0:3,3:6", distinct=False):
        bits = part.split(":")
        try:
            if len(bits) != 2:
                raise ValueError(part)
            out.append((int(bits[0]), int(bits[1])))
        except ValueError:
            raise VitposError(f"--windows {text!r}: give windows as START:STOP[,START:STOP...], e.g. 0:3,3:6") from None
    check_distinct(out, text, "--windows", "0:3,3:6", show=lambda w: f"{w[0]}:{w[1]}")
    return out


class RopeFreqSettings(Settings):
    """`rope_freq:` in the run config."""

    QUICK = {"images": 120}
    images: int = Field(default=300, ge=2, description="test-split images, split by image into probe train/test")
    bands: int = Field(default=3, ge=2,
                       description="equal-rank bands of each axis' rotary frequencies (3: low/mid/high)")
    windows: list[tuple[int, int]] | None = Field(
        default=None, min_length=1, description="layer windows [start, stop); None = first half, second half, all")
    layers: list[int] | None = Field(default=None, min_length=1,
                                     description="probed layers; None = the last layer of each window")


class RopeFreqExperiment(Experiment[RopeFreqResult, RopeFreqSettings]):
    name = "rope_freq"
    version = 1
    title = "RoPE frequency bands: which frequencies carry position"
    result_type = RopeFreqResult
    settings_type = RopeFreqSettings
    scheme = "rope"

    def check(self, settings: RopeFreqSettings, surface: ModelSurface, data: str, sizes: SplitSizes | None) -> None:
        s = settings
        check_probe_images(images_of(sizes, "test", s.images), "rope_freq.images")
        wins = ([(int(a), int(b)) for a, b in s.windows] if s.windows is not None
                else default_windows(surface.depth))
        check_settings(surface, s.bands, wins, list(s.layers) if s.layers is not None
                       else default_layers(wins))

    def plan(self, settings: RopeFreqSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        return plan_rope_freq(settings, surface, sizes)

    def run_stage(self, surface: ModelSurface, stage: StageInput[RopeFreqSettings]) -> RopeFreqResult:
        s = stage.settings
        return run_rope_freq(surface, data=stage.data, n_images=s.images, bands=s.bands, windows=s.windows,
                             layers=s.layers, seed=stage.seed)

    def figures(self, result: RopeFreqResult) -> list[Figure]:
        from vitpos import plots  # matplotlib is imported when a figure is drawn, not with the experiment

        return [Figure("rope_freq", "the removed axis' decodability and top-1 with one frequency band of it removed, "
                       "per layer window", lambda r, p: plots.plot_rope_freq(r, p))]

    def section(self, result: RopeFreqResult, claims: ClaimRules) -> str:
        return rope_freq_section.section(result)

    def summary(self, result: RopeFreqResult, claim: str) -> str:
        return rope_freq_section.summary(result)

