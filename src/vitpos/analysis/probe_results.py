"""Result types of the position probes: one layer (`ProbeResult`) and several (`LayerProbeResults`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vitpos.analysis.stats import bootstrap_mean_interval
from vitpos.errors import VitposError

if TYPE_CHECKING:
    from vitpos.analysis.linear_probe import LinearProbe


@dataclass
class ProbeResult:
    """Test accuracies of the row / column probes on one set of activations, plus the probes."""

    row_acc: float
    col_acc: float
    row_control_acc: float | None
    col_control_acc: float | None
    row_selectivity: float | None
    col_selectivity: float | None
    chance_row: float
    chance_col: float
    l2_row: float
    l2_col: float
    n_train_images: int
    n_test_images: int
    n_train_tokens: int
    grid: tuple[int, int]
    l2_grid: tuple[float, ...]
    row_val_acc: list[float]  # validation accuracy per l2_grid entry (what chose l2_row)
    col_val_acc: list[float]
    train_image_ids: list[Any] = field(repr=False)
    val_image_ids: list[Any] = field(repr=False)  # a subset of train_image_ids
    test_image_ids: list[Any] = field(repr=False)
    row_probe: LinearProbe = field(repr=False)
    col_probe: LinearProbe = field(repr=False)
    row_control_probe: LinearProbe | None = field(default=None, repr=False)
    col_control_probe: LinearProbe | None = field(default=None, repr=False)
    # per test image (test_image_ids order), patches each probe labels correctly: what intervals resample
    test_correct: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    def per_image_acc(self, target: str) -> torch.Tensor | None:
        """(test images,) float64 accuracy of the row or col probe on each test image (None if unknown)."""
        if self.test_correct is None:
            return None
        return self.test_correct[target].double() / (self.grid[0] * self.grid[1])

    def acc_ci95(self, target: str) -> list[float] | None:
        """Bootstrap interval over test images of the row or col probe's accuracy (patches of one
        image are not independent draws: the image is the unit resampled)."""
        acc = self.per_image_acc(target)
        return None if acc is None or acc.numel() == 0 else bootstrap_mean_interval(acc)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able metrics (no probes, no image id lists)."""
        return {
            "row_acc": self.row_acc,
            "col_acc": self.col_acc,
            "row_acc_ci95": self.acc_ci95("row"),
            "col_acc_ci95": self.acc_ci95("col"),
            "row_control_acc": self.row_control_acc,
            "col_control_acc": self.col_control_acc,
            "row_selectivity": self.row_selectivity,
            "col_selectivity": self.col_selectivity,
            "chance_row": self.chance_row,
            "chance_col": self.chance_col,
            "l2_row": self.l2_row,
            "l2_col": self.l2_col,
            "n_train_images": self.n_train_images,
            "n_test_images": self.n_test_images,
            "n_train_tokens": self.n_train_tokens,
            "grid": list(self.grid),
            "l2_grid": list(self.l2_grid),
            "row_val_acc": list(self.row_val_acc),
            "col_val_acc": list(self.col_val_acc),
        }


@dataclass
class LayerProbeResults:
    """One ProbeResult per layer (ascending layer order), with per-layer metric lists."""

    layers: list[int]
    results: list[ProbeResult] = field(repr=False)

    def _metric(self, name: str) -> list[Any]:
        return [getattr(r, name) for r in self.results]

    @property
    def row_acc(self) -> list[float]:
        return self._metric("row_acc")

    @property
    def col_acc(self) -> list[float]:
        return self._metric("col_acc")

    @property
    def row_control_acc(self) -> list[float | None]:
        return self._metric("row_control_acc")

    @property
    def col_control_acc(self) -> list[float | None]:
        return self._metric("col_control_acc")

    @property
    def row_selectivity(self) -> list[float | None]:
        return self._metric("row_selectivity")

    @property
    def col_selectivity(self) -> list[float | None]:
        return self._metric("col_selectivity")

    @property
    def chance_row(self) -> float:
        return self.results[0].chance_row

    @property
    def chance_col(self) -> float:
        return self.results[0].chance_col

    def __getitem__(self, layer: int) -> ProbeResult:
        try:
            return self.results[self.layers.index(layer)]
        except ValueError:
            raise VitposError(f"layer {layer} was not probed; probed layers are {self.layers}") from None

    def to_json(self, site: str) -> dict[str, Any]:
        """The probe.json payload for activations captured at `site` (e.g. 'resid_post')."""
        return {
            "layers": list(self.layers),
            "site": site,
            "row_acc": self.row_acc,
            "col_acc": self.col_acc,
            "chance_row": self.chance_row,
            "chance_col": self.chance_col,
            "row_control_acc": self.row_control_acc,
            "col_control_acc": self.col_control_acc,
            "row_selectivity": self.row_selectivity,
            "col_selectivity": self.col_selectivity,
            "l2_row": self._metric("l2_row"),
            "l2_col": self._metric("l2_col"),
            "n_train_images": self.results[0].n_train_images,
            "n_test_images": self.results[0].n_test_images,
        }
