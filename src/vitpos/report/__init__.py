"""The self-contained HTML report, rendered from results.json and the figures experiments declare."""

from __future__ import annotations

from typing import Any

_EXPORTS = {"render_report": "vitpos.report.html", "render_figures": "vitpos.report.html",
            "model_slug": "vitpos.report.html", "figure_key": "vitpos.report.html"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # lazy: importing vitpos.report does not pull in matplotlib
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vitpos.report' has no attribute {name!r}")
