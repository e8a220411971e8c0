"""E2 (C1)'s result: an SAE on one layer, its positional features and their causal check, and the
seed x size sweep beside it (`vitpos.experiments.sae_run` and `sae_seeds` measure them)."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from vitpos.results.base import Result, Skipped, omit_unmeasured
from vitpos.sae.special import SpecialTokens
from vitpos.sae.stability import DEFAULT_COS, SeedMatch


class SweepRun(BaseModel):
    seed: int
    expansion: int
    d_sae: int
    main: bool  # the study's SAE (the one C1 / C2 read)
    fvu: float
    l0: float
    dead_frac: float
    n_row_features: int
    n_col_features: int
    n_mixed_features: int
    train_seconds: float | None = None  # None for the main SAE (its own result has it)
    n_conj_features: int | None = None  # issue 47 item 3: conjunction latents (None: written before them)

    @model_serializer(mode="wrap")
    def _without_unmeasured(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_unmeasured(self, handler(self), ISSUE28_FIELDS)


class SAESweep(BaseModel):
    seeds: list[int]
    expansions: list[int]
    eval_images: int
    runs: list[SweepRun]
    stability: list[SeedMatch]  # every pair of seeds, per size
    stable_cos: float = DEFAULT_COS  # the headline threshold; every SeedMatch carries the curve


# measured since issue 28: left out of a result's JSON where a result written before them has none
ISSUE28_FIELDS = frozenset({"n_features", "edit_norm", "top1", "top1_drop", "top1_drop_ci95", "per_group_drop",
                            "control_row", "control_col", "clean_top1", "eta2_null", "data",
                            "seed_pool",  # issue 48: the SAE seeds' pooled causal check
                            "conj_features", "n_conj_features"})  # issue 47 item 3: conjunction latents


class AblationEffect(BaseModel):
    """Clean-probe accuracies downstream after subtracting one feature set at the SAE's site."""

    row_acc: list[float]
    col_acc: list[float]
    row_drop: float  # mean over later layers of clean - ablated accuracy
    col_drop: float
    selectivity: float | None  # own-axis drop / (|row drop| + |col drop|)
    # 95 % paired-bootstrap intervals over the probes' test images (selectivity's None where it is
    # undefined on too many resamples, `percentile_interval`)
    row_drop_ci95: list[float] | None
    col_drop_ci95: list[float] | None
    selectivity_ci95: list[float] | None
    # issue 28: the behavioural read-out and the size of the edit (None: written before they existed)
    n_features: int | None = None
    edit_norm: float | None = None  # mean ||removed contribution|| over the held-out patch tokens
    top1: float | None = None  # top-1 with the set removed (None without class logits)
    top1_drop: float | None = None  # points, clean - removed
    top1_drop_ci95: list[float] | None = None  # paired bootstrap over the held-out images, points
    per_group_drop: dict[str, float] | None = None  # points per class group of the data

    @model_serializer(mode="wrap")
    def _without_unmeasured(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_unmeasured(self, handler(self), ISSUE28_FIELDS)


class RemovalControl(AblationEffect):
    """A matched random-latent removal: as many live non-positional latents as the set, each matched
    on its RMS code (the size of what removing it subtracts; decoder rows are unit-norm)."""

    features: list[int]
    note: str | None = None


class CausalCheck(BaseModel):
    layers: list[int]
    clean_row_acc: list[float]
    clean_col_acc: list[float]
    ablate_row: AblationEffect | Skipped
    ablate_col: AblationEffect | Skipped
    control_row: RemovalControl | Skipped | None = None  # issue 28: the row set's matched random removal
    control_col: RemovalControl | Skipped | None = None
    clean_top1: float | None = None
    # the labelled images the check read when the SAE's own are not (sae.data: unlabelled natural crops);
    # None: the SAE's held-out images
    data: str | None = None

    @model_serializer(mode="wrap")
    def _without_unmeasured(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_unmeasured(self, handler(self), ISSUE28_FIELDS)

    def control(self, kind: str) -> RemovalControl | None:
        c = self.control_row if kind == "row" else self.control_col
        return c if isinstance(c, RemovalControl) else None

    def effect(self, kind: str) -> AblationEffect | None:
        eff = self.ablate_row if kind == "row" else self.ablate_col
        return eff if isinstance(eff, AblationEffect) else None


INTERVAL_SOURCES = ("images", "sae_seeds")  # what a pooled interval resamples (issue 48)


class PooledEffect(BaseModel):
    """One removal pooled over the SAE training seeds (issue 48): each seed's SAE types its own latents and
    removes its own set; the drops are the mean over seeds of each seed's mean over images (a seed
    without the set removes nothing: drops 0), the selectivity own / (|row| + |col|) of the pooled drops,
    and the 95 % intervals a hierarchical bootstrap (seeds, then images within each seed; the row and col
    drops of one seed on the same resample) gives (`analysis.stats.hierarchical_means`). Per seed: the
    seed's own numbers, in `SAESeedPool.seeds` order."""

    row_drop: float  # fractions, as AblationEffect
    col_drop: float
    selectivity: float | None
    row_drop_ci95: list[float] | None
    col_drop_ci95: list[float] | None
    selectivity_ci95: list[float] | None
    top1_drop: float | None = None  # points
    top1_drop_ci95: list[float] | None = None
    per_seed_row_drop: list[float]
    per_seed_col_drop: list[float]
    per_seed_selectivity: list[float | None]
    per_seed_top1_drop: list[float | None]


class FeatureSets(Protocol):
    """What `TypedLatents.of` reads of an SAE's feature scores."""

    row_features: list[int]
    col_features: list[int]
    mixed_features: list[int]
    conj_features: list[int]


class TypedLatents(BaseModel):
    """An SAE's latents as typed on its held-out images (`vitpos.sae.features`): the row, col and mixed
    positional sets and, since issue 47 item 3, the conjunction latents (positional within their content:
    not row / col / mixed; positional + these is the set ape_permute's conj_positional moves; None: written
    before them). The run seed's SAE (`SAEResult`) and each extra seed's (`SAESeedRun`) carry the same."""

    row_features: list[int]
    col_features: list[int]
    mixed_features: list[int]
    n_row_features: int
    n_col_features: int
    n_mixed_features: int
    conj_features: list[int] | None = None
    n_conj_features: int | None = None

    @staticmethod
    def of(scores: FeatureSets) -> dict[str, Any]:
        """These fields from an SAE's feature scores (`vitpos.sae.features.FeatureScores`), counts included."""
        sets = {name: list(getattr(scores, name)) for name in
                ("row_features", "col_features", "mixed_features", "conj_features")}
        return {**sets, **{f"n_{name}": len(v) for name, v in sets.items()}}


class SAESeedRun(TypedLatents):
    """One extra SAE seed of the sae stage (issue 48): trained as the run seed's on the same tokens, its
    own latents typed on the same held-out images, its own causal check. `dir`: its weights, relative to
    the stage's SAE folder."""

    seed: int
    dir: str
    fvu: float
    causal: CausalCheck | None

    @model_serializer(mode="wrap")
    def _without_unmeasured(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_unmeasured(self, handler(self), ISSUE28_FIELDS)


class SAESeedPool(BaseModel):
    """C1's causal check over `seeds` (the run seed's SAE, this result's own, first; then `runs`): each
    removal pooled (`PooledEffect`); what its intervals cover (`interval_sources`)."""

    seeds: list[int]
    interval_sources: list[str]
    runs: list[SAESeedRun]
    ablate_row: PooledEffect | None = None  # None: the causal check did not run (the last layer)
    ablate_col: PooledEffect | None = None
    control_row: PooledEffect | None = None
    control_col: PooledEffect | None = None

    def effect(self, kind: str) -> PooledEffect | None:
        return self.ablate_row if kind == "row" else self.ablate_col

    def control(self, kind: str) -> PooledEffect | None:
        return self.control_row if kind == "row" else self.control_col


class SAETraining(BaseModel):
    train_store: str | None
    train_images: int
    lr: float
    buffer_tokens: int | None
    reader_peak_bytes: int
    reader_bound_bytes: int
    max_batch_tokens: int
    dropped_tail_tokens: int
    # high-norm exclusion (None: off): tokens above factor x the median patch-token norm left out of training
    high_norm_factor: float | None = None
    high_norm_threshold: float | None = None
    excluded_high_norm_tokens: int | None = None  # in the last epoch's pass


class SeedStability(BaseModel):
    """A second SAE, same data and settings but another seed: decoder directions matched one-to-one
    (Hungarian assignment on cosine, scipy's linear_sum_assignment) and the share with cos >= 0.9."""

    seed: int
    other_seed: int
    cos_threshold: float
    share_matched: float  # matched pairs with cos >= cos_threshold / latents
    median_cos: float
    other_fvu: float  # held-out FVU of the second SAE (is it as good a fit?)


class SAEFidelity(BaseModel):
    """What vision-SAE users ask besides FVU / L0 / dead / splice (those stay top-level in sae.json)."""

    dense_threshold: float  # a latent is dense when it fires on more than this share of held-out tokens
    dense_frac: float
    dense_frac_by_threshold: dict[str, float]  # the threshold's sensitivity
    stability: SeedStability | None = None  # None: no second seed was trained


class Eta2Count(BaseModel):
    """How many features one pair of eta2 thresholds admits (row / col / mixed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    threshold: float
    row: int
    col: int
    mixed: int


class NullThresholds(BaseModel):
    """The null-derived thresholds (`Eta2Null`'s quantile; axis: max of row and col) and what they admit."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    min_eta2: float
    min_eta2_pos: float
    row: int
    col: int
    mixed: int


class Eta2Null(BaseModel):
    """eta2 with positions shuffled within each image (`eta2_null`): its quantile and max over the
    live latents per statistic (None: no live latent), the features each threshold admits."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    quantile: float
    n_live: int
    null_row_q: float | None
    null_row_max: float | None
    null_col_q: float | None
    null_col_max: float | None
    null_pos_q: float | None
    null_pos_max: float | None
    # issue 47 item 3: the conjunction typing's eta2_pos_fired under the same shuffle, over the latents firing in
    # >= min_conj_images images (None: none, or written before it)
    null_conj_q: float | None = None
    null_conj_max: float | None = None
    admitted: list[Eta2Count]  # one per threshold of ETA2_GRID, used for both axis and pos
    null_thresholds: NullThresholds
    used_above_null: bool  # the thresholds the feature lists use are at or above the null's


class SAEResult(Result, TypedLatents):
    """sae.json: the run key, held-out metrics, the positional features and their causal check."""

    run: dict[str, Any]  # the settings that identify this SAE (a finished run with the same key is reused)
    model: str
    layer: int
    site: str
    data: str
    arch: str
    k: int
    expansion: int
    d_sae: int
    mse: float
    fvu: float
    l0: float
    dead_frac: float
    tokens: int
    # None when the model's outputs are not logits over the data's classes (a headless model
    # without --head): the SAE is trained and scored, the splice's top-1 is not measured
    logit_kl: float | None
    top1: float | None
    top1_spliced: float | None
    top1_change_points: float | None
    train_tokens: int
    train_seconds: float
    training: SAETraining
    thresholds: dict[str, float]
    causal: CausalCheck | None
    eta2_null: Eta2Null | None = None  # issue 28: eta2 with positions shuffled in-image; counts per threshold
    sae_dir: str | None = None  # set by the study: where the weights live
    layer_choice: str | None = None  # set by the study: how the layer was chosen
    sweep: SAESweep | None = None  # set by the study when sae.seeds > 1 or sae.expansions: seeds x sizes, stability
    fidelity: SAEFidelity | None = None  # None: written before it existed
    # special tokens (vitpos.sae.special): per-layer prefix / outlier stats on the held-out images,
    # the outlier norm threshold on the training tokens, and whether outliers were trained on
    special_tokens: SpecialTokens | None = None
    outlier_threshold: float | None = None
    include_special: bool = False
    excluded_outlier_tokens: int | None = None  # training tokens left out as outliers (per epoch)
    browser: str | None = None  # set by the study: the latent browser page, relative to the study's folder
    seed_pool: SAESeedPool | None = None  # issue 48: the SAE seeds C1 reads (None: one seed)

    @model_serializer(mode="wrap")
    def _without_unmeasured(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_unmeasured(self, handler(self), ISSUE28_FIELDS)


class GivenSAEResult(BaseModel):
    """What `sae_doc_from_held` measures of an SAE that is given, not trained here (a planted one):
    the fields of SAEResult that C1 reads, named as there (training fields it has none of)."""

    model_config = ConfigDict(extra="ignore")  # the held-out metrics beside these
    model: str
    layer: int
    site: str
    data: str
    fvu: float
    row_features: list[int]
    col_features: list[int]
    mixed_features: list[int]
    n_row_features: int
    n_col_features: int
    n_mixed_features: int
    causal: CausalCheck | None
    eta2_null: Eta2Null | None = None
    seed_pool: SAESeedPool | None = None  # issue 48: several SAE seeds at this site (None: one)
