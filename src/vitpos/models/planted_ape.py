"""Planted APE models where C1 and C2 are true or false by construction.

Each model is one of vitpos' own ViTs (timm's `Eva`, 4x4 grid of 4-pixel patches, two blocks) whose
weights are written by hand, so what the label depends on is known exactly:

* the residual stream has named channels (`Channels`): a one-hot of the patch's row, of its column
  (or of its cell), two colour channels (red / green: 1 on the patch holding the coloured square,
  0 elsewhere), four texture channels (random projections of the background noise, read by
  nothing), four output channels, a `sink` that is always 0 and, since rules version 7, 20 idle channels
  (noise filters read by nothing, a cell one-hot's spread: where C2's edit-norm-matched control finds
  non-positional latents to move; without them it moved the colours, which costs what moving position
  does, and `cell_used` came out inconclusive);
* the APE table writes the positional one-hots, the patch embedding the colour and texture channels;
* block 0 is the identity (its attention and MLP write nothing): the SAE reads its output;
* block 1's MLP computes the label from the channels (GELU units of slope `GAIN`, which act as AND
  gates on 0/1 inputs; two weak colour units, `PRIOR`, make a model that cannot read position guess
  red-top / green-left, the best it can do, instead of tying), the final norm and average pooling
  pass the output channels to the head.
  Every LayerNorm gets eps = 1e6 and weight 1e3, so it is (x - mean(x)) to 1e-6, and every weight
  row that reads it sums to 0 over the channels (the `sink` takes the balance), so the mean
  subtraction cancels: the model is exactly the circuit written below.

The SAE is planted too: a ReLU SAE whose dictionary is the identity on the channels (one latent per
channel, decoder rows unit-norm), so the scoring, causal check, permutation, controls and verdict
rules are what is validated here, not SAE training.

Data (`planted_data`): 16x16 images, grey background with noise, one red or green 4x4 square on a
random cell. Label `position` (4 classes): red square in the top / bottom half (classes 0, 1,
group `vertical`), green square in the left / right half (classes 2, 3, group `horizontal`).
Label `colour` (4 classes, 2 used): red -> 0, green -> 2 (position plays no part).

Cases (`vitpos.validation.ape_cases.APE_CASES`, which measures them; planted truth for C1 / C2):
  row_col_used   row and col one-hots, label = position through them     C1 true,  C2 true
  cell_used      a cell one-hot (no row- or col-only channel), label = position through it
                                                                          C1 false, C2 true
  pos_unused     row and col one-hots present, label = colour only        C1 false, C2 false
  no_position    APE table 0 (the model has no position), label = position (it cannot read it)
                                                                          C1 false, C2 false
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from vitpos.data.base import DatasetInfo, TensorImageDataset
from vitpos.models.own import OwnViTConfig, build_own_vit
from vitpos.models.spec import OwnSurface
from vitpos.sae import SAE, SAEConfig

GRID = 4
N = GRID * GRID
D = 68  # 48 before issue 47 item 2: + the 20 idle channels
PRIOR = 1e-3  # the colour prior's output (the gates write 1): the class a position-blind model guesses
GAIN = 10.0  # slope of block 1's GELU gates: gelu(GAIN * (a + b - 1.5)) is 0 unless a = b = 1
Positional = Literal["row_col", "cell", "none"]
Label = Literal["position", "colour"]
CLASS_NAMES = ("red-top", "red-bottom", "green-left", "green-right")
GROUPS = {"vertical": (0, 1), "horizontal": (2, 3)}


@dataclass(frozen=True)
class Channels:
    """The residual channels of the planted models."""

    row: tuple[int, ...] = tuple(range(0, 4))
    col: tuple[int, ...] = tuple(range(4, 8))
    cell: tuple[int, ...] = tuple(range(8, 24))
    red: int = 24
    green: int = 25
    texture: tuple[int, ...] = tuple(range(26, 30))
    out: tuple[int, ...] = tuple(range(30, 34))
    sink: int = 34
    # read by nothing, spread like a positional one-hot (`idle_filters`): where C2's edit-norm-matched control
    # (rules version 7) finds non-positional latents to move, as a real SAE's many content latents offer it
    idle: tuple[int, ...] = tuple(range(48, 68))


CH = Channels()


def planted_info(label: Label) -> DatasetInfo:
    return DatasetInfo(name=f"planted-{label}", num_classes=4, class_names=CLASS_NAMES, image_size=(16, 16),
                       in_chans=3, class_groups=dict(GROUPS) if label == "position" else {},
                       description="planted: one red or green square on a grey 4x4-patch grid")


def planted_data(n: int, label: Label = "position", seed: int = 0, split: str = "test") -> TensorImageDataset:
    """n images with one red or green square on a random cell; labels as the module docstring says."""
    g = torch.Generator().manual_seed(seed)
    img = (100 + torch.randint(-12, 13, (n, 1, 16, 16), generator=g)).expand(n, 3, 16, 16).clone()
    green = torch.randint(0, 2, (n,), generator=g).bool()
    cell = torch.randint(0, N, (n,), generator=g)
    r, c = cell // GRID, cell % GRID
    for i in range(n):
        square = torch.tensor([0, 255, 0] if green[i] else [255, 0, 0], dtype=img.dtype)
        img[i, :, 4 * r[i]:4 * r[i] + 4, 4 * c[i]:4 * c[i] + 4] = square.view(3, 1, 1)
    if label == "position":
        y = torch.where(green, 2 + (c >= GRID // 2).long(), (r >= GRID // 2).long())
    else:
        y = torch.where(green, 2, 0)
    return TensorImageDataset(img.to(torch.uint8), y, planted_info(label), split)


# the background noise's sd in the model's input ([-1, 1]: 25 uniform grey levels of 255 / 2) and the
# within-image spread an idle channel is given: ReLU(N(0, s^2)) has sd 0.584 s, and 0.24 is a one-hot's over
# 16 patches (sqrt(15) / 16), so the matched control finds idle channels nearer every positional latent than
# the colour channels (spread <= 0.18) and never has to move the label's content
NOISE_SD = (((25 ** 2 - 1) / 12) ** 0.5) / 127.5
IDLE_SPREAD = 0.24


def idle_filters(n: int, seed: int, spread: float = IDLE_SPREAD) -> torch.Tensor:
    """(n, 4, 4) zero-mean filters for the blue input channel whose ReLU response to the background noise
    has within-image spread ~`spread`: idle latents (read by nothing) of a positional one-hot's spread."""
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(n, 4, 4, generator=g)
    f = f - f.mean((1, 2), keepdim=True)
    return f / f.norm(dim=(1, 2), keepdim=True) * spread / (0.584 * NOISE_SD)


def _balanced(w: torch.Tensor) -> torch.Tensor:
    """Rows that read a (x - mean(x)) LayerNorm: the sink channel (always 0) takes minus the row sum."""
    w = w.clone()
    w[:, CH.sink] = 0
    w[:, CH.sink] = -w.sum(1)
    return w


@torch.no_grad()
def build_planted_ape(positional: Positional, label: Label, seed: int = 0) -> OwnSurface:
    """The planted model (see the module docstring): `positional` channels in the APE table,
    the label read through them (`position`) or from colour alone (`colour`)."""
    cfg = OwnViTConfig(pe="ape", img_size=16, patch_size=4, in_chans=3, num_classes=4, embed_dim=D, depth=2,
                       num_heads=2, mlp_ratio=2.0)
    with torch.random.fork_rng(devices=[]):  # timm's init draws from the global generator: leave it as it was
        torch.manual_seed(seed)
        m: Any = build_own_vit(cfg).eval()
    for p in m.parameters():
        p.zero_()
    # APE: the positional one-hots
    pe = torch.zeros(N, D)
    for n in range(N):
        r, c = divmod(n, GRID)
        if positional == "row_col":
            pe[n, CH.row[r]] = 1.0
            pe[n, CH.col[c]] = 1.0
        elif positional == "cell":
            pe[n, CH.cell[n]] = 1.0
    m.pos_embed.copy_(pe.unsqueeze(0))
    # patch embedding: inputs are in [-1, 1]; a pure red patch has (R - G) / 2 = 1, grey 0
    w = m.patch_embed.proj.weight  # (D, 3, 4, 4)
    w[CH.red, 0] = 1 / 32
    w[CH.red, 1] = -1 / 32
    w[CH.green, 1] = 1 / 32
    w[CH.green, 0] = -1 / 32
    g = torch.Generator().manual_seed(1000 + seed)
    for t in CH.texture:  # zero-mean random filters on the blue channel: respond to the noise, read by nothing
        f = torch.randn(4, 4, generator=g)
        w[t, 2] = 2.0 * (f - f.mean())
    w[list(CH.idle), 2] = idle_filters(len(CH.idle), 2000 + seed)
    # block 1's MLP: four AND gates, one per class, each writing its output channel
    mlp = m.blocks[1].mlp
    fc1 = torch.zeros(mlp.fc1.out_features, D)
    b1 = torch.zeros(mlp.fc1.out_features)
    half = GRID // 2
    if label == "position":
        if positional == "row_col":
            reads = [(CH.red, CH.row[:half]), (CH.red, CH.row[half:]), (CH.green, CH.col[:half]),
                     (CH.green, CH.col[half:])]
        else:  # cell one-hots (or none: the same gates, which then never fire)
            cells = [[n for n in range(N) if (n // GRID < half) == top] for top in (True, False)]
            cols = [[n for n in range(N) if (n % GRID < half) == left] for left in (True, False)]
            reads = [(CH.red, tuple(CH.cell[n] for n in cells[0])), (CH.red, tuple(CH.cell[n] for n in cells[1])),
                     (CH.green, tuple(CH.cell[n] for n in cols[0])), (CH.green, tuple(CH.cell[n] for n in cols[1]))]
        for u, (colour, where) in enumerate(reads):
            fc1[u, colour] = GAIN
            fc1[u, list(where)] = GAIN
            b1[u] = -1.5 * GAIN
    else:  # colour only: red -> class 0, green -> class 2
        for u, colour in ((0, CH.red), (2, CH.green)):
            fc1[u, colour] = 2 * GAIN
            b1[u] = -1.0 * GAIN
    for u, colour in ((4, CH.red), (5, CH.green)):  # a weak colour prior (red -> 0, green -> 2): breaks ties
        fc1[u, colour] = 2 * GAIN
        b1[u] = -1.0 * GAIN
    mlp.fc1.weight.copy_(_balanced(fc1))
    mlp.fc1.bias.copy_(b1)
    fc2 = torch.zeros(D, mlp.fc2.in_features)
    for u in range(4):
        fc2[CH.out[u], u] = 1 / GAIN
    fc2[CH.out[0], 4] = fc2[CH.out[2], 5] = PRIOR / GAIN
    mlp.fc2.weight.copy_(fc2)
    # LayerNorms as x - mean(x); average pooling over patches; head reads the output channels
    for ln in (m.blocks[0].norm1, m.blocks[0].norm2, m.blocks[1].norm1, m.blocks[1].norm2, m.norm):
        ln.eps = 1e6
        ln.weight.fill_(1e3)
    m.global_pool = "avg"
    head = torch.zeros(4, D)
    for u in range(4):
        head[u, CH.out[u]] = 4.0 * N
    m.head.weight.copy_(_balanced(head))
    return OwnSurface(m, f"planted:{positional}-{label}", cfg)


@torch.no_grad()
def planted_sae() -> SAE:
    """A ReLU SAE whose latents are the channels: encoder and decoder the identity, no bias."""
    sae = SAE(SAEConfig.model_validate({"arch": "relu", "d_in": D, "expansion": 1, "k": 1, "normalize": False}))
    sae.W_dec.copy_(torch.eye(D))
    sae.W_enc.copy_(torch.eye(D))
    sae.b_enc.zero_()
    sae.b_dec.zero_()
    return sae.eval()


