"""An example user model (docs/models.md's): Huber regression, params w [D], b [1], option delta.

Use it in a job with ``[model] kind = "user_model_example:HuberRegression"`` and ``delta = 1.0``,
with this file's directory on PYTHONPATH. The tests build it by that import path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from memtrain.errors import InputError
from memtrain.models.protocol import DataSpec

Params = dict[str, np.ndarray]


@dataclass(frozen=True)
class HuberRegression:
    spec: DataSpec  # first field: memtrain calls HuberRegression(spec, **options)
    delta: float = 1.0  # residuals beyond delta cost linearly, not quadratically

    additive: ClassVar[bool] = False  # a gradient model: implements loss_and_grad

    def __post_init__(self) -> None:
        if self.spec.task != "regression" or self.spec.n_targets != 1:
            raise InputError("model 'huber' needs one regression target", found=f"task {self.spec.task!r}")
        if not self.delta > 0:
            raise InputError("bad value for model.delta", expected="a number > 0", found=repr(self.delta))

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"w": (self.spec.n_features,), "b": (1,)}

    def init(self, rng: np.random.Generator) -> Params:
        return {"w": np.zeros(self.spec.n_features, dtype=np.float32), "b": np.zeros(1, dtype=np.float32)}

    def _residual(self, params: Params, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x @ params["w"] + params["b"] - y.reshape(-1).astype(np.float32)

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        r = np.abs(self._residual(params, x, y))
        per_row = np.where(r <= self.delta, 0.5 * r * r, self.delta * (r - 0.5 * self.delta))
        return float(np.sum(per_row, dtype=np.float64))  # the SUM over rows, not the mean

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray, grads: Params) -> float:
        r = self._residual(params, x, y)
        slope = np.clip(r, -self.delta, self.delta)  # d loss / d prediction, per row
        grads["w"][...] = slope @ x  # summed over rows; overwrite, never add
        grads["b"][...] = slope.sum()
        return self.loss(params, x, y)

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        return x @ params["w"] + params["b"]
