"""The planted APE cases (C1, C2): each a planted model of `vitpos.models.planted_ape` (its weights
written by hand there) with what is true of it by construction, and how it is measured: the sae
stage's held-out scoring and causal check and the permutation, by the experiments' own run functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vitpos.claims.base import Split
from vitpos.claims.inputs import ClaimInputs
from vitpos.experiments.ape_permute import run_ape_permute
from vitpos.experiments.sae_heldout import sae_doc_from_held
from vitpos.models import planted_ape_power as power
from vitpos.models.planted_ape import Label, Positional, build_planted_ape, planted_data, planted_sae
from vitpos.models.spec import OwnSurface
from vitpos.models.surface import Site
from vitpos.results.sae_run import GivenSAEResult
from vitpos.sae import SAE


@dataclass(frozen=True)
class PlantedCase:
    """A planted model and what is true of it by construction (claim id -> true / false).

    `measure(n_images, seeds)` returns the typed results the claims read of the model
    (`claims.inputs.ClaimInputs`), measured by the experiments' own run functions."""

    name: str
    description: str
    truth: dict[str, bool]
    measure: Callable[[int, tuple[int, ...]], ClaimInputs]
    split: Split = "design"  # claims.base.Split: seen while the rules were written, or held out


def measure_ape(surface: OwnSurface, label: Label, n_images: int = 400, seeds: tuple[int, ...] = (0, 1)
                ) -> ClaimInputs:
    """The sae (held-out scoring + causal check, `evaluate_sae`) and ape_permute results of a planted
    model with the planted SAE at block 0's output, on `n_images` planted test images."""

    return measure_planted(surface, planted_sae(), planted_data(n_images, label, seed=7), seeds)


def measure_planted(surface: OwnSurface, sae: SAE, data: Any, seeds: tuple[int, ...]) -> ClaimInputs:
    """measure_ape's measurement of any planted model, SAE (at block 0's output) and planted images
    (`data`, a dataset object: what the run functions take as `data`)."""
    n_images = len(data)
    sae_doc = sae_doc_from_held(surface, sae, Site(0, "resid_post"), data, seed=0)
    ap = run_ape_permute(surface, sae, sae_doc, data=data, n_images=n_images, seeds=seeds)
    return ClaimInputs(sae=GivenSAEResult.model_validate(sae_doc), ape_permute=ap, scheme=surface.scheme,
                       data=data.info.name)


def _case(name: str, description: str, positional: Positional, label: Label, c1: bool, c2: bool) -> PlantedCase:
    return PlantedCase(name, description, {"C1": c1, "C2": c2},
                       lambda n, seeds: measure_ape(build_planted_ape(positional, label), label, n, seeds))


APE_CASES: tuple[PlantedCase, ...] = (
    _case("ape:row_col_used", "row and col one-hots in the APE; the label reads them", "row_col", "position",
          True, True),
    _case("ape:cell_used", "a cell one-hot in the APE (no row- or col-only channel); the label reads it", "cell",
          "position", False, True),
    _case("ape:pos_unused", "row and col one-hots in the APE; the label reads colour only", "row_col", "colour",
          False, False),
    _case("ape:no_position", "APE table 0 (no position anywhere); the label needs position", "none", "position",
          False, False),
)


def _power(name: str, description: str, build: Callable[[], OwnSurface], label: power.Label, p_blue: float,
           truth: dict[str, bool], split: Split = "held_out", red: float = 0.5, uncovered: tuple[int, ...] = (),
           scale: int = 1) -> PlantedCase:
    """A case of `planted_ape_power` (its docstring says why each truth follows from the weights); held
    out: built after rules version 4 (hash bfb33fb5b1333858) was frozen; design: built with the rule it tests.
    red: the share of red among the red and green squares; uncovered: channels its SAE does not encode; scale:
    the case measures scale x the images it is asked for (a small effect's ratio needs them)."""
    return PlantedCase(name, description, truth,
                       lambda n, seeds: measure_planted(build(), power.power_sae(uncovered),
                                                        power.power_data(scale * n, label, p_blue, seed=7, red=red),
                                                        seeds),
                       split=split)


# One planted-false case per condition of C1 / C2 that it alone should decide, and a planted-true case
# nearer the thresholds (planted_ape_power's docstring). C1's `feature_sets` and C2's `ape_shuffle` have
# none: they are preconditions (a model without a row (col) feature set has no removal of it either, so
# `selective`, `probe_drop` and `above_control` fail with it; a model whose APE shuffle costs ~nothing has no
# position budget, so `budget` fails with it). colour_in_position, held out under rules version 4, fails
# `ape_shuffle` and `budget` too since version 7 (its APE shuffle costs 0): colour_beside_position is the
# design case that `above_null` decides alone now.
APE_POWER_CASES: tuple[PlantedCase, ...] = (
    _power("ape:cells_recoded", "row and col one-hots re-coded downstream as a cell one-hot (only selective "
           "decides)", power.cells_recoded, "position", 0.0, {"C1": False}),
    _power("ape:rows_elsewhere", "downstream row code read from cell one-hots, from the row latents only on the "
           "red square (only probe_drop decides)", power.rows_elsewhere, "position", 0.0, {"C1": False}),
    _power("ape:rows_need_everything", "downstream row code needs the row one-hot and eight always-on latents "
           "(only above_control decides)", power.rows_need_everything, "position", 0.0, {"C1": False}),
    _power("ape:colour_in_position", "the colour stored inside the positional latents; label colour (above_null "
           "decides; since rules version 7 ape_shuffle and budget too)", power.colour_in_position, "colour", 0.0,
           {"C2": False}),
    _power("ape:rare_position", "position decides the class of 1 image in 10 (only min_drop decides)",
           power.colour_position, "position", 0.9, {"C2": False}, scale=4),
    _power("ape:near_threshold", "position decides the class of half the images (top-1 drops near the "
           "thresholds)", power.colour_position, "position", 0.5, {"C1": True, "C2": True}),
    _power("ape:colour_beside_position", "red by the colour stored in its row latents, green by its column (only "
           "above_null decides)", power.colour_beside_position, "mixed", 0.0, {"C2": False}, split="design",
           red=2 / 3),
    _power("ape:position_beyond_sae", "the label reads the column through channels the SAE does not encode (only "
           "budget decides)", power.position_beyond_sae, "position", 0.0, {"C2": False}, split="design", red=0.3,
           uncovered=power.PC.hidden_col, scale=2),
    _power("ape:content_moves_label", "each gate needs colour, mark and position at one token: moving content "
           "costs more than moving position (only above_norm_control decides)", power.content_moves_label,
           "position", 0.0, {"C2": False}, split="design", uncovered=(power.PC.mark,)),
)
