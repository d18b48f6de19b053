"""Command-line arguments -> one frozen PrepareOptions (every default of `memtrain prepare` in one block)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np

from memtrain.errors import InputError
from memtrain.prepare.table import MAX_LEVELS, NA_VALUES, TableOptions

# Defaults, with why:
SHARD_MB = 64  # about 64 MiB per shard file: big enough for sequential reads, small enough to map freely
CHUNK_MB = 64  # rows handled at once while reading and shuffling; peak memory is a small multiple of this
VAL_FRACTION = 0.1
SEED = 0
DTYPES = ("float32", "float64", "float16")


@dataclass(frozen=True)
class PrepareOptions:
    """Everything that decides the bytes of a prepared dataset (plus where it goes)."""

    source: Path | None
    out: Path
    x: str | None = None  # npz array name / HDF5 dataset path of the features
    y: str | None = None  # npz array name / HDF5 dataset path / labels .npy of the targets
    label: str | None = None  # CSV/Parquet target column
    task: str = "auto"
    dtype: str = "float32"
    val_fraction: float = VAL_FRACTION
    seed: int = SEED
    shuffle: bool = True
    shard_mb: float = SHARD_MB
    chunk_mb: float = CHUNK_MB
    drop_nonfinite: bool = False
    overwrite: bool = False
    synthetic: str | None = None  # "ROWSxFEATURES"
    classes: int = 10  # synthetic classification: number of classes
    test_fraction: float = 0.0  # share of rows in a test split (none when 0)
    stratify: bool = False  # keep each class's share of rows the same in train, val and test
    # tables (CSV, Parquet): memtrain/prepare/table.py
    missing: str = "impute"  # impute, drop or error: what a missing feature cell does
    na_values: tuple[str, ...] = NA_VALUES  # the spellings of a missing cell
    columns: tuple[str, ...] | None = None  # keep only these feature columns
    drop_columns: tuple[str, ...] = ()  # leave these columns out
    categorical: tuple[str, ...] = ()  # category columns even if they hold numbers
    categorical_encoding: str = "one-hot"  # or ordinal
    max_levels: int = MAX_LEVELS  # levels kept per category column; the rest go to <rare>
    min_level_count: int = 1  # a level seen fewer times goes to <rare>

    def __post_init__(self) -> None:
        self.table  # noqa: B018 (validates the table options)
        if not 0.0 <= self.val_fraction < 1.0:
            raise InputError("--val-fraction must be in [0, 1)", expected="0 <= f < 1", found=self.val_fraction)
        if not 0.0 <= self.test_fraction < 1.0 or self.val_fraction + self.test_fraction >= 1.0:
            raise InputError("--test-fraction must be in [0, 1) and leave rows for training", expected=
                             "0 <= test fraction and val fraction + test fraction < 1",
                             found=f"{self.test_fraction} (val fraction {self.val_fraction})")
        if self.dtype not in DTYPES:
            raise InputError("unsupported --dtype", expected=" or ".join(DTYPES), found=self.dtype)
        for flag, value in (("--shard-mb", self.shard_mb), ("--chunk-mb", self.chunk_mb)):
            if not math.isfinite(value) or value <= 0:
                raise InputError(f"{flag} out of range", expected="a finite number of MiB > 0", found=value)
        if self.seed < 0:
            raise InputError("--seed out of range", expected="an integer >= 0", found=self.seed)
        if (self.source is None) == (self.synthetic is None):
            raise InputError("give either a SOURCE file or --synthetic ROWSxFEATURES (not both)")

    @property
    def table(self) -> TableOptions:
        return TableOptions(missing=self.missing, na_values=tuple(self.na_values),
                            columns=None if self.columns is None else tuple(self.columns),
                            drop_columns=tuple(self.drop_columns), categorical=tuple(self.categorical),
                            categorical_encoding=self.categorical_encoding, max_levels=self.max_levels,
                            min_level_count=self.min_level_count)

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def chunk_bytes(self) -> int:
        return max(1 << 16, int(self.chunk_mb * (1 << 20)))

    @property
    def shard_bytes(self) -> int:
        return max(1, int(self.shard_mb * (1 << 20)))

    def manifest_options(self) -> dict[str, object]:
        """The options recorded in the manifest (paths and --overwrite are not options of the data)."""
        skip = {"source", "out", "overwrite"}
        return {k: v for k, v in asdict(self).items() if k not in skip}

    def resume_key(self, source_identity: dict[str, object]) -> str:
        """Hash of the options and the source's identity: a rerun with the same ones resumes."""
        # "code": what the work area holds; 2: the spool of a table holds compact rows and its encoding
        blob = json.dumps({"options": self.manifest_options(), "source": source_identity, "code": 2},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def parse_synthetic(spec: str) -> tuple[int, int]:
    """``"100000x64"`` -> (100000, 64); counts may be written ``1e6``, ``1_000_000`` or ``1,000,000``."""
    rows, sep, features = spec.lower().replace("_", "").replace(",", "").partition("x")
    counts = (_count(rows), _count(features)) if sep else (None, None)
    if counts[0] is None or counts[1] is None:
        raise InputError("--synthetic needs ROWSxFEATURES", expected="e.g. 100000x64 or 1e6x64", found=spec)
    return counts


def _count(text: str) -> int | None:
    """A positive whole number written in digits or in scientific notation (``1e6``, ``2.5e3``); else None."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    if not value.is_finite() or value < 1 or value != value.to_integral_value():
        return None
    return int(value)
