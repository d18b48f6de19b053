"""Source files -> chunks of (x, y) rows with their position in the file, one small reader per format.

Formats: ``.npy`` features + ``--y labels.npy``, ``.npz`` (``--x``/``--y`` array names), HDF5
(``--x``/``--y`` dataset paths, chunked and compressed datasets included) and Parquet (``--label``;
needs pyarrow). CSV lives in ``csv_source``, generated data in ``synthetic``. Every reader raises
InputError naming the file (and the row, column or path) for bad input; none loads a whole file.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from memtrain.errors import InputError, MemtrainError
from memtrain.files import MAX_NPY_HEADER, check_npy, check_regular, open_npy

LABEL_NAMES = ("label", "target", "y")
NUMERIC_KINDS = "biuf"


@dataclass
class Chunk:
    """Consecutive rows of a source: x of shape (n, *features), y of shape (n,)."""

    x: np.ndarray
    y: np.ndarray
    first_row: int
    nbytes: int = 0  # source bytes this chunk came from, when known (CSV), for progress
    line_of: Callable[[int], int] | None = field(default=None, repr=False)  # csv: row in chunk -> line
    finite: bool = False  # the source already checked that x (in the output dtype) and y are all finite
    # Tables (CSV, Parquet): which cells of x are missing (NaN there), the text of each category column (by
    # feature index; x holds NaN there), which labels are missing; None: none.
    missing: np.ndarray | None = None
    text: dict[int, np.ndarray] | None = None
    y_missing: np.ndarray | None = None

    def where(self, row: int) -> str:
        """Where row ``row`` of this chunk is in the file: ``line 12`` (CSV) or ``row 11`` (0-based)."""
        return f"line {self.line_of(row)}" if self.line_of else f"row {self.first_row + row}"


class Source(Protocol):
    format: str
    path: Path | None
    rows: int | None  # None when unknown before reading (CSV)
    size_bytes: int
    feature_shape: tuple[int, ...]
    feature_names: list[str] | None
    label_name: str

    def chunks(self, rows: int) -> Iterator[Chunk]: ...

    def describe(self) -> dict[str, Any]: ...


def resolve_label(columns: list[str], wanted: str | None, path: Path) -> int:
    """Index of the target column: ``--label NAME``, else a column named label, target or y.

    Every table source (CSV, Parquet) names its columns through here, so this is where names are checked:
    each must be non-empty and unique, since the label, the features and the recorded encoding are all
    found by name (``a,b,a`` would read the first ``a`` twice; ``label,x,label`` would put the target
    among the features)."""
    check_column_names(columns, path)
    if wanted is not None:
        if wanted in columns:
            return columns.index(wanted)
        raise InputError(f"no label column named '{wanted}'", path=path, expected="one of the columns",
                         found=_listing(columns))
    for name in LABEL_NAMES:
        lowered = [c.strip().lower() for c in columns]
        if name in lowered:
            return lowered.index(name)
    raise InputError("missing label column", path=path, expected="a column named label, target or y "
                     "(or --label NAME)", found=_listing(columns))


def check_column_names(columns: list[str], path: Path | None) -> None:
    """Refuse an empty column name, and a name given to two columns (positions counted from 1)."""
    empty = [i + 1 for i, name in enumerate(columns) if not name]
    if empty:
        raise InputError("a column has no name", path=path, where="column names",
                         expected="a name for every column", found=f"an empty name at position "
                         f"{', '.join(map(str, empty))} of {len(columns)}",
                         hint="name it in the header (pandas writes its index as an unnamed first column: "
                              "to_csv(index=False) leaves it out)")
    positions: dict[str, list[int]] = {}
    for i, name in enumerate(columns):
        positions.setdefault(name, []).append(i + 1)
    repeated = {name: at for name, at in positions.items() if len(at) > 1}
    if repeated:
        raise InputError("two columns have the same name", path=path, where="column names",
                         expected="a different name for every column",
                         found="; ".join(f"'{name}' at positions {', '.join(map(str, at))}"
                                         for name, at in repeated.items()),
                         hint="rename them in the source: columns are found by name, for the label, the "
                              "features and at prediction time")


def _listing(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:12])
    return f"columns {shown}" + (f" and {len(names) - 12} more" if len(names) > 12 else "")


def as_input_error(exc: MemtrainError) -> InputError:
    """A file problem found while reading a *source* is bad input (exit 2), not a failure."""
    return InputError(exc.message, path=exc.path, where=exc.where, expected=exc.expected, found=exc.found,
                      hint=exc.hint)


def _check_numeric(dtype: np.dtype, path: Path, what: str) -> None:
    if dtype.kind not in NUMERIC_KINDS:
        raise InputError(f"{what} must be numeric", path=path, expected="a bool, integer or float dtype",
                         found=str(dtype))


def _check_lengths(x_rows: int, y_rows: int, x_what: str, y_what: str, path: Path) -> None:
    if x_rows != y_rows:
        raise InputError("features and labels have different lengths", path=path,
                         expected=f"{x_what} and {y_what} with the same number of rows",
                         found=f"{x_rows} and {y_rows} rows")


def _labels_1d(shape: tuple[int, ...], path: Path, what: str) -> None:
    if len(shape) == 0 or (len(shape) == 2 and shape[1] != 1) or len(shape) > 2:
        raise InputError(f"{what} must be one label per row", path=path, expected="shape (rows,) or (rows, 1)",
                         found=f"shape {shape}")


class NpySource:
    """``x.npy`` (rows, *features) + ``--y y.npy`` (rows,): mapped, read in slices."""

    format = "npy"

    def __init__(self, path: Path, y_path: Path | None):
        if y_path is None:
            raise InputError("a .npy source needs its labels", path=path, hint="pass --y LABELS.npy")
        try:
            self._x = check_npy(path)
            self._y = check_npy(y_path)
        except MemtrainError as exc:
            raise as_input_error(exc) from exc
        _check_numeric(self._x.dtype, path, "features")
        if len(self._x.shape) == 0:
            raise InputError("features must have a row axis", path=path, found="a 0-d array")
        _labels_1d(self._y.shape, y_path, "labels")
        _check_lengths(self._x.shape[0], self._y.shape[0], path.name, y_path.name, path)
        self.path, self.y_path = path, y_path
        self.rows = self._x.shape[0]
        self.size_bytes = path.stat().st_size + y_path.stat().st_size
        self.feature_shape = self._x.shape[1:] or (1,)
        self.feature_names = None
        self.label_name = y_path.name

    def chunks(self, rows: int) -> Iterator[Chunk]:
        x = open_npy(self.path).reshape(self.rows, *self.feature_shape)
        y = open_npy(self.y_path).reshape(self.rows)
        for lo in range(0, self.rows, rows):
            yield Chunk(x[lo:lo + rows], y[lo:lo + rows], lo)

    def describe(self) -> dict[str, Any]:
        return {"format": "npy", "path": str(self.path), "y": str(self.y_path), "bytes": self.size_bytes}


class NpzSource:
    """``.npz`` (``np.savez`` or ``savez_compressed``): two members streamed row block by row block."""

    format = "npz"

    def __init__(self, path: Path, x_name: str | None, y_name: str | None):
        self.path = path
        with self._zip() as archive:
            names = [n[:-4] for n in archive.namelist() if n.endswith(".npy")]
            self.x_name = self._pick(names, x_name, ("x", "X", "features", "data"), "--x")
            self.y_name = self._pick(names, y_name, ("y", "labels", "label", "target"), "--y")
            x_shape, x_dtype = self._header(archive, self.x_name)
            y_shape, y_dtype = self._header(archive, self.y_name)
        _check_numeric(x_dtype, path, f"array '{self.x_name}'")
        _labels_1d(y_shape, path, f"array '{self.y_name}'")
        _check_lengths(x_shape[0] if x_shape else 0, y_shape[0], f"'{self.x_name}'", f"'{self.y_name}'", path)
        self._dtypes = (x_dtype, y_dtype)
        self.rows = x_shape[0]
        self.size_bytes = path.stat().st_size
        self.feature_shape = x_shape[1:] or (1,)
        self.feature_names = None
        self.label_name = self.y_name

    def _zip(self) -> zipfile.ZipFile:
        try:
            return zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise InputError(f"not a readable .npz file ({exc})", path=self.path,
                             expected="a zip archive written by np.savez") from exc

    def _pick(self, names: list[str], wanted: str | None, defaults: tuple[str, ...], flag: str) -> str:
        if wanted is not None and wanted in names:
            return wanted
        if wanted is None:
            for name in defaults:
                if name in names:
                    return name
        raise InputError(f"no array named '{wanted or defaults[0]}' in the archive", path=self.path,
                         expected=f"{flag} NAME, one of the arrays", found=", ".join(names) or "no arrays")

    def _header(self, archive: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype]:
        with self._member(archive, name) as handle:
            return _npy_stream_header(handle, self.path, name)[:2]

    def _member(self, archive: zipfile.ZipFile, name: str) -> IO[bytes]:
        try:
            return archive.open(name + ".npy")
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise InputError(f"cannot read array '{name}' ({exc})", path=self.path) from exc

    def chunks(self, rows: int) -> Iterator[Chunk]:
        x_dtype, y_dtype = self._dtypes
        with self._zip() as archive, self._member(archive, self.x_name) as fx, \
                self._member(archive, self.y_name) as fy:
            _npy_stream_header(fx, self.path, self.x_name)
            _npy_stream_header(fy, self.path, self.y_name)
            for lo in range(0, self.rows, rows):
                n = min(rows, self.rows - lo)
                x = self._read(fx, n, (n, *self.feature_shape), x_dtype, self.x_name, lo)
                y = self._read(fy, n, (n,), y_dtype, self.y_name, lo)
                yield Chunk(x, y, lo)

    def _read(self, handle: IO[bytes], n: int, shape: tuple[int, ...], dtype: np.dtype, name: str,
              lo: int) -> np.ndarray:
        want = int(np.prod(shape)) * dtype.itemsize
        try:
            data = handle.read(want)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise InputError(f"array '{name}' is damaged ({exc})", path=self.path, where=f"row {lo}") from exc
        if len(data) != want:
            raise InputError(f"array '{name}' ends early (truncated file)", path=self.path, where=f"row {lo}",
                             expected=f"{want} bytes", found=f"{len(data)} bytes")
        return np.frombuffer(data, dtype=dtype).reshape(shape)

    def describe(self) -> dict[str, Any]:
        return {"format": "npz", "path": str(self.path), "x": self.x_name, "y": self.y_name,
                "bytes": self.size_bytes}


def _npy_stream_header(handle: IO[bytes], path: Path, name: str) -> tuple[tuple[int, ...], np.dtype, bool]:
    try:
        version = np.lib.format.read_magic(handle)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = reader(handle, max_header_size=MAX_NPY_HEADER)
    except (ValueError, SyntaxError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"array '{name}' has an unreadable .npy header ({exc})", path=path) from exc
    if dtype.hasobject:
        raise InputError(f"array '{name}' holds Python objects (loading it would unpickle)", path=path,
                         expected="a numeric or string dtype", found=str(dtype))
    if fortran and len(shape) > 1:
        raise InputError(f"array '{name}' is Fortran-ordered", path=path, expected="C order",
                         hint="save it with np.ascontiguousarray")
    return tuple(int(d) for d in shape), dtype, bool(fortran)


def open_source(options: Any) -> Source:
    """Pick the reader by the source's extension (``options`` is a PrepareOptions)."""
    from memtrain.prepare.csv_source import CsvSource
    from memtrain.prepare.hdf5_source import Hdf5Source
    from memtrain.prepare.parquet_source import ParquetSource

    path: Path = options.source
    for named in (path, Path(options.y) if options.y and path.suffix.lower() == ".npy" else None):
        if named is None:
            continue
        if not named.exists():
            raise InputError("source file not found", path=named)
        check_regular(named, what="a .csv, .npy, .npz, .h5 or .parquet file", error=InputError)
    suffix = path.suffix.lower()
    if path.stat().st_size == 0:
        raise InputError("the file is empty", path=path, expected="a header and data rows" if suffix == ".csv"
                         else "data", found="0 bytes")
    if suffix in (".csv", ".txt"):
        return CsvSource(path, options.label, options.chunk_bytes, options.np_dtype, options.table)
    if suffix == ".npy":
        return NpySource(path, Path(options.y) if options.y else None)
    if suffix == ".npz":
        return NpzSource(path, options.x, options.y)
    if suffix in (".h5", ".hdf5", ".he5"):
        return Hdf5Source(path, options.x, options.y)
    if suffix in (".parquet", ".pq"):
        return ParquetSource(path, options.label, options.table)
    raise InputError("unknown source format", path=path, expected=".csv, .npy, .npz, .h5/.hdf5 or .parquet",
                     found=suffix or "no extension")
