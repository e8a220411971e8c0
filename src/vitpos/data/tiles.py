"""`tiles`: natural crops cut into 14-px tiles whose row order, column order, both or neither are
reversed; the label says which. A labelled task on natural images whose label needs *where*, by
construction (issue 28: C1's top-1 floor on DINOv2 needs a task that reads position).

Sample i of a split is crop i // 4 of the `natural` generator (its own split seeds, so no crop is
shared with `natural`'s splits) in order i % 4:
  0 as photographed    1 rows reversed    2 columns reversed    3 both reversed
Reversing moves whole TILE x TILE tiles and keeps each tile's pixels as they are, so the four
versions of a crop hold the same multiset of tiles. A model that patches the image at exactly the
tiles (patch TILE px at SIZE px input, no resize: DINOv2-S/14 at 224) and sees no position gets
the same bag of patch tokens for all four and sits at chance (25 %) exactly; what tells the
classes apart is the arrangement: the photo's layout (sky below ground) and the continuity across
tile borders (seams between vertically adjacent tiles where the rows were reversed, between
horizontally adjacent ones where the columns were). Both need position, and each axis matters
alike (removing rows' information confuses 0 with 1 and 2 with 3). The check that a model's
patches are the tiles is `require_tile_patches` (a model patching across tile borders would see
the seams inside its patches: content, not position). Every split holds the four orders of each
crop, in turn, so any even prefix of 4 is balanced; no class groups (no class is decided by one
axis alone: every class differs from one other in rows and from another in columns).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from vitpos.data import natural
from vitpos.data.base import DatasetInfo, split_seed
from vitpos.errors import VitposError

if TYPE_CHECKING:
    from vitpos.models.surface import ModelSurface

NAME = "tiles"
SIZE = natural.SIZE  # 224
TILE = 14  # px: DINOv2's patch at 224 px (a 16 x 16 grid)
GRID = SIZE // TILE
ORDERS = ("as photographed", "rows reversed", "columns reversed", "both reversed")
SPLIT_SIZES = {"train": 40_000, "val": 4_000, "test": 8_000}

INFO = DatasetInfo(
    name=NAME,
    num_classes=len(ORDERS),
    class_names=ORDERS,
    image_size=(SIZE, SIZE),
    in_chans=3,
    class_groups={},
    fixed_size=True,
    description=(f"natural crops (as `natural`) cut into {TILE}-px tiles ({GRID}x{GRID}) whose row order, column "
                 "order, both or neither are reversed; label = which (chance 25 %: every class holds the same tiles)"),
)


def reorder(x: torch.Tensor, order: int) -> torch.Tensor:
    """(..., SIZE, SIZE) with its TILE-px tile rows (order 1, 3) and / or columns (2, 3) reversed."""
    if order not in (0, 1, 2, 3):
        raise ValueError(f"order must be 0-3, got {order}")
    *lead, h, w = x.shape
    t = x.reshape(*lead, h // TILE, TILE, w // TILE, TILE)
    dims = [d for d, on in ((-4, order in (1, 3)), (-2, order in (2, 3))) if on]
    return (t.flip(dims) if dims else t).reshape(*lead, h, w)


class LazyTiles(natural.LazyCrops):
    """LazyCrops whose item i is crop i // 4 in tile order i % 4."""

    def boxes(self, ids) -> list[natural.CropBox]:
        return super().boxes([int(i) // 4 for i in ids])

    def render(self, ids: np.ndarray) -> torch.Tensor:
        crops = super().render(ids)
        return torch.stack([reorder(c, int(i) % 4) for c, i in zip(crops, ids, strict=True)]) if len(ids) else crops


class TileCrops(natural.NaturalCrops):
    images: LazyTiles  # pyright: ignore[reportIncompatibleVariableOverride]


def load_split(split: str, seed: int = 0, limit: int | None = None) -> TileCrops:
    """`limit` samples (default SPLIT_SIZES[split]); sample i depends only on (seed, split, i)."""
    n = SPLIT_SIZES[split] if limit is None else min(max(int(limit), 0), SPLIT_SIZES[split])
    ids = np.arange(n)
    labels = torch.from_numpy(ids % 4).long()
    return TileCrops(LazyTiles(split_seed(seed, NAME, split), ids), labels, INFO, split)  # pyright: ignore[reportArgumentType]


def require_tile_patches(surface: ModelSurface, data: str = NAME) -> None:
    """One VitposError unless `surface` patches the tiles exactly: input SIZE x SIZE (no resize, which
    would blend pixels across tile borders) and patch TILE x TILE."""
    c, h, w = surface.input_size
    if (h, w) == (SIZE, SIZE) and tuple(surface.patch_size) == (TILE, TILE):
        return
    ph, pw = surface.patch_size
    raise VitposError(f"{data} is built of {TILE}-px tiles at {SIZE} px, so a model must take {SIZE} x {SIZE} input "
                      f"with {TILE}-px patches (e.g. DINOv2-S/14 at img_size={SIZE}); {surface.spec} takes {h} x {w} "
                      f"with {ph} x {pw} patches, so its patches would cross the tiles' borders and see the seams as "
                      "content; use such a model, or other data")


__all__ = ["GRID", "INFO", "NAME", "ORDERS", "SIZE", "SPLIT_SIZES", "TILE", "LazyTiles", "TileCrops", "load_split",
           "reorder", "require_tile_patches"]
