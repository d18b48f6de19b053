"""Test models that misbehave on purpose: one kills its own worker, one raises, on marked rows."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import numpy as np

from memtrain.models.softmax import SoftmaxRegression

POISON = 4242.0  # a raw feature value that marks a poisoned row (the tests train without normalization)


@dataclass(frozen=True)
class KillsItsWorker(SoftmaxRegression):
    """Softmax regression whose worker dies (SIGKILL) whenever a batch holds a poisoned row."""

    def loss_and_grad(self, params: dict, x: np.ndarray, y: np.ndarray, grads: dict) -> float:
        if np.any(x[:, 0] == POISON):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().loss_and_grad(params, x, y, grads)


@dataclass(frozen=True)
class RaisesOnPoison(SoftmaxRegression):
    """Softmax regression that raises ValueError on a poisoned row."""

    def loss_and_grad(self, params: dict, x: np.ndarray, y: np.ndarray, grads: dict) -> float:
        if np.any(x[:, 0] == POISON):
            raise ValueError("poisoned row in this batch")
        return super().loss_and_grad(params, x, y, grads)
