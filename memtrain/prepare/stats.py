"""Rows of features, block by block -> per-feature count, mean, std, min, max (Chan et al.'s parallel merge).

Each block's mean and sum of squared deviations (M2) are computed around the block's own mean and merged
into the running totals with Chan, Golub and LeVeque's pairwise update, which stays accurate where the
naive sum of squares loses every digit (features with a large mean and a small spread). std is the
population standard deviation, sqrt(M2 / n).
"""

from __future__ import annotations

import numpy as np

from memtrain.moments import merge_moments

# Bytes of float64 per block: bounds the temporaries of one update (two blocks) at about 8 MiB.
BLOCK_BYTES = 4 << 20


class RunningStats:
    """Streaming per-feature statistics; ``update(x)`` with x of shape (n, features)."""

    def __init__(self, features: int):
        self.count = 0
        self.mean = np.zeros(features, dtype=np.float64)
        self.m2 = np.zeros(features, dtype=np.float64)
        self.min = np.full(features, np.inf)
        self.max = np.full(features, -np.inf)

    def update(self, x: np.ndarray) -> None:
        rows = max(1, BLOCK_BYTES // (8 * max(1, len(self.mean))))
        for lo in range(0, len(x), rows):
            self._merge(np.asarray(x[lo:lo + rows], dtype=np.float64).reshape(-1, len(self.mean)))

    def _merge(self, block: np.ndarray) -> None:
        n = len(block)
        if n == 0:
            return
        mean = block.mean(axis=0)
        m2 = np.square(block - mean).sum(axis=0)
        self.count, self.mean, self.m2 = merge_moments(self.count, self.mean, self.m2, n, mean, m2)
        np.minimum(self.min, block.min(axis=0), out=self.min)
        np.maximum(self.max, block.max(axis=0), out=self.max)

    def as_dict(self) -> dict[str, list[float]]:
        """The manifest's ``stats``: lists of floats; all zeros when there were no rows."""
        if self.count == 0:
            zeros = np.zeros_like(self.mean).tolist()
            return {"mean": zeros, "std": zeros, "min": zeros, "max": zeros}
        std = np.sqrt(np.maximum(self.m2 / self.count, 0.0))
        return {"mean": self.mean.tolist(), "std": std.tolist(), "min": self.min.tolist(), "max": self.max.tolist()}
