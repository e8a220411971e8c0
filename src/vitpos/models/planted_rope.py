"""Planted RoPE models: small models where C3, C4 and C5 are true or false by construction.

A verdict is evidence only if the same pipeline says `supported` where the claim is planted true
and `not supported` where it is planted false (METHODS.md, Validity). Each case below edits the
weights of a tiny own RoPE ViT (timm's Eva, `vitpos.models.own`) so that the claim's truth follows
from the weights alone; `vitpos.validation.rope_cases` runs the study's own measurements on it
(`run_rope_axis`, `run_rope_heads`) and reads the claim's verdict from `vitpos.claims.summary.summarise`. Content is
(near) constant where position is probed, so every bit of position comes from the rotations.

The edits, each exact (not a tendency of training):
  inert head      its query weights and bias are 0: every score is 0 whatever the rotation, so
                  attention is uniform and removing any rotation changes nothing (A_row = A_col = 0)
  one-axis head   its query and key channels of the other axis are 0: the other axis' rotation
                  multiplies zeros, so removing it changes nothing (S = +1 for a row head, -1 col)
  silent block    attention projection and MLP output (weights and biases) are 0: the block is the
                  identity, so every condition reads the same stream after it as before it

The cases (claim, planted truth):
  C3 true   rope-axial, head 0 of every block row-only and head 1 col-only (rules version 5):
            row (col) position exists only through the row (col) rotations, so removing one
            removes its axis, and the other axis' heads are exactly as they were. (The version-4
            case, every head reading both axes, keeps 209 % / 154 % of the other axis above its
            floor: with one axis' rotations gone the heads turn with the other alone and carry it
            more clearly, an interaction that the two-sided `kept` of version 5 rejects.)
  C3 false  rope-ape: the same with a learned APE added, which carries both axes whatever the
            rotations do: removing a rotation cannot remove its axis
  C4 true   depth 3: layers 0-1 build position on both axes until the clean probes saturate (the
            clean model gains nothing after R = 2); layer 2 holds one row-only and one col-only
            head writing a quarter as strongly: once restored they close part of the deficit, each
            on its axis (count-matched rebuilt share inside (0, 1), S = +-1 exactly)
  C4 false  the same, but block 2 is silent: nothing is rebuilt (rebuilt share exactly 0)
  C4 false  (unspecialised) block 2's heads have the same query / key weights on row and column
            channels of each frequency: they rebuild, but treat both axes alike (S ~ 0)
  C5 true   every head inert but L1H0 (row only), which alone carries position and the classifier's
            input: labels are the model's own clean predictions, so only its ablation moves top-1
  C5 false  the same plus an active layer-0 head writing straight into the class token that the
            classifier reads, while the classifier is blind to L1H0's writes: the largest drop
            is not the rebuilding head's

This module builds the models (the weights); `vitpos.validation.rope_cases` lists the cases, measures
them, and `vitpos.validation.table` reads their verdicts.
"""

from __future__ import annotations

from typing import Any

import torch

from vitpos.data.base import DatasetInfo, TensorImageDataset, to_float
from vitpos.models.own import OwnViTConfig, build_own_vit
from vitpos.models.spec import OwnSurface

GRID_PX, PATCH = 16, 4  # 4 x 4 patches
WIDTH, HEADS = 64, 2  # head_dim 32: 8 row and 8 column rotary pairs per head
REBUILD_SCALE = 0.25  # C4's rebuilders write a quarter of the other heads' output: a partial rebuild
INFO = DatasetInfo(name="planted", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(GRID_PX, GRID_PX),
                   in_chans=3)


def planted_surface(pe: str = "rope-axial", depth: int = 2, seed: int = 0, heads: int = HEADS) -> OwnSurface:
    """A tiny own ViT with sharp attention: a large CLS token (unrotated: a query's score against it
    depends on the query's absolute position), sharp q / k and a strong attention output, so the
    rotations alone make each patch's state a clear function of its position. heads: more heads of
    a smaller head_dim (WIDTH / heads), fewer rotary pairs each."""
    torch.manual_seed(seed)
    cfg = OwnViTConfig.model_validate({"pe": pe, "img_size": GRID_PX, "patch_size": PATCH, "in_chans": 3,
                                       "num_classes": 4, "embed_dim": WIDTH, "depth": depth, "num_heads": heads,
                                       "mlp_ratio": 2.0})
    s = OwnSurface(build_own_vit(cfg).eval(), f"planted:{pe}", cfg)
    with torch.no_grad():
        _eva(s).cls_token.mul_(30)
        for b in _eva(s).blocks:
            b.attn.qkv.weight[: 2 * WIDTH] *= 8
            b.attn.proj.weight.mul_(50)
    return s


def _eva(surface: OwnSurface) -> Any:
    """The surface's timm Eva (blocks, cls_token, head), untyped for attribute access."""
    return surface.model


def _qk_rows(surface: OwnSurface, head: int, channels: list[int], q: bool = True, k: bool = True) -> list[int]:
    d = surface.head_dim
    rows = []
    if q:
        rows += [head * d + j for j in channels]
    if k:
        rows += [surface.width + head * d + j for j in channels]
    return rows


@torch.no_grad()
def make_inert(surface: OwnSurface, layer: int, head: int) -> None:
    """Query of this head = 0: uniform attention whatever the rotations."""
    qkv = _eva(surface).blocks[layer].attn.qkv
    rows = _qk_rows(surface, head, list(range(surface.head_dim)), k=False)
    qkv.weight[rows] = 0
    qkv.bias[rows] = 0


@torch.no_grad()
def make_one_axis(surface: OwnSurface, layer: int, head: int, axis: str) -> None:
    """Query and key channels of the other axis = 0: this head's scores turn with `axis` only."""
    other = "col" if axis == "row" else "row"
    qkv = _eva(surface).blocks[layer].attn.qkv
    rows = _qk_rows(surface, head, surface.rope_axis_map().channels(other))  # type: ignore[arg-type]
    qkv.weight[rows] = 0
    qkv.bias[rows] = 0


@torch.no_grad()
def make_symmetric(surface: OwnSurface, layer: int, head: int) -> None:
    """Query and key weights of the row channels copied from the column channels of the same
    frequency: the head's scores are symmetric under swapping row and column offsets, so on a
    square grid with position-independent content it depends on both axes alike (S = 0)."""
    amap = surface.rope_axis_map()
    rows, cols = amap.channels("row"), amap.channels("col")  # type: ignore[arg-type]
    doc = amap.to_json()
    if not torch.allclose(torch.tensor(doc["row_freqs"]), torch.tensor(doc["col_freqs"]), rtol=1e-5):
        raise ValueError("make_symmetric needs the same frequencies on both axes")
    qkv = _eva(surface).blocks[layer].attn.qkv
    for q, k in ((True, False), (False, True)):
        src, dst = _qk_rows(surface, head, cols, q, k), _qk_rows(surface, head, rows, q, k)
        qkv.weight[dst] = qkv.weight[src]
        qkv.bias[dst] = qkv.bias[src]


@torch.no_grad()
def make_silent(surface: OwnSurface, layer: int) -> None:
    """Attention output and MLP output = 0: block `layer` is the identity."""
    b = _eva(surface).blocks[layer]
    for lin in (b.attn.proj, b.mlp.fc2):
        lin.weight.zero_()
        lin.bias.zero_()


def flat_images(n: int, seed: int = 0, content: float = 0.03) -> torch.Tensor:
    """Near-constant uint8 images (one shared pattern per patch plus a little noise): any position
    in the activations comes from the positional encoding, not from content."""
    patch = torch.rand(3, PATCH, PATCH, generator=torch.Generator().manual_seed(0))  # one pattern for every seed
    g = torch.Generator().manual_seed(seed)
    base = patch.repeat(1, GRID_PX // PATCH, GRID_PX // PATCH)
    x = (base + content * torch.rand(n, 3, GRID_PX, GRID_PX, generator=g)).clamp(0, 1)
    return (x * 255).to(torch.uint8)


def dataset(images: torch.Tensor, labels: torch.Tensor | None = None, seed: int = 0) -> TensorImageDataset:
    if labels is None:
        labels = torch.randint(0, 4, (len(images),), generator=torch.Generator().manual_seed(seed))
    return TensorImageDataset(images, labels, INFO, "test")


@torch.no_grad()
def set_classifier(surface: OwnSurface, images: torch.Tensor, reads: tuple[int, int],
                   blind_to: tuple[int, int] | None = None) -> None:
    """The classifier reads what the rotations of head `reads` = (layer, head) put into the class
    token: e1 = the mean change of that head's write into the class token when its rotations are
    removed, e2 = the leading direction of the write's variation over `images` orthogonal to e1;
    four classes, the quadrants of the class token's final features around their mean along e1, e2.
    blind_to=(layer, head): both directions are made orthogonal to everything that head can write
    (its slice of the output projection), so the classifier does not read it (up to the final
    LayerNorm)."""
    from vitpos.hooks import capture, remove_rope
    from vitpos.models.surface import Site

    x = to_float(images)
    layer, h = reads
    site = Site(layer, "z")
    proj = surface.head_projections(layer)[h].double()  # (d, D)
    with capture(surface, [site]) as c:
        feats = _eva(surface).forward_features(x)[:, 0].double()  # (n, D): final norm, class token
    write = c[str(site)][:, h, 0].double() @ proj  # (n, D): the head's write into the class token
    with remove_rope(surface, {"row": [h], "col": [h]}, layers=[layer]), capture(surface, [site]) as c2:
        _eva(surface).forward_features(x)
    shift = (write - c2[str(site)][:, h, 0].double() @ proj).mean(0)
    centred = write - write.mean(0)
    blind = None
    if blind_to is not None:
        blind, _ = torch.linalg.qr(surface.head_projections(blind_to[0])[blind_to[1]].double().T)  # (D, d)
        shift = shift - blind @ (blind.T @ shift)
    e1 = shift / shift.norm()
    centred = centred - centred @ e1.unsqueeze(1) @ e1.unsqueeze(0)
    if blind is not None:
        centred = centred - centred @ blind @ blind.T
    e2 = torch.linalg.svd(centred, full_matrices=False)[2][0]
    weight = torch.stack([e1, e2, -e1, -e2])
    head = _eva(surface).head
    head.weight.copy_(weight.float())
    head.bias.copy_((-weight @ feats.mean(0)).float())


@torch.no_grad()
def own_labels(surface: OwnSurface, images: torch.Tensor) -> TensorImageDataset:
    """`images` labelled with the model's own clean predictions: clean top-1 is 1 and a head's
    drop is the share of images whose decision its ablation changes."""
    ds = dataset(images)
    preds = torch.cat([surface(x).argmax(-1) for x, _ in ds.batches(256)])
    return dataset(images, preds)


def varied_images(n: int, seed: int = 0, content: float = 0.5) -> torch.Tensor:
    """The near-constant pattern plus strong per-image noise: content that moves a class token."""
    return flat_images(n, seed, content)


def c3_model(pe: str, axis_heads: bool = False) -> OwnSurface:
    """axis_heads: in every block head 0 is row-only and head 1 col-only, so removing one axis' rotations
    leaves the other axis' heads exactly as they were (independence by construction)."""
    s = planted_surface(pe)
    if axis_heads:
        for layer in range(s.depth):
            make_one_axis(s, layer, 0, "row")
            make_one_axis(s, layer, 1, "col")
    return s


def c4_model(kind: str) -> OwnSurface:
    """Layers 0 and 1 build position on both axes (the clean model's probes saturate by layer 1, so
    the layers after R = 2 add nothing in the clean run); layer 2 holds the candidate rebuilders,
    their output scaled by REBUILD_SCALE so that restoring closes only part of the deficit."""
    s = planted_surface("rope-axial", depth=3)
    last = s.depth - 1
    if kind == "rebuild":
        make_one_axis(s, last, 0, "row")
        make_one_axis(s, last, 1, "col")
    if kind == "symmetric":
        make_symmetric(s, last, 0)
        make_symmetric(s, last, 1)
    if kind == "silent":
        make_silent(s, last)
    else:
        with torch.no_grad():
            _eva(s).blocks[last].attn.proj.weight.mul_(REBUILD_SCALE)
    return s


def c5_model(kind: str) -> OwnSurface:
    s = planted_surface("rope-axial", depth=2)
    make_inert(s, 0, 0)
    make_inert(s, 1, 1)
    make_one_axis(s, 1, 0, "row")
    if kind == "true":
        make_inert(s, 0, 1)
    return s


def flat_data(s: OwnSurface) -> TensorImageDataset:
    return dataset(flat_images(240))


def own_data(s: OwnSurface) -> TensorImageDataset:
    return own_labels(s, varied_images(240))


def classified(s: OwnSurface, reads: tuple[int, int], blind_to: tuple[int, int] | None) -> OwnSurface:
    set_classifier(s, varied_images(240, seed=1), reads, blind_to)
    return s


