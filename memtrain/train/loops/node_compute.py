"""A node's compute in a two-level round (issue 42; docs/cluster.md, "The two-level round"): the gradients of the
member's range on the node's threads, folded onto the update's chain.

The cluster's side (memtrain/cluster/nodes.py) decodes the node record and finds the member's range; it reaches
this through the worker's state its actor holds (``WorkerState.node_range``, train/worker/worker.py), as a
worker's task reaches its handlers: the cluster runs no loop of its own.

A node's P processes are, for now, P threads of its Dask worker's process (``NodeCompute``), when the model
may be called from several threads at once (``thread_safe = True``: the numpy models; numpy releases the GIL in
BLAS) and BLAS runs on one thread; otherwise one thread computes the range. Each task is computed exactly as
alone into its own file of the node's scratch, and the fold adds them in task order: the same bits either way.

A model that does not say ``thread_safe = True`` (torch modules among them), or BLAS on more than one thread, has
its node's range computed in P real processes instead (``NodeProcesses``): the project's local worker pool
(train/worker/pool.py ``WorkerPool``; its spawned processes run the ``target`` the worker passes, ``worker_main``),
whose exchange folder is the node's scratch -- their gradient files stay on the node -- and whose server is the
Dask worker's process (they die with it). A process killed mid-task is replaced by the pool and its task sent
again: the same file, the same bits. A process silent on a task for ``train.task_timeout`` (``TaskLimit``, a
record of train/messages.py, from the node record) is killed, replaced and its task sent again, as the server's
Scheduler does with a local worker; a task whose processes died or were killed ``train.max_attempts`` times fails,
naming the node, the task and the process (the node's answer: the server completes the update per task and its
events.log quotes it).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import WorkerFailure
from memtrain.files import open_npy
from memtrain.train.exchange.area import STREAMED_GRADIENT, discard
from memtrain.train.loops.gradient import TaskGradient
from memtrain.train.loops.mapped import ROW_CACHE_BYTES, THREAD_ROWS_SHARE, TaskRows
from memtrain.train.loops.maps import MapCache
from memtrain.train.loops.node_sum import Abandoned, KeptSum, PartialSum, fold_node
from memtrain.train.loops.stream import StreamedGradient
from memtrain.train.loops.threads import TaskThreads
from memtrain.train.messages import GradTask, Outcome, Result, TaskLimit
from memtrain.train.worker.pool import WorkerPool

LOG = logging.getLogger("distributed.worker.memtrain")  # in the Dask worker's log (Dask's loggers print at INFO)
WAIT_BOUND = 1.0  # the longest wait for the node's processes between two looks at the silent ones


class NodeCompute:
    """A node's gradients of its range on ``threads`` threads (train/loops/threads.py's ``TaskThreads``: task k of
    the range on thread k % threads), each with its own streamed gradient (its own output buffer), row reader and
    maps; every task computed exactly as alone, into its own file: the same bits as one thread."""

    def __init__(self, state: Any, scratch: Path, threads: int):
        self.state, self.scratch = state, scratch
        self.threads = TaskThreads(threads)
        self.gradients = []
        for thread in range(threads):
            rows = state.task_rows
            if thread:  # a helper's own reader of the split's rows (it reuses its buffers)
                reader = TaskRows(state.dataset.split("train"), state.context.normalize,
                                  ROW_CACHE_BYTES // THREAD_ROWS_SHARE)
                rows = lambda epoch, lo, hi, reader=reader: reader.get(state.plan.rows(epoch, lo, hi))  # noqa: E731
            gradient = state.gradient if not thread else TaskGradient(state.context.model, seed=state.gradient.seed,
                                                                         straggler=state.gradient.straggler)
            self.gradients.append(StreamedGradient(layout=state.context.layout, maps=state.maps if not thread
                                                   else MapCache(), run_dir=state.run_dir, exchange=scratch,
                                                   rows=rows, gradient=gradient))

    @property
    def count(self) -> int:
        return self.threads.count

    def __call__(self, tasks: list[GradTask], limit: TaskLimit) -> list[Any]:
        """Each task's result, in order. ``limit`` is not applied: a thread cannot be killed (a hung one is the
        whole node silent, which the server's rules handle)."""
        return self.threads.run([lambda thread, task=task: self.gradients[thread](task) for task in tasks])

    def close(self) -> None:
        self.threads.close()


class NodeProcesses:
    """A node's gradients of its range in ``count`` spawned worker processes (see the module's docstring): task k
    of a range to the first idle process, each written by ``StreamedGradient`` into the scratch exactly as alone.
    A run's worth: ``node_compute`` keeps it while it fits."""

    def __init__(self, state: Any, scratch: Path, count: int, target: Callable[..., None]):
        self.scratch, self.count = scratch, count
        self.failed = ""  # the error of processes that could not start: the node's answer from then on
        setup = replace(state.setup, exchange_dir=str(scratch), server_pid=os.getpid())
        with children_allowed():
            self.pool = WorkerPool(setup, count, target=target)

    def __call__(self, tasks: list[GradTask], limit: TaskLimit) -> list[Any]:
        """Each task's ``Result``, in order; a task whose process died, or was killed silent past ``limit.seconds``,
        is sent again (to its replacement), up to ``limit.attempts`` times (then it fails: ``run``). When
        the node's processes cannot start (``WorkerFailure``: ``max_starts`` deaths before Ready in a row), every
        task is failed with its text, then and at every later call (no more starts): the node answers the error
        (the server runs its tasks per task, on the Dask workers themselves, and its events.log quotes it)."""
        if not self.failed:
            try:
                return self.run(tasks, limit)
            except WorkerFailure as exc:
                self.failed = str(exc)
                self.pool.close()
        return [Result(task=t.task, attempt=t.attempt, outcome=Outcome.FAILED, error=self.failed) for t in tasks]

    def run(self, tasks: list[GradTask], limit: TaskLimit) -> list[Any]:
        waiting, results = list(range(len(tasks))), [None] * len(tasks)
        given: dict[int, int] = {}  # slot index -> index of the task it computes
        lost: Counter[int] = Counter()  # task index -> processes that died or were killed with it
        killed: dict[int, str] = {}  # pid -> how it was silent, for the error (the pool reports its death)
        while waiting or given:
            with children_allowed():  # the pool replaces a dead process here
                events = self.pool.wait(0.0 if waiting and self.idle() else self.wait_time(given, limit, killed))
            for event in events:
                index = given.pop(event.slot.index, None)
                if index is None:
                    continue
                if event.answer is not None:
                    results[index] = event.answer
                    continue
                lost[index] += 1  # the process died with the task (or was killed silent): computed again, into
                if lost[index] < limit.attempts:  # the same file, by its replacement
                    waiting.insert(0, index)
                    continue
                how = killed.get(event.slot.pid, f"died (exit code {event.slot.process.exitcode})")
                results[index] = Result(task=tasks[index].task, attempt=tasks[index].attempt, outcome=Outcome.FAILED,
                                        error=f"node {limit.node}: gradient task {tasks[index].task} of update "
                                              f"{tasks[index].ticket} lost its worker process {limit.attempts} "
                                              f"time(s) (train.max_attempts); the last, process {event.slot.index} "
                                              f"(pid {event.slot.pid}), {how}")
            self.kill_silent(given, tasks, limit, killed)
            for slot in self.idle():
                if not waiting:
                    break
                given[slot.index] = waiting.pop(0)
                self.pool.send(slot, tasks[given[slot.index]])
        return results

    def idle(self) -> list[Any]:
        return [slot for slot in self.pool.slots if slot.idle and slot.ready]

    def wait_time(self, given: dict[int, int], limit: TaskLimit, killed: dict[int, str]) -> float:
        """Until the first busy process is due to be killed as silent, at most ``WAIT_BOUND``."""
        busy = [self.pool.slots[index].since for index in given if self.pool.slots[index].pid not in killed]
        return max(0.0, min([WAIT_BOUND, *(since + limit.seconds - time.monotonic() for since in busy)]))

    def kill_silent(self, given: dict[int, int], tasks: list[GradTask], limit: TaskLimit, killed: dict[int, str]
                    ) -> None:
        """Kill every process silent on its task past ``limit.seconds`` (SIGKILL: a stopped one too); the pool
        reports its death at the next wait and replaces it, and ``run`` sends the task again."""
        now = time.monotonic()
        for index, task in given.items():
            slot = self.pool.slots[index]
            if now - slot.since > limit.seconds and slot.pid not in killed:
                killed[slot.pid] = f"silent for {limit.seconds:g} s on it (train.task_timeout): killed"
                LOG.warning("memtrain node %s: worker process %d (pid %d) silent for %g s on gradient task %d of "
                            "update %d; killing it, the task goes to its replacement", limit.node, index, slot.pid,
                            limit.seconds, tasks[task].task, tasks[task].ticket)
                self.pool.kill(slot)

    def close(self) -> None:
        self.pool.close()


@contextlib.contextmanager
def children_allowed() -> Any:
    """Inside: this process may start processes although it is daemonic (a Dask worker under a nanny is): its
    node's workers die with it by their parent-death signal (train/worker/worker.py ``become_worker``), which is
    what multiprocessing's refusal protects."""
    config = multiprocessing.current_process()._config  # noqa: SLF001 - the one place the daemon flag is kept
    daemon = config.get("daemon")
    config["daemon"] = False
    try:
        yield
    finally:
        if daemon is not None:
            config["daemon"] = daemon


def node_processes_for(state: Any, processes: int) -> tuple[bool, str]:
    """Whether a node of ``processes`` computes its range in real processes (``NodeProcesses``), and why."""
    if processes < 2:
        return False, "one process"
    if not getattr(state.context.model, "thread_safe", False):
        return True, f"the model ({type(state.context.model).__name__}) does not say thread_safe = True"
    if state.setup.blas_threads != 1:
        return True, f"train.blas_threads = {state.setup.blas_threads}"
    return False, "thread_safe model"


def node_threads(state: Any, processes: int) -> tuple[int, str]:
    """How many threads a node of ``processes`` computes its range on, and why: one per process when the model
    may be called from several threads at once (``thread_safe``, the numpy models) with BLAS on one thread."""
    if processes < 2:
        return 1, "one process"
    if not getattr(state.context.model, "thread_safe", False):
        return 1, f"the model ({type(state.context.model).__name__}) does not say thread_safe = True"
    if state.setup.blas_threads != 1:
        return 1, f"train.blas_threads = {state.setup.blas_threads}"
    return processes, "thread_safe model"


def node_compute(state: Any, made: NodeCompute | NodeProcesses | None, scratch: Path, processes: int,
                 target: Callable[..., None]) -> NodeCompute | NodeProcesses:
    """The worker state's ``NodeCompute`` (or ``NodeProcesses``, when ``node_processes_for`` says so): ``made``
    while it fits (same kind, scratch and count), else a new one (``made`` closed): made once per run."""
    in_processes, why = node_processes_for(state, processes)
    kind = NodeProcesses if in_processes else NodeCompute
    threads = processes if in_processes else node_threads(state, processes)[0]
    if made is not None and type(made) is kind and made.scratch == scratch and made.count == threads:
        return made
    if made is not None:
        made.close()
    if in_processes:
        logging.getLogger("distributed.worker.memtrain").info(
            "memtrain node of %d processes: its tasks in %d worker processes (%s)", processes, processes, why)
        return NodeProcesses(state, scratch, processes, target)
    why = node_threads(state, processes)[1]
    # in the Dask worker's log (Dask's own loggers print at INFO)
    logging.getLogger("distributed.worker.memtrain").info(
        "memtrain node of %d processes: its tasks on %d thread(s) (%s)", processes, threads, why)
    return NodeCompute(state, scratch, threads)


def compute_range(compute: NodeCompute | NodeProcesses, tasks: list[GradTask], lo: int, chain: PartialSum, *,
                  deadline: float, abandoned: Callable[[], bool], limit: TaskLimit,
                  keep: KeptSum | None = None, published: list[Path] | None = None) -> tuple[list[float], str]:
    """Tasks ``lo``.. of the update (``tasks``, its member's range) computed on ``compute``'s threads into the
    node's scratch and folded onto ``chain`` (``node_sum.fold_node``, ``keep`` as there); (task, loss, seconds of
    each task, error). ``published``: extended with the partials' files it published.
    The scratch files are deleted whatever happens; a round that ended meanwhile is no error (nobody reads the
    answer)."""
    numbers: list[float] = []
    paths = [STREAMED_GRADIENT.path(compute.scratch, t.ticket, t.task, t.attempt) for t in tasks]
    try:
        for task, result in zip(tasks, compute(tasks, limit), strict=True):
            if result.outcome != Outcome.DONE:
                return numbers, result.error or f"task {task.task}: {result.outcome.name}"
            numbers += [task.task, result.loss, result.seconds]
        grads = {t: open_npy(path, shape=(chain.size,), dtype=np.float32)
                 for t, path in enumerate(paths, start=lo)}
        with contextlib.suppress(Abandoned):  # the round ended meanwhile: nobody reads this answer
            written = fold_node(chain, lo, lo + len(tasks), grads.__getitem__, deadline=deadline,
                                abandoned=abandoned, keep=keep)
            if published is not None:
                published += written
        return numbers, ""
    finally:
        discard(paths)
