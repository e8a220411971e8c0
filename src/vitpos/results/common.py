"""What several experiments' results share: the probed condition, the recovery and count-matched
recovery records, and the base of every probe sweep over RoPE conditions."""

from __future__ import annotations

from pydantic import BaseModel

from vitpos.results.base import Result

MIN_GAP = 0.05  # accuracy gap below which recovery is not defined (nothing to recover)


class ProbedCondition(BaseModel):
    """Probe accuracies per layer (retrained and clean-probe) and top-1 under one condition; the
    retrained accuracies with a bootstrap interval over the probes' test images (None in results
    written before the intervals)."""

    row_acc: list[float]
    col_acc: list[float]
    row_acc_orig_probe: list[float]
    col_acc_orig_probe: list[float]
    row_acc_ci95: list[list[float] | None] | None = None
    col_acc_ci95: list[list[float] | None] | None = None
    top1: float
    top1_ci95: list[float] | None = None  # Wilson, over the condition's images
    per_group: dict[str, float]
    axis: str | None  # row | col | both removed; None: rotations intact
    restore_from: int | None  # first layer whose rotations come back; None: removed everywhere (or never)


class AxisSweepResult(Result):
    """What every probe sweep over RoPE conditions reports first: which model, data and images, the
    probed site and layers, and the chance level of each axis' probe."""

    model: str
    data: str
    split: str
    n_images: int
    site: str
    layers: list[int]
    chance_row: float
    chance_col: float


class Recovery(BaseModel):
    layers: list[int]
    rec: list[float | None]  # per layer; None before R or where nothing was removed
    mean_rec: float | None
    # paired bootstrap over the probes' test images (the same images under every condition)
    mean_rec_ci95: list[float] | None = None


class CountMatched(BaseModel):
    """Recovery against a count-matched reference (restore point R): per layer l >= R the clean
    model's own gain over the same layers, P_clean(l) - P_clean(R-1), the restore condition's gain
    P_restore(l) - P_restore(R-1) (= P_off(R-1): before R the two are the same run), and the
    rebuilt share B(l) = (gain_restore - gain_clean) / deficit, deficit = P_clean(R-1) - P_off(R-1):
    the share of the deficit at R that the restored layers close beyond what the same layers add in
    the clean model, = 1 - (P_clean(l) - P_restore(l)) / deficit. B = 0: the layers after R only do
    what they do anyway; B = 1: the deficit is closed. None where the deficit is < MIN_GAP."""

    layers: list[int]
    deficit: float | None  # P_clean(R-1) - P_off(R-1)
    clean_gain: list[float | None]
    restore_gain: list[float | None]
    share: list[float | None]
    mean_share: float | None
    mean_share_ci95: list[float] | None = None  # paired bootstrap over the probes' test images
