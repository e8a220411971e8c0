"""The headline figure reads 12 models as 4 encodings: seeds of a family share a colour and one legend entry."""

from __future__ import annotations

import copy
from pathlib import Path

import vitpos.plots.headline as headline
from conftest import GOLDEN
from vitpos.claims.inputs import model_family
from vitpos.results.probe import ProbeSiteResult

_GOLDEN_PROBE = ProbeSiteResult.model_validate(copy.deepcopy(GOLDEN["models"]["builtin:ape"]["probe"]))


def _probe(level: float) -> dict:
    L = len(_GOLDEN_PROBE.layers)
    return {"probe": _GOLDEN_PROBE.model_copy(update={"row_acc": [level] * L, "col_acc": [level / 2] * L})}


def _drawn(monkeypatch, models: dict, families: dict | None):
    figs = []
    monkeypatch.setattr(headline, "save_figure", lambda fig, path: figs.append(fig) or Path(path))
    headline.plot_headline(models, "unused.png", families=families)
    (fig,) = figs
    return fig.axes[0]  # panel (a): the probes


def test_seeds_share_their_familys_colour_and_one_legend_entry(monkeypatch):
    models = {"ape": _probe(1.0), "rope": _probe(0.4), "ape-seed1": _probe(0.9), "rope-seed1": _probe(0.3)}
    ax = _drawn(monkeypatch, models, {spec: model_family(spec) for spec in models})
    lines = ax.get_lines()  # row and col per model, in the models' order
    colour = {spec: lines[2 * i].get_color() for i, spec in enumerate(models)}
    assert colour["ape"] == colour["ape-seed1"] != colour["rope"] == colour["rope-seed1"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ape (2 seeds)", "rope (2 seeds)"]
    # the family's first model bold, its other seeds thin
    assert lines[0].get_linewidth() > lines[4].get_linewidth()


def test_without_families_every_model_is_its_own(monkeypatch):
    models = {"ape": _probe(1.0), "ape-seed1": _probe(0.9)}
    ax = _drawn(monkeypatch, models, None)
    lines = ax.get_lines()
    assert lines[0].get_color() != lines[2].get_color()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ape", "ape-seed1"]


def test_a_long_spec_keeps_the_legend_inside_its_panel(monkeypatch):
    """A timm spec with its query string (~60 characters) is elided in the legend, so the legend fits
    the probe panel's width (it once ran off the figure's left edge) below the plot (inside, it covered
    the zoo's curves); the elided name still tells models apart."""
    long = "timm:vit_small_patch14_dinov2?img_size=224&num_classes=0"
    models = {long: _probe(1.0), long.replace("224", "448"): _probe(0.9)}
    ax = _drawn(monkeypatch, models, None)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(len(t) <= headline.LEGEND_CHARS for t in texts)
    assert len(set(texts)) == 2 and all(t.startswith("timm:vit_smal") for t in texts)
    assert "224" in texts[0] and "448" in texts[1]  # where the two specs differ stays in view
    fig = ax.figure
    fig.canvas.draw()
    box, panel = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert panel.x0 <= box.x0 and box.x1 <= panel.x1
    assert box.y1 <= panel.y0  # below the plot: it covers no curve


def test_panel_b_draws_the_drop_the_claims_read_pooled_over_sae_seeds(monkeypatch):
    """Where the permutation has several SAE seeds, panel (b)'s all-positional and swap bars are the pooled
    drops C2 reads (not the run seed's SAE's); without a seed pool they are the one SAE's."""
    from vitpos.results.ape_permute import ApePermuteResult, PermuteSeedPool, PooledDrop

    ap = ApePermuteResult.model_validate(copy.deepcopy(GOLDEN["models"]["builtin:ape"]["ape_permute"]))
    own = ap.variant("all_positional")
    assert own is not None and own.drop_points is not None
    pooled = PooledDrop(drop_points=own.drop_points + 7.0, drop_ci95=[own.drop_points + 5.0, own.drop_points + 9.0],
                        per_seed=[own.drop_points, own.drop_points + 7.0, own.drop_points + 14.0],
                        per_seed_n_features=[1, 1, 1])
    pool = PermuteSeedPool(sae_seeds=[0, 1, 2], interval_sources=["images", "sae_seeds"],
                           variants={"all_positional": pooled})

    def first_bar(doc: ApePermuteResult) -> float:
        figs = []
        monkeypatch.setattr(headline, "save_figure", lambda fig, path: figs.append(fig) or Path(path))
        headline.plot_headline({"builtin:ape": {"ape_permute": doc}}, "unused.png")
        bars = [p for p in figs[-1].axes[1].patches if hasattr(p, "get_height")]
        return float(min(bars, key=lambda b: b.get_x()).get_height())

    assert abs(first_bar(ap) - own.drop_points) < 1e-6
    assert abs(first_bar(ap.model_copy(update={"seed_pool": pool})) - (own.drop_points + 7.0)) < 1e-6
