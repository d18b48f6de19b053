"""A job with ``run.cluster`` -> its Dask workers as a Transport, and the placement of its rounds on them.

On a cluster the rounds do not run on the workers (their participants cannot meet at marks across
machines): the server runs their loop alone and sends the gradient tasks (train/loops/stream.py) and the step's
slices (train/loops/sliced.py) to the workers as tasks; evaluation and statistics tasks go to the same workers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrain.config import Job
from memtrain.train.messages import Transport, WorkerSetup
from memtrain.train.records.run_dir import RunDir
from memtrain.train.timing import UNTIMED, Timer


def open_cluster(job: Job, setup: WorkerSetup, run: RunDir, log: Callable[[str], None],
                 stopped: Callable[[], int | None] = lambda: None, timer: Timer = UNTIMED) -> Any:
    """A ``cluster.transport.ClusterPool`` on ``run.cluster``, its workers checked against the run's files;
    its ``close`` also disconnects (and stops a ``local:N`` cluster). ``stopped``: a stop request's signal
    number, or None; the connection's waits end at one (``Interrupted``). ``timer``: a measurement's hook
    (train/timing.py), handed to the pool."""
    from memtrain.cluster.address import parse_cluster
    from memtrain.cluster.connect import connected
    from memtrain.cluster.sharedfs import cleanup, server_probe
    from memtrain.cluster.transport import ClusterPool
    from memtrain.train.worker.worker import WorkerState

    stack = contextlib.ExitStack()
    try:
        log(f"connecting to the Dask cluster {job.run.cluster}")
        client = stack.enter_context(connected(parse_cluster(job.run.cluster, where="run.cluster"), stopped=stopped))
        probe = server_probe(Path(setup.dataset), run.path, run.exchange)
        stack.callback(cleanup, probe)
        pool = ClusterPool(client, setup, probe, WorkerState, log=log, on_close=stack, timer=timer)
    except BaseException:
        stack.close()
        raise
    log(f"Dask scheduler {client.scheduler.address}: workers "
        + ", ".join(f"{s.process.address} (host {s.process.host}, pid {s.process.pid})" for s in pool.slots))
    return pool


def check_cluster(job: Job, stopped: Callable[[], int | None] = lambda: None) -> None:
    """Refuse, before the run writes anything, a ``run.cluster`` where no Dask scheduler answers (one
    handshake, ``cluster.connect.check_scheduler``); nothing to check without one, or for ``local:N``."""
    if not job.run.cluster:
        return
    from memtrain.cluster.address import parse_cluster
    from memtrain.cluster.connect import check_scheduler

    check_scheduler(parse_cluster(job.run.cluster, where="run.cluster"), stopped=stopped)


class Streamed:
    """The placement of a run whose gradients are streamed (train/server/placement.py's interface): a transport
    chosen at start, never re-decided -- a cluster run, or an overlapping mode (train/loops/overlap.py)."""

    def __init__(self, transport: Transport, text: str, log: Callable[[str], None]):
        self.transport = transport
        log(text)

    def stretch_limit(self) -> int | None:
        return None

    def ends_stretch(self) -> bool:
        return False

    def observe(self, timeline: list[tuple[int, float, float]], update: int, remaining: int) -> None:
        pass

    def close(self, timeout: float = 5.0) -> None:
        self.transport.close(timeout)


class OnCluster(Streamed):
    """A cluster run: tasks on the Dask workers (gradients and step slices), the rounds' loop in the server
    (train/loops/stream.py, train/loops/sliced.py)."""

    def __init__(self, pool: Transport, log: Callable[[str], None]):
        super().__init__(pool, f"rounds: in the server (the gradients streamed to {len(pool.slots)} Dask workers, "
                               "the step sliced across them)", log)
