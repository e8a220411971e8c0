"""What every experiment result shares: the `Result` base (its JSON is what results.json holds), the
`Skipped` marker and `omit_unmeasured` for fields added after a result was first written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict


class Result(BaseModel):
    """Base of every experiment result: a typed object whose JSON is what results.json holds.

    Unknown keys are refused on load, so a result file from another vitpos version fails
    loudly rather than rendering half-empty."""

    model_config = ConfigDict(extra="forbid")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]):
        return cls.model_validate(doc)


def omit_unmeasured(model: BaseModel, doc: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    """`doc` (the JSON of `model`) without those of `keys` whose value is None and whose field has a
    default: measurements added later stay out of the JSON of a result written before them, so it reads
    back exactly as it was written. A required field is always written, even None: left out, the JSON
    would not load back (a stage-cache entry would then be recomputed on every resume)."""
    fields = type(model).model_fields
    return {k: v for k, v in doc.items()
            if not (v is None and k in keys and k in fields and not fields[k].is_required())}


class Skipped(BaseModel):
    """An experiment that ran but could not produce its measurement (e.g. no features of a kind)."""

    model_config = ConfigDict(extra="forbid")
    skipped: str
