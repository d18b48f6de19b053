"""Messages out, answers back: where the work runs -- worker processes on this machine, or the server itself.

``Transport`` is the interface the scheduler drives: ``send`` a message to a slot, ``wait`` for answers
and deaths, ``kill`` a slot's process. Two implementations:

- ``WorkerPool``: one process per slot, started with ``spawn``, two pipes each: train/worker/pool.py's pool
  (a node of a two-level round starts one too), its processes running ``worker_main``.
- ``InServer``: one slot, no process: ``send`` runs the message in the server right away (the same
  ``WorkerState``, the same files and arithmetic) and ``wait`` hands back its answer.

Only ``messages`` records cross a transport. Across machines a third implementation,
``cluster.transport.ClusterPool`` (one Dask actor per Dask worker), carries the same records; it is sent
tasks only, never a stretch: workers on other machines cannot meet at marks, so a cluster run streams
the round (train/loops/stream.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from memtrain.train.messages import Event, Message, SetAside, Slot, WorkerSetup
from memtrain.train.worker import pool
from memtrain.train.worker.worker import WorkerState, worker_main

if TYPE_CHECKING:
    from memtrain.train.server.outline import KeptWorker


class WorkerPool(pool.WorkerPool):
    """The server's workers: train/worker/pool.py's pool whose processes run ``worker_main``."""

    def __init__(self, setup: WorkerSetup, count: int, adopt: KeptWorker | None = None, max_starts: int = 3):
        super().__init__(setup, count, target=worker_main, adopt=adopt, max_starts=max_starts)


class InServer:
    """The server as its own single worker: ``send`` runs the message here and now."""

    def __init__(self, state: WorkerState):
        self.state = state
        self.slots = [Slot(0, None, ready=True)]
        self.aside = SetAside()  # the Transport's (its one slot is never set aside: it has no peers)
        self._events: list[Event] = []

    def send(self, slot: Slot, message: Message) -> None:
        slot.current, slot.since = message, time.monotonic()
        answer = self.state.handle(message)
        slot.current = None
        self._events.append(Event(slot, answer, message))

    def wait(self, timeout: float) -> list[Event]:
        events, self._events = self._events, []
        return events

    def kill(self, slot: Slot) -> None:
        raise AssertionError("the server's own slot is never killed")

    def close(self, timeout: float = 5.0) -> None:
        self._events.clear()
