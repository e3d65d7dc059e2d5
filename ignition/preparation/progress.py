"""Progress display for long preparation steps (loading, compiling, capturing)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


@contextmanager
def phase(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar for one phase; yields ``advance(n)``. Plain lines when not a TTY."""
    if not sys.stderr.isatty():
        done = 0
        console.print(f"{description}: 0/{total}")

        def advance_plain(n: int = 1) -> None:
            nonlocal done
            done += n

        yield advance_plain
        console.print(f"{description}: {done}/{total} done")
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task(description, total=total)

        def advance(n: int = 1) -> None:
            progress.advance(task, n)

        yield advance
