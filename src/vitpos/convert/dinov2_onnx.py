"""The old path of `vitpos.models.convert.dinov2_onnx`: this name is that module (an alias, so
attributes and monkeypatches reach the one module)."""

import sys

from vitpos.models.convert import dinov2_onnx as _module

sys.modules[__name__] = _module
