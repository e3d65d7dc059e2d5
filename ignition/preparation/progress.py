"""Progress display for long preparation steps (loading, compiling, capturing)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


@contextmanager
def phase(description: str, total: int) -> Iterator[Callable[..., None]]:
    """A progress bar for one phase; yields ``advance(n=1, label=None)``. Plain lines
    when not a TTY: then each advance that names its item prints the item and the
    seconds since the previous advance (a log shows which item took the time)."""
    if not sys.stderr.isatty():
        done = 0
        console.print(f"{description}: 0/{total}")
        last = time.perf_counter()

        def advance_plain(n: int = 1, label: str | None = None) -> None:
            nonlocal done, last
            done += n
            now = time.perf_counter()
            if label is not None:
                console.print(f"  {label}: {done}/{total} after {now - last:.1f} s")
            last = now

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

        def advance(n: int = 1, label: str | None = None) -> None:
            progress.advance(task, n)

        yield advance
