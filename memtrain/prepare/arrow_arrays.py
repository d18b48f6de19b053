"""An Arrow array (or a chunked column) -> numpy arrays, read straight from its buffers.

pyarrow's own ``to_numpy`` (and ``np.asarray`` on an Arrow array) goes through its pandas conversion
(``ConvertArrayToPandas``), which imports pandas whenever pandas is installed: with pyarrow 26 and
pandas 3.1 that is about 27 MiB of anonymous memory that never goes away, more than the whole chunk
budget of a small ``--chunk-mb`` (docs/prepare.md, "Memory"). Reading the buffers gives the same
values without it, and without a copy for a column of one chunk.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def values(column: Any, dtype: Any) -> np.ndarray:
    """The values of a fixed-width numeric column of Arrow type ``dtype`` (float64 -> np.float64, int32 ->
    np.int32, ...): a view of Arrow's buffer for one chunk (never write to it), a copy otherwise. A null's
    slot holds whatever bytes the writer left there: mask it with ``nulls``."""
    chunks = _chunks(column)
    if len(chunks) == 1:
        return _values(chunks[0], np.dtype(dtype))
    return np.concatenate([_values(chunk, np.dtype(dtype)) for chunk in chunks]) if chunks else \
        np.empty(0, dtype=dtype)


def nulls(column: Any) -> np.ndarray:
    """Which cells of ``column`` are null, from its validity bitmaps (all False when there are none)."""
    chunks = _chunks(column)
    if not chunks:
        return np.zeros(0, dtype=bool)
    return np.concatenate([_nulls(chunk) for chunk in chunks]) if len(chunks) > 1 else _nulls(chunks[0])


def strings(column: Any) -> np.ndarray:
    """A text column as a numpy array of str (a null reads as "")."""
    texts = column.to_pylist()
    return np.array(["" if text is None else text for text in texts] if column.null_count else texts,
                    dtype=str).reshape(-1)


def _chunks(column: Any) -> list[Any]:
    return list(column.chunks) if hasattr(column, "chunks") else [column]


def _values(array: Any, dtype: np.dtype) -> np.ndarray:
    if len(array) == 0:
        return np.empty(0, dtype=dtype)
    if array.type.bit_width != 8 * dtype.itemsize:
        raise TypeError(f"an Arrow {array.type} column read as {dtype}")
    data = array.buffers()[1]
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _nulls(array: Any) -> np.ndarray:
    validity = array.buffers()[0] if array.null_count else None
    if validity is None:
        return np.zeros(len(array), dtype=bool)
    first, skip = divmod(array.offset, 8)
    data = np.frombuffer(validity, dtype=np.uint8)[first:first + (skip + len(array) + 7) // 8]
    return np.unpackbits(data, bitorder="little")[skip:skip + len(array)] == 0
