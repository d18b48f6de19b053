"""Jobs (closures over arrays already in memory) -> run in order on one background thread.

``write``/``pwrite``/``fsync`` and numpy's loops release the GIL, so while one thread copies a piece of
rows into the page cache, waits for the disk or sums statistics, the caller gathers, checks and hashes the
next: on two cores, prepare's compute and its I/O overlap instead of taking turns. At most
``limit_bytes`` of rows wait in the queue (one job is always accepted), which keeps memory within the
chunk budget. The first failure stops the queue; it is raised in the caller at its next ``submit`` or
``drain``.

    >>> with BackgroundJobs(64 << 20) as writer:     # doctest: +SKIP
    ...     writer.submit(lambda: os.pwrite(fd, rows.data, offset), rows.nbytes)
    ...     writer.drain()                           # every job done (or its error raised here)
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType


class BackgroundJobs:
    """A queue of jobs and the thread that runs them; leaving the ``with`` block stops the thread."""

    def __init__(self, limit_bytes: int):
        self._limit = limit_bytes
        self._cond = threading.Condition()
        self._jobs: deque[tuple[Callable[[], None], int]] = deque()
        self._queued = 0
        self._busy = False
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="memtrain-background", daemon=True)
        self._thread.start()

    def __enter__(self) -> BackgroundJobs:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(cancel=kind is not None)

    def submit(self, job: Callable[[], None], nbytes: int = 0) -> None:
        """Queue ``job`` (which must not share mutable state with the caller); waits while the queue is full."""
        with self._cond:
            while self._error is None and self._jobs and self._queued + nbytes > self._limit:
                self._cond.wait()
            self._raise_failure()
            self._jobs.append((job, nbytes))
            self._queued += nbytes
            self._cond.notify_all()

    def drain(self) -> None:
        """Wait until every queued job has run; raise the first failure."""
        with self._cond:
            while self._error is None and (self._jobs or self._busy):
                self._cond.wait()
            self._raise_failure()

    def stop(self, *, cancel: bool) -> None:
        """End the thread: after the queued jobs, or (``cancel``) after the running one only. Never raises."""
        with self._cond:
            if cancel:
                self._jobs.clear()
                self._queued = 0
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if not self._jobs:
                    return
                job, nbytes = self._jobs.popleft()
                self._busy = True
                self._cond.notify_all()  # room in the queue
            failure = None
            try:
                job()
            except BaseException as exc:  # handed to the caller, who decides what it means
                failure = exc
            with self._cond:
                self._busy = False
                self._queued -= nbytes
                if failure is not None and self._error is None:
                    self._error = failure
                    self._jobs.clear()
                    self._queued = 0
                self._cond.notify_all()
