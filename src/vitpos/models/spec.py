"""Model SPECs: `builtin:NAME` (shipped), a directory written by `vitpos train`, or `timm:NAME`.

timm specs take keyword arguments for timm.create_model in a query string, e.g.
`timm:vit_small_patch16_224?img_size=64&depth=4`; weights come from the hub (`pretrained=True`,
timm's own loading code) or from a local `checkpoint` (.safetensors, strict; official key layouts
go through the timm module's checkpoint_filter_fn).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl

import timm
import torch

from vitpos.errors import VitposError
from vitpos.io import check_finite, read_safetensors
from vitpos.models.checkpoint import load_own_model
from vitpos.models.own import OwnViTConfig
from vitpos.models.query import parse_query_value
from vitpos.models.surface import ModelSurface
from vitpos.models.timm_adapter import TIMM_VERSION, TimmEvaSurface, surface_for

BUILTIN_DIR = Path(__file__).parent / "builtin"


class OwnSurface(TimmEvaSurface):
    """vitpos' own ViTs: timm Eva models built from an OwnViTConfig (see own.py)."""

    extrapolation_scales = (1.25, 1.5)  # 32 px -> 40 and 48 px (grid 8 -> 10, 12)

    def __init__(self, model: torch.nn.Module, spec: str, config: OwnViTConfig, trained_data: str | None = None,
                 trained_classes: list[str] | None = None):
        super().__init__(model, spec)
        self.config = config
        self.trained_data = trained_data
        if trained_classes is not None:  # recorded by `vitpos train` in config.json
            self.trained_classes = tuple(trained_classes)
        elif trained_data is not None:
            from vitpos.data import BUILTIN, dataset_info

            if trained_data in BUILTIN:
                self.trained_classes = tuple(dataset_info(trained_data).class_names)
            else:  # an image folder, classes not recorded (older runs): read them there, or accept no data
                try:
                    self.trained_classes = tuple(dataset_info(trained_data).class_names)
                except VitposError:
                    self.trained_classes = ()

    def _resized(self) -> None:
        super()._resized()
        h, w = self.input_size[1:]
        if h == w:  # the config describes the model as it now runs (OwnViTConfig has one img_size)
            self.config = self.config.model_copy(update={"img_size": h})

    def data_config(self) -> dict:
        """vitpos' own ViTs read [-1, 1] images (data.base.to_float)."""
        c = self.input_size[0]
        return {"mean": (0.5,) * c, "std": (0.5,) * c, "interpolation": "bilinear"}

    def describe(self) -> dict:
        return {**super().describe(), "pe": self.config.pe, "config": self.config.model_dump()}


def _trained_data(model_dir: Path) -> tuple[str | None, list[str] | None]:
    """The data set an own model was trained on and its class names, from its config.json (None
    when not recorded; load_own_model has already read the file)."""
    from vitpos.io import read_json

    try:
        doc = read_json(model_dir / "config.json")
    except VitposError:
        return None, None
    train = doc.get("train") if isinstance(doc, dict) else None
    data = train.get("data") if isinstance(train, dict) else None
    classes = doc.get("classes") if isinstance(doc, dict) else None
    if classes is not None and not (isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)):
        raise VitposError(f"{model_dir / 'config.json'}: 'classes' is not a list of class names; retrain with "
                          "`vitpos train`")
    return (data if isinstance(data, str) else None), classes


def library_versions() -> dict[str, str]:
    """Versions of the model-family libraries behind the adapters (recorded with every study)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"timm": TIMM_VERSION}
    try:
        out["transformers"] = version("transformers")
    except PackageNotFoundError:
        pass
    return out


def weights_file(spec: str, checkpoint: str | Path | None = None) -> Path | None:
    """The file whose bytes are `spec`'s weights: a shipped or trained model's model.safetensors, a
    timm spec's local checkpoint; None for hub weights (named by the spec alone). The file may be
    missing: `load_model` names that problem."""
    if spec.startswith("builtin:"):
        return BUILTIN_DIR / spec[len("builtin:"):] / "model.safetensors"
    if spec.startswith("timm:"):
        return Path(checkpoint) if checkpoint else None
    if spec.startswith("hf:"):  # a checkpoint, a save_pretrained folder's weights; None: random init / hub cache
        if checkpoint:
            return Path(checkpoint)
        folder = Path(os.path.expanduser(spec[len("hf:"):].partition("?")[0]))
        return folder / "model.safetensors" if folder.is_dir() else None
    return Path(os.path.expanduser(spec)) / "model.safetensors"


def available_builtins() -> list[str]:
    if not BUILTIN_DIR.is_dir():
        return []
    return sorted(p.name for p in BUILTIN_DIR.iterdir() if (p / "model.safetensors").is_file())


# query keys that would make timm read a file or fetch weights by a route vitpos does not control
# (timm's checkpoint_path goes through torch.load: vitpos never unpickles user files)
REFUSED_KEYS = {
    "checkpoint_path": "pass --checkpoint FILE.safetensors (or `checkpoints:` in a run config) instead",
    "pretrained": "pass --pretrained instead",
    "pretrained_cfg": "vitpos loads hub weights only through --pretrained",
    "pretrained_cfg_overlay": "vitpos loads hub weights only through --pretrained",
    "cache_dir": "vitpos loads hub weights only through --pretrained",
}
# bounds of the sizes a query may set: a zero patch or a huge image must be refused, not built
SIZE_BOUNDS = {"img_size": (1, 4096), "patch_size": (1, 4096), "embed_dim": (1, 16384), "depth": (1, 256),
               "num_heads": (1, 1024), "num_classes": (0, 100_000), "in_chans": (1, 16), "reg_tokens": (0, 1024)}
INT_BOUND = 1 << 20


def parse_timm_spec(spec: str) -> tuple[str, dict]:
    body = spec[len("timm:"):]
    name, _, query = body.partition("?")
    kwargs = {k: parse_query_value(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    if not name:
        raise VitposError("timm spec needs a model name, e.g. timm:vit_small_patch16_224")
    for key, value in kwargs.items():
        if key in REFUSED_KEYS:
            raise VitposError(f"timm spec {spec!r}: ?{key}= is refused; {REFUSED_KEYS[key]}")
        if isinstance(value, float) and not math.isfinite(value):
            raise VitposError(f"timm spec {spec!r}: {key}={value} is not a finite number; pass a number")
        if isinstance(value, int) and not isinstance(value, bool):
            lo, hi = SIZE_BOUNDS.get(key, (-INT_BOUND, INT_BOUND))
            if not lo <= value <= hi:
                raise VitposError(f"timm spec {spec!r}: {key}={value} is outside {lo}..{hi}; pass a value in range")
        elif key in SIZE_BOUNDS:
            raise VitposError(f"timm spec {spec!r}: {key}={value!r} must be a whole number; pass e.g. {key}="
                              f"{max(SIZE_BOUNDS[key][0], 4)}")
    return name, kwargs


def _load_checkpoint(model: torch.nn.Module, checkpoint: Path, name: str) -> torch.nn.Module:
    """Strict load of local safetensors weights; official-format checkpoints go through the timm
    model module's own checkpoint_filter_fn (e.g. naver / EVA key layouts)."""
    state = read_safetensors(checkpoint)
    check_finite(state, checkpoint, "the weights are broken; re-create or re-download them")
    try:
        model.load_state_dict(state, strict=True)
        return model
    except RuntimeError as first:
        filter_fn = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
        try:
            if filter_fn is None:
                raise first
            model.load_state_dict(filter_fn(state, model), strict=True)
            return model
        except Exception as e:
            raise VitposError(f"checkpoint {checkpoint} does not fit timm:{name} ({str(e).splitlines()[0][:200]}); "
                              "pass the kwargs it was trained with (e.g. ?num_classes=...&img_size=...)") from e


def load_timm(name: str, kwargs: dict, pretrained: bool, checkpoint: str | Path | None) -> torch.nn.Module:
    if name not in timm.list_models():
        raise VitposError(f"timm has no model {name!r}; list them with `python -c \"import timm; "
                          "print(timm.list_models('*vit*'))\"`")
    if checkpoint is not None:
        checkpoint = Path(checkpoint)
        if checkpoint.suffix != ".safetensors":
            raise VitposError(f"checkpoint {checkpoint} is not .safetensors; vitpos never unpickles weights — convert "
                              "it first")
        if not checkpoint.is_file():
            raise VitposError(f"checkpoint {checkpoint} does not exist")
        return _load_checkpoint(timm.create_model(name, pretrained=False, **kwargs), checkpoint, name)
    try:
        # A random-init model is the same model on every load (seed 0, the global generator left as it
        # was): the study keys its stage cache by the spec alone, so a resumed run must not mix stages
        # measured on two different random inits.
        with torch.random.fork_rng(devices=[]), _quiet_hub():
            torch.manual_seed(0)
            return timm.create_model(name, pretrained=pretrained, **kwargs)
    except TypeError as e:
        raise VitposError(f"timm:{name} does not take these arguments {kwargs} ({e})") from e
    except Exception as e:  # hub / network failures come in many types
        if not pretrained:
            raise
        raise VitposError(
            f"pretrained weights for timm:{name} are not available ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:160]}); this machine may be offline — pass --checkpoint FILE.safetensors with "
            "local weights"
        ) from e


@contextlib.contextmanager
def _quiet_hub() -> Iterator[None]:
    """huggingface_hub's warnings off while timm fetches weights: offline, its five 'Retrying in Ns'
    lines came before vitpos' one `error:` line (errors still show)."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_model(spec: str, *, pretrained: bool = False, checkpoint: str | Path | None = None,
               timm_kwargs: dict | None = None) -> ModelSurface:
    """Load any supported model SPEC behind the model surface (eval mode)."""
    if spec.startswith("hf:"):
        if pretrained:
            raise VitposError("--pretrained applies to timm:NAME specs; hf: specs load a local folder (hf:DIR), the "
                              "local Hugging Face cache (hf:ORG/NAME) or --checkpoint FILE.safetensors")
        from vitpos.models.hf_load import load_hf

        return load_hf(spec, checkpoint)
    if not spec.startswith("timm:") and (pretrained or checkpoint is not None):
        flag = "--checkpoint" if checkpoint is not None else "--pretrained"
        raise VitposError(f"{flag} applies to timm:NAME specs only; {spec!r} loads its own weights (drop {flag}, "
                          "or name a timm model)")
    if spec.startswith("builtin:"):
        name = spec[len("builtin:"):]
        if name not in available_builtins():
            raise VitposError(f"no shipped model {spec!r}; available: "
                              f"{', '.join('builtin:' + n for n in available_builtins()) or 'none'}")
        model, cfg = load_own_model(BUILTIN_DIR / name)
        return OwnSurface(model, spec, cfg, *_trained_data(BUILTIN_DIR / name))
    if spec.startswith("timm:"):
        name, kwargs = parse_timm_spec(spec)
        kwargs.update(timm_kwargs or {})
        try:
            model = load_timm(name, kwargs, pretrained, checkpoint)
        except (ValueError, TypeError, AssertionError, RuntimeError, ZeroDivisionError, OverflowError, IndexError,
                KeyError, AttributeError) as e:  # timm's own argument checks, and what bad sizes break
            if isinstance(e, VitposError):
                raise
            msg = " ".join(str(e).split())[:200] or type(e).__name__
            raise VitposError(f"timm could not build {spec!r}: {msg}; check the model name and the ?key=value "
                              "arguments (e.g. img_size must be a positive multiple of the patch size)") from None
        return surface_for(model.eval(), spec)
    path = Path(os.path.expanduser(spec))
    if path.is_dir():
        model, cfg = load_own_model(path)
        return OwnSurface(model, spec, cfg, *_trained_data(path))
    raise VitposError(
        f"model spec {spec!r} is neither builtin:NAME, timm:NAME nor an existing directory written by `vitpos train`"
    )
