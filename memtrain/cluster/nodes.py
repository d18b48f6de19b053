"""A node's part of a two-level round (issue 42; docs/cluster.md, "The two-level round"): one Dask worker per node.

A Dask worker started with ``MEMTRAIN_NODE_PROCESSES=P`` in its environment stands for a node of P processes.
When every member of a broadcast round is such a node, the server posts a **node record** per update instead
of the gradient record: the gradient record, plus the members' process counts in rank order. Every member
derives the same ranges from it (``node_sum.node_tasks``: contiguous, in node order, about in proportion to the
processes), and member ``rank``:

1. computes the gradients of its range (on its threads, below), each into a file of the node's own scratch
   (the Dask worker's local directory: never on the shared filesystem);
2. continues the update's fold (``node_sum.fold_node``): waits for the partial sum of the tasks before its
   range (published by the node before it in the shared exchange folder), adds its gradients in task order and
   publishes the partial of the tasks up to the end of its range; deletes its scratch files;
3. answers with task, loss and seconds of each of its tasks, as the gradient record's answer.

The step then reads its slice of the last partial instead of every gradient (``StepTask.chained``): the same
sum in the same order, so the same bits as a local run whatever the layout. A member waiting for a partial
that will not come (the node before it was lost: the round ended) gives up within about a second
(``abandoned``: the scheduler's plugin asked at most twice a second, and only after half a second of waiting),
so the per-task path that completes the update finds it idle.

A node's P processes are, for now, P threads of its Dask worker's process (``NodeCompute``), when the model
may be called from several threads at once (``thread_safe = True``: the numpy models; numpy releases the GIL in
BLAS) and BLAS runs on one thread; otherwise one thread computes the range. Each task is computed exactly as
alone into its own file, and the fold adds them in task order: the same bits either way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import InputError
from memtrain.files import open_npy
from memtrain.layout import streamed_gradient_name
from memtrain.train.loops.node_sum import Abandoned, PartialSum, fold_node, node_tasks
from memtrain.train.messages import GradTask, Outcome

PROCESSES_ENV = "MEMTRAIN_NODE_PROCESSES"
SCRATCH = "memtrain-node"  # the node's gradient files, under the Dask worker's local directory
CHAIN_SECONDS = 600.0  # the longest a member waits for the partial before its range (when no task timeout)


def node_processes(environ: dict[str, str] | None = None) -> int:
    """This Dask worker's process count as a node (``MEMTRAIN_NODE_PROCESSES``), 0 when it is not a node."""
    text = (os.environ if environ is None else environ).get(PROCESSES_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit() or int(text) < 1:
        raise InputError(f"{PROCESSES_ENV} must be a whole number of processes >= 1",
                         where=f"environment variable {PROCESSES_ENV}", expected="e.g. 2", found=repr(text),
                         hint="set it in the environment of each node's Dask worker, or leave it unset")
    return int(text)


def reported_processes() -> int | str:
    """``node_processes`` as a Dask worker reports it to the server: the count, or the error's text."""
    try:
        return node_processes()
    except InputError as exc:
        return str(exc)


def node_record(record: tuple[Any, ...], counts: list[int], seconds: float) -> tuple[Any, ...]:
    """The node record the server posts: the update's gradient record, the members' process counts in rank
    order, how long a member may wait for the partial before its range."""
    return record, tuple(counts), seconds


def node_part(actor: Any, body: tuple[Any, ...], rank: int, abandoned: Callable[[], bool]
              ) -> tuple[list[float], bytes, str]:
    """Member ``rank``'s part of a node record: its range's gradients into the node's scratch, folded onto the
    chain; (numbers, blob, error) as ``broadcast.part``."""
    from memtrain.cluster.broadcast import gradient_tasks

    record, counts, seconds = body
    state = actor.state
    tasks = gradient_tasks(state.plan, record)
    if isinstance(tasks, str):
        return [], b"", tasks
    lo, hi = node_tasks(len(tasks), counts)[rank]
    if hi <= lo:
        return [], b"", ""
    scratch = Path(actor.worker.local_directory) / SCRATCH
    scratch.mkdir(exist_ok=True)
    compute = node_compute(actor, scratch, counts[rank])
    numbers: list[float] = []
    paths = [scratch / streamed_gradient_name(t.ticket, t.task, t.attempt) for t in tasks[lo:hi]]
    try:
        for task, result in zip(tasks[lo:hi], compute(tasks[lo:hi]), strict=True):
            if result.outcome != Outcome.DONE:
                return numbers, b"", result.error or f"task {task.task}: {result.outcome.name}"
            numbers += [task.task, result.loss, result.seconds]
        size = state.context.layout.size
        chain = PartialSum(Path(actor.setup.exchange_dir), update=tasks[0].ticket, attempt=0,
                           version=tasks[0].version, size=size, sync=actor.sync)
        grads = {t: open_npy(path, shape=(size,), dtype=np.float32) for t, path in zip(range(lo, hi), paths,
                                                                                         strict=True)}
        try:
            fold_node(chain, lo, hi, grads.__getitem__, deadline=time.monotonic() + seconds, abandoned=abandoned)
        except Abandoned:
            return numbers, b"", ""  # the round ended meanwhile: nobody reads this answer
        return numbers, b"", ""
    finally:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


class NodeCompute:
    """A node's gradients of its range on ``threads`` threads (train/loops/threads.py's ``TaskThreads``: task k of
    the range on thread k % threads), each with its own streamed gradient (its own output buffer), row reader and
    maps; every task computed exactly as alone, into its own file: the same bits as one thread."""

    def __init__(self, state: Any, scratch: Path, threads: int):
        from memtrain.train.loops.gradient import TaskGradient
        from memtrain.train.loops.mapped import ROW_CACHE_BYTES, THREAD_ROWS_SHARE, TaskRows
        from memtrain.train.loops.maps import MapCache
        from memtrain.train.loops.stream import StreamedGradient
        from memtrain.train.loops.threads import TaskThreads

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

    def __call__(self, tasks: list[GradTask]) -> list[Any]:
        return self.threads.run([lambda thread, task=task: self.gradients[thread](task) for task in tasks])

    def close(self) -> None:
        self.threads.close()


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


def node_compute(actor: Any, scratch: Path, processes: int) -> NodeCompute:
    """The actor's ``NodeCompute`` (made once per run: again when the worker state or the count changes)."""
    made = getattr(actor, "node_compute", None)
    threads, why = node_threads(actor.state, processes)
    if made is None or made.state is not actor.state or made.scratch != scratch or made.threads.count != threads:
        if made is not None:
            made.close()
        made = actor.node_compute = NodeCompute(actor.state, scratch, threads)
        # in the Dask worker's log (Dask's own loggers print at INFO)
        logging.getLogger("distributed.worker.memtrain").info(
            "memtrain node of %d processes: its tasks on %d thread(s) (%s)", processes, threads, why)
    return made


def every(seconds: float, check: Callable[[], bool]) -> Callable[[], bool]:
    """``check``, asked at most once per ``seconds`` and not in the first ``seconds`` (its last answer in between,
    False at first): a member that finds the partial before its range within ``seconds`` asks the scheduler
    nothing more."""
    last = [time.monotonic(), False]

    def rated() -> bool:
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0], last[1] = now, check()
        return bool(last[1])

    return rated
