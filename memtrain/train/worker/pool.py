"""The pool of worker processes on one machine: one process per slot, started with ``spawn``, two pipes each.

This module makes two pipes per slot (messages in, answers out) and hands the worker its ends; the worker reads
only its inbox and writes only its outbox (train/worker/worker.py). No pipe is shared between workers, so a
worker killed in the middle of a write can wedge only its own slot, which is replaced with fresh pipes. Every
wait watches the answer pipes and the process sentinels together and has a bound, so a death is seen at once.
A worker that dies before it said Ready could not start (it sends its error first, ``StartFailed``):
``max_starts`` such deaths in a row, with no worker started in between, stop the run quoting the last error
(``WorkerFailure``), wherever the pool is waited on -- a replacement that cannot start either would otherwise
be replaced forever.

It lives beside the worker, not in the server, because two hosts start pools: the server (its workers), and a
node of a two-level round (its processes, train/loops/node_compute.py). Each passes the process's ``target``
(``worker_main``), so this module imports neither.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

from memtrain.errors import WorkerFailure, plural
from memtrain.train.messages import Event, Message, Ready, SetAside, Slot, StartFailed, Stop, WorkerSetup
from memtrain.train.worker.launch import script_not_rerun

# Workers start with `spawn`: never fork a server that may hold threads, BLAS pools or HDF5 handles.
START_METHOD = "spawn"


class WorkerPool:
    """Worker slots; a dead worker's slot gets a new process and new pipes.

    ``adopt``: a kept outline child (train/server/outline.py), the first slot's process, sent ``setup`` rather than
    started. ``grow`` starts more workers on the side (``pending``: not in ``slots``, so sent nothing, until
    ``ready`` sees them all started), ``shrink`` stops the last ones."""

    def __init__(self, setup: WorkerSetup, count: int, *, target: Callable[..., None], adopt: Any = None,
                 max_starts: int = 3):
        self._context = multiprocessing.get_context(START_METHOD)
        self._target = target  # what each process runs: worker_main(setup, inbox, outbox)
        self._setup = setup
        self.max_starts = max_starts  # train.max_attempts: workers that could not start, in a row, stop the run
        self.failed_starts = 0  # in a row: a worker that starts resets it
        # One poll set for the pool's life, changed only when a slot is replaced: building a selector per
        # wait (multiprocessing.connection.wait) cost the server more than the wait's system call.
        self._poll = select.poll()
        self._by_fd: dict[int, tuple[int, bool]] = {}  # answer pipe or sentinel -> (slot index, is sentinel)
        self.pending: list[Slot] = []
        self.aside = SetAside()  # the stragglers the scheduler sets aside (train/messages.py)
        self.slots = [self._adopt(adopt) if index == 0 and adopt is not None else self._start(index)
                      for index in range(count)]

    def _start(self, index: int) -> Slot:
        worker_in, inbox = self._context.Pipe(duplex=False)
        outbox, worker_out = self._context.Pipe(duplex=False)
        process = self._context.Process(target=self._target, args=(self._setup, worker_in, worker_out),
                                        name=f"memtrain-worker-{index}", daemon=True)
        with script_not_rerun(self._setup.model_kind):
            process.start()
        worker_in.close()  # the worker has its own copies; without ours, its death reads as end-of-file
        worker_out.close()
        return self._watch(Slot(index, process, inbox, outbox))

    def _adopt(self, kept: Any) -> Slot:
        slot = self._watch(Slot(0, kept.process, kept.inbox, kept.outbox))
        with contextlib.suppress(OSError):  # it died already: its sentinel reports the death
            kept.inbox.send(self._setup)
        return slot

    def _watch(self, slot: Slot) -> Slot:
        for fd, sentinel in ((slot.outbox.fileno(), False), (slot.process.sentinel, True)):
            self._poll.register(fd, select.POLLIN)
            self._by_fd[fd] = (slot.index, sentinel)
        return slot

    def _slot(self, index: int) -> Slot:
        return self.slots[index] if index < len(self.slots) else self.pending[index - len(self.slots)]

    def grow(self, count: int) -> None:
        """Start workers up to ``count`` slots; they join ``slots`` when ``ready`` sees them all started."""
        self.pending += [self._start(index) for index in range(len(self.slots) + len(self.pending), count)]

    def shrink(self, count: int, timeout: float = 5.0) -> None:
        """Stop the idle workers beyond the first ``count`` slots."""
        leaving, self.slots = self.slots[count:], self.slots[:count]
        self._stop(leaving, timeout)

    def ready(self) -> bool:
        """Every worker has started (polls without blocking); started ones that were pending join ``slots``."""
        self.wait(0)
        if self.pending and all(slot.ready for slot in self.pending):
            self.slots, self.pending = self.slots + self.pending, []
        return not self.pending and all(slot.ready for slot in self.slots)

    def send(self, slot: Slot, message: Message) -> None:
        slot.current, slot.since = message, time.monotonic()
        with contextlib.suppress(OSError):  # it died since the last wait (EPIPE): its sentinel reports the death
            slot.inbox.send(message)

    def wait(self, timeout: float) -> list[Event]:
        """Answers and deaths, waiting at most ``timeout`` seconds for the first one (a pending worker's death
        only replaces it)."""
        events, dead = [], []
        for fd, _ in self._poll.poll(max(0, math.ceil(timeout * 1000))):
            index, sentinel = self._by_fd[fd]
            if sentinel:
                dead.append(self._slot(index))
            else:
                events.extend(self._drain(self._slot(index)))
        for slot in dead:
            events.extend(self._drain(slot))
            slot.process.join()
            if not slot.ready:
                self._failed_start(slot)
            if slot not in self.pending:
                events.append(Event(slot, None, slot.current, slot.process.exitcode, started=slot.ready))
            self._replace(slot)
        return events

    def _failed_start(self, slot: Slot) -> None:
        """A worker died before it said Ready: the ``max_starts``-th such death in a row stops the run (raises),
        quoting what the worker said, before a replacement is started."""
        self.failed_starts += 1
        if self.failed_starts < self.max_starts:
            return
        said = f":\n{slot.error.rstrip()}" if slot.error else \
            f" (it said nothing: exit code {slot.process.exitcode})"
        raise WorkerFailure(f"worker processes could not start {plural(self.failed_starts, 'time')} in a row; the "
                            f"last, worker {slot.index} (pid {slot.pid}), exited with code {slot.process.exitcode}"
                            f"{said}")

    def _drain(self, slot: Slot) -> list[Event]:
        events = []
        while slot.outbox.poll(0):
            try:
                answer = slot.outbox.recv()
            except (EOFError, OSError):
                break
            if isinstance(answer, Ready):
                slot.ready, self.failed_starts = True, 0
                continue
            if isinstance(answer, StartFailed):
                slot.error = answer.error
                continue
            events.append(Event(slot, answer, slot.current))
            slot.current = None
        return events

    def kill(self, slot: Slot) -> None:
        """Kill a hung worker (SIGKILL works on a SIGSTOPped process too); its death is reported by wait."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(slot.process.pid, signal.SIGKILL)

    def _unwatch(self, slot: Slot) -> None:
        for fd in (slot.outbox.fileno(), slot.process.sentinel):
            self._poll.unregister(fd)
            del self._by_fd[fd]
        for end in (slot.inbox, slot.outbox):
            end.close()

    def _replace(self, slot: Slot) -> None:
        self._unwatch(slot)
        members = self.pending if slot in self.pending else self.slots
        members[members.index(slot)] = self._start(slot.index)

    def pids(self) -> list[int]:
        return [slot.process.pid for slot in self.slots + self.pending]

    def close(self, timeout: float = 5.0) -> None:
        """Ask every worker to stop, then make sure: no worker outlives the pool."""
        leaving, self.slots, self.pending = self.slots + self.pending, [], []
        self._stop(leaving, timeout)

    def _stop(self, leaving: list[Slot], timeout: float) -> None:
        for slot in leaving:
            with contextlib.suppress(OSError, ValueError):
                if slot.idle:
                    slot.inbox.send(Stop())
        deadline = time.monotonic() + timeout
        for slot in leaving:
            slot.process.join(max(0.0, deadline - time.monotonic()) if slot.idle else 0)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join()
            self._unwatch(slot)
