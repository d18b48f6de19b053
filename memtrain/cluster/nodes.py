"""A node's part of a two-level round (issue 42; docs/cluster.md, "The two-level round"): one Dask worker per node.

A Dask worker started with ``MEMTRAIN_NODE_PROCESSES=P`` in its environment stands for a node of P processes.
When every member of a broadcast round is such a node, the server posts a **node record** per update instead
of the gradient record: the gradient record, plus the members' process counts in rank order. Every member
derives the same ranges from it (``plan.node_tasks``: contiguous, in node order, about in proportion to the
processes), and member ``rank``:

1. computes the gradients of its range (on its threads or processes: train/loops/node_compute.py, reached through the
   worker's state its actor holds, ``WorkerState.node_range``), each into a file of the node's own scratch
   (the Dask worker's local directory: never on the shared filesystem);
2. continues the update's fold (``node_sum.fold_node``): waits for the partial sum of the tasks before its
   range (published by the node before it in the shared exchange folder), adds its gradients in task order and
   publishes the partial of the tasks up to the end of its range; deletes its scratch files (the last node of
   the chain keeps the segments of its own step slice in memory instead, for its step: ``node_sum.KeptSum``);
3. answers with task, loss and seconds of each of its tasks, as the gradient record's answer.

The step then reads its slice of the last partial instead of every gradient (``StepTask.chained``): the same
sum in the same order, so the same bits as a local run whatever the layout. A round of nodes' records and
answers are files of the exchange area, not messages through the scheduler (``broadcast.WaveFiles``); a
member waiting for a partial that will not come (the node before it was lost: the round ended) gives up at
its next look once the server's end file of the round is there (``abandoned``), so the per-task path that
completes the update finds it idle.

A node's P processes are P threads of its Dask worker's process (``node_compute.NodeCompute``) when the model
may be called from several threads at once (``thread_safe = True``: the numpy models; numpy releases the GIL in
BLAS) and BLAS runs on one thread; otherwise P worker processes its Dask worker spawns
(``node_compute.NodeProcesses``: the local worker pool, the node's scratch as their exchange folder). Each task
is computed exactly as alone into its own file, and the fold adds them in task order: the same bits either way.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrain.errors import InputError
from memtrain.train.exchange.weights import BLOCK
from memtrain.train.messages import GradTask, TaskLimit
from memtrain.train.plan import node_step_deal, node_tasks

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


def node_record(record: tuple[Any, ...], counts: list[int], seconds: float, attempts: int) -> tuple[Any, ...]:
    """The node record the server posts: the update's gradient record, the members' process counts in rank
    order, how long a member may wait for the partial before its range -- the run's ``train.task_timeout``, also
    how long a node's process may be silent on a task (``TaskLimit``) -- and ``train.max_attempts``."""
    return record, tuple(counts), seconds, attempts


def node_part(actor: Any, tasks: list[GradTask] | str, body: tuple[Any, ...], rank: int,
              abandoned: Callable[[], bool]) -> tuple[list[float], bytes, str]:
    """Member ``rank``'s part of a node record ``body``: its range's gradients into the node's scratch, folded onto
    the chain; (numbers, blob, error) as ``broadcast.part``. ``tasks``: the record's gradient tasks as
    ``broadcast.gradient_tasks`` derives them from the worker's plan (or its text of how they disagree). The
    range is computed by the worker's state the actor holds (``WorkerState.node_range``:
    train/loops/node_compute.py), as ``broadcast.part`` runs a task through the actor: the cluster runs none of
    the engine itself."""
    _, counts, seconds, attempts = body
    if isinstance(tasks, str):
        return [], b"", tasks
    if tasks:
        actor.state.drop_partials(tasks[0].ticket)  # its previous update's partials: stepped, read by nobody now
    ranges = node_tasks(len(tasks), counts)
    lo, hi = ranges[rank]
    if hi <= lo:
        return [], b"", ""
    scratch = Path(actor.worker.local_directory) / SCRATCH
    scratch.mkdir(exist_ok=True)
    worker = actor.worker
    limit = TaskLimit(seconds=seconds, attempts=attempts,
                      node=f"{worker.name} (Dask worker {worker.address}, host {socket.gethostname()})")
    # the node that ends the chain steps its own slice of the last partial from its memory, unpublished
    # (``node_sum.KeptSum``): its slice of the step as a round of nodes deals it (``plan.node_step_deal``)
    deal = node_step_deal(actor.state.context.layout.size, ranges, BLOCK, len(actor.state.slice_step.state_names))
    own = deal[rank] if hi == len(tasks) and deal[rank][1] > deal[rank][0] else None
    numbers, error = actor.state.node_range(tasks[lo:hi], lo, scratch, counts[rank], sync=actor.sync,
                                            deadline=time.monotonic() + seconds, abandoned=abandoned, limit=limit,
                                            own_slice=own)
    return numbers, b"", error


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
