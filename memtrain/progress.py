"""Progress for people: a rich bar on a terminal, plain lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

# A bench runs for minutes, one measured run after another: on a terminal a bar on stderr names the run under
# way; in a log (stderr not a terminal) a line every BENCH_EVERY seconds at most. Its tables go to stdout alone.
BENCH_EVERY = 10.0
# The bar's columns never shrink (a squeezed column shows "0:0…" for its elapsed time): the bar is BAR wide
# and the info text, the one column that can give way, is cut in the middle to the room the others leave.
BAR = 10
TIME = len("0:00:00")


def console(stderr: bool = True) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def may_be_a_terminal() -> bool:
    """False where rich's ``Console.is_terminal`` is sure to say no (stderr not a terminal, neither FORCE_COLOR nor
    TTY_COMPATIBLE=1 set): every `memtrain` process whose stderr is a log or a pipe (each run's workers, servers
    under a service, the tests' thousands of commands) then prints plain lines without importing rich (40 ms of
    CPU a process). Where it may be one, rich decides."""
    try:
        on_a_tty = sys.stderr is not None and sys.stderr.isatty()
    except ValueError:  # closed
        on_a_tty = False
    return on_a_tty or os.environ.get("TTY_COMPATIBLE") == "1" or bool(os.environ.get("FORCE_COLOR"))


class Reporter:
    """Reports progress of one long step; ``update(done, **fields)``, ``line(text)``."""

    def __init__(self, progress: Progress | None, task_id: int | None, label: str, total: float,
                 plain_every: float):
        self._progress = progress
        self._task = task_id
        self._label = label
        self._total = total
        self._plain_every = plain_every
        self._last_plain = 0.0
        self._start = time.monotonic()
        self._begun = 0

    def update(self, done: float, info: str = "") -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, info=self._fit(info))
            return
        now = time.monotonic()
        if now - self._last_plain >= self._plain_every:
            self._last_plain = now
            pct = 100.0 * done / self._total if self._total else 100.0
            print(f"{self._label}: {pct:5.1f}% {info}".rstrip(), file=sys.stderr, flush=True)

    def _fit(self, info: str) -> str:
        """``info`` cut in the middle to the room the bar's fixed columns leave on the terminal's line."""
        from memtrain.inspection.render import elide_middle

        count = len(str(int(self._total)))
        fixed = len(self._label) + BAR + (2 * count + 1) + len("100%") + 2 * TIME + 6  # 6: a space between each
        return elide_middle(info, max(0, self._progress.console.width - fixed)) if info else info

    def begin(self, info: str) -> None:
        """The next of ``total`` items starts, ``info`` says which: the ones before it count as done."""
        self.update(self._begun, f"{info} ({self._begun + 1} of {self._total:g})")
        self._begun += 1

    def line(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, markup=False)
        else:
            print(text, file=sys.stderr, flush=True)


class Silent(Reporter):
    """``--quiet``: reports nothing."""

    def __init__(self) -> None:
        super().__init__(None, None, "", 0, 0.0)

    def update(self, done: float, info: str = "") -> None:
        pass

    def line(self, text: str) -> None:
        pass


@contextmanager
def reporting(label: str, total: float, *, plain_every: float = 5.0, force_plain: bool = False,
              quiet: bool = False) -> Iterator[Reporter]:
    """A progress bar when stderr is a terminal, otherwise a plain line at most every ``plain_every`` s.

    The bar is transient: it disappears when the step ends, leaving only the lines printed with ``line``.
    """
    if quiet:
        yield Silent()
        return
    out = console() if not force_plain and may_be_a_terminal() else None
    if out is None or not out.is_terminal:
        yield Reporter(None, None, label, total, plain_every)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column

    columns = (TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True)),
               BarColumn(bar_width=BAR, table_column=Column(no_wrap=True)),
               MofNCompleteColumn(table_column=Column(no_wrap=True)),
               TaskProgressColumn(table_column=Column(no_wrap=True)),
               TextColumn("{task.fields[info]}", markup=False, table_column=Column(no_wrap=True)),
               TimeElapsedColumn(table_column=Column(no_wrap=True)),
               TimeRemainingColumn(table_column=Column(no_wrap=True)))
    with Progress(*columns, console=out, transient=True) as progress:
        task_id = progress.add_task(label, total=total, info="")
        yield Reporter(progress, task_id, label, total, plain_every)
