"""The matched positional-encoding zoo (issue 33): one ViT, seven encodings, three seeds, on `pairs`.

Every member is the same timm `Eva` (vitpos' own ViT, models/own.py) at one size: width 128,
6 layers, 4 heads of dimension 32 (8 rotary pairs per axis for axial RoPE), an 8x8 grid of 4-px
patches on 32-px `pairs` scenes. Only the positional encoding differs, and the training recipe
(data, optimiser, schedule, epochs, seed handling) is one for all: 12 epochs, because under 4 the
random-init learned APE and three of six RoPE seeds were still far from converged (docs/zoo.md). A
member is shipped as
`builtin:pairs-<encoding>` (seed 0) and `builtin:pairs-<encoding>-seed<N>`; `recipe(name)` gives the
exact `train` call that reproduced it, and `vitpos zoo train NAME` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vitpos.errors import VitposError

DATA = "pairs"
SEEDS = (0, 1, 2)
MODEL = dict(embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0, patch_size=4)
TRAIN = dict(epochs=12, batch_size=128, lr=1e-3, weight_decay=0.05, warmup_epochs=0.5)


@dataclass(frozen=True)
class Encoding:
    key: str  # the name's middle part: builtin:pairs-<key>
    pe: str  # OwnViTConfig.pe
    ape_init: str  # "trunc_normal" | "sincos" (ignored without a learned table)
    family: str  # "ape" | "rope" | "none": how the report groups it
    text: str


ENCODINGS: tuple[Encoding, ...] = (
    Encoding("ape", "ape", "trunc_normal", "ape", "learned APE from a truncated-normal init (std 0.02, timm's)"),
    Encoding("ape-sinit", "ape", "sincos", "ape", "learned APE initialised from the 2D sin-cos table"),
    Encoding("sincos", "ape-sincos", "sincos", "ape", "fixed 2D sin-cos APE (frozen)"),
    Encoding("rope-axial", "rope-axial", "sincos", "rope", "axial 2D RoPE (naver's rope_axial layout)"),
    Encoding("rope-mixed", "rope-mixed", "sincos", "rope", "mixed 2D RoPE, learned frequencies (naver)"),
    Encoding("rope-mixed-ape", "rope-mixed-ape", "trunc_normal", "rope",
             "mixed 2D RoPE plus a learned APE from a truncated-normal init (naver's rope_mixed_ape)"),
    Encoding("none", "none", "sincos", "none", "no positional signal (a bag of patches)"),
)


def member_name(encoding: str, seed: int) -> str:
    return f"pairs-{encoding}" if seed == 0 else f"pairs-{encoding}-seed{seed}"


def members(seeds: int = len(SEEDS)) -> list[str]:
    """Builtin names of the zoo, seed-major within each encoding (seed 0 first)."""
    return [member_name(e.key, s) for e in ENCODINGS for s in SEEDS[:seeds]]


def parse(name: str) -> tuple[Encoding, int]:
    """(encoding, seed) of a member name; one clear error otherwise."""
    bare = name.removeprefix("builtin:")
    for enc in ENCODINGS:
        for seed in SEEDS:
            if bare == member_name(enc.key, seed):
                return enc, seed
    raise VitposError(f"{name!r} is not a zoo member; use one of {', '.join(members())}")


def recipe(name: str) -> dict:
    """The keyword arguments of `vitpos.train.train` that reproduce member `name`."""
    enc, seed = parse(name)
    overrides = {**MODEL, "ape_init": enc.ape_init}
    return dict(pe=enc.pe, data=DATA, seed=seed, model_overrides=overrides, **TRAIN)


def train_member(name: str, out: str | Path, progress: bool = True, force: bool = False) -> dict:
    """Train (or resume, or no-op if finished) one zoo member into `out`; returns its metrics."""
    from vitpos.train import train

    return train(out=out, progress=progress, force=force, **recipe(name))


def recipe_differences(name: str, member_dir: str | Path) -> list[str]:
    """Where the `train_config.json` in `member_dir` departs from `recipe(name)`, as "key: shipped
    (recipe)" strings; [] when the member was trained with the current recipe. A member shipped
    under an earlier recipe (4 epochs before 2026-12-05) is then visible, not silently compared."""
    from vitpos.io import read_json_object

    cfg = read_json_object(Path(member_dir) / "train_config.json", fix="retrain the member with `vitpos zoo train`")
    r = recipe(name)
    want = {**{k: r[k] for k in TRAIN}, "seed": r["seed"], "data": r["data"], "quick": False,
            **{f"model.{k}": v for k, v in r["model_overrides"].items()}, "model.pe": r["pe"]}
    got = {**{k: cfg.get("train", {}).get(k) for k in ("seed", "data", "quick", *TRAIN)},
           **{f"model.{k}": cfg.get("model", {}).get(k) for k in (*r["model_overrides"], "pe")}}
    return [f"{k}: {got[k]} ({want[k]})" for k in want if got[k] != want[k]]


def older_recipe_note(spec: str) -> str | None:
    """A one-line warning when `spec` names a shipped zoo member trained under another recipe."""
    from vitpos.models.spec import BUILTIN_DIR

    try:
        enc, seed = parse(spec)
    except VitposError:
        return None
    name = member_name(enc.key, seed)
    if not (BUILTIN_DIR / name / "train_config.json").is_file():
        return None
    diff = recipe_differences(name, BUILTIN_DIR / name)
    if not diff:
        return None
    return (f"warning: builtin:{name} was trained with an earlier zoo recipe ({'; '.join(diff)}, shipped "
            f"(current)); its numbers describe that model. Retrain it: vitpos zoo train {name} --out DIR")
