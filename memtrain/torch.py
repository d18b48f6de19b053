"""A prepared dataset + an epoch position -> torch tensor batches for a ``DataLoader``: ``BatchDataset``.

This module is the only place the loader imports torch (``import torch`` here is the top-level package:
imports are absolute). The order is memtrain/order.py's: global batch k of an epoch is the same rows in
the same order whatever the number of ranks (``world``) and of ``DataLoader`` workers. Rank ``rank``
yields its contiguous part of each global batch; worker w of W takes the batches ``start + w``,
``start + w + W``, ... and, as a ``DataLoader`` takes one batch from each worker in turn, the loader
yields the global order. A position is just (epoch, batch), so ``state_dict`` / ``load_state_dict``
resume exactly, also on another number of ranks or workers, and ``start`` costs nothing. A state names
the order it belongs to (memtrain/position.py): another loader's is refused. The position counts the
batches handed to the loop: here when this process makes them, by ``BatchLoader`` when ``DataLoader``
workers do (their batches arrive as a ``Handover`` naming the loader's pass, so a plain ``DataLoader``'s
count, unknown here, is refused rather than guessed).

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

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from memtrain.dataset import Dataset, JoinedPlaces, Split
from memtrain.errors import InputError
from memtrain.order import WINDOW, EpochOrder, check_integer, check_part, policy, rank_part
from memtrain.position import ORDER, check_state, order_record
from memtrain.ring import Layout, Ring, RingBatch, worker_ring


class BatchDataset(IterableDataset):
    """Tensor ``(x, y)`` batches of one epoch of a split, from global batch ``start`` on.

    The arguments mean what they mean for ``Dataset.batches``. Use it with ``batch_size=None`` in the
    ``DataLoader`` (the batches are made here), or with ``BatchLoader``, which also counts the batches your
    loop takes when ``DataLoader`` workers make them. ``set_epoch(e)`` selects the epoch of the next pass, as
    with ``DistributedSampler``; each pass runs to the end of its epoch.

    >>> data = BatchDataset(memtrain.open_dataset("data/digits"), 128, seed=0, epoch=0)   # doctest: +SKIP
    >>> for x, y in BatchLoader(data, num_workers=2):                                    # doctest: +SKIP
    ...     ...
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, seed: int = 0, epoch: int = 0, start: int = 0,
                 rank: int = 0, world: int = 1, shuffle: str | bool = "rows", window: int = WINDOW,
                 drop_last: bool = False, split: str = "train") -> None:
        super().__init__()
        self.split: Split = dataset.split(split)
        order = self.split.order(batch_size, seed=seed, epoch=epoch, shuffle=shuffle, window=window,
                                 drop_last=drop_last)  # every argument of the order checked
        check_part(start, rank, world, order.batches)
        self.batch_size, self.seed, self.window = int(batch_size), int(seed), int(window)
        self.shuffle, self.drop_last, self.rank, self.world = policy(shuffle), bool(drop_last), int(rank), int(world)
        self.order_record = order_record(dataset.manifest, split=split, rows=self.split.rows,
                                         batch_size=self.batch_size, seed=self.seed, shuffle=self.shuffle,
                                         window=self.window, drop_last=self.drop_last)
        self._ident = secrets.token_hex(8)  # names this loader's batches on their way back from workers
        self._pass = 0
        self.epoch, self.start = 0, 0
        self._move(epoch, start)

    def _order(self, epoch: int | None = None) -> EpochOrder:
        return self.split.order(self.batch_size, seed=self.seed, epoch=self.epoch if epoch is None else epoch,
                                shuffle=self.shuffle, window=self.window, drop_last=self.drop_last)

    def _move(self, epoch: int, start: int) -> None:
        """The next pass is epoch ``epoch`` from batch ``start``: checked first, so a bad position changes nothing."""
        check_part(start, self.rank, self.world, self._order(epoch).batches)
        self.epoch, self.start = int(epoch), int(start)  # numpy integers are taken; the state holds plain ones
        self._begin(counter=None)

    def _begin(self, *, counter: str | None) -> int:
        """A new pass: nothing handed to the loop yet. ``counter``: who counts its batches as they are handed,
        ``"process"`` (``__iter__`` here, no workers) or ``"loader"`` (a ``BatchLoader``, with workers)."""
        self._pass += 1
        self._taken, self._counter = 0, counter
        return self._pass

    def __len__(self) -> int:
        """Global batches left in this pass: what the ``DataLoader`` yields."""
        return self._order().batches - self.start

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch ``epoch``, from its first batch."""
        self._move(epoch, 0)

    def state_dict(self, *, consumed: int | None = None) -> dict[str, Any]:
        """The position to resume from: ``{"epoch": e, "batch": k, "order": {...}}``, k the next global batch to
        train on, ``order`` what decides the rows of each batch (memtrain/position.py).

        Without ``consumed``: the batches of this pass handed to your loop, counted in this process when it
        makes them (no workers) or when a ``BatchLoader`` hands them over. A plain ``DataLoader``'s workers
        make them where this object cannot see: once their batches of this pass have arrived, the count is
        unknown here and this raises, unless ``consumed`` says how many your loop took. A finished epoch
        resumes at the next one.
        """
        batches = self._order().batches
        if consumed is None and get_worker_info() is not None:  # torchdata's StatefulDataLoader asks each worker
            raise InputError("a BatchDataset's position is kept in the process that iterates the DataLoader, not "
                             "in its workers (each makes every n-th batch)", where="state_dict",
                             hint="use memtrain.torch.BatchLoader, whose state_dict() is the position, with any "
                                  "number of workers")
        if consumed is None and self._counter != "loader" and _ARRIVED.get(self._ident) == self._pass:
            raise InputError("this pass's batches were made in DataLoader workers, which this BatchDataset cannot "
                             "count", where="consumed",
                             hint="pass state_dict(consumed=n), n the batches your loop took from the DataLoader "
                                  "in this pass, or iterate with memtrain.torch.BatchLoader, which counts them")
        taken = self._taken if consumed is None else check_integer("consumed", consumed, 0, batches - self.start)
        position = self.start + taken
        epoch, batch = (self.epoch + 1, 0) if position == batches else (self.epoch, position)
        return {"epoch": epoch, "batch": batch, ORDER: dict(self.order_record)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (from ``state_dict``), with any number of ranks or workers; a state of another
        order (dataset, split, batch_size, seed, shuffle, window, drop_last) is refused naming what differs."""
        self._move(*check_state(state, self.order_record))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor] | Handover]:
        info = get_worker_info()
        order = self._order()
        places = self.split.places(order)
        if info is None:  # in the process that iterates: each batch counted as it is handed to the loop
            self._begin(counter="process")
            for k in range(self.start, order.batches):
                batch = self._tensors(self._rows(places, order, k), places, shared=False)
                self._taken += 1
                yield batch
            return
        ring = worker_ring(self._layout())
        for k in range(self.start + info.id, order.batches, info.num_workers):
            rows = self._rows(places, order, k)
            yield Handover(ident=self._ident, step=self._pass, batch=self._into_ring(ring, rows, places))

    def _rows(self, places: JoinedPlaces | None, order: EpochOrder, k: int) -> Any:
        """This rank's part of batch k: its places in the joined shards (a rows order: 2 x rows), else its rows."""
        if places is not None:
            return places.batch(k, self.rank, self.world)
        return rank_part(order.batch(k), self.rank, self.world)

    def _read(self, rows: Any, places: JoinedPlaces | None, out: tuple[np.ndarray, np.ndarray]) -> None:
        if places is not None:  # rows are places from ``_rows``: two takes
            places.read_into(rows, out)
        else:
            self.split.read_into(rows, out)

    def _layout(self) -> Layout:
        split = self.split
        largest = min(self.batch_size, split.rows)  # a batch_size past the split's rows makes one batch of them
        return Layout(rows=-(-largest // self.world), x_shape=split.x_shape, x_dtype=split.x_dtype.str,
                      y_shape=split.y_shape, y_dtype=split.y_dtype.str)

    def _into_ring(self, ring: Ring, rows: Any, places: JoinedPlaces | None
                   ) -> RingBatch | tuple[torch.Tensor, torch.Tensor]:
        """In a worker: the batch gathered into a free slot of the worker's ring (only the slot's number
        crosses to the main process); when the receiver still holds every slot, a fresh shared tensor pair."""
        n = _count(rows)
        taken = ring.take(n) if n else None
        if taken is None:
            return self._tensors(rows, places, shared=True)
        slot, x, y = taken
        self._read(rows, places, (x, y))
        return ring.batch(slot, n)

    def _tensors(self, rows: Any, places: JoinedPlaces | None, *, shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
        n = _count(rows)
        x = _empty(n, self.split.x_shape, self.split.x_dtype, shared)
        y = _empty(n, self.split.y_shape, self.split.y_dtype, shared)
        self._read(rows, places, (x.numpy(), y.numpy()))
        return x, y


def _count(rows: Any) -> int:
    """The rows of a batch given as rows (a range or an array) or as places (a 2 x rows array)."""
    return rows.shape[1] if isinstance(rows, np.ndarray) and rows.ndim == 2 else len(rows)


def _empty(rows: int, shape: tuple[int, ...], dtype: np.dtype, shared: bool) -> torch.Tensor:
    if not shared:  # a fresh, writable array the tensor owns (the cheapest way to make one: about 0.7 us)
        return torch.from_numpy(np.empty((rows, *shape), dtype))
    # in a worker whose ring is full: shared memory from the start, so sending it copies nothing more
    return torch.from_numpy(np.empty(0, dtype)).new_empty((rows, *shape)).share_memory_()


@dataclass(frozen=True, kw_only=True)
class Handover:
    """A worker's batch on its way to the process that iterates; unpickled there, it notes that this pass's
    batches of loader ``ident`` have arrived (so a ``state_dict`` without a count is refused) and is the batch."""

    ident: str
    step: int  # the loader's pass
    batch: RingBatch | tuple[torch.Tensor, torch.Tensor]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _arrive, (self.ident, self.step, self.batch)


_ARRIVED: dict[str, int] = {}  # the newest pass whose batches arrived here from workers, by loader


def _arrive(ident: str, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    _ARRIVED[ident] = max(step, _ARRIVED.get(ident, 0))
    return batch


class BatchLoader(DataLoader):
    """A ``DataLoader`` over a ``BatchDataset`` (``batch_size=None``) that counts the batches it hands to your
    loop, so ``state_dict()`` (its own or the dataset's) is the exact position with workers too, as torchdata's
    ``StatefulDataLoader`` offers; ``load_state_dict`` resumes there. Keyword arguments are the
    ``DataLoader``'s; ``persistent_workers`` is refused (the workers would keep the first pass's position).

    >>> loader = BatchLoader(BatchDataset(ds, 128, seed=0), num_workers=2)   # doctest: +SKIP
    >>> for step, (x, y) in enumerate(loader): ...                          # doctest: +SKIP
    >>> torch.save(loader.state_dict(), "loader.pt")                        # doctest: +SKIP
    """

    dataset: BatchDataset

    def __init__(self, dataset: BatchDataset, **kwargs: Any) -> None:
        if not isinstance(dataset, BatchDataset):
            raise InputError("a BatchLoader loads a memtrain.torch.BatchDataset", found=type(dataset).__name__)
        for key, allowed in (("batch_size", None), ("persistent_workers", False)):
            if key in kwargs and kwargs[key] != allowed:
                raise InputError(f"a BatchLoader takes {key}={allowed} (the BatchDataset makes the batches and "
                                 "knows the position)", where=key, found=repr(kwargs[key]))
        super().__init__(dataset, **(kwargs | {"batch_size": None}))

    def __iter__(self) -> Iterator[Any]:
        if not self.num_workers:  # the dataset is iterated in this process, and counts its batches itself
            return super().__iter__()
        step = self.dataset._begin(counter="loader")  # before the workers get their copy: their batches carry it
        return self._counted(super().__iter__(), step)

    def _counted(self, batches: Iterator[Any], step: int) -> Iterator[Any]:
        data = self.dataset
        for batch in batches:
            if data._pass == step:  # not once the position moved (set_epoch, load_state_dict) or a new pass began
                data._taken += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The dataset's position: the batches handed to your loop so far in this pass."""
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration resumes at ``state``."""
        self.dataset.load_state_dict(state)
