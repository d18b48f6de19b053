"""A test model whose start-up leaves garbage behind: ``init`` fills and drops a 256 MiB scratch array
(tests/test_pools.py: what an outline's kept child hands back before it serves as a worker)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memtrain.models.softmax import SoftmaxRegression

SCRATCH_BYTES = 256 << 20


@dataclass(frozen=True)
class ScratchAtInit(SoftmaxRegression):
    """Softmax regression whose ``init`` uses (and frees) SCRATCH_BYTES of memory first."""

    def init(self, rng: np.random.Generator) -> dict:
        scratch = np.ones(SCRATCH_BYTES // 8)
        assert scratch.sum() > 0
        del scratch
        return super().init(rng)
