"""The per-model self-tests of vitpos' rotary recomputation (`self_test`).

They run a model through the hook engine, so they sit above both `vitpos.rope` (the pure RoPE
maths they check) and `vitpos.hooks` (which imports that maths).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel

from vitpos.errors import VitposError
from vitpos.hooks import capture, observe_rotary, rope_coordinates
from vitpos.models.surface import ModelSurface, Site
from vitpos.rope import CoordEdit


class RopeSelfTest(BaseModel):
    """Two checks of vitpos' rotary recomputation on one model (`self_test`).

    (a) table: `rope_from_coords()` against the tensor each block receives in a plain forward
        (max |difference| over layers; exact = bit for bit), and the forward under the no-op edit
        CoordEdit() against the plain forward, bit for bit.
    (b) shift: every patch coordinate moved by `shift` patches; per layer, the patch-to-patch
        attention scores q_rot . k_rot (the layer run from the clean stream) move by at most
        `shift_deviation` x their largest magnitude (a relative encoding: 0 up to rounding; prefix
        tokens are not rotated and are left out). `jitter_deviation`: the same under per-patch jitter
        of `jitter_sigma` patch, which must move them (the check can fail).
    """

    spec: str
    family: str
    layout: str
    table_max_abs: float
    table_exact: bool
    noop_exact: bool
    shift: tuple[float, float]
    shift_deviation: float
    jitter_sigma: float
    jitter_deviation: float
    tolerance: float

    @property
    def recompute_ok(self) -> bool:
        return self.table_exact and self.noop_exact

    @property
    def shift_ok(self) -> bool:
        return self.shift_deviation <= self.tolerance < self.jitter_deviation

    @property
    def passed(self) -> bool:
        return self.recompute_ok and self.shift_ok

    def summary(self) -> str:
        return (f"{self.spec} ({self.family}, {self.layout}): recomputation "
                f"{'bit-identical' if self.recompute_ok else f'DIFFERS (max {self.table_max_abs:.3g})'}, no-op forward "
                f"{'bit-identical' if self.noop_exact else 'DIFFERS'}; shift {self.shift} patches moves patch scores "
                f"by {self.shift_deviation:.2g} (tolerance {self.tolerance:g}), jitter by {self.jitter_deviation:.2g}: "
                f"{'pass' if self.passed else 'FAIL'}")


@torch.no_grad()
def self_test(surface: ModelSurface, images: torch.Tensor | None = None, layout: str | None = None,
              shift: tuple[float, float] = (1.5, -2.5), jitter_sigma: float = 1.0,
              tolerance: float = 1e-4) -> RopeSelfTest:
    """Run both self-tests (RopeSelfTest) on a RoPE surface. images: None = 2 seeded random images.
    layout: force the recomputation's rotary layout (a wrong one must fail (a))."""
    if not surface.has_rope:
        raise VitposError(f"{surface.spec} has no rotary embedding (scheme {surface.scheme}); the RoPE self-test "
                          "needs a RoPE model")
    dev = next(surface.model.parameters()).device
    if images is None:
        g = torch.Generator().manual_seed(0)
        images = torch.randn(2, *surface.input_size, generator=g)
    images = images.to(dev)
    L, npt = surface.depth, surface.num_prefix_tokens
    seen: dict[int, torch.Tensor] = {}  # what each block receives (the family's rotary hook point)

    def record(li: int):
        def fn(t: torch.Tensor) -> None:
            seen[li] = t
        return fn

    with observe_rotary(surface, {li: record(li) for li in range(L)}):
        plain = surface(images)
    table = surface.rope_from_coords(layout=layout)
    worst, exact = 0.0, True
    for li in range(L):
        mine = (table[li] if table.ndim == 4 else table).to(seen[li].device)
        same_shape = mine.shape == seen[li].shape
        exact &= same_shape and torch.equal(mine, seen[li])
        worst = max(worst, float((mine.float() - seen[li].float()).abs().max()))
    with rope_coordinates(surface, CoordEdit(), layout=layout):
        noop = surface(images)

    def deviation(coord_edit: CoordEdit) -> float:
        t = surface.embed_tokens(images)
        dev_max = 0.0
        for li in range(L):
            sites = [Site(li, "q_rot"), Site(li, "k_rot")]
            scores = []
            for e in (CoordEdit(), coord_edit):
                with rope_coordinates(surface, e, layers=[li], layout=layout), capture(surface, sites) as c:
                    surface.run_blocks(t, li, li + 1)
                q, k = c[str(sites[0])][:, :, npt:].double(), c[str(sites[1])][:, :, npt:].double()
                scores.append(q @ k.transpose(-1, -2))
            scale = float(scores[0].abs().max()) or 1.0
            dev_max = max(dev_max, float((scores[1] - scores[0]).abs().max()) / scale)
            t = surface.run_blocks(t, li, li + 1)
        return dev_max

    own_layout = surface.rope_axis_map().layout
    return RopeSelfTest(
        spec=surface.spec, family=type(getattr(surface, "_rope", None)).__name__, layout=layout or own_layout,
        table_max_abs=worst, table_exact=bool(exact), noop_exact=bool(torch.equal(noop, plain)), shift=shift,
        shift_deviation=deviation(CoordEdit("shift", offset=shift)), jitter_sigma=jitter_sigma,
        jitter_deviation=deviation(CoordEdit("jitter", sigma=jitter_sigma, seed=1)), tolerance=tolerance)
