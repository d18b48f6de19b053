"""SIGINT/SIGTERM/SIGHUP -> a callback that records the request; the caller stops at a point of its choosing.

Used by the training server (between updates) and by ``serve`` (at the next turn of its loop), so that a
stop never lands in the middle of bookkeeping. Handlers are installed only in the main thread (the only
one Python lets install them) and the previous handlers are restored on exit. SIGHUP (the terminal was
closed) is a stop request like the others: a run in a closed terminal checkpoints and says so in its log.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from memtrain.errors import Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def on_stop_signals(record: Callable[[int], None]) -> Iterator[None]:
    """While inside, SIGINT, SIGTERM and SIGHUP call ``record(signum)`` instead of interrupting the program."""
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


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, with SIGHUP ignored (ignored signals survive ``exec``).

    The tracker (which unlinks the worker queues' semaphores if the server dies) ignores SIGINT and SIGTERM
    itself, but not SIGHUP: closing the terminal would kill it along with the server's process group, and
    the server would then relaunch it with a "process died unexpectedly" warning and leak semaphores.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    from multiprocessing import resource_tracker

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


@dataclass
class StopRequest:
    """Set by SIGINT/SIGTERM/SIGHUP.

    Until training starts (``deferred`` False) a stop raises at once, wherever start-up is (opening or
    verifying the dataset, creating the run directory): there is nothing to save yet, and every step of it
    cleans up after itself. From then on a stop is only recorded; the server looks at it between updates,
    so it never lands mid-bookkeeping, and the run checkpoints where it stands.
    """

    signum: int | None = None
    deferred: bool = False

    def record(self, signum: int) -> None:
        self.signum = self.signum or signum
        if not self.deferred:
            self.deferred = True  # a second signal during the unwinding must not interrupt the cleanup
            error = Interrupted(f"stopped by {signal.Signals(signum).name} during start-up, before training began",
                                hint="nothing was trained; run the same command again to start")
            error.exit_code = 128 + signum
            raise error

    @property
    def requested(self) -> bool:
        return self.signum is not None
