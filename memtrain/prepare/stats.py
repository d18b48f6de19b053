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
            self._merge(np.asarray(x[lo:lo + rows]).reshape(-1, len(self.mean)))

    def _merge(self, raw: np.ndarray) -> None:
        n = len(raw)
        if n == 0:
            return
        # min and max on the rows as stored (float64 holds every float16/32 value exactly: same result,
        # half the memory traffic); the moments on one float64 copy, worked on in place.
        np.minimum(self.min, raw.min(axis=0), out=self.min)
        np.maximum(self.max, raw.max(axis=0), out=self.max)
        block = raw.astype(np.float64)
        mean = block.mean(axis=0)
        np.subtract(block, mean, out=block)
        m2 = np.square(block, out=block).sum(axis=0)
        self.count, self.mean, self.m2 = merge_moments(self.count, self.mean, self.m2, n, mean, m2)

    def as_dict(self) -> dict[str, list[float]]:
        """The manifest's ``stats``: lists of floats; all zeros when there were no rows."""
        if self.count == 0:
            zeros = np.zeros_like(self.mean).tolist()
            return {"mean": zeros, "std": zeros, "min": zeros, "max": zeros}
        std = np.sqrt(np.maximum(self.m2 / self.count, 0.0))
        return {"mean": self.mean.tolist(), "std": std.tolist(), "min": self.min.tolist(), "max": self.max.tolist()}
