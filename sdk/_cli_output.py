"""What the ``ketten`` commands print: tables, progress bars, events as text or JSON.

Data goes to stdout, one record a line with ``--json``. Progress bars go to
stderr and only when it is a terminal, so piped output stays clean.
"""

from __future__ import annotations

import base64
import datetime
import json
import sys
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from ._core.event import Event

__all__ = [
    "ProgressBar",
    "emit_json",
    "event_line",
    "event_record",
    "json_option",
    "payload_text",
    "print_table",
    "progress_bar",
]

F = TypeVar("F", bound=Callable[..., Any])


def json_option(help_text: str) -> Callable[[F], F]:
    """The ``--json`` flag of a command that prints data."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def emit_json(value: Any) -> None:
    """One JSON document on one line of stdout."""
    click.echo(json.dumps(value, separators=(",", ":")))


def _stdout_console() -> Console:
    # A terminal sets the width; piped output is never wrapped (keys stay whole).
    interactive = sys.stdout.isatty()
    return Console(highlight=False, width=None if interactive else 1 << 15,
                   no_color=not interactive)


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]], *,
                right: Sequence[str] = ()) -> None:
    """A table on stdout: a header row, then one line per row."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    _stdout_console().print(table)


class ProgressBar:
    """Advances a progress display; does nothing when there is none."""

    def __init__(self, progress: Progress | None = None, description: str = "") -> None:
        self._progress = progress
        self._task = progress.add_task(description, total=None) if progress else None

    def advance(self, amount: float = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, amount)

    def update(self, completed: float, total: float | None = None) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=completed, total=total)

    def add_total(self, amount: float) -> None:
        if self._progress is not None and self._task is not None:
            task = self._progress.tasks[self._task]
            self._progress.update(self._task, total=(task.total or 0) + amount)


@contextmanager
def progress_bar(description: str) -> Iterator[ProgressBar]:
    """A progress bar on stderr while the block runs, if stderr is a terminal."""
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    if not console.is_terminal:
        yield ProgressBar()
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    # Lines printed meanwhile go above the bar when stdout is the same terminal.
    with Progress(*columns, console=console, transient=True,
                  redirect_stdout=sys.stdout.isatty(), redirect_stderr=False) as progress:
        yield ProgressBar(progress, description)


def payload_text(payload: bytes) -> str | None:
    """The payload as text if it is UTF-8, else ``None``."""
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _escape_controls(text: str) -> str:
    # One event, one line: newlines and other control characters are escaped.
    if text.isprintable():
        return text
    return "".join(json.dumps(ch)[1:-1] if unicodedata.category(ch) == "Cc" else ch
                   for ch in text)


def event_record(event: Event) -> dict[str, Any]:
    """An event as a JSON object: the payload as text, or base64 if it is not UTF-8."""
    text = payload_text(event.payload)
    return {
        "criterion": event.criterion.hex(),
        "seq": event.seq,
        "hash": event.hash.hex(),
        "author": event.author.hex(),
        "time": event.time,
        "payload": text if text is not None else base64.b64encode(event.payload).decode(),
        "encoding": "utf-8" if text is not None else "base64",
    }


def _time_text(ms: int) -> str:
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_line(event: Event) -> str:
    """``SEQ  TIME  PAYLOAD``: the payload as text if it is UTF-8, else in hex."""
    text = payload_text(event.payload)
    shown = _escape_controls(text) if text is not None else event.payload.hex()
    return f"{event.seq:>6}  {_time_text(event.time)}  {shown}"
