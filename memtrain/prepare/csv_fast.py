"""A block of whole CSV records (bytes) -> (x in the output dtype, y), parsed by pyarrow's multi-threaded
C++ reader, or None when the block needs the reference parser.

The fast path takes only blocks that are plainly fine: every record has the header's number of fields,
every feature (and a numeric label) parses as a number, and every value is finite once converted to the
output dtype. Anything else — a ragged row, a stray word, an empty field, NaN, Inf, an out-of-range
value, a text label longer than ``MAX_LABEL_BYTES`` — returns None, and ``csv_source`` re-reads that
block with its reference parser (numpy's ``loadtxt``, then the ``csv`` module), which gives today's
error with its exact line and column, or today's result (``--drop-nonfinite``). Both parsers read
decimal text to float64 with correct rounding and then convert, so a block gives the same bytes
whichever parser read it (``tests/test_prepare_csv.py`` checks this on random text).
"""

from __future__ import annotations

from typing import Any

import numpy as np

QUOTE = b'"'
# pyarrow splits a block into pieces of this size and parses them on its thread pool.
ARROW_BLOCK = 1 << 20
# A class name longer than this is refused (by the reference parser's error): no label needs 64 KiB,
# and such a field is almost always a quote that was never closed.
MAX_LABEL_BYTES = 1 << 16


def available() -> bool:
    try:
        import pyarrow.csv  # noqa: F401
    except ImportError:
        return False
    return True


class ArrowBlockParser:
    """Parses blocks of one file's records; ``parse(data)`` -> (x, y) or None (use the reference parser)."""

    def __init__(self, *, columns: int, label_index: int, text_labels: bool, dtype: np.dtype):
        import pyarrow as pa
        import pyarrow.csv as pacsv

        self._pa, self._pacsv = pa, pacsv
        # The C library's allocator: freed blocks go back to it at once, where pyarrow's default (mimalloc)
        # keeps several MiB per thread; measured peak growth of prepare with 2 MiB chunks 24 vs 33 MiB.
        self._pool = pa.system_memory_pool()
        self._names = [f"c{i}" for i in range(columns)]
        self._features = [i for i in range(columns) if i != label_index]
        self._label = label_index
        self._text_labels = text_labels
        self._dtype = np.dtype(dtype)
        types = {name: pa.float64() for name in self._names}
        if text_labels:
            types[self._names[label_index]] = pa.string()
        # No null spellings: an empty field or "NA" is an error here, exactly as in the reference parser.
        self._convert = pacsv.ConvertOptions(column_types=types, null_values=[], strings_can_be_null=False,
                                             quoted_strings_can_be_null=False)
        self._read = pacsv.ReadOptions(column_names=self._names, block_size=ARROW_BLOCK, use_threads=True)
        # A field may hold a newline only inside quotes; without a quote in the block pyarrow can split it
        # at any newline, which is faster.
        self._plain = pacsv.ParseOptions(newlines_in_values=False)
        self._quoted = pacsv.ParseOptions(newlines_in_values=True)

    def parse(self, data: bytes) -> tuple[np.ndarray, np.ndarray] | None:
        try:
            table = self._pacsv.read_csv(self._pa.py_buffer(data), read_options=self._read,
                                         parse_options=self._quoted if QUOTE in data else self._plain,
                                         convert_options=self._convert, memory_pool=self._pool)
        except self._pa.ArrowException:
            return None
        if table.num_rows == 0:
            return None
        x = self._x(table)
        y = self._y(table)
        if x is None or y is None:
            return None
        return x, y

    def _x(self, table: Any) -> np.ndarray | None:
        """Row-major features in the output dtype, converted batch by batch straight from pyarrow's buffers."""
        x = np.empty((table.num_rows, len(self._features)), dtype=self._dtype)
        at = 0
        with np.errstate(over="ignore", invalid="ignore"):  # out of range becomes inf: declined below
            for batch in table.to_batches():
                rows = batch.num_rows
                for j, i in enumerate(self._features):
                    x[at:at + rows, j] = batch.column(i).to_numpy(zero_copy_only=True)
                at += rows
        return x if np.isfinite(x).all() else None

    def _y(self, table: Any) -> np.ndarray | None:
        column = table.column(self._label)
        if not self._text_labels:
            y = column.to_numpy()
            return y if np.isfinite(y).all() else None
        encoded = column.combine_chunks(memory_pool=self._pool).dictionary_encode()
        names = encoded.dictionary.to_pylist()
        # the reference parser strips a label's surrounding white space: such a block is left to it
        if any(len(name.encode()) > MAX_LABEL_BYTES or name != name.strip() for name in names):
            return None
        return np.array(names, dtype=str)[encoded.indices.to_numpy()] if names else np.empty(0, dtype=str)
