"""The clean model's top-1 (`vitpos.experiments.evaluation` measures it)."""

from __future__ import annotations

from vitpos.results.base import Result


class EvalResult(Result):
    top1: float
    n: int
    per_class: dict[str, float]  # class name -> accuracy
    per_group: dict[str, float]  # class group (e.g. vertical / horizontal) -> accuracy
    top1_ci95: list[float]  # Wilson 95 % interval of top1
