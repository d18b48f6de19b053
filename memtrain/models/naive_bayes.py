"""Gaussian naive Bayes: rows -> per-class count, sum, sum of squares (float64) -> log priors, means, variances.

Like scikit-learn's GaussianNB: every variance gets epsilon = var_smoothing * (largest variance of a
feature over all rows) added, and the class score is log prior + sum of per-feature Gaussian log
densities. Variances come from sums of squares (E[x^2] - E[x]^2) in float64; on normalized features
the cancellation this invites costs far less than the float32 the parameters are stored in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from memtrain.models.checks import CLASSIFICATION, check_nonnegative, require_classes, require_task
from memtrain.models.layers import as_rows
from memtrain.models.losses import class_indices
from memtrain.models.protocol import DataSpec

Params = dict[str, np.ndarray]
# log prior of a class with no training rows: finite (weight files stay finite) but never predicted.
ABSENT_LOG_PRIOR = -1e30


@dataclass(frozen=True)
class GaussianNaiveBayes:
    spec: DataSpec
    var_smoothing: float = 1e-9

    additive: ClassVar[bool] = True
    classifier: ClassVar[bool] = True

    def __post_init__(self) -> None:
        require_task("naive_bayes", self.spec, CLASSIFICATION, "use 'ridge' or 'linear' for regression")
        require_classes("naive_bayes", self.spec)
        check_nonnegative("model.var_smoothing", self.var_smoothing)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        c, d = self.spec.n_classes, self.spec.n_features
        return {"log_prior": (c,), "mean": (c, d), "var": (c, d)}

    def statistic_shapes(self) -> dict[str, tuple[int, ...]]:
        c, d = self.spec.n_classes, self.spec.n_features
        return {"count": (c,), "sum": (c, d), "sumsq": (c, d)}

    def init(self, rng: np.random.Generator) -> Params:
        """Uniform prior, zero means, unit variances (replaced by ``solve``); ``rng`` is unused."""
        c, d = self.spec.n_classes, self.spec.n_features
        return {"log_prior": np.full(c, -math.log(c), dtype=np.float32),
                "mean": np.zeros((c, d), dtype=np.float32), "var": np.ones((c, d), dtype=np.float32)}

    def statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """The whole-rows contract (``out`` zeroed, these rows' statistics into it): ``add_statistics``. memtrain
        calls ``add_statistics``; this one serves a subclass that overrides ``statistics`` and calls it."""
        self.add_statistics(x, y, out)

    def add_statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        labels = class_indices(y, self.spec.n_classes)
        x64 = as_rows(x).astype(np.float64)
        onehot = np.zeros((len(labels), self.spec.n_classes), dtype=np.float64)
        onehot[np.arange(len(labels)), labels] = 1.0
        out["count"] += np.bincount(labels, minlength=self.spec.n_classes)  # add: called once per chunk of rows
        out["sum"] += onehot.T @ x64
        np.square(x64, out=x64)
        out["sumsq"] += onehot.T @ x64

    def solve(self, stats: dict[str, np.ndarray]) -> Params:
        count = np.asarray(stats["count"], dtype=np.float64)
        total = count.sum()
        seen = count > 0
        per_class = np.maximum(count, 1.0)[:, None]
        mean = stats["sum"] / per_class
        var = np.maximum(stats["sumsq"] / per_class - mean**2, 0.0)
        overall_mean = stats["sum"].sum(axis=0) / max(total, 1.0)
        overall_var = np.maximum(stats["sumsq"].sum(axis=0) / max(total, 1.0) - overall_mean**2, 0.0)
        var += self.var_smoothing * (overall_var.max() if overall_var.size else 0.0)
        var[~seen] = 1.0
        log_prior = np.full(len(count), ABSENT_LOG_PRIOR)
        log_prior[seen] = np.log(count[seen] / total)
        return {"log_prior": log_prior.astype(np.float32), "mean": mean.astype(np.float32),
                "var": var.astype(np.float32)}

    def joint_log_likelihood(self, params: Params, x: np.ndarray) -> np.ndarray:
        """Rows x classes, float64: log prior + sum over features of log N(x | mean, var).

        sum((x - m)^2 / v) is expanded into x^2 @ (1/v)^T - 2 x @ (m/v)^T + sum(m^2 / v): three matmuls
        instead of a rows x classes x features temporary.
        """
        x64 = as_rows(x).astype(np.float64)
        mean = params["mean"].astype(np.float64)
        inv_var = 1.0 / params["var"].astype(np.float64)
        quad = np.square(x64) @ inv_var.T
        quad -= 2.0 * (x64 @ (mean * inv_var).T)
        quad += np.sum(mean**2 * inv_var, axis=1)
        log_norm = -0.5 * np.sum(np.log(2.0 * np.pi * params["var"].astype(np.float64)), axis=1)
        return params["log_prior"].astype(np.float64) + log_norm - 0.5 * quad

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        """Summed negative log posterior probability of the true class."""
        labels = class_indices(y, self.spec.n_classes)
        jll = self.joint_log_likelihood(params, x)
        top = jll.max(axis=1, keepdims=True)
        log_evidence = top[:, 0] + np.log(np.sum(np.exp(jll - top), axis=1))
        return float(np.sum(log_evidence - jll[np.arange(len(labels)), labels]))

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        return np.argmax(self.joint_log_likelihood(params, x), axis=1)

    def predict_proba(self, params: Params, x: np.ndarray) -> np.ndarray:
        jll = self.joint_log_likelihood(params, x)
        jll -= jll.max(axis=1, keepdims=True)
        np.exp(jll, out=jll)
        jll /= jll.sum(axis=1, keepdims=True)
        return jll.astype(np.float32)
