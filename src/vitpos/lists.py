"""One parser for every comma-list option (--sites, --restore, --layers, --windows, --scales, --models,
--data): an empty list, an empty item (`a,,b`, a trailing comma) or an item given twice is one
VitposError naming the option and the fix, never a silent default or a silently shortened list."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from vitpos.errors import VitposError

T = TypeVar("T", bound=Hashable)


def comma_items(text: str, flag: str, example: str, *, distinct: bool = True) -> list[str]:
    """The stripped items of `text` ('a, b' -> ['a', 'b']); refused: no item at all, an empty item,
    and (distinct) the same item twice."""
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise VitposError(f"{flag} is empty; give at least one item, e.g. {flag} {example}")
    if not all(items):
        raise VitposError(f"{flag} {text!r} has an empty item (a stray or trailing comma); separate items with "
                          f"single commas, e.g. {flag} {example}")
    if distinct:
        check_distinct(items, text, flag, example)
    return items


def check_distinct(values: Sequence[T], text: str, flag: str, example: str, show: Callable[[T], str] = str) -> None:
    """Refuse a value that occurs twice (`--restore 1,1`): each item is computed once, so a repeat
    is a typo, not a request."""
    seen: set[T] = set()
    for v in values:
        if v in seen:
            raise VitposError(f"{flag} {text!r} names {show(v)} twice; give each item once, e.g. {flag} {example}")
        seen.add(v)


def parsed_items(text: str, flag: str, example: str, parse: Callable[[str], T], kind: str) -> list[T]:
    """comma_items, each parsed (`int`, `float`, ...); an item that does not parse is refused naming
    `kind` ('layer numbers'), and values equal after parsing ('1,01') count as the same item."""
    items = comma_items(text, flag, example, distinct=False)
    try:
        values = [parse(t) for t in items]
    except ValueError:
        raise VitposError(f"{flag} takes a comma list of {kind}, e.g. {flag} {example} (got {text!r})") from None
    check_distinct(values, text, flag, example)
    return values
