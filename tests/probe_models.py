"""A test model that checks, inside the worker, how many BLAS threads it was given."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_info

from memtrain.models.softmax import SoftmaxRegression


@dataclass(frozen=True)
class ExpectsBlasThreads(SoftmaxRegression):
    """Raises in the worker unless every BLAS pool runs ``expect_threads`` threads."""

    expect_threads: int = 1

    def loss_and_grad(self, params: dict, x: np.ndarray, y: np.ndarray, grads: dict) -> float:
        found = sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
        if found != [self.expect_threads]:
            raise ValueError(f"BLAS threads in this worker: {found}, expected {self.expect_threads}")
        return super().loss_and_grad(params, x, y, grads)
