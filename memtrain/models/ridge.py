"""Least squares / ridge regression by the normal equations: rows -> X^T X, X^T Y (float64) -> W [D, K], b [K].

X is augmented with a column of ones, so the intercept is fitted with the weights but not penalized:
solve (Xa^T Xa + alpha * P) [W; b] = Xa^T Y, with P the identity except 0 for the intercept. For
classification, Y is one-hot (K = classes) and predict takes the argmax of the K scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from memtrain.models.checks import CLASSIFICATION, check_nonnegative, output_width, require_classes
from memtrain.models.layers import affine, as_rows, regression_output
from memtrain.models.losses import class_indices, regression_targets, squared_error_grad
from memtrain.models.protocol import DataSpec

Params = dict[str, np.ndarray]


@dataclass(frozen=True)
class Ridge:
    spec: DataSpec
    alpha: float = 0.0  # L2 penalty on W (not b); 0 = ordinary least squares

    additive: ClassVar[bool] = True
    # No predict_proba: ridge scores are not probabilities (predict still returns classes for classification).
    classifier: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_nonnegative("model.alpha", self.alpha)
        require_classes("ridge", self.spec)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"W": (self.spec.n_features, output_width(self.spec)), "b": (output_width(self.spec),)}

    def statistic_shapes(self) -> dict[str, tuple[int, ...]]:
        d = self.spec.n_features + 1
        return {"xtx": (d, d), "xty": (d, output_width(self.spec))}

    def init(self, rng: np.random.Generator) -> Params:
        """Zeros (replaced by ``solve``); ``rng`` is unused."""
        return {name: np.zeros(shape, dtype=np.float32) for name, shape in self.parameter_shapes().items()}

    def _targets(self, y: np.ndarray) -> np.ndarray:
        """Rows x K float64 targets: one-hot class indicators, or the regression targets."""
        if self.spec.task == CLASSIFICATION:
            labels = class_indices(y, self.spec.n_classes)
            onehot = np.zeros((len(labels), self.spec.n_classes), dtype=np.float64)
            onehot[np.arange(len(labels)), labels] = 1.0
            return onehot
        return regression_targets(y, self.spec.n_targets).astype(np.float64)

    def statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """The whole-rows contract (``out`` zeroed, these rows' statistics into it): ``add_statistics``. memtrain
        calls ``add_statistics``; this one serves a subclass that overrides ``statistics`` and calls it."""
        self.add_statistics(x, y, out)

    def add_statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        x = as_rows(x)
        augmented = np.empty((len(x), x.shape[1] + 1), dtype=np.float64)
        augmented[:, :-1] = x
        augmented[:, -1] = 1.0
        out["xtx"] += augmented.T @ augmented  # add: called once per chunk of rows
        out["xty"] += augmented.T @ self._targets(y)

    def solve(self, stats: dict[str, np.ndarray]) -> Params:
        """``linalg.solve`` when alpha > 0 (the system is then positive definite); for plain least squares
        ``lstsq``, whose minimum-norm answer stays sane with collinear or constant (all-zero) features."""
        lhs = np.array(stats["xtx"], dtype=np.float64)
        rhs = np.asarray(stats["xty"], dtype=np.float64)
        if self.alpha > 0:
            d = self.spec.n_features
            lhs[np.arange(d), np.arange(d)] += self.alpha
            try:
                coef = np.linalg.solve(lhs, rhs)
            except np.linalg.LinAlgError:
                coef = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
        else:
            coef = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
        return {"W": coef[:-1].astype(np.float32), "b": coef[-1].astype(np.float32)}

    def _scores(self, params: Params, x: np.ndarray) -> np.ndarray:
        return affine(as_rows(x), params["W"], params["b"])

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        """Summed 0.5 * squared error (against the one-hot targets for classification), without the penalty."""
        return squared_error_grad(self._scores(params, x), self._targets(y).astype(np.float32))

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        scores = self._scores(params, x)
        if self.spec.task == CLASSIFICATION:
            return np.argmax(scores, axis=1)
        return regression_output(scores, self.spec)
