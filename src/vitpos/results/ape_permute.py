"""E3 (C2)'s result: top-1 under each permutation of an SAE's positional features, its matched
controls and nulls (`vitpos.experiments.ape_permute` measures it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

from vitpos.results.base import Result, Skipped, omit_unmeasured

# `variants` of the result (kept as format 1 wrote it); the matched controls added since are listed in `controls`
VARIANTS = ("all", "row_only", "col_only", "all_positional", "random_features", "mean_ablate", "pos_embed_shuffle")


CONTROLS = {"all_positional": "random_all_positional", "all": "random_features", "row_only": "random_row",
            "col_only": "random_col"}  # permuted set -> its matched random control (C2 reads the first)


CONTROL_VARIANTS = ("random_row", "random_col", "random_all_positional")


NULLS = {"swap_all_positional": "all_positional", "crossed": "all", "norm_all_positional": "all_positional"}


NULL_VARIANTS = tuple(NULLS)  # null -> the permuted set it is the null of (C2 reads swap_all_positional)


# issue 47: the positional subspace (the span of the all-positional set's decoder directions) permuted as a
# whole, and the SAE error term's component in it, with the all-positional set's permutations
SUBSPACE_VARIANTS = ("subspace_positional", "subspace_error")


# issue 47 item 3: the conjunction-inclusive positional set (row + col + mixed + the sae stage's conjunction
# latents, `FeatureScores.conj_features`) permuted with the all-positional set's permutations; its edit-norm-matched
# control; and the all-positional set's edit-norm-matched control, both drawn from live latents in NEITHER set (the
# older norm_all_positional, which C2 reads, draws from every non-positional latent, conjunction ones included)
CONJ_VARIANTS = ("conj_positional", "norm_conj_positional", "norm_all_positional_no_conj")


ALL_VARIANTS = VARIANTS + CONTROL_VARIANTS + NULL_VARIANTS + SUBSPACE_VARIANTS + CONJ_VARIANTS


# the edits a position budget is reported for, in the report's order
BUDGET_VARIANTS = ("row_only", "col_only", "all", "all_positional", *SUBSPACE_VARIANTS, "conj_positional")


# the APE-table shuffle's drop (points) below which it is no denominator: the model reads (nearly) no
# position from its APE table, so there is no effect to take a share of
MIN_SHUFFLE_DROP = 2.0


def variant_names(doc: Mapping) -> list[str]:
    """Every variant of a result's JSON: its `variants` then the matched controls it lists."""
    names: list[str] = [str(v) for v in doc.get("variants") or VARIANTS]
    names += [c for c in (doc.get("controls") or {}).values() if c not in names]
    names += [c for c in (doc.get("nulls") or {}) if c not in names]
    return names + [v for v in SUBSPACE_VARIANTS + CONJ_VARIANTS if doc.get(v) is not None and v not in names]


# measured since issue 28 (edit sizes, nulls) and 47 (subspaces, the position budget, the prefix tokens):
# left out of a result's JSON where a result written before them has none
NEW_FIELDS = frozenset({"edit_norm", "edit_rel", "nulls", *NULL_VARIANTS, *SUBSPACE_VARIANTS, "position_budget",
                        "prefix_tokens", "prefix_edited", "subspace_rank", "seed_pool", *CONJ_VARIANTS})


# issue 48: the variants each extra SAE seed permutes: C2's set and its null (what the rule reads), the axis
# sets (reported); the controls stay the run seed's (reported, read by no rule: not worth the forwards)
# (issue 47 item 3: and the conjunction-inclusive set, reported beside C2's)
SEED_VARIANTS = ("all_positional", "swap_all_positional", "row_only", "col_only", "conj_positional")


class PositionBudget(BaseModel):
    """One edit's share of the APE-table shuffle's effect on the same images: drop(edit) / drop(APE shuffle)
    (points over points), its 95 % paired-bootstrap interval over images (seeds pooled per image), or
    None with the reason (`undefined`) where the shuffle costs ~nothing or the edit was not run."""

    share: float | None
    share_ci95: list[float] | None = None
    edit_drop: float | None = None  # points
    shuffle_drop: float | None = None  # points
    undefined: str | None = None  # why there is no share


def shuffle_undefined(drop: float | None, ci95: list[float] | None) -> str | None:
    """Why the APE-table shuffle's drop (points, its interval) cannot divide, or None when it can: it must
    be at least MIN_SHUFFLE_DROP and its interval must lie above 0 (never a ratio over ~0)."""
    if drop is None:
        return "the APE-table shuffle was not measured"
    if drop < MIN_SHUFFLE_DROP:
        return (f"the APE-table shuffle costs {drop:.1f} pts (< {MIN_SHUFFLE_DROP:g}): the model reads ~no position "
                "from its APE table, so no share of its effect is defined")
    if ci95 is None or ci95[0] <= 0:
        return f"the APE-table shuffle's drop ({drop:.1f} pts) has an interval reaching 0: no share is defined"
    return None


class GroupDrop(BaseModel):
    top1: float
    drop_points: float


class VariantResult(BaseModel):
    """Top-1 under one intervention, mean (and std) over seeds; drops in points vs the baseline."""

    top1: float
    top1_std: float
    drop_points: float
    drop_std: float
    per_seed_top1: list[float]
    n_features: int | None  # latents moved (None: the SAE-free APE-table shuffle)
    per_group: dict[str, GroupDrop]
    drop_ci95: list[float] | None = None  # paired bootstrap over images (seeds pooled), points
    activation_mass: float | None = None  # sum of the moved latents' mean activation (mean over seeds)
    note: str | None = None  # e.g. a control smaller than its set
    edit_norm: float | None = None  # mean ||x' - x|| over patch tokens (first MASS_IMAGES images, fresh draws)
    edit_rel: float | None = None  # edit_norm / mean ||x||

    @model_serializer(mode="wrap")
    def _without_unmeasured(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_unmeasured(self, handler(self), NEW_FIELDS)


Outcome = VariantResult | Skipped


class PooledDrop(BaseModel):
    """One variant's top-1 drop pooled over the SAE training seeds (issue 48): the mean over seeds of each
    seed's drop (points; a seed without the set moves nothing: 0), its 95 % hierarchical-bootstrap
    interval (seeds, then images within each seed, every variant of a seed on the same image resample:
    an effect and its null stay paired), and each seed's drop in `PermuteSeedPool.sae_seeds` order."""

    drop_points: float
    drop_ci95: list[float] | None
    per_seed: list[float]
    per_seed_n_features: list[int]

    def seeds_text(self) -> str:
        """Each SAE seed's drop, "a / b / c" (points, one decimal), as the claim text and the section print it."""
        return " / ".join(f"{x:.1f}" for x in self.per_seed)


class PermuteSeedPool(BaseModel):
    """The permutation of every SAE seed's own positional latents (the run seed's SAE first: this result's
    own variants), `SEED_VARIANTS` pooled; `budget`: the position budget of those of them in BUDGET_VARIANTS,
    pooled the same way (issue 47 item 2: C2 reads the all-positional set's; None: a pool written before)."""

    sae_seeds: list[int]
    interval_sources: list[str]
    variants: dict[str, PooledDrop]
    budget: dict[str, PositionBudget] | None = None


class ApePermuteResult(Result):
    model: str
    layer: int
    site: str
    data: str
    n_images: int
    seeds: list[int]
    baseline_top1: float
    baseline_per_group: dict[str, float]
    baseline_top1_ci95: list[float] | None = None  # Wilson
    variants: list[str]
    feature_counts: dict[str, int]
    all: Outcome
    row_only: Outcome
    col_only: Outcome
    all_positional: Outcome
    random_features: Outcome
    mean_ablate: Outcome
    pos_embed_shuffle: Outcome
    random_row: Outcome | None = None
    random_col: Outcome | None = None
    random_all_positional: Outcome | None = None
    controls: dict[str, str] | None = None  # permuted set -> its matched control variant
    swap_all_positional: Outcome | None = None
    crossed: Outcome | None = None
    norm_all_positional: Outcome | None = None
    nulls: dict[str, str] | None = None  # null variant -> the permuted set it is the null of
    subspace_positional: Outcome | None = None
    subspace_error: Outcome | None = None
    subspace_rank: int | None = None  # dimension of the span of the all-positional set's decoder directions
    # edit -> its share of the APE-table shuffle's effect (BUDGET_VARIANTS; read it with `position_budget`)
    position_budget: dict[str, PositionBudget] | None = None
    prefix_tokens: int | None = None  # CLS / registers: never edited at the site (see `prefix_scope`)
    prefix_edited: bool | None = None
    seed_pool: PermuteSeedPool | None = None  # issue 48: SEED_VARIANTS over the SAE seeds (None: one seed)
    conj_positional: Outcome | None = None  # issue 47 item 3 (CONJ_VARIANTS; None: written before them)
    norm_conj_positional: Outcome | None = None
    norm_all_positional_no_conj: Outcome | None = None

    @model_serializer(mode="wrap")
    def _without_unmeasured(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_unmeasured(self, handler(self), NEW_FIELDS)

    def variant(self, name: str) -> VariantResult | None:
        v = getattr(self, name, None)
        return v if isinstance(v, VariantResult) else None

    def pooled(self, name: str) -> PooledDrop | None:
        """`name`'s drop pooled over the SAE seeds (None: one seed, or not pooled)."""
        return None if self.seed_pool is None else self.seed_pool.variants.get(name)

    def drop_as_read(self, name: str) -> tuple[float, list[float] | None] | None:
        """`name`'s drop and 95 % interval as C2 reads it (and the figures draw it): pooled over the SAE seeds
        where there are several, else the one SAE's (None: the variant was not measured)."""
        p = self.pooled(name)
        if p is not None:
            return p.drop_points, p.drop_ci95
        v = self.variant(name)
        return None if v is None else (v.drop_points, v.drop_ci95)

    def outcome(self, name: str) -> Outcome | None:
        """One variant's outcome, measured or skipped (None: not run in this result)."""
        v = getattr(self, name, None) if name in type(self).model_fields else None
        return v if isinstance(v, (VariantResult, Skipped)) else None

    def variant_names(self) -> list[str]:
        """Every variant: `variants`, then the matched controls and the nulls it lists."""
        names = list(self.variants or VARIANTS)
        names += [c for c in (self.controls or {}).values() if c not in names]
        names += [c for c in (self.nulls or {}) if c not in names]
        return names + [v for v in SUBSPACE_VARIANTS + CONJ_VARIANTS if self.outcome(v) is not None and v not in names]


def position_budget(r: ApePermuteResult, variant: str) -> PositionBudget:
    """`variant`'s share of the APE-table shuffle's effect as `r` measured it (the reader a C2 rule can use):
    the stored share and interval, or share None with the reason (the shuffle costs ~nothing, the edit was
    skipped or not run, or `r` was written before the position budget)."""
    stored = (r.position_budget or {}).get(variant)
    if stored is not None:
        return stored
    x = r.outcome(variant)
    why = ("not measured: a result written before the position budget" if r.position_budget is None else
           f"{variant} was skipped: {x.skipped}" if isinstance(x, Skipped) else f"{variant} was not run")
    return PositionBudget(share=None, undefined=why)


def read_budget(r: ApePermuteResult, variant: str) -> tuple[PositionBudget, bool]:
    """`variant`'s position budget as C2 reads it, and whether it is pooled over the SAE seeds: the seed
    pool's where it has one, else the run seed's SAE's (`position_budget`: one SAE seed, or a pool written
    before its budget was pooled)."""
    pooled = None if r.seed_pool is None or r.seed_pool.budget is None else r.seed_pool.budget.get(variant)
    return (position_budget(r, variant), False) if pooled is None else (pooled, True)


def prefix_scope(r: ApePermuteResult) -> str:
    """What the site's edits do to the prefix tokens (CLS, registers), in words: they are never edited;
    at the embedding they hold no patch position, after block 0 they may have read it."""
    n = r.prefix_tokens
    if n is None:
        return "prefix tokens: not recorded (a result written before issue 47); they were not edited"
    if n == 0:
        return "no prefix tokens: every token is a patch token the edit reaches"
    edited = "edited" if r.prefix_edited else "not edited"
    if r.site == "resid_pre" and r.layer == 0:
        return (f"the {n} prefix token(s) (CLS / registers) are {edited}; at the embedding they carry no patch "
                "position (their APE row, where they have one, is the same for every image, and the APE-table "
                "shuffle leaves it too), so the edit and the APE shuffle reach the same tokens")
    return (f"the {n} prefix token(s) (CLS / registers) are {edited}: by this site they may have read the patches' "
            "positions (attention from block 0 on), which an edit of the patch tokens cannot reach and the "
            "APE-table shuffle does")
