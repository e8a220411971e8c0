"""The self-contained HTML report, rendered from results.json and the figures experiments declare."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy __getattr__ below returns, for type checkers
    from vitpos.report.html import render_report

# (render_figures, model_slug and figure_key were listed here but no longer exist in vitpos.report.html:
# figures are drawn by the study, model_slug / figure_key live in vitpos.study.results.)
_EXPORTS = {"render_report": "vitpos.report.html"}
# A literal list (type checkers cannot evaluate sorted(_EXPORTS)); test_report checks it matches _EXPORTS.
__all__ = ["render_report"]


def __getattr__(name: str) -> Any:
    # lazy: importing vitpos.report does not pull in matplotlib
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vitpos.report' has no attribute {name!r}")
