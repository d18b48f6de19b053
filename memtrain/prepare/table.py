"""Raw table cells (numbers, text, missing) -> the encoding (levels, fill values, column order) and numeric rows.

Glossary: a *column* is a feature column of the source; a *category* column holds text (or is named by
``--categorical``), a *number* column holds numbers; a *level* is one distinct value of a category column;
a *cell* is missing when it is empty or spelled as one of ``--na-values``. The *encoding* is data, recorded in
the manifest (``encoding``, docs/formats.md) and applied again by ``predict`` to raw rows:

- a number column is one feature; a missing cell gets the column's ``fill`` (its mean over the rows that
  have a value, all splits);
- a category column keeps at most ``--max-levels`` levels (the most frequent, each seen at least
  ``--min-level-count`` times), sorted by name; then ``<missing>`` (when prepare saw a missing cell there)
  and ``<rare>`` (every other level, and at predict time every unseen one). ``one-hot``: one 0/1 feature per
  level and bucket, named ``column=level``; ``ordinal``: one feature holding the level's index.

Prepare needs the levels and the means before it can write a row, so it spools *compact* rows in pass 1
(one value per column: the number, NaN for a missing cell, or a level's provisional id in order of first
appearance) while ``Survey`` counts; pass 2 ``expand``s the shuffled compact rows. Memory is bounded by the
distinct levels (at most ``MAX_DISTINCT`` per column), never by the rows.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import CorruptFileError, InputError, plural

MISSING_MODES = ("impute", "drop", "error")
CATEGORICAL = ("one-hot", "ordinal")
# The spellings of a missing cell in real exports (R writes NA, pandas NaN or an empty field, databases null).
NA_VALUES = ("", "NA", "N/A", "NaN", "nan", "null", "NULL")
# A category column keeps at most this many levels by default; the rest share the <rare> bucket. One-hot
# features grow with it, so it is a cap on the width of a row, not on what is read.
MAX_LEVELS = 100
# Distinct values counted per category column while reading: what bounds prepare's memory. A column with
# more is an identifier or free text, not a category.
MAX_DISTINCT = 65536
RARE = "<rare>"
MISSING = "<missing>"
NUMBER, CATEGORY = "number", "category"


@dataclass(frozen=True, kw_only=True)
class TableOptions:
    """How a CSV/Parquet table becomes numbers (the table half of PrepareOptions)."""

    missing: str = "impute"
    na_values: tuple[str, ...] = NA_VALUES
    columns: tuple[str, ...] | None = None  # keep only these feature columns (--columns)
    drop_columns: tuple[str, ...] = ()  # leave these out (--drop-columns)
    categorical: tuple[str, ...] = ()  # treat these as category columns even if they hold numbers
    categorical_encoding: str = "one-hot"
    max_levels: int = MAX_LEVELS
    min_level_count: int = 1

    def __post_init__(self) -> None:
        if self.missing not in MISSING_MODES:
            raise InputError("unknown --missing", expected=" or ".join(MISSING_MODES), found=self.missing)
        if self.categorical_encoding not in CATEGORICAL:
            raise InputError("unknown --categorical-encoding", expected=" or ".join(CATEGORICAL),
                             found=self.categorical_encoding)
        if not 1 <= self.max_levels <= MAX_DISTINCT:
            raise InputError("--max-levels out of range", expected=f"1 to {MAX_DISTINCT}", found=self.max_levels)
        if self.min_level_count < 1:
            raise InputError("--min-level-count out of range", expected="an integer >= 1", found=self.min_level_count)

    @property
    def number_na(self) -> tuple[str, ...]:
        """Spellings of a missing *number*: none under ``--missing error``, which reads numbers as before."""
        return () if self.missing == "error" else self.na_values

    def select(self, names: list[str], label: str, path: Path | None) -> list[str]:
        """The feature columns kept, in source order (every name given must be a column)."""
        for flag, given in (("--columns", self.columns or ()), ("--drop-columns", self.drop_columns),
                            ("--categorical", self.categorical)):
            unknown = [n for n in given if n not in names and n != label]
            if unknown:
                raise InputError(f"{flag} names a column the source does not have", path=path,
                                 expected="one of " + ", ".join(repr(n) for n in names), found=", ".join(unknown))
        keep = [n for n in names if (self.columns is None or n in self.columns) and n not in self.drop_columns]
        if not keep:
            raise InputError("no feature columns left", path=path, expected="at least one column besides the label",
                             found=f"--columns {','.join(self.columns or ())} --drop-columns "
                                   f"{','.join(self.drop_columns)}")
        return keep


@dataclass(frozen=True, kw_only=True)
class Column:
    """One source column's part of the encoding."""

    name: str
    kind: str  # NUMBER or CATEGORY
    fill: float | None = None  # number: what a missing cell becomes
    levels: tuple[str, ...] = ()  # category: the kept levels, in code order
    missing_level: bool = False  # category: has a <missing> bucket (prepare saw missing cells)
    missing: int = 0  # missing cells prepare saw in this column

    @property
    def buckets(self) -> tuple[str, ...]:
        """Every code's name: the levels, then <missing> (if any), then <rare>."""
        return (*self.levels, *((MISSING,) if self.missing_level else ()), RARE) if self.kind == CATEGORY else ()

    def as_dict(self) -> dict[str, Any]:
        if self.kind == NUMBER:
            return {"name": self.name, "kind": NUMBER, "fill": self.fill, "missing": self.missing}
        return {"name": self.name, "kind": CATEGORY, "levels": list(self.levels), "missing_level": self.missing_level,
                "missing": self.missing}


@dataclass(frozen=True, kw_only=True)
class Encoding:
    """How raw rows become feature rows; ``manifest["encoding"]`` (docs/formats.md)."""

    columns: tuple[Column, ...]
    categorical: str  # "one-hot" or "ordinal"
    na_values: tuple[str, ...]
    missing: str  # the --missing mode prepare used
    label: str
    source_columns: tuple[str, ...]  # every column of the source: rows may carry these (ignored if not features)

    @property
    def width(self) -> int:
        return len(self.feature_names)

    @property
    def feature_names(self) -> list[str]:
        names: list[str] = []
        for column in self.columns:
            if column.kind == CATEGORY and self.categorical == "one-hot":
                names += [f"{column.name}={b}" for b in column.buckets]
            else:
                names.append(column.name)
        return names

    def expand(self, compact: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """Compact rows (final level codes, NaN for a missing number) -> feature rows in ``dtype``."""
        out = np.zeros((len(compact), self.width), dtype=dtype)
        at = 0
        for j, column in enumerate(self.columns):
            values = compact[:, j]
            if column.kind == NUMBER:
                with np.errstate(over="ignore", invalid="ignore"):
                    out[:, at] = np.where(np.isnan(values), column.fill if column.fill is not None else 0.0, values)
                at += 1
            elif self.categorical == "ordinal":
                out[:, at] = values
                at += 1
            else:
                codes = values.astype(np.int64)
                out[np.arange(len(codes)), at + codes] = 1
                at += len(column.buckets)
        return out

    def codes(self, column: Column, values: Sequence[Any]) -> list[int]:
        """Raw cells of a category column -> codes (unseen -> <rare>, missing -> <missing>, else <rare>)."""
        rare = len(column.buckets) - 1
        missing = len(column.levels) if column.missing_level else rare
        index = {level: i for i, level in enumerate(column.levels)}
        return [missing if _is_missing(v, self.na_values) else index.get(_text(v), rare) for v in values]

    def rows(self, table: Any, dtype: Any = np.float32) -> np.ndarray:
        """Raw rows (a DataFrame, a dict of columns, one dict, or a list of dicts such as csv.DictReader's
        rows, with the source's column names) -> feature rows, encoded as prepare encoded the dataset."""
        columns = raw_columns(table)
        known = set(self.source_columns)
        extra = [name for name in columns if name not in known]
        if extra:
            raise InputError("a column the dataset's source did not have", found=", ".join(map(repr, extra)),
                             expected="the source's columns: " + ", ".join(self.source_columns))
        absent = [c.name for c in self.columns if c.name not in columns]
        if absent:
            raise InputError(f"the rows have no column {', '.join(map(repr, absent))}, which the model needs",
                             expected="every feature column: " + ", ".join(c.name for c in self.columns),
                             found="the rows' columns: " + (", ".join(columns) or "none"))
        lengths = {len(columns[c.name]) for c in self.columns}
        if len(lengths) != 1:
            raise InputError("the columns have different lengths", found=sorted(lengths))
        rows = lengths.pop()
        if rows == 0:
            raise InputError("no rows to encode", expected="at least one row", found="0 rows")
        compact = np.empty((rows, len(self.columns)), dtype=np.float64)
        for j, column in enumerate(self.columns):
            values = columns[column.name]
            _check_cells(column.name, values)
            if column.kind == CATEGORY:
                compact[:, j] = self.codes(column, values)
            else:
                compact[:, j] = [self._number(column, v, i) for i, v in enumerate(values)]
        out = self.expand(compact, np.dtype(dtype))
        self._check_finite(out, compact, np.dtype(dtype))
        return out

    def _number(self, column: Column, value: Any, row: int) -> float:
        if _is_missing(value, self.na_values):
            return math.nan
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise InputError("not a number in a number column", where=f"row {row}, column '{column.name}'",
                             expected="a number or a missing value", found=repr(value)) from None
        if not math.isfinite(number):  # prepare refuses such values: a model never saw one
            raise InputError("not a finite number in a number column", where=f"row {row}, column '{column.name}'",
                             expected="a finite number or a missing value", found=repr(value))
        return number

    def _check_finite(self, out: np.ndarray, compact: np.ndarray, dtype: np.dtype) -> None:
        """A number too large for ``dtype`` is refused as prepare refuses it (it would become Inf)."""
        bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
        if len(bad) == 0:
            return
        row = int(bad[0])
        names = self.feature_names
        column = names[int(np.flatnonzero(~np.isfinite(out[row]))[0])]
        found = compact[row, [c.name for c in self.columns].index(column)]
        raise InputError(f"a value is not a finite {dtype} (out of range)", where=f"row {row}, column '{column}'",
                         expected=f"a number within ±{float(np.finfo(dtype).max):.4g}", found=repr(float(found)))

    def as_dict(self) -> dict[str, Any]:
        return {"columns": [c.as_dict() for c in self.columns], "categorical": self.categorical,
                "na_values": list(self.na_values), "missing": self.missing, "label": self.label,
                "source_columns": list(self.source_columns)}

    @classmethod
    def from_dict(cls, record: Any, path: Path | None = None) -> Encoding:
        try:
            columns = tuple(Column(name=str(c["name"]), kind=c["kind"], fill=c.get("fill"),
                                   levels=tuple(str(v) for v in c.get("levels", ())),
                                   missing_level=bool(c.get("missing_level", False)), missing=int(c.get("missing", 0)))
                            for c in record["columns"])
            if any(c.kind not in (NUMBER, CATEGORY) for c in columns) or record["categorical"] not in CATEGORICAL:
                raise ValueError("unknown kind")
            return cls(columns=columns, categorical=record["categorical"],
                       na_values=tuple(str(v) for v in record["na_values"]), missing=str(record["missing"]),
                       label=str(record["label"]), source_columns=tuple(str(c) for c in record["source_columns"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptFileError(f"the encoding record is malformed ({exc})", path=path, where="encoding") from exc


def _text(value: Any) -> str:
    """A cell as the text prepare saw: integers written as integers (a DataFrame may hold 3 or 3.0 for "3")."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value).strip()


def _is_missing(value: Any, na_values: tuple[str, ...]) -> bool:
    if value is None or type(value).__name__ in ("NAType", "NaTType"):  # pandas.NA, pandas.NaT
        return True
    if isinstance(value, float | np.floating):
        return math.isnan(value)
    return isinstance(value, str) and value.strip() in na_values


def _is_cell(value: Any) -> bool:
    """One value of one cell: text, a number, or a missing value (None, NaN, pandas.NA/NaT)."""
    return value is None or isinstance(value, str | int | float | np.number | np.bool_ | np.str_) or \
        type(value).__name__ in ("NAType", "NaTType")


def _check_cells(name: str, values: Sequence[Any]) -> None:
    """Every cell of a column holds one value (not a list, a dict or bytes, which no source column holds)."""
    for i, value in enumerate(values):
        if not _is_cell(value):
            raise InputError("a cell holds no single value", where=f"row {i}, column '{name}'",
                             expected="text, a number or a missing value",
                             found=f"{type(value).__name__} {_preview(value)}",
                             hint="decode bytes to text first" if isinstance(value, bytes | bytearray) else None)


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _unique_names(names: list[str]) -> None:
    """Rows are matched to the encoding by column name: two columns of one name would be read as one."""
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InputError("two columns of the rows have the same name", expected="a different name for every column",
                         found=", ".join(f"'{name}' {names.count(name)} times" for name in repeated))


def raw_columns(table: Any) -> dict[str, Sequence[Any]]:
    """A DataFrame (duck-typed: ``columns`` and ``[name]``), a dict of columns, one dict of scalars, or a list
    of dicts with the same keys -> {column name: values}."""
    if hasattr(table, "columns") and hasattr(table, "__getitem__") and not isinstance(table, Mapping):
        names = [str(name) for name in table.columns]
        _unique_names(names)
        return {name: list(table[column]) for name, column in zip(names, table.columns, strict=True)}
    if isinstance(table, Mapping):
        _unique_names([str(k) for k in table])
        if all(_is_cell(v) for v in table.values()):
            return {str(k): [v] for k, v in table.items()}  # one row
        for key, values in table.items():
            if _is_cell(values) or isinstance(values, bytes | bytearray | Mapping) or \
                    not isinstance(values, Iterable):
                raise InputError("a dict of columns needs a sequence of values for every column",
                                 where=f"column '{key}'", expected="a list, an array or a Series",
                                 found=f"{type(values).__name__} {_preview(values)}",
                                 hint="decode bytes to text first" if isinstance(values, bytes | bytearray) else
                                 "one dict of single values is one row; a dict of lists is one list per column")
        return {str(k): list(v) for k, v in table.items()}
    if not isinstance(table, Iterable) or isinstance(table, str | bytes | bytearray):
        raise InputError("raw rows must be a DataFrame, a dict of columns or a list of dicts",
                         found=type(table).__name__)
    rows = list(table)
    if not rows or not all(isinstance(r, Mapping) for r in rows):
        raise InputError("raw rows must be a DataFrame, a dict of columns or a list of dicts",
                         found=type(table).__name__)
    names = list(rows[0])
    for i, row in enumerate(rows):
        if list(row) != names and set(row) != set(names):
            raise InputError("the rows do not all have the same columns", where=f"row {i}",
                             expected=", ".join(names), found=", ".join(map(str, row)))
    return {str(name): [row[name] for row in rows] for name in names}


def is_raw(table: Any) -> bool:
    """Raw rows (named columns) rather than an array of features."""
    if isinstance(table, Mapping) or (hasattr(table, "columns") and hasattr(table, "iloc")):
        return True
    return isinstance(table, list | tuple) and bool(table) and isinstance(table[0], Mapping)


@dataclass
class Survey:
    """Pass 1: counts what the encoding needs (level counts, sums for the means, missing cells) chunk by chunk,
    and turns raw chunks into compact rows for the spool."""

    options: TableOptions
    names: list[str]
    kinds: list[str]
    label: str
    source_columns: list[str]
    path: Path | None = None
    ids: list[dict[str, int]] = field(init=False)
    counts: list[list[int]] = field(init=False)
    sums: np.ndarray = field(init=False)
    seen: np.ndarray = field(init=False)
    missing: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.ids = [{} for _ in self.names]
        self.counts = [[] for _ in self.names]
        self.sums = np.zeros(len(self.names))
        self.seen = np.zeros(len(self.names), dtype=np.int64)
        self.missing = np.zeros(len(self.names), dtype=np.int64)

    def compact(self, x: np.ndarray, missing: np.ndarray | None, text: Mapping[int, np.ndarray],
                dtype: np.dtype) -> np.ndarray:
        """One chunk's rows (NaN in missing cells and category columns) -> compact rows in ``dtype`` (the
        spool's); counts what it saw. The means are summed from the values as stored (in ``dtype``), so
        they do not depend on which parser read a block; float64 sums of float32 values are exact."""
        out = x.astype(dtype, copy=bool(text))  # a copy when level ids are written into it
        if missing is not None:
            self.missing += missing.sum(axis=0)
        for j, values in text.items():
            out[:, j] = self._level_ids(j, values, None if missing is None else missing[:, j])
        numbers = self.numbers
        if numbers:
            block = out if len(numbers) == out.shape[1] else out[:, numbers]
            total = np.sum if missing is None else np.nansum  # nansum copies the block: only when needed
            self.sums[numbers] += total(block, axis=0, dtype=np.float64)
            self.seen[numbers] += len(out) - (0 if missing is None else missing[:, numbers].sum(axis=0))
        return out

    @property
    def numbers(self) -> list[int]:
        return [j for j, kind in enumerate(self.kinds) if kind == NUMBER]

    def _level_ids(self, j: int, values: np.ndarray, missing: np.ndarray | None) -> np.ndarray:
        names, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
        ids, tally = self.ids[j], self.counts[j]
        mapped = np.empty(len(names), dtype=np.float64)
        for k, name in enumerate(names.tolist()):
            if name not in ids:
                if name in (RARE, MISSING):
                    raise self._reserved(j, name)
                ids[name] = len(ids)
                tally.append(0)
            mapped[k] = ids[name]
            tally[ids[name]] += int(counts[k])
        if len(ids) > MAX_DISTINCT:
            raise InputError("a category column has too many distinct values", path=self.path,
                             where=f"column '{self.names[j]}'", expected=f"at most {MAX_DISTINCT:,} levels",
                             found=f"more than {MAX_DISTINCT:,}",
                             hint="an identifier or free text is no category: leave it out with --drop-columns")
        result = mapped[inverse.reshape(-1)]
        if missing is not None and missing.any():
            result[missing] = np.nan
            tally[ids[values[missing][0]]] -= int(missing.sum())  # missing cells are no level
        return result

    def _reserved(self, j: int, name: str) -> InputError:
        """A value spelled as one of the encoding's own buckets would give two features of one name."""
        return InputError(f"a value of a text column is spelled like memtrain's {name} bucket", path=self.path,
                          where=f"column '{self.names[j]}'", expected=f"values other than {RARE} and {MISSING}",
                          found=repr(name), hint=f"rename the value in the source, or leave the column out with "
                                                 f"--drop-columns {shlex.quote(self.names[j])}")

    def finish(self) -> tuple[Encoding, list[list[int] | None]]:
        """The encoding, and per column the map provisional id -> final code (None for number columns)."""
        columns, remaps = [], []
        for j, name in enumerate(self.names):
            if self.kinds[j] == NUMBER:
                fill = float(self.sums[j] / self.seen[j]) if self.seen[j] else 0.0
                columns.append(Column(name=name, kind=NUMBER, fill=fill, missing=int(self.missing[j])))
                remaps.append(None)
                continue
            column, remap = self._category(j, name)
            columns.append(column)
            remaps.append(remap)
        encoding = Encoding(columns=tuple(columns), categorical=self.options.categorical_encoding,
                            na_values=self.options.na_values, missing=self.options.missing, label=self.label,
                            source_columns=tuple(self.source_columns))
        return encoding, remaps

    def _category(self, j: int, name: str) -> tuple[Column, list[int]]:
        ids, tally = self.ids[j], self.counts[j]
        by_count = sorted((level for level in ids if tally[ids[level]] >= self.options.min_level_count
                           and tally[ids[level]] > 0), key=lambda level: (-tally[ids[level]], level))
        kept = sorted(by_count[:self.options.max_levels])
        missing_level = bool(self.missing[j])
        column = Column(name=name, kind=CATEGORY, levels=tuple(kept), missing_level=missing_level,
                        missing=int(self.missing[j]))
        index = {level: i for i, level in enumerate(kept)}
        rare = len(column.buckets) - 1
        remap = [rare] * len(ids)
        for level, provisional in ids.items():
            remap[provisional] = index.get(level, rare)
        return column, remap

    def missing_note(self) -> str | None:
        """``missing  3 values imputed: bill_length_mm 2 (mean 43.92), sex 1 (level <missing>)``."""
        counts = [(self.names[j], int(n)) for j, n in enumerate(self.missing) if n]
        if not counts:
            return None
        total = sum(n for _, n in counts)
        return f"{plural(total, 'missing value')} imputed: " + ", ".join(f"{name} {n:,}" for name, n in counts)


def final_codes(compact: np.ndarray, remaps: list[list[int] | None], encoding: Encoding) -> np.ndarray:
    """Compact rows from the spool (provisional level ids, NaN for a missing cell) -> compact rows with final
    codes: a level's code, <missing> for a missing category cell (<rare> if the column has no such bucket);
    a missing number stays NaN (``expand`` fills it)."""
    out = np.array(compact, dtype=np.float64, copy=True)
    for j, (remap, column) in enumerate(zip(remaps, encoding.columns, strict=True)):
        if remap is None:
            continue
        values = out[:, j]
        missing = np.isnan(values)
        table = np.asarray([*remap, len(column.levels) if column.missing_level else len(column.buckets) - 1],
                           dtype=np.float64)
        out[:, j] = table[np.where(missing, len(remap), values).astype(np.int64)]
    return out
