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


ALL_VARIANTS = VARIANTS + CONTROL_VARIANTS + NULL_VARIANTS


def variant_names(doc: Mapping) -> list[str]:
    """Every variant of a result's JSON: its `variants` then the matched controls it lists."""
    names: list[str] = [str(v) for v in doc.get("variants") or VARIANTS]
    names += [c for c in (doc.get("controls") or {}).values() if c not in names]
    return names + [c for c in (doc.get("nulls") or {}) if c not in names]


# measured since issue 28: left out of a result's JSON where a result written before them has none
NEW_FIELDS = frozenset({"edit_norm", "edit_rel", "nulls", *NULL_VARIANTS})


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

    @model_serializer(mode="wrap")
    def _without_unmeasured(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_unmeasured(self, handler(self), NEW_FIELDS)

    def variant(self, name: str) -> VariantResult | None:
        v = getattr(self, name, None)
        return v if isinstance(v, VariantResult) else None

    def outcome(self, name: str) -> Outcome | None:
        """One variant's outcome, measured or skipped (None: not run in this result)."""
        v = getattr(self, name, None) if name in type(self).model_fields else None
        return v if isinstance(v, (VariantResult, Skipped)) else None

    def variant_names(self) -> list[str]:
        """Every variant: `variants`, then the matched controls and the nulls it lists."""
        names = list(self.variants or VARIANTS)
        names += [c for c in (self.controls or {}).values() if c not in names]
        return names + [c for c in (self.nulls or {}) if c not in names]
