"""Heat maps of the SAE latents that encode row or column position."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vitpos.errors import VitposError
from vitpos.io import atomic_path


def plot_feature_maps(scores, path: str | Path, n: int = 4) -> Path:
    """Save a PNG: top-``n`` row features (first line) and column features (second line), each
    drawn as its mean activation per grid cell and titled with its id and η². Returns ``path``.

    ``scores`` is a ``vitpos.sae.FeatureScores``. Uses matplotlib's Agg canvas directly (no
    pyplot state) and writes atomically.
    """
    if n < 1:
        raise VitposError(f"n must be >= 1 to plot feature maps, got {n}")
    path = Path(path)
    H, W = scores.grid
    lines = [
        ("row", scores.row_features[:n], scores.eta2_row),
        ("col", scores.col_features[:n], scores.eta2_col),
    ]
    fig = Figure(figsize=(2.6 * n, 5.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, n, squeeze=False)
    for i, (kind, ids, eta2) in enumerate(lines):
        for j in range(n):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(ids):
                msg = f"no {kind} feature" if j == 0 else ""
                ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes, color="0.4")
                ax.set_frame_on(False)
                continue
            f = ids[j]
            im = ax.imshow(scores.cell_means[f].numpy(), cmap="viridis", interpolation="nearest", aspect="equal")
            ax.set_title(f"f{f}  η²_{kind}={float(eta2[f]):.2f}", fontsize=9)
            fig.colorbar(im, ax=ax, shrink=0.8)
        axes[i][0].set_ylabel(f"{kind} features ({len(ids)} shown)")
    fig.suptitle(f"SAE positional features: mean activation per cell ({H}x{W} grid)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return path
