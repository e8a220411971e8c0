"""Models behind the surface: `load_model(spec)` for builtin:NAME, a trained DIR, or timm:NAME."""

from vitpos.models.spec import available_builtins, load_model
from vitpos.models.surface import AXES, ModelSurface, RopeAxisMap, Site, expand_sites

__all__ = ["load_model", "available_builtins", "ModelSurface", "RopeAxisMap", "Site", "expand_sites", "AXES"]
