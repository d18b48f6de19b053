"""Model outputs (float32 scores) + targets -> summed loss, and the gradient of it w.r.t. the scores.

Each ``*_grad`` function overwrites the scores array with d(summed loss)/d(scores), to save a temporary
of the size of the output layer. Per-row losses are float32; their sum is taken in float64.
"""

from __future__ import annotations

import numpy as np

from memtrain.errors import InputError


def class_indices(y: np.ndarray, n_classes: int) -> np.ndarray:
    """Check that targets are class indices in [0, n_classes); a wrong label file fails here, clearly."""
    y = np.asarray(y).reshape(-1)
    if y.dtype.kind not in "iu":
        raise InputError("classification targets must be integer class indices", expected="an integer dtype",
                         found=str(y.dtype))
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise InputError("class index out of range", expected=f"0..{n_classes - 1}",
                         found=f"{int(y.min())}..{int(y.max())}")
    return y


def regression_targets(y: np.ndarray, width: int) -> np.ndarray:
    """Targets as float32 rows x width ([n] and [n, ...] both accepted)."""
    y = np.asarray(y)
    if y.size != len(y) * width:
        raise InputError("regression targets have the wrong width", expected=f"{width} value(s) per row",
                         found=f"shape {list(y.shape)}")
    return y.reshape(len(y), width).astype(np.float32, copy=False)


def _shift_exp(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """z <- exp(z - rowmax); return (row sums, shifted score of the true class)."""
    np.subtract(z, z.max(axis=1, keepdims=True), out=z)
    true_score = z[np.arange(len(z)), y]
    np.exp(z, out=z)
    return z.sum(axis=1), true_score


def softmax_xent(z: np.ndarray, y: np.ndarray) -> float:
    """Summed cross-entropy of softmax(z) against class indices y (log-sum-exp with the row max removed).

    Destroys ``z``.
    """
    sums, true_score = _shift_exp(z, y)
    return float(np.sum(np.log(sums) - true_score, dtype=np.float64))


def softmax_xent_grad(z: np.ndarray, y: np.ndarray) -> float:
    """As ``softmax_xent``; leaves softmax(z) - onehot(y) in ``z``."""
    sums, true_score = _shift_exp(z, y)
    np.divide(z, sums[:, None], out=z)
    z[np.arange(len(z)), y] -= np.float32(1)
    return float(np.sum(np.log(sums) - true_score, dtype=np.float64))


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax, in place; returns ``z``."""
    np.subtract(z, z.max(axis=1, keepdims=True), out=z)
    np.exp(z, out=z)
    np.divide(z, z.sum(axis=1, keepdims=True), out=z)
    return z


def sigmoid_xent_grad(z: np.ndarray, y: np.ndarray) -> float:
    """Summed binary cross-entropy of sigmoid(z) against y in {0, 1}; leaves sigmoid(z) - y in ``z``.

    Per row: max(z, 0) - y*z + log1p(exp(-|z|)), which never overflows.
    """
    yf = y.astype(np.float32)
    e = np.exp(-np.abs(z))
    per_row = np.maximum(z, np.float32(0)) - yf * z + np.log1p(e)
    numerator = np.where(z >= 0, np.float32(1), e)
    np.add(e, np.float32(1), out=e)
    np.divide(numerator, e, out=z)
    np.subtract(z, yf, out=z)
    return float(np.sum(per_row, dtype=np.float64))


def sigmoid(z: np.ndarray) -> np.ndarray:
    """Stable logistic function (no overflow for large |z|)."""
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, np.float32(1), e) / (np.float32(1) + e)


def squared_error_grad(out: np.ndarray, y: np.ndarray) -> float:
    """Summed 0.5 * ||out - y||^2 over rows; leaves the residual out - y in ``out``."""
    np.subtract(out, y, out=out)
    flat = out.reshape(-1)
    return 0.5 * float(np.dot(flat.astype(np.float64), flat.astype(np.float64)))
