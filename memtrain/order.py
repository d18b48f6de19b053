"""(split rows, batch size, seed, epoch, shuffle, window) -> the rows of each global batch of an epoch. No I/O.

An epoch's order depends only on these numbers: never on the worker or rank count, the placement, the
timing or the machine's memory, so every process derives the same batches on its own, and a position in
a run is just (epoch, batch). Three policies, each a small strategy with one interface (``EpochOrder``),
picked by name once (``epoch_order``):

- ``"rows"`` (the default): blocks of rows grouped into windows by a seeded, stratified draw, then the
  rows shuffled within each window (a block shuffle, as MosaicML Streaming's). The split's blocks are cut
  into at most ``BLOCKS_PER_WINDOW`` strata of consecutive blocks, and each window holds one block of
  every stratum, so every window spans the whole split: on a source sorted by class or by time each
  window, hence each batch and each stretch of training, has every part of it in its share (a window of
  blocks drawn at random could hold a few classes only, and the model drift towards them until the next
  window). Every epoch mixes rows into new batches, yet a batch's rows lie in at most
  ``BLOCKS_PER_WINDOW`` blocks, so reads keep locality on data larger than RAM. A window of at least
  the split's rows is a uniform shuffle.
- ``"batches"``: memtrain's order before row-level shuffling: contiguous row ranges of ``batch_size``
  visited in a seeded order per epoch (the same batches every epoch), bitwise as ``memtrain train`` did.
- ``"none"``: contiguous batches in file order.

Cost: setting up an epoch is O(blocks) (``"batches"``: O(batches)) time and memory; batch k is then
O(batch + window) whatever k is, and no more than one window's permutation is held at a time, so an
epoch needs neither O(rows) time to start at batch k nor O(rows) memory.

>>> order = epoch_order("rows", rows=1000, batch_size=128, seed=0, epoch=3, window=256)
>>> order.batches, len(order.batch(7))
(8, 104)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from memtrain.errors import InputError

SHUFFLES = ("rows", "batches", "none")
# Rows per shuffle window of the "rows" policy. 2**16 rows of 64 float32 features are 16 MiB: a window
# stays in the page cache of any machine that trains, so a batch gathered from it costs no more disk
# reads than a contiguous one, yet it mixes 64 blocks of 1,024 rows, one from each 64th of the split
# (on a class-sorted source of 10 classes, all 10 classes in every batch). Splits up to this size get a
# uniform shuffle. MosaicML Streaming's default block (1 << 18 samples) is of the same order.
WINDOW = 1 << 16
# Blocks per window: the window's rows come from this many blocks, one per stratum of the split. More
# blocks mix better but read from more places. A window holds whole blocks, so on a source sorted by class
# a class's share of a window is a whole number of blocks: with 16 blocks (10 classes, 216,000 rows) a
# class had 2% to 18% of a window, and a model trained on a class-sorted --no-shuffle dataset drifted
# towards the last window's classes, 1.3 to 1.8 points of validation accuracy below the same rows
# prepared shuffled (docs/train.md); with 64 the shares stay within 10% +- 2.3%. A block of 1,024 rows of
# 64 float32 features is 256 KiB of contiguous reads.
BLOCKS_PER_WINDOW = 64
Rows = range | np.ndarray  # a contiguous range of rows, or row indices in batch order
# The largest integer the loader takes anywhere (a count, a seed, an epoch, a window): what numpy's int64 holds,
# and a TOML or JSON integer (memtrain/config.py's MAX_SEED). Every integer argument is checked against it
# first, so a huge one is a clear error rather than an OverflowError from numpy halfway through.
LARGEST = 2**63 - 1


class EpochOrder(Protocol):
    """One epoch of one split: its number of batches and the rows of global batch k, in order."""

    batches: int

    def batch(self, k: int) -> Rows: ...


def check_order(shuffle: object, window: object) -> None:
    """Raise InputError naming the bad value when ``shuffle`` or ``window`` is not valid."""
    if shuffle not in SHUFFLES:
        raise InputError("unknown shuffle", where="shuffle", expected=" or ".join(map(repr, SHUFFLES)),
                         found=repr(shuffle))
    check_integer("window", window, 1)


def policy(shuffle: str | bool) -> str:
    """The policy's name: ``True`` and ``False`` mean what they meant before row shuffling.

    >>> policy(True), policy("rows")
    ('batches', 'rows')
    """
    if isinstance(shuffle, bool):
        return "batches" if shuffle else "none"
    return shuffle


def epoch_order(shuffle: str, *, rows: int, batch_size: int, seed: int, epoch: int, window: int = WINDOW,
                drop_last: bool = False) -> EpochOrder:
    """The order of epoch ``epoch`` of a split of ``rows`` rows under the policy ``shuffle``.

    ``drop_last`` leaves out the one batch of fewer than ``batch_size`` rows, if any.
    """
    check_order(shuffle, window)
    for name, value, low in (("rows", rows, 0), ("batch_size", batch_size, 1), ("seed", seed, 0),
                             ("epoch", epoch, 0)):
        check_integer(name, value, low)
    return ORDERS[shuffle](rows=int(rows), batch_size=int(batch_size), seed=int(seed), epoch=int(epoch),
                           window=int(window), drop_last=drop_last)


def batch_count(rows: int, batch_size: int, drop_last: bool) -> int:
    return rows // batch_size if drop_last else -(-rows // batch_size)


def rank_part(rows: Rows, rank: int, world: int) -> Rows:
    """Rank ``rank``'s contiguous part of a global batch among ``world`` ranks (near-equal sizes, in order).

    >>> rank_part(range(10, 20), 1, 3)
    range(13, 16)
    """
    n = len(rows)
    return rows[n * rank // world:n * (rank + 1) // world]


def check_part(start: int, rank: int, world: int, batches: int) -> None:
    """Raise InputError unless ``start`` is a batch of an epoch of ``batches`` (or its end) and ``rank`` one of
    ``world`` ranks."""
    check_integer("world", world, 1)
    check_integer("rank", rank, 0, world - 1)
    check_integer("start", start, 0, batches)


def check_integer(name: str, value: object, low: int, high: int = LARGEST) -> int:
    """``value`` as a Python int; InputError naming ``name`` unless it is an integer (Python's or numpy's, not a
    bool) in [low, high].

    >>> check_integer("epoch", np.int64(3), 0)
    3
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not low <= value <= high:
        top = "2**63 - 1" if high == LARGEST else high
        raise InputError(f"{name} must be an integer from {low} to {top}", where=name, found=repr(value))
    return int(value)


def _check_k(k: int, batches: int) -> None:
    if not 0 <= k < batches:
        raise IndexError(f"batch {k} outside an epoch of {batches} batches")


@dataclass(kw_only=True)
class FileOrder:
    """``"none"``: batch k is rows [k * batch_size, (k + 1) * batch_size)."""

    rows: int
    batch_size: int
    seed: int
    epoch: int
    window: int
    drop_last: bool
    batches: int = field(init=False)

    def __post_init__(self) -> None:
        self.batches = batch_count(self.rows, self.batch_size, self.drop_last)

    def batch(self, k: int) -> Rows:
        _check_k(k, self.batches)
        return range(k * self.batch_size, min((k + 1) * self.batch_size, self.rows))


@dataclass(kw_only=True)
class BatchOrder:
    """``"batches"``: the contiguous batches of ``"none"``, visited in a seeded order per epoch."""

    rows: int
    batch_size: int
    seed: int
    epoch: int
    window: int
    drop_last: bool
    batches: int = field(init=False)
    _order: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        every = -(-self.rows // self.batch_size)
        # exactly memtrain/train/plan.py's epoch_updates before row shuffling: do not change the generator
        order = np.random.default_rng([self.seed, self.epoch]).permutation(every)
        if self.drop_last and self.rows % self.batch_size:
            order = order[order != every - 1]
        self._order, self.batches = order, len(order)

    def batch(self, k: int) -> Rows:
        _check_k(k, self.batches)
        lo = int(self._order[k]) * self.batch_size
        return range(lo, min(lo + self.batch_size, self.rows))


@dataclass(kw_only=True)
class WindowOrder:
    """``"rows"``: rows shuffled within windows of at most ``BLOCKS_PER_WINDOW`` blocks, each block of a
    different stratum of the split.

    Blocks are ``window // B`` rows (the last one of the split may be shorter), ``B = BLOCKS_PER_WINDOW``
    (``window`` if fewer), so a window never holds more than ``window`` rows. With W = ceil(blocks / B)
    windows, stratum s is blocks [s * W, (s + 1) * W) in file order (the last may be shorter; at most B
    strata), each stratum's blocks are permuted by a generator seeded with (seed, epoch), and window w
    holds the w-th block of every stratum. Its rows are permuted by a generator seeded with
    (seed, epoch, w) alone, so any window, hence any batch, is computed without the ones before it.
    """

    rows: int
    batch_size: int
    seed: int
    epoch: int
    window: int
    drop_last: bool
    batches: int = field(init=False)
    window_blocks: int = field(init=False)  # BLOCKS_PER_WINDOW, fewer for a window of fewer rows
    block_rows: int = field(init=False)
    block_order: np.ndarray = field(init=False, repr=False)  # the blocks, window by window
    block_starts: np.ndarray = field(init=False, repr=False)  # where each window's blocks begin in block_order
    window_starts: np.ndarray = field(init=False, repr=False)  # epoch position where each window begins
    _window_starts: list[int] = field(init=False, repr=False)  # window_starts as Python ints
    _cached: tuple[int, np.ndarray] | None = field(init=False, default=None, repr=False)
    _last_window: int = field(init=False, default=0, repr=False)  # the last window a batch ended in

    def __post_init__(self) -> None:
        self.batches = batch_count(self.rows, self.batch_size, self.drop_last)
        self.window_blocks = min(BLOCKS_PER_WINDOW, self.window)
        self.block_rows = self.window // self.window_blocks
        blocks = -(-self.rows // self.block_rows)
        windows = max(1, -(-blocks // self.window_blocks))
        generator = np.random.default_rng([self.seed, self.epoch, 0])
        grid = np.full((-(-blocks // windows), windows), -1, dtype=np.int64)  # stratum x window -> block
        for s, first in enumerate(range(0, blocks, windows)):
            size = min(windows, blocks - first)
            grid[s, :size] = first + generator.permutation(size)
        by_window = grid.T
        self.block_order = by_window[by_window >= 0]
        self.block_starts = np.concatenate([[0], np.cumsum((by_window >= 0).sum(axis=1))])
        sizes = np.full(blocks, self.block_rows, dtype=np.int64)
        if blocks:
            sizes[-1] = self.rows - (blocks - 1) * self.block_rows
        per_window = np.add.reduceat(sizes[self.block_order], self.block_starts[:-1]) if blocks else sizes
        self.window_starts = np.concatenate([[0], np.cumsum(per_window)])
        self._window_starts = self.window_starts.tolist()

    def batch(self, k: int) -> Rows:
        return self.batch_of(k, self.window_rows)

    def batch_of(self, k: int, window: Callable[[int], np.ndarray]) -> np.ndarray:
        """Batch k's part of ``window(w)`` for the windows it spans: ``window`` is ``window_rows`` or an array
        made from it element by element along its last axis (a dataset's own places of those rows, say), so
        that work done once per window is not done again per batch."""
        _check_k(k, self.batches)
        lo, hi = k * self.batch_size, min((k + 1) * self.batch_size, self.rows)
        starts = self._window_starts  # bisect on a list: a numpy searchsorted costs microseconds per batch
        w = self._last_window  # batches run through windows in turn: most lie in the window of the one before
        if starts[w] <= lo and hi <= starts[w + 1]:
            return window(w)[..., lo - starts[w]:hi - starts[w]]
        first = bisect.bisect_right(starts, lo) - 1
        last = bisect.bisect_right(starts, hi - 1) - 1
        self._last_window = last
        pieces = []
        for w in range(first, last + 1):
            start = starts[w]
            pieces.append(window(w)[..., max(lo, start) - start:hi - start])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=-1)

    def window_rows(self, w: int) -> np.ndarray:
        """The rows of window ``w`` in epoch order (the last one used is kept: batches run through windows)."""
        if self._cached is None or self._cached[0] != w:
            blocks = self.block_order[self.block_starts[w]:self.block_starts[w + 1]]
            # a block is never longer than the split (a window past the split's size is one block of it)
            rows = (blocks[:, None] * self.block_rows + np.arange(min(self.block_rows, self.rows))).ravel()
            if rows.size and rows.max() >= self.rows:  # the split's last block is shorter: its rows past the end go
                rows = rows[rows < self.rows]
            rows = rows[np.random.default_rng([self.seed, self.epoch, 1, w]).permutation(len(rows))]
            rows.flags.writeable = False
            self._cached = w, rows
        return self._cached[1]


ORDERS: dict[str, type[FileOrder] | type[BatchOrder] | type[WindowOrder]] = {
    "rows": WindowOrder, "batches": BatchOrder, "none": FileOrder}
