"""sys.stdout/sys.stderr -> best-effort streams: a reader that left never stops memtrain.

``memtrain train JOB | head -2``, a closed terminal or a closed pipe make writes to stdout or stderr fail
(EPIPE, EIO). Console output is for people; the run's own record is its files (events.log, metrics.jsonl).
So a failed console write switches that stream off for the rest of the process -- its descriptor is
pointed at /dev/null, so that the interpreter's final flush and any C-level writer fail no more -- and the
command goes on. Nothing is retried and nothing is reported: there is nobody left to read it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class Guarded:
    """Wraps a text stream; ``write``/``flush`` never raise OSError, and after one failure write nothing."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._stream.write(text)
            except (OSError, ValueError):  # ValueError: the stream was closed
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._lose()

    def _lose(self) -> None:
        self.lost = True
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no descriptor: nothing to redirect
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding... as the wrapped stream says
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_streams() -> Iterator[None]:
    """While inside, writes to sys.stdout and sys.stderr never raise: a lost reader is ignored."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Guarded(sys.stdout), Guarded(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
