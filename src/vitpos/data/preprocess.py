"""A model's own preprocessing for the in-memory built-in data: resize, channels, mean / std.

Built-in splits (`shapes`, `digits`, `fashion`) are held as uint8 at their native size; a model
that takes another size, channel count or normalisation sees them through `BatchPreprocess`,
applied per batch by `TensorImageDataset` (so memory stays uint8 at the native size):
  1. uint8 -> [0, 1];
  2. grey -> RGB by repeating the channel (RGB -> grey by the channel mean) when the model
     takes the other count;
  3. resize the whole image to the model's input size (no crop: every patch position maps onto
     the image), with the model's interpolation, antialiased, clamped to [0, 1];
  4. (x - mean) / std with the model's mean / std (``ModelSurface.data_config``; vitpos' own
     ViTs: 0.5 / 0.5, i.e. [-1, 1]).
When nothing changes (same size and channels, mean = std = 0.5) no transform is attached and the
images go through `to_float` exactly as before: vitpos' own models keep a bit-identical input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

_MODES = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest", "area": "area"}


@dataclass(frozen=True)
class BatchPreprocess:
    in_chans: int
    size: tuple[int, int]  # (H, W)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bicubic"

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float().div_(255.0)
        c = x.shape[1]
        if c != self.in_chans:
            grey = x if c == 1 else x.mean(1, keepdim=True)
            x = grey.expand(-1, self.in_chans, -1, -1)
        if tuple(x.shape[-2:]) != tuple(self.size):
            mode = _MODES.get(self.interpolation, "bilinear")
            kw = {"antialias": True, "align_corners": False} if mode in ("bilinear", "bicubic") else {}
            x = F.interpolate(x, size=tuple(self.size), mode=mode, **kw).clamp_(0.0, 1.0)
        mean = torch.tensor(self.mean, dtype=x.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype).view(1, -1, 1, 1)
        return (x - mean).div_(std).contiguous()

    def is_identity(self, in_chans: int, size: tuple[int, int]) -> bool:
        """True when this is exactly `to_float` for images of (in_chans, size)."""
        return (in_chans == self.in_chans and tuple(size) == tuple(self.size)
                and all(m == 0.5 for m in self.mean) and all(s == 0.5 for s in self.std))


def _per_channel(v, c: int) -> tuple[float, ...]:
    vals = tuple(float(x) for x in (v if isinstance(v, (tuple, list)) else [v]))
    if len(vals) == c:
        return vals
    if len(vals) == 1:
        return vals * c
    return (sum(vals) / len(vals),) * c  # an RGB mean / std on a grey-input model


def model_preprocess(surface) -> BatchPreprocess:
    """The preprocessing `surface` expects, from `surface.data_config()` and its input size."""
    c, h, w = surface.input_size
    cfg = surface.data_config()
    return BatchPreprocess(in_chans=int(c), size=(int(h), int(w)), mean=_per_channel(cfg.get("mean", 0.5), int(c)),
                           std=_per_channel(cfg.get("std", 0.5), int(c)),
                           interpolation=str(cfg.get("interpolation", "bicubic")))


__all__ = ["BatchPreprocess", "model_preprocess"]
