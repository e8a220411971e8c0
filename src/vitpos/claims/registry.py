"""The one list of claims, in the order the summary and the report show them.

Adding a claim: one module (its text, scheme, rule as named conditions, thresholds, headline:
`vitpos.claims.base`) and one `register(...)` line below, or `register(...)` at run time (a plugin, a
test). The summary, the rule set and its hash, the sensitivity curves, the report's claims table and
the validation table all follow the registry.
"""

from __future__ import annotations

from vitpos.claims import c1, c2, c3, c4, c5
from vitpos.claims.base import Claim
from vitpos.claims.rules import VERSION, RuleSet

# Changed in place by register / unregister: whoever imported them sees every registered claim.
CLAIMS: list[Claim] = []
BY_ID: dict[str, Claim] = {}


def register(claim: Claim) -> Claim:
    """Add `claim` after the claims registered so far. Its thresholds must be named `<id>.<name>` and
    belong to it. Returns `claim`."""
    if not claim.id or claim.id in BY_ID:
        raise ValueError(f"a claim with id {claim.id!r} is registered already, or the id is empty")
    wrong = [t.name for t in claim.thresholds if t.claim != claim.id or not t.name.startswith(f"{claim.id}.")]
    if wrong:
        raise ValueError(f"{claim.id}: thresholds {wrong} must be named {claim.id}.<name> with claim={claim.id!r}")
    CLAIMS.append(claim)
    BY_ID[claim.id] = claim
    return claim


def unregister(claim_id: str) -> None:
    CLAIMS.remove(BY_ID.pop(claim_id))


def rule_set() -> RuleSet:
    """The hashed rule set: every registered claim's thresholds, in registry order."""
    return RuleSet(version=VERSION, thresholds=tuple(t for c in CLAIMS for t in c.thresholds))


def scheme_of(claim_id: str) -> str:
    """The scheme a claim is about ("" for an id no registered claim has)."""
    c = BY_ID.get(claim_id)
    return "" if c is None else c.scheme


for _claim in (c1.CLAIM, c2.CLAIM, c3.CLAIM, c4.CLAIM, c5.CLAIM):
    register(_claim)

__all__ = ["BY_ID", "CLAIMS", "register", "rule_set", "scheme_of", "unregister"]
