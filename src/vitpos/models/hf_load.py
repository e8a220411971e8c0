"""Loading an `hf:` spec: a transformers config (from its class, a save_pretrained folder or the local
cache), its preprocessor config and weights, each checked before the model is built behind the
surface (`vitpos.models.hf_adapter.HFSurface`).

`hf:CLASS?key=value&...` builds CLASS from its config class with those keys (random init);
`hf:DIR` reads a `save_pretrained` folder (config.json + model.safetensors) with transformers' own
loader, offline, safetensors only; `hf:ORG/NAME` uses the local Hugging Face cache only. `--checkpoint
FILE.safetensors` loads weights into the configured model. Any missing, unexpected or mis-shaped key
is an error.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from vitpos.errors import VitposError
from vitpos.io import check_finite, read_json, validate_doc
from vitpos.models.hf_adapter import HFSurface
from vitpos.models.hf_families import BY_CLASS, NO_SURFACE, family_of, require_transformers
from vitpos.models.query import parse_query_value


def _build(cls_name: str, config: Any, where: str) -> nn.Module:
    tr = require_transformers()
    # The same random init on every load (the stage cache keys a model by its spec; see models/spec.py).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            return getattr(tr, cls_name)(config)
        except Exception as e:  # the config's values disagree with the modules (a dropout of 3, a bad activation)
            raise VitposError(f"transformers could not build {cls_name} from {where}: "
                              f"{' '.join(str(e).split())[:200]}; fix the config's keys") from None


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """One load of local files: no progress bars, load report or mismatch warning from transformers in
    vitpos' output (a mismatch is raised as one error line instead)."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _load_weights(model: nn.Module, checkpoint: Path, spec: str, fix: str = "pass the config it was trained with",
                  where: str | None = None) -> nn.Module:
    """Weights from a .safetensors file through transformers' own loader (its key renames for older
    checkpoints included), refused unless every key of the model is loaded and nothing is left over.
    Mis-shaped tensors are loaded as transformers' 'ignore_mismatched_sizes' (no traceback telling the user
    to set it) and refused from its loading report, naming the tensor and both shapes. `where` heads the
    error line (default: the checkpoint and the spec)."""
    if checkpoint.suffix != ".safetensors":
        raise VitposError(f"checkpoint {checkpoint} is not .safetensors; vitpos never unpickles weights — convert it "
                          "first")
    if not checkpoint.is_file():
        raise VitposError(f"checkpoint {checkpoint} does not exist")
    cls: Any = type(model)
    with tempfile.TemporaryDirectory() as tmp, _quiet_transformers():
        hf_model: Any = model
        hf_model.config.save_pretrained(tmp)
        os.symlink(checkpoint.resolve(), Path(tmp) / "model.safetensors")
        try:
            loaded, info = cls.from_pretrained(tmp, local_files_only=True, use_safetensors=True,
                                               output_loading_info=True, ignore_mismatched_sizes=True)
        except Exception as e:  # a truncated or unreadable file
            raise VitposError(f"checkpoint {checkpoint} could not be read for {spec} "
                              f"({' '.join(str(e).split())[:200]}); re-save or re-copy it") from None
    bad = _load_problems(info, checkpoint.name)
    if bad:
        head = where if where is not None else f"checkpoint {checkpoint} does not fit {spec}"
        raise VitposError(f"{head}: {bad}; {fix}")
    return loaded


def _shape(shape: Any) -> str:
    return str([int(n) for n in shape])


def _load_problems(info: Mapping[str, Any], file: str) -> str:
    """What a from_pretrained load (with ignore_mismatched_sizes) left wrong, in words: the first mis-shaped
    tensor with both shapes (transformers reports (key, shape in the file, shape the config implies)),
    then missing and unexpected keys; empty when every key loaded."""
    mismatched = sorted(info.get("mismatched_keys") or [], key=lambda t: str(t[0]))
    if mismatched:
        key, found, implied = mismatched[0]
        more = f" (and {len(mismatched) - 1} more mis-shaped)" if len(mismatched) > 1 else ""
        return (f"weight {key!r} has shape {_shape(found)} in {file} but the config implies {_shape(implied)}"
                f"{more}")
    parts = [f"{k.replace('_', ' ')} {', '.join(sorted(map(str, v))[:4])}" + (" ..." if len(v) > 4 else "")
             for k, v in info.items() if k in ("missing_keys", "unexpected_keys") and v]
    return "; ".join(parts)


class PreprocessorConfig(BaseModel):
    """The keys of a preprocessor_config.json vitpos reads (the rest is transformers' business)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    image_mean: list[float] | None = Field(default=None, min_length=1, max_length=16)
    image_std: list[Annotated[float, Field(gt=0)]] | None = Field(default=None, min_length=1, max_length=16)
    resample: int | None = None


def _read_preprocess(folder: Path, channels: int) -> dict:
    """mean / std / interpolation from a preprocessor_config.json next to the weights (PIL resample codes)."""
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        return {}
    fix = "fix it, or remove it to use the family's own normalisation"
    doc = validate_doc(PreprocessorConfig, read_json(path, fix), path, fix)
    out: dict = {}
    if doc.image_mean is not None and doc.image_std is not None:
        for key, values in (("image_mean", doc.image_mean), ("image_std", doc.image_std)):
            if len(values) != channels:
                raise VitposError(f"{path}: key {key!r} has {len(values)} values for a model of {channels} input "
                                  f"channels; {fix}")
        out["mean"], out["std"] = tuple(doc.image_mean), tuple(doc.image_std)
    if doc.resample is not None:
        if doc.resample not in _RESAMPLE:  # PIL's lanczos / box / hamming or no code at all: not silently bicubic
            pil = {1: "lanczos", 4: "box", 5: "hamming"}.get(doc.resample)
            raise VitposError(f"{path}: key 'resample' is {doc.resample}"
                              + (f" (PIL's {pil}, which vitpos does not apply)" if pil else " (no PIL resampling code)")
                              + "; set it to one of " + ", ".join(f"{k} ({v})" for k, v in _RESAMPLE.items())
                              + ", or remove the key to use the family's own")
        out["interpolation"] = _RESAMPLE[doc.resample]
    return out


_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # the PIL codes vitpos' preprocessing applies


# sizes a config must have for a patch grid + prefix surface (StopIteration, division by zero otherwise),
# bounded as the timm: specs' (models.spec.SIZE_BOUNDS): a huge one must be refused, not allocated
_SIZE_BOUNDS = {"num_hidden_layers": 256, "hidden_size": 16384, "num_attention_heads": 1024, "patch_size": 4096,
                "image_size": 4096, "num_channels": 16, "intermediate_size": 1 << 18, "num_register_tokens": 1024,
               "num_labels": 1 << 20}
_MAY_BE_ZERO = ("num_register_tokens", "num_labels")  # none; a headless model (num_labels=-1 read as 0 before)


def _check_config(config: Any, where: str) -> None:
    """One VitposError naming the key when the config cannot be a vision transformer of >= 1 layer."""
    _check_sizes({k: getattr(config, k, None) for k in _SIZE_BOUNDS}, where)
    heads, width = getattr(config, "num_attention_heads", None), getattr(config, "hidden_size", None)
    if isinstance(heads, int) and isinstance(width, int) and width % heads:
        raise VitposError(f"{where}: hidden_size {width} is not a multiple of num_attention_heads {heads}")
    size, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if isinstance(size, int) and isinstance(patch, int) and size < patch:
        raise VitposError(f"{where}: image_size {size} is smaller than patch_size {patch}: no patch fits")
    if isinstance(size, int) and isinstance(patch, int) and size < 2 * patch:  # as `vitpos train` refuses
        raise VitposError(f"{where}: image_size {size} with patch_size {patch} gives a 1 x 1 patch grid; a position "
                          f"study needs at least 2 x 2 patches: set image_size to at least {2 * patch}")


def _check_sizes(values: Mapping[str, Any], where: str) -> None:
    """The size keys among `values` (a config.json's, a query's) within their bounds: checked before
    transformers sees them too, since a config builds lists of num_hidden_layers entries at init (a
    huge count would fill the memory before any model exists)."""
    for key, top in _SIZE_BOUNDS.items():
        value = values.get(key)
        low = 0 if key in _MAY_BE_ZERO else 1
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if value is not None and (isinstance(v, bool) or not isinstance(v, int) or not low <= v <= top):
                raise VitposError(f"{where}: {key}={value!r}; it must be a whole number in {low}..{top}")


def _query_kwargs(query: str, defaults: dict[str, Any], where: str) -> dict[str, Any]:
    """A spec's ?key=value pairs, each a key of the config (`defaults`: its keys and default values): an
    unknown key is refused (transformers would keep it as an unused attribute, and nothing would change);
    a whole number where the config holds a float is that float (rope_theta=100)."""
    kwargs = {k: parse_query_value(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        accepted = sorted(k for k in defaults if not k.startswith("_"))
        raise VitposError(f"{where}: unknown query key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                          f"the config's keys are {', '.join(accepted)}")
    return {k: float(v) if isinstance(defaults[k], float) and isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in kwargs.items()}


def _config_keys(config: Any) -> dict[str, Any]:
    """The keys a spec's query may set on `config`, with their values: its own and num_labels (an init
    argument every config takes, stored as id2label)."""
    return {**config.to_dict(), "num_labels": int(getattr(config, "num_labels", 0) or 0)}


def _check_weights(model: nn.Module, where: str | Path) -> None:
    """NaN or infinity in any parameter or buffer: refused naming the file and the key, at load (not
    later as a probe's 'features contain NaN')."""
    check_finite(dict(model.state_dict()), where, "the weights are damaged or diverged; re-save or re-download them")


def load_hf(spec: str, checkpoint: str | Path | None = None) -> HFSurface:
    """An `hf:` spec behind the model surface (see the module docstring)."""
    tr = require_transformers()
    body = spec[len("hf:"):]
    name, _, query = body.partition("?")
    if not name:
        raise VitposError("hf spec needs a class or a folder, e.g. hf:Dinov2Model?hidden_size=32 or hf:DIR")
    folder = Path(os.path.expanduser(name))
    # a path is never a hub id (ORG/NAME): a file, or a folder that is not there, would otherwise be looked up in
    # the hub cache, and transformers' answer (a torch.load message for config.json) names neither problem
    if folder.exists() and not folder.is_dir():
        raise VitposError(f"{spec}: {folder} is a file; pass the save_pretrained folder holding it "
                          f"(hf:{folder.parent})")
    if name.startswith(("/", "./", "../", "~")) and not folder.exists():
        raise VitposError(f"{spec}: no folder {folder}; pass an existing save_pretrained folder (config.json + "
                          "model.safetensors)")
    preprocess: dict = {}
    if folder.is_dir():
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            raise VitposError(f"{folder} has no config.json; save the model with save_pretrained")
        fix = "save the model with save_pretrained, or fix the file"
        raw = read_json(cfg_path, fix)
        if not isinstance(raw, dict):
            raise VitposError(f"{cfg_path} holds a JSON {type(raw).__name__}, not an object of keys; {fix}")
        _check_sizes(raw, str(cfg_path))
        try:
            config = tr.AutoConfig.from_pretrained(folder, local_files_only=True)
            kwargs = _query_kwargs(query, _config_keys(config), spec)
            _check_sizes(kwargs, spec)
            if kwargs:
                config = tr.AutoConfig.from_pretrained(folder, local_files_only=True, **kwargs)
        except VitposError:
            raise
        except Exception as e:  # ValueError (no model_type: e.g. a `vitpos train` folder), JSON, query keys
            raise VitposError(f"{spec}: {cfg_path} is not a Hugging Face config transformers can read "
                              f"({' '.join(str(e).split())[:160]}); save the model with save_pretrained, or pass "
                              "a folder from `vitpos train` without the hf: prefix") from None
        _check_config(config, str(cfg_path))
        archs = list(getattr(config, "architectures", None) or [])
        cls_name = next((a for a in archs if a in BY_CLASS or a in NO_SURFACE), archs[0] if archs else
                        type(config).__name__.replace("Config", "Model"))
        fam = family_of(cls_name, spec)
        weights = Path(checkpoint) if checkpoint is not None else folder / "model.safetensors"
        if checkpoint is None and not weights.is_file():
            raise VitposError(f"{folder} has no model.safetensors (vitpos reads safetensors only); pass --checkpoint")
        preprocess = _read_preprocess(folder, int(config.num_channels))  # before the weights: the cheap check first
        model = _load_weights(_build(cls_name, config, str(cfg_path)), weights, spec,
                              *(("pass the config it was trained with", None) if checkpoint is not None else
                                ("fix config.json or re-save the weights", spec)))
        _check_weights(model, weights)
        return HFSurface(model, spec, fam, preprocess)
    if name in BY_CLASS or name in NO_SURFACE:
        fam = family_of(name, spec)
        config_cls = getattr(tr, fam.config_cls)
        kwargs = _query_kwargs(query, _config_keys(config_cls()), spec)
        _check_sizes(kwargs, spec)
        try:
            config = config_cls(**kwargs)
        except Exception as e:  # TypeError / ValueError / huggingface_hub's strict-dataclass validation errors
            raise VitposError(f"transformers could not build {spec!r}: {' '.join(str(e).split())[:200]}; check the "
                              f"?key=value names against {fam.config_cls}") from None
        _check_config(config, spec)
        model = _build(name, config, spec)
        if checkpoint is not None:
            model = _load_weights(model, Path(checkpoint), spec)
            _check_weights(model, checkpoint)
        return HFSurface(model, spec, fam)
    if "/" in name:  # a hub id: the local cache only
        if query:
            raise VitposError(f"{spec}: a cached hf:ORG/NAME takes no ?key=value (its config is the cached one, the "
                              "keys would be ignored); save it with save_pretrained and pass hf:DIR?key=value")
        try:
            config = tr.AutoConfig.from_pretrained(name, local_files_only=True)
        except OSError:
            raise VitposError(f"{spec}: {name} is not in the local Hugging Face cache and vitpos does not download; "
                              "save it with save_pretrained where the hub is reachable and pass hf:DIR, or pass "
                              "hf:CLASS?config-keys with --checkpoint FILE.safetensors") from None
        _check_config(config, f"{spec} (its cached config.json)")
        archs = list(getattr(config, "architectures", None) or [])
        cls_name = archs[0] if archs else type(config).__name__.replace("Config", "Model")
        fam = family_of(cls_name, spec)
        try:
            with _quiet_transformers():
                model, info = getattr(tr, cls_name).from_pretrained(
                    name, local_files_only=True, use_safetensors=True, output_loading_info=True,
                    ignore_mismatched_sizes=True)
        except OSError:
            raise VitposError(f"{spec}: no safetensors weights for {name} in the local cache; pass "
                              "--checkpoint") from None
        except Exception as e:  # e.g. a truncated cached file
            raise VitposError(f"{spec}: the cached weights could not be read ({' '.join(str(e).split())[:200]}); "
                              "re-download the model or pass --checkpoint") from None
        bad = _load_problems(info, "the cached weights")
        if bad:
            raise VitposError(f"{spec}: {bad}; re-download the model or pass --checkpoint")
        _check_weights(model, f"{spec} (its cached weights)")
        return HFSurface(model, spec, fam)
    raise VitposError(f"{spec}: {name!r} is neither a transformers class vitpos supports "
                      f"({', '.join(sorted(BY_CLASS))}), an existing save_pretrained folder, nor an ORG/NAME in the "
                      "local Hugging Face cache")
