"""Output-match gate: what a model family must pass before vitpos trusts its surface.

Run on a toy random-init model of the family (seconds), on the surface alone, so the same checks
hold for timm and Hugging Face families:
  noop          identity edits on every editable site and captures of every site leave the output bit for bit
  partial       forward_from(0, embed_tokens(x)) is the plain forward, bit for bit
  pattern       the captured attention rows sum to 1 and attention through them reproduces z (RoPE included)
  head_proj     attn_out = sum over heads of z_h @ P_h + bias (the per-head output projection)
RoPE families also:
  rotations     vitpos' recomputation of the rotation (rope_table + apply_rope) equals the model's own
                q_rot / k_rot, and the other layout (interleaved <-> rotate-half) does not
  axis_removal  (RoPE only, no APE) with an axis removed in every layer, the pooled features do not change
                when that axis' patch rows (or columns) are permuted, and they do change (10x more) with it kept
  per_head      removing an axis for one head changes that head's rotated q and pattern only
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pydantic import BaseModel

from vitpos.errors import VitposError
from vitpos.hooks import capture, edit, remove_rope
from vitpos.models.surface import ModelSurface, Site

EDITABLE = ("embed", "resid_pre", "resid_post", "attn_out", "mlp_out", "q", "k", "z")
CAPTURED = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "q_rot", "k_rot", "z", "embed")


class GateCheck(BaseModel):
    name: str
    passed: bool
    detail: str


class GateResult(BaseModel):
    family: str
    spec: str
    checks: list[GateCheck]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def status(self) -> str:
        failed = [c.name for c in self.checks if not c.passed]
        return "passes" if not failed else "FAILS: " + ", ".join(failed)


def _images(surface: ModelSurface, n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, *surface.input_size, generator=torch.Generator().manual_seed(seed))


def _max(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def check_noop(s: ModelSurface, x: torch.Tensor) -> GateCheck:
    plain = s(x)
    with edit(s, {name: (lambda t: t) for name in EDITABLE}):
        edited = s(x)
    with capture(s, list(CAPTURED)):
        captured = s(x)
    ok = torch.equal(plain, edited) and torch.equal(plain, captured)
    return GateCheck(name="noop", passed=ok, detail=f"max |diff| edit {_max(plain, edited):.1e}, capture "
                                                    f"{_max(plain, captured):.1e} (must be 0)")


def check_partial(s: ModelSurface, x: torch.Tensor) -> GateCheck:
    plain, part = s(x), s.forward_from(0, s.embed_tokens(x))
    return GateCheck(name="partial", passed=torch.equal(plain, part), detail=f"max |diff| {_max(plain, part):.1e}")


def check_pattern(s: ModelSurface, x: torch.Tensor) -> GateCheck:
    """Rows of the pattern sum to 1 and attn_pattern @ v, with v read off z's own path, is z."""
    L = s.depth - 1
    with capture(s, [f"blocks.{L}.attn_pattern", f"blocks.{L}.z", f"blocks.{L}.q_rot", f"blocks.{L}.k_rot"]) as c:
        s(x)
    pat, qr, kr = c[f"blocks.{L}.attn_pattern"], c[f"blocks.{L}.q_rot"], c[f"blocks.{L}.k_rot"]
    rows = _max(pat.sum(-1), torch.ones_like(pat[..., 0]))
    # the pattern is softmax(q_rot k_rot^T / sqrt(d)) from the model's own rotated q, k (RoPE applied)
    ref = torch.softmax(qr @ kr.transpose(-1, -2) * s.head_dim ** -0.5, dim=-1)
    err = _max(pat, ref)
    ok = rows < 1e-5 and err < 1e-5
    return GateCheck(name="pattern", passed=ok, detail=f"row sums off by {rows:.1e}, vs softmax(q_rot k_rot^T) "
                                                       f"{err:.1e} (tol 1e-5)")


def check_head_proj(s: ModelSurface, x: torch.Tensor) -> GateCheck:
    L = 0
    with capture(s, [f"blocks.{L}.z", f"blocks.{L}.attn_out"]) as c:
        s(x)
    z, out = c[f"blocks.{L}.z"], c[f"blocks.{L}.attn_out"]
    P = s.head_projections(L)  # (h, d, D)
    shares = torch.einsum("bhtd,hdD->btD", z.double(), P.double())
    resid = out.double() - shares  # the projection's bias, the same for every token
    err = _max(resid, resid[:1, :1].expand_as(resid))
    return GateCheck(name="head_proj", passed=err < 1e-5, detail=f"attn_out - sum_h z_h P_h varies by {err:.1e} "
                                                                 "(tol 1e-5)")


def _rotate(s: ModelSurface, t: torch.Tensor, table: torch.Tensor, half: bool) -> torch.Tensor:
    from timm.layers.pos_embed_sincos import apply_rot_embed_cat

    npt = s.num_prefix_tokens
    return torch.cat([t[:, :, :npt], apply_rot_embed_cat(t[:, :, npt:], table, half=half)], dim=2)


def check_rotations(s: ModelSurface, x: torch.Tensor) -> GateCheck:
    """vitpos' recomputation (rope_table, the axis map's layout) equals the model's own rotated q / k."""
    with capture(s, ["blocks.0.q", "blocks.0.k", "blocks.0.q_rot", "blocks.0.k_rot"]) as c:
        s(x)
    table = s.rope_table()
    table = table if table.ndim == 2 else table.reshape(-1, *table.shape[-2:])[0]  # mixed: layer 0, head 0 only
    if table.ndim != 2 or s.rope_axis_map().kind != "axial":
        return GateCheck(name="rotations", passed=True, detail="mixed RoPE: checked by rope_embed tests")
    half = s.rope_axis_map().layout == "half"
    errs, wrong = [], []
    for name in ("q", "k"):
        own = c[f"blocks.0.{name}_rot"]
        errs.append(_max(_rotate(s, c[f"blocks.0.{name}"], table, half), own))
        wrong.append(_max(_rotate(s, c[f"blocks.0.{name}"], table, not half), own))
    ok = max(errs) < 1e-5 and min(wrong) > 1e-3
    return GateCheck(name="rotations", passed=ok,
                     detail=f"recomputed vs model {max(errs):.1e} (tol 1e-5); the other layout off by "
                            f"{min(wrong):.1e} (must exceed 1e-3)")


def _permute_axis(images: torch.Tensor, grid: tuple[int, int], axis: str, perm: torch.Tensor) -> torch.Tensor:
    B, C, Hp, Wp = images.shape
    H, W = grid
    ph, pw = Hp // H, Wp // W
    tiles = images.reshape(B, C, H, ph, W, pw)
    tiles = tiles[:, :, perm] if axis == "row" else tiles[:, :, :, :, perm]
    return tiles.reshape(B, C, Hp, Wp)


def check_axis_removal(s: ModelSurface, x: torch.Tensor) -> GateCheck:
    details, ok = [], True
    for axis, n in (("row", s.grid[0]), ("col", s.grid[1])):
        perm = torch.arange(n).flip(0)
        xp = _permute_axis(x, s.grid, axis, perm)
        with remove_rope(s, {axis: None}):  # type: ignore[dict-item]
            a, b = s.pooled_features(x), s.pooled_features(xp)
        kept = _max(s.pooled_features(x), s.pooled_features(xp))
        err = _max(a, b)
        ok = ok and err < 1e-5 and kept > 10 * max(err, 1e-7)
        details.append(f"{axis}: removed {err:.1e} (tol 1e-5), kept {kept:.1e} (must exceed 10x removed)")
    return GateCheck(name="axis_removal", passed=ok, detail="; ".join(details))


def check_per_head(s: ModelSurface, x: torch.Tensor) -> GateCheck:
    sites = ["blocks.0.q_rot", "blocks.0.attn_pattern"]
    with capture(s, sites) as c0:
        s(x)
    with remove_rope(s, {"row": [0]}, layers=[0]), capture(s, sites) as c1:
        s(x)
    other = max(_max(c0[k][:, 1:], c1[k][:, 1:]) for k in sites)
    own = min(_max(c0[k][:, :1], c1[k][:, :1]) for k in sites)
    ok = other == 0.0 and own > 1e-5
    return GateCheck(name="per_head", passed=ok, detail=f"other heads moved {other:.1e} (must be 0), head 0 "
                                                        f"{own:.1e} (must exceed 1e-5)")


def run_gate(family: str, spec: str, build: Callable[[], ModelSurface]) -> GateResult:
    torch.manual_seed(0)
    s = build()
    x = _images(s)
    checks = [check_noop(s, x), check_partial(s, x), check_pattern(s, x), check_head_proj(s, x)]
    if s.has_rope:
        checks += [check_rotations(s, x), check_per_head(s, x)]
        if not s.has_ape:  # with an absolute embedding too, removing RoPE leaves position in the tokens
            checks.append(check_axis_removal(s, x))
    return GateResult(family=family, spec=spec, checks=checks)


# --- the families `vitpos models --families` lists ----------------------------------------------------------

_Q = "img_size=16&patch_size=4&depth=2&embed_dim=32&num_heads=2&num_classes=4"
TIMM_FAMILIES: dict[str, tuple[str, str, str]] = {  # family -> (toy spec, positional encoding, prefix tokens)
    "timm vit / deit3": (f"timm:vit_small_patch16_224?{_Q}", "APE", "CLS"),
    "timm vit + registers": (f"timm:vit_small_patch16_224?{_Q}&reg_tokens=2&no_embed_class=True", "APE",
                             "CLS + registers"),
    "timm RoPE-ViT axial": (f"timm:vit_small_patch16_rope_224?{_Q}&init_values=1.0", "RoPE axial", "CLS"),
    "timm RoPE-ViT mixed": (f"timm:vit_small_patch16_rope_mixed_224?{_Q}&init_values=1.0", "RoPE mixed", "CLS"),
    "timm RoPE-ViT + APE": (f"timm:vit_small_patch16_rope_ape_224?{_Q}&init_values=1.0", "RoPE + APE", "CLS"),
    "timm DINOv3": (f"timm:vit_small_patch16_dinov3?{_Q}&init_values=1.0", "RoPE axial", "CLS + registers"),
    "timm EVA-02": ("timm:eva02_tiny_patch14_224?img_size=28&patch_size=7&depth=2&embed_dim=32&num_heads=2"
                    "&num_classes=4", "RoPE + APE", "CLS"),
}


def hf_available() -> bool:
    """Whether Hugging Face transformers is installed (the `hf` rows can run their gates)."""
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


def family_rows() -> list[tuple[str, str, str, str]]:
    """(family, positional encoding, prefix tokens, toy spec) for every timm and Hugging Face family."""
    from vitpos.models.hf_families import FAMILIES, tiny_spec

    rows = [(k, pe, prefix, spec) for k, (spec, pe, prefix) in TIMM_FAMILIES.items()]
    for key, fam in FAMILIES.items():
        pe = "RoPE axial (rotate-half)" if fam.pe == "rope" else "APE"
        rows.append((f"hf {fam.model_cls}", pe, fam.prefix, tiny_spec(key)))
    return rows


def gate_family(spec: str, name: str) -> GateResult:
    from vitpos.models import load_model

    try:
        return run_gate(name, spec, lambda: load_model(spec))
    except VitposError as e:
        return GateResult(family=name, spec=spec, checks=[GateCheck(name="load", passed=False, detail=str(e))])


# --- the same model in two families ------------------------------------------------------------------------

COMPARED = ("embed", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "q_rot", "k_rot", "z",
            "attn_pattern")


def site_differences(a: ModelSurface, b: ModelSurface, images: torch.Tensor,
                     sites: tuple[str, ...] = COMPARED) -> dict[str, float]:
    """Largest |a - b| per site (every layer) and for the pooled features, on the same images: two
    surfaces of one model in two families (timm and transformers) must agree everywhere."""
    names = [s for s in sites if s != "embed"]
    wanted = [str(Site(i, n)) for n in names for i in range(a.depth)] + (["embed"] if "embed" in sites else [])
    out: dict[str, float] = {}
    with capture(a, wanted) as ca:
        pa = a.pooled_features(images)
    with capture(b, wanted) as cb:
        pb = b.pooled_features(images)
    for key in wanted:
        out[key] = _max(ca[key], cb[key])
    out["pooled"] = _max(pa, pb)
    if a.has_ape and b.has_ape:
        out["pos_embed"] = _max(a.patch_pos_embed(), b.patch_pos_embed())
    return out
