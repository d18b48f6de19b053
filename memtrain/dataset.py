"""Dataset directory -> read-only access: the manifest, shards as memmaps, row ranges across shards.

Format ``memtrain.dataset`` version 3 (specified in docs/formats.md; version 2, without ``encoding``, is
read too). ``manifest.json``::

    {"format": "memtrain.dataset", "version": 3,
     "task": "classification" | "regression",
     "rows": int,                                  # train + val
     "x": {"shape": [F, ...], "dtype": "float32"}, # shape of ONE row
     "y": {"shape": [] | [K], "dtype": "int64" | "float32"},
     "classes": ["name", ...] | null,              # class index i has name classes[i]
     "splits": {"train": {"rows": int, "shards": [SHARD, ...]}, "val": {...}, "test": {...}},  # test: optional
     "stats": {"mean": [...], "std": [...], "min": [...], "max": [...]},  # per feature, train split
     "source": {...}, "options": {...}, "created": "ISO-8601",
     "encoding": {...} | null,                     # CSV/Parquet: how raw rows became x (memtrain/prepare/table.py)
     "record_checksum": "xxh3-128:.."}             # of every other field (files.seal): damage is refused
    SHARD = {"rows": int, "x": "train/x-00000.npy", "y": "train/y-00000.npy",
             "x_bytes": int, "y_bytes": int, "x_checksum": "xxh3-128:..", "y_checksum": "xxh3-128:.."}

Shard paths are relative and must resolve inside the dataset directory (no absolute path, no ``..``, no
symlink that leaves it). Opening checks every shard's header and exact size (cheap); ``verify=True``
also re-hashes them.

For your own training loop: ``len(ds)``, ``ds[i]`` / ``ds[a:b]`` / ``ds[[i, j]]`` and ``ds.batches(...)``
address the train split (``ds.split("val")`` has the same methods); ``batches`` follows memtrain/order.py
(global batch k by (seed, epoch) alone, ``start``, ``rank`` / ``world``), as ``memtrain.torch.BatchDataset``
does. Shards are mapped read-only and lazily; a pickled dataset carries only its paths and manifest, so
every process that unpickles it (a PyTorch ``DataLoader`` worker, say) maps the same files and shares
their pages with every other process.
"""

from __future__ import annotations

import bisect
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import CorruptFileError, InputError, MemtrainError, plural
from memtrain.files import check_npy, open_npy, read_json, unseal, verify_checksum, write_sealed_json
from memtrain.joined import join
from memtrain.layout import MANIFEST, OPTIONAL_SPLITS, SPLITS
from memtrain.order import (
    WINDOW,
    EpochOrder,
    Rows,
    WindowOrder,
    check_integer,
    check_part,
    epoch_order,
    policy,
    rank_part,
)
from memtrain.train.normalize import Normalizer

INT16_MAX = int(np.iinfo(np.int16).max)

FORMAT = "memtrain.dataset"
FORMAT_VERSION = 3  # 3: "encoding" (tables: levels, fill values, column order); 2: the manifest is sealed
READ_VERSIONS = (2, 3)  # 2 is read as 3 without an encoding; 1 had no checksum of its own and is refused


@dataclass(frozen=True)
class Shard:
    rows: int
    x_path: Path
    y_path: Path
    x_checksum: str
    y_checksum: str


@dataclass
class Split:
    """One split (train or val): its shards, mapped lazily and kept mapped."""

    name: str
    rows: int
    shards: list[Shard]
    x_shape: tuple[int, ...]
    x_dtype: np.dtype
    y_shape: tuple[int, ...]
    y_dtype: np.dtype
    # The dataset directory and its identity (inode) when it was opened: a shard mapped later must come from
    # the same directory, not from one that `prepare --overwrite` renamed into its place since.
    root: Path | None = None
    identity: int | None = None
    starts: list[int] = field(init=False)
    _maps: dict[int, tuple[np.ndarray, np.ndarray]] = field(init=False, default_factory=dict)
    _starts: np.ndarray = field(init=False, repr=False)
    _plain_maps: dict[int, tuple[np.ndarray, np.ndarray]] = field(init=False, default_factory=dict, repr=False)
    _joined_maps: Any = field(init=False, default=None, repr=False)  # None: not tried yet; False: not possible

    def __post_init__(self) -> None:
        self.starts = np.concatenate([[0], np.cumsum([s.rows for s in self.shards])]).astype(int).tolist()
        self._starts = np.asarray(self.starts, dtype=np.int64)
        if self.starts[-1] != self.rows:
            raise CorruptFileError(f"the {self.name} split's shard rows do not add up",
                                   expected=self.rows, found=self.starts[-1])

    def shard_arrays(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The (x, y) memmaps of shard ``index``, validated against the manifest on first use."""
        if index not in self._maps:
            shard = self.shards[index]
            x = open_npy(shard.x_path, shape=(shard.rows, *self.x_shape), dtype=self.x_dtype)
            y = open_npy(shard.y_path, shape=(shard.rows, *self.y_shape), dtype=self.y_dtype)
            # checked after mapping: a directory replaced after this check left us maps of the old one's files
            if self.root is not None and directory_identity(self.root) != self.identity:
                raise MemtrainError("the dataset changed since it was opened (it was replaced, e.g. by "
                                    "`memtrain prepare --overwrite`): its shards are another dataset's",
                                    path=self.root, hint="open it again (a training run: resume it, or start over)")
            self._maps[index] = (x, y)
        return self._maps[index]

    def segments(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """Rows [lo, hi) of the split as (shard, first row in shard, end row in shard) pieces."""
        if not 0 <= lo <= hi <= self.rows:
            raise IndexError(f"rows [{lo}, {hi}) outside the {self.name} split of {self.rows} rows")
        pieces = []
        position = lo
        while position < hi:
            shard = bisect.bisect_right(self.starts, position) - 1
            end = min(hi, self.starts[shard + 1])
            pieces.append((shard, position - self.starts[shard], end - self.starts[shard]))
            position = end
        return pieces

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [lo, hi) as arrays: a zero-copy view when they lie in one shard, a copy otherwise."""
        pieces = self.segments(lo, hi)
        if len(pieces) == 1:
            shard, a, b = pieces[0]
            x, y = self.shard_arrays(shard)
            return x[a:b], y[a:b]
        if not pieces:
            return (np.empty((0, *self.x_shape), self.x_dtype), np.empty((0, *self.y_shape), self.y_dtype))
        xs, ys = zip(*(self._slice(*piece) for piece in pieces), strict=True)
        return np.concatenate(xs), np.concatenate(ys)

    def _slice(self, shard: int, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.shard_arrays(shard)
        return x[a:b], y[a:b]

    def __len__(self) -> int:
        return self.rows

    def __repr__(self) -> str:
        return f"Split({self.name!r}: {plural(self.rows, 'row')} in {plural(len(self.shards), 'shard')})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its maps: the receiving process maps the same files (no copy of the data)."""
        return {key: value for key, value in self.__dict__.items()
                if key not in ("_maps", "_plain_maps", "_joined_maps")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _maps={}, _plain_maps={}, _joined_maps=None)

    def __getitem__(self, key: int | slice | Any) -> tuple[np.ndarray, np.ndarray]:
        """Rows as new (writable) arrays: ``split[i]`` one row, ``split[a:b]`` or ``split[[i, j, ...]]`` several."""
        if isinstance(key, slice):
            key = range(*key.indices(self.rows))
        index = np.asarray(key)
        if index.dtype == bool or not np.issubdtype(index.dtype, np.integer) and index.size:
            raise TypeError(f"rows are indexed by integers, slices or integer arrays, not {index.dtype}")
        index = index.astype(np.int64)
        if index.size and (index.min() < -self.rows or index.max() >= self.rows):
            raise IndexError(f"row index out of range for the {self.name} split of {self.rows} rows")
        index = np.where(index < 0, index + self.rows, index)
        flat = index.reshape(-1)
        x = np.empty((len(flat), *self.x_shape), self.x_dtype)
        y = np.empty((len(flat), *self.y_shape), self.y_dtype)
        shard_of = np.searchsorted(self.starts, flat, side="right") - 1
        for shard in np.unique(shard_of):
            mask = shard_of == shard
            xs, ys = self.shard_arrays(int(shard))
            x[mask], y[mask] = xs[flat[mask] - self.starts[shard]], ys[flat[mask] - self.starts[shard]]
        return x.reshape(index.shape + self.x_shape), y.reshape(index.shape + self.y_shape)

    def batches(self, batch_size: int, *, seed: int = 0, epoch: int = 0, start: int = 0, rank: int = 0,
                world: int = 1, shuffle: str | bool = "rows", window: int = WINDOW,
                drop_last: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Read-only numpy ``(x, y)`` batches of one epoch, from global batch ``start`` on (memtrain/order.py).

        ``shuffle="rows"`` mixes rows into new batches every epoch (rows shuffled within windows of
        ``window`` rows of a seeded block order); ``"batches"`` gives contiguous row ranges visited in a
        seeded order (the same batches every epoch, as ``memtrain train`` before row shuffling; ``True``
        means this, as it did); ``"none"`` (or ``False``) file order. The order depends only on
        (seed, epoch, batch_size, shuffle, window): global batch k is the same rows whatever ``world`` is,
        and rank ``rank`` of ``world`` yields its contiguous part of each. ``start=k`` begins at batch k
        without reading the batches before it.

        A batch of contiguous rows in one shard is a view of the mapped file (no copy); any other is
        gathered into one of two buffers that are reused only once nothing refers to them any more, so
        a batch you keep is never overwritten.

        >>> for x, y in ds.batches(128, seed=0, epoch=3):   # doctest: +SKIP
        ...     loss = step(x, y)
        """
        order = self.order(batch_size, seed=seed, epoch=epoch, shuffle=shuffle, window=window, drop_last=drop_last)
        check_part(start, rank, world, order.batches)
        buffers = GatherBuffers(self)
        places = self.places(order)
        if places is not None:  # the rows order: places in the joined arrays made a window at a time
            yield from self._joined_batches(places, buffers, start, rank, world)
            return
        for k in range(start, order.batches):
            rows = rank_part(order.batch(k), rank, world)
            if isinstance(rows, range):  # contiguous: a view of the mapped shard when it lies in one
                x, y = self.read(rows.start, rows.stop)
            else:
                x, y = self.gather(rows, buffers.next(len(rows)), in_range=True)
            yield _read_only(x), _read_only(y)

    def _joined_batches(self, places: JoinedPlaces, buffers: GatherBuffers, start: int, rank: int, world: int
                        ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``batches`` of a rows order from the joined shards: per batch, rank ``rank``'s part of its places
        and two takes into buffers nobody holds (the same rows, in the same order, as ``gather``)."""
        for k in range(start, places.order.batches):
            part = places.batch(k, rank, world)
            x, y = places.read_into(part, buffers.next(part.shape[1]))
            yield _read_only(x), _read_only(y)

    def places(self, order: EpochOrder) -> JoinedPlaces | None:
        """A rows order's batches as places in the split's joined shards (two takes per batch, nothing more:
        ``JoinedPlaces``), or None for another order or where the shards cannot be joined (then ``gather``)."""
        joined = self._joined() if isinstance(order, WindowOrder) else None
        return None if joined is None else JoinedPlaces(order, self._starts, joined)

    def order(self, batch_size: int, *, seed: int = 0, epoch: int = 0, shuffle: str | bool = "rows",
              window: int = WINDOW, drop_last: bool = False) -> EpochOrder:
        """The epoch's order of this split: ``order.batches`` global batches, ``order.batch(k)`` the rows of one."""
        batch_size = check_integer("batch_size", batch_size, 1)
        return epoch_order(policy(shuffle), rows=self.rows, batch_size=batch_size, seed=seed, epoch=epoch,
                           window=window, drop_last=drop_last)

    def read_into(self, rows: Rows, out: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``rows`` (a range or row indices, in order) copied into ``out``: plain copies for a range."""
        if not isinstance(rows, range):
            return self.gather(rows, out)
        done = 0
        for shard, a, b in self.segments(rows.start, rows.stop):
            xs, ys = self.shard_arrays(shard)
            np.copyto(out[0][done:done + b - a], xs[a:b])
            np.copyto(out[1][done:done + b - a], ys[a:b])
            done += b - a
        return out

    def gather(self, rows: np.ndarray, out: tuple[np.ndarray, np.ndarray], *, in_range: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``rows`` (in that order) copied into ``out``: one ``take`` from the shards joined into one
        array (memtrain/joined.py), or, where they cannot be joined, one ``take`` per shard they lie in.
        IndexError for a row outside the split (checked once: the takes then copy once, ``take_into``);
        ``in_range=True`` for rows that are by construction (an epoch order's): the check is left out.

        At a few microseconds per numpy call against about 30 us for the take of a 512-row batch of 256-byte
        rows, every call here counts: the joined path is three calls besides the takes."""
        x, y = out
        if not len(rows):
            return x, y
        if not in_range and (rows.min() < 0 or rows.max() >= self.rows):
            raise IndexError(f"row index out of range for the {self.name} split of {self.rows} rows")
        starts = self._starts
        joined = self._joined()
        if joined is not None:  # every shard's rows in one array each for x and y: one take each
            (xj, xshift), (yj, yshift) = joined
            shard_of = np.searchsorted(starts, rows, side="right") - 1
            take_into(xj, rows + xshift[shard_of], x)
            take_into(yj, rows + yshift[shard_of], y)
            return x, y
        # shard numbers in 16 bits where they fit: numpy's stable sort of them below is then a radix sort
        small = np.int16 if len(self.shards) <= INT16_MAX else np.int32
        shard_of = (np.searchsorted(starts, rows, side="right") - 1).astype(small)
        if (shard_of == shard_of[0]).all():  # straight into ``out``
            xs, ys = self._plain(int(shard_of[0]))
            local = rows - starts[shard_of[0]]
            take_into(xs, local, x)
            take_into(ys, local, y)
            return x, y
        # grouped by shard: one take per shard into consecutive rows of a scratch pair, then one scatter
        by_shard = np.argsort(shard_of, kind="stable")
        grouped = shard_of[by_shard]
        local = rows[by_shard] - starts[grouped]
        counts = np.bincount(grouped, minlength=len(self.shards))
        tx, ty = np.empty_like(x), np.empty_like(y)
        a = 0
        for shard in np.flatnonzero(counts).tolist():  # the per-shard cost is these two calls
            b = a + int(counts[shard])
            xs, ys = self._plain(shard)
            take_into(xs, local[a:b], tx[a:b])
            take_into(ys, local[a:b], ty[a:b])
            a = b
        x[by_shard] = tx
        y[by_shard] = ty
        return x, y

    def _joined(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None:
        """x's and y's shards each as one read-only array (memtrain/joined.py), made on first use; None
        where that cannot be done (then gathers go shard by shard)."""
        if self._joined_maps is None:
            for index in range(len(self.shards)):
                self.shard_arrays(index)  # every shard validated, and from the directory that was opened
            rows = [shard.rows for shard in self.shards]
            x = join([s.x_path for s in self.shards], rows, self.x_shape, self.x_dtype)
            y = join([s.y_path for s in self.shards], rows, self.y_shape, self.y_dtype)
            if self.root is not None and directory_identity(self.root) != self.identity:
                x = y = None  # replaced since: shard_arrays raises the error on the next plain read
            # per shard, what to add to a row's number for its place in the joined array
            self._joined_maps = ((x.array, x.first - self._starts[:-1]), (y.array, y.first - self._starts[:-1])) \
                if x and y else False
        return self._joined_maps or None

    def _plain(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard ``index``'s maps as plain arrays: indexing an ``np.memmap`` costs microseconds of Python."""
        plain = self._plain_maps.get(index)
        if plain is None:
            xs, ys = self.shard_arrays(index)
            plain = self._plain_maps[index] = (xs.view(np.ndarray), ys.view(np.ndarray))
        return plain

    def check_files(self) -> None:
        """Headers and exact sizes of every shard (no mapping, no hashing): catches truncation early."""
        for shard in self.shards:
            check_npy(shard.x_path, shape=(shard.rows, *self.x_shape), dtype=self.x_dtype)
            check_npy(shard.y_path, shape=(shard.rows, *self.y_shape), dtype=self.y_dtype)

    def verify(self) -> None:
        for shard in self.shards:
            verify_checksum(shard.x_path, shard.x_checksum)
            verify_checksum(shard.y_path, shard.y_checksum)


class JoinedPlaces:
    """A rows order's windows as places in a split's joined x and y arrays (memtrain/joined.py): row r of
    shard s is place ``r + shift[s]``, worked out for a whole window at once, so that a batch's gather is its
    two takes and nothing more. Per batch the same sum cost a ``searchsorted``, two lookups and two adds,
    about 9 us of the 60 that a 512-row batch of 256-byte rows took (issue 43)."""

    def __init__(self, order: WindowOrder, starts: np.ndarray,
                 joined: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]) -> None:
        self.order, self.starts, self.joined = order, starts, joined
        self.stride = shard_stride(starts)
        self._cached: tuple[int, np.ndarray] | None = None

    def window(self, w: int) -> np.ndarray:
        """Window ``w``'s rows in epoch order as a (2, rows) array: their places in joined x, then in joined y."""
        if self._cached is None or self._cached[0] != w:
            rows = self.order.window_rows(w)
            shard_of = shards_of(rows, self.starts, self.stride)
            places = np.empty((2, len(rows)), dtype=np.intp)
            for side, (_, shift) in enumerate(self.joined):
                np.add(rows, shift[shard_of], out=places[side])
            places.flags.writeable = False
            self._cached = w, places
        return self._cached[1]

    def batch(self, k: int, rank: int = 0, world: int = 1) -> np.ndarray:
        """Rank ``rank``'s part of global batch k as a (2, rows) array of places (``window``'s, sliced)."""
        both = self.order.batch_of(k, self.window)
        n = both.shape[1]
        return both[:, n * rank // world:n * (rank + 1) // world]

    def read_into(self, part: np.ndarray, out: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The rows at places ``part`` (from ``batch``) copied into ``out``: one take each for x and y, the
        same rows in the same order as ``Split.gather`` of the batch's rows."""
        (xj, _), (yj, _) = self.joined
        take_into(xj, part[0], out[0])
        take_into(yj, part[1], out[1])
        return out


def shard_stride(starts: np.ndarray) -> int | None:
    """R when every shard but the last holds R > 0 rows (``starts``: each shard's first row, then the total)."""
    sizes = set(np.diff(starts[:-1]).tolist())
    return next(iter(sizes)) if len(sizes) == 1 and min(sizes) > 0 else None


def shards_of(rows: np.ndarray, starts: np.ndarray, stride: int | None) -> np.ndarray:
    """The shard each of ``rows`` lies in: ``min(row // R, shards - 1)`` with ``stride`` R (``shard_stride``),
    else a ``searchsorted``, which for rows in no order costs as much as shuffling them."""
    if len(starts) <= 2:  # one shard
        return np.zeros(len(rows), dtype=np.intp)
    if stride is not None:
        return np.minimum(rows // stride, len(starts) - 2)
    return np.searchsorted(starts, rows, side="right") - 1


def take_into(source: np.ndarray, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``source[rows]`` copied into ``out``, once: ``rows`` must be in range (checked by the caller).

    ``np.take(..., out=)`` in its default ``mode="raise"`` first takes into a temporary and then copies it
    into ``out`` (numpy buffers ``out`` so that a bad index leaves it untouched): twice the copying, 1.7x
    the time of a 256-row gather of 4 KiB rows (106 against 64 us). ``"clip"`` writes straight into ``out``.
    """
    return source.take(rows, axis=0, out=out, mode="clip")  # the method: np.take's wrapper costs a microsecond


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


class GatherBuffers:
    """Two pairs of (x, y) buffers for gathered batches, taken in turn. A pair still referred to from outside
    (a batch the caller kept, or a view of it) is left to its holder and replaced by a new one, so reuse
    never overwrites rows someone holds: a plain loop reuses the same two pairs all epoch long."""

    def __init__(self, split: Split, *, x_shape: tuple[int, ...] | None = None,
                 x_dtype: np.dtype | None = None) -> None:
        """Buffers of ``split``'s rows; ``x_shape``/``x_dtype`` (one row's) for rows of another form than the
        split's (the normalized rows training gathers from)."""
        self.split = split
        self.x_shape = split.x_shape if x_shape is None else x_shape
        self.x_dtype = split.x_dtype if x_dtype is None else np.dtype(x_dtype)
        self._pairs: list[tuple[np.ndarray, np.ndarray] | None] = [None, None]
        self._turn = 0
        self._unheld = 0  # the reference count of a buffer nothing outside refers to, measured as it is made

    def next(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """A pair of buffers of ``rows`` rows that nothing outside refers to."""
        split = self.split
        self._turn ^= 1
        pair = self._pairs[self._turn]
        if pair is None or len(pair[0]) < rows or max(self._references(pair)) > self._unheld:
            size = max(rows, len(pair[0]) if pair is not None else 0)
            pair = (np.empty((size, *self.x_shape), self.x_dtype), np.empty((size, *split.y_shape), split.y_dtype))
            self._pairs[self._turn] = pair
            self._unheld = max(self._references(pair))  # the same expression: any view handed out adds one
        return pair[0][:rows], pair[1][:rows]

    @staticmethod
    def _references(pair: tuple[np.ndarray, np.ndarray]) -> tuple[int, int]:
        return sys.getrefcount(pair[0]), sys.getrefcount(pair[1])


@dataclass
class Dataset:
    """A prepared dataset, opened read-only; ``len``, indexing and ``batches`` address its train split.

    >>> ds = open_dataset("data/digits")     # doctest: +SKIP
    >>> ds                                   # doctest: +SKIP
    Dataset('data/digits': classification, 10 classes; x (64,) float32; train 1,617 rows, val 180 rows)
    >>> x, y = ds[0]; len(ds)                # doctest: +SKIP
    """

    path: Path
    manifest: dict[str, Any]
    splits: dict[str, Split]

    def __repr__(self) -> str:
        task = self.task + (f", {plural(len(self.classes), 'class', 'classes')}" if self.classes else "")
        x = self.manifest["x"]
        sizes = ", ".join(f"{name} {plural(split.rows, 'row')}" for name, split in self.splits.items())
        return f"Dataset({str(self.path)!r}: {task}; x {tuple(x['shape'])} {x['dtype']}; {sizes})"

    def __len__(self) -> int:
        return self.split("train").rows

    def __getitem__(self, key: int | slice | Any) -> tuple[np.ndarray, np.ndarray]:
        """Train rows as new arrays: ``ds[i]``, ``ds[a:b]``, ``ds[[i, j, ...]]`` (see ``Split.__getitem__``)."""
        return self.split("train")[key]

    def batches(self, batch_size: int, *, seed: int = 0, epoch: int = 0, start: int = 0, rank: int = 0,
                world: int = 1, shuffle: str | bool = "rows", window: int = WINDOW, drop_last: bool = False,
                split: str = "train") -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Numpy ``(x, y)`` batches of a split for your own training loop (see ``Split.batches``).

        >>> for epoch in range(10):                                   # doctest: +SKIP
        ...     for x, y in ds.batches(128, seed=0, epoch=epoch):
        ...         ...
        """
        return self.split(split).batches(batch_size, seed=seed, epoch=epoch, start=start, rank=rank, world=world,
                                         shuffle=shuffle, window=window, drop_last=drop_last)

    @property
    def task(self) -> str:
        return self.manifest["task"]

    @property
    def classes(self) -> list[str] | None:
        return self.manifest.get("classes")

    @property
    def n_features(self) -> int:
        return int(np.prod(self.manifest["x"]["shape"]))

    @property
    def stats(self) -> dict[str, np.ndarray]:
        """Per-feature ``mean``, ``std``, ``min`` and ``max`` of the train split, in the features' own float
        dtype (float32 features: float32; integer features: float32, or float64 past 16-bit integers), so
        ``(x - mean) / std`` keeps the dtype of ``x``. (Computed in float64 by ``prepare``.)"""
        dtype = np.promote_types(self.manifest["x"]["dtype"], np.float32)
        return {k: np.asarray(v, dtype=dtype) for k, v in self.manifest["stats"].items()}

    @property
    def normalizer(self) -> Normalizer:
        """The standardization training applies (``data.normalize``), ready for your own loop: a function
        of raw rows giving new, writable float32 rows ``(x - mean) / std`` (flattened per row). A column with
        zero variance on the train split is only centred, never divided (std 0 counts as 1), so it never
        becomes NaN or Inf.

        >>> norm = ds.normalizer                                      # doctest: +SKIP
        >>> for x, y in ds.batches(128): step(torch.from_numpy(norm(x)), torch.tensor(y))   # doctest: +SKIP
        """
        return Normalizer.from_stats(self.manifest["stats"], True)

    def split(self, name: str) -> Split:
        """The ``train``, ``val`` or (when prepared with ``--test-fraction``) ``test`` split."""
        if name not in self.splits:
            raise InputError(f"the dataset has no {name!r} split", path=self.path,
                             expected=" or ".join(repr(n) for n in self.splits), found=repr(name))
        return self.splits[name]

    def verify(self) -> None:
        """Re-hash every shard against the manifest; raises CorruptFileError naming the first bad file."""
        for split in self.splits.values():
            split.verify()


def open_dataset(path: str | Path, *, verify: bool = False) -> Dataset:
    """Open a prepared dataset directory read-only.

    >>> ds = open_dataset("data/digits")            # doctest: +SKIP
    >>> x, y = ds.split("train").read(0, 128)      # rows 0..127, across shards if needed
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not path.is_dir():
        raise InputError("dataset directory not found", path=path,
                         hint="create one with `memtrain prepare SOURCE OUT`")
    if not manifest_path.exists():
        raise InputError("not a memtrain dataset: no manifest.json", path=path,
                         hint="an interrupted prepare leaves no manifest; run `memtrain prepare` again")
    identity = directory_identity(path)  # before the manifest is read: a replacement after it is seen later
    manifest = read_manifest(path)
    present = manifest.get("splits") if isinstance(manifest.get("splits"), dict) else {}
    splits = {name: _split(path, name, manifest, identity) for name in SPLITS if name in present or
              name not in OPTIONAL_SPLITS}
    for split in splits.values():
        split.check_files()
    dataset = Dataset(path, manifest, splits)
    if verify:
        dataset.verify()
    return dataset


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of the dataset ``root``: its format and version checked, then its seal."""
    path = root / MANIFEST
    manifest = read_json(path, what="dataset manifest")
    _check_format(manifest, path)
    return unseal(manifest, path=path, what="dataset manifest")


def write_manifest(folder: Path, manifest: dict[str, Any], *, durable: bool) -> None:
    write_sealed_json(folder / MANIFEST, {"format": FORMAT, "version": FORMAT_VERSION, **manifest}, durable=durable)


def shard_file(root: Path, name: Any, *, where: str) -> Path:
    """``root / name`` for a shard path of a manifest, refused unless it is relative and stays inside ``root``
    (also through symlinks): a manifest cannot make memtrain read a file outside its dataset."""
    manifest = root / MANIFEST
    if not isinstance(name, str) or not name:
        raise CorruptFileError("a shard path must be a non-empty string", path=manifest, where=where,
                               found=repr(name))
    if os.path.isabs(name) or ".." in Path(name).parts:
        raise CorruptFileError("a shard path must be relative to the dataset, without '..'", path=manifest,
                               where=where, found=name)
    real_root = os.path.realpath(root)
    real = os.path.realpath(root / name)
    if os.path.commonpath([real_root, real]) != real_root:
        raise CorruptFileError("a shard path leaves the dataset directory (through a symbolic link)",
                               path=manifest, where=where, expected=f"a file under {real_root}", found=real)
    return root / name


def _check_format(manifest: Any, path: Path) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CorruptFileError("not a memtrain dataset manifest", path=path, where="format",
                               expected=FORMAT, found=found)
    if manifest.get("version") not in READ_VERSIONS:
        raise CorruptFileError("unsupported dataset format version", path=path, where="version",
                               expected=" or ".join(map(str, READ_VERSIONS)), found=manifest.get("version"),
                               hint="prepare the dataset again with this memtrain")


def directory_identity(root: Path) -> int | None:
    """The inode of the directory ``root`` (None if it is gone): a directory renamed into its place has another."""
    try:
        return os.stat(root).st_ino
    except OSError:
        return None


def _split(root: Path, name: str, manifest: dict[str, Any], identity: int | None = None) -> Split:
    try:
        entry = manifest["splits"][name]
        shards = [Shard(int(s["rows"]), shard_file(root, s["x"], where=f"splits.{name}.shards[{i}].x"),
                        shard_file(root, s["y"], where=f"splits.{name}.shards[{i}].y"), s["x_checksum"],
                        s["y_checksum"]) for i, s in enumerate(entry["shards"])]
        return Split(name, int(entry["rows"]), shards,
                     tuple(manifest["x"]["shape"]), np.dtype(manifest["x"]["dtype"]),
                     tuple(manifest["y"]["shape"]), np.dtype(manifest["y"]["dtype"]), root=root, identity=identity)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptFileError(f"manifest is missing or has a malformed field ({exc})",
                               path=root / MANIFEST, where=f"splits.{name}") from exc
