"""Mutation test of the validation table: each mutation breaks one part of the pipeline (a defence of
a rule switched off, a control or null made a no-op, the wrong head ablated, probe targets permuted,
SAE latent types shuffled), the planted cases of the claims it can touch are measured again under it,
and the rows whose verdict moved are its flips. A mutation that flips no row is a defence the table
cannot see: switched off, every planted-false case still fails on something else (METHODS.md, Power).

Why monkeypatching the real functions (and not flags in the pipeline): the pipeline carries no switch
that could be left on by mistake, and each mutation breaks the code path a bug would. A patch replaces
the function in every vitpos module that imported it by name, so `from x import f` is covered too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any
from unittest import mock

import torch

from vitpos.analysis import probes
from vitpos.claims.base import Condition, Planted, RuleClaim
from vitpos.claims.inputs import ClaimInputs
from vitpos.claims.intervals import HOLDS
from vitpos.claims.registry import BY_ID
from vitpos.experiments import ape_permute, ape_permute_variants, rope_axis, rope_heads_analysis
from vitpos.experiments.rope_heads_ablation import HeadDrops
from vitpos.results.ape_permute import PositionBudget
from vitpos.results.validation import ValidationRow, ValidationTable
from vitpos.sae import SAE
from vitpos.sae import controls as sae_controls
from vitpos.sae.features import FeatureScores
from vitpos.validation.table import case_rows, table_of

# what a mutation does to the pipeline while it is applied
Apply = Callable[[ExitStack], None]


@dataclass(frozen=True)
class Mutation:
    """One pipeline bug. `claims`: the claims whose planted cases it can move (only their cases are
    measured again); `rule_only`: it changes how results are read, not measured (the cases' measured
    results are read again under it)."""

    name: str
    what: str
    claims: tuple[str, ...]
    apply: Apply
    rule_only: bool = False


def _patch_everywhere(stack: ExitStack, owner: Any, name: str, new: Any) -> None:
    """Replace `owner.name` and every vitpos module's binding of the same object by `new`."""
    old = getattr(owner, name)
    stack.enter_context(mock.patch.object(owner, name, new))
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("vitpos") and mod is not owner and getattr(mod, name, None) is old:
            stack.enter_context(mock.patch.object(mod, name, new))


# ---- pipeline mutations -------------------------------------------------------------------------

def _identity_permutation(stack: ExitStack) -> None:
    _patch_everywhere(stack, ape_permute_variants, "permute_features", lambda x, z, sae, ids, perm: x)


def _swap_null_noop(stack: ExitStack) -> None:
    _patch_everywhere(stack, ape_permute_variants, "swap_features", lambda x, z, sae, ids, other: x)


def _norm_control_noop(stack: ExitStack) -> None:
    """C2's edit-norm-matched control (norm_all_positional) edits nothing: its drop reads 0."""
    real = ape_permute_variants.FeatureSets.edit

    def edit(self: ape_permute_variants.FeatureSets, v: str, ids: list[int], kind: str,
             stream: int) -> ape_permute_variants.PatchEdit:
        return (lambda x, z: x) if v == "norm_all_positional" else real(self, v, ids, kind, stream)

    stack.enter_context(mock.patch.object(ape_permute_variants.FeatureSets, "edit", edit))


def _budget_reads_one(stack: ExitStack) -> None:
    """Every position budget reads 1 (the edit reproduces the whole APE-shuffle effect), pooled or not."""
    def whole(*args: Any, **kwargs: Any) -> PositionBudget:
        return PositionBudget(share=1.0, share_ci95=[1.0, 1.0])

    _patch_everywhere(stack, ape_permute, "budget_of", whole)
    _patch_everywhere(stack, ape_permute, "pooled_budget", whole)


def _control_removes_nothing(stack: ExitStack) -> None:
    """The matched random-latent removal subtracts nothing: the latents it draws are remembered and
    their contribution is zero whenever they are removed."""
    drawn: list[list[int]] = []
    real_control, real_contribution = sae_controls.matched_control, SAE.feature_contribution

    def control(*args: Any, **kwargs: Any) -> Any:
        ids, note = real_control(*args, **kwargs)
        drawn.append(sorted(ids))
        return ids, note

    def contribution(self: SAE, z: torch.Tensor, ids: list[int]) -> torch.Tensor:
        out = real_contribution(self, z, ids)
        return torch.zeros_like(out) if sorted(ids) in drawn else out

    _patch_everywhere(stack, sae_controls, "matched_control", control)
    stack.enter_context(mock.patch.object(SAE, "feature_contribution", contribution))


def _probe_targets_permuted(stack: ExitStack) -> None:
    """Every probe learns a fixed random relabelling of the patches' rows and columns."""
    real = probes.position_labels

    def labels(grid: Any, target: str) -> torch.Tensor:
        y = real(grid, target)
        return y[torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))]

    _patch_everywhere(stack, probes, "position_labels", labels)


def _sae_types_shuffled(stack: ExitStack) -> None:
    """Which latents are row / col / mixed is read through a fixed random relabelling of the latents."""
    real = FeatureScores.classify

    def classify(self: FeatureScores, thresholds: Any = None) -> None:
        real(self, thresholds)
        perm = torch.randperm(self.n_features, generator=torch.Generator().manual_seed(1234)).tolist()
        self.row_features = [perm[i] for i in self.row_features]
        self.col_features = [perm[i] for i in self.col_features]
        self.mixed_features = [perm[i] for i in self.mixed_features]

    stack.enter_context(mock.patch.object(FeatureScores, "classify", classify))


def _c5_neighbour_head(stack: ExitStack) -> None:
    """C5's margins compare every head with the head next to the primary, not the primary."""
    real = HeadDrops.margin_intervals

    def margins(self: HeadDrops, primary: tuple[int, int], level: float = 0.95) -> Any:
        H = self.ablated.shape[1]
        return real(self, (primary[0], (primary[1] + 1) % H), level)

    stack.enter_context(mock.patch.object(HeadDrops, "margin_intervals", margins))


def _floor_at_chance(stack: ExitStack) -> None:
    """C3's content floor is chance again: the no-both condition's accuracies read as chance."""
    real = rope_axis.floored_removal

    def floored(conditions: Mapping[str, Mapping[str, Any]], fitted: Any, axis: str, chance: Mapping[str, float],
                layers: Any) -> Any:
        no_both = dict(conditions["no_both"])
        for a in ("row", "col"):
            no_both[f"{a}_acc"] = [chance[a]] * len(no_both[f"{a}_acc"])
        return real({**conditions, "no_both": no_both}, fitted, axis, chance, layers)

    _patch_everywhere(stack, rope_axis, "floored_removal", floored)


def _s_from_clean_attention(stack: ExitStack) -> None:
    """C4's axis index S is read from clean attention instead of where the head rebuilds: S and its
    interval both (C4's `specialised` reads the interval, so S alone would change no verdict)."""
    real = rope_heads_analysis.restore_axis_index

    def restore_S(surface: Any, images: torch.Tensor, axes: Any, R: int, *args: Any, **kwargs: Any) -> Any:
        got = real(surface, images, axes, R, *args, **kwargs)
        clean, kl = rope_heads_analysis.axis_index(surface, images)
        S = [[None if got.S[li][h] is None else clean[li][h] for h in range(len(row))] for li, row in enumerate(got.S)]
        ci = [[None if got.ci95[li][h] is None else kl["ci95"][li][h] for h in range(len(row))]
              for li, row in enumerate(got.ci95)]
        return got._replace(S=S, ci95=ci)

    _patch_everywhere(stack, rope_heads_analysis, "restore_axis_index", restore_S)


def _s_threshold_half(stack: ExitStack) -> None:
    """C4's S threshold is the round 0.5 instead of its null's quantile."""
    real = rope_heads_analysis.restore_axis_index

    def restore_S(*args: Any, **kwargs: Any) -> Any:
        return real(*args, **kwargs)._replace(threshold=0.5)

    _patch_everywhere(stack, rope_heads_analysis, "restore_axis_index", restore_S)


# ---- rule mutations: one condition of one claim always holds ---------------------------------------

def _always_holds(claim_id: str, condition: str) -> Apply:
    def apply(stack: ExitStack) -> None:
        claim = BY_ID[claim_id]
        assert isinstance(claim, RuleClaim)

        def holds(check: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(x: Any, t: Any) -> Any:
                got = check(x, t)
                return None if got is None else (HOLDS, got[1])
            return wrapped

        conditions = tuple(replace(c, check=holds(c.check)) if c.name == condition else c
                           for c in claim.rule_conditions)
        stack.enter_context(mock.patch.object(claim, "rule_conditions", conditions))
    return apply


def condition_mutations() -> list[Mutation]:
    """Every condition of every rule claim switched off (it always holds); preconditions are not
    defences (`Condition.precondition`) and are left as they are."""
    out = []
    for claim in BY_ID.values():
        if isinstance(claim, RuleClaim):
            cond: Condition[Any]
            for cond in claim.rule_conditions:
                if cond.precondition:
                    continue
                out.append(Mutation(f"{claim.id}.{cond.name} always holds", f"{claim.id}'s condition `{cond.name}` "
                                    "switched off", (claim.id,), _always_holds(claim.id, cond.name), rule_only=True))
    return out


PIPELINE_MUTATIONS: tuple[Mutation, ...] = (
    Mutation("C2 permutation is the identity", "permuting positional latents edits nothing", ("C2",),
             _identity_permutation),
    Mutation("same-position swap edits nothing", "C2's null (the same-position cross-image swap) is a no-op", ("C2",),
             _swap_null_noop),
    Mutation("C2 norm-matched control edits nothing", "C2's edit-norm-matched control (norm_all_positional) is a "
             "no-op", ("C2",), _norm_control_noop),
    Mutation("C2 position budget reads 1", "every position budget reads 1: the edit reproduces the whole APE-table "
             "shuffle's effect", ("C2",), _budget_reads_one),
    Mutation("C1 control removes nothing", "C1's matched random-latent removal subtracts nothing", ("C1",),
             _control_removes_nothing),
    Mutation("probe targets permuted", "every position probe learns patches relabelled at random",
             ("C1", "C3", "C4"), _probe_targets_permuted),
    Mutation("SAE latent types shuffled", "row / col / mixed latents read through a random relabelling",
             ("C1", "C2"), _sae_types_shuffled),
    Mutation("C5 reads the neighbour head", "C5's margins are taken against the head next to the primary",
             ("C5",), _c5_neighbour_head),
    Mutation("C3 floor at chance", "C3's content floor is chance, not the no-both condition", ("C3",),
             _floor_at_chance),
    Mutation("C4 S from clean attention", "C4's axis index is read on clean attention, not where the head rebuilds",
             ("C4",), _s_from_clean_attention),
    Mutation("C4 S threshold 0.5", "C4's axis-index threshold is a constant 0.5, not its null's quantile", ("C4",),
             _s_threshold_half),
)


def mutations() -> list[Mutation]:
    return [*PIPELINE_MUTATIONS, *condition_mutations()]


@contextmanager
def applied(m: Mutation) -> Iterator[None]:
    with ExitStack() as stack:
        m.apply(stack)
        yield


@dataclass(frozen=True)
class Flip:
    """A row whose verdict a mutation moved."""

    claim: str
    case: str
    planted: bool
    before: str
    after: str


def flips(before: Iterable[ValidationRow], after: Iterable[ValidationRow]) -> list[Flip]:
    old = {(r.claim, r.case): r for r in before}
    return [Flip(r.claim, r.case, r.planted, old[r.claim, r.case].verdict, r.verdict) for r in after
            if (r.claim, r.case) in old and old[r.claim, r.case].verdict != r.verdict]



@dataclass(frozen=True)
class MutationResult:
    mutation: Mutation
    flips: list[Flip]
    rows: int  # how many rows were read again under it


def run_mutations(cases: Sequence[Planted], n_images: int, seeds: tuple[int, ...],
                  which: Sequence[Mutation] | None = None, on_done: Callable[[MutationResult], None] | None = None,
                  until_first_flip: bool = False, measured: Mapping[str, ClaimInputs] | None = None
                  ) -> tuple[ValidationTable, list[MutationResult]]:
    """The table of `cases` as they are, then each mutation's flips: the cases of the claims it can
    touch measured again under it (read again only, for a rule mutation). until_first_flip: stop
    measuring a mutation's cases at the first that flips (enough to show it flips a row; the test's
    question), else every touched case is measured (the full table of flips). measured: cases' results
    as they are, already measured at these sizes (by case name; the rest are measured here), so the
    unmutated table is not measured twice."""
    given = measured or {}
    measured = {c.name: given[c.name] if c.name in given else c.measure(n_images, seeds) for c in cases}
    base = table_of([r for c in cases for r in case_rows(c, measured[c.name])], n_images, seeds)
    out = []
    for m in mutations() if which is None else which:
        touched = [c for c in cases if set(c.truth) & set(m.claims)]
        rows: list[ValidationRow] = []
        found: list[Flip] = []
        with applied(m):
            for c in touched:
                got = case_rows(c, measured[c.name] if m.rule_only else c.measure(n_images, seeds))
                rows += got
                found += flips(base.rows, [r for r in got if r.claim in m.claims])
                if until_first_flip and found:
                    break
        result = MutationResult(m, found, len(rows))
        out.append(result)
        if on_done is not None:
            on_done(result)
    return base, out
