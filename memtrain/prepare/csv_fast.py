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

from typing import Any, NamedTuple

import numpy as np

from memtrain.prepare import arrow_arrays

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


class Block(NamedTuple):
    """A parsed block: x (rows, features) in the output dtype, NaN in a missing cell and in a category column;
    y; which cells are missing (None: none); the text of each category column (by feature index; "" where
    missing); which labels are missing (None: none)."""

    x: np.ndarray
    y: np.ndarray
    missing: np.ndarray | None = None
    text: dict[int, np.ndarray] | None = None
    y_missing: np.ndarray | None = None


class ArrowBlockParser:
    """Parses blocks of one file's records; ``parse(data)`` -> a Block or None (use the reference parser)."""

    def __init__(self, *, columns: int, label_index: int, text_labels: bool, dtype: np.dtype,
                 features: list[int] | None = None, categories: frozenset[int] = frozenset(),
                 number_na: tuple[str, ...] = (), text_na: tuple[str, ...] = ()):
        import pyarrow as pa
        import pyarrow.csv as pacsv

        self._pa, self._pacsv = pa, pacsv
        # The C library's allocator: freed blocks go back to it at once, where pyarrow's default (mimalloc)
        # keeps several MiB per thread; measured peak growth of prepare with 2 MiB chunks 24 vs 33 MiB.
        self._pool = pa.system_memory_pool()
        self._names = [f"c{i}" for i in range(columns)]
        self._features = features if features is not None else [i for i in range(columns) if i != label_index]
        self._categories = categories  # header indices of category columns: read as text
        self._label = label_index
        self._text_labels = text_labels
        self._dtype = np.dtype(dtype)
        self._text_na = text_na
        types = {self._names[i]: pa.float64() for i in (*self._features, label_index)}
        for i in (*categories, *((label_index,) if text_labels else ())):
            types[self._names[i]] = pa.string()
        # Numbers: only the given spellings are null (none under --missing error: an empty field or "NA" is
        # then an error, exactly as in the reference parser); text is never null here, its missing spellings
        # are matched after trimming.
        self._convert = pacsv.ConvertOptions(column_types=types, null_values=list(number_na),
                                             strings_can_be_null=False, quoted_strings_can_be_null=False,
                                             include_columns=[self._names[i] for i in sorted(
                                                 {*self._features, label_index})])
        self._read = pacsv.ReadOptions(column_names=self._names, block_size=ARROW_BLOCK, use_threads=True)
        # A field may hold a newline only inside quotes; without a quote in the block pyarrow can split it
        # at any newline, which is faster.
        self._plain = pacsv.ParseOptions(newlines_in_values=False)
        self._quoted = pacsv.ParseOptions(newlines_in_values=True)

    def parse(self, data: bytes) -> Block | None:
        try:
            table = self._pacsv.read_csv(self._pa.py_buffer(data), read_options=self._read,
                                         parse_options=self._quoted if QUOTE in data else self._plain,
                                         convert_options=self._convert, memory_pool=self._pool)
        except self._pa.ArrowException:
            return None
        if table.num_rows == 0:
            return None
        numbers = [j for j, i in enumerate(self._features) if i not in self._categories]
        missing = np.zeros((table.num_rows, len(self._features)), dtype=bool)
        for j in numbers:
            missing[:, j] = self._nulls(table.column(self._names[self._features[j]]))
        x = self._x(table, numbers, missing)
        y, y_missing = self._y(table)
        if x is None or y is None:
            return None
        text = {}
        for j, i in enumerate(self._features):
            if i in self._categories:
                text[j], missing[:, j] = self._text(table.column(self._names[i]))
        return Block(x, y, missing if missing.any() else None, text or None, y_missing)

    def _x(self, table: Any, numbers: list[int], missing: np.ndarray) -> np.ndarray | None:
        """Row-major features in the output dtype, converted batch by batch straight from pyarrow's buffers."""
        x = np.full((table.num_rows, len(self._features)), np.nan, dtype=self._dtype)
        with np.errstate(over="ignore", invalid="ignore"):  # out of range becomes inf: declined below
            for j in numbers:
                column = table.column(self._names[self._features[j]])
                at = 0
                for chunk in column.chunks:
                    x[at:at + len(chunk), j] = arrow_arrays.values(chunk, np.float64)
                    at += len(chunk)
                x[missing[:, j], j] = np.nan  # a null's slot holds no value
        if len(numbers) == x.shape[1] and not missing.any():  # a table of numbers: no copy to check it
            return x if np.isfinite(x).all() else None
        return x if np.isfinite(x[:, numbers][~missing[:, numbers]]).all() else None

    def _nulls(self, column: Any) -> np.ndarray | bool:
        """Which cells are null; computed only when there are some."""
        if column.null_count == 0:
            return False
        return arrow_arrays.nulls(column)

    def _text(self, column: Any) -> tuple[np.ndarray, np.ndarray]:
        """A text column's trimmed values ("" where missing) and which are missing."""
        import pyarrow.compute as pc

        values = arrow_arrays.strings(pc.utf8_trim_whitespace(column, memory_pool=self._pool))
        missing = np.isin(values, list(self._text_na)) if self._text_na else np.zeros(len(values), dtype=bool)
        values[missing] = ""
        return values, missing

    def _y(self, table: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
        column = table.column(self._names[self._label])
        if not self._text_labels:
            absent = np.asarray(self._nulls(column)) | np.zeros(table.num_rows, dtype=bool)
            # a copy (the view would keep the table's buffer alive with the chunk); NaN in a null's slot
            y = np.where(absent, np.nan, arrow_arrays.values(column, np.float64))
            return (y if np.isfinite(y[~absent]).all() else None), (absent if absent.any() else None)
        encoded = column.combine_chunks(memory_pool=self._pool).dictionary_encode()
        names = encoded.dictionary.to_pylist()
        # the reference parser strips a label's surrounding white space: such a block is left to it
        if any(len(name.encode()) > MAX_LABEL_BYTES or name != name.strip() for name in names):
            return None, None
        indices = arrow_arrays.values(encoded.indices, np.int32)
        y = np.array(names, dtype=str)[indices] if names else np.empty(0, dtype=str)
        absent = np.isin(y, list(self._text_na)) if self._text_na and len(y) else np.zeros(len(y), dtype=bool)
        if absent.any():
            y = y.copy()
            y[absent] = ""
        return y, (absent if absent.any() else None)
