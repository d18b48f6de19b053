"""Validation rows + a model's predictions -> summed statistics per task -> the metrics of the whole split.

A worker writes one small float64 vector per evaluation task (``layout.metrics_name``; the server keeps
those of the tasks it runs itself in memory); the server adds them in task order (fixed, so metrics are
reproducible) and turns the sums into metrics. The vector holds sums, not averages, so any split of the
rows into tasks gives the same metrics (up to float rounding).

Classification (K classes): ``[rows, log-loss sum, correct, true positives[K], predicted[K], actual[K]]``;
macro-F1 averages the per-class F1 over the classes that occur in the labels or the predictions (as
scikit-learn's ``f1_score(average="macro")``); log-loss clips probabilities at 1e-15 (NaN, and left out,
for a model without ``predict_proba``).
Regression (T outputs per row): ``[rows, absolute error sum, mean of y[T], squared deviation of y[T],
squared error[T]]``, the y moments combined exactly across tasks (Chan et al.); R² is
``1 - SSE/SST`` per output, averaged over outputs (1 when SST = SSE = 0, 0 when only SST = 0), MAE and RMSE
are over every target value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from memtrain.files import open_npy, writing_npy
from memtrain.models.protocol import Evaluation
from memtrain.train.context import ModelContext
from memtrain.train.exchange.area import METRICS, discard

PROBABILITY_FLOOR = 1e-15  # log-loss clips probabilities here, as scikit-learn does: log(0) is -inf
# What the epoch lines and the summary show, in this order (metrics.jsonl and inspect have every metric).
SHOWN = ("val_loss", "val_accuracy", "val_macro_f1", "val_r2", "val_rmse", "val_mae")


def statistics_size(context: ModelContext) -> int:
    if context.classifier:
        return 3 + 3 * context.spec.n_classes
    return 2 + 3 * context.spec.n_targets


def evaluation(context: ModelContext, params: dict[str, np.ndarray], x: np.ndarray, y: Any) -> Evaluation:
    """The loss of rows ``x``, ``y``, the predictions (a classifier's, else None: made once for the accuracy and
    the statistics) and the probabilities when the model gives them in the same pass (``evaluate``,
    models/protocol.py: one forward pass of a torch module instead of three), else None."""
    model = context.model
    if hasattr(model, "evaluate"):
        return model.evaluate(params, x, y)
    predicted = model.predict(params, x) if context.classifier else None
    return Evaluation(loss=float(model.loss(params, x, y)), predicted=predicted, proba=None)


def task_statistics(context: ModelContext, params: dict[str, np.ndarray], x: np.ndarray, y: Any, *,
                    predicted: Any = None, proba: np.ndarray | None = None) -> np.ndarray:
    """The summed statistics of normalized rows ``x`` with targets ``y`` (see the module docstring).

    ``predicted``: the model's predictions of ``x``, ``proba`` a classifier's probabilities, if the caller has
    them already (asked of the model otherwise)."""
    model, rows = context.model, len(x)
    if context.classifier:
        k = context.spec.n_classes
        labels = np.asarray(y).reshape(rows).astype(np.int64)
        predicted = np.asarray(model.predict(params, x) if predicted is None else predicted)
        predicted = predicted.reshape(rows).astype(np.int64)
        log_loss = np.nan
        if proba is not None or hasattr(model, "predict_proba"):
            proba = np.asarray(model.predict_proba(params, x) if proba is None else proba,
                               dtype=np.float64).reshape(rows, k)
            log_loss = -np.log(np.clip(proba[np.arange(rows), labels], PROBABILITY_FLOOR, 1.0)).sum()
        hits = labels[predicted == labels]
        return np.concatenate([[rows, log_loss, len(hits)], np.bincount(hits, minlength=k)[:k],
                               np.bincount(predicted, minlength=k)[:k], np.bincount(labels, minlength=k)[:k]])
    targets = np.asarray(y, dtype=np.float64).reshape(rows, -1)
    error = np.asarray(model.predict(params, x) if predicted is None else predicted,
                       dtype=np.float64).reshape(rows, -1) - targets
    mean = targets.mean(axis=0) if rows else np.zeros(targets.shape[1])
    return np.concatenate([[rows, np.abs(error).sum()], mean, ((targets - mean) ** 2).sum(axis=0),
                           (error ** 2).sum(axis=0)])


def write_task_statistics(exchange: Path, version: int, task: int, attempt: int, context: ModelContext,
                          params: dict[str, np.ndarray], x: np.ndarray, y: Any, *, predicted: Any = None,
                          proba: np.ndarray | None = None) -> None:
    """In a worker: the statistics of one evaluation task, to its exchange file."""
    stats = task_statistics(context, params, x, y, predicted=predicted, proba=proba)
    with writing_npy(METRICS.path(exchange, version, task, attempt), stats.shape, np.float64,
                     durable=False) as out:
        out[:] = stats


def collect(exchange: Path, version: int, results: list[Any], context: ModelContext,
            kept: dict[tuple[int, int, int], np.ndarray] | None = None) -> dict[str, float]:
    """In the server: the tasks' statistics added in task order (files removed), as ``val_`` metrics.

    ``kept``: statistics of tasks the server ran itself, by (version, task, attempt), taken from there.
    """
    vectors = []
    for result in results:
        vector = kept.pop((version, result.task, result.attempt), None) if kept is not None else None
        if vector is None:
            path = METRICS.path(exchange, version, result.task, result.attempt)
            vector = np.array(open_npy(path, shape=(statistics_size(context),), dtype=np.float64))
            discard([path])
        vectors.append(vector)
    return {f"val_{name}": value for name, value in combine(vectors, context).items()}


def combine(vectors: list[np.ndarray], context: ModelContext) -> dict[str, float]:
    """Metrics from the statistics of one or more tasks (in the order given)."""
    if context.classifier:
        return _classification(np.sum(vectors, axis=0), context.spec.n_classes)
    return _regression(vectors, context.spec.n_targets)


def _classification(total: np.ndarray, k: int) -> dict[str, float]:
    rows, log_loss, correct = total[:3]
    tp, predicted, actual = total[3:3 + k], total[3 + k:3 + 2 * k], total[3 + 2 * k:]
    present = (predicted + actual) > 0
    f1 = 2 * tp[present] / (predicted[present] + actual[present])
    metrics = {"accuracy": correct / rows, "macro_f1": float(f1.mean()) if f1.size else 0.0}
    if np.isfinite(log_loss):
        metrics["log_loss"] = log_loss / rows
    return {key: float(value) for key, value in metrics.items()}


def _regression(vectors: list[np.ndarray], t: int) -> dict[str, float]:
    rows, mean, m2, abs_sum, sse = 0.0, np.zeros(t), np.zeros(t), 0.0, np.zeros(t)
    for vector in vectors:  # Chan et al.'s pairwise update: exact moments without a second pass
        n, part_mean, part_m2 = vector[0], vector[2:2 + t], vector[2 + t:2 + 2 * t]
        if n == 0:
            continue
        delta = part_mean - mean
        mean = mean + delta * n / (rows + n)
        m2 = m2 + part_m2 + delta ** 2 * rows * n / (rows + n)
        rows += n
        abs_sum += vector[1]
        sse += vector[2 + 2 * t:]
    r2 = np.where(m2 > 0, 1 - sse / np.where(m2 > 0, m2, 1), np.where(sse == 0, 1.0, 0.0))
    return {"r2": float(r2.mean()), "mae": float(abs_sum / (rows * t)), "rmse": float(np.sqrt(sse.sum() / (rows * t)))}
