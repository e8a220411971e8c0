"""Hook engine: capture or edit any surface site, remove RoPE axes per layer and head, block
patch -> prefix attention.

Every context manager registers torch hooks on entry and removes them on exit, also when the
body raises; contexts nest and compose (edits apply in the order they were entered).

    with capture(surface, ["blocks.3.resid_post", "blocks.3.attn_pattern"]) as cache:
        logits = surface(images)
    with edit(surface, {"blocks.2.attn_out": zero_ablate()}), remove_rope(surface, {"row": None}, layers=[0, 1]):
        logits = surface(images)
    with rope_coordinates(surface, CoordEdit("swap", seed=0), layers=[3], heads=[1]):  # counterfactual coordinates
        logits = surface(images)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from vitpos.errors import VitposError
from vitpos.models.hookpoint import HookPoint
from vitpos.models.surface import (
    AXES,
    CAPTURE_ONLY,
    GLOBAL_SITES,
    LAYER_SITES,
    Axis,
    FreqBand,
    ModelSurface,
    Site,
    expand_sites,
)
from vitpos.rope import CoordEdit

EditFn = Callable[[torch.Tensor], torch.Tensor]


class _Registry:
    """Handles and attribute changes made by one context; undone exactly once."""

    def __init__(self) -> None:
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.restores: list[Callable[[], None]] = []

    def close(self) -> None:
        for h in reversed(self.handles):
            h.remove()
        for undo in reversed(self.restores):
            undo()
        self.handles.clear()
        self.restores.clear()


def _as_sites(surface: ModelSurface, sites: Iterable[str | Site] | str) -> list[Site]:
    if isinstance(sites, str):
        return expand_sites(sites, surface.depth)
    out = []
    for s in sites:
        out.extend([s] if isinstance(s, Site) else expand_sites(s, surface.depth))
    return out


def _output_hook(point: HookPoint, fn: Callable[[torch.Tensor], torch.Tensor | None]):
    """A forward hook handing the site's view of the module's output to fn (a returned tensor
    replaces it, through the point's unview)."""
    view, unview = point.view, point.unview

    def hook(module: nn.Module, args: tuple, out):
        new = fn(out if view is None else view(out))
        if new is None:
            return None
        return new if unview is None else unview(new, out)
    return hook


def _input_hook(point: HookPoint, fn: Callable[[torch.Tensor], torch.Tensor | None]):
    """A forward pre-hook (with kwargs) on the point's argument: by position or keyword; an absent
    or None argument is passed over."""
    view, unview, arg = point.view, point.unview, point.arg

    def pre(module: nn.Module, args: tuple, kwargs: dict):
        value = (args[arg] if arg < len(args) else None) if isinstance(arg, int) else kwargs.get(arg)
        if value is None:
            return None
        new = fn(value if view is None else view(value))
        if new is None:
            return None
        new = new if unview is None else unview(new, value)
        if isinstance(arg, int):
            return (*args[:arg], new, *args[arg + 1:]), kwargs
        return args, {**kwargs, arg: new}
    return pre


def _hook(reg: _Registry, point: HookPoint, fn: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
    """Register fn on a hook point (its prepare first, undone after the hook is removed)."""
    if point.prepare is not None:
        reg.restores.append(point.prepare())
    if point.where == "output":
        reg.handles.append(point.module.register_forward_hook(_output_hook(point, fn)))
    else:
        reg.handles.append(point.module.register_forward_pre_hook(_input_hook(point, fn), with_kwargs=True))


def _attach(surface: ModelSurface, reg: _Registry, site: Site,
            fn: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
    """Attach fn to a site: fn sees the site's tensor; a returned tensor replaces it."""
    name, layer = site.name, site.layer
    if name == "pos_embed":
        raise AssertionError("pos_embed is handled without hooks")
    if name in GLOBAL_SITES:
        _hook(reg, surface.hook_point(None, name), fn)
        return
    if name not in LAYER_SITES:
        raise VitposError(f"unknown site {site}")
    if layer is None or not 0 <= layer < surface.depth:
        raise VitposError(f"site {site} is outside layers 0..{surface.depth - 1}")
    _hook(reg, surface.hook_point(layer, name), fn)


class CaptureCache(Mapping[str, torch.Tensor]):
    """Captured tensors by site name; batches from repeated forwards are concatenated on read.

    A read-only Mapping (not a dict subclass: a dict's own storage would stay empty while the
    batches live in `_parts`, so `get`, `items`, `len` and iteration would silently see nothing).
    A site is a key once something was captured for it (a table such as pos_embed at once, an
    activation after its first forward) and until `pop_batch` empties it."""

    def __init__(self, fixed: dict[str, torch.Tensor], parts: dict[str, list[torch.Tensor]]):
        self._fixed = fixed
        self._parts = parts

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self._fixed:
            return self._fixed[key]
        if self._parts.get(key):
            return torch.cat(self._parts[key])
        raise KeyError(f"{key} was not captured (captured: {', '.join(self) or 'nothing yet'})")

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self._fixed) | {k for k, v in self._parts.items() if v}))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return key in self._fixed or bool(self._parts.get(key))  # type: ignore[arg-type]

    def pop_batch(self, key: str) -> torch.Tensor:
        """Everything captured for `key` since the last pop, then forget it (bounded memory)."""
        out = self[key]
        self._parts[key] = []
        return out


@contextmanager
def capture(surface: ModelSurface, sites: Iterable[str | Site] | str, *, to_cpu: bool = True,
            tokens: slice | None = None,
            sink: Callable[[str, torch.Tensor], None] | None = None) -> Iterator[CaptureCache]:
    """Record sites into a dict keyed by site name; repeated forwards append along the batch.

    tokens: optional slice over the token axis (e.g. patches only) to keep memory down.
    sink: called with (site name, tensor) as each site is computed, instead of recording it: the
    caller keeps what it needs of every batch and nothing accumulates here."""
    cache: dict[str, torch.Tensor] = {}
    parts: dict[str, list[torch.Tensor]] = {}
    reg = _Registry()

    def recorder(key: str, token_axis: int):
        def fn(t: torch.Tensor) -> None:
            t = t.detach()
            if tokens is not None:
                t = t[(slice(None),) * token_axis + (tokens,)]
            t = t.cpu() if to_cpu else t
            if sink is not None:
                sink(key, t)
            else:
                parts.setdefault(key, []).append(t)
        return fn

    try:
        for site in _as_sites(surface, sites):
            key = str(site)
            if site.name == "pos_embed":
                cache[key] = surface.patch_pos_embed().unsqueeze(0).clone()
                continue
            token_axis = 2 if site.name in ("q", "k", "q_rot", "k_rot", "attn_pattern", "z") else 1
            _attach(surface, reg, site, recorder(key, token_axis))

        out = CaptureCache(cache, parts)
        yield out
    finally:
        reg.close()


@contextmanager
def observe(surface: ModelSurface, observers: Mapping[Site, Callable[[torch.Tensor], None]]) -> Iterator[None]:
    """Call fn(site tensor) on every forward during the context, keeping nothing: running
    statistics over many images in bounded memory, where `capture` would hold every tensor."""
    reg = _Registry()
    try:
        for site, fn in observers.items():
            if site.name == "pos_embed":
                raise VitposError("pos_embed is a table, not an activation of a forward: capture it instead")
            _attach(surface, reg, site, lambda t, fn=fn: fn(t.detach()))
        yield
    finally:
        reg.close()


@contextmanager
def edit(surface: ModelSurface, edits: dict[str | Site, EditFn]) -> Iterator[None]:
    """Replace sites by fn(site tensor) during the context."""
    reg = _Registry()
    try:
        for key, fn in edits.items():
            sites = [key] if isinstance(key, Site) else _as_sites(surface, key)
            for site in sites:
                if site.name in CAPTURE_ONLY:
                    raise VitposError(f"site {site} can be captured but not edited; edit "
                                      "resid_pre/resid_post/attn_out/mlp_out/q/k/attn_pattern/z/embed")
                _attach(surface, reg, site, fn)
        yield
    finally:
        reg.close()


@contextmanager
def remove_rope(surface: ModelSurface, remove: Mapping[Axis, list[int] | None],
                layers: Iterable[int] | None = None, band: FreqBand | None = None) -> Iterator[None]:
    """Remove RoPE axes: remove = {'row': heads or None (all heads), 'col': ...}, in `layers` (None = all).

    The rotary tensor passed to each chosen block is rebuilt with that axis coordinate set to 0
    (identity for axial channels, the axis term dropped for mixed RoPE), in q and k alike.
    band: only in that band of each axis' frequencies (per layer and head for mixed RoPE); the
    other channels keep their rotation bit for bit. Contexts nest: removing every band of an
    axis, one context per band, is removing the axis."""
    if not surface.has_rope:
        raise VitposError(f"{surface.spec} has no rotary embedding (scheme {surface.scheme}); RoPE edits need a RoPE "
                          "model")
    for axis in remove:
        if axis not in AXES:
            raise VitposError(f"unknown axis {axis!r}; use row or col")
    layer_list = list(range(surface.depth)) if layers is None else sorted(set(layers))
    reg = _Registry()
    try:
        for layer in layer_list:
            if not 0 <= layer < surface.depth:
                raise VitposError(f"layer {layer} is outside 0..{surface.depth - 1}")
            memo: dict[int, torch.Tensor] = {}

            def rebuilt(base: torch.Tensor, layer: int = layer, memo: dict[int, torch.Tensor] = memo) -> torch.Tensor:
                key = id(base)
                if key not in memo:
                    memo.clear()
                    memo[key] = surface.rope_embed(layer, base, remove, band)
                return memo[key]

            _hook(reg, surface.rotary_input(layer), rebuilt)
        yield
    finally:
        reg.close()


@contextmanager
def block_prefix(surface: ModelSurface, layers: Iterable[int] | None = None) -> Iterator[None]:
    """Block patch -> prefix attention in `layers` (None = all): every patch query's attention to the
    prefix tokens (CLS, registers) is set to 0 and its row renormalised over the patch keys, i.e. the
    softmax over the patch keys alone. Prefix queries keep attending everywhere.

    Runs unfused attention in those layers (it edits `blocks.L.attn_pattern`). With no prefix tokens
    or no layers it registers nothing: the plain forward, bit for bit."""
    layer_list = list(range(surface.depth)) if layers is None else sorted(set(layers))
    for layer in layer_list:
        if not 0 <= layer < surface.depth:
            raise VitposError(f"layer {layer} is outside 0..{surface.depth - 1}")
    npt = surface.num_prefix_tokens
    if npt == 0 or not layer_list:
        yield
        return
    with edit(surface, {Site(layer, "attn_pattern"): drop_prefix_keys(npt) for layer in layer_list}):
        yield


# --- edit functions ----------------------------------------------------------------------------

def zero_ablate(tokens: slice | None = None) -> EditFn:
    def fn(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        out[:, tokens if tokens is not None else slice(None)] = 0
        return out
    return fn


def mean_ablate(mean: torch.Tensor) -> EditFn:
    """Replace by a fixed mean (broadcast over the batch), e.g. the dataset mean of the site."""
    return lambda t: mean.to(t.dtype).expand_as(t).clone()


def stack(*managers) -> ExitStack:
    """Enter several hook contexts as one: `with stack(edit(...), remove_rope(...)):`."""
    es = ExitStack()
    for m in managers:
        es.enter_context(m)
    return es


def drop_prefix_keys(num_prefix: int) -> EditFn:
    """Attention (B, h, T, T) with patch queries' weights on the first `num_prefix` keys set to 0 and
    each patch query's row renormalised to sum to 1 over the patch keys; prefix queries unchanged."""
    def fn(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        out[:, :, num_prefix:, :num_prefix] = 0
        patch = out[:, :, num_prefix:, num_prefix:]
        out[:, :, num_prefix:, num_prefix:] = patch / patch.sum(-1, keepdim=True)
        return out
    return fn


# --- counterfactual RoPE coordinates and head-output mean ablation -------------------------------------

@contextmanager
def rope_coordinates(surface: ModelSurface, coord_edit: CoordEdit, layers: Iterable[int] | None = None,
                     heads: Iterable[int] | None = None, *, layout: str | None = None) -> Iterator[None]:
    """Rotate q and k of `heads` (None = all) in `layers` (None = all) with edited patch coordinates.

    The rotary tensor is recomputed by vitpos from the coordinates `coord_edit` makes of the model's
    own (`surface.rope_coords()`, `rope_from_coords`: the family's own arithmetic, on the device timm
    computes on), once on entry; heads not chosen keep the model's tensor bit for bit. CoordEdit()
    (kind 'none') is the plain forward bit for bit (`vitpos.rope_selftest.self_test` checks it per family).
    Works for every timm RoPE family vitpos supports (axial cat, mixed, DINOv3, EVA-02; own models).
    layout: force the rotary layout of the recomputation (self-tests only)."""
    if not surface.has_rope:
        raise VitposError(f"{surface.spec} has no rotary embedding (scheme {surface.scheme}); RoPE edits need a RoPE "
                          "model")
    layer_list = list(range(surface.depth)) if layers is None else sorted(set(layers))
    for layer in layer_list:
        if not 0 <= layer < surface.depth:
            raise VitposError(f"layer {layer} is outside 0..{surface.depth - 1}")
    head_list = None if heads is None else sorted(set(heads))
    if head_list is not None and not all(0 <= h < surface.num_heads for h in head_list):
        raise VitposError(f"heads {head_list}: the model has heads 0..{surface.num_heads - 1}")
    table = surface.rope_from_coords(coord_edit.apply(surface.rope_coords()), layout=layout)
    h_all = surface.num_heads
    reg = _Registry()
    try:
        for layer in layer_list:
            memo: dict[int, torch.Tensor] = {}
            new = table[layer] if table.ndim == 4 else table  # mixed: per layer (h, N, 2d)

            def edited(base: torch.Tensor, new: torch.Tensor = new,
                       memo: dict[int, torch.Tensor] = memo) -> torch.Tensor:
                key = id(base)
                if key not in memo:
                    memo.clear()
                    out = new.to(base.device, base.dtype)
                    if head_list is not None:
                        full = (base if base.ndim == 3 else base.unsqueeze(0)).expand(h_all, *base.shape[-2:]).clone()
                        full[head_list] = (out if out.ndim == 3 else out.unsqueeze(0)).expand(
                            h_all, *out.shape[-2:])[head_list]
                        out = full
                    memo[key] = out
                return memo[key]

            _hook(reg, surface.rotary_input(layer), edited)
        yield
    finally:
        reg.close()


@contextmanager
def observe_rotary(surface: ModelSurface, observers: Mapping[int, Callable[[torch.Tensor], None]]) -> Iterator[None]:
    """Call fn(rotary tensor) with what block `layer` receives ({layer: fn}), keeping nothing."""
    reg = _Registry()
    try:
        for layer, fn in observers.items():
            _hook(reg, surface.rotary_input(layer), lambda t, fn=fn: (fn(t), None)[1])
        yield
    finally:
        reg.close()


@torch.no_grad()
def head_means(surface: ModelSurface, batches: Iterable[torch.Tensor], layers: Iterable[int],
               tokens: slice | None = None) -> dict[int, torch.Tensor]:
    """Mean of each head's output (`blocks.L.z`) over the images of `batches` and the tokens
    `tokens` (None: the patch tokens): {layer: (h, d)}, accumulated in float64."""
    layer_list = sorted(set(layers))
    tok = slice(surface.num_prefix_tokens, None) if tokens is None else tokens
    sums: dict[int, torch.Tensor] = {}
    count = {li: 0 for li in layer_list}

    def add(li: int):
        def fn(z: torch.Tensor) -> None:
            zt = z[:, :, tok].double()
            sums[li] = sums[li] + zt.sum((0, 2)) if li in sums else zt.sum((0, 2))
            count[li] += zt.shape[0] * zt.shape[2]
        return fn

    dev = next(surface.model.parameters()).device
    with observe(surface, {Site(li, "z"): add(li) for li in layer_list}):
        for x in batches:
            surface(x.to(dev))
    if not sums:
        raise VitposError("head_means: no images")
    return {li: (sums[li] / count[li]).float() for li in layer_list}


@contextmanager
def mean_ablate_heads(surface: ModelSurface, heads: Mapping[int, Iterable[int]], means: Mapping[int, torch.Tensor],
                      tokens: slice | None = None) -> Iterator[None]:
    """Replace the output of these heads ({layer: heads}) at `tokens` (None: patch tokens) by their
    mean (`head_means`: (h, d) per layer): whatever the head writes that depends on the image or the
    position is gone, its average contribution stays."""
    tok = slice(surface.num_prefix_tokens, None) if tokens is None else tokens

    def replace(li: int, hs: list[int]) -> EditFn:
        def fn(z: torch.Tensor) -> torch.Tensor:
            z = z.clone()
            z[:, hs, tok] = means[li][hs].to(z.device, z.dtype).unsqueeze(1)
            return z
        return fn

    for li, hs in heads.items():
        if li not in means:
            raise VitposError(f"mean_ablate_heads: no mean for layer {li} (means has {sorted(means)})")
        if not all(0 <= h < surface.num_heads for h in hs):
            raise VitposError(f"heads {list(hs)}: the model has heads 0..{surface.num_heads - 1}")
    with edit(surface, {Site(li, "z"): replace(li, sorted(set(hs))) for li, hs in heads.items()}):
        yield
