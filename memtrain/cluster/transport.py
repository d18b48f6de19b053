"""Messages out, answers back, over Dask: one actor per Dask worker, a Transport like train/exchange.WorkerPool.

It carries tasks only (gradients, evaluation, statistics): across machines the round's participants
cannot meet at marks in a shared file, so a cluster run streams gradient tasks and steps in the server
(train/loops/stream.py); a ``Stretch`` is never sent here.

Measured (``python -m benchmarks.cluster_transports``; docs/cluster.md has the table), a record's
round trip on loopback: an actor method call from a client with ``direct_to_workers`` goes straight to the
worker and back (1.5-2.5 ms under load; the scheduler relaying it costs several times that); a task
submission goes through the scheduler (15-23 ms); a long-running seceded task fed by ``distributed.Queue``
pays scheduler hops both ways (5-11 ms). So each slot is an actor. Actors have
no resilience of their own -- an actor dies with its worker -- and need none: like a local worker's
death, a lost Dask worker is reported as an ``Event`` with its task, which the Scheduler re-runs under a
new attempt number (so it writes a new file; a re-run by Dask with the same arguments could not). A
worker that joins the cluster later gets a slot of its own; one that leaves is seen within
``WATCH_SECONDS`` even when no call of ours was in flight. Losing the scheduler stops the run.

Only the ``messages`` records travel (a few hundred bytes); the arrays stay on the shared filesystem.
"""

from __future__ import annotations

import contextlib
import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrain.cluster.sharedfs import View, ViewProbe, look, needs_sync, read_back, refuse
from memtrain.errors import MemtrainError
from memtrain.layout import partial_name, statistics_dir
from memtrain.train.exchange.area import STREAMED_GRADIENT
from memtrain.train.messages import Event, GradTask, Result, SetAside, StatsTask, Task, WorkerSetup
from memtrain.train.timing import UNTIMED, Timer, timed

START_SECONDS = 120.0  # for the actors of the first workers to open the dataset and answer the view check
JOIN_SECONDS = 20.0  # the same for workers that join mid-run (the server's loop waits meanwhile)
WATCH_SECONDS = 1.0  # how often the pool asks the scheduler which workers it has
SCHEDULER_SECONDS = 10.0  # a scheduler that does not answer within this is lost
NO_WORKER_SECONDS = 120.0  # a run with no Dask worker at all for this long stops


class ClusterLost(MemtrainError):
    """The Dask scheduler is gone: the run stops with its checkpoints."""


class WorkerLeft(Exception):
    """A Dask worker left the scheduler before its actor started: the actor, bound to it, can never start."""


class ClusterWorker:
    """The actor on a Dask worker: a memtrain WorkerState answering tasks, its files on the shared filesystem.
    ``worker_state(setup, alive=...)`` makes it (train/worker/worker.py's ``WorkerState``, handed down by the pool's
    maker, train/server/pools.py: the cluster runs memtrain's worker without importing it)."""

    def __init__(self, setup: WorkerSetup, token: str, worker_state: Callable[..., Any]):
        from distributed import get_worker

        self.setup, self.token, self.worker_state = setup, token, worker_state
        self.worker = get_worker()  # the Dask worker this actor lives on: its loop and scheduler connection
        self.state: Any = None
        self.sync = False
        self.limits: Any = None

    def start(self, probe: ViewProbe) -> View:
        """Check this worker's view of the run's files; if it matches, open the dataset and the model."""
        view = look(probe, self.token)
        if view.problems:
            return view
        from threadpoolctl import threadpool_limits

        self.limits = threadpool_limits(limits=self.setup.blas_threads)
        self.state = self.worker_state(self.setup, alive=lambda: None)
        self.sync = needs_sync(Path(self.setup.exchange_dir))
        return view

    def run(self, task: Task) -> Result:
        result = self.state.handle(task)
        if self.sync and result.error is None and isinstance(task, GradTask | StatsTask):
            self._sync(task)
        return result

    def follow(self, ident: str, rank: int, members: int, files: bool = False) -> int:
        """This worker's part of a broadcast round (memtrain/cluster/broadcast.py), until the round ends;
        ``files``: a round of nodes, its waves as files of the exchange area (``broadcast.WaveFiles``)."""
        from memtrain.cluster.broadcast import follow

        return follow(self, ident, rank, members, files)

    def _sync(self, task: GradTask | StatsTask) -> None:
        """Write the task's file back to the file server before the result says it is there."""
        import os

        path = (STREAMED_GRADIENT.path(Path(self.setup.exchange_dir), task.ticket, task.task, task.attempt)
                if isinstance(task, GradTask) else
                statistics_dir(Path(self.setup.run_dir)) / partial_name(task.task, task.attempt))
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Give back what the run held in this long-lived Dask worker: maps, descriptors, limits."""
        if self.state is not None:
            self.state.close()  # its maps, and a node's task threads (cluster/nodes.py)
            self.state = None  # the dataset's maps go with it
        if self.limits is not None:
            self.limits.restore_original_limits()
            self.limits = None


@dataclass
class RemoteWorker:
    """The process behind a slot, as the Scheduler asks about it (``pid``, ``is_alive``) plus where it is."""

    address: str
    host: str
    pid: int
    alive: bool = True
    exitcode: int | None = None

    def is_alive(self) -> bool:
        return self.alive


@dataclass
class ClusterSlot:
    index: int
    process: RemoteWorker
    actor: Any
    future: Any  # the actor's Dask future: the actor lives while it is held
    token: str
    current: Task | None = None
    since: float = 0.0

    @property
    def idle(self) -> bool:
        return self.current is None

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class Completion:
    token: str
    result: Result | None
    error: BaseException | None = None


@dataclass
class ClusterPool:
    """The ``Transport`` interface (slots, send, wait, kill, close; and pids) on a Dask client."""

    client: Any
    setup: WorkerSetup
    probe: ViewProbe
    worker_state: Callable[..., Any]  # what each Dask worker's actor runs (ClusterWorker)
    log: Callable[[str], None] = print
    slots: list[ClusterSlot] = field(default_factory=list)
    restarts: int = 0
    excluded: set[str] = field(default_factory=set)  # workers killed as hung, or refused by the view check
    _done: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _next_index: int = 0
    _watched: float = 0.0
    _vacant_since: float | None = None
    on_close: contextlib.ExitStack | None = None  # the connection (and a local cluster), closed with the pool
    timer: Timer = UNTIMED  # a measurement's hook (train/timing.py): tasks out, answers in, broadcast calls
    aside: SetAside = field(default_factory=SetAside)  # the stragglers set aside (rounds and per-task path alike)

    def __post_init__(self) -> None:
        """A slot for every worker present; any worker that cannot start or see the run's files refuses the run."""
        self.send = timed(self.timer, "task out", self.send)  # type: ignore[method-assign]
        self._completed = timed(self.timer, "result in", self._completed)  # type: ignore[method-assign]
        started, failures = self._start(sorted(self._workers()), START_SECONDS)
        self.slots.extend(started)
        if failures:
            self.close()
            raise failures[0] if len(failures) == 1 else type(failures[0])(
                f"{failures[0].message}; and {len(failures) - 1} more Dask worker(s) (see the run's events.log)",
                hint=failures[0].hint)
        self._watched = time.monotonic()

    @property
    def started(self) -> list[str]:
        return [slot.process.address for slot in self.slots]

    def send(self, slot: ClusterSlot, task: Task) -> None:
        slot.current, slot.since = task, time.monotonic()
        try:
            call = slot.actor.run(task)
        except Exception as exc:  # the actor's worker is already known to be gone
            self._done.put(Completion(slot.token, None, exc))
            return
        self.client.loop.add_callback(self._forward, slot.token, call)

    async def _forward(self, token: str, call: Any) -> None:
        try:
            result = await call
        except BaseException as exc:  # noqa: BLE001 - any failure of the call is the loss of its worker
            self._done.put(Completion(token, None, exc))
            return
        self._done.put(Completion(token, result))

    def wait(self, timeout: float) -> list[Event]:
        """Results and deaths, waiting at most ``timeout`` seconds for the first one."""
        deadline = time.monotonic() + timeout
        events: list[Event] = []
        while True:
            events.extend(self._watch())
            left = max(0.0, min(deadline - time.monotonic(), WATCH_SECONDS))
            try:
                item = self._done.get(timeout=left)
                while True:
                    events.extend(self._completed(item))
                    item = self._done.get_nowait()
            except queue.Empty:
                pass
            if events or time.monotonic() >= deadline:
                return events

    def _completed(self, item: Completion) -> list[Event]:
        slot = next((s for s in self.slots if s.token == item.token), None)
        if slot is None:
            return []  # a slot already reported dead
        if item.result is not None:
            task, slot.current = slot.current, None
            return [Event(slot, item.result, task)]  # type: ignore[arg-type]
        if self.client.status != "running":  # every call fails once the scheduler is gone: say that instead
            raise self._lost(f"{type(item.error).__name__}: {item.error}")
        self.log(f"lost Dask worker {slot.process.address} (host {slot.process.host}): "
                 f"{type(item.error).__name__}: {item.error}")
        return [self._dead(slot)]

    def _dead(self, slot: ClusterSlot) -> Event:
        slot.process.alive = False
        self.slots.remove(slot)
        self._release(slot)
        self.restarts += 1
        return Event(slot, None, slot.current)  # type: ignore[arg-type]

    def _watch(self) -> list[Event]:
        """Deaths of workers that left the scheduler, slots for workers that joined; at most once per second."""
        now = time.monotonic()
        if now - self._watched < WATCH_SECONDS:
            return []
        self._watched = now
        present = self._workers()
        events = []
        for slot in [s for s in self.slots if s.process.address not in present]:
            self.log(f"lost Dask worker {slot.process.address} (host {slot.process.host}): it left the scheduler")
            events.append(self._dead(slot))
        for slot in self.slots:
            present.discard(slot.process.address)
        joined = sorted(present - self.excluded)
        if joined:
            self._join(joined)
        self._check_vacancy(now)
        return events

    def _join(self, addresses: list[str]) -> None:
        started, failures = self._start(addresses, JOIN_SECONDS)
        for error in failures:  # the run goes on without it
            self.log(f"not using a Dask worker that joined: {error}")
        for slot in started:
            self.log(f"Dask worker {slot.process.address} (host {slot.process.host}) joined: slot {slot.index}")
            self.slots.append(slot)

    def _check_vacancy(self, now: float) -> None:
        if self.slots:
            self._vacant_since = None
            return
        self._vacant_since = self._vacant_since or now
        if now - self._vacant_since > NO_WORKER_SECONDS:
            raise MemtrainError(f"no Dask worker left for {NO_WORKER_SECONDS:g} s",
                                hint="start workers for the scheduler, then resume the run with "
                                     f"memtrain train --resume {self.setup.run_dir}")

    def _workers(self) -> set[str]:
        if self.client.status != "running":  # "connecting": the client lost the scheduler and tries again
            raise self._lost(f"client {self.client.status}")
        try:
            info = self.client.sync(self.client.scheduler.identity, callback_timeout=SCHEDULER_SECONDS)
        except Exception as exc:  # noqa: BLE001 - whatever the comm raised, the scheduler did not answer
            raise self._lost(f"{type(exc).__name__}: {exc}") from None
        return set(info["workers"])

    def _lost(self, found: str) -> ClusterLost:
        return ClusterLost(f"lost the Dask scheduler {self.client.scheduler.address} ({found}); the run stopped",
                           hint="the newest checkpoint is intact; resume with `memtrain train --resume "
                                             f"{self.setup.run_dir}` (with --cluster, or --cluster \"\" to run here)")

    def _start(self, addresses: list[str], seconds: float) -> tuple[list[ClusterSlot], list[MemtrainError]]:
        """An actor on each of ``addresses``, checked against the server's view, the workers side by side: every
        actor is submitted, then every actor's start (its view check, the dataset and the model opened) is called
        before any answer is awaited, never one worker's start after another's.

        Returns the slots that passed and an error for each worker that did not (it is left out of the run
        for good); bounded by ``seconds`` in all.
        """
        pending = []
        for address in addresses:
            token = uuid.uuid4().hex[:12]
            future = self.client.submit(ClusterWorker, self.setup, token, self.worker_state, actor=True,
                                        workers=[address], allow_other_workers=False, pure=False,
                                        key=f"memtrain-worker-{token}")
            pending.append(ClusterSlot(self._next_index, RemoteWorker(address, "?", 0), None, future, token))
            self._next_index += 1
        deadline = time.monotonic() + seconds
        calls = [(slot, self._attempt(slot, lambda slot=slot: self._begin(slot, deadline))) for slot in pending]
        started, failures = [], []
        for slot, call in calls:
            view = call if isinstance(call, MemtrainError) else self._attempt(
                slot, lambda slot=slot, call=call: self._view(slot, call, deadline))
            failure = view if isinstance(view, MemtrainError) else self._refusal(slot, view)
            if failure is not None:
                failures.append(failure)
                self.excluded.add(slot.process.address)
                self._close_actors([slot])
                self._release(slot)
                continue
            started.append(slot)
        return started, failures

    @staticmethod
    def _attempt(slot: ClusterSlot, step: Callable[[], Any]) -> Any:
        """``step()``, or the error that leaves the slot's worker out of the run (named, with what it said)."""
        try:
            return step()
        except WorkerLeft:
            return MemtrainError(f"Dask worker {slot.process.address} left the scheduler before its memtrain "
                                 "worker started")
        except Exception as exc:  # noqa: BLE001 - a worker that cannot start is named, with what it said
            return MemtrainError(f"Dask worker {slot.process.address} could not start a memtrain worker: "
                                 f"{type(exc).__name__}: {exc}",
                                 hint="memtrain (same version) must be installed on every worker")

    def _begin(self, slot: ClusterSlot, deadline: float) -> Any:
        """The slot's actor once started, its start call sent: the call's future, not awaited here."""
        with self.client.as_current():  # the handle binds to the current client: ours, not another one
            slot.actor = self._actor(slot, deadline)
        return slot.actor.start(self.probe)

    def _view(self, slot: ClusterSlot, call: Any, deadline: float) -> View:
        """The start call's answer: the worker's view of the run's files."""
        view = call.result(timeout=max(0.1, deadline - time.monotonic()))
        slot.process.host, slot.process.pid = view.host, view.pid
        return view

    def _refusal(self, slot: ClusterSlot, view: View) -> MemtrainError | None:
        """The error refusing a worker whose view of the run's files differs from the server's, else None."""
        problems = read_back(self.probe, slot.token, view)
        return refuse(slot.process.address, view, problems) if problems else None

    def _actor(self, slot: ClusterSlot, deadline: float) -> Any:
        """The slot's actor once started, asking the scheduler every ``WATCH_SECONDS`` meanwhile whether its worker
        is still there: one that left (a worker that died while the scheduler still listed it, which the pool then
        took for one that joined) never runs it, so the wait ends then, not at ``deadline``."""
        while True:
            try:
                return slot.future.result(timeout=max(0.1, min(deadline - time.monotonic(), WATCH_SECONDS)))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
            if slot.process.address not in self._workers():
                raise WorkerLeft(slot.process.address)

    def _release(self, slot: ClusterSlot) -> None:
        """Forget a slot's actor (what a dead attempt wrote is discarded by the Scheduler)."""
        with contextlib.suppress(Exception):
            slot.future.cancel()

    def kill(self, slot: ClusterSlot) -> None:
        """A hung worker: stop using it (its death is reported by wait); Dask's nanny may restart it."""
        self.excluded.add(slot.process.address)
        self._done.put(Completion(slot.token, None, TimeoutError("silent past train.task_timeout")))

    def pids(self) -> list[int]:
        return [slot.process.pid for slot in self.slots]

    def close(self, timeout: float = 5.0) -> None:
        """Close every actor (bounded), then release them; the Dask workers themselves keep running."""
        self._close_actors(self.slots, timeout)
        for slot in self.slots:
            self._release(slot)
        self.slots.clear()
        if self.on_close is not None:
            self.on_close.close()

    def _close_actors(self, slots: list[ClusterSlot], timeout: float = 5.0) -> None:
        """Ask each actor to give back what it holds; a busy one does so after its task (calls run in order)."""
        calls = []
        for slot in slots:
            with contextlib.suppress(Exception):
                if slot.actor is not None:
                    calls.append(slot.actor.close())
        deadline = time.monotonic() + timeout
        for call in calls:
            with contextlib.suppress(Exception):
                call.result(timeout=max(0.1, deadline - time.monotonic()))
