"""Arrays (memmaps of any size) -> summary statistics and differences, streamed chunk by chunk.

Nothing here loads a whole array: each chunk is converted to float64, summarised, and merged into a
running total with Chan et al.'s parallel update of the mean and the sum of squared deviations, so the
result matches numpy's float64 ``mean``/``std`` of the whole array to rounding. min, max, mean, std and
the L2 norm are over the finite values; NaN and Inf are counted instead (one NaN would otherwise hide
every other number). ``std`` is the population standard deviation (numpy's default ``ddof=0``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from memtrain.moments import merge_moments

# Elements per streamed chunk: 1M elements is 8 MiB of float64 scratch, enough to run at memory speed
# while bounding the memory a summary takes whatever the size of the checkpoint.
CHUNK = 1 << 20
NUMERIC_KINDS = "biuf"  # bool, signed, unsigned, float: what a summary is computed for


@dataclass
class Summary:
    """Running statistics of the values seen so far; ``add`` a chunk, ``merge`` another summary."""

    size: int = 0
    finite: int = 0
    nan: int = 0
    inf: int = 0
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean (finite values)
    sumsq: float = 0.0  # sum of squares (finite values), for the L2 norm
    low: float = math.inf
    high: float = -math.inf

    def add(self, chunk: np.ndarray) -> None:
        values = np.asarray(chunk, dtype=np.float64).reshape(-1)
        finite = np.isfinite(values)
        count = int(finite.sum())
        nan = int(np.isnan(values).sum()) if count < values.size else 0
        if count < values.size:
            values = values[finite]
        part = Summary(size=int(finite.size), finite=count, nan=nan, inf=int(finite.size) - count - nan)
        if count:
            part.mean = float(values.mean())
            part.m2 = float(np.square(values - part.mean).sum())
            part.sumsq = float(np.dot(values, values))
            part.low, part.high = float(values.min()), float(values.max())
        self.merge(part)

    def merge(self, other: Summary) -> None:
        self.finite, self.mean, self.m2 = merge_moments(self.finite, self.mean, self.m2, other.finite, other.mean,
                                                        other.m2)
        self.size += other.size
        self.nan += other.nan
        self.inf += other.inf
        self.sumsq += other.sumsq
        self.low, self.high = min(self.low, other.low), max(self.high, other.high)

    def to_dict(self) -> dict[str, Any]:
        """``min max mean std l2 nan inf`` (None where there is no finite value)."""
        some = self.finite > 0
        return {"min": self.low if some else None, "max": self.high if some else None,
                "mean": self.mean if some else None, "std": math.sqrt(self.m2 / self.finite) if some else None,
                "l2": math.sqrt(self.sumsq), "nan": self.nan, "inf": self.inf}


EMPTY_STATS = {"min": None, "max": None, "mean": None, "std": None, "l2": None, "nan": None, "inf": None}


def chunks(array: np.ndarray, chunk: int = CHUNK) -> Iterator[np.ndarray]:
    """Consecutive pieces of the flattened array (views of a C-ordered memmap: nothing is copied)."""
    flat = array.reshape(-1)
    for start in range(0, flat.size, max(1, chunk)):
        yield flat[start:start + chunk]


def summarise(array: np.ndarray, chunk: int = CHUNK) -> Summary:
    """Streamed statistics of ``array`` (numeric dtypes only; see ``is_numeric``)."""
    summary = Summary()
    for piece in chunks(array, chunk):
        summary.add(piece)
    return summary


def is_numeric(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind in NUMERIC_KINDS


@dataclass
class Difference:
    """Running ``||other - base||``, ``max |other - base|`` and ``||base||``, ``||other||``."""

    dist_sq: float = 0.0
    max_abs: float = 0.0
    base_sq: float = 0.0
    other_sq: float = 0.0

    def add(self, base: np.ndarray, other: np.ndarray) -> None:
        a = np.asarray(base, dtype=np.float64)
        b = np.asarray(other, dtype=np.float64)
        d = b - a
        self.dist_sq += float(np.dot(d, d))
        if d.size:
            largest = float(np.max(np.abs(d)))
            # A NaN on either side makes the difference unknown; keep it NaN rather than let max() drop it.
            self.max_abs = largest if math.isnan(largest) else max(self.max_abs, largest)
        self.base_sq += float(np.dot(a, a))
        self.other_sq += float(np.dot(b, b))

    def merge(self, other: Difference) -> None:
        self.dist_sq += other.dist_sq
        self.max_abs = other.max_abs if math.isnan(other.max_abs) else max(self.max_abs, other.max_abs)
        self.base_sq += other.base_sq
        self.other_sq += other.other_sq

    def to_dict(self) -> dict[str, Any]:
        """``l2_distance max_abs_diff relative_change norm other_norm``; relative is None if ``norm`` is 0."""
        dist, norm = math.sqrt(self.dist_sq), math.sqrt(self.base_sq)
        relative = dist / norm if norm > 0 else (0.0 if dist == 0 else None)
        return {"l2_distance": dist, "max_abs_diff": self.max_abs, "relative_change": relative,
                "norm": norm, "other_norm": math.sqrt(self.other_sq)}


def difference(base: np.ndarray, other: np.ndarray, chunk: int = CHUNK) -> Difference:
    """Streamed difference of two arrays of the same shape."""
    diff = Difference()
    for a, b in zip(chunks(base, chunk), chunks(other, chunk), strict=True):
        diff.add(a, b)
    return diff
