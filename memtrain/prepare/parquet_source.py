"""A Parquet file (needs pyarrow, the ``parquet`` extra) -> chunks of rows, one record batch at a time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import InputError
from memtrain.prepare.sources import Chunk, resolve_label


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

    def __init__(self, path: Path, label: str | None):
        pa = _pyarrow()
        self.path = path
        try:
            parquet = pa.parquet.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"not a readable Parquet file ({exc})", path=path) from exc
        schema = parquet.schema_arrow
        names = list(schema.names)
        target = resolve_label(names, label, path)
        self.label_name = names[target]
        self.feature_names = [n for i, n in enumerate(names) if i != target]
        for name in self.feature_names:
            kind = schema.field(name).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
                raise InputError("a feature column is not numeric", path=path, where=f"column '{name}'",
                                 expected="integer, float or bool", found=str(kind))
        self.rows = parquet.metadata.num_rows
        self.size_bytes = path.stat().st_size
        self.feature_shape = (len(self.feature_names),)

    def chunks(self, rows: int) -> Iterator[Chunk]:
        pa = _pyarrow()
        parquet = pa.parquet.ParquetFile(self.path)
        first = 0
        for batch in parquet.iter_batches(batch_size=rows, columns=[*self.feature_names, self.label_name]):
            for name in batch.schema.names:
                column = batch.column(name)
                if column.null_count:
                    row = first + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
                    raise InputError("missing value (null)", path=self.path, where=f"row {row}, column '{name}'",
                                     expected="a value", found="null")
            x = np.column_stack([batch.column(n).to_numpy(zero_copy_only=False) for n in self.feature_names])
            y = batch.column(self.label_name)
            if pa.types.is_dictionary(y.type):
                y = y.cast(pa.string())
            labels = y.to_numpy(zero_copy_only=False)
            yield Chunk(x, labels.astype(str) if labels.dtype.kind == "O" else labels, first)
            first += batch.num_rows

    def describe(self) -> dict[str, Any]:
        return {"format": "parquet", "path": str(self.path), "label": self.label_name, "bytes": self.size_bytes}
