"""What every engine shares in a process: the run's files mapped, a task's rows read, the one whole-vector step.

- ``RoundFiles``: what a process keeps across stretches (the model, the plan, the round's files mapped: the
  gradient buffers, the optimizer state, the block digests, the records), used by the rounds' participants
  (train/loops/rounds.py), the desk (train/loops/desk.py), the server's whole-vector loop (train/loops/overlap.py) and a
  cluster's round (train/loops/stream.py, train/loops/sliced.py); ``RoundFiles.step_and_publish`` is the one
  whole-vector step-and-publish of every engine that steps the whole vector (the desk's groups, the server's
  updates).
- ``TaskRows``: a gradient task's rows, read and normalized (a view of the shard maps, or one gather), kept
  within ``ROW_CACHE_BYTES``; ``RowCache``: evaluation's rows kept the same way.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from memtrain.dataset import Dataset, GatherBuffers, Split, take_into
from memtrain.faults import fault_point
from memtrain.layout import building_path, private_path, weights_path
from memtrain.order import Rows
from memtrain.train.context import ModelContext
from memtrain.train.exchange.area import DIGESTS, GRADIENT_BUFFER, OPTIMIZER_STATE, RECORDS
from memtrain.train.exchange.marks import Board, open_records
from memtrain.train.exchange.weights import (
    commit_weights,
    digests_shape,
    ready_building,
    rounds_keep,
    versions_to_keep,
)
from memtrain.train.loops.gradient import TaskGradient
from memtrain.train.loops.maps import MapCache
from memtrain.train.loops.reduce import Scratch, reduce_and_step
from memtrain.train.messages import RoundSetup
from memtrain.train.optim import OptimizerConfig, state_names
from memtrain.train.plan import Plan, TaskRange, gradient_banks
from memtrain.train.timing import UNTIMED, Timer, timed_sections

DROP_DELETED_EVERY = 16  # updates between checks for maps of deleted files (a retired version not recycled)
# A task's rows are read (and normalized) once and kept for the next epochs, up to this many bytes of
# copies per process (views of the shard maps cost nothing and are always kept): on a small dataset
# reading and normalizing a task's rows costs more than computing its gradient, and a plain loop reads
# them once. Beyond the budget rows are read per task, as a dataset larger than RAM needs.
ROW_CACHE_BYTES = 32 << 20
THREAD_ROWS_SHARE = 2  # a helper thread's row cache: this fraction of ROW_CACHE_BYTES (it reads a share of the tasks)


def round_plan(train_rows: int, setup: RoundSetup) -> Plan:
    """The plan a participant derives on its own from what every participant is given."""
    return Plan(train_rows, setup.batch_size, setup.tasks_per_update, setup.seed, setup.epochs,
                shuffle=setup.shuffle, window=setup.shuffle_window)


class RoundFiles:
    """What a process keeps for the rounds across stretches: the model, the plan and the round's files, mapped.

    The files are made by the server before any stretch (``create_round_files`` in train/server/server.py): a
    gradient buffer per task, the optimizer state (two parities), the block digests, the records.
    """

    def __init__(self, *, context: ModelContext, dataset: Dataset, run_dir: Path, exchange: Path, server_pid: int,
                 optimizer: OptimizerConfig, setup: RoundSetup, board: Board, maps: MapCache, gradient: TaskGradient,
                 plan: Plan | None = None, rows: TaskRows | None = None, timer: Timer = UNTIMED):
        self.context, self.run_dir, self.exchange, self.server_pid = context, run_dir, exchange, server_pid
        timed_sections(self, timer, ("rows",))
        self.gradient = gradient  # a task's loss and gradient (train/loops/gradient.py), this process's
        self.optimizer, self.setup, self.board, self.maps = optimizer, setup, board, maps
        self.train = dataset.split("train")
        self.size = context.layout.size
        # the plan: derived here, or the server's own when it runs the rounds itself (each epoch's list made once)
        self.plan = plan if plan is not None else round_plan(self.train.rows, setup)
        self.records = open_records(RECORDS.path(exchange), self.plan.per_epoch, setup.tasks_per_update)
        # each field of the records as an array (an update writes a field of its row: a row's field costs a
        # microsecond, a column's element a tenth of that)
        self.columns = {name: self.records[name] for name in self.records.dtype.names}
        self.loss, self.seconds, self.bad = self.columns["loss"], self.columns["seconds"], self.columns["bad"]
        self.grads = [[self._map(GRADIENT_BUFFER.path(exchange, t, bank)) for t in range(setup.tasks_per_update)]
                      for bank in range(gradient_banks(setup.staleness))]  # by plan.gradient_bank
        self.state = [{name: self._map(OPTIMIZER_STATE.path(exchange, name, parity)) for name in state_names(optimizer)}
                      for parity in (0, 1)]
        self.digests = maps.get(DIGESTS.path(exchange), digests_shape(self.size), np.uint8, "r+")
        self.scratch = Scratch()
        self._building: tuple[int, Path] = (-1, run_dir)
        # the views of the task buffers and of the versions in use: a few maps, each kept alive by its views
        self._views: OrderedDict[int, tuple[np.ndarray, dict[str, np.ndarray]]] = OrderedDict()
        self.keep = rounds_keep(setup.keep_versions, setup.staleness)  # versions kept as the rounds ready a file
        self._views_kept = setup.tasks_per_update + self.keep + 2
        self._rows = rows if rows is not None else TaskRows(self.train, context.normalize, ROW_CACHE_BYTES)
        self._thread_rows: dict[int, TaskRows] = {}  # the server's helper threads' own readers (train/loops/threads.py)
        # the server alone: the ring's files it readied and still holds at their names, ring -> (inode, map), kept
        # across stretches (``ready_private``)
        self._ring: dict[int, tuple[int, np.ndarray]] = {}

    def _map(self, path: Path, mode: str = "r+") -> np.ndarray:
        return self.maps.get(path, (self.size,), np.float32, mode)

    def weights(self, version: int) -> np.ndarray:
        return self._map(weights_path(self.run_dir, version), "r")

    def building_path(self, version: int) -> Path:
        """The unpublished file of ``version`` (asked for by the step, the publication and the next step)."""
        if self._building[0] != version:
            self._building = (version, building_path(self.run_dir, version, self.server_pid))
        return self._building[1]

    def building(self, version: int) -> np.ndarray:
        return self._map(self.building_path(version))

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """The model's named views of a mapped vector, made once per map (the maps are kept: train/loops/maps.py)."""
        entry = self._views.get(id(flat))
        if entry is None or entry[0] is not flat:
            entry = self._views[id(flat)] = (flat, self.context.layout.views(flat))
            while len(self._views) > self._views_kept:  # never pins more than a few files' pages
                self._views.popitem(last=False)
        self._views.move_to_end(id(flat))
        return dict(entry[1])  # a fresh dict: a model may keep or change the one it is given

    def rows(self, epoch: int, rows: TaskRange, *, thread: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The rows of a task of epoch ``epoch``, normalized (kept for later epochs while ROW_CACHE_BYTES allows).

        ``thread``: the server's task thread reading them (train/loops/threads.py). A reader reuses its buffers, so
        each helper thread has its own, kept across stretches, its cache ROW_CACHE_BYTES / THREAD_ROWS_SHARE."""
        return self.reader(thread).get(self.plan.rows(epoch, rows.lo, rows.hi))

    def reader(self, thread: int) -> TaskRows:
        """Thread ``thread``'s row reader (0: the process's own); made in the calling thread, before any
        helper runs (``Participant.run``)."""
        if thread == 0:
            return self._rows
        reader = self._thread_rows.get(thread)
        if reader is None:
            reader = self._thread_rows[thread] = TaskRows(self.train, self.context.normalize,
                                                          ROW_CACHE_BYTES // THREAD_ROWS_SHARE)
        return reader

    def private_path(self, ring: int) -> Path:
        """The ring's file ``ring`` of the rounds in the server alone (``layout.private_path``)."""
        return private_path(self.run_dir, ring, self.server_pid)

    def ready_private(self, version: int, ring: int, *, left_from: int | None = None) -> tuple[np.ndarray, int | None]:
        """Make sure the ring's file ``ring`` exists for the step of ``version`` (a retired version recycled, the
        versions older than the newest ``keep`` before it retired); returns it mapped, and the oldest version that
        may be left on disk now. ``left_from``: that version as an earlier call of the stretch returned it (every
        older one is retired), so the folder is not listed again; None: it is (once per stretch). A ring file this
        process readied and has not published (a stretch publishes its newest ``keep``; the ring's other file
        stays) is taken again as it is, once a stat shows that its name still holds that file: nobody else writes
        it, and its header was checked when it was readied."""
        path = self.private_path(ring)
        kept = self._ring.pop(ring, None)
        if kept is not None:
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == kept[0]:
                    self._ring[ring] = kept
                    return kept[1], left_from  # nothing retired
        ready_building(self.run_dir, version, self.size, self.server_pid, self.keep, path=path, left_from=left_from)
        mapped = self._map(path)
        self._ring[ring] = (os.stat(path).st_ino, mapped)
        return mapped, version - self.keep  # every version before it retired

    def published_ring(self, ring: int) -> None:
        """The ring's file ``ring`` was renamed into place as a version: the next stretch readies another."""
        self._ring.pop(ring, None)

    def ready_building(self, version: int) -> None:
        ready_building(self.run_dir, version, self.size, self.server_pid, self.keep, fast=True,
                       path=self.building_path(version))

    def step_and_publish(self, version: int, grads: list[np.ndarray], rows: int, lr: float, *, oldest: int,
                         left_from: int | None, recycle: bool = True,
                         publish_sync: Callable[[Path], None] | None = None) -> tuple[bool, int]:
        """The one step-and-publish of a process that steps the whole vector (async mode at the desk or
        streamed, fixed staleness streamed, a replay): ``version`` + the optimizer step of ``grads``' mean
        (added in list order) -> ``version`` + 1, renamed into place (and ``publish_sync``-ed).

        First the file is readied, retiring the versions older than the newest ``versions_to_keep`` (the one
        keep rule; ``oldest``: the oldest version a gradient in flight or still to come reads; ``left_from``:
        the oldest version that may be left on disk, None if not known: the folder is listed). Returns
        whether the step came out finite (else nothing is published: the update is skipped) and the oldest
        version that may be left on disk now (the next step's ``left_from``)."""
        keep = versions_to_keep(self.setup.keep_versions, version, oldest)
        path = self.building_path(version + 1)
        ready_building(self.run_dir, version + 1, self.size, self.server_pid, keep, recycle=recycle,
                       left_from=left_from, path=path)
        left = version - keep + 1 if left_from is None else max(left_from, version - keep + 1)  # older: retired
        parity = version % 2  # the optimizer state of version n is in buffer n % 2, as in the round
        if not reduce_and_step(grads=grads, rows=rows, weights=self.weights(version), state_in=self.state[parity],
                               weights_out=self.building(version + 1), state_out=self.state[1 - parity], lo=0,
                               hi=self.size, optimizer=self.optimizer, step=version + 1, lr=lr,
                               digests=self.digests[(version + 1) % 2], trainable=self.context.layout.trainable,
                               scratch=self.scratch):
            return False, left
        commit_weights(path, self.run_dir, version + 1)
        fault_point("after_publish")  # renamed, not recorded yet: the server deletes it, the update is made again
        if publish_sync is not None:
            publish_sync(weights_path(self.run_dir, version + 1))
        if version % DROP_DELETED_EVERY == 0:
            self.maps.drop_deleted()
        return True, left


class RowCache:
    """Rows [lo, hi) -> (x, y) as ``read`` gives them, kept while the copies among them fit in ``budget`` bytes.

    Views of the shards' maps cost no memory and are always kept. Kept arrays are made read-only, as the
    maps' views already are: every later epoch reads them.
    """

    def __init__(self, budget: int):
        self.budget, self.used = budget, 0
        self._kept: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def get(self, lo: int, hi: int, read: Callable[[int, int], tuple[np.ndarray, np.ndarray]]
            ) -> tuple[np.ndarray, np.ndarray]:
        kept = self._kept.get((lo, hi))
        if kept is not None:
            return kept
        rows = read(lo, hi)
        copied = sum(_private_bytes(a) for a in rows)
        if self.used + copied <= self.budget:
            for array in rows:
                array.flags.writeable = False
            self._kept[lo, hi] = rows
            self.used += copied
        return rows


class TaskRows:
    """A task's rows of one split as the plan gives them (``Plan.rows``: a range, or row indices in order) ->
    (x, y), normalized: the one reader of every engine's training rows.

    A range is read as ``RowCache`` keeps it (a view of the shard's map when it lies in one). Row indices
    (``train.shuffle = "rows"``) cost one copy of the task's rows, whatever else: when the whole split,
    normalized, fits in ``budget`` bytes it is read and normalized once, and every task is one ``take`` from
    it; otherwise a task is one gather from the shards' maps (``Split.gather``: one ``take`` per shard),
    normalized in place. Either way into reused buffers (``GatherBuffers``: never one the caller still holds),
    so a task allocates nothing. Normalizing is per element, so every way gives the same bits.
    """

    def __init__(self, split: Split, normalize: Callable[..., np.ndarray], budget: int):
        self.split, self.normalize, self.budget = split, normalize, budget
        self._ranges = RowCache(budget)
        self._buffers = GatherBuffers(split)  # rows as the shards hold them, normalized in place
        self._normalized = GatherBuffers(split, x_shape=(math.prod(split.x_shape),), x_dtype=np.float32)
        self._whole: tuple[np.ndarray, np.ndarray] | None = None
        self._fits = split.rows * (4 * math.prod(split.x_shape) + split.y_dtype.itemsize * math.prod(split.y_shape)
                                   ) <= budget

    def get(self, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(rows, range):
            return self._ranges.get(rows.start, rows.stop, self.read)
        if self._fits:
            if self._whole is None:
                x, y = self.read(0, self.split.rows)
                self._whole = x, np.ascontiguousarray(y)
            if len(rows) and (rows.min() < 0 or rows.max() >= self.split.rows):
                raise IndexError(f"row index out of range for the train split of {self.split.rows} rows")
            x, y = self._normalized.next(len(rows))
            return take_into(self._whole[0], rows, x), take_into(self._whole[1], rows, y)
        x, y = self.split.gather(rows, self._buffers.next(len(rows)))
        return self.normalize(x, in_place=True), y

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.split.read(lo, hi)
        return self.normalize(x), np.asarray(y)


def _private_bytes(array: np.ndarray) -> int:
    """The bytes of memory that keeping ``array`` holds: none for a view of a file map, else its whole base's."""
    root = array
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    return 0 if isinstance(root, mmap.mmap) else getattr(root, "nbytes", array.nbytes)


