"""Tasks out, results back: worker processes, one task queue and one result queue per worker slot.

Only ``messages`` records cross the queues. No queue is shared between workers: a worker killed while it
holds a queue's lock can then wedge only its own slot, which is replaced with fresh queues. Every wait
watches the result pipes and the process sentinels together and has a bound, so a death is seen at once.
This is the one module that knows how tasks reach workers; another dispatcher (Dask, Ray) would replace it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from multiprocessing.queues import SimpleQueue
from pathlib import Path
from typing import Any

from memtrain.train.gradbuf import remove_buffers
from memtrain.train.launch import script_not_rerun
from memtrain.train.messages import Result, Stop, Task, WorkerSetup
from memtrain.train.worker import worker_main

# Workers start with `spawn`: never fork a server that may hold threads, BLAS pools or HDF5 handles.
START_METHOD = "spawn"


@dataclass
class Slot:
    index: int
    process: Any
    tasks: SimpleQueue
    results: SimpleQueue
    current: Task | None = None
    since: float = 0.0

    @property
    def idle(self) -> bool:
        return self.current is None


@dataclass(frozen=True)
class Event:
    """A result from a slot, or the death of its process (``result`` None, ``exitcode`` set)."""

    slot: Slot
    result: Result | None
    exitcode: int | None = None
    task: Task | None = None


class WorkerPool:
    """A fixed number of worker slots; a dead worker's slot gets a new process and new queues."""

    def __init__(self, setup: WorkerSetup, count: int):
        self._context = multiprocessing.get_context(START_METHOD)
        self._setup = setup
        self.slots = [self._start(index) for index in range(count)]
        self.restarts = 0
        self.started = [slot.process.pid for slot in self.slots]  # every worker pid ever started

    def _start(self, index: int) -> Slot:
        tasks, results = self._context.SimpleQueue(), self._context.SimpleQueue()
        process = self._context.Process(target=worker_main, args=(replace(self._setup, slot=index), tasks, results),
                                        name=f"memtrain-worker-{index}", daemon=True)
        with script_not_rerun(self._setup.model_kind):
            process.start()
        return Slot(index, process, tasks, results)

    def idle_slots(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.idle]

    def send(self, slot: Slot, task: Task) -> None:
        slot.current, slot.since = task, time.monotonic()
        slot.tasks.put(task)

    def wait(self, timeout: float) -> list[Event]:
        """Results and deaths, waiting at most ``timeout`` seconds for the first one."""
        by_reader = {slot.results._reader: slot for slot in self.slots}
        by_sentinel = {slot.process.sentinel: slot for slot in self.slots}
        ready = wait([*by_reader, *by_sentinel], timeout)
        events, dead = [], []
        for handle in ready:
            if handle in by_reader:
                events.extend(self._drain(by_reader[handle]))
            else:
                dead.append(by_sentinel[handle])
        for slot in dead:
            events.extend(self._drain(slot))
            slot.process.join()
            events.append(Event(slot, None, slot.process.exitcode, slot.current))
            self._replace(slot)
        return events

    def _drain(self, slot: Slot) -> list[Event]:
        events = []
        while slot.results._reader.poll(0):
            try:
                result = slot.results.get()
            except (EOFError, OSError):
                break
            events.append(Event(slot, result, task=slot.current))
            slot.current = None
        return events

    def kill(self, slot: Slot) -> None:
        """Kill a hung worker (SIGKILL works on a SIGSTOPped process too); its death is reported by wait."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(slot.process.pid, signal.SIGKILL)

    def _replace(self, slot: Slot) -> None:
        self.restarts += 1
        remove_buffers(Path(self._setup.exchange_dir), slot.process.pid)
        fresh = self._start(slot.index)
        self.started.append(fresh.process.pid)
        self.slots[slot.index] = fresh

    def pids(self) -> list[int]:
        return [slot.process.pid for slot in self.slots]

    def close(self, timeout: float = 5.0) -> None:
        """Ask every worker to stop, then make sure: no worker outlives the pool."""
        for slot in self.slots:
            with contextlib.suppress(OSError, ValueError):
                if slot.idle:
                    slot.tasks.put(Stop())
        deadline = time.monotonic() + timeout
        for slot in self.slots:
            slot.process.join(max(0.0, deadline - time.monotonic()) if slot.idle else 0)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join()
