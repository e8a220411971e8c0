"""The claims' rules as an experiment's report section shows them beside its numbers.

An experiment never imports the claims (tests/unit/test_import_graph.py): the report, above both,
hands each section the claims' rules through this interface (`vitpos.report.sections.CLAIM_RULES`
implements it with `vitpos.claims`). Today one section reads them: sae_layers shows C1 and C2 at
every swept layer and over the plausible ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from vitpos.results.sae_layers import LayerPoint, SAELayersResult


class Reading(Protocol):
    """One claim's reading of one result: its outcome (holds / fails / ...) and the numbers it read."""

    @property
    def result(self) -> str: ...

    @property
    def numbers(self) -> Mapping[str, Any]: ...


class ClaimRules(Protocol):
    """The claims' per-model rules, as far as a report section shows them."""

    def at_layer(self, claim: str, spec: str, point: LayerPoint) -> Reading:
        """`claim`'s rule at one layer of a layer sweep (C1, C2: the claims read over the sweep)."""
        ...

    def plausible_sites(self, sweep: SAELayersResult) -> list[str]:
        """The sweep's sites (point keys) the claims read (selected in at least the rule set's share of resamples)."""
        ...

    def over_plausible(self, outcomes: Sequence[str]) -> str:
        """A claim's outcome over the plausible layers from its outcome at each."""
        ...
