"""Test models that misbehave on purpose: one kills its own worker, one raises, on marked rows."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import numpy as np

from memtrain.models.mlp import MLP
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


@dataclass(frozen=True)
class OutOfMemoryOnPoison(SoftmaxRegression):
    """Softmax regression whose gradient runs out of memory (MemoryError, as numpy raises it) on a poisoned row."""

    def loss_and_grad(self, params: dict, x: np.ndarray, y: np.ndarray, grads: dict) -> float:
        if np.any(x[:, 0] == POISON):
            raise MemoryError("Unable to allocate 1.00 TiB for an array with shape (137438953472,) and data type "
                              "float64")
        return super().loss_and_grad(params, x, y, grads)


@dataclass(frozen=True)
class NanLossOnPoison(MLP):
    """An MLP whose loss is NaN on a batch holding a poisoned row: the update is skipped at its gradients."""

    def loss_and_grad(self, params: dict, x: np.ndarray, y: np.ndarray, grads: dict) -> float:
        loss = super().loss_and_grad(params, unpoisoned(x), y, grads)
        return float("nan") if np.any(x[:, 0] == POISON) else loss


@dataclass(frozen=True)
class HugeGradientOnPoison(MLP):
    """An MLP whose gradient is the largest float32 on a batch holding a poisoned row, and its loss finite.

    Each task's gradient is finite; when two tasks of one update are poisoned, their sum is not, so the
    update is skipped at its step, not at its gradients.
    """

    def loss_and_grad(self, params: dict, x: np.ndarray, y: np.ndarray, grads: dict) -> float:
        loss = super().loss_and_grad(params, unpoisoned(x), y, grads)
        if np.any(x[:, 0] == POISON):
            for grad in grads.values():
                grad.fill(np.finfo(np.float32).max)
        return loss


def unpoisoned(x: np.ndarray) -> np.ndarray:
    x = np.array(x, dtype=np.float32)
    x[x[:, 0] == POISON, 0] = 0.0
    return x
