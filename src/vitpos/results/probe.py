"""Row / column position probes per layer and site (`vitpos.experiments.probe` measures it)."""

from __future__ import annotations

from pydantic import BaseModel

from vitpos.results.base import Result


class ContentBaseline(BaseModel):
    row_acc: float
    col_acc: float
    note: str


class ProbeSiteResult(Result):
    """Row / column probe accuracies per layer at one site, with controls and the content baseline."""

    layers: list[int]
    site: str
    row_acc: list[float]
    col_acc: list[float]
    chance_row: float
    chance_col: float
    row_control_acc: list[float | None]
    col_control_acc: list[float | None]
    row_selectivity: list[float | None]  # probe minus control-task accuracy
    col_selectivity: list[float | None]
    l2_row: list[float]
    l2_col: list[float]
    n_train_images: int
    n_test_images: int
    content_baseline: ContentBaseline
    n_images: int


class MultiSiteProbeResult(Result):
    """`vitpos probe --sites a,b`: one ProbeSiteResult per site name."""

    sites: dict[str, ProbeSiteResult]


ProbeResults = ProbeSiteResult | MultiSiteProbeResult


def probe_sites(result: ProbeResults) -> dict[str, ProbeSiteResult]:
    return result.sites if isinstance(result, MultiSiteProbeResult) else {result.site: result}
