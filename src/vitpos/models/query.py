"""A model SPEC's query values (`timm:NAME?k=v`, `hf:NAME?k=v`), parsed alike for every family; below
both the spec loader and the family adapters it dispatches to."""

from __future__ import annotations


def parse_query_value(text: str):
    """A spec query's value: true/false, an int, a float, else the text (timm: and hf: specs alike)."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text
