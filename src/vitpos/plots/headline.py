"""The report's headline figure: APE and RoPE side by side, one panel per kind of evidence.

(a) probes: row and column decodability per layer (depth-normalised) for every model;
(b) C2: the top-1 drop of each permuted feature set beside its matched random control (//) and the
    all-positional set beside the same-position swap C2 reads (xx), with 95 % intervals (APE models);
    where the permutation has several SAE seeds, a bar is the drop pooled over them, as the claims read it;
(c) C3/C4: recovery Rec(l) after restoring the rotations from R (RoPE models);
(d) C5: the per-head top-1 drop of one RoPE model, its primary rebuilding head ringed.
A panel without data says so in place, so the figure's layout never depends on what ran.
In (a)-(c) the seeds of one model family share a colour ((a), (c): one legend entry, its first model
drawn bold, the other seeds thin; (b): each seed lighter), so twelve models read as four encodings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from matplotlib.ticker import MaxNLocator

from vitpos.plots.sweeps import CYCLE, OKABE_ITO, drop_error, mathtext_safe, new_figure, save_figure

# the study-level figure reads several experiments' results (it sits above them, beside the report)
from vitpos.results.ape_permute import NULLS, ApePermuteResult, VariantResult
from vitpos.results.base import Result, Skipped
from vitpos.results.probe import ProbeSiteResult
from vitpos.results.rope_axis import RopeAxisResult
from vitpos.results.rope_heads import RopeHeadsResult

Models = Mapping[str, Mapping[str, Result | Skipped]]  # spec -> experiment name -> its result
R = TypeVar("R", bound=Result)

# each permuted set beside its matched random control (//; the all-positional set also beside the same-position
# swap C2 reads, xx), then the SAE-free APE shuffle
_APE_BARS = (("all_positional", "all\npositional"), ("random_all_positional", "its\ncontrol"),
             ("swap_all_positional", "its null:\nswap"),
             ("all", "row+col"), ("random_features", "its\ncontrol"),
             ("row_only", "row"), ("random_row", "its\ncontrol"), ("col_only", "col"), ("random_col", "its\ncontrol"),
             ("pos_embed_shuffle", "APE table\nshuffled"))
_APE_CONTROLS = {"random_all_positional", "random_features", "random_row", "random_col"}


def _results(models: Models, name: str, kind: type[R]) -> list[tuple[str, R]]:
    """(spec, result) of every model with a `kind` result of experiment `name`, in the models' order."""
    return [(spec, r) for spec, m in models.items() if isinstance(r := m.get(name), kind)]


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666", fontsize=9, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


LEGEND_CHARS = 40  # a longer spec (a timm name with its query) would push the legend out of its panel


def legend_name(spec: str, limit: int = LEGEND_CHARS, differs_at: int | None = None) -> str:
    """`spec` elided in the middle to about `limit` characters; the report's tables give it in full.
    `differs_at`: the first character where it differs from another spec's same elision, kept in view."""
    if len(spec) <= limit:
        return spec
    tail = limit // 3
    if differs_at is None or differs_at < limit - tail - 1:
        return spec[:limit - tail - 1] + "…" + spec[-tail:]
    start = max(differs_at - tail, tail + 1)
    window = spec[start:start + limit - tail - 2]
    return spec[:tail] + "…" + window + ("…" if start + len(window) < len(spec) else "")


def legend_names(specs: list[str], limit: int = LEGEND_CHARS) -> dict[str, str]:
    """Each spec's legend name; specs whose elisions collide keep the part where they differ."""
    plain = {s: legend_name(s, limit) for s in specs}
    out = dict(plain)
    for s in specs:
        others = [o for o in specs if o != s and plain[o] == plain[s]]
        if others:
            d = min(next((i for i, (a, b) in enumerate(zip(s, o, strict=False)) if a != b), len(s)) for o in others)
            out[s] = legend_name(s, limit, differs_at=d)
    return out


class _FamilyStyle:
    """Colour per model family (fixed by first appearance in `families`, so a family keeps its colour
    in every panel), and how many of the family's models this panel has drawn before: the first is
    drawn bold (and, in (b), solid) and labelled, further seeds thin (lighter) and unlabelled."""

    def __init__(self, families: Mapping[str, str]):
        self.families = families
        order = list(dict.fromkeys(families.values()))
        self.colour = {fam: CYCLE[i % len(CYCLE)] for i, fam in enumerate(order)}
        self.drawn: dict[str, int] = {}
        self.names = legend_names(order)

    def __call__(self, spec: str) -> tuple[str, int, str | None]:
        """(colour, seeds of its family drawn before in this panel, legend name for the first or None)."""
        fam = self.families.get(spec, spec)
        nth = self.drawn.get(fam, 0)
        self.drawn[fam] = nth + 1
        n = sum(1 for f in self.families.values() if f == fam)
        name = mathtext_safe(self.names.get(fam, legend_name(fam))) + (f" ({n} seeds)" if n > 1 else "")
        return self.colour.get(fam, CYCLE[0]), nth, (name if nth == 0 else None)

    def line(self, spec: str) -> tuple[str, float, float, str | None]:
        """(colour, line width, alpha, legend name or None) of a curve."""
        colour, nth, name = self(spec)
        return colour, (1.6 if nth == 0 else 0.8), (1.0 if nth == 0 else 0.55), name


def _probes(ax, models: Models, style: _FamilyStyle) -> None:
    drawn = 0
    for spec, p in _results(models, "probe", ProbeSiteResult):
        L = max(len(p.layers) - 1, 1)
        x = [layer / L for layer in p.layers]
        color, lw, alpha, name = style.line(spec)
        ax.plot(x, p.row_acc, "-", color=color, lw=lw, alpha=alpha, label=name)  # one entry per family
        ax.plot(x, p.col_acc, "--", color=color, lw=lw, alpha=alpha)
        drawn += 1
    if not drawn:
        _empty(ax, "no probe results")
        return
    ax.set_xlabel("layer / depth")
    ax.set_ylabel("probe accuracy")
    ax.set_ylim(0, 1.02)
    # below the axes: inside, the curves of a 7-encoding zoo fill every height the legend could take
    ax.legend(fontsize=6, ncol=3, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.13))


def _drop_as_read(doc: ApePermuteResult, name: str, entry: VariantResult) -> tuple[float, float, float]:
    """(drop, down, up) as the claims table reads it: pooled over the SAE seeds where there are several (the
    rule's number), else the one SAE's drop and interval."""
    read = doc.drop_as_read(name)
    ci = None if read is None else read[1]
    if read is None or ci is None:
        return drop_error(entry)  # no interval: the bar shows +- the drop's std
    d = read[0]
    return d, max(d - ci[0], 0.0), max(ci[1] - d, 0.0)


def _ape(ax, models: Models, style: _FamilyStyle) -> None:
    docs = _results(models, "ape_permute", ApePermuteResult)
    if not docs:
        _empty(ax, "no APE model: permutation not applicable")
        return
    width = 0.8 / len(docs)
    for j, (spec, doc) in enumerate(docs):
        xs, ys, lows, highs, hatches = [], [], [], [], []
        for i, (v, _) in enumerate(_APE_BARS):
            entry = doc.variant(v)
            if entry is not None:
                d, lo, hi = _drop_as_read(doc, v, entry)
                xs.append(i + (j - (len(docs) - 1) / 2) * width)
                ys.append(d)
                lows.append(lo)
                highs.append(hi)
                hatches.append("//" if v in _APE_CONTROLS else "xx" if v in NULLS else "")
        colour, nth, _ = style(spec)  # the family's colour (as in (a)), lighter for each further seed
        ax.bar(xs, ys, width, yerr=[lows, highs], color=colour, alpha=max(1.0 - 0.3 * nth, 0.3),
               label=mathtext_safe(legend_name(spec)), capsize=2, hatch=hatches,
               edgecolor="black", linewidth=0.4)
    ax.set_xticks(range(len(_APE_BARS)), [label for _, label in _APE_BARS], fontsize=6)
    ax.axhspan(24, 31, color=OKABE_ITO["yellow"], alpha=0.25, lw=0, label="study: 24-31 pts")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_ylabel("top-1 drop (points, 95% CI)")
    # below the bars (as in (a)): inside, "best" still landed on the APE-shuffle bars of the zoo
    ax.legend(fontsize=6, ncol=3, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.16))


def _recovery(ax, models: Models, family_style: _FamilyStyle) -> None:
    drawn = 0
    for spec, doc in _results(models, "rope_axis", RopeAxisResult):
        color, lw, alpha, name = family_style.line(spec)
        for axis, style in (("row", "-"), ("col", "--")):
            per_r = doc.recovery.get(axis) or {}
            if not per_r:
                continue
            rec = per_r[sorted(per_r, key=int)[len(per_r) // 2]]
            pts = [(layer, r) for layer, r in zip(rec.layers, rec.rec, strict=False) if r is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o", ms=3 if name else 2, color=color, lw=lw,
                        alpha=alpha, label=None if name is None else f"{name} {axis}")
                drawn += 1
    if not drawn:
        _empty(ax, "no RoPE model: axis removal not applicable")
        return
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.axhline(1, color="black", lw=0.6, ls=":")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xlabel("layer (each model restored from its middle R)")
    ax.set_ylabel("recovery Rec(l)")
    ax.legend(fontsize=6, frameon=False)


def _heads(fig, ax, models: Models) -> None:
    doc, spec = None, None
    for s, d in _results(models, "rope_heads", RopeHeadsResult):
        if d.drop_points:
            doc, spec = d, s
            if "mixed" in s:
                break  # prefer a mixed-frequency model: its heads are the study's C5 subject
    if doc is None:
        _empty(ax, "no RoPE model: head ablation not applicable")
        return
    im = ax.imshow(doc.drop_points, cmap="viridis", aspect="auto")
    fig.colorbar(im, ax=ax, label="top-1 drop (points)")
    prim = doc.primary_rebuilding_head
    if prim:
        ax.scatter([prim[1]], [doc.layers.index(prim[0])], s=160, facecolors="none",
                   edgecolors=OKABE_ITO["vermillion"], linewidths=2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_yticks(range(len(doc.layers)), [str(layer) for layer in doc.layers])
    # said in the label, not a legend: a legend inside the heat map covers heads
    ax.set_xlabel("head" + ("  (ringed: the primary rebuilding head)" if prim else "  (no primary rebuilding head)"))
    ax.set_ylabel("layer")
    ax.set_title(f"(d) C5 per-head drop: {mathtext_safe(legend_name(str(spec), 60))}", fontsize=9)


def plot_headline(models: Models, path: str | Path, families: Mapping[str, str] | None = None) -> Path:
    """`models`: spec -> that model's results (experiment name -> typed result, `ModelEntry.results`).
    `families`: spec -> model family (seeds of one model); None: every model its own family."""
    fig = new_figure(13, 8.5)
    axes = fig.subplots(2, 2)
    families = families if families is not None else {spec: spec for spec in models}
    _probes(axes[0][0], models, _FamilyStyle(families))
    axes[0][0].set_title("(a) probes: row (solid) / col (dashed) decodability", fontsize=9)
    _ape(axes[0][1], models, _FamilyStyle(families))
    axes[0][1].set_title("(b) C2 APE: permuting features vs controls", fontsize=9)
    _recovery(axes[1][0], models, _FamilyStyle(families))
    axes[1][0].set_title("(c) C3/C4 RoPE: recovery after restoring rotations", fontsize=9)
    _heads(fig, axes[1][1], models)
    if not axes[1][1].get_title():
        axes[1][1].set_title("(d) C5 RoPE: per-head top-1 drop", fontsize=9)
    return save_figure(fig, path)
