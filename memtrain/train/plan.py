"""Job + split sizes -> the fixed list of updates and tasks (row ranges); the server's schedule.

The plan depends only on the job (rows, batch size, tasks per update, seed, epoch), never on the
worker count or on timing, which is what makes results bitwise identical with any number of workers.

Rows are read in contiguous ranges (fast, sequential I/O on datasets larger than RAM). The dataset was
shuffled once by ``prepare``; each epoch additionally visits the batches in a seeded random order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TaskRange:
    """Rows [lo, hi) of one split, computed by one task."""

    index: int  # position in the update: the reduction adds task results in this order
    lo: int
    hi: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Update:
    epoch: int
    batch: int  # index of this update within its epoch
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
                  epoch: int) -> list[Update]:
    """The updates of one epoch, in order. ``batch_size=None`` means one full-batch update."""
    if batch_size is None:
        batches = [(0, train_rows)]
    else:
        starts = range(0, train_rows, batch_size)
        order = np.random.default_rng([seed, epoch]).permutation(len(starts))
        batches = [(starts[k], min(starts[k] + batch_size, train_rows)) for k in order]
    return [Update(epoch, number, tuple(TaskRange(i, a, b)
                                        for i, (a, b) in enumerate(split_range(lo, hi, tasks_per_update))))
            for number, (lo, hi) in enumerate(batches)]


def eval_tasks(val_rows: int, eval_rows: int) -> tuple[TaskRange, ...]:
    pieces = split_range(0, val_rows, -(-val_rows // eval_rows)) if val_rows else []
    return tuple(TaskRange(i, a, b) for i, (a, b) in enumerate(pieces))
