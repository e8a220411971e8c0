"""The planted RoPE cases (C3-C5): each a planted model of `vitpos.models.planted_rope` (its weights
edited there) with the claim it tests and its truth by construction, measured by the study's own
`run_rope_axis` / `run_rope_heads` and read by `vitpos.claims.summary.summarise`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from vitpos.claims.base import Split
from vitpos.claims.inputs import ClaimInputs
from vitpos.data.base import TensorImageDataset
from vitpos.experiments.rope_axis import run_rope_axis
from vitpos.experiments.rope_heads import run_rope_heads
from vitpos.models.planted_rope import c3_model, c4_model, c5_model, classified, flat_data, own_data
from vitpos.models.planted_rope_power import (
    c3_entangled,
    c3_interacting,
    c3_late_axes,
    c4_complete,
    c4_hidden,
    c4_redundant,
    c4_weak,
    col_content_data,
    ring_data,
)
from vitpos.models.spec import OwnSurface


@dataclass(frozen=True)
class PlantedCase:
    """One planted model: the claim it tests, whether the claim is true for it by construction, why."""

    claim: str
    name: str
    truth: bool
    why: str
    build: Callable[[], OwnSurface]
    data: Callable[[OwnSurface], TensorImageDataset]  # what the experiments run on
    # design: seen while the rules were written; held_out: added after rules version 4 was frozen
    # (hash bfb33fb5b1333858), so no rule was tuned on it (rules.CHANGES says which set a change followed)
    split: Split = "design"


def rope_cases() -> list[PlantedCase]:
    return [
        PlantedCase("C3", "one-axis heads", True, "position only through the rotations, each head turning with one "
                    "axis", lambda: c3_model("rope-axial", axis_heads=True), flat_data),
        PlantedCase("C3", "rope-ape", False, "an APE carries both axes whatever the rotations",
                    lambda: c3_model("rope-ape"), flat_data),
        PlantedCase("C4", "one-axis rebuilders", True, "from R on one row-only and one col-only head",
                    lambda: c4_model("rebuild"), flat_data),
        PlantedCase("C4", "silent after R", False, "blocks from R on are the identity", lambda: c4_model("silent"),
                    flat_data),
        PlantedCase("C4", "symmetric rebuilders", False, "after R every head treats row and column alike",
                    lambda: c4_model("symmetric"), flat_data),
        PlantedCase("C5", "only the rebuilder matters", True, "every other head inert",
                    lambda: classified(c5_model("true"), (1, 0), None), own_data),
        PlantedCase("C5", "a layer-0 head matters more", False, "an active layer-0 head that the classifier reads",
                    lambda: classified(c5_model("false"), (0, 1), (1, 0)), own_data),
        # issue 46 (planted_rope_power): each planted-false case fails one condition alone
        PlantedCase("C3", "row in rings", False, "content carries the row as a ring's radius: only an MLP reads it",
                    lambda: c3_model("rope-axial", axis_heads=True), ring_data, split="held_out"),
        PlantedCase("C3", "entangled axes", False, "a head reads the columns only where the row rotation is not "
                    "the identity: removing the rows removes the columns", c3_entangled, flat_data, split="held_out"),
        # rules version 5 (C3's kept two-sided): built with the condition it decides, so a design case
        PlantedCase("C3", "interacting axes", False, "a head reads the columns on the top rows only; removing the "
                    "row rotations makes every row look like row 0 and opens it everywhere: the columns gain",
                    c3_interacting, flat_data),
        # built for the pipeline mutation "C3 floor at chance" (issue 46), knowing the floor decides it: a design case
        PlantedCase("C3", "column in content", True, "content carries the column weakly (a noisy linear code) and "
                    "the rotations the rest: removing the col rotations removes all they add above the content "
                    "floor, though against chance the content's share looks kept", c3_late_axes, col_content_data),
        PlantedCase("C4", "complete rebuild", False, "one-axis rebuilders that put back all of the position",
                    c4_complete, flat_data, split="held_out"),
        PlantedCase("C4", "redundant rebuilders", False, "two heads per axis share the rebuild: none carries much",
                    c4_redundant, flat_data, split="held_out"),
        PlantedCase("C4", "weakly biased rebuilders", False, "the rebuilders read both axes and favour one: S "
                    "between 0.5 and the null threshold", c4_weak, flat_data, split="held_out"),
        PlantedCase("C4", "specialised where it rebuilds", True, "the row rebuilder reads the columns only from "
                    "position the stream carries in the clean run", c4_hidden, flat_data, split="held_out"),
    ]


def run_case(case: PlantedCase, probe_images: int = 200, top1_images: int = 240, attn_images: int = 16,
             readout_images: int = 48) -> ClaimInputs:
    """The experiments a claim reads, on the case's model: its rope_axis and (C4, C5) rope_heads results."""

    s = case.build()
    ds = case.data(s)
    R = s.depth - 1  # the last block: the one the cases plant (or leave out) a rebuilder in
    axis = run_rope_axis(s, data=cast(Any, ds), n_images=probe_images, restore_points=[R],
                         readout_images=readout_images if case.claim == "C3" else 0)
    heads = None
    if case.claim in ("C4", "C5"):
        heads = run_rope_heads(s, data=cast(Any, ds), axis="both", restore_from=R, n_probe_images=probe_images,
                               n_top1_images=top1_images, n_attn_images=attn_images)
    return ClaimInputs(rope_axis=axis, rope_heads=heads, scheme=s.scheme)
