"""Checks of stage settings on plain values, the ones a stage's library functions make at their start:
each experiment's `check` calls them (one line each), so that `vitpos run --plan` exits 2 on exactly
what the run would refuse, and the run refuses before its first stage instead of after hours.

Each raises one VitposError naming the config key (the study prefixes the model and the stage)."""

from __future__ import annotations

from collections.abc import Sequence

from vitpos.analysis.probe_split import split_images
from vitpos.errors import VitposError
from vitpos.experiments.base import SplitSizes
from vitpos.models.surface import ModelSurface

MAX_EXPANSION = 256  # sae.expansion's bound (SAESettings): each size of the sweep's grid is held to it too


def check_data(surface: ModelSurface, data: str, key: str) -> None:
    """`data` (a data set a stage reads besides the run's) exists and can be measured on the model: an
    unknown name, a missing package, tiles that are not the model's patches."""
    from vitpos.data import dataset_info
    from vitpos.data.resolve import require_fit

    try:
        dataset_info(data)
        require_fit(surface, data)
    except VitposError as e:
        raise VitposError(f"{key} {data!r}: {e}") from None


def check_probe_images(n: int, key: str) -> None:
    """`n` images (as many as the stage will get) split by image into probe fit / val / test sets, as
    the probes split them (`split_images`): fewer than 3 leave a set empty."""
    try:
        split_images(n)
    except VitposError as e:
        raise VitposError(f"{key} gives {n} images: {e}") from None


def images_of(sizes: SplitSizes | None, split: str, wanted: int) -> int:
    """The images of `split` the stage gets for `wanted` (fewer where the split is smaller)."""
    if sizes is None:
        return wanted
    try:
        return sizes.n(split, wanted)
    except ValueError:
        return wanted


def check_expansions(surface: ModelSurface, arch: str, k: int, expansions: Sequence[int] | None, key: str) -> None:
    """Every dictionary size of an SAE sweep within sae.expansion's bound and holding k latents."""
    for exp in expansions or []:
        if not 1 <= exp <= MAX_EXPANSION:
            raise VitposError(f"{key} holds {exp}; each must lie in 1..{MAX_EXPANSION} (a dictionary of {exp} x width "
                              f"{surface.width} latents)")
        if arch != "relu" and k > exp * surface.width:
            raise VitposError(f"{key} holds {exp}: a dictionary of {exp * surface.width} latents, fewer than "
                              f"sae.k {k}; use a larger expansion or a smaller k")


def check_head_splits(sizes: SplitSizes, data: str, model: str, key: str = "head.images") -> None:
    """A head is fitted on train-split images and its l2 chosen on val-split ones: neither may be empty
    (an empty val split gives an undefined val top-1, and the fit a head chosen on nothing). A split of
    unknown size (`split_sizes` could not read it) is read here, for the error the fit would meet.
    `model`: the spec that needs the head, named in the refusal (a run may hold several models)."""
    from vitpos.data import load_split

    needs = (f"{model} needs a head for {data} (its outputs are not logits over {data}'s classes), fitted on the "
             f"train split and chosen on the val split ({key})")
    fix = f"or pass a head for {model} (heads: {{{model}: HEAD_DIR}})"
    for split in ("train", "val"):
        n = getattr(sizes, split)
        if n is None:
            try:
                n = len(load_split(data, split, limit=1))
            except VitposError as e:
                raise VitposError(f"{needs}, but {e}; {fix}") from None
        if n == 0:
            raise VitposError(f"{needs}, but {data} has no {split} images; add {split} images, {fix}")


__all__ = ["MAX_EXPANSION", "check_data", "check_expansions", "check_head_splits", "check_probe_images", "images_of"]
