"""Rows in source order -> K bucket files (pass 1) -> pieces of rows in a uniformly random order (pass 2).

The external shuffle, in bounded memory whatever the data set's size:
  pass 1 (scatter): every row gets an independent uniform bucket in [0, K) from a generator seeded with
    ``--seed`` and is appended to that bucket's file (x in the output dtype, y as a float64 label code).
  pass 2 (gather): buckets are visited in order; each bucket gets a uniform permutation of its rows from
    a generator seeded with (seed, bucket), and its rows are emitted in that order, a piece at a time.
Given the bucket sizes, each bucket holds a uniform random subset of the rows and is ordered uniformly,
so the concatenation is a uniformly random permutation of all rows (the scatter-gather shuffle; see
e.g. Sanders 1998, "Random permutations on distributed, external and hierarchical memory"). K is chosen
so that a bucket is expected to hold about half a chunk; only a bucket's permutation (8 bytes per row)
and one piece of rows are in memory at once. ``--no-shuffle`` uses one bucket and the identity order.

The train/validation split is drawn piece by piece from the hypergeometric distribution, which gives
exactly ``round(val_fraction * rows)`` validation rows as a uniform random subset, in O(piece) memory;
the optional test split is drawn the same way from the rows that are not validation rows. Stratified
(``--stratify``), both are drawn within each class, from exact per-class counts counted beforehand.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import numpy as np

from memtrain.faults import fault_point
from memtrain.files import no_space_error, open_own, open_regular
from memtrain.layout import spool_bucket_names
from memtrain.prepare.background import BackgroundJobs

# Upper bound on bucket files: beyond it buckets grow past half a chunk (about 2 TiB of rows at the
# default 64 MiB chunk) rather than the spool opening an unbounded number of files.
MAX_BUCKETS = 4096  # (bucket ids fit in 16 bits, which keeps the scatter's sort a radix sort)
CODE_DTYPE = np.dtype(np.float64)
# numpy's hypergeometric sampler needs both counts below 10**9; past that the split uses a binomial draw.
HYPERGEOMETRIC_LIMIT = 10**9


def bucket_paths(folder: Path, bucket: int) -> tuple[str, str]:
    """A bucket's x and y files (``layout.spool_bucket_names``), as strings. A ``Path`` interns its name
    (pathlib's ``parse_parts`` on Python 3.11) and the spool opens two files per piece, about one piece per
    row at large bucket counts: that churn rebuilt the interpreter's table of interned strings, which never
    shrinks, at a larger size (tracemalloc: a 1.9 MiB table during the scatter of a 135 MB CSV, none on
    22 MB). Measured RssAnon growth at --chunk-mb 2, 22 and 270 MB CSVs: 22.1 and 26.1 MiB with Paths,
    20.8 and 21.6 MiB with strings."""
    x_name, y_name = spool_bucket_names(bucket)
    return os.path.join(folder, x_name), os.path.join(folder, y_name)


def bucket_count(estimated_bytes: int, chunk_bytes: int, shuffle: bool) -> int:
    if not shuffle:
        return 1
    return max(1, min(MAX_BUCKETS, math.ceil(2 * estimated_bytes / chunk_bytes)))


class Spool:
    """Pass 1: append rows to K bucket files by a seeded uniform random bucket per row.

    A context manager: the appends run on a background thread (``BackgroundJobs``) while the caller reads
    and checks the next chunk; ``finish`` waits for them, and leaving the block stops the thread.
    """

    def __init__(self, folder: Path, buckets: int, seed: int, *, keep_x: bool = True):
        self.folder = folder
        self.buckets = buckets
        self.keep_x = keep_x  # False: only the label codes are spooled (pass 2 reads the rows from the source)
        self.counts = np.zeros(buckets, dtype=np.int64)
        self._rng = np.random.default_rng([seed, 1])
        self._writer = BackgroundJobs(0)  # one chunk appended while the next is queued

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._writer.stop(cancel=kind is not None)

    def add(self, x: np.ndarray, codes: np.ndarray) -> None:
        """Queue the rows' appends; ``x`` and ``codes`` must not change afterwards."""
        if len(x) == 0:
            return
        if self.buckets == 1:
            pieces = [(0, x, codes)]
        else:
            bucket = self._rng.integers(self.buckets, size=len(x))
            order = np.argsort(bucket.astype(np.uint16), kind="stable")  # 16-bit keys: numpy's radix sort, O(n)
            sizes = np.bincount(bucket, minlength=self.buckets)
            bounds = np.concatenate([[0], np.cumsum(sizes)])
            xs, ys = x[order], codes[order]
            pieces = [(int(k), xs[bounds[k]:bounds[k + 1]], ys[bounds[k]:bounds[k + 1]])
                      for k in np.flatnonzero(sizes)]
        for bucket_index, rows, _ in pieces:
            self.counts[bucket_index] += len(rows)
        self._writer.submit(lambda: self._append(pieces), x.nbytes + codes.nbytes)
        fault_point("prepare_mid_spool")

    def _append(self, pieces: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        for bucket, x, codes in pieces:
            for path, rows in zip(bucket_paths(self.folder, bucket), (x, codes), strict=True):
                if rows is x and not self.keep_x:
                    continue
                try:
                    with open(open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as handle:  # no link
                        handle.write(np.ascontiguousarray(rows).data)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise no_space_error(Path(path)) from exc
                    raise

    def finish(self) -> list[int]:
        """Wait for the appends and make the bucket files durable (the caller then writes the spool's commit
        marker)."""
        self._writer.drain()
        for bucket in np.flatnonzero(self.counts):
            for name in spool_bucket_names(int(bucket))[0 if self.keep_x else 1:]:
                with open_regular(self.folder / name) as handle:
                    os.fsync(handle.fileno())
        return self.counts.tolist()


def spool_intact(folder: Path, counts: list[int], x_row_bytes: int) -> bool:
    """Every bucket file has exactly the bytes its count says (a damaged spool is redone, not trusted); an
    ``x_row_bytes`` of 0 means the rows were not spooled (pass 2 reads them from the source)."""
    for bucket, count in enumerate(counts):
        x_path, y_path = bucket_paths(folder, bucket)
        for path, row_bytes in ((x_path, x_row_bytes), (y_path, CODE_DTYPE.itemsize)):
            size = os.stat(path).st_size if os.path.exists(path) else 0
            if size != count * row_bytes:
                return False
    return True


def gather(folder: Path, counts: list[int], x_shape: tuple[int, ...], x_dtype: np.dtype, *, seed: int,
           shuffle: bool, piece_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Pass 2: (x, codes) pieces of at most ``piece_rows`` rows, in the shuffled (or source) order."""
    for bucket, count in enumerate(counts):
        if count == 0:
            continue
        x_path, y_path = bucket_paths(folder, bucket)
        x = np.memmap(x_path, dtype=x_dtype, mode="r", shape=(count, *x_shape))
        y = np.memmap(y_path, dtype=CODE_DTYPE, mode="r", shape=(count,))
        order = np.random.default_rng([seed, 2, bucket]).permutation(count) if shuffle else None
        for lo in range(0, count, piece_rows):
            hi = min(count, lo + piece_rows)
            if order is None:
                yield np.asarray(x[lo:hi]), np.asarray(y[lo:hi])
            else:
                yield x[order[lo:hi]], y[order[lo:hi]]
        del x, y  # unmapped, unless a piece still refers to it (its pages then stay)
        forget_cached(x_path, y_path)


def forget_cached(*paths: Path | str) -> None:
    """Drop the pages of spool files read for the last time from the page cache (they are clean: fsynced by
    ``Spool.finish``), so that the shards written next take that memory back instead of new pages: new memory
    can cost more than the copy itself (docs/prepare-performance.md). Only a hint; a rerun reads them again."""
    if not hasattr(os, "posix_fadvise"):
        return
    for path in paths:
        with contextlib.suppress(OSError):  # a hint that cannot be given is no error
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def unshuffled_codes(folder: Path, counts: list[int]) -> np.ndarray:
    """The label codes of a one-bucket (``--no-shuffle``) spool in source order, mapped, not read."""
    if len(counts) != 1 or counts[0] == 0:
        assert sum(counts) == 0, "an unshuffled spool has one bucket"
        return np.empty(0, dtype=CODE_DTYPE)
    return np.memmap(bucket_paths(folder, 0)[1], dtype=CODE_DTYPE, mode="r", shape=(counts[0],))


def spool_codes(folder: Path, counts: list[int], piece_rows: int) -> Iterator[np.ndarray]:
    """The label codes of the spool, a piece at a time, in no particular order (for counting classes)."""
    for bucket, count in enumerate(counts):
        if count:
            y = np.memmap(bucket_paths(folder, bucket)[1], dtype=CODE_DTYPE, mode="r", shape=(count,))
            for lo in range(0, count, piece_rows):
                yield np.asarray(y[lo:lo + piece_rows])


class ValSplit:
    """Marks exactly ``val_rows`` of ``rows`` as validation, a uniform random subset, piece by piece."""

    def __init__(self, rows: int, val_rows: int, seed: int, stream: tuple[int, ...] = (3,)):
        self._rng = np.random.default_rng([seed, *stream])
        self._left = rows
        self._val_left = val_rows

    def take(self, n: int) -> np.ndarray:
        """Boolean mask of the next ``n`` rows: True for validation rows."""
        mask = np.zeros(n, dtype=bool)
        if n == 0:
            return mask
        if self._val_left == 0:
            k = 0
        elif self._val_left == self._left:
            k = n
        elif max(self._val_left, self._left - self._val_left) < HYPERGEOMETRIC_LIMIT:
            k = int(self._rng.hypergeometric(self._val_left, self._left - self._val_left, n))
        else:  # numpy's limit: a binomial draw, clamped so the total stays exact
            k = int(self._rng.binomial(n, self._val_left / self._left))
            k = min(max(k, n - (self._left - self._val_left)), self._val_left, n)
        if k:
            mask[self._rng.choice(n, k, replace=False)] = True
        self._left -= n
        self._val_left -= k
        return mask


TRAIN, VAL, TEST = 0, 1, 2  # what RowSplit.take gives each row


class RowSplit:
    """Assigns each row to train, val or test: exact counts per group, uniformly random, piece by piece.

    ``groups[g] = (rows, val_rows, test_rows)``; one group for a plain split, one per class when
    stratified. Test rows are drawn from the rows that are not validation rows. With one group and no
    test rows, the validation rows are exactly those ``ValSplit(rows, val_rows, seed)`` marks.
    """

    def __init__(self, groups: list[tuple[int, int, int]], seed: int):
        tag = [(g,) for g in range(len(groups))] if len(groups) > 1 else [()]
        self._val = [ValSplit(rows, val, seed, (3, *tag[g])) for g, (rows, val, _) in enumerate(groups)]
        self._test = [ValSplit(rows - val, test, seed, (4, *tag[g])) for g, (rows, val, test) in enumerate(groups)]

    def take(self, group: np.ndarray) -> np.ndarray:
        """``TRAIN``/``VAL``/``TEST`` (uint8) for the next rows, whose groups (class indices, or zeros) are given."""
        out = np.full(len(group), TRAIN, dtype=np.uint8)
        for g in np.unique(group):
            rows = np.flatnonzero(group == g)
            is_val = self._val[g].take(len(rows))
            out[rows[is_val]] = VAL
            rest = rows[~is_val]
            out[rest[self._test[g].take(len(rest))]] = TEST
        return out
