"""Everything a study stage would refuse, checked before the first stage runs (and by `--plan`).

`check_stage` applies the same checks the experiments' library functions make at their start (the
SAE's k against its dictionary, restore points and windows against the depth, scales against the
grid and the data's canvas, enough training tokens for one SAE batch), to the settings the study
will hand the stage, so that a run never stops at its fifth stage for a setting it could have
refused before the first; a `--plan` exits 2 on the same problems.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vitpos.errors import VitposError
from vitpos.experiments.base import SplitSizes
from vitpos.models.surface import ModelSurface

SAE_BATCH_TOKENS = 4096  # run_sae's default batch, the one the study's sae stage trains with


def check_stage(name: str, settings: Mapping[str, Any], surface: ModelSurface, data: str,
                sizes: SplitSizes | None = None) -> None:
    """One VitposError, naming the config key and the model, when the stage `name` would refuse
    `settings` on `surface` (None when it would run)."""
    try:
        _check(name, settings, surface, data, sizes)
    except VitposError as e:
        raise VitposError(f"{surface.spec} on {data}, stage {name}: {e}") from None


def _check(name: str, s: Mapping[str, Any], surface: ModelSurface, data: str, sizes: SplitSizes | None) -> None:
    L = surface.depth
    if name == "sae":
        from vitpos.experiments.sae_run import sae_config

        sae_config(surface, s["arch"], s["k"], s["expansion"])
        if s.get("layer") is not None and not 0 <= s["layer"] < L:
            raise VitposError(f"sae.layer {s['layer']} is outside 0..{L - 1}; pass a layer of the model")
        if sizes is not None:
            try:
                n = sizes.n("train", s["images"])
            except ValueError:
                n = None
            if n is not None and n * surface.num_patches < SAE_BATCH_TOKENS:
                need = -(-SAE_BATCH_TOKENS // surface.num_patches)
                raise VitposError(f"sae.images {n} give {n * surface.num_patches} patch tokens, fewer than one SAE "
                                  f"batch ({SAE_BATCH_TOKENS}); set sae.images to at least {need}")
    elif name == "rope_axis":
        from vitpos.experiments.common import check_restore_points

        if s.get("restore") is not None:
            check_restore_points(surface, list(s["restore"]), "rope_axis.restore")
    elif name == "rope_heads":
        from vitpos.experiments.common import check_restore_points

        if s.get("restore_from") is not None:
            check_restore_points(surface, [s["restore_from"]], "rope_heads.restore_from")
    elif name == "rope_prefix":
        from vitpos.experiments.common import check_restore_points
        from vitpos.experiments.rope_prefix import check_block_from

        if s.get("restore_from") is not None:
            check_restore_points(surface, [s["restore_from"]], "rope_prefix.restore_from")
        check_block_from(surface, s["block_from"], "rope_prefix.block_from")
    elif name == "rope_freq":
        from vitpos.experiments.rope_freq import check_settings, default_layers, default_windows

        wins = ([(int(a), int(b)) for a, b in s["windows"]] if s.get("windows") is not None
                else default_windows(L))
        check_settings(surface, s["bands"], wins, list(s["layers"]) if s.get("layers") is not None
                       else default_layers(wins))
    elif name == "extrapolate":
        from vitpos.experiments.extrapolate import check_scales

        scales = s.get("scales")
        check_scales(surface, surface.extrapolation_scales if scales is None else scales, "extrapolate.scales",
                     data=data)


__all__ = ["check_stage"]
