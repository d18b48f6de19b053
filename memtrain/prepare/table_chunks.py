"""A table's chunk (cells, missing marks, text) -> the rows that stay: a row without a label dropped and
counted, missing cells stopped at, dropped or kept (for ``Survey`` to impute) as ``--missing`` says."""

from __future__ import annotations

from typing import Any

import numpy as np

from memtrain.errors import InputError
from memtrain.prepare.sources import Chunk, Source


def holes_of(chunk: Chunk, raw: np.ndarray) -> np.ndarray | None:
    """The cells that hold no number (missing cells, category columns): not checked for finiteness."""
    if chunk.missing is None and not chunk.text:
        return None
    holes = np.zeros(raw.shape, dtype=bool) if chunk.missing is None else chunk.missing.copy()
    for j in chunk.text or {}:
        holes[:, j] = True
    return holes


def rows_of(chunk: Chunk, keep: np.ndarray) -> Chunk:
    """The chunk's table parts, for the rows ``keep`` (x and y are cut by the caller)."""
    return Chunk(chunk.x, chunk.y, chunk.first_row, chunk.nbytes, chunk.line_of, chunk.finite,
                 None if chunk.missing is None else chunk.missing[keep],
                 None if chunk.text is None else {j: t[keep] for j, t in chunk.text.items()},
                 None if chunk.y_missing is None else chunk.y_missing[keep])


def table_rows(chunk: Chunk, raw: np.ndarray, source: Source, missing: str,
               counts: dict[str, int]) -> tuple[Chunk, np.ndarray]:
    """Rows with a missing label dropped (counted), and missing cells checked as ``--missing`` says."""
    keep = np.ones(len(raw), dtype=bool)
    if chunk.y_missing is not None and chunk.y_missing.any():
        if missing == "error":
            row = int(np.flatnonzero(chunk.y_missing)[0])
            raise InputError("the label is missing", path=source.path,
                             where=f"{chunk.where(row)}, column '{source.label_name}'", expected="a label",
                             found="a missing value", hint="--missing impute or drop drops such rows (and counts them)")
        keep &= ~chunk.y_missing
        counts["label_missing"] = counts.get("label_missing", 0) + int(chunk.y_missing.sum())
    if chunk.missing is not None and chunk.missing[keep].any():
        if missing == "error":
            row, column = (int(v[0]) for v in np.nonzero(chunk.missing & keep[:, None]))
            raise InputError("a value is missing", path=source.path,
                             where=f"{chunk.where(row)}, column '{(source.feature_names or [])[column]}'",
                             expected="a value", found="a missing value",
                             hint="--missing impute (the default) fills missing values, --missing drop drops "
                                  "their rows")
        if missing == "drop":
            gone = keep & chunk.missing.any(axis=1)
            counts["missing_dropped"] = counts.get("missing_dropped", 0) + int(gone.sum())
            keep &= ~gone
    if keep.all():
        return chunk, raw
    cut = rows_of(chunk, keep)
    cut.x, cut.y = raw[keep], np.asarray(chunk.y).reshape(-1)[keep]
    cut.line_of = _renumbered(chunk, keep)
    return cut, raw[keep]


def _renumbered(chunk: Chunk, keep: np.ndarray) -> Any:
    """``where`` for the kept rows: row i of the cut chunk is row kept[i] of the source chunk."""
    index = np.flatnonzero(keep)
    if chunk.line_of is None:
        return None
    line_of = chunk.line_of
    return lambda i: line_of(int(index[i]))
