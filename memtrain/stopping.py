"""SIGINT/SIGTERM -> a callback that records the request; the caller stops at a point of its choosing.

Used by the training server (between updates) and by ``serve`` (at the next turn of its loop), so that a
stop never lands in the middle of bookkeeping. Handlers are installed only in the main thread (the only
one Python lets install them) and the previous handlers are restored on exit.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def on_stop_signals(record: Callable[[int], None]) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM call ``record(signum)`` instead of interrupting the program."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        record(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
