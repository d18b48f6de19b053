"""A Parquet file (needs pyarrow, the ``parquet`` extra) -> chunks of rows, one record batch at a time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import InputError
from memtrain.prepare import arrow_arrays
from memtrain.prepare.sources import Chunk, resolve_label
from memtrain.prepare.table import CATEGORY, NUMBER, TableOptions


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise InputError("reading Parquet needs pyarrow, which is not installed",
                         hint="pip install memtrain[parquet]") from exc
    return pyarrow


class ParquetSource:
    format = "parquet"

    def __init__(self, path: Path, label: str | None, table: TableOptions | None = None):
        pa = _pyarrow()
        self.path = path
        self.table = table or TableOptions()
        try:
            parquet = pa.parquet.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"not a readable Parquet file ({exc})", path=path) from exc
        schema = parquet.schema_arrow
        names = list(schema.names)
        target = resolve_label(names, label, path)
        self.label_name = names[target]
        self.columns = names
        self.feature_names = self.table.select([n for i, n in enumerate(names) if i != target], self.label_name, path)
        self.kinds = [self._kind(pa, name, schema.field(name).type) for name in self.feature_names]
        self.rows = parquet.metadata.num_rows
        self.size_bytes = path.stat().st_size
        self.feature_shape = (len(self.feature_names),)

    def _kind(self, pa: Any, name: str, kind: Any) -> str:
        if pa.types.is_dictionary(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
                name in self.table.categorical:
            return CATEGORY
        if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            return NUMBER
        raise InputError("a feature column is neither numeric nor text", path=self.path, where=f"column '{name}'",
                         expected="integer, float, bool, string or dictionary", found=str(kind),
                         hint=f"leave it out with --drop-columns {name}")

    def chunks(self, rows: int) -> Iterator[Chunk]:
        pa = _pyarrow()
        parquet = pa.parquet.ParquetFile(self.path)
        first = 0
        for batch in parquet.iter_batches(batch_size=rows, columns=[*self.feature_names, self.label_name]):
            n = batch.num_rows
            x = np.full((n, len(self.feature_names)), np.nan)
            missing = np.zeros(x.shape, dtype=bool)
            text = {}
            for j, (name, kind) in enumerate(zip(self.feature_names, self.kinds, strict=True)):
                column = batch.column(name)
                if kind == CATEGORY:
                    text[j], missing[:, j] = self._text(pa, column)
                    continue
                missing[:, j] = arrow_arrays.nulls(column)
                values = _floats(pa, column)
                if self._nan_is_missing:
                    missing[:, j] |= np.isnan(values)
                x[:, j] = np.where(missing[:, j], np.nan, values)
            y, y_missing = self._labels(pa, batch.column(self.label_name))
            if self.table.missing == "error" and missing.any():
                row, j = (int(v[0]) for v in np.nonzero(missing))
                raise InputError("missing value", path=self.path, where=f"row {first + row}, "
                                 f"column '{self.feature_names[j]}'", expected="a value", found="null",
                                 hint="--missing impute (the default) fills missing values, --missing drop drops "
                                      "their rows")
            yield Chunk(x, y, first, missing=missing if missing.any() else None, text=text or None,
                        y_missing=y_missing if y_missing.any() else None)
            first += n

    @property
    def _nan_is_missing(self) -> bool:
        return any(v.lower() == "nan" for v in self.table.number_na)

    def _text(self, pa: Any, column: Any) -> tuple[np.ndarray, np.ndarray]:
        """A category column's values as trimmed text ("" where missing: null or a missing spelling)."""
        import pyarrow.compute as pc

        values = pc.utf8_trim_whitespace(column.cast(pa.string()))
        text = arrow_arrays.strings(values)  # a null reads as ""
        missing = arrow_arrays.nulls(values) | np.isin(text, list(self.table.na_values))
        text[missing] = ""
        return text, missing

    def _labels(self, pa: Any, column: Any) -> tuple[np.ndarray, np.ndarray]:
        if pa.types.is_dictionary(column.type):
            column = column.cast(pa.string())
        absent = arrow_arrays.nulls(column)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            y, absent = self._text(pa, column)
            return y, absent
        y = _floats(pa, column)
        if self._nan_is_missing:
            absent = absent | np.isnan(y)
        return np.where(absent, np.nan, y), absent

    def describe(self) -> dict[str, Any]:
        return {"format": "parquet", "path": str(self.path), "label": self.label_name, "bytes": self.size_bytes}


def _floats(pa: Any, column: Any) -> np.ndarray:
    """A numeric or bool column as float64 (whatever sits under a null), read from Arrow's buffers:
    pyarrow's ``to_numpy`` imports pandas when it is installed (``arrow_arrays``). Not a checked cast:
    integers beyond 2**53 round, as numpy's conversion does."""
    return arrow_arrays.values(column.cast(pa.float64(), safe=False), np.float64)
