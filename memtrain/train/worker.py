"""Task records in, result records out: a worker maps weights and shard rows read-only, writes gradient files.

A worker never decides what to compute. It keeps the dataset shards and the files it meets mapped between
tasks (train/maps.py), writes gradients straight into a kept, mapped buffer published by a hard link
(train/gradbuf.py),
and exits by itself when the server dies (parent-death signal, and a parent-pid check while it waits).
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import sys
import time
import traceback
from multiprocessing.queues import SimpleQueue
from pathlib import Path

import numpy as np

from memtrain.dataset import open_dataset
from memtrain.faults import fault_point
from memtrain.files import writing_npy
from memtrain.layout import STEP_MARKS, gradient_name, weights_path
from memtrain.train.context import model_context
from memtrain.train.gradbuf import GradientBuffers
from memtrain.train.maps import MapCache
from memtrain.train.marks import PeerWaitExpired, StepMarks
from memtrain.train.messages import EvalTask, GradTask, Result, StatsTask, StepTask, Stop, Task, WorkerSetup
from memtrain.train.metrics import write_task_statistics
from memtrain.train.optim import OptimizerConfig
from memtrain.train.reduce import run_step_slice

PARENT_POLL_SECONDS = 1.0  # how often an idle worker checks that its server is still alive
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
KEEP_BLOCKS_BELOW = 1 << 30  # allocations below this come from (and return to) the heap, which is not trimmed


def worker_main(setup: WorkerSetup, tasks: SimpleQueue, results: SimpleQueue) -> None:
    """Entry point of a worker process."""
    _exit_with_parent(setup.server_pid)
    _keep_freed_memory()
    for stop in (signal.SIGINT, signal.SIGHUP):  # Ctrl-C or a closed terminal: the server stops us in order
        signal.signal(stop, signal.SIG_IGN)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(setup.blas_threads)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=setup.blas_threads):
        state = WorkerState(setup)
        while (task := _receive(tasks, setup.server_pid)) is not None:
            results.put(state.run(task))


def _exit_with_parent(server_pid: int) -> None:
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    _exit_if_orphaned(server_pid)  # the server died before the signal was armed


def _exit_if_orphaned(server_pid: int) -> None:
    if os.getppid() != server_pid:
        os._exit(1)


def _keep_freed_memory() -> None:
    """Let glibc keep freed memory for reuse instead of returning it to the kernel after every task.

    A gradient's temporaries (activations, deltas: megabytes) are freed at the end of each task. By
    default glibc may hand such blocks back (munmap, heap trim) and the next task faults every page in
    again: ~480 page faults per task at 1e6 parameters, measured. Keeping them costs no more memory
    than the largest task's peak, which the process reaches anyway.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, KEEP_BLOCKS_BELOW)
        libc.mallopt(M_TRIM_THRESHOLD, KEEP_BLOCKS_BELOW)
    except (OSError, AttributeError):  # not glibc: its allocator keeps its own policy
        pass


def _receive(tasks: SimpleQueue, server_pid: int) -> Task | None:
    while not tasks._reader.poll(PARENT_POLL_SECONDS):
        if os.getppid() != server_pid:
            return None
    try:
        message = tasks.get()
    except (EOFError, OSError):
        return None
    return None if isinstance(message, Stop) else message


class WorkerState:
    """What a worker keeps between tasks: the model, the mapped shards, the current weight version."""

    def __init__(self, setup: WorkerSetup):
        self.setup = setup
        self.exchange = Path(setup.exchange_dir)
        self.run_dir = Path(setup.run_dir)
        self.dataset = open_dataset(setup.dataset)
        self.context = model_context(self.dataset, setup.model_kind, dict(setup.model_options), setup.normalize)
        self.optimizer = OptimizerConfig(**dict(setup.optimizer))
        self.maps = MapCache()
        self.buffers = GradientBuffers(self.exchange)
        self.marks = StepMarks(self.exchange / STEP_MARKS)
        if hasattr(self.context.model, "in_worker"):  # e.g. a torch module pins its thread pool
            self.context.model.in_worker(setup.blas_threads)

    def run(self, task: Task) -> Result:
        self.maps.drop_deleted()
        try:
            with np.errstate(all="ignore"):  # non-finite results are detected and reported, not warned about
                return self._run(task)
        except Exception as exc:  # reported to the server, which stops the run with this text
            detail = "".join(traceback.format_exception_only(exc)).strip()
            return Result(task.task, task.attempt, error=f"{detail}\n{traceback.format_exc(limit=-4)}")

    def _run(self, task: Task) -> Result:
        if isinstance(task, GradTask):
            return self.grad(task)
        if isinstance(task, EvalTask):
            return self.evaluate(task)
        if isinstance(task, StatsTask):
            return self.statistics(task)
        return self.step(task)

    def weights(self, version: int) -> np.ndarray:
        return self.maps.get(weights_path(self.run_dir, version), (self.context.layout.size,), np.float32)

    def rows(self, split: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.dataset.split(split).read(lo, hi)
        return self.context.normalize(x), np.asarray(y)

    def grad(self, task: GradTask) -> Result:
        layout, model = self.context.layout, self.context.model
        x, y = self.rows("train", task.lo, task.hi)
        fault_point("before_grad_write")
        buffer = self.buffers.take(layout.size, np.dtype(np.float32))
        step_finite = True
        if task.building is not None:  # the rows and the buffer are ready before the wait: less to do after it
            if task.slice is not None:
                step_finite = self.step_slice(task.slice)
            try:
                usable = self.marks.wait(task.building.seq, task.building.slices, task.building.wait_limit,
                                         lambda: _exit_if_orphaned(self.setup.server_pid))
            except PeerWaitExpired:
                return Result(task.task, task.attempt, step_finite=step_finite, peer_wait_expired=True)
            if not usable:
                return Result(task.task, task.attempt, finite=False, step_finite=step_finite, new_version_void=True)
        weights = (self.maps.get(Path(task.building.path), (layout.size,), np.float32) if task.building is not None
                   else self.weights(task.version))
        seeded = {"seed": (self.setup.seed, task.version, task.task)} if getattr(model, "seeded", False) else {}
        started = time.perf_counter()
        loss = model.loss_and_grad(layout.views(weights), x, y, layout.views(buffer.array), **seeded)  # overwrites
        seconds = time.perf_counter() - started
        fault_point("after_grad_tmp")
        self.buffers.publish(buffer, self.exchange / gradient_name(task.version, task.task, task.attempt))
        fault_point("after_grad_rename")
        fault_point("before_notify")
        return Result(task.task, task.attempt, loss=float(loss), rows=task.hi - task.lo, finite=math.isfinite(loss),
                      seconds=seconds, step_finite=step_finite)

    def statistics(self, task: StatsTask) -> Result:
        shapes = self.context.stats_layout
        x, y = self.rows("train", task.lo, task.hi)
        out = self.exchange / gradient_name(0, task.task, task.attempt)
        with writing_npy(out, (shapes.size,), np.float64, durable=False) as flat:
            self.context.model.statistics(x, y, shapes.views(flat))
        return Result(task.task, task.attempt, rows=task.hi - task.lo)

    def evaluate(self, task: EvalTask) -> Result:
        params = self.context.layout.views(self.weights(task.version))
        x, y = self.rows("val", task.lo, task.hi)
        loss = float(self.context.model.loss(params, x, y))
        correct = 0
        if self.context.classifier:
            correct = int(np.count_nonzero(self.context.model.predict(params, x) == y))
        write_task_statistics(self.exchange, task.version, task.task, task.attempt, self.context, params, x, y)
        return Result(task.task, task.attempt, loss=loss, rows=task.hi - task.lo, correct=correct,
                      finite=math.isfinite(loss))

    def step(self, task: StepTask) -> Result:
        started = time.perf_counter()
        finite = self.step_slice(task)
        return Result(task.task, task.attempt, rows=task.hi - task.lo, finite=finite, step_finite=finite,
                      seconds=time.perf_counter() - started)

    def step_slice(self, task: StepTask) -> bool:
        """Write this slice of the next version, then mark it (for the peers that wait to read it)."""
        finite = run_step_slice(task, self.exchange, self.run_dir, self.context.layout.size, self.optimizer,
                                self.maps, self.context.layout.trainable)
        self.marks.mark(task.task, task.seq, finite)
        return finite
