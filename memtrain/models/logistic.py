"""Binary logistic regression: params w [D], b [1]; loss per row = sigmoid cross-entropy of x w + b vs y in {0,1}."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from memtrain.errors import InputError
from memtrain.models.checks import CLASSIFICATION, require_task
from memtrain.models.layers import as_rows
from memtrain.models.losses import class_indices, sigmoid, sigmoid_xent_grad
from memtrain.models.protocol import DataSpec

Params = dict[str, np.ndarray]


@dataclass(frozen=True)
class LogisticRegression:
    spec: DataSpec

    additive: ClassVar[bool] = False
    thread_safe: ClassVar[bool] = True  # loss_and_grad keeps no state: the server's task threads may share it
    classifier: ClassVar[bool] = True

    def __post_init__(self) -> None:
        require_task("logistic", self.spec, CLASSIFICATION, "use 'linear', 'ridge' or 'mlp' for regression")
        if self.spec.n_classes != 2:
            raise InputError("model 'logistic' needs exactly 2 classes", expected="2 classes",
                             found=f"{self.spec.n_classes} classes", hint="use model kind 'softmax' for more classes")

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"w": (self.spec.n_features,), "b": (1,)}

    def init(self, rng: np.random.Generator) -> Params:
        """Zeros (convex loss); ``rng`` is unused."""
        return {"w": np.zeros(self.spec.n_features, dtype=np.float32), "b": np.zeros(1, dtype=np.float32)}

    def _scores(self, params: Params, x: np.ndarray) -> np.ndarray:
        z = np.matmul(x, params["w"])
        np.add(z, params["b"], out=z)
        return z

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray, grads: Params) -> float:
        x = as_rows(x)
        dz = self._scores(params, x)
        loss = sigmoid_xent_grad(dz, class_indices(y, 2))
        np.matmul(dz, x, out=grads["w"])
        np.sum(dz, keepdims=True, out=grads["b"])
        return loss

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        return sigmoid_xent_grad(self._scores(params, as_rows(x)), class_indices(y, 2))

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        return (self._scores(params, as_rows(x)) > 0).astype(np.int64)

    def predict_proba(self, params: Params, x: np.ndarray) -> np.ndarray:
        """Rows x 2: [P(class 0), P(class 1)]."""
        p1 = sigmoid(self._scores(params, as_rows(x)))
        return np.stack([np.float32(1) - p1, p1], axis=1)
