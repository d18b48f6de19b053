"""Manifest statistics -> a function that standardizes raw feature rows on the fly (float32 out)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Normalizer:
    """(x - mean) / std per feature, with std 0 (a constant feature) treated as 1."""

    mean: np.ndarray | None
    scale: np.ndarray | None

    @classmethod
    def from_stats(cls, stats: dict[str, list[float]] | None, enabled: bool) -> Normalizer:
        if not enabled or not stats:
            return cls(None, None)
        std = np.asarray(stats["std"], dtype=np.float64)
        scale = 1.0 / np.where(std > 0, std, 1.0)
        return cls(np.asarray(stats["mean"], dtype=np.float32), scale.astype(np.float32))

    def __call__(self, x: np.ndarray, *, in_place: bool = False) -> np.ndarray:
        """The rows of ``x`` standardized, one row per line, float32. ``in_place``: into ``x`` itself when it is
        a contiguous float32 array the caller owns (a gather buffer), saving a new array per call; the same
        operations, so the same bits."""
        rows = x.reshape(len(x), -1)
        if self.mean is None:
            return np.ascontiguousarray(rows, dtype=np.float32)
        into = rows if in_place and rows.dtype == np.float32 and rows.flags.c_contiguous and rows.flags.writeable \
            else None
        out = np.subtract(rows, self.mean, dtype=np.float32, out=into)
        out *= self.scale
        return out
