"""Only `vitpos/models/` knows a model family: no timm (or transformers) import and no timm submodule
/ API name anywhere else in the package, and the timm adapters implement the family protocol."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import vitpos
from conftest import tiny_own, tiny_timm
from vitpos.errors import VitposError
from vitpos.hooks import capture, edit
from vitpos.models.adapter import FamilyAdapter
from vitpos.models.hookpoint import HookPoint
from vitpos.models.surface import LAYER_SITES, ModelSurface

PACKAGE = Path(vitpos.__file__).parent
MODELS = PACKAGE / "models"
FAMILY_LIBRARIES = {"timm", "transformers"}  # imported by the family adapters only
# timm's module and method names the hook sites, preprocessing and training once reached for directly
TIMM_NAMES = {"norm1", "norm2", "mlp", "q_norm", "k_norm", "proj", "attn_drop", "fused_attn", "pos_drop", "qkv",
              "patch_embed", "norm_pre", "forward_head", "forward_features", "no_weight_decay",
              "resolve_data_config", "create_transform", "get_mixed_freqs", "get_mixed_grid"}
TIMM_ATTRIBUTES = TIMM_NAMES | {"rope"}  # "rope" is also a scheme's name: only `x.rope` counts


def _docstring_ids(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def timm_uses(source: str, where: str) -> list[str]:
    """Each timm import, and each attribute access or string literal (docstrings excepted) that is a
    timm submodule or API name, as 'where:line: what'."""
    tree = ast.parse(source)
    docs = _docstring_ids(tree)
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in FAMILY_LIBRARIES for a in node.names):
            what = f"import {', '.join(a.name for a in node.names)}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FAMILY_LIBRARIES:
            what = f"from {node.module} import"
        elif isinstance(node, ast.Attribute) and node.attr in TIMM_ATTRIBUTES:
            what = f".{node.attr}"
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
              and node.value in TIMM_NAMES):
            what = repr(node.value)
        if what is not None:
            found.append(f"{where}:{getattr(node, 'lineno', '?')}: {what}")
    return found


def test_the_scan_sees_imports_module_names_and_strings_but_not_prose():
    src = ('"""Mentions norm2 and timm in prose."""\nimport timm\nfrom timm.layers import x\n'
           'import transformers.models\n'
           'def f(b):\n    """q_norm in a docstring"""\n    return b.norm2, b.get_submodule("attn_drop")\n')
    assert [u.split(": ", 1)[1] for u in timm_uses(src, "m")] == [
        "import timm", "from timm.layers import", "import transformers.models", ".norm2", "'attn_drop'"]


# Strings that are timm names by coincidence, each with its reason (exact file and literal only).
NOT_TIMM = {
    ("analysis/readout.py", "'mlp'"): "the MLP probe's name (a read-out kind), not a block's .mlp",
    ("claims/c3.py", "'mlp'"): "reads the MLP probe's read-out (analysis/readout.py KINDS)",
}


def test_no_timm_outside_the_model_adapters():
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if MODELS not in p.parents]
    assert len(files) > 40  # the scan sees the package
    uses = [u for p in files for u in timm_uses(p.read_text(), str(p.relative_to(PACKAGE)))
            if (u.split(":", 1)[0], u.rsplit(": ", 1)[1]) not in NOT_TIMM]
    assert not uses, "timm reached outside vitpos/models/ (go through the surface's adapter):\n" + "\n".join(uses)


@pytest.mark.parametrize("make,key", [(tiny_own, "rope-axial"), (tiny_timm, "vit"), (tiny_timm, "dinov3")])
def test_timm_surfaces_implement_the_family_protocol(make, key):
    s = make(key)
    assert isinstance(s, FamilyAdapter)
    for layer in (0, s.depth - 1):
        for site in LAYER_SITES:
            point = s.hook_point(layer, site)
            assert isinstance(point, HookPoint) and isinstance(point.module, torch.nn.Module)
    assert isinstance(s.hook_point(None, "embed"), HookPoint)
    assert s.head_projections(0).shape == (s.num_heads, s.head_dim, s.width)
    cfg = s.data_config()
    assert {"mean", "std", "interpolation"} <= set(cfg)
    assert s.device == torch.device("cpu") and s.to("cpu") is s
    if s.has_rope:
        assert s.rotary_input(0).arg == "rope"


class _ToyLayer(torch.nn.Module):
    """A Hugging Face-style layer: hidden states by keyword, a tuple out."""

    def __init__(self, d: int):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)

    def forward(self, hidden_states: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, str]:
        return hidden_states + scale * self.lin(hidden_states), "aux"


class _ToyModel(torch.nn.Module):
    def __init__(self, d: int = 4, depth: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Identity()
        self.layers = torch.nn.ModuleList(_ToyLayer(d) for _ in range(depth))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images.flatten(2).transpose(1, 2))  # (B, C, H, W) -> (B, H*W, C): one token a pixel
        for layer in self.layers:
            x = layer(hidden_states=x, scale=0.5)[0]
        return x.mean(1)


class _ToySurface(ModelSurface):
    """A second family in a few lines: the attributes plus hook points for the sites it has."""

    def __init__(self):
        self.model, self.spec = _ToyModel().eval(), "toy"
        self.grid, self.num_prefix_tokens, self.depth, self.num_heads = (2, 2), 0, 2, 1
        self.head_dim = self.width = 4
        self.num_classes, self.scheme, self.input_size = 0, "none", (4, 2, 2)

    def hook_point(self, layer, site):
        if layer is None and site == "embed":
            return HookPoint(self.model.embed)
        mod = self.model.layers[layer]
        if site == "resid_pre":
            return HookPoint(mod, "input", arg="hidden_states")
        if site == "resid_post":
            return HookPoint(mod, view=lambda out: out[0], unview=lambda new, out: (new, *out[1:]))
        raise VitposError(f"the toy family has no site {site}")


def test_a_second_family_is_one_adapter_keyword_inputs_and_tuple_outputs_included():
    s = _ToySurface()
    x = torch.randn(3, 4, 2, 2, generator=torch.Generator().manual_seed(1))
    plain = s(x)
    with edit(s, {"resid_pre": lambda t: t, "resid_post": lambda t: t.clone()}), \
            capture(s, ["embed", "resid_pre", "resid_post"]) as c:
        same = s(x)
    assert torch.equal(same, plain)
    assert torch.equal(c["embed"], x.flatten(2).transpose(1, 2))
    assert torch.equal(c["blocks.0.resid_post"], c["blocks.1.resid_pre"])  # the keyword input of the next layer
    assert torch.equal(c["blocks.1.resid_post"].mean(1), plain)
    with edit(s, {"blocks.1.resid_post": lambda t: torch.zeros_like(t)}):
        assert torch.equal(s(x), torch.zeros_like(plain))
    with pytest.raises(VitposError, match="no site q"), capture(s, ["blocks.0.q"]):
        pass
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in s.model.modules())
