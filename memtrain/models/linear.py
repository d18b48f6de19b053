"""Linear regression: params W [D, K], b [K]; loss per row 0.5 * ||x W + b - y||^2 (K = spec.n_targets)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from memtrain.models.checks import REGRESSION, require_task
from memtrain.models.layers import affine, affine_grads, as_rows, gaussian, regression_output
from memtrain.models.losses import regression_targets, squared_error_grad
from memtrain.models.protocol import DataSpec

Params = dict[str, np.ndarray]


@dataclass(frozen=True)
class LinearRegression:
    spec: DataSpec

    additive: ClassVar[bool] = False
    thread_safe: ClassVar[bool] = True  # loss_and_grad keeps no state: the server's task threads may share it
    classifier: ClassVar[bool] = False

    def __post_init__(self) -> None:
        require_task("linear", self.spec, REGRESSION, "use 'logistic', 'softmax' or 'mlp' for classification")

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"W": (self.spec.n_features, self.spec.n_targets), "b": (self.spec.n_targets,)}

    def init(self, rng: np.random.Generator) -> Params:
        """Small random W (Xavier scale), zero b."""
        d, k = self.spec.n_features, self.spec.n_targets
        return {"W": gaussian(rng, (d, k), math.sqrt(2.0 / (d + k))), "b": np.zeros(k, dtype=np.float32)}

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray, grads: Params) -> float:
        x = as_rows(x)
        residual = affine(x, params["W"], params["b"])
        loss = squared_error_grad(residual, regression_targets(y, self.spec.n_targets))
        affine_grads(x, residual, grads["W"], grads["b"])
        return loss

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        out = affine(as_rows(x), params["W"], params["b"])
        return squared_error_grad(out, regression_targets(y, self.spec.n_targets))

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        return regression_output(affine(as_rows(x), params["W"], params["b"]), self.spec)
