"""Random controls for a set of SAE latents: live latents outside the positional ones, each matched in
mass (mean activation, RMS code, edit size) to one latent of the set. Shared by the permutation (C2)
and the causal check (C1)."""

from __future__ import annotations

import torch

MASS_TOLERANCE = 0.10  # a control whose total activation mass is further off than this is flagged


def _pick_matched(mass: torch.Tensor, targets: list[int], cands: list[int], g: torch.Generator, pool: int) -> list[int]:
    """For each target latent in turn, a random still-free candidate among the `pool` closest in mass."""
    chosen: list[int] = []
    for f in targets:
        free = [c for c in cands if c not in chosen]
        free.sort(key=lambda c: abs(float(mass[c] - mass[f])))
        near = free[:pool]
        chosen.append(near[int(torch.randint(len(near), (1,), generator=g))])
    return chosen


def matched_random_features(mass: torch.Tensor, positional: list[int], live: torch.Tensor, g: torch.Generator,
                            pool: int = 5) -> list[int]:
    """For each positional latent, a random non-positional live latent among the `pool` closest in mass."""
    pos = set(positional)
    cands = [f for f in torch.nonzero(live).flatten().tolist() if f not in pos]
    if len(cands) < len(positional):
        return []
    return _pick_matched(mass, positional, cands, g, pool)


def matched_control(mass: torch.Tensor, targets: list[int], positional: list[int], live: torch.Tensor,
                    g: torch.Generator, pool: int = 5, what: str = "mass") -> tuple[list[int], str | None]:
    """A random control for the permuted set `targets`: live latents outside `positional` (every
    positional latent), one matched in mass to each target. With fewer such latents than targets,
    all of them (the largest matched set) and a note saying so; ([], note) when there are none."""
    pos = set(positional)
    cands = [f for f in torch.nonzero(live).flatten().tolist() if f not in pos]
    if len(cands) >= len(targets):
        ids = _pick_matched(mass, targets, cands, g, pool)
        want, got = float(mass[targets].sum()), float(mass[ids].sum())
        if want > 0 and abs(got / want - 1) > MASS_TOLERANCE:  # the candidates' masses cannot match: said so
            return ids, (f"{what} not matched within {MASS_TOLERANCE:.0%}: the control's {got:.3g} vs the set's "
                         f"{want:.3g} (the closest live non-positional latents)")
        return ids, None
    if not cands:
        return [], "no live non-positional latents"
    cands.sort(key=lambda c: -float(mass[c]))
    k = len(cands)
    return cands, (f"only {k} live non-positional latent{'s' if k != 1 else ''} for a set of {len(targets)}: "
                   f"the control moves {'all ' if k != 1 else ''}{k}")
