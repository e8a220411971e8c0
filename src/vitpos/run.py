"""`vitpos run`: the whole study on the built-in defaults, cached per stage, resumable, one report.

Stages per model: eval, probe, then sae + ape_permute (APE models) or rope_axis + rope_heads
(RoPE models). Each stage's result lives in OUT/stages/<model>/<stage>-<key>.json, where key is
a content hash of (model weights or timm spec, data, the stage's settings): a rerun skips
finished stages, an interrupted run resumes at the first unfinished one, --force recomputes.
SAE layer (documented choice): the layer whose patch tokens hold the most of both axes by the
probes (max of min(row, col) accuracy), last layer excluded, earliest on ties.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import time
from pathlib import Path
from typing import Any, Literal

import timm
import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import vitpos
from vitpos.errors import VitposError
from vitpos.io import read_json, write_json

SHAPES_MODELS = ["builtin:ape", "builtin:rope-axial", "builtin:rope-mixed", "builtin:none"]
FASHION_MODELS = ["builtin:fashion-ape", "builtin:fashion-rope-axial", "builtin:fashion-rope-mixed", "builtin:fashion-none"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProbeStage(_Strict):
    images: int = 1000


class SAEStage(_Strict):
    layer: int | None = Field(None, description="None = chosen from the probe results")
    site: str = "resid_post"
    arch: Literal["topk", "batchtopk", "relu"] = "topk"
    k: int = 32
    expansion: int = 8
    images: int = 4000
    epochs: int = 4
    lr: float | None = Field(None, description="None = vitpos.sae.train.default_lr")


class ApePermuteStage(_Strict):
    images: int = 2000
    seeds: int = 3


class RopeAxisStage(_Strict):
    images: int = 1000
    restore: list[int] | None = None


class RopeHeadsStage(_Strict):
    axis: Literal["row", "col", "both"] = "both"
    restore_from: int | None = None
    probe_images: int = 500
    top1_images: int = 2000
    attn_images: int = 64


class RunConfig(_Strict):
    models: list[str] | None = Field(None, description="None = the shipped models of each dataset")
    data: list[str] = Field(default_factory=lambda: ["shapes"])
    seed: int = 0
    eval_images: int | None = None
    pretrained: bool = False
    checkpoints: dict[str, str] = Field(default_factory=dict, description="timm spec -> local .safetensors")
    probe: ProbeStage = ProbeStage()
    sae: SAEStage = SAEStage()
    ape_permute: ApePermuteStage = ApePermuteStage()
    rope_axis: RopeAxisStage = RopeAxisStage()
    rope_heads: RopeHeadsStage = RopeHeadsStage()


QUICK = {
    "eval_images": 500,
    "probe": {"images": 200},
    "sae": {"images": 400, "epochs": 2, "expansion": 4},
    "ape_permute": {"images": 300, "seeds": 1},
    "rope_axis": {"images": 200},
    "rope_heads": {"probe_images": 150, "top1_images": 300, "attn_images": 16},
}


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(path: str | Path | None, overrides: dict[str, Any], quick: bool) -> RunConfig:
    """Config file (YAML or TOML) < --quick sizes < command-line options; unknown keys are errors."""
    doc: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise VitposError(f"config file {path} does not exist")
        text = path.read_text()
        try:
            if path.suffix == ".toml":
                import tomllib

                doc = tomllib.loads(text)
            else:
                doc = yaml.safe_load(text) or {}
        except Exception as e:
            raise VitposError(f"config file {path} does not parse ({str(e).splitlines()[0]})") from e
        if not isinstance(doc, dict):
            raise VitposError(f"config file {path} must hold a mapping of settings")
    if quick:
        doc = _merge(QUICK, doc)
        if "rope_axis" not in doc or "restore" not in doc.get("rope_axis", {}):
            doc.setdefault("rope_axis", {})["restore"] = None  # filled per model (middle layer)
    doc = _merge(doc, {k: v for k, v in overrides.items() if v is not None})
    try:
        return RunConfig.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise VitposError(f"config key {key!r}: {err['msg']} (see `vitpos run --help` and README for valid keys)") from e


def model_fingerprint(spec: str, cfg: RunConfig) -> str:
    """Content identity of a model: its weights file hash, or timm spec + weights source."""
    from vitpos.models.spec import BUILTIN_DIR

    if spec.startswith("builtin:"):
        path = BUILTIN_DIR / spec[len("builtin:"):] / "model.safetensors"
    elif spec.startswith("timm:"):
        ck = cfg.checkpoints.get(spec)
        path = Path(ck) if ck else None
        if path is None:
            return hashlib.sha256(f"{spec}|pretrained={cfg.pretrained}".encode()).hexdigest()[:16]
    else:
        path = Path(spec) / "model.safetensors"
    if not path.is_file():
        return hashlib.sha256(spec.encode()).hexdigest()[:16]  # load_model will give the clear error
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


class StageCache:
    def __init__(self, root: Path, force: bool):
        self.root, self.force = root, force

    def path(self, model_slug: str, stage: str, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return self.root / "stages" / model_slug / f"{stage}-{digest}.json"

    def get(self, path: Path) -> dict | None:
        if self.force or not path.is_file():
            return None
        try:
            return read_json(path)["result"]
        except (VitposError, KeyError):
            return None  # a damaged cache entry is recomputed

    def put(self, path: Path, key: dict, result: dict, seconds: float) -> None:
        write_json(path, {"key": key, "seconds": seconds, "result": result})


def _models_for(cfg: RunConfig) -> list[tuple[str, str]]:
    if cfg.models:
        return [(m, d) for d in cfg.data for m in cfg.models]
    pairs = []
    for d in cfg.data:
        if d == "shapes":
            pairs += [(m, d) for m in SHAPES_MODELS]
        elif d == "fashion":
            pairs += [(m, d) for m in FASHION_MODELS]
        else:
            raise VitposError(f"no shipped models for --data {d}; pass --models (e.g. timm:NAME) for it")
    return pairs


def run_study(out: str | Path, cfg: RunConfig, *, quick: bool = False, force: bool = False, progress: bool = True,
              reproduce: str | None = None, log=print) -> dict:
    from vitpos.analysis.forward import evaluate
    from vitpos.data.resolve import dataset_for
    from vitpos.experiments.ape_permute import run_ape_permute
    from vitpos.experiments.probe import run_probe
    from vitpos.experiments.rope_axis import run_rope_axis
    from vitpos.experiments.rope_heads import run_rope_heads
    from vitpos.experiments.sae_run import choose_sae_layer, run_sae
    from vitpos.models import load_model
    from vitpos.report.html import model_slug, render_figures, render_report
    from vitpos.sae import SAE
    from vitpos.summary import summarise

    out = Path(out)
    cache = StageCache(out, force)
    t_start = time.time()
    timings: dict[str, float] = {}
    models_doc: dict[str, dict] = {}
    for spec, data in _models_for(cfg):
        key_spec = spec if len(cfg.data) == 1 or cfg.models is None else f"{spec}@{data}"
        slug = model_slug(key_spec)
        surface = load_model(spec, pretrained=cfg.pretrained, checkpoint=cfg.checkpoints.get(spec))
        fp = model_fingerprint(spec, cfg)
        entry: dict[str, Any] = {"describe": surface.describe(), "data": data, "not_applicable": {}}
        for name in ("eval", "probe", "sae", "ape_permute", "rope_axis", "rope_heads"):
            entry[name] = None

        def stage(name: str, settings: dict, fn, recompute: bool = False):
            key = {"model": fp, "spec": spec, "data": data, "seed": cfg.seed, "stage": name, "settings": settings,
                   "vitpos": vitpos.__version__}
            path = cache.path(slug, name, key)
            hit = None if recompute else cache.get(path)
            if hit is not None:
                log(f"[{spec}] {name}: cached")
                return hit
            log(f"[{spec}] {name} ...")
            t0 = time.time()
            result = fn(out / "artifacts" / slug / name)
            secs = time.time() - t0
            timings[f"{key_spec}/{name}"] = round(secs, 1)
            cache.put(path, key, result, secs)
            log(f"[{spec}] {name}: done in {secs:.0f} s")
            return result

        entry["eval"] = stage("eval", {"images": cfg.eval_images}, lambda d: evaluate(
            surface, dataset_for(surface, data, "test", limit=cfg.eval_images), progress=False))
        entry["probe"] = stage("probe", cfg.probe.model_dump(), lambda d: run_probe(
            surface, data=data, n_images=cfg.probe.images, seed=cfg.seed, out=d))
        if surface.has_ape:
            layer = cfg.sae.layer if cfg.sae.layer is not None else choose_sae_layer(entry["probe"], surface.depth)
            sae_settings = {**cfg.sae.model_dump(), "layer": layer}

            def sae_fn(d):
                doc, _ = run_sae(surface, layer, site=cfg.sae.site, data=data, arch=cfg.sae.arch, k=cfg.sae.k,
                                 expansion=cfg.sae.expansion, n_train_images=cfg.sae.images, epochs=cfg.sae.epochs,
                                 seed=cfg.seed, out=d, progress=progress, lr=cfg.sae.lr, keep_acts=False)
                doc["sae_dir"] = str(d)
                doc["layer_choice"] = "given" if cfg.sae.layer is not None else "max min(row, col) probe accuracy"
                return doc
            entry["sae"] = stage("sae", sae_settings, sae_fn)
            sae_dir = Path(entry["sae"]["sae_dir"])
            if not (sae_dir / "sae.safetensors").is_file():  # artifacts removed since: recompute
                entry["sae"] = stage("sae", sae_settings, sae_fn, recompute=True)
            entry["ape_permute"] = stage("ape_permute", {**cfg.ape_permute.model_dump(), "sae": sae_settings},
                                         lambda d: run_ape_permute(surface, SAE.load(sae_dir), entry["sae"], data=data,
                                                                   n_images=cfg.ape_permute.images,
                                                                   seeds=tuple(range(cfg.ape_permute.seeds)), out=d))
        else:
            reason = f"no absolute position embedding (scheme {surface.scheme})"
            entry["not_applicable"].update({"sae": reason, "ape_permute": reason})
        if surface.has_rope:
            restore = cfg.rope_axis.restore
            if restore is None and quick:
                restore = [max(1, surface.depth // 2)]
            entry["rope_axis"] = stage("rope_axis", {**cfg.rope_axis.model_dump(), "restore": restore},
                                       lambda d: run_rope_axis(surface, data=data, n_images=cfg.rope_axis.images,
                                                               restore_points=restore, seed=cfg.seed, out=d))
            h = cfg.rope_heads
            entry["rope_heads"] = stage("rope_heads", h.model_dump(), lambda d: run_rope_heads(
                surface, data=data, axis=h.axis, restore_from=h.restore_from, n_probe_images=h.probe_images,
                n_top1_images=h.top1_images, n_attn_images=h.attn_images, seed=cfg.seed, out=d))
        else:
            reason = f"no rotary embedding (scheme {surface.scheme})"
            entry["not_applicable"].update({"rope_axis": reason, "rope_heads": reason})
        models_doc[key_spec] = entry

    results = {
        "vitpos_version": vitpos.__version__, "torch_version": torch.__version__, "timm_version": timm.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "seed": cfg.seed,
        "quick": quick, "config": cfg.model_dump(), "models": models_doc, "timings": timings,
        "reproduce": reproduce or "vitpos run --out OUT",
    }
    results["summary"] = summarise(models_doc)
    results["timings"]["total_this_run"] = round(time.time() - t_start, 1)
    figures = render_figures(results, out)
    results["figures"] = {k: str(Path(p).relative_to(out)) for k, p in figures.items()}
    write_json(out / "results.json", results)
    render_report(results, out, figures=figures)
    return results
