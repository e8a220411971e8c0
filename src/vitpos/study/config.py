"""Study settings: one validated RunConfig (YAML/TOML file < --quick sizes < command-line options)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, ValidationError, model_validator
from pydantic_core import ErrorDetails, InitErrorDetails

from vitpos.errors import VitposError

SHAPES_ENCODINGS = ["ape", "rope-axial", "rope-mixed", "none"]
SHAPES_SEEDS = 3  # shipped training seeds per encoding: builtin:<pe> (seed 0), builtin:<pe>-seed1, -seed2
SHAPES_MODELS = [f"builtin:{pe}" for pe in SHAPES_ENCODINGS]  # seed 0 of each encoding


def shapes_models(seeds: int) -> list[str]:
    """The shipped shapes checkpoints of the first `seeds` training seeds, seed by seed."""
    return [f"builtin:{pe}" + (f"-seed{k}" if k else "") for k in range(seeds) for pe in SHAPES_ENCODINGS]


def zoo_models(seeds: int) -> list[str]:
    """The shipped members of the encoding zoo (vitpos.zoo) for the first `seeds` training seeds,
    seed by seed; a member that is not shipped yet is refused in one line."""
    from vitpos import zoo
    from vitpos.models.spec import available_builtins

    wanted = [zoo.member_name(e.key, k) for k in range(seeds) for e in zoo.ENCODINGS]
    missing = sorted(set(wanted) - set(available_builtins()))
    if missing:
        raise VitposError(f"the zoo members {', '.join(missing)} are not shipped in this install; retrain them with "
                          "`vitpos zoo train NAME --out DIR` and pass --models DIR,..., or use fewer --model-seeds")
    return [f"builtin:{name}" for name in wanted]


FASHION_MODELS = ["builtin:fashion-ape", "builtin:fashion-rope-axial", "builtin:fashion-rope-mixed",
                  "builtin:fashion-none"]


SEED_MAX = 2**32 - 1  # every seed vitpos takes: 0..SEED_MAX (derived seeds stay inside torch's 64-bit range)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HeadStage(_Strict):
    """The classifier the study fits on a model's pooled features when the model's own does not fit
    the data (headless backbones, another class count) and `heads` names none."""

    images: int = Field(default=4000, ge=2, description="train-split images; val and test: images // 4 each")


class RunConfig(BaseModel):
    """Every setting of `vitpos run`. Unknown keys are errors (experiment sections are checked
    against the registry, so the model allows extra keys only for them)."""

    model_config = ConfigDict(extra="allow")
    models: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, min_length=1, description="None = the shipped models of each dataset")
    # The full study's default is the matched encoding zoo (issue 33); --quick keeps the shapes test organisms.
    data: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=lambda: ["pairs"], min_length=1)
    seed: int = Field(default=0, ge=0, le=SEED_MAX)
    model_seeds: int = Field(default=1, ge=1, le=SHAPES_SEEDS,
                             description="shipped models per encoding (training seeds 0..n-1) when models is None")
    eval_images: int | None = Field(default=None, ge=1, description="None = the whole test split")
    pretrained: bool = False
    checkpoints: dict[str, str] = Field(default_factory=dict, description="timm spec -> local .safetensors")
    heads: dict[str, str] = Field(default_factory=dict, description="model spec -> head dir from `vitpos head`")
    head: HeadStage = HeadStage()
    # Then one section per registered experiment with settings, named like it (`probe`, `sae`, ...):
    # built from the registry (vitpos.experiments.registry), each the experiment's own frozen
    # Settings, read as `cfg.section(name)` (or `cfg.<name>`); a config file may leave any out.

    @model_validator(mode="wrap")
    @classmethod
    def _experiment_sections(cls, data: Any, handler: ModelWrapValidatorHandler[RunConfig]) -> RunConfig:
        if not isinstance(data, dict):
            return handler(data)
        from vitpos.experiments.registry import settings_types

        types = settings_types()
        errors: list[InitErrorDetails] = []
        try:
            cfg = handler({k: v for k, v in data.items() if k not in types})
        except ValidationError as e:
            errors += [_detail(err, ()) for err in e.errors()]
            cfg = None
        sections: dict[str, BaseModel] = {}
        for name, kind in types.items():
            given = data.get(name, {})
            try:
                sections[name] = given if isinstance(given, kind) else kind.model_validate(given)
            except ValidationError as e:
                errors += [_detail(err, (name,)) for err in e.errors()]
        errors += [InitErrorDetails(type="extra_forbidden", loc=(k,), input=data[k])
                   for k in data if k not in cls.model_fields and k not in types]
        if errors or cfg is None:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        assert cfg.__pydantic_extra__ is not None
        cfg.__pydantic_extra__.update(sections)
        return cfg

    @model_validator(mode="after")
    def _nothing_ignored(self) -> RunConfig:
        """A setting the run would not read is refused, not ignored: model_seeds picks shipped models
        (with `models` given it picks nothing), a model named twice would be run twice, and a checkpoint
        or head for a model that is not run would never be loaded."""
        if self.models is not None and self.model_seeds != 1:
            raise ValueError(f"model_seeds {self.model_seeds} picks shipped models, but models are given "
                             f"({', '.join(self.models)}); leave model_seeds out, or leave models out")
        for key, names in (("models", self.models or []), ("data", self.data)):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{key} names {', '.join(twice)} more than once; name each once")
        if self.models is not None:
            stray = sorted(set(self.checkpoints) - set(self.models))
            if stray:
                raise ValueError(f"checkpoints names {', '.join(stray)}, which is not among the models "
                                 f"({', '.join(self.models)}); key each checkpoint by its model spec")
        return self

    def section(self, name: str) -> Any:
        """The settings of experiment `name` (its section of the config)."""
        sections = self.__pydantic_extra__ or {}
        if name not in sections:
            raise VitposError(f"the run config has no section {name!r} (is the experiment registered?)")
        return sections[name]


def _detail(err: ErrorDetails, prefix: tuple[str, ...]) -> InitErrorDetails:
    """A validation error of a section, re-raised at its place in the whole config."""
    detail = InitErrorDetails(type=err["type"], loc=(*prefix, *err["loc"]), input=err["input"])
    if "ctx" in err:
        detail["ctx"] = err["ctx"]
    return detail


BASE_QUICK: dict[str, Any] = {
    "data": ["shapes"],  # the test organisms: a minutes-long smoke run
    "model_seeds": 1,  # seed 0 of each encoding
    "eval_images": 500,
    "head": {"images": 400},
}


def quick_sizes() -> dict[str, Any]:
    """The `--quick` sizes: the study's own (BASE_QUICK) and each registered experiment's (its
    settings' QUICK)."""
    from vitpos.experiments.registry import quick_sizes as experiment_quick_sizes

    return {**BASE_QUICK, **experiment_quick_sizes()}


def __getattr__(name: str) -> Any:
    """The stage settings' former names here (they live in their experiment modules now)."""
    moved = {"ProbeStage": ("probe", "ProbeSettings"), "SAEStage": ("sae_run", "SAESettings"),
             "ApePermuteStage": ("ape_permute", "ApePermuteSettings"),
             "RopeAxisStage": ("rope_axis", "RopeAxisSettings"), "RopeHeadsStage": ("rope_heads", "RopeHeadsSettings"),
             "RopePrefixStage": ("rope_prefix", "RopePrefixSettings"),
             "RopeFreqStage": ("rope_freq", "RopeFreqSettings"),
             "ExtrapolateStage": ("extrapolate", "ExtrapolateSettings"), "QUICK": None}
    if name not in moved:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    where = moved[name]
    if where is None:
        return quick_sizes()
    import importlib

    return getattr(importlib.import_module(f"vitpos.experiments.{where[0]}"), where[1])


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error (PyYAML keeps the last
    silently: `checkpoints:` with one model twice would use one of the two files unsaid). TOML refuses
    it itself."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice (line {line})",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | Path | None, overrides: dict[str, Any], quick: bool) -> RunConfig:
    """Config file (YAML or TOML) < --quick sizes < command-line options; unknown keys are errors."""
    doc: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise VitposError(f"config file {path} does not exist")
        try:
            text = path.read_bytes().decode("utf-8-sig")  # a byte-order mark (Windows editors) is not a key
        except UnicodeDecodeError as e:
            raise VitposError(f"config file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
        try:
            if path.suffix == ".toml":
                import tomllib

                doc = tomllib.loads(text)
            else:
                doc = yaml.load(text, Loader=_UniqueKeyLoader)
        except Exception as e:
            raise VitposError(f"config file {path} does not parse ({(str(e).splitlines() or [type(e).__name__])[0]}); "
                              "fix its syntax") from None
        if doc is None or doc == {}:  # empty means error, not the defaults
            raise VitposError(f"config file {path} holds no settings; write some (see README), or leave --config out "
                              "for the defaults")
        if not isinstance(doc, dict):
            raise VitposError(f"config file {path} must hold a mapping of settings")
    if quick:
        doc = _merge(quick_sizes(), doc)
    doc = _merge(doc, {k: v for k, v in overrides.items() if v is not None})
    try:
        return RunConfig.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        where = f"config key {key!r}" if key else "config"  # a check across keys has no one key
        raise VitposError(f"{where}: {err['msg'].removeprefix('Value error, ')} (see `vitpos run --help` and README "
                          "for valid keys)") from e
