"""A running job's process id -> one of its worker processes stopped from outside a fraction of the time.

The straggler of issue 32: a worker that loses the core to something else, at any point of its work (in
a gradient, holding a lock, between two meetings), not only where the ``MEMTRAIN_STRAGGLER`` hook sleeps.
Every ``PERIOD`` seconds the worker gets SIGSTOP for ``stopped`` of the period and SIGCONT for the rest;
with ``--straggler 3`` it is stopped two thirds of the time, so it runs at a third of its speed. The
worker is the first process below the job's that multiprocessing spawned to run a function
(``spawn_main`` in its command line; its resource tracker is not one).

A run with no worker process is not straggled at all: with ``train.workers = "auto"`` a small model (the
README's digits MLP) trains in the server, in both modes, so a straggler that stops "one worker" stops
nothing, and the ratio it gives compares two unslowed in-server runs (issue 32's 1.46x: no stop was made,
which is why the async run showed no stale gradient from a stopped worker). ``check`` refuses such a run.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from memtrain.benchmarks.memory import descendants
from memtrain.errors import MemtrainError

PERIOD = 0.03  # seconds: several of the small models' updates, a fraction of the large models' tasks
FIND_EVERY = 0.02  # seconds between looks for the worker while the job starts


def is_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
    except OSError:
        return False
    return b"spawn_main" in command and b"resource_tracker" not in command


class OutsideStraggler(threading.Thread):
    """Stops one worker of the process tree under ``root`` for ``stopped`` (0-1) of every PERIOD, until
    ``finish``; ``stops`` counts the stops made (0: no worker was ever found)."""

    def __init__(self, root: int, stopped: float):
        super().__init__(daemon=True)
        if not 0 <= stopped < 1:
            raise ValueError(f"the stopped fraction must be in [0, 1), not {stopped}")
        self.root, self.stopped = root, stopped
        self.stops = 0
        self._done = threading.Event()

    def run(self) -> None:
        worker = self._find()
        while worker is not None and not self._done.is_set():
            try:
                os.kill(worker, signal.SIGSTOP)
                self.stops += 1
                time.sleep(PERIOD * self.stopped)
                os.kill(worker, signal.SIGCONT)
            except ProcessLookupError:
                return
            self._done.wait(PERIOD * (1 - self.stopped))

    def finish(self) -> None:
        """Stop stopping; the worker is left running."""
        self._done.set()
        self.join()

    def check(self, what: str) -> None:
        """MemtrainError if no worker was ever stopped: ``what`` ran unslowed, so it measures no straggler."""
        if self.stops == 0:
            raise MemtrainError(f"{what}: the outside straggler found no worker process to stop, so the run was "
                                "not slowed at all", hint="give the job worker processes (train.workers = 2): with "
                                "train.workers = 'auto' a small model trains in the server")

    def _find(self) -> int | None:
        while not self._done.wait(FIND_EVERY):
            workers = sorted(pid for pid in descendants(self.root) if pid != self.root and is_worker(pid))
            if workers:
                return workers[0]
        return None


def run_straggled(command: list[str], stopped: float, what: str) -> float:
    """Run ``command`` (a whole ``memtrain train``) to its end, one of its workers stopped ``stopped`` of the time
    when > 0 (checked to have been stopped: ``what`` names the run in that check's error); its wall seconds."""
    import subprocess

    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    straggler = OutsideStraggler(process.pid, stopped) if stopped else None
    if straggler is not None:
        straggler.start()
    _, stderr = process.communicate()
    seconds = time.perf_counter() - started
    if straggler is not None:
        straggler.finish()
        straggler.check(what)
    if process.returncode != 0:
        raise SystemExit(f"memtrain train failed (exit {process.returncode}): {stderr[-2000:]}")
    return seconds
