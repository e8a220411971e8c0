"""Where one site's tensor passes through a model (`HookPoint`): what a family adapter hands the hook
engine per site (see `vitpos.models.adapter`). Its own module, below both the surface and the adapter
protocol, which each name it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

Undo = Callable[[], None]


@dataclass(frozen=True)
class HookPoint:
    """Where one site's tensor passes through the model.

    module: the module the hook goes on.
    where: "output" (a forward hook on the module's return value) or "input" (a forward pre-hook on
      the argument `arg`: a position in the call's positional arguments or a keyword name; a value
      that is absent or None is passed over: nothing is captured or edited on that call).
    view: the module's value -> the site tensor in the documented shape (None: the value itself);
      e.g. `lambda out: out[0]` for a module returning a tuple, a reshape to (B, h, T, d).
    unview: (edited site tensor, the module's original value) -> the value to put back (None: the
      edited tensor itself); the inverse of `view`, e.g. `lambda new, out: (new, *out[1:])`.
    prepare: called once when the hook is attached, before it; returns the undo, called once when
      the hook context exits (after the hook is removed). For what the site needs around the hook:
      timm's attention patterns exist only on its unfused path (prepare switches it and back); q_rot
      records the rotary tensor attention receives (prepare registers that pre-hook, undo removes it).
    """

    module: nn.Module
    where: Literal["output", "input"] = "output"
    arg: int | str = 0
    view: Callable[[Any], torch.Tensor] | None = None
    unview: Callable[[torch.Tensor, Any], Any] | None = None
    prepare: Callable[[], Undo] | None = None
