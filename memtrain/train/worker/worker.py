"""Messages in, answers out: a worker runs stretches of rounds (train/loops/rounds.py), evaluation/statistics tasks
and gradient tasks (train/loops/stream.py).

A worker never decides what to compute: a stretch names the updates, the plan says which parts are this
slot's. It keeps the dataset shards and the files it meets mapped between messages (train/loops/maps.py), and
exits by itself when the server dies (parent-death signal, and a parent-pid check while it waits).
The server runs the same ``WorkerState`` itself when it runs the rounds alone (train/server/exchange.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from memtrain.dataset import Dataset, open_dataset
from memtrain.errors import MemtrainError
from memtrain.faults import straggler_factor
from memtrain.layout import partial_name, statistics_dir, weights_path
from memtrain.train.context import ModelContext, model_context
from memtrain.train.exchange.area import BOARD, discard
from memtrain.train.exchange.marks import Board
from memtrain.train.loops.additive import task_partial
from memtrain.train.loops.desk import DeskParticipant
from memtrain.train.loops.gradient import TaskGradient
from memtrain.train.loops.mapped import ROW_CACHE_BYTES, RoundFiles, RowCache, TaskRows, round_plan
from memtrain.train.loops.maps import MapCache
from memtrain.train.loops.node_compute import NodeCompute, NodeProcesses, compute_range, node_compute
from memtrain.train.loops.node_sum import KeptSum, PartialSum
from memtrain.train.loops.rounds import Participant
from memtrain.train.loops.sliced import SliceStep
from memtrain.train.loops.stream import StreamedGradient
from memtrain.train.memory import apply_test_limit
from memtrain.train.messages import (
    EvalTask,
    GradTask,
    Loop,
    Message,
    Outcome,
    Ready,
    Result,
    RLWorkerSetup,
    StartFailed,
    StatsTask,
    StepTask,
    Stop,
    Stretch,
    StretchEnd,
    TaskLimit,
    WorkerSetup,
)
from memtrain.train.plan import Plan
from memtrain.train.records.metrics import evaluation, task_statistics, write_task_statistics
from memtrain.train.timing import UNTIMED, Timer, timed
from memtrain.train.worker.launch import exit_at_once

PARENT_POLL_SECONDS = 1.0  # how often an idle worker checks that its server is still alive
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
KEEP_BLOCKS_BELOW = 1 << 30  # allocations below this come from (and return to) the heap, which is not trimmed


def worker_main(setup: WorkerSetup | RLWorkerSetup, inbox: Connection, outbox: Connection) -> None:
    """Entry point of a worker process: ``inbox`` and ``outbox`` are its ends of the pipes
    train/server/exchange.py made."""
    become_worker(setup.server_pid, setup.blas_threads)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=setup.blas_threads):
        state = start(lambda: _state_for(setup), outbox)
        serve(state, inbox, outbox)
    exit_at_once()


def _state_for(setup: WorkerSetup | RLWorkerSetup) -> WorkerState:
    """A worker's state for its setup: a training run's, or a reinforcement-learning run's (memtrain/rl/worker.py,
    which answers CollectTasks)."""
    if isinstance(setup, RLWorkerSetup):
        from memtrain.rl.worker import RLWorkerState

        return RLWorkerState(setup)  # type: ignore[return-value] - the same handle(message) -> Result
    return WorkerState(setup, alive=lambda: exit_if_orphaned(setup.server_pid))


def start(make_state: Callable[[], WorkerState], outbox: Connection) -> WorkerState:
    """``make_state()``, or, if it raises, its error sent to the server (``StartFailed``) and exit code 1.

    A worker that cannot start (a shard truncated since the run began, a model that no longer builds)
    would print a traceback per replacement; the server counts these deaths against ``train.max_attempts``
    and quotes the error once when it stops the run."""
    try:
        return make_state()
    except BaseException as exc:  # noqa: BLE001 - the user's model may raise anything: reported, then exit 1
        with contextlib.suppress(OSError):
            outbox.send(StartFailed(error=error_text(exc)))
        exit_at_once(1)


def error_text(exc: BaseException) -> str:
    """What the server quotes of a worker's error: a MemtrainError's own text, else the exception and the last
    lines of its traceback."""
    if isinstance(exc, MemtrainError):
        return str(exc)
    return "".join(traceback.format_exception_only(exc)).strip() + "\n" + traceback.format_exc(limit=-4)


def become_worker(server_pid: int, blas_threads: int) -> None:
    """What a worker process sets up before it builds its model: it dies with its server, keeps freed memory,
    ignores the terminal's stop signals (the server stops it in order) and runs BLAS on ``blas_threads``."""
    _exit_with_parent(server_pid)
    keep_freed_memory()
    apply_test_limit()  # MEMTRAIN_WORKER_DATA_LIMIT (tests): a memory limit of this worker's own
    for stop in (signal.SIGINT, signal.SIGHUP):  # Ctrl-C or a closed terminal: the server stops us in order
        signal.signal(stop, signal.SIG_IGN)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(blas_threads)


def serve(state: WorkerState, inbox: Connection, outbox: Connection) -> None:
    """Say Ready, then answer messages until a Stop, the end of the inbox or the server's death."""
    server_pid = state.setup.server_pid
    outbox.send(Ready(pid=os.getpid()))
    poll = select.poll()
    poll.register(inbox.fileno(), select.POLLIN)
    while (message := _receive(inbox, server_pid, poll)) is not None:
        outbox.send(state.handle(message))


def _exit_with_parent(server_pid: int) -> None:
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    exit_if_orphaned(server_pid)  # the server died before the signal was armed


def exit_if_orphaned(server_pid: int) -> None:
    if os.getppid() != server_pid:
        os._exit(1)


def keep_freed_memory() -> None:
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


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the kernel once (glibc ``malloc_trim``), whatever
    ``keep_freed_memory`` says: for a process that did other work before it serves as a worker (an outline's
    kept child: version 0, the model's first parameters and the dry run's temporaries are garbage once the
    outline is sent), so that a worker's memory is what its tasks need."""
    gc.collect()
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator keeps its own policy
        ctypes.CDLL(None).malloc_trim(0)


def _receive(inbox: Connection, server_pid: int, poll: select.poll) -> Message | None:
    """The next message (None: stop). ``poll`` watches ``inbox`` alone: made once, as a selector made per
    message (``Connection.poll``) costs more than the wait."""
    while not poll.poll(PARENT_POLL_SECONDS * 1000):
        if os.getppid() != server_pid:
            return None
    try:
        message = inbox.recv()
    except (EOFError, OSError):
        return None
    return None if isinstance(message, Stop) else message


class WorkerState:
    """What a worker keeps between messages: the model, the mapped shards and round files, the board.

    ``board`` is the board the rounds meet at (the exchange's file; the server passes its in-memory one
    when it runs the rounds alone), ``chores`` the server's chores between two updates then.
    ``keep_statistics``: an evaluation task's statistics stay in ``kept_statistics`` (keyed by version, task
    and attempt) instead of going to a file: the server's own state, whose reader is in the same process.
    ``plan``, ``dataset``, ``context``: the server's own, shared with the rounds it runs itself (the dataset
    opened and its manifest verified once, the model built once; an outline when its workers compute every
    gradient, train/server/outline.py).
    """

    def __init__(self, setup: WorkerSetup, *, alive: Callable[[], None], board: Board | None = None,
                 chores: Callable[[], bool] | None = None, keep_statistics: bool = False, plan: Plan | None = None,
                 dataset: Dataset | None = None, context: ModelContext | None = None, timer: Timer = UNTIMED):
        self.setup, self.alive, self.chores, self.timer = setup, alive, chores, timer
        self.kept_statistics: dict[tuple[int, int, int], np.ndarray] | None = {} if keep_statistics else None
        self.exchange = Path(setup.exchange_dir)
        self.run_dir = Path(setup.run_dir)
        self.dataset = dataset if dataset is not None else open_dataset(setup.dataset)
        self.context = context if context is not None else model_context(
            self.dataset, setup.model_kind, dict(setup.model_options), setup.normalize, setup.target_scale)
        train = self.dataset.split("train")
        self.plan = plan if plan is not None else round_plan(train.rows, setup.rounds)
        self.train_rows = TaskRows(train, self.context.normalize, ROW_CACHE_BYTES)  # the rows of gradient tasks
        self.maps = MapCache()
        self.board = board
        if hasattr(self.context.model, "in_worker"):  # e.g. a torch module pins its thread pool
            self.context.model.in_worker(setup.blas_threads)
        self._rounds: RoundFiles | None = None
        self._val_rows = RowCache(ROW_CACHE_BYTES)  # evaluated every epoch: read and normalized once
        # a task's loss and gradient; the straggler test hook slows a worker, never the server itself
        self.gradient = TaskGradient(self.context.model, seed=setup.rounds.seed,
                                     straggler=straggler_factor() if board is None else 1.0, timer=timer)
        # the handlers of a streamed gradient task and of a cluster's step slice, each handed what it uses
        self.streamed_gradient = StreamedGradient(layout=self.context.layout, maps=self.maps, run_dir=self.run_dir,
                                                  exchange=self.exchange, rows=self.task_rows, gradient=self.gradient)
        self.kept = KeptSum()  # a node ending a chain: its own step slice of the last partial (node_sum.py)
        self.published: tuple[int, list[Path]] = (-1, [])  # a node: the update whose partials it published last
        # and their files, removed by itself when its next update's part starts (``drop_partials``)
        self.dropped: list[Path] = []
        self.slice_step = SliceStep(layout=self.context.layout, optimizer=setup.optimizer,
                                    server_pid=setup.server_pid, run_dir=self.run_dir, exchange=self.exchange,
                                    kept=self.kept)
        # a node's task threads or worker processes (a two-level round's member)
        self.node_compute: NodeCompute | NodeProcesses | None = None

    def handle(self, message: Message) -> Result | StretchEnd:
        try:
            with np.errstate(all="ignore"):  # non-finite results are detected and reported, not warned about
                if isinstance(message, Stretch):
                    return self.stretch(message)
                self.maps.drop_deleted()
                if isinstance(message, GradTask):
                    return self.streamed_gradient(message)
                if isinstance(message, StepTask):
                    return self.slice_step(message)
                return self.statistics(message) if isinstance(message, StatsTask) else self.evaluate(message)
        except BaseException as exc:  # noqa: BLE001 - reported to the server, which stops the run with this text
            # (the user's model may raise anything, SystemExit or KeyboardInterrupt too: a failed task, never a
            # silent exit of the process)
            error = error_text(exc)
            if isinstance(message, Stretch):
                return StretchEnd(generation=message.generation, slot=message.slot, outcome=Outcome.FAILED,
                                  error=error)
            return Result(task=message.task, attempt=message.attempt, outcome=Outcome.FAILED, error=error)

    def node_range(self, tasks: list[GradTask], lo: int, scratch: Path, processes: int, *, sync: bool,
                   deadline: float, abandoned: Callable[[], bool], limit: TaskLimit,
                   own_slice: tuple[int, int] | None = None) -> tuple[list[float], str]:
        """A two-level round member's range (tasks ``lo``.. of the update) computed on the node's ``processes``
        threads into ``scratch`` and folded onto the update's chain in the exchange (train/loops/node_compute.py;
        the cluster's side, memtrain/cluster/nodes.py, hands it here): (task, loss, seconds of each, error).
        ``own_slice``: the range ends the chain, and this node steps slice [lo, hi) of it: those segments of the
        last partial are kept in memory for its step instead of published (``KeptSum``)."""
        self.node_compute = node_compute(self, self.node_compute, scratch, processes, worker_main)
        chain = PartialSum(self.exchange, update=tasks[0].ticket, attempt=0, version=tasks[0].version,
                           size=self.context.layout.size, sync=sync)
        if own_slice is not None:
            self.kept.expect(chain, *own_slice)
        self.drop_partials(tasks[0].ticket)
        return compute_range(self.node_compute, tasks, lo, chain, deadline=deadline, abandoned=abandoned,
                             limit=limit, keep=self.kept if own_slice is not None else None,
                             published=self.published[1])

    def drop_partials(self, update: int) -> None:
        """A node's part of update ``update`` starts: the partials it published for an earlier update are set
        aside, removed once its answer is written (``remove_dropped``: not before, so that its part is not
        slower). The server posts an update's node record only once the update before it is stepped, so nobody
        reads them any more; the server then removes none in a round where every node answered (docs/cluster.md,
        "The server told, not asking"), and those of a node lost with its state when that round ends."""
        if self.published[0] != update:
            self.dropped += self.published[1]
            self.published = (update, [])

    def remove_dropped(self) -> None:
        """Remove the partials ``drop_partials`` set aside (after the node's answer)."""
        paths, self.dropped = self.dropped, []
        discard(paths)

    def close(self) -> None:
        """Give back the node's task threads and the maps (a long-lived Dask worker's state, at the run's end)."""
        if self.node_compute is not None:
            self.node_compute.close()
            self.node_compute = None
        self.maps.close()

    def rounds(self) -> RoundFiles:
        if self._rounds is None:
            setup = self.setup
            board = self.board or Board(setup.rounds.slots, BOARD.path(self.exchange))
            self._rounds = RoundFiles(context=self.context, dataset=self.dataset, run_dir=self.run_dir,
                                      exchange=self.exchange, server_pid=setup.server_pid,
                                      optimizer=setup.optimizer, setup=setup.rounds,
                                      board=board, maps=self.maps, gradient=timed(self.timer, "gradient task",
                                                                                  self.gradient),
                                      plan=self.plan, rows=self.train_rows, timer=self.timer)
        return self._rounds

    def stretch(self, stretch: Stretch) -> StretchEnd:
        if stretch.loop is Loop.DESK:
            outcome = DeskParticipant(self.rounds(), stretch, alive=self.alive).run()
            return StretchEnd(generation=stretch.generation, slot=stretch.slot, outcome=outcome)
        outcome = Participant(self.rounds(), stretch, alive=self.alive, chores=self.chores,
                              timer=self.timer).run()
        return StretchEnd(generation=stretch.generation, slot=stretch.slot, outcome=outcome)

    def task_rows(self, epoch: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """The train rows of a gradient task of epoch ``epoch`` (positions [lo, hi): ``Plan.rows``), normalized."""
        return self.train_rows.get(self.plan.rows(epoch, lo, hi))

    def rows(self, split: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [lo, hi) of a split, normalized (evaluation, and the statistics of an additive model's full
        batch); the validation rows kept for the next epochs (as the rounds keep a task's rows, within
        ROW_CACHE_BYTES)."""
        if split == "val":
            return self._val_rows.get(lo, hi, lambda a, b: self._read(split, a, b))
        return self._read(split, lo, hi)

    def _read(self, split: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.dataset.split(split).read(lo, hi)
        return self.context.normalize(x), np.asarray(y)

    def statistics(self, message: StatsTask) -> Result:
        """An additive model's partial of one task, streamed ``chunk_rows`` rows at a time (train/loops/additive.py)."""
        task_partial(statistics_dir(self.run_dir) / partial_name(message.task, message.attempt),
                     self.context.stats_layout, self.context.model, message.lo, message.hi, message.chunk_rows,
                     lambda a, b: self._read("train", a, b))
        return Result(task=message.task, attempt=message.attempt, outcome=Outcome.DONE, rows=message.hi - message.lo)

    def evaluate(self, message: EvalTask) -> Result:
        weights = self.maps.get(weights_path(self.run_dir, message.version), (self.context.layout.size,), np.float32)
        params = self.context.layout.views(weights)
        x, y = self.rows("val", message.lo, message.hi)
        seen = evaluation(self.context, params, x, y)
        loss, predicted, proba = seen.loss, seen.predicted, seen.proba
        correct = int(np.count_nonzero(predicted == y)) if self.context.classifier else 0
        if self.kept_statistics is not None:
            self.kept_statistics[message.version, message.task, message.attempt] = task_statistics(
                self.context, params, x, y, predicted=predicted, proba=proba)
        else:
            write_task_statistics(self.exchange, message.version, message.task, message.attempt, self.context,
                                  params, x, y, predicted=predicted, proba=proba)
        return Result(task=message.task, attempt=message.attempt,
                      outcome=Outcome.DONE if math.isfinite(loss) else Outcome.NONFINITE,
                      loss=loss, rows=message.hi - message.lo, correct=correct)
