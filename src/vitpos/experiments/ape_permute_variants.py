"""ape_permute's variants, built before the forwards: the edits that move SAE latents across patches
(`permute_features`, `swap_features`, `crossed_edit`, `random_perms`), the latent sets and their matched
controls and nulls (`FeatureSets`), every run and its edit (`permute_runs`, `site_edits`), their edit
sizes, and the APE-table shuffle (`shuffle_pe`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from vitpos.analysis.forward import capture_layers
from vitpos.models.surface import ModelSurface, Site
from vitpos.results.ape_permute import (
    ALL_VARIANTS,
    CONJ_VARIANTS,
    CONTROL_VARIANTS,
    CONTROLS,
    NULL_VARIANTS,
    NULLS,
    SUBSPACE_VARIANTS,
)
from vitpos.sae import SAE
from vitpos.sae.controls import matched_control, matched_random_features

MASS_IMAGES = 256  # images whose codes give each latent's mean activation


_CONTROL_STREAM = {v: 100_000 * (i + 1) for i, v in enumerate(CONTROL_VARIANTS + NULL_VARIANTS)}  # + 10_000 + seed


EDIT_STREAM = 900_000  # + seed: the fresh draws that measure each variant's edit size


# + seed: the conjunction variants' control draws (issue 47 item 3), apart from every older stream
_CONJ_STREAM = {v: 2_000_000 + 100_000 * i for i, v in enumerate(CONJ_VARIANTS)}


NO_CONJ = "no conjunction latents"  # why the conjunction variants are skipped (the set would be the positional one)


def permute_features(x: torch.Tensor, z: torch.Tensor, sae: SAE, ids: list[int], perm: torch.Tensor) -> torch.Tensor:
    """x, z: (B, N, D), (B, N, F); perm (B, N): patch n takes the features of patch perm[b, n]."""
    c = sae.feature_contribution(z, ids)
    moved = torch.gather(c, 1, perm.unsqueeze(-1).expand_as(c))
    return x + (moved - c)


def swap_features(x: torch.Tensor, z: torch.Tensor, sae: SAE, ids: list[int], other: torch.Tensor) -> torch.Tensor:
    """The same-position cross-image swap: image b takes image other[b]'s codes of `ids` at each patch."""
    c = sae.feature_contribution(z, ids)
    return x + (c[other] - c)


def subspace_basis(sae: SAE, ids: list[int], rtol: float = 1e-5) -> torch.Tensor:
    """(D, r) orthonormal basis of the span of latents `ids`' decoder directions (r: its rank; r = D when
    the set spans the whole stream, e.g. more positional latents than dimensions)."""
    w = sae.W_dec.detach().index_select(0, torch.as_tensor(ids, dtype=torch.long, device=sae.W_dec.device)).double()
    _, sv, vh = torch.linalg.svd(w, full_matrices=False)
    rank = int((sv > rtol * sv[0]).sum()) if sv.numel() and float(sv[0]) > 0 else 0
    return vh[:rank].T.contiguous()


def permute_subspace(x: torch.Tensor, z: torch.Tensor, sae: SAE, basis: torch.Tensor, perm: torch.Tensor,
                     error_only: bool) -> torch.Tensor:
    """Each patch's component in span(`basis`) (D, r) replaced by patch perm[b, n]'s: of the whole token, or
    (`error_only`) of the SAE's error term x - decode(z) only; the rest of every token stays."""
    q = basis.to(device=x.device, dtype=x.dtype)
    src = x - sae.decode(z).to(x.dtype) if error_only else x
    c = (src @ q) @ q.T
    moved = torch.gather(c, 1, perm.to(x.device).unsqueeze(-1).expand_as(c))
    return x + (moved - c)


def image_rotation(B: int, g: torch.Generator) -> torch.Tensor:
    """(B,) image b -> image (b + s) % B with a random shift s in 1..B-1 (no image keeps its own
    codes; a batch of one is left as it is)."""
    if B < 2:
        return torch.zeros(B, dtype=torch.long)
    shift = int(torch.randint(1, B, (1,), generator=g))
    return (torch.arange(B) + shift) % B


def crossed_edit(x: torch.Tensor, z: torch.Tensor, sae: SAE, row: list[int], col: list[int], grid: tuple[int, int],
                 g: torch.Generator) -> torch.Tensor:
    """Row features moved by whole columns, col features by whole rows (each token keeps its row's
    row codes and its column's col codes when the features are what they are called)."""
    B = x.shape[0]
    if row:
        x = permute_features(x, z, sae, row, random_perms("col", B, grid, g))
    if col:
        x = permute_features(x, z, sae, col, random_perms("row", B, grid, g))
    return x


def random_perms(kind: str, B: int, grid: tuple[int, int], g: torch.Generator) -> torch.Tensor:
    """(B, N) permutations: 'all' any, 'row' shuffles whole rows, 'col' shuffles whole columns."""
    H, W = grid
    idx = torch.arange(H * W).reshape(H, W)
    out = []
    for _ in range(B):
        if kind == "all":
            out.append(torch.randperm(H * W, generator=g))
        elif kind == "row":
            out.append(idx[torch.randperm(H, generator=g)].flatten())
        else:
            out.append(idx[:, torch.randperm(W, generator=g)].flatten())
    return torch.stack(out)


@torch.no_grad()
def site_tokens(surface: ModelSurface, site: Site, dataset, n: int = MASS_IMAGES) -> torch.Tensor:
    """(n, N, D) patch tokens at `site` of the first n images."""
    return capture_layers(surface, dataset.subset(n), [site], check_classifier=False)[0][str(site)]


@dataclass(frozen=True)
class CodeStats:
    """Per latent over the patch tokens of the mass images: mean code (mean ablation; decoder columns are
    unit-norm, so also its mean activation mass), firing rate and within-image spread (`feature_spread_of`)."""

    mean_code: torch.Tensor  # (F,)
    fire: torch.Tensor  # (F,)
    spread: torch.Tensor  # (F,)


@torch.no_grad()
def code_stats(sae: SAE, acts: torch.Tensor, chunk: int = 32) -> CodeStats:
    """CodeStats of `acts` (n, N, D), encoded `chunk` images at a time: the peak holds the codes, not also
    the whole set's pre-activations and float mask (+505 MB instead of +1268 MB at DINOv2-S/14's 256 x 256
    tokens x 1536 latents). The codes are those of one whole encode up to the encoder matmul's rounding,
    which BLAS may split differently by batch size (bit for bit at one thread; ~1e-8 at two)."""
    n = acts.shape[0]
    z = torch.empty(*acts.shape[:-1], sae.d_sae, dtype=acts.dtype)  # filled in place: no list of chunks beside it
    fired = torch.zeros(sae.d_sae, dtype=torch.long)
    for i in range(0, n, chunk):
        z[i:i + chunk] = sae.encode(acts[i:i + chunk])
        fired += torch.count_nonzero(z[i:i + chunk].reshape(-1, sae.d_sae), dim=0)
    flat = z.reshape(-1, z.shape[-1])
    # the count is exact in float32 (< 2^24 tokens), so this is (z != 0).float().mean(0) to the bit
    fire = fired.to(torch.float32) / flat.shape[0]
    return CodeStats(flat.mean(0), fire, feature_spread_of(z))


def feature_spread_of(z: torch.Tensor) -> torch.Tensor:
    """(F,) per latent, sqrt of its mean within-image variance of z (n, N, F) over patches: a permutation of
    patches moves latent f by sqrt(2) x this on average (decoder rows are unit-norm), so it sizes the edit."""
    return z.var(1, correction=0).mean(0).sqrt()


@torch.no_grad()
def edit_size(edit: PatchEdit, sae: SAE, acts: torch.Tensor, batch: int = 256) -> tuple[float, float]:
    """(mean ||x' - x||, that / mean ||x||) over the patch tokens `acts` (n, N, D) under `edit`."""
    total, norm, count = 0.0, 0.0, 0
    for i in range(0, acts.shape[0], batch):
        x = acts[i:i + batch]
        d = (edit(x, sae.encode(x)) - x).norm(dim=-1)
        total += float(d.sum())
        norm += float(x.norm(dim=-1).sum())
        count += d.numel()
    return total / max(count, 1), total / norm if norm > 0 else 0.0


PatchEdit = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (patch tokens x, SAE codes z) -> new x


@dataclass(frozen=True)
class PermuteRun:
    """One intervened forward of run_ape_permute: a variant at a seed, edited at the SAE's site or, for
    the APE-table shuffle, at the input."""

    variant: str
    seed: int

    @property
    def at_input(self) -> bool:
        return self.variant == "pos_embed_shuffle"


# the variants edited at the SAE's site once per seed, in the order they run (mean ablation runs once)
SITE_VARIANTS = tuple(v for v in ALL_VARIANTS if v not in ("mean_ablate", "pos_embed_shuffle"))


def permute_runs(seeds: Sequence[int]) -> list[PermuteRun]:
    """Every intervened forward run_ape_permute makes, in its order (the clean baseline besides): per
    seed every permuted set, control and null at the site; mean ablation once (deterministic: it
    counts for every seed); per seed the APE-table shuffle. A site variant with nothing to move is
    skipped when run, so for `plan_ape_permute` this is an upper bound."""
    runs = [PermuteRun(v, seed) for seed in seeds for v in SITE_VARIANTS]
    runs.append(PermuteRun("mean_ablate", seeds[0]))
    return runs + [PermuteRun("pos_embed_shuffle", seed) for seed in seeds]


def run_stream(variant: str, seed: int) -> int:
    """The seed of a run's permutation draws: a permuted set and its controls share the seed (same
    permutations); each null has its own stream, so adding them moved no older number."""
    return _CONTROL_STREAM[variant] + 10_000 + seed if variant in NULLS else seed


@dataclass(frozen=True)
class FeatureSets:
    """The SAE's latents that run_ape_permute moves, and what its matched controls are drawn by."""

    sae: SAE
    grid: tuple[int, int]
    row: list[int]
    col: list[int]
    mixed: list[int]
    mean_code: torch.Tensor  # (F,) mean activation over patch tokens: the controls match on it
    live: torch.Tensor  # (F,) bool: the latents a control may draw
    spread: torch.Tensor  # (F,) within-image spread of z: norm_all_positional matches on it
    conj: list[int] = field(default_factory=list)  # conjunction latents (issue 47 item 3): not row / col / mixed
    conj_typed: bool = True  # False: the SAE's description has no conjunction typing (written before it, or given)

    @property
    def positional(self) -> list[int]:
        return self.row + self.col + self.mixed

    @property
    def conj_positional(self) -> list[int]:
        """The conjunction-inclusive positional set: the positional latents, then the conjunction ones."""
        pos = set(self.positional)
        return self.positional + [f for f in self.conj if f not in pos]

    def sets(self) -> dict[str, tuple[list[int], str]]:
        """Permuted set -> (its latents, the permutation kind)."""
        return {"all": (self.row + self.col, "all"), "row_only": (self.row, "row"), "col_only": (self.col, "col"),
                "all_positional": (self.positional, "all")}

    def mass(self, ids: list[int]) -> float:
        return float(self.mean_code[ids].sum()) if ids else 0.0

    def moved(self, v: str, seed: int) -> tuple[list[int], str, str | None]:
        """(latents, permutation kind, note) of site variant `v` at `seed`; without latents the note, when
        there is one, says why."""
        sets, pos = self.sets(), self.positional
        if v in sets:
            return (*sets[v], None)
        if v == "random_features":
            g = torch.Generator().manual_seed(10_000 + seed)
            return matched_random_features(self.mean_code, self.row + self.col, self.live, g), "all", None
        if v in CONTROL_VARIANTS:  # each control its own stream: the older variants' draws do not move
            of = {c: s for s, c in CONTROLS.items()}[v]
            targets, kind = sets[of]
            if not targets:
                return [], kind, f"no features in {of} to match"
            g = torch.Generator().manual_seed(_CONTROL_STREAM[v] + 10_000 + seed)
            ids, note = matched_control(self.mean_code, targets, pos, self.live, g)
            return ids, kind, note
        if v == "norm_all_positional":
            if not pos:
                return [], "all", None
            g = torch.Generator().manual_seed(_CONTROL_STREAM[v] + seed)
            ids, note = matched_control(self.spread, pos, pos, self.live, g, what="edit size")
            return ids, "all", note
        if v == "swap_all_positional":
            return pos, "all", None
        if v in CONJ_VARIANTS:
            return self._conj_moved(v, seed)
        if v in SUBSPACE_VARIANTS:  # the all-positional set's span, moved with that set's permutations
            if not pos:
                return [], "all", None
            rank, d = subspace_basis(self.sae, pos).shape[1], self.sae.cfg.d_in
            whole = " (the whole stream: the token itself is moved)" if rank == d and v == "subspace_positional" else ""
            return pos, "all", f"span of {len(pos)} decoder directions: rank {rank} of {d} dims{whole}"
        if v in ("crossed", "mean_ablate"):
            return self.row + self.col, "all", None
        raise ValueError(f"{v} is not a variant edited at the SAE's site")

    def _conj_moved(self, v: str, seed: int) -> tuple[list[int], str, str | None]:
        """CONJ_VARIANTS: the conjunction-inclusive set (all_positional's permutations: same seed), or an edit-norm
        matched control of it or of the all-positional set, drawn from live latents in neither set. Without
        conjunction latents each is skipped: the set would be all_positional and the pool norm_all_positional's."""
        both = self.conj_positional
        if not self.conj_typed:
            return [], "all", "the SAE's description types no conjunction latents (sae.json without conj_features)"
        if not self.conj:
            return [], "all", f"{NO_CONJ}: the conjunction-inclusive set is the all-positional one"
        if v == "conj_positional":
            return both, "all", None
        g = torch.Generator().manual_seed(_CONJ_STREAM[v] + seed)
        targets = both if v == "norm_conj_positional" else self.positional
        if not targets:
            return [], "all", "no positional latents to match"
        ids, note = matched_control(self.spread, targets, both, self.live, g, what="edit size")
        return ids, "all", note

    def edit(self, v: str, ids: list[int], kind: str, stream: int) -> PatchEdit:
        """Variant `v`'s edit of the site's patch tokens moving `ids`, its draws from a generator of
        `stream`, advanced batch by batch."""
        sae, grid = self.sae, self.grid
        g = torch.Generator().manual_seed(stream)
        if v == "swap_all_positional":
            return lambda x, z: swap_features(x, z, sae, ids, image_rotation(x.shape[0], g))
        if v == "crossed":
            return lambda x, z: crossed_edit(x, z, sae, self.row, self.col, grid, g)
        if v in SUBSPACE_VARIANTS:
            basis, error_only = subspace_basis(sae, ids), v == "subspace_error"
            return lambda x, z: permute_subspace(x, z, sae, basis, random_perms(kind, x.shape[0], grid, g), error_only)
        if v == "mean_ablate":
            mean_c = sae.feature_contribution(self.mean_code, ids)  # mean contribution over patches, (D,)
            return lambda x, z: x - sae.feature_contribution(z, ids) + mean_c
        return lambda x, z: permute_features(x, z, sae, ids, random_perms(kind, x.shape[0], grid, g))


def _why_none(v: str, note: str | None) -> str:
    """Why site variant `v` has nothing to move (its note, when it has one)."""
    if note:
        return note
    if v in NULLS:
        return f"no features in {NULLS[v]}"
    if v == "mean_ablate":
        return "no positional features"
    if v in SUBSPACE_VARIANTS:
        return "no positional features: no subspace to move"
    if v in ("all", "row_only", "col_only", "all_positional"):
        return "no features of this kind"
    return "not enough live non-positional latents"  # random_features and the matched controls


@dataclass(frozen=True)
class SiteEdits:
    """The site runs of `permute_runs` that have latents to move: (variant, seed) -> its edit and what
    it moves; why each other variant is skipped; the matching's notes (the last seed's)."""

    fns: dict[tuple[str, int], PatchEdit]
    moved: dict[tuple[str, int], tuple[list[int], str]]
    skipped: dict[str, str]
    notes: dict[str, str]


def site_edits(feats: FeatureSets, runs: Sequence[PermuteRun]) -> SiteEdits:
    """Every site run's edit, planned before the forwards."""
    out = SiteEdits({}, {}, {}, {})
    for r in runs:
        if r.at_input:
            continue
        ids, kind, note = feats.moved(r.variant, r.seed)
        if not ids:
            out.skipped.setdefault(r.variant, _why_none(r.variant, note))
            continue
        if note:
            out.notes[r.variant] = note
        out.fns[(r.variant, r.seed)] = feats.edit(r.variant, ids, kind, run_stream(r.variant, r.seed))
        out.moved[(r.variant, r.seed)] = (ids, kind)
    return out


def edit_sizes(feats: FeatureSets, edits: SiteEdits, acts: torch.Tensor, seed: int) -> dict[str, tuple[float, float]]:
    """Each site variant's edit size at `seed` on the patch tokens `acts`, from fresh draws (their own
    stream: the runs' draws do not move); mean ablation draws nothing, so its own edit."""
    sizes: dict[str, tuple[float, float]] = {}
    for v in ALL_VARIANTS:
        key = (v, seed)
        if key not in edits.fns:
            continue
        fn = edits.fns[key] if v == "mean_ablate" else feats.edit(v, *edits.moved[key], EDIT_STREAM + seed)
        sizes[v] = edit_size(fn, feats.sae, acts)
    return sizes


def shuffle_pe(surface: ModelSurface, pe: torch.Tensor, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The APE-table shuffle's edit of the embedded tokens: each image's patch position embeddings
    permuted (its own generator of `seed`, advanced batch by batch)."""
    npt, g = surface.num_prefix_tokens, torch.Generator().manual_seed(20_000 + seed)

    def fn(t: torch.Tensor) -> torch.Tensor:
        moved = pe[random_perms("all", t.shape[0], surface.grid, g)]  # (B, N, D)
        return torch.cat([t[:, :npt], t[:, npt:] - pe + moved], dim=1)
    return fn
