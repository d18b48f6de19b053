"""A prepared dataset + an epoch position -> torch tensor batches for a ``DataLoader``: ``BatchDataset``.

This module is the only place the loader imports torch (``import torch`` here is the top-level package:
imports are absolute). The order is memtrain/order.py's: global batch k of an epoch is the same rows in
the same order whatever the number of ranks (``world``) and of ``DataLoader`` workers. Rank ``rank``
yields its contiguous part of each global batch; worker w of W takes the batches ``start + w``,
``start + w + W``, ... and, as a ``DataLoader`` takes one batch from each worker in turn, the loader
yields the global order. A position is just (epoch, batch), so ``state_dict`` / ``load_state_dict``
resume exactly, also on another number of ranks or workers, and ``start`` costs nothing.

Memory: in the process that iterates (``num_workers=0``) each batch is one fresh tensor the rows are
copied into once. In a ``DataLoader`` worker the rows are gathered once into a free slot of the worker's
shared ring (memtrain/ring.py) and only the slot's number crosses the queue: the main process gets
tensors over the slot, with no copy and without torch's per-tensor file-descriptor passing. A slot is
reused only once nothing refers to its tensors any more, so the loader never writes into a tensor it has
handed out; the tensors are writable (no read-only warning). A pickled ``BatchDataset`` carries the
dataset's paths, not its rows: every worker maps the same files lazily and shares their pages.

>>> loader = torch.utils.data.DataLoader(BatchDataset(ds, 128, seed=0, epoch=3), batch_size=None,
...                                      num_workers=2)          # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from memtrain.dataset import Dataset, Split
from memtrain.errors import InputError
from memtrain.order import WINDOW, EpochOrder, check_integer, check_part, rank_part
from memtrain.ring import Layout, Ring, RingBatch, worker_ring


class BatchDataset(IterableDataset):
    """Tensor ``(x, y)`` batches of one epoch of a split, from global batch ``start`` on.

    The arguments mean what they mean for ``Dataset.batches``. Use it with ``batch_size=None`` in the
    ``DataLoader`` (the batches are made here). ``set_epoch(e)`` selects the epoch of the next pass, as
    with ``DistributedSampler``; each pass runs to the end of its epoch.

    >>> data = BatchDataset(memtrain.open_dataset("data/digits"), 128, seed=0, epoch=0)   # doctest: +SKIP
    >>> for x, y in torch.utils.data.DataLoader(data, batch_size=None, num_workers=2):    # doctest: +SKIP
    ...     ...
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, seed: int = 0, epoch: int = 0, start: int = 0,
                 rank: int = 0, world: int = 1, shuffle: str | bool = "rows", window: int = WINDOW,
                 drop_last: bool = False, split: str = "train") -> None:
        super().__init__()
        self.split: Split = dataset.split(split)
        self.batch_size, self.seed, self.shuffle, self.window = batch_size, seed, shuffle, window
        self.drop_last, self.rank, self.world = drop_last, rank, world
        self.epoch, self.start = 0, 0
        self._move(epoch, start)

    def _order(self, epoch: int | None = None) -> EpochOrder:
        return self.split.order(self.batch_size, seed=self.seed, epoch=self.epoch if epoch is None else epoch,
                                shuffle=self.shuffle, window=self.window, drop_last=self.drop_last)

    def _move(self, epoch: int, start: int) -> None:
        """The next pass is epoch ``epoch`` from batch ``start``: checked first, so a bad position changes nothing."""
        check_part(start, self.rank, self.world, self._order(epoch).batches)
        self.epoch, self.start = int(epoch), int(start)  # numpy integers are taken; the state holds plain ones
        self._yielded = 0  # batches this process has yielded in the current pass (num_workers=0)

    def __len__(self) -> int:
        """Global batches left in this pass: what the ``DataLoader`` yields."""
        return self._order().batches - self.start

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch ``epoch``, from its first batch."""
        self._move(epoch, 0)

    def state_dict(self, *, consumed: int | None = None) -> dict[str, int]:
        """The position to resume from: ``{"epoch": e, "batch": k}``, the next global batch to train on.

        ``consumed``: batches of the current pass your loop has taken from the ``DataLoader`` (needed with
        ``num_workers > 0``: the batches are made in the workers, which this object cannot see; without it,
        the batches this object has yielded in this process). A finished epoch resumes at the next one.
        """
        batches = self._order().batches
        taken = self._yielded if consumed is None else check_integer("consumed", consumed, 0, batches - self.start)
        position = self.start + taken
        return {"epoch": self.epoch + 1, "batch": 0} if position == batches else {"epoch": self.epoch,
                                                                                   "batch": position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (from ``state_dict``), with any number of ranks or workers."""
        if not isinstance(state, dict) or set(state) != {"epoch", "batch"}:
            raise InputError("a BatchDataset state is {'epoch': int, 'batch': int}", found=repr(state))
        self._move(state["epoch"], state["batch"])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        order = self._order()
        self._yielded = 0
        ring = None if info is None else worker_ring(self._layout())
        for k in range(self.start + worker, order.batches, workers):
            rows = rank_part(order.batch(k), self.rank, self.world)
            batch = self._tensors(rows, shared=False) if ring is None else self._into_ring(ring, rows)
            self._yielded += 1  # counted when handed out; only meaningful in the process that iterates
            yield batch

    def _layout(self) -> Layout:
        split = self.split
        largest = min(self.batch_size, split.rows)  # a batch_size past the split's rows makes one batch of them
        return Layout(rows=-(-largest // self.world), x_shape=split.x_shape, x_dtype=split.x_dtype.str,
                      y_shape=split.y_shape, y_dtype=split.y_dtype.str)

    def _into_ring(self, ring: Ring, rows: Any) -> RingBatch | tuple[torch.Tensor, torch.Tensor]:
        """In a worker: the batch gathered into a free slot of the worker's ring (only the slot's number
        crosses to the main process); when the receiver still holds every slot, a fresh shared tensor pair."""
        taken = ring.take(len(rows)) if len(rows) else None
        if taken is None:
            return self._tensors(rows, shared=True)
        slot, x, y = taken
        self.split.read_into(rows, (x, y))
        return ring.batch(slot, len(rows))

    def _tensors(self, rows: Any, *, shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x = _empty(len(rows), self.split.x_shape, self.split.x_dtype, shared)
        y = _empty(len(rows), self.split.y_shape, self.split.y_dtype, shared)
        self.split.read_into(rows, (x.numpy(), y.numpy()))
        return x, y


def _empty(rows: int, shape: tuple[int, ...], dtype: np.dtype, shared: bool) -> torch.Tensor:
    if not shared:  # a fresh, writable array the tensor owns (the cheapest way to make one: about 0.7 us)
        return torch.from_numpy(np.empty((rows, *shape), dtype))
    # in a worker whose ring is full: shared memory from the start, so sending it copies nothing more
    return torch.from_numpy(np.empty(0, dtype)).new_empty((rows, *shape)).share_memory_()
