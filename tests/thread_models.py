"""A numpy model for the server's task threads (tests/test_server_threads.py): softmax regression with dropout.

``kind = "thread_models:DropoutSoftmax"``. Seeded (its dropout masks drawn from the task's seed alone) and
``thread_safe``; options for the tests: ``record`` (a file each gradient task appends its thread's name to),
``fail_task`` (the task whose gradient raises from ``fail_version`` on), ``sleep`` (seconds each gradient
task sleeps, the GIL released: a compute time the test knows).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from memtrain.models.protocol import DataSpec

Params = dict[str, np.ndarray]


class InjectedFailure(ValueError):
    pass


@dataclass(frozen=True)
class DropoutSoftmax:
    spec: DataSpec
    dropout: float = 0.3
    record: str = ""
    fail_task: int = -1
    fail_version: int = 3
    sleep: float = 0.0

    additive: ClassVar[bool] = False
    classifier: ClassVar[bool] = True
    seeded: ClassVar[bool] = True
    thread_safe: ClassVar[bool] = True

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"W": (self.spec.n_features, self.spec.n_classes), "b": (self.spec.n_classes,)}

    def init(self, rng: np.random.Generator) -> Params:
        shape = (self.spec.n_features, self.spec.n_classes)
        return {"W": (rng.normal(size=shape) * 0.1).astype(np.float32),
                "b": np.zeros(self.spec.n_classes, dtype=np.float32)}

    def _scores(self, params: Params, x: np.ndarray) -> np.ndarray:
        z = x.reshape(len(x), -1).astype(np.float32) @ params["W"] + params["b"]
        return z - z.max(axis=1, keepdims=True)

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        z = self._scores(params, x)
        log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-log_p[np.arange(len(y)), y.reshape(-1)].sum(dtype=np.float64))

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray, grads: Params, *,
                      seed: tuple[int, int, int]) -> float:
        if self.record:
            with open(self.record, "a", encoding="utf-8") as out:
                out.write(f"{seed[2]} {threading.current_thread().name}\n")
        if self.sleep:
            time.sleep(self.sleep)
        if seed[2] == self.fail_task and seed[1] >= self.fail_version:
            raise InjectedFailure(f"injected failure in task {seed[2]} at version {seed[1]}")
        keep = np.random.default_rng(list(seed)).random(x.reshape(len(x), -1).shape) >= self.dropout
        x = np.where(keep, x.reshape(len(x), -1) / np.float32(1 - self.dropout), np.float32(0)).astype(np.float32)
        z = self._scores(params, x)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        rows, labels = np.arange(len(y)), y.reshape(-1)
        loss = float(-np.log(p[rows, labels]).sum(dtype=np.float64))
        p[rows, labels] -= 1
        grads["W"][...] = x.T @ p
        grads["b"][...] = p.sum(axis=0)
        return loss

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        return np.argmax(self._scores(params, x), axis=1)
