"""The family adapter protocol: what one model family implements so that every hook, experiment and
data path of vitpos runs on it.

A model family (timm's VisionTransformer / Eva in `timm_adapter.py`, Hugging Face transformers in
`hf_adapter.py`, ...) is one file in `vitpos/models/`: a subclass of `ModelSurface`
(`vitpos.models.surface`) that fills in the attributes and implements the methods `FamilyAdapter`
lists below. Nothing outside `vitpos/models/` names a family's modules or calls its library: the hook
engine (`vitpos.hooks`) asks the surface for a `HookPoint` per site, the data code asks it for its
preprocessing, the experiments ask it for its device. `ModelSurface` implements everything that is
the same for every family on top of these (sites and their validation, `__call__`, `forward_from`,
`pooled_features`, `with_head`, `device`, `to`, `weights_digest`, `describe`).

How a site is reached, in torch terms: a `HookPoint` names one `nn.Module` and whether the site's
tensor is that module's output (a forward hook) or one of its inputs (a forward pre-hook, by
position or keyword), with an optional view (e.g. (B, T, h*d) -> (B, h, T, d), or the first item of
a tuple a module returns) and its inverse for edits. The engine registers the hook, calls the
capture / edit function on the site tensor, and puts an edited tensor back through `unview`; a
function that returns None leaves the module's value untouched, so a capture is the plain forward bit
for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

from vitpos.models.hookpoint import HookPoint

if TYPE_CHECKING:
    from vitpos.models.surface import Axis, FreqBand, ModelSurface, RopeAxisMap, Scheme

@runtime_checkable
class FamilyAdapter(Protocol):
    """What a model family implements (as a `ModelSurface` subclass); the surface builds the rest.

    Attributes, set in `__init__` (all read-only after it; `at_size` returns a new surface):
      spec: str                 the model SPEC it was loaded from (cache keys, messages)
      model: nn.Module          the wrapped model, in eval mode
      grid: (H, W)              patch grid; patches are row-major, token index prefix + r * W + c
      num_prefix_tokens: int    CLS, registers... (they come first in the token axis)
      depth, num_heads, head_dim, width: int
      num_classes: int          classes of the model's own classifier (0: headless, outputs are features)
      scheme: "ape" | "rope" | "rope+ape" | "none"
      input_size: (C, H, W)     the image size the model takes

    Methods below; those marked optional have a `ModelSurface` default that refuses with one line
    (a model without RoPE need not implement the rotary methods).
    """

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
    input_size: tuple[int, int, int]

    # --- hook points (vitpos.hooks) -----------------------------------------------------------
    def block(self, layer: int) -> nn.Module:
        """The module of transformer layer `layer` (attention + MLP: its parameters are the layer's;
        the plan's cost estimate counts its linear layers)."""
        ...

    def hook_point(self, layer: int | None, site: str) -> HookPoint:
        """Where `site` passes through the model. layer None: the global site "embed" (block 0's
        input before any pre-block norm: the tokens right after the absolute embedding is added).
        layer 0..depth-1 with site one of (see `vitpos.models.surface` for shapes):
          resid_pre (block input), resid_mid (after the attention residual add: capture only),
          resid_post (block output), attn_out / mlp_out (branch outputs before layer scale),
          q / k (per-head, before rotation, (B, h, T, d)), q_rot / k_rot (after rotation: capture
          only), attn_pattern (softmax weights (B, h, T, T)), z (per-head attention outputs as the
          output projection reads them, (B, h, T, d)).
        The engine checks the layer range and which sites may be edited; an adapter raises
        VitposError for a site its family cannot expose."""
        ...

    def rotary_input(self, layer: int) -> HookPoint:
        """(RoPE families; optional) where block `layer` receives its rotary tensor, in the layout
        `rope_embed` takes and returns: `remove_rope` replaces it by `rope_embed(layer, base, ...)`."""
        ...

    def head_projections(self, layer: int) -> torch.Tensor:
        """(h, d, D): each head's slice of the attention output projection: head i's share of
        attn_out is z[:, i] @ P[i]; the shares plus the projection's bias add up to attn_out."""
        ...

    # --- partial forwards (forward_from(0, embed_tokens(x)) must equal surface(x) bit for bit) --
    def embed_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """(B, T, D) input of block 0 (`blocks.0.resid_pre`): patch embedding, prefix tokens, APE,
        through the same modules (and so the same hooks) as a full forward."""
        ...

    def run_blocks(self, tokens: torch.Tensor, start: int, stop: int | None = None) -> torch.Tensor:
        """Blocks start..stop-1 on `tokens` (the resid_pre of `start`), calling each block module as
        the full forward does (so block hooks fire); `ModelSurface._check_tokens` validates."""
        ...

    def head_from(self, tokens: torch.Tensor) -> torch.Tensor:
        """The last block's output -> outputs: final norm, pooling, classifier; with `self.head`
        attached, that head applied to the pooled features instead of the model's classifier."""
        ...

    def _pooled(self, images: torch.Tensor) -> torch.Tensor:
        """(B, D) pooled pre-logit features (what a classifier reads) of checked images."""
        ...

    # --- data -----------------------------------------------------------------------------------
    def data_config(self) -> dict[str, Any]:
        """The model's input normalisation: {"mean": per-channel tuple, "std": ..., "interpolation":
        "bilinear" | "bicubic" | ...} (`vitpos.data.preprocess` applies it to in-memory images)."""
        ...

    def image_transform(self) -> Callable[[Any], torch.Tensor]:
        """The family's own eval preprocessing of one PIL image into a (C, H, W) float tensor at
        `input_size` (used for image-folder data)."""
        ...

    # --- position encodings (optional: APE / RoPE families) ------------------------------------
    def patch_pos_embed(self) -> torch.Tensor:
        """(H*W, D) absolute position table of the patches (row-major)."""
        ...

    def rope_table(self) -> torch.Tensor:
        """The rotary tensor the blocks get for this grid, (..., H*W, 2d), patches row-major."""
        ...

    def rope_axis_map(self) -> RopeAxisMap:
        """Which rotary channels turn with which image axis, at which frequency."""
        ...

    def rope_embed(self, layer: int, base: torch.Tensor, remove: Mapping[Axis, list[int] | None],
                   band: FreqBand | None = None) -> torch.Tensor:
        """`base` (what `rotary_input(layer)` carries) with axes removed for chosen heads (see
        `ModelSurface.rope_embed`)."""
        ...

    def at_size(self, img_size: int | tuple[int, int]) -> ModelSurface:
        """(optional) A copy of this surface resized to `img_size` by the family's own code."""
        ...


__all__ = ["FamilyAdapter"]
