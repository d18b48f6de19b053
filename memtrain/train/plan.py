"""Job + split sizes -> the fixed list of updates and tasks, the rows of each task, and who does which part of a round.

The plan depends only on the job (rows, batch size, tasks per update, seed, epoch, ``train.shuffle`` and
``train.shuffle_window``), never on the worker count or on timing, which is what makes results bitwise
identical with any number of workers. Because it is fixed, every participant of a round derives it on its
own (``Plan``): a worker is handed a whole stretch of it in one message, not one task at a time.

A task is the positions [lo, hi) of its epoch's **row sequence**, and ``Plan.rows`` is the one place that
turns them into rows of the train split (memtrain/order.py decides the order):

- ``train.shuffle = "rows"``: the sequence is the epoch's row-level order (order.py's ``"rows"``: a seeded
  block order, rows shuffled within windows of ``shuffle_window`` rows), batch k is its positions
  [k * batch_size, (k + 1) * batch_size), as order.py's ``batch(k)``, and a task is a contiguous part of it
  (as ``rank_part`` cuts a batch): its rows are row indices, read with one gather. Every epoch mixes rows
  into new batches.
- ``"batches"`` (the order before row shuffling): the sequence is the split in file order and each epoch
  visits the contiguous batches in a seeded order (order.py's ``"batches"``): a task's rows are a range.
- ``"none"``: file order, batches in order.

A full-batch job (``train.batch_size`` unset) has one batch of every row, whatever the shuffle: its tasks are
row ranges.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from memtrain.order import WINDOW, EpochOrder, Rows, epoch_order
from memtrain.train.records.counters import epoch_number

if TYPE_CHECKING:
    from memtrain.config import TrainConfig
    from memtrain.dataset import Dataset

SHARDS_NAMED, ROWS_NAMED = 3, 5  # a shuffled task's shards and rows named in its description (it has many)


@dataclass(frozen=True)
class TaskRange:
    """Positions [lo, hi) of a split's row sequence, computed by one task: rows [lo, hi), except for a shuffled
    plan's train tasks, whose rows ``Plan.rows`` gives."""

    task: int  # position in the update: the reduction adds task results in this order
    lo: int
    hi: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Update:
    """One update: its gradients added in task order. In synchronous training they are computed at the
    version the previous update published; with fixed staleness k, at an earlier one (``gradient_base``)."""

    epoch: int
    batch: int  # this update's number within its epoch
    update: int  # its number in the run
    tasks: tuple[TaskRange, ...]

    @property
    def rows(self) -> int:
        return sum(task.rows for task in self.tasks)


def split_range(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """Cut [lo, hi) into at most ``parts`` contiguous, near-equal, non-empty pieces."""
    parts = max(1, min(parts, hi - lo))
    edges = [lo + (hi - lo) * k // parts for k in range(parts + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def updates_per_epoch(train_rows: int, batch_size: int | None) -> int:
    if batch_size is None:
        return 1
    return -(-train_rows // batch_size)


def epoch_updates(train_rows: int, batch_size: int | None, tasks_per_update: int, seed: int,
                  epoch: int, *, shuffle: str) -> list[Update]:
    """The updates of one epoch, in order, each task positions [lo, hi) of the epoch's row sequence (see the
    module's text; with ``shuffle`` "batches" or "none", or a full batch, these are rows). ``batch_size=None``
    means one full-batch update."""
    if batch_size is None:
        batches = [(0, train_rows)]
    else:
        starts = range(0, train_rows, batch_size)
        # "batches": exactly the order before row shuffling (order.py's BatchOrder): do not change the generator
        order = np.random.default_rng([seed, epoch]).permutation(len(starts)) if shuffle == "batches" else \
            range(len(starts))
        batches = [(starts[k], min(starts[k] + batch_size, train_rows)) for k in order]
    first = epoch * len(batches)
    return [Update(epoch, number, first + number, batch_tasks(lo, hi, tasks_per_update))
            for number, (lo, hi) in enumerate(batches)]


@functools.lru_cache(maxsize=4096)
def batch_tasks(lo: int, hi: int, tasks_per_update: int) -> tuple[TaskRange, ...]:
    """The tasks of the batch that is positions [lo, hi): made once (for the 4,096 batches used last), since every
    epoch has the same batches in another order (making them was most of the cost of an epoch's list of updates)."""
    return tuple(TaskRange(i, a, b) for i, (a, b) in enumerate(split_range(lo, hi, tasks_per_update)))


class Plan:
    """The job's schedule as every participant of a round sees it: the same in every process.

    ``shuffle`` and ``window`` are ``train.shuffle`` and ``train.shuffle_window`` (memtrain/order.py).
    """

    def __init__(self, train_rows: int, batch_size: int | None, tasks_per_update: int, seed: int, epochs: int, *,
                 shuffle: str, window: int = WINDOW):
        self.train_rows, self.batch_size, self.tasks_per_update = train_rows, batch_size, tasks_per_update
        self.seed, self.epochs, self.shuffle, self.window = seed, epochs, shuffle, window
        self.per_epoch = updates_per_epoch(train_rows, batch_size)
        self.total_updates = self.per_epoch * epochs
        self._epoch: tuple[int, list[Update]] | None = None
        self._orders: dict[int, EpochOrder] = {}  # "rows": the row order of the epochs in use (two at most)

    def updates(self, epoch: int) -> list[Update]:
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = epoch, epoch_updates(self.train_rows, self.batch_size, self.tasks_per_update, self.seed,
                                               epoch, shuffle=self.shuffle)
        return self._epoch[1]

    @property
    def shuffled(self) -> bool:
        """Whether tasks are positions of a row-level order (``Plan.rows`` gives row indices), not row ranges."""
        return self.shuffle == "rows" and self.batch_size is not None

    def rows(self, epoch: int, lo: int, hi: int) -> Rows:
        """The train rows of the task that is positions [lo, hi) of epoch ``epoch``'s row sequence, in order: a
        range (contiguous: read without a copy), or row indices (read with one gather). A task lies within
        one batch; O(batch + window) for a shuffled one, whatever the epoch or batch.

        >>> Plan(10, 4, 2, 0, 1, shuffle="batches").rows(0, 4, 6)
        range(4, 6)
        """
        if not self.shuffled:
            return range(lo, hi)
        order = self._orders.get(epoch)
        if order is None:
            while len(self._orders) >= 2:  # an async epoch's end may still read the previous epoch's tasks
                del self._orders[min(self._orders)]
            order = self._orders[epoch] = epoch_order("rows", rows=self.train_rows, batch_size=self.batch_size,
                                                      seed=self.seed, epoch=epoch, window=self.window)
        k = lo // self.batch_size
        first = k * self.batch_size
        return order.batch(k)[lo - first:hi - first]

    def update(self, update: int) -> Update:
        """An update by its number in the run."""
        return self.updates(update // self.per_epoch)[update % self.per_epoch]


def in_rounds(train: TrainConfig, *, replaying: bool) -> bool:
    """Whether the rounds run the job's updates (synchronous, or fixed staleness in the rounds; not a replay):
    asked once, by ``Trainer.choose`` and by the outline that keeps its child as the rounds' first worker."""
    return not replaying and train.mode == "sync" and train.staleness_in == "rounds"


def task_owner(task: int, participants: int) -> int:
    """The slot that computes task ``task`` of every update (any choice gives the same bits: the reduction
    order is the task order, not the owner's)."""
    return task % participants


SEGMENT_BLOCKS = 4  # checksum blocks per segment: 256 Ki parameters, 1 MiB; a 1e6 vector is 4 segments, 1e7 is 39


def step_slices(size: int, participants: int, block: int) -> list[tuple[int, int]]:
    """The parameter slices of a step, one per participant at most, each a whole number of ``block``s
    (the checksum blocks, so each block's digest has one writer). Slice j is stepped by slot j."""
    blocks = -(-size // block)
    return [(a * block, min(b * block, size)) for a, b in split_range(0, blocks, min(participants, blocks))]


def member_slice(size: int, members: int, rank: int, block: int) -> tuple[int, int] | None:
    """Member ``rank``'s slice of a step dealt to ``members`` (``step_slices``); None when it has none: a vector of
    fewer blocks than members has fewer slices, and the last members step nothing.

    >>> member_slice(10, 2, 1, 8), member_slice(5, 2, 1, 8)
    ((8, 10), None)
    """
    slices = step_slices(size, members, block)
    return slices[rank] if rank < len(slices) else None


def node_step_deal(size: int, ranges: Sequence[tuple[int, int]], block: int, state_vectors: int = 0,
                   segment_blocks: int = SEGMENT_BLOCKS) -> list[tuple[int, int]]:
    """Each member's slice of the step in a round of nodes (their task ranges ``ranges``, ``node_tasks``), by rank,
    in whole segments (``segment_blocks`` checksum blocks of ``block`` parameters): the node ending the chain
    keeps its own slice of the last partial in its memory, never published (``node_sum.KeptSum``), and steps it
    from there.

    With an optimizer without state (``state_vectors`` = 0: SGD) the chain's last node steps [m, size) and its
    first node [0, m), the nodes between nothing ((0, 0)); ``m`` is the segment boundary at or below half the
    vector: the last node steps at least half, so that no node moves more than 3 vectors over the shared
    filesystem per update (docs/cluster.md, "Bytes per node per update"); one node in the chain steps it all.
    With optimizer state, which every slice owner reads and writes for its slice, the step is spread over the
    members as without nodes (``plan.step_slices``, in whole segments) -- concentrated on two nodes it would move
    more bytes through them, not fewer -- the last slice to the node ending the chain, the others to the ranks
    before it (fewer slices than members when the vector has fewer segments: the first ranks step nothing).

    >>> node_step_deal(10 * 65536, [(0, 2), (2, 3), (3, 6)], 65536, segment_blocks=2)
    [(0, 262144), (0, 0), (262144, 655360)]
    >>> node_step_deal(10 * 65536, [(0, 2), (2, 3), (3, 6)], 65536, state_vectors=2, segment_blocks=2)
    [(0, 131072), (131072, 393216), (393216, 655360)]
    >>> node_step_deal(10 * 65536, [(0, 2), (2, 3), (3, 6)], 65536, state_vectors=2, segment_blocks=8)
    [(0, 0), (0, 524288), (524288, 655360)]
    """
    step = segment_blocks * block
    active = [rank for rank, (lo, hi) in enumerate(ranges) if hi > lo]
    deal = [(0, 0)] * len(ranges)
    if not active:
        return deal
    if state_vectors:
        slices = step_slices(size, active[-1] + 1, step)
        deal[active[-1] + 1 - len(slices): active[-1] + 1] = slices
        return deal
    cut = 0 if len(active) == 1 else size // 2 // step * step
    deal[active[-1]] = (cut, size)
    if cut:
        deal[active[0]] = (0, cut)
    return deal


def eval_tasks(val_rows: int, eval_rows: int, *, at_least: int = 1) -> tuple[TaskRange, ...]:
    """The evaluation tasks of ``val_rows`` validation rows: contiguous pieces of at most ``eval_rows`` rows,
    and at least ``at_least`` of them (the job's ``tasks_per_update``, so that the participants of an update
    evaluate side by side) while there are rows for them. A function of the job alone, never of the worker
    count: the validation figures, summed in task order, are the same bits with any worker count.

    >>> [(t.lo, t.hi) for t in eval_tasks(512, 8192, at_least=2)]
    [(0, 256), (256, 512)]
    >>> [(t.lo, t.hi) for t in eval_tasks(10, 4, at_least=2)]
    [(0, 3), (3, 6), (6, 10)]
    """
    pieces = split_range(0, val_rows, max(-(-val_rows // eval_rows), at_least)) if val_rows else []
    return tuple(TaskRange(i, a, b) for i, (a, b) in enumerate(pieces))


# --- the schedule of the asynchronous modes (docs/async.md) ---
#
# Fixed staleness k: the gradients of update n (counted over the whole run, from 0) are computed at the
# weights as they stood after max(0, n - k) updates, and applied to the weights after n updates. This is
# a function of n and k alone, so the run is bitwise identical with any worker count and after any
# fault; k = 0 is synchronous training.


def gradient_base(update: int, staleness: int) -> int:
    """After how many updates stood the weights update ``update``'s gradients are computed at.

    >>> [gradient_base(n, 2) for n in range(5)]
    [0, 0, 0, 1, 2]
    """
    return max(0, update - staleness)


def gradient_banks(staleness: int) -> int:
    """Sets of gradient buffers the rounds keep: with fixed staleness a participant computes update n + 1's
    gradients while a peer may still step update n from its buffers, so updates alternate between two."""
    return 2 if staleness else 1


def gradient_bank(update: int, staleness: int) -> int:
    """The bank of gradient buffers update ``update``'s gradients are in (gradient_banks)."""
    return update % gradient_banks(staleness)


def startable_updates(done: int, staleness: int, total: int) -> range:
    """The updates whose gradients can be computed once ``done`` of ``total`` are applied: the next k + 1.
    Every later one needs weights that do not exist yet, so at most k + 1 updates are ever in flight.
    """
    return range(done, min(total, done + staleness + 1))


def live_bases(done: int, staleness: int) -> range:
    """The counts of applied updates whose weights the gradients in flight may need once ``done`` are applied:
    at most k + 1, the versions a fixed-staleness run keeps alive (a checkpoint carries the k older ones)."""
    return range(max(0, done - staleness), done + 1)


def task_stream(updates: list[Update]) -> tuple[TaskRange, ...]:
    """An epoch's tasks in plan order, numbered from 0: what async mode hands out to whichever worker is free."""
    ranges = [(task.lo, task.hi) for update in updates for task in update.tasks]
    return tuple(TaskRange(i, lo, hi) for i, (lo, hi) in enumerate(ranges))


def async_updates_per_epoch(tasks: int, group: int) -> int:
    """Async mode applies an epoch's ``tasks`` gradients ``group`` at a time; the last group may be smaller."""
    return -(-tasks // group)


def run_updates_per_epoch(train_rows: int, batch_size: int | None, tasks_per_update: int,
                          async_group: int | None) -> int:
    """Updates per epoch of a job: the plan's, or, in async mode (``async_group`` set), its groups (the same
    count whatever the shuffle)."""
    if async_group is None:
        return updates_per_epoch(train_rows, batch_size)
    updates = epoch_updates(train_rows, batch_size, tasks_per_update, 0, 0, shuffle="none")
    return async_updates_per_epoch(len(task_stream(updates)), async_group)


@dataclass(frozen=True)
class RowWords:
    """A task's rows in words, for the event log and errors: ``words(lo, hi)`` says rows [lo, hi) of ``split``,
    or, for a gradient task of epoch ``epoch`` of a shuffled plan (``train.shuffle = "rows"``), the positions
    [lo, hi) of that epoch's row order, the rows and shards they are."""

    dataset: Dataset
    plan: Plan

    def __call__(self, lo: int, hi: int, split: str = "train", epoch: int | None = None) -> str:
        data = self.dataset.split(split)
        if split != "train" or epoch is None or not self.plan.shuffled:
            names = ", ".join(data.shards[s].x_path.name for s, _, _ in data.segments(lo, hi))
            return f"rows {lo}-{hi} of the {split} split, shard {names}"
        rows = np.asarray(self.plan.rows(epoch, lo, hi))
        shards = np.unique(np.searchsorted(data.starts, rows, side="right") - 1).tolist()
        names = ", ".join(data.shards[s].x_path.name for s in shards[:SHARDS_NAMED])
        more = f" and {len(shards) - SHARDS_NAMED} more" if len(shards) > SHARDS_NAMED else ""
        listed = ", ".join(map(str, rows[:ROWS_NAMED].tolist()))
        others = f" and {len(rows) - ROWS_NAMED} more" if len(rows) > ROWS_NAMED else ""
        return (f"positions {lo}-{hi} of epoch {epoch_number(epoch)}'s shuffled row order of the train split "
                f"(train.shuffle = 'rows'): rows {listed}{others}, shard{'s' if len(shards) > 1 else ''} "
                f"{names}{more}")


def node_tasks(tasks: int, processes: Sequence[int]) -> list[tuple[int, int]]:
    """Tasks [0, ``tasks``) cut into one contiguous range per node, in node order, each about in proportion to
    the node's process count (``processes[j]`` >= 1). A function of its arguments only; a node may get an
    empty range (lo == hi), and then takes no part in the chain.

    >>> node_tasks(7, [1, 2, 1])
    [(0, 1), (1, 5), (5, 7)]
    >>> node_tasks(2, [1, 1, 1])
    [(0, 0), (0, 1), (1, 2)]
    """
    if not processes or min(processes) < 1:
        raise ValueError(f"every node needs at least one process, got {list(processes)}")
    total, edges, running = sum(processes), [0], 0
    for count in processes:
        running += count
        edges.append(tasks * running // total)
    return list(zip(edges, edges[1:], strict=False))
