"""One rich progress bar style for every long loop; silent when disabled or not a terminal."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class _Silent:
    def add_task(self, *a, **k) -> TaskID:
        return TaskID(0)

    def update(self, *a, **k) -> None:
        pass

    def advance(self, *a, **k) -> None:
        pass


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Progress | _Silent]:
    if not enabled:
        yield _Silent()
        return
    # stderr: stdout carries the command's result line, which scripts read
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), transient=False, console=Console(stderr=True))
    with bar:
        yield bar
