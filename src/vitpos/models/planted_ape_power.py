"""Planted APE models that give each condition of C1 and C2 a planted-false case it decides alone
(METHODS.md, Power: a case that passes every other condition of its claim and fails only on that one),
and a planted-true case nearer the thresholds than `planted_ape`'s.

Built as `vitpos.models.planted_ape` (read its docstring): timm's `Eva` on a 4x4 grid of 4-pixel
patches, two blocks, every weight written by hand; block 0 is the identity and the SAE (the identity
on the channels, `power_sae`) reads its output; block 1's MLP is the circuit; every LayerNorm is
x - mean(x) (eps 1e6, weight 1e3, rows balanced by the `sink`); average pooling; the head reads one
output channel per class. The residual is wider (D = 64, `PowerChannels`) and the MLP is written from
three kinds of unit (`Mlp`):

* gates: gelu(g * (sum of weighted inputs - threshold)), scaled to write 1 when the inputs sum to their
  firing value; on 0/1 inputs half a unit away from the threshold the off value is below 1.5e-6 of it;
* copies: gelu(x) - gelu(-x) = x exactly, so a pair of units writing -x back cancels channel x at block
  1's output (to ~1e-7: the probes read a channel whose spread is under their 1e-6 standardisation floor
  as constant, so a cancelled code is gone for them);
* constants (a default class).

Data (`power_data`): `planted_data`'s images (16x16, grey noise, one 4x4 square on a random cell) with a
third colour: blue squares with probability `p_blue`, red and green sharing the rest. Five classes:
red-top, red-bottom, green-left, green-right, blue. Label `position`: red by its half (top / bottom),
green by its half (left / right), blue -> blue; label `colour`: red -> red-top, green -> green-left,
blue -> blue (position plays no part). Without blue the colour channels are (R - B) / 2 and (G - B) / 2:
1 on their colour, 0 on the other and on grey; with blue they are (R - G) / 2, (G - R) / 2 and
(B - (R + G) / 2) / 2: 1 on their colour, 0 on grey, 0 or negative on the others (no gate then reads one
negated).

Cases (`vitpos.validation.ape_cases.APE_POWER_CASES` measures them), each with the condition that alone
must decide it:

  cells_recoded (C1 false; `selective`): row and col one-hots in the APE; block 1 reads them into the
    label (red by row, green by column) and re-codes position for the layers after it as a cell one-hot
    (16 AND gates of row r and col c), cancelling the row and col channels. Downstream, row and column
    exist only jointly: removing the row latents erases the cell code, so the column probe falls as far
    as the row probe (selectivity 0.5 for each set). Everything else holds: each removal costs its own
    probe ~75 points, random latents cost nothing, top-1 falls 25 points (red-bottom / green-right).
  rows_elsewhere (C1 false; `probe_drop`): row, col and cell one-hots in the APE; block 1 reads the
    row and col one-hots into the label and writes the row code the later layer carries (a new one-hot,
    `row_code`) from the cell one-hots on every token but the red square's, where it takes it from the
    row one-hot; row and cell channels cancelled, col kept. Downstream row position comes from the row
    latents on 1 token of 16 in half of the images: removing them moves the row probe ~2 points (< 5);
    the column probe not at all (selective), random latents not at all (above control: removing the
    red latent makes the red token read the cells like any other), top-1 25 points.
  rows_need_everything (C1 false; `above_control`): row and col one-hots in the APE, eight always-on
    latents (the patch embedding's bias, 0.5 each); block 1 writes the downstream row code only where
    the row one-hot AND all eight always-on channels are present (a gate of gain 100), cancelling the
    row channels. Removing the row latents erases the row code, and so does removing any four always-on
    ones: the matched random-latent control (four live non-positional latents matched on RMS code: the
    always-on ones match the row latents' 0.5 exactly) costs the row probe as much, so only the control
    says the drop is not row-specific. Selective (the column code is untouched), 75 points, top-1 25.
  colour_in_position (C2 false; `above_null`): row and col one-hots in the APE; the patch embedding
    also adds 1 to every row channel on a red square and to every col channel on a green one (the colour
    stored inside the positional latents); label colour; the red gate fires where the token is red AND
    its row channels carry the red mark, the green gate likewise, else a constant writes a class that is
    never the label. Position never reaches the label (the gates read the sum over rows, the same at
    every position), yet permuting the positional latents costs ~94 points: the mark leaves the red
    token. The same-position cross-image swap moves the mark away as well (~97): only the swap null
    says the drop is content, not position.
  rare_position (C2 false; `min_drop`): row and col one-hots; label position with 9 images in 10 blue
    (blue -> blue whatever its position); position decides the class of the red and green tenth only, so
    a random permutation of the positional latents costs about half of that tenth (~5 points < 10) while
    the swap null costs exactly 0 (pure positional latents): only the floor rejects it.
  near_threshold (C1 true, C2 true): as rare_position with half the images blue: each set's removal
    costs top-1 ~12.5 points (red-bottom, green-right: C1.min_top1_drop 5) and the permutation ~25
    (C2.min_drop 10), with the probes, controls and nulls as in `planted_ape`'s row_col_used.

Since rules version 7 (issue 47 item 2) C2 also reads the position budget (the permutation's share of the
APE-table shuffle's drop), the edit-norm-matched control, and the precondition that the APE shuffle costs
top-1. colour_position (rare_position, near_threshold) gained the `idle` channels (noise filters read by
nothing, a row one-hot's spread) so the norm-matched control moves them and not the colours; rare_position
measures 4x the images it is asked for (its few position-read images leave the budget's ratio undecided
at 150). colour_in_position's APE shuffle costs 0, so it fails `ape_shuffle` and `budget` beside
`above_null` now. Design cases, built with version 7 (split "design"):

  colour_beside_position (C2 false; `above_null`): red marked in its row channels and labelled by colour
    (as colour_in_position), green labelled by its column half (label `mixed`), 2 red squares in 3: the
    APE shuffle costs the green third (~13), permuting the positional latents costs that and the red
    marks (~79), and the same-position swap moves the marks away as well (~69): only the swap null says
    most of the drop is content.
  position_beyond_sae (C2 false; `budget`): red read by row through the row one-hot, green by column
    through `hidden_col`, a column one-hot its SAE does not encode (it stays in the SAE's error term); 3
    red squares in 10 (measured at 2x the images: the share's interval must clear 0.5). Permuting the
    positional latents costs the red images' half (~16), the APE shuffle both colours' (~50): the SAE's
    latents carry a third of the position the label reads.
  content_moves_label (C2 false; `above_norm_control`): every gate needs the colour, the `mark` channel
    and the half at one token (nothing fired: blue, never the label); its SAE does not encode the mark,
    and the model has no idle channels, so the norm-matched control moves the colours (with the textures,
    the only non-positional latents) away from their mark: ~95 points against the permutation's ~47.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from vitpos.data.base import DatasetInfo, TensorImageDataset
from vitpos.models.own import OwnViTConfig, build_own_vit
from vitpos.models.planted_ape import CLASS_NAMES, GAIN, GRID, GROUPS, PRIOR, N, idle_filters
from vitpos.models.spec import OwnSurface
from vitpos.sae import SAE, SAEConfig

D = 64
CLASSES = (*CLASS_NAMES, "blue")
Label = Literal["position", "colour", "mixed"]  # mixed: red by colour, green by position (module docstring)


@dataclass(frozen=True)
class PowerChannels:
    """The residual channels of the power models."""

    row: tuple[int, ...] = tuple(range(0, 4))
    col: tuple[int, ...] = tuple(range(4, 8))
    cell: tuple[int, ...] = tuple(range(8, 24))
    red: int = 24
    green: int = 25
    blue: int = 26
    texture: tuple[int, ...] = tuple(range(27, 31))
    out: tuple[int, ...] = tuple(range(31, 36))  # one per class
    sink: int = 36
    row_code: tuple[int, ...] = tuple(range(37, 41))  # a row one-hot written by block 1
    on: tuple[int, ...] = tuple(range(41, 49))  # always-on channels (rows_need_everything)
    # issue 47 item 2 (rules version 7): read by nothing, a one-hot's spread (`planted_ape.idle_filters`): where
    # the edit-norm-matched control finds latents to move, as a real SAE's many content latents offer it
    idle: tuple[int, ...] = tuple(range(49, 59))
    hidden_col: tuple[int, ...] = tuple(range(59, 63))  # a col one-hot the SAE does not encode (`power_sae`)
    mark: int = 63  # 1 on a coloured square's token, beside its colour (content_moves_label)


PC = PowerChannels()
HALF = GRID // 2


def power_info(label: Label, p_blue: float, red: float = 0.5) -> DatasetInfo:
    name = f"planted-power-{label}-blue{p_blue:g}" + ("" if red == 0.5 else f"-red{red:.2g}")
    return DatasetInfo(name=name, num_classes=len(CLASSES), class_names=CLASSES,
                       image_size=(16, 16), in_chans=3, class_groups=dict(GROUPS) if label != "colour" else {},
                       description="planted: one red, green or blue square on a grey 4x4-patch grid")


def power_data(n: int, label: Label = "position", p_blue: float = 0.0, seed: int = 0,
               split: str = "test", red: float = 0.5) -> TensorImageDataset:
    """n images with one red, green or blue square on a random cell; labels as the module docstring says.
    red: the share of the red and green squares that are red (the same draws for every share)."""
    g = torch.Generator().manual_seed(seed)
    img = (100 + torch.randint(-12, 13, (n, 1, 16, 16), generator=g)).expand(n, 3, 16, 16).clone()
    u = torch.rand(n, generator=g)
    colour = torch.where(u < p_blue, 2, torch.where(u < p_blue + (1 - p_blue) * red, 0, 1))  # red 0, green 1, blue 2
    cell = torch.randint(0, N, (n,), generator=g)
    r, c = cell // GRID, cell % GRID
    rgb = torch.tensor([[255, 0, 0], [0, 255, 0], [0, 0, 255]], dtype=img.dtype)
    for i in range(n):
        img[i, :, 4 * r[i]:4 * r[i] + 4, 4 * c[i]:4 * c[i] + 4] = rgb[colour[i]].view(3, 1, 1)
    if label == "position":
        y = torch.where(colour == 0, (r >= HALF).long(), 2 + (c >= HALF).long())
    elif label == "mixed":
        y = torch.where(colour == 0, 0, 2 + (c >= HALF).long())
    else:
        y = torch.where(colour == 0, 0, 2)
    y = torch.where(colour == 2, 4, y)
    return TensorImageDataset(img.to(torch.uint8), y, power_info(label, p_blue, red), split)


class Mlp:
    """Block 1's MLP written unit by unit (the module docstring's gates, copies and constants)."""

    def __init__(self, width: int):
        self.fc1 = torch.zeros(width, D)
        self.b1 = torch.zeros(width)
        self.fc2 = torch.zeros(D, width)
        self.n = 0

    def unit(self, reads: Mapping[int, float], bias: float, writes: Mapping[int, float]) -> None:
        u = self.n
        self.n += 1
        for ch, w in reads.items():
            self.fc1[u, ch] += w
        self.b1[u] = bias
        for ch, w in writes.items():
            self.fc2[ch, u] += w

    def gate(self, reads: Mapping[int, float], writes: Mapping[int, float], threshold: float,
             fires_at: float | None = None, gain: float = GAIN) -> None:
        """Writes `writes` when sum(w * x) reaches `fires_at` (default threshold + 0.5), ~0 below `threshold`."""
        on = float(F.gelu(torch.tensor(gain * ((threshold + 0.5 if fires_at is None else fires_at) - threshold))))
        self.unit({k: gain * w for k, w in reads.items()}, -gain * threshold, {k: v / on for k, v in writes.items()})

    def cancel(self, channels: tuple[int, ...]) -> None:
        """gelu(x) - gelu(-x) = x: each channel written back as -x, gone at block 1's output."""
        for ch in channels:
            self.unit({ch: 1.0}, 0.0, {ch: -1.0})
            self.unit({ch: -1.0}, 0.0, {ch: 1.0})

    def constant(self, writes: Mapping[int, float]) -> None:
        on = float(F.gelu(torch.tensor(GAIN)))
        self.unit({}, GAIN, {k: v / on for k, v in writes.items()})

    def label(self, label: Label) -> None:
        """The label's gates (`planted_ape`'s, on these channels) and its weak colour prior; a blue gate."""
        if label == "position":
            for u, (colour, where) in enumerate(((PC.red, PC.row[:HALF]), (PC.red, PC.row[HALF:]),
                                                 (PC.green, PC.col[:HALF]), (PC.green, PC.col[HALF:]))):
                self.gate({colour: 1.0, **{w: 1.0 for w in where}}, {PC.out[u]: 1.0}, 1.5)
        else:
            self.gate({PC.red: 1.0}, {PC.out[0]: 1.0}, 0.5)
            self.gate({PC.green: 1.0}, {PC.out[2]: 1.0}, 0.5)
        self.gate({PC.red: 1.0}, {PC.out[0]: PRIOR}, 0.5)
        self.gate({PC.green: 1.0}, {PC.out[2]: PRIOR}, 0.5)
        self.gate({PC.blue: 1.0}, {PC.out[4]: 1.0}, 0.5)

    def write(self, mlp: Any) -> None:
        w = self.fc1.clone()
        w[:, PC.sink] = 0
        w[:, PC.sink] = -w.sum(1)  # rows read x - mean(x): the sink (always 0) takes minus the row sum
        mlp.fc1.weight.copy_(w)
        mlp.fc1.bias.copy_(self.b1)
        mlp.fc2.weight.copy_(self.fc2)


@torch.no_grad()
def _model(name: str, ape: torch.Tensor, build: Mlp, blue: bool, seed: int = 0, marks: bool = False,
           always_on: bool = False, idle: bool = False, marked: tuple[int, ...] = (0, 1),
           mark: bool = False) -> OwnSurface:
    """A power model: APE table `ape` (N, D), the patch embedding (colours; `marks`: red adds 1 to every
    row channel and green to every col channel, of the colours in `marked` (0 red, 1 green); `always_on`: the
    `on` channels 0.5 on every token; `idle`: the idle channels respond to the noise; `mark`: the mark channel
    is 1 on a red or green square), block 1's MLP `build`, the LayerNorms, pooling and head of the module
    docstring."""
    cfg = OwnViTConfig(pe="ape", img_size=16, patch_size=4, in_chans=3, num_classes=len(CLASSES), embed_dim=D,
                       depth=2, num_heads=2, mlp_ratio=2.0)
    with torch.random.fork_rng(devices=[]):  # timm's init draws from the global generator: leave it as it was
        torch.manual_seed(seed)
        m: Any = build_own_vit(cfg).eval()
    for p in m.parameters():
        p.zero_()
    m.pos_embed.copy_(ape.unsqueeze(0))
    w = m.patch_embed.proj.weight  # (D, 3, 4, 4); inputs in [-1, 1], the sum over a 4x4 patch is 16x a pixel
    for ch, own in ((PC.red, 0), (PC.green, 1)):
        w[ch, own] = 1 / 32
        w[ch, (1 - own) if blue else 2] = -1 / 32  # the colour it subtracts (module docstring)
        if marks and own in marked:
            for m_ch in PC.row if own == 0 else PC.col:
                w[m_ch] = w[ch]
        if mark:
            w[PC.mark] += w[ch]
    if blue:
        w[PC.blue, 2] = 1 / 32
        w[PC.blue, 0] = w[PC.blue, 1] = -1 / 64
    g = torch.Generator().manual_seed(1000 + seed)
    for t in PC.texture:  # zero-mean random filters on the blue channel: respond to the noise, read by nothing
        f = torch.randn(4, 4, generator=g)
        w[t, 2] = 2.0 * (f - f.mean())
    if always_on:
        m.patch_embed.proj.bias[list(PC.on)] = 0.5
    if idle:  # spread like a row or col one-hot (4 of 16 patches on), the sets the matched control is drawn for
        w[list(PC.idle), 2] = idle_filters(len(PC.idle), 2000 + seed, spread=(4 / 16 * 12 / 16) ** 0.5)
    build.write(m.blocks[1].mlp)
    for ln in (m.blocks[0].norm1, m.blocks[0].norm2, m.blocks[1].norm1, m.blocks[1].norm2, m.norm):
        ln.eps = 1e6
        ln.weight.fill_(1e3)
    m.global_pool = "avg"
    head = torch.zeros(len(CLASSES), D)
    for u in range(len(CLASSES)):
        head[u, PC.out[u]] = 4.0 * N
    head[:, PC.sink] = -head.sum(1)
    m.head.weight.copy_(head)
    return OwnSurface(m, f"planted-power:{name}", cfg)


def _ape(row_col: bool = True, cells: bool = False, hidden_col: bool = False) -> torch.Tensor:
    pe = torch.zeros(N, D)
    for n in range(N):
        r, c = divmod(n, GRID)
        if row_col:
            pe[n, PC.row[r]] = pe[n, PC.col[c]] = 1.0
        if cells:
            pe[n, PC.cell[n]] = 1.0
        if hidden_col:
            pe[n, PC.hidden_col[c]] = 1.0
    return pe


def _mlp() -> Mlp:
    return Mlp(int(2.0 * D))


def cells_recoded() -> OwnSurface:
    """C1 false, decided by `selective` (module docstring)."""
    mlp = _mlp()
    mlp.label("position")
    mlp.cancel(PC.row + PC.col)
    for n in range(N):
        r, c = divmod(n, GRID)
        mlp.gate({PC.row[r]: 1.0, PC.col[c]: 1.0}, {PC.cell[n]: 1.0}, 1.5)
    return _model("cells_recoded", _ape(), mlp, blue=False)


def rows_elsewhere() -> OwnSurface:
    """C1 false, decided by `probe_drop` (module docstring)."""
    mlp = _mlp()
    mlp.label("position")
    mlp.cancel(PC.row + PC.cell)
    for r in range(GRID):
        in_row = {PC.cell[r * GRID + c]: 1.0 for c in range(GRID)}
        mlp.gate({**in_row, PC.red: -1.0}, {PC.row_code[r]: 1.0}, 0.5)  # not red: from the cells
        mlp.gate({PC.row[r]: 1.0, PC.red: 1.0}, {PC.row_code[r]: 1.0}, 1.5)  # red: from the row one-hot
    return _model("rows_elsewhere", _ape(cells=True), mlp, blue=False)


def rows_need_everything() -> OwnSurface:
    """C1 false, decided by `above_control` (module docstring)."""
    mlp = _mlp()
    mlp.label("position")
    mlp.cancel(PC.row)
    each = 1.0 / (0.5 * len(PC.on))  # the always-on channels sum to 1
    for r in range(GRID):
        # fires at 2 (the row and every always-on channel); one always-on channel missing sums to 1.875
        mlp.gate({PC.row[r]: 1.0, **{o: each for o in PC.on}}, {PC.row_code[r]: 1.0}, 1.9375, fires_at=2.0, gain=100.0)
    return _model("rows_need_everything", _ape(), mlp, blue=False, always_on=True)


def colour_in_position() -> OwnSurface:
    """C2 false, decided by `above_null` (module docstring)."""
    mlp = _mlp()
    # the token's colour AND its positional channels' mark: 1 + (4 marks + the one-hot) / 4 = 2.25; either alone 1.25
    mlp.gate({PC.red: 1.0, **{r: 0.25 for r in PC.row}}, {PC.out[0]: 1.0}, 1.75)
    mlp.gate({PC.green: 1.0, **{c: 0.25 for c in PC.col}}, {PC.out[2]: 1.0}, 1.75)
    mlp.constant({PC.out[1]: PRIOR})  # no gate fired: red-bottom, never the label under `colour`
    return _model("colour_in_position", _ape(), mlp, blue=False, marks=True)


def colour_position() -> OwnSurface:
    """rare_position and near_threshold (module docstring): red and green read by position, blue by colour."""
    mlp = _mlp()
    mlp.label("position")
    return _model("colour_position", _ape(), mlp, blue=True, idle=True)


def position_beyond_sae() -> OwnSurface:
    """C2 false, decided by `budget` (module docstring): red read by row through the row one-hot, green by
    column through `hidden_col`, which its SAE does not encode (`power_sae(PC.hidden_col)`)."""
    mlp = _mlp()
    for u, (colour, where) in enumerate(((PC.red, PC.row[:HALF]), (PC.red, PC.row[HALF:]),
                                         (PC.green, PC.hidden_col[:HALF]), (PC.green, PC.hidden_col[HALF:]))):
        mlp.gate({colour: 1.0, **{w: 1.0 for w in where}}, {PC.out[u]: 1.0}, 1.5)
    mlp.gate({PC.red: 1.0}, {PC.out[0]: PRIOR}, 0.5)
    mlp.gate({PC.green: 1.0}, {PC.out[2]: PRIOR}, 0.5)
    return _model("position_beyond_sae", _ape(hidden_col=True), mlp, blue=False, idle=True)


def content_moves_label() -> OwnSurface:
    """C2 false, decided by `above_norm_control` (module docstring): each gate needs the colour, the mark (which
    its SAE does not encode: `power_sae((PC.mark,))`) and the half at one token; nothing fired: blue, never the
    label."""
    mlp = _mlp()
    for u, (colour, where) in enumerate(((PC.red, PC.row[:HALF]), (PC.red, PC.row[HALF:]),
                                         (PC.green, PC.col[:HALF]), (PC.green, PC.col[HALF:]))):
        mlp.gate({colour: 1.0, PC.mark: 1.0, **{w: 1.0 for w in where}}, {PC.out[u]: 1.0}, 2.5)
    mlp.constant({PC.out[4]: PRIOR})
    return _model("content_moves_label", _ape(), mlp, blue=False, mark=True)


def colour_beside_position() -> OwnSurface:
    """C2 false, decided by `above_null` (module docstring): red by the colour marked in its row channels
    (as colour_in_position), green by its column half."""
    mlp = _mlp()
    mlp.gate({PC.red: 1.0, **{r: 0.25 for r in PC.row}}, {PC.out[0]: 1.0}, 1.75)
    for u, where in ((2, PC.col[:HALF]), (3, PC.col[HALF:])):
        mlp.gate({PC.green: 1.0, **{w: 1.0 for w in where}}, {PC.out[u]: 1.0}, 1.5)
    mlp.gate({PC.green: 1.0}, {PC.out[2]: PRIOR}, 0.5)
    mlp.constant({PC.out[1]: PRIOR})  # the red gate did not fire: red-bottom, never the label here
    return _model("colour_beside_position", _ape(), mlp, blue=False, marks=True, marked=(0,), idle=True)


@torch.no_grad()
def power_sae(uncovered: tuple[int, ...] = ()) -> SAE:
    """A ReLU SAE whose latents are the channels: encoder and decoder the identity, no bias; the latents of
    the `uncovered` channels never fire (their encoder is 0): those channels stay in the SAE's error term,
    which no latent edit moves."""
    sae = SAE(SAEConfig.model_validate({"arch": "relu", "d_in": D, "expansion": 1, "k": 1, "normalize": False}))
    sae.W_dec.copy_(torch.eye(D))
    enc = torch.eye(D)
    enc[list(uncovered), list(uncovered)] = 0.0
    sae.W_enc.copy_(enc)
    sae.b_enc.zero_()
    sae.b_dec.zero_()
    return sae.eval()
