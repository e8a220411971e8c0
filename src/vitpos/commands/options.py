"""Command-line options generated from typed settings: a command's options are its settings' fields.

`settings_command` turns a pydantic settings class into a typer command: each field is one option
(`top1_images` -> `--top1-images`) with the field's default, its description (and bounds) as help, its
`ge` / `le` bounds as typer's min / max, a bool as an on/off flag and a list as one comma-separated
string. What was passed is then validated by the settings class itself, so an option is refused by
the same rule as the run config's key, as one VitposError naming the option (`vitpos.cli.main` prints
it as one `error:` line, exit 2). Every such command also takes `COMMON`, the one option group of
model, weights, head, data, output, seed and progress bars. `experiment_command` gives any
registered experiment without prerequisites a command that runs its stage on one model.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

import typer
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from vitpos.errors import VitposError
from vitpos.experiments.base import Experiment, Settings, StageInput
from vitpos.lists import check_distinct, comma_items
from vitpos.study.config import SEED_MAX

COUNT_MAX = 10**9  # the largest count (images, tokens, layer) an option takes: huge values are refused
M = TypeVar("M", bound=BaseModel)

MODEL = typer.Option(..., "--model", "-m",
                     help="builtin:NAME, a directory from `vitpos train`, or timm:NAME[?kw=v&...]")
PRETRAINED = typer.Option(False, "--pretrained", help="timm: load hub weights with timm's own loader")
CHECKPOINT = typer.Option(None, "--checkpoint", help="timm: local .safetensors weights")
DATA = typer.Option("shapes", "--data", "-d", help="shapes | pairs | digits | fashion | natural | regions | tiles | "
                    "imagefolder:PATH")
OUT = typer.Option(..., "--out", "-o", help="output directory")
PROGRESS = typer.Option(True, "--progress/--no-progress", help="progress bars")
DEVICE = typer.Option("auto", "--device", help="auto | cpu | cuda (cuda:N); under torchrun each rank takes "
                      "cuda:LOCAL_RANK")
AMP = typer.Option("none", "--amp", help="autocast: none | bf16 | fp16 (fp16 needs CUDA)")
HEAD = typer.Option(None, "--head", help="a head fitted by `vitpos head` (DIR with head.json): the classifier "
                    "every top-1 is measured with (for headless backbones)")


def seed_option() -> Any:
    return typer.Option(0, "--seed", min=0, max=SEED_MAX, help=f"0..{SEED_MAX}")


def load_surface(model: str, pretrained: bool = False, checkpoint: Path | None = None, head: Path | None = None,
                 data: str | None = None, top1: bool = False):
    """The model; with --head, that head (checked against the model's weights and the data's classes)
    as its classifier. top1: the command measures top-1, so a classifier that does not fit the data
    is refused here, before any work."""
    from vitpos.data import dataset_info
    from vitpos.models import load_model
    from vitpos.models.head import Head

    surface = load_model(model, pretrained=pretrained, checkpoint=checkpoint)
    info = dataset_info(data) if data is not None and (head is not None or top1) else None
    if head is not None:
        surface = surface.with_head(Head.load(head), info, data)
    if top1 and info is not None:
        surface.check_classifier(info, data)
    return surface


@dataclass(frozen=True)
class Common:
    """The option group every per-experiment command shares."""

    model: str
    data: str
    out: Path
    seed: int
    pretrained: bool
    checkpoint: Path | None
    head: Path | None
    progress: bool

    def surface(self, top1: bool = False):
        return load_surface(self.model, self.pretrained, self.checkpoint, self.head, self.data, top1)


def _keyword(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def common_params(seed: bool = True) -> list[inspect.Parameter]:
    """The shared group's options (a fresh list: typer reads each parameter once per command)."""
    return [p for p in (
        _keyword("model", str, MODEL), _keyword("data", str, DATA), _keyword("out", Path, OUT),
        _keyword("seed", int, seed_option()) if seed else None,
        _keyword("pretrained", bool, PRETRAINED), _keyword("checkpoint", Path | None, CHECKPOINT),
        _keyword("head", Path | None, HEAD), _keyword("progress", bool, PROGRESS)) if p is not None]


def kebab(name: str) -> str:
    return "--" + name.replace("_", "-")


def _optional(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None was allowed)."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return (args[0] if len(args) == 1 else Union[tuple(args)]), len(args) < len(get_args(annotation))  # noqa: UP007
    return annotation, False


def _bound(field: FieldInfo, kind: type) -> Any:
    return next((getattr(m, kind.__name__.lower()) for m in field.metadata if isinstance(m, kind)), None)


def _is_list(annotation: Any) -> bool:
    return get_origin(annotation) in (list, tuple)


def _help(field: FieldInfo) -> str:
    text = field.description or ""
    bounds = [f"{op} {v}" for op, kind in ((">=", Ge), (">", Gt), ("<=", Le), ("<", Lt))
              if (v := _bound(field, kind)) is not None]
    return f"{text} ({', '.join(bounds)})" if bounds else text


def field_param(name: str, field: FieldInfo, flags: Sequence[str] = (), required: bool = False) -> inspect.Parameter:
    """The typer option of one settings field."""
    flags = list(flags) or [kebab(name)]
    inner, optional = _optional(field.annotation)
    default = ... if required else field.default
    text = _help(field)
    if inner is bool:
        return _keyword(name, bool, typer.Option(default, f"{flags[0]}/--no-{flags[0][2:]}", *flags[1:], help=text))
    if _is_list(inner):
        item = get_args(inner)[0] if get_args(inner) else str
        example = {int: "1,2", float: "1.5,2"}.get(item, "a,b")
        given = default if default is None or default is ... else ",".join(map(str, default))
        return _keyword(name, str | None,
                        typer.Option(given, *flags, help=f"{text}; a comma list, e.g. {example}".lstrip("; ")))
    low, high = _bound(field, Ge), _bound(field, Le)
    if inner is int and high is None:
        high = COUNT_MAX
    numeric = inner in (int, float)
    return _keyword(name, inner | None if optional else inner,
                    typer.Option(default, *flags, help=text, min=low if numeric else None,
                                 max=high if numeric else None))


def settings_from(settings_type: type[M], values: Mapping[str, Any], flags: Mapping[str, str]) -> M:
    """`values` validated by `settings_type`; the first problem is one VitposError naming its option."""
    try:
        return settings_type.model_validate(dict(values))
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        flag = flags.get(name, kebab(name))
        raise VitposError(f"{flag} {values.get(name)!r}: {err['msg']}") from None


def _list_value(text: str, flag: str, item: Any) -> list[Any]:
    """A comma list option's items, each converted like the settings field's items (a repeat refused:
    `1,01` names 1 twice)."""
    example = {int: "1,2", float: "1.5,2"}.get(item, "a,b")
    items = comma_items(text, flag, example, distinct=False)
    if item in (int, float):
        try:
            values: list[Any] = [item(t) for t in items]
        except ValueError:
            raise VitposError(f"{flag} takes a comma list of numbers, e.g. {flag} {example} (got {text!r})") from None
    else:
        values = items
    check_distinct(values, text, flag, example)
    return values


S = TypeVar("S", bound=Settings)


def settings_command(parent: typer.Typer, name: str, settings_type: type[S], run: Callable[[Common, S], None], *,
                     help: str, skip: Sequence[str] = (), required: Sequence[str] = (),
                     flags: Mapping[str, Sequence[str]] | None = None,
                     parsers: Mapping[str, Callable[[str], Any]] | None = None, seed: bool = True) -> None:
    """Register `name` on `parent`: the shared options, then one option per field of `settings_type` (but
    `skip`; `required` ones without a default; `flags`: other option names; `parsers`: a field's own
    parser of its option text); the command validates the options as `settings_type` and calls `run`."""
    flags, parsers = dict(flags or {}), dict(parsers or {})
    fields = {k: f for k, f in settings_type.model_fields.items() if k not in skip}
    shared = common_params(seed)
    params = shared + [field_param(k, f, flags.get(k, ()), k in required) for k, f in fields.items()]
    first_flag = {k: (list(flags.get(k, ())) or [kebab(k)])[0] for k in fields}

    def command(**kwargs: Any) -> None:
        group: dict[str, Any] = {p.name: kwargs.pop(p.name) for p in shared}
        common = Common(**{"seed": 0, **group})
        values: dict[str, Any] = {}
        for k, v in kwargs.items():
            inner = _optional(fields[k].annotation)[0]
            if isinstance(v, str) and k in parsers:
                v = parsers[k](v)
            elif isinstance(v, str) and _is_list(inner):
                v = _list_value(v, first_flag[k], (get_args(inner) or (str,))[0])
            values[k] = v
        run(common, settings_from(settings_type, values, first_flag))

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__ = command.__qualname__ = name.replace("-", "_")
    parent.command(name, help=help)(command)


def experiment_command(parent: typer.Typer, exp: Experiment, name: str | None = None) -> str:
    """A command for a registered experiment that reads no earlier stage: its settings' options and the
    shared group; it runs the stage on one model and writes OUT/<experiment>.json and its figures.
    Returns the command's name."""
    if exp.settings_type is None or exp.requires:
        raise ValueError(f"{exp.name}: a command needs settings and no earlier stages (requires {exp.requires})")
    command_name = name or exp.name.replace("_", "-")

    def run(common: Common, settings: Settings) -> None:
        from vitpos.io import require_out_dir

        require_out_dir(common.out)
        surface = common.surface()
        result = exp.run_stage(surface, StageInput(data=common.data, seed=common.seed, settings=settings, prior={},
                                                   out=common.out, progress=common.progress, quick=False,
                                                   root=common.out))
        exp.write(result, common.out)

    settings_command(parent, command_name, exp.settings_type, run, help=f"{exp.title}: OUT/{exp.name}.json")
    return command_name


__all__ = ["AMP", "CHECKPOINT", "COUNT_MAX", "Common", "DATA", "DEVICE", "HEAD", "MODEL", "OUT", "PRETRAINED",
           "PROGRESS", "experiment_command", "field_param", "kebab", "load_surface", "seed_option",
           "settings_command", "settings_from"]
