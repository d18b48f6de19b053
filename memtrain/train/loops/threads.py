"""An update's gradient tasks on a few threads of the server: the calling thread and persistent helpers.

When the server runs the rounds itself (train/loops/rounds.py) it may compute an update's tasks concurrently
(``train.server_threads``, chosen in train/server/placement.py): numpy releases the GIL inside BLAS and most
ufuncs, so two threads compute at once. Each task is computed exactly as alone -- its rows, its gradient
into its own task buffer, its loss and seconds, BLAS on ``train.blas_threads`` (1) thread -- and the step
adds the buffers in task order afterwards, so the weights are bitwise those of the sequential server.

``TaskThreads`` hands work over with two locks per helper (one each way): a handoff costs a wake-up, not
a queue. Job ``i`` of a call runs on thread ``i % count`` (thread 0 is the caller), so a thread sees the
same task slots every update and its own row reader keeps their rows. A job's exception is raised in the
caller once every thread is done with the call (no thread writes a buffer after ``run`` returns or
raises): the first failed job's, in job order, as the sequential loop would have raised it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

JOIN_SECONDS = 60.0  # how long ``close`` waits for a helper's task in flight (a stop mid-update) before leaving it


class TaskThreads:
    """The caller plus ``count - 1`` helper threads, started here and stopped by ``close`` (or ``with``)."""

    def __init__(self, count: int):
        if count < 1:
            raise ValueError(f"TaskThreads needs at least 1 thread, got {count}")
        self.helpers = [_Helper(index) for index in range(1, count)]

    @property
    def count(self) -> int:
        return len(self.helpers) + 1

    def run(self, jobs: Sequence[Callable[[int], Any]]) -> list[Any]:
        """Each job called with its thread's index (0: the caller); their results, in job order."""
        count = self.count
        given = [helper for helper in self.helpers if helper.give(jobs[helper.index::count])]
        outcomes = [None] * len(jobs)
        outcomes[::count] = [_attempt(job, 0) for job in jobs[::count]]
        for helper in given:
            outcomes[helper.index::count] = helper.collect()
        for outcome in outcomes:
            if isinstance(outcome, _Failed):
                raise outcome.error
        return outcomes

    def close(self) -> None:
        """Stop every helper (after the task it is computing, if any)."""
        for helper in self.helpers:
            helper.stop()

    def __enter__(self) -> TaskThreads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def _attempt(job: Callable[[int], Any], thread: int) -> Any:
    try:
        return job(thread)
    except BaseException as error:  # noqa: BLE001 - raised again in the caller, in job order
        return _Failed(error)


class _Helper:
    """One persistent thread: ``give`` releases ``_go``, the thread runs the jobs and releases ``_done``."""

    def __init__(self, index: int):
        self.index = index
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._jobs: Sequence[Callable[[int], Any]] | None = None
        self._outcomes: list[Any] = []
        self._busy = False
        self.thread = threading.Thread(target=self._loop, name=f"memtrain-task-thread-{index}", daemon=True)
        self.thread.start()

    def give(self, jobs: Sequence[Callable[[int], Any]]) -> bool:
        """Start ``jobs`` on this thread; False (nothing started) if there are none."""
        if not jobs:
            return False
        self._jobs, self._busy = jobs, True
        self._go.release()
        return True

    def collect(self) -> list[Any]:
        """Wait for the jobs given: their results, or ``_Failed``."""
        self._done.acquire()
        self._busy = False
        return self._outcomes

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        if self._busy and not self._done.acquire(timeout=JOIN_SECONDS):  # a caller interrupted mid-update
            return  # a daemon thread: it cannot keep the process alive
        self._busy, self._jobs = False, None
        self._go.release()
        self.thread.join(JOIN_SECONDS)

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            jobs = self._jobs
            if jobs is None:
                return
            self._outcomes = [_attempt(job, self.index) for job in jobs]
            self._done.release()
