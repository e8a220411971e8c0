"""results.json as typed objects: one ModelEntry per (model, data), the claims summary, provenance.

The JSON layout is the one users have read since format 1 (each experiment's result under its
name in the model's entry); FORMAT_VERSION marks it, and files written before the version field
existed load as version 1.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vitpos.claims.verdict import Summary
from vitpos.errors import VitposError
from vitpos.experiments.registry import BY_NAME, names
from vitpos.results.base import Result, Skipped
from vitpos.study.config import SEED_MAX, RunConfig
from vitpos.study.head_stage import HeadResult

FORMAT = "vitpos-results"
FORMAT_VERSION = 1
HEADLINE_FIGURE = "headline"  # the study-level figure: APE vs RoPE per claim, above the claims table


def model_slug(spec: str) -> str:
    """A safe file/anchor name for a model spec; a short hash keeps distinct specs distinct."""
    spec = str(spec)
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-._")[:60] or "model"
    if clean != spec:
        clean += "-" + hashlib.sha1(spec.encode()).hexdigest()[:8]
    return clean


def figure_key(spec: str, figure: str) -> str:
    """The key (and file stem under OUT/figures/) of one model's figure."""
    return f"{model_slug(spec)}_{figure}"


class ModelDescription(BaseModel):
    """ModelSurface.describe(): the geometry every measurement depends on."""

    # adapters may add fields of their own (e.g. own ViTs' training config): kept as they are
    model_config = ConfigDict(extra="allow")
    spec: str
    family: str
    grid: list[int]
    num_prefix_tokens: int
    depth: int
    num_heads: int
    head_dim: int
    width: int
    scheme: str
    rope: dict[str, Any] | None


class ModelEntry(BaseModel):
    """One model on one data set: its description and each experiment's result (None: not run).

    `head`: the classifier fitted (or given) on the model's pooled features when its own does not
    fit the data; written only when there is one, so entries of models with a fitting classifier
    read exactly as before."""

    model_config = ConfigDict(extra="forbid")
    describe: ModelDescription
    data: str
    not_applicable: dict[str, str]
    results: dict[str, Result | Skipped]
    head: HeadResult | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"describe": self.describe.model_dump(mode="json"), "data": self.data,
                               "not_applicable": dict(self.not_applicable)}
        if self.head is not None:
            doc["head"] = self.head.to_json()
        for name in names():
            r = self.results.get(name)
            doc[name] = None if r is None else r.model_dump(mode="json")
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ModelEntry:
        unknown = set(doc) - {"describe", "data", "not_applicable", "head", *names()}
        if unknown:
            raise VitposError(f"model entry has unknown keys {sorted(unknown)}")
        results = {name: BY_NAME[name].load(doc[name]) for name in names() if doc.get(name) is not None}
        head = HeadResult.from_json(doc["head"]) if doc.get("head") is not None else None
        return cls(describe=ModelDescription.model_validate(doc["describe"]), data=doc["data"],
                   not_applicable=dict(doc.get("not_applicable") or {}), results=results, head=head)


class StudyResults(BaseModel):
    """Everything `vitpos run` measured, keyed by model then experiment, plus a verdict per claim."""

    model_config = ConfigDict(extra="forbid")
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    vitpos_version: str
    torch_version: str
    timm_version: str
    created: str
    seed: int = Field(ge=0, le=SEED_MAX)
    quick: bool
    config: RunConfig
    models: dict[str, ModelEntry]
    timings: dict[str, float]
    reproduce: str
    summary: Summary
    figures: dict[str, str] = {}  # figure key -> PNG path relative to the output directory

    def to_json(self) -> dict[str, Any]:
        doc = self.model_dump(mode="json", exclude={"models"})
        doc["models"] = {spec: m.to_json() for spec, m in self.models.items()}
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StudyResults:
        version = doc.get("format_version", 1)
        if version != FORMAT_VERSION:
            raise VitposError(f"results format version {version} is not supported (this vitpos reads "
                              f"{FORMAT_VERSION}); rerun `vitpos run` to rewrite it")
        rest = {k: v for k, v in doc.items() if k != "models"}
        where = "results"
        try:
            models = {}
            for spec, m in (doc.get("models") or {}).items():
                where = f"models[{spec!r}]"
                models[spec] = ModelEntry.from_json(m)
            where = "results"
            return cls.model_validate({**rest, "models": models})
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise VitposError(f"{where}: {e.title} field {loc!r}: {err['msg']} (is this a results.json written by "
                              f"vitpos {FORMAT_VERSION}? rerun `vitpos run` to rewrite it)") from None
        except (KeyError, TypeError, AttributeError) as e:
            raise VitposError(f"{where} is malformed ({type(e).__name__}: {e}); rerun `vitpos run` to rewrite "
                              "it") from None


def load_results(path: str | Path) -> StudyResults:
    """OUT/results.json (or the file itself) as typed results: a file that does not decode, parse or
    fit the schema is one VitposError naming it and the fix."""
    from vitpos.io import read_json_object

    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    fix = "rerun `vitpos run` with the same --out to rewrite it"
    doc = read_json_object(file, fix)
    try:
        return StudyResults.from_json(doc)
    except VitposError as e:
        raise VitposError(f"{file}: {e}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise VitposError(f"{file} is not a vitpos results file ({type(e).__name__}: {str(e)[:160]}); {fix}") from None
