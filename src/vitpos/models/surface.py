"""The model surface: the one interface every experiment talks to.

A surface exposes the patch grid, prefix tokens, blocks and heads, the positional scheme, named
hook sites, and the rotary angles per axis and head. Family adapters (timm_adapter.py for timm's
VisionTransformer and Eva, spec.OwnSurface for vitpos' own ViTs) implement the protocol in
adapter.py (`FamilyAdapter`: hook points, partial forwards, preprocessing, position encodings);
experiments never touch a model family's modules directly.

Site names (TransformerLens style), shapes for a batch of B images with T = prefix + H*W tokens:
  embed                    (B, T, D)    tokens right after the absolute embedding is added (editable)
  pos_embed                (1, H*W, D)  the APE table for patches (capture only)
  blocks.L.resid_pre       (B, T, D)    block input (editable)
  blocks.L.resid_mid       (B, T, D)    after the attention residual add (capture only)
  blocks.L.resid_post      (B, T, D)    block output (editable)
  blocks.L.attn_out        (B, T, D)    attention branch output before layer scale (editable)
  blocks.L.mlp_out         (B, T, D)    MLP branch output before layer scale (editable)
  blocks.L.q / .k          (B, h, T, d) per-head queries/keys before rotation (editable)
  blocks.L.q_rot / .k_rot  (B, h, T, d) after rotation; prefix tokens unrotated (capture only)
  blocks.L.attn_pattern    (B, h, T, T) softmax attention (editable; runs unfused attention)
  blocks.L.z               (B, h, T, d) per-head attention outputs as the output projection reads
                                        them (after a family's optional scale-norm; editable)
"""

from __future__ import annotations

import copy
import hashlib
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from vitpos.errors import VitposError
from vitpos.rope import RopeCoords, band_members, fold_frequency, pair_of_channel

if TYPE_CHECKING:
    from vitpos.data.base import DatasetInfo
    from vitpos.models.head import Head
    from vitpos.models.hookpoint import HookPoint

LAYER_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "q_rot", "k_rot",
               "attn_pattern", "z")
GLOBAL_SITES = ("embed", "pos_embed")
CAPTURE_ONLY = ("resid_mid", "q_rot", "k_rot", "pos_embed")
Scheme = Literal["ape", "rope", "rope+ape", "none"]
Axis = Literal["row", "col"]
AXES: tuple[Axis, Axis] = ("row", "col")

_SITE_RE = re.compile(r"^blocks\.(\d+)\.([a-z_]+)$")


@dataclass(frozen=True, order=True)
class Site:
    layer: int | None
    name: str

    def __str__(self) -> str:
        return self.name if self.layer is None else f"blocks.{self.layer}.{self.name}"

    @staticmethod
    def parse(text: str, depth: int | None = None) -> Site:
        text = text.strip()
        if text in GLOBAL_SITES:
            return Site(None, text)
        m = _SITE_RE.match(text)
        if not m or m.group(2) not in LAYER_SITES:
            raise VitposError(
                f"unknown hook site {text!r}; use blocks.L.<{'|'.join(LAYER_SITES)}> or one of "
                f"{', '.join(GLOBAL_SITES)}"
            )
        layer = int(m.group(1))
        if depth is not None and layer >= depth:
            raise VitposError(f"hook site {text!r} names layer {layer}, but the model has layers 0..{depth - 1}")
        return Site(layer, m.group(2))


def expand_sites(names: str | list[str], depth: int) -> list[Site]:
    """'resid_post' -> every layer's resid_post; 'blocks.3.q' -> that one; comma lists allowed."""
    if isinstance(names, str):  # an empty item ('blocks.1.resid_post,') is refused, not skipped
        from vitpos.lists import comma_items

        names = comma_items(names, "--sites", "blocks.1.resid_post", distinct=False)
    out: list[Site] = []
    for name in names:
        name = name.strip()
        if name in LAYER_SITES:
            out.extend(Site(i, name) for i in range(depth))
        else:
            out.append(Site.parse(name, depth))
    return out


@dataclass(frozen=True)
class FreqBand:
    """Band `index` of `count` equal-rank bands of an axis' rotary frequencies (0 = lowest): the
    axis' rotary pairs ranked by their frequency along it, band b holding ranks [b*n//count,
    (b+1)*n//count) of the n pairs (per layer and head for mixed RoPE)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise VitposError(f"frequency band {self.index} of {self.count}: use 0 <= index < count")


@dataclass(frozen=True)
class RopeAxisMap:
    """Which rotary channels turn with which image axis, and how fast, per layer and head.

    axial: `channel_axis[j]` is 'row', 'col' or 'none' for channel j of every head (timm's axial
    families share one map over layers and heads); `channel_freq[j]` is its frequency along that
    axis. mixed: every channel turns with both axes; `freqs[a, layer, head, pair]` is the angle step
    per grid unit along axis a (0 = row, 1 = col). Frequencies are radians per patch; `frequencies`
    gives the effective ones (folded into [0, pi], `vitpos.rope.fold_frequency`).
    """

    kind: Literal["axial", "mixed"]
    head_dim: int
    depth: int
    num_heads: int
    layout: Literal["interleaved", "half"]
    channel_axis: tuple[str, ...] | None = None
    freqs: torch.Tensor | None = None
    channel_freq: tuple[float, ...] | None = None

    def channels(self, axis: Axis) -> list[int]:
        if self.channel_axis is None:
            raise VitposError("mixed RoPE has no per-axis channels: every channel turns with both axes")
        return [j for j, a in enumerate(self.channel_axis) if a == axis]

    def axis_pairs(self, axis: Axis, layer: int, head: int) -> tuple[list[int], torch.Tensor]:
        """The rotary pairs that turn with `axis` in this layer and head, and their effective
        frequencies along it (float64, radians per patch)."""
        if axis not in AXES:
            raise VitposError(f"unknown axis {axis!r}; use row or col")
        if not (0 <= layer < self.depth and 0 <= head < self.num_heads):
            raise VitposError(f"layer {layer} head {head} is outside {self.depth} layers x {self.num_heads} heads")
        if self.kind == "mixed":
            assert self.freqs is not None, "a mixed map carries its frequencies"
            f = fold_frequency(self.freqs[AXES.index(axis), layer, head])
            return list(range(f.numel())), f
        assert self.channel_freq is not None, "an axial map carries its channel frequencies"
        pair = pair_of_channel(self.head_dim, self.layout)
        first: dict[int, int] = {}  # pair -> its first channel of this axis
        for j in self.channels(axis):
            first.setdefault(pair[j], j)
        pairs = sorted(first)
        return pairs, torch.tensor([self.channel_freq[first[p]] for p in pairs], dtype=torch.float64)

    def pair_channels(self, pairs: list[int]) -> list[int]:
        """The channels of rotary pairs (both members of each)."""
        chosen = set(pairs)
        return [j for j, p in enumerate(pair_of_channel(self.head_dim, self.layout)) if p in chosen]

    def band_pairs(self, axis: Axis, layer: int, head: int, band: FreqBand) -> list[int]:
        """The rotary pairs of `band` of `axis`' frequencies in this layer and head."""
        pairs, f = self.axis_pairs(axis, layer, head)
        if band.count > len(pairs):
            raise VitposError(f"{band.count} frequency bands: {axis} has only {len(pairs)} rotary pairs per head; use "
                              f"at most {len(pairs)} bands")
        return [pairs[i] for i in band_members(f, band.index, band.count)]

    def band_channels(self, axis: Axis, layer: int, head: int, band: FreqBand) -> list[int]:
        """The channels of `band` of `axis`' frequencies in this layer and head."""
        return self.pair_channels(self.band_pairs(axis, layer, head, band))

    def to_json(self) -> dict:
        doc: dict = {"kind": self.kind, "head_dim": self.head_dim, "layout": self.layout}
        if self.channel_axis is not None:
            doc["row_channels"] = self.channels("row")
            doc["col_channels"] = self.channels("col")
        if self.channel_freq is not None:  # per channel, in the order of row_channels / col_channels
            assert self.channel_axis is not None
            for a in AXES:
                doc[f"{a}_freqs"] = [self.channel_freq[j] for j in self.channels(a)]
        return doc


class ModelSurface:
    """Base class: what is the same for every model family. A family's adapter (a subclass) fills in
    the attributes and implements the methods of `vitpos.models.adapter.FamilyAdapter`."""

    spec: str
    model: nn.Module
    grid: tuple[int, int]
    num_prefix_tokens: int
    depth: int
    num_heads: int
    head_dim: int
    width: int
    num_classes: int
    scheme: Scheme
    input_size: tuple[int, int, int]  # (C, H, W)
    head: Head | None = None  # a fitted classifier on the pooled features (`with_head`); None: the model's own
    trained_classes: tuple[str, ...] | None = None  # class names of the data an own model was trained on
    resizable: bool = False  # at_size works (adapters that implement it set True)
    # grid scales the extrapolate experiment runs by default (the 1.5x and 2x for pretrained models)
    extrapolation_scales: tuple[float, ...] = (1.5, 2.0)

    # --- what experiments use -------------------------------------------------------------
    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def has_rope(self) -> bool:
        return self.scheme in ("rope", "rope+ape")

    @property
    def has_ape(self) -> bool:
        return self.scheme in ("ape", "rope+ape")

    @property
    def patch_size(self) -> tuple[int, int]:
        """(pixels per patch row, per patch column)."""
        return self.input_size[1] // self.grid[0], self.input_size[2] // self.grid[1]

    def at_size(self, img_size: int | tuple[int, int]) -> ModelSurface:
        """This model on a copy resized to take `img_size` images (same weights, a larger or smaller
        grid): absolute embeddings resampled and rotary tables rebuilt by the model family's own code.
        The copy keeps any attached head (it reads pooled features, which any grid gives) and the
        forward hooks on the model at the time (copy.deepcopy); this surface is left unchanged."""
        raise VitposError(f"{self.spec} ({type(self).__name__}) cannot be resized to another input size")

    def rope_table(self) -> torch.Tensor:
        """The rotary tensor the blocks get for this grid, (..., H*W, 2d): patches in row-major order."""
        raise VitposError(f"{self.spec} has no rotary embedding (scheme {self.scheme})")

    def patch_rows_cols(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = torch.arange(self.num_patches)
        return n // self.grid[1], n % self.grid[1]

    def _check_images(self, images: torch.Tensor) -> None:
        if tuple(images.shape[1:]) != tuple(self.input_size):
            raise VitposError(
                f"images of shape {tuple(images.shape[1:])} do not fit {self.spec}, which takes "
                f"{tuple(self.input_size)}; use the dataset the model was trained on or pass img_size"
            )

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """The model's outputs: class logits of its own classifier, or of the attached head
        (`with_head`); for a headless model without a head, its pooled features."""
        self._check_images(images)
        if self.head is not None:
            return self.head(self._pooled(images))
        return self.model(images)

    # --- partial forwards: the model from a layer's residual stream ---------------------------
    # forward_from(0, embed_tokens(x)) is surface(x), bit for bit: the same modules in the same
    # order, with every hook on them (capture / edit / remove_rope) firing as in a full forward.
    # An intervention that starts at layer l leaves resid_pre of l unchanged, so experiments run
    # the clean prefix once and only blocks >= l per intervention.

    def embed_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """(B, T, D) input of block 0 (`blocks.0.resid_pre`): patch embedding, prefix tokens, APE."""
        raise NotImplementedError

    def run_blocks(self, tokens: torch.Tensor, start: int, stop: int | None = None) -> torch.Tensor:
        """Blocks start..stop-1 (stop None = the last) on `tokens`, the resid_pre of `start`; returns the
        resid_pre of `stop` (the resid_post of stop - 1). start == stop returns `tokens` unchanged."""
        raise NotImplementedError

    def head_from(self, tokens: torch.Tensor) -> torch.Tensor:
        """Outputs from the last block's output: final norm, pooling and classifier (the attached head, if any)."""
        raise NotImplementedError

    @torch.no_grad()
    def forward_from(self, layer: int, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of the model run from `blocks.<layer>.resid_pre` = tokens (layer in 0..depth;
        layer == depth: tokens are the last block's output, only the final norm and head run)."""
        return self.head_from(self.run_blocks(tokens, layer))

    def _check_tokens(self, tokens: torch.Tensor, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.depth:
            raise VitposError(f"blocks {start}..{stop - 1} are outside layers 0..{self.depth - 1} of {self.spec}")
        want = (self.num_prefix_tokens + self.num_patches, self.width)
        if tokens.ndim != 3 or tuple(tokens.shape[1:]) != want:
            raise VitposError(f"residual stream of shape {tuple(tokens.shape)} does not fit {self.spec}, whose blocks "
                              f"take (B, {want[0]}, {want[1]})")

    @torch.no_grad()
    def pooled_features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, D) pooled pre-logit features: what the model's classifier (or a fitted head) reads."""
        self._check_images(images)
        return self._pooled(images)

    def _pooled(self, images: torch.Tensor) -> torch.Tensor:
        raise VitposError(f"{self.spec} ({type(self).__name__}) has no pooled pre-logit features")

    def data_config(self) -> dict:
        """The model's input normalisation and interpolation ({"mean", "std", "interpolation"})."""
        raise NotImplementedError

    def image_transform(self) -> Callable:
        """The family's eval preprocessing of one PIL image into a (C, H, W) tensor at `input_size`."""
        raise VitposError(f"{self.spec} ({type(self).__name__}) has no image preprocessing for image-folder data")

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (inputs follow them)."""
        return next(self.model.parameters()).device

    def to(self, device: torch.device | str) -> ModelSurface:
        """Move the model's weights to `device` (in place, as nn.Module.to); returns this surface."""
        self.model.to(device)
        return self

    def with_head(self, head: Head, info: DatasetInfo | None = None, data: str | None = None) -> ModelSurface:
        """This surface (same model, same hooks) with `head` on its pooled features as the classifier.

        Refused (one-line VitposError) when the head was fitted on other weights, or, given the
        data's `info`, on other classes."""
        from vitpos.models.head import check_head

        check_head(head, self, info, data)
        out = copy.copy(self)
        out.head = head
        return out

    def classifier_problem(self, info: DatasetInfo, data: str | None = None) -> str | None:
        """None when the outputs are logits over `info`'s classes, else why not (with the fix)."""
        data = data or info.name
        k = len(info.class_names)
        from vitpos.data.base import classes_problem

        if (few := classes_problem(info, data)) is not None:  # no top-1 over a single class
            return few
        fit = (f"fit one with `vitpos head --model {shlex.quote(self.spec)} --data {shlex.quote(data)} --out DIR` "
               "and pass --head DIR")
        if self.head is not None:
            if tuple(self.head.info.classes) == tuple(info.class_names):
                return None
            return (f"the head on {self.spec} has {self.head.num_classes} classes ({self.head.info.data}) but {data} "
                    f"has {k}; {fit}")
        n = self.num_classes
        if n <= 0:
            return (f"{self.spec} has no classifier (num_classes=0: its outputs are pooled features, not "
                    f"class logits) and {data} has {k} classes; {fit}")
        trained = self.trained_classes
        if n != k or (trained is not None and tuple(trained) != tuple(info.class_names)):
            own = getattr(self, "trained_data", None)
            alt = f", or use the data it was trained on ({own})" if own else ""
            if n == k:
                return (f"{self.spec}'s {n}-class classifier was trained on {own or 'other data'}, whose classes are "
                        f"not those of {data}; {fit}{alt}")
            return f"{self.spec}'s classifier has {n} classes but {data} has {k}; {fit}{alt}"
        return None

    def check_classifier(self, info: DatasetInfo, data: str | None = None) -> None:
        """One-line VitposError unless the outputs are class logits for `info`'s classes."""
        problem = self.classifier_problem(info, data)
        if problem is not None:
            raise VitposError(problem)

    def weights_digest(self) -> str:
        """sha256 (16 hex) of every parameter and buffer: the model's content identity, so results
        cached under a spec are never reused after the weights behind that spec change (a retrained
        train dir, another checkpoint). Computed once per surface; experiments never edit weights."""
        if getattr(self, "_weights_digest", None) is None:
            h = hashlib.sha256()
            for name, t in sorted(self.model.state_dict().items()):
                t = t.detach().cpu().contiguous()
                h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            self._weights_digest = h.hexdigest()[:16]
        return self._weights_digest

    def describe(self) -> dict:
        return {
            "spec": self.spec, "family": type(self).__name__, "grid": list(self.grid),
            "num_prefix_tokens": self.num_prefix_tokens, "depth": self.depth, "num_heads": self.num_heads,
            "head_dim": self.head_dim, "width": self.width, "scheme": self.scheme,
            "rope": None if not self.has_rope else self.rope_axis_map().to_json(),
        }

    def patch_pos_embed(self) -> torch.Tensor:
        """(H*W, D) absolute embedding of the patches; VitposError for models without APE."""
        raise VitposError(f"{self.spec} has no absolute position embedding (scheme {self.scheme})")

    def rope_axis_map(self) -> RopeAxisMap:
        raise VitposError(f"{self.spec} has no rotary embedding (scheme {self.scheme})")

    def rope_embed(self, layer: int, base: torch.Tensor, remove: Mapping[Axis, list[int] | None],
                   band: FreqBand | None = None) -> torch.Tensor:
        """The rotary tensor for `layer` with axes removed for chosen heads.

        base: the tensor timm passes to the block (N, 2d) or (h, N, 2d). remove: axis -> heads
        (None = all heads). band: remove each axis only in that band of its frequencies (the
        pairs `rope_axis_map().band_pairs` names); every other channel stays exactly as in `base`.
        Returns (h, N, 2d)."""
        raise VitposError(f"{self.spec} has no rotary embedding (scheme {self.scheme})")

    def rope_coords(self) -> RopeCoords:
        """The model's own rotary coordinates for its grid (the family's units and column order)."""
        raise VitposError(self._no_coordinates())

    def rope_from_coords(self, coords: torch.Tensor | None = None, layout: str | None = None) -> torch.Tensor:
        """The rotary tensor the blocks get, recomputed by vitpos from (N, 2) coordinates (None: the
        model's own) with the family's arithmetic: (N, 2d), or (depth, h, N, 2d) for mixed RoPE.
        layout: force 'interleaved' or 'half' (None: the family's own; a wrong one is for self-tests)."""
        raise VitposError(self._no_coordinates())

    def _no_coordinates(self) -> str:
        if not self.has_rope:
            return f"{self.spec} has no rotary embedding (scheme {self.scheme})"
        return (f"{self.spec}: counterfactual RoPE coordinates are implemented for timm's RoPE families (and vitpos' "
                f"own models), not for {type(self).__name__}; use remove_rope, or load the model through timm")

    # --- what the hook engine uses (vitpos.models.adapter.FamilyAdapter) --------------------------
    def block(self, layer: int) -> nn.Module:
        """The module of transformer layer `layer` (its parameters are the layer's)."""
        raise NotImplementedError

    def hook_point(self, layer: int | None, site: str) -> HookPoint:
        """Where `site` of `layer` (None: the global site "embed") passes through the model."""
        raise NotImplementedError

    def rotary_input(self, layer: int) -> HookPoint:
        """Where block `layer` receives its rotary tensor (RoPE families)."""
        raise VitposError(f"{self.spec} has no rotary embedding (scheme {self.scheme})")

    def head_projections(self, layer: int) -> torch.Tensor:
        """(h, d, D): each head's slice of the attention's output projection, as the `blocks.L.z`
        site feeds it: head i's share of `attn_out` is z[:, i] @ P[i]; the shares and the
        projection's bias add up to `attn_out`."""
        raise NotImplementedError
