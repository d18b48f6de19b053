"""Softmax regression: params W [D, C], b [C]; loss per row -log softmax(x W + b)[y] (y a class index)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from memtrain.models.checks import CLASSIFICATION, require_classes, require_task
from memtrain.models.layers import affine, affine_grads, as_rows
from memtrain.models.losses import class_indices, softmax, softmax_xent, softmax_xent_grad
from memtrain.models.protocol import DataSpec

Params = dict[str, np.ndarray]


@dataclass(frozen=True)
class SoftmaxRegression:
    spec: DataSpec

    additive: ClassVar[bool] = False
    thread_safe: ClassVar[bool] = True  # loss_and_grad keeps no state: the server's task threads may share it
    classifier: ClassVar[bool] = True

    def __post_init__(self) -> None:
        require_task("softmax", self.spec, CLASSIFICATION, "use 'linear', 'ridge' or 'mlp' for regression")
        require_classes("softmax", self.spec)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"W": (self.spec.n_features, self.spec.n_classes), "b": (self.spec.n_classes,)}

    def init(self, rng: np.random.Generator) -> Params:
        """Zeros: the loss is convex, and zero weights start at the uniform prediction. ``rng`` is unused."""
        return {name: np.zeros(shape, dtype=np.float32) for name, shape in self.parameter_shapes().items()}

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray, grads: Params) -> float:
        x = as_rows(x)
        scores = affine(x, params["W"], params["b"])
        loss = softmax_xent_grad(scores, class_indices(y, self.spec.n_classes))
        affine_grads(x, scores, grads["W"], grads["b"])
        return loss

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        return softmax_xent(affine(as_rows(x), params["W"], params["b"]), class_indices(y, self.spec.n_classes))

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        return np.argmax(affine(as_rows(x), params["W"], params["b"]), axis=1)

    def predict_proba(self, params: Params, x: np.ndarray) -> np.ndarray:
        return softmax(affine(as_rows(x), params["W"], params["b"]))
