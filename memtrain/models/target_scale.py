"""A regression target's training-split mean and std -> the model trained on ``(y - mean) / std``.

Features are standardized (``data.normalize``); a target of natural scale (a price of about 3,900) is not, so
a gradient model has to move its output bias and weights thousands of units in steps of about ``lr``: 20
epochs of Adam at lr 0.003 left a linear model at validation R² -0.91 where ridge reached 0.91. Trained on
the standardized target, the model's parameters live where its initialization and ``lr`` are meant for.

``ScaledTarget`` wraps such a model: its gradient is the wrapped model's at the standardized target (the
loss it returns, and so the run's training loss, is in the target's units); ``loss`` and ``predict`` are in
the target's units, so every metric, ``load_model``'s predictions and the server stay in them, and
``unscaled`` folds the scale into the output layer for ``inspect --export``. The scale is computed once from
the training split (float64 sums in shard order: the same bits in every process), recorded in each
checkpoint's ``data`` entry (``target_scale``), and read from there by ``load_model``.

Only the built-in squared-error models are wrapped (``SCALED_KINDS``): ridge (and naive Bayes) solve exactly
and are unchanged; a torch or user model's loss is its own, so its target is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from memtrain.errors import CorruptFileError

SCALED_KINDS = {"linear": ("W", "b"), "mlp": None}  # kind -> its output layer's (weights, bias); mlp: the last
CHUNK_ROWS = 1 << 20  # targets read per step while the training split's statistics are summed
# what a wrapped model may have that would answer in the standardized units: never passed through
NOT_FORWARDED = frozenset({"evaluate", "predict_proba", "statistics", "solve"})


@dataclass(frozen=True)
class TargetScale:
    """Per-target mean and std (float64 lists of the flattened target's width); a std of 0 counts as 1."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of_split(cls, split: Any, width: int) -> TargetScale:
        """The training split's targets' mean and std, streamed in chunks in row order."""
        total, squares, rows = np.zeros(width), np.zeros(width), 0
        for lo in range(0, split.rows, CHUNK_ROWS):
            y = np.asarray(split.read(lo, min(lo + CHUNK_ROWS, split.rows))[1], dtype=np.float64).reshape(-1, width)
            total += y.sum(axis=0)
            rows += len(y)
        mean = total / max(rows, 1)
        for lo in range(0, split.rows, CHUNK_ROWS):  # a second pass: no cancellation at a large mean
            y = np.asarray(split.read(lo, min(lo + CHUNK_ROWS, split.rows))[1], dtype=np.float64).reshape(-1, width)
            squares += ((y - mean) ** 2).sum(axis=0)
        std = np.sqrt(squares / max(rows, 1))
        return cls(tuple(map(float, mean)), tuple(float(s) if s > 0 else 1.0 for s in std))

    def to_json(self) -> dict[str, list[float]]:
        return {"mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_json(cls, value: Any, where: Any = "checkpoint metadata") -> TargetScale | None:
        """None for a run that trained on the raw target (no ``target_scale``); an error for a mangled one."""
        if value is None:
            return None
        ok = (isinstance(value, dict) and all(isinstance(value.get(k), list) for k in ("mean", "std"))
              and len(value["mean"]) == len(value["std"]) > 0
              and all(isinstance(v, int | float) and np.isfinite(v) for v in value["mean"] + value["std"])
              and all(v > 0 for v in value["std"]))
        if not ok:
            raise CorruptFileError("the target scale is mangled", path=where, where="data.target_scale",
                                   expected='{"mean": [numbers], "std": [positive numbers]} of one length',
                                   found=repr(value)[:80])
        return cls(tuple(map(float, value["mean"])), tuple(map(float, value["std"])))


def scalable(kind: str, task: str) -> bool:
    """Whether ``data.scale_target`` applies: a regression target and a built-in squared-error model."""
    return task == "regression" and kind in SCALED_KINDS


class ScaledTarget:
    """A squared-error regression model trained on the standardized target, speaking the target's units."""

    def __init__(self, model: Any, scale: TargetScale, kind: str) -> None:
        self.inner, self.scale, self.kind = model, scale, kind
        self._mean = np.asarray(scale.mean, dtype=np.float32)
        self._std = np.asarray(scale.std, dtype=np.float32)
        self._std2 = float(scale.std[0]) ** 2 if len(scale.std) == 1 else None

    def __getattr__(self, name: str) -> Any:  # parameter_shapes, init, spec, thread_safe, ...: the model's own
        if name in NOT_FORWARDED:
            raise AttributeError(name)
        return getattr(self.inner, name)

    def standardized(self, y: np.ndarray) -> np.ndarray:
        rows = np.asarray(y, dtype=np.float32).reshape(len(y), -1)
        return (rows - self._mean) / self._std

    def loss_and_grad(self, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                      grads: dict[str, np.ndarray]) -> float:
        """The gradient at the standardized target; the loss in the target's units (exact for one target:
        a squared error scales by std²; several targets' are computed from the predictions)."""
        loss = self.inner.loss_and_grad(params, x, self.standardized(y), grads)
        return loss * self._std2 if self._std2 is not None else self.loss(params, x, y)

    def loss(self, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
        """Half the summed squared error in the target's units, as the wrapped model defines its loss."""
        if self._std2 is not None:
            return float(self.inner.loss(params, x, self.standardized(y))) * self._std2
        error = np.asarray(self.predict(params, x), dtype=np.float64).reshape(len(x), -1) \
            - np.asarray(y, dtype=np.float64).reshape(len(x), -1)
        return float(0.5 * (error ** 2).sum())

    def predict(self, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        out = np.asarray(self.inner.predict(params, x), dtype=np.float32)
        shape = out.shape
        return (out.reshape(len(out), -1) * self._std + self._mean).reshape(shape)


def unscaled(kind: str, params: dict[str, Any], scale: TargetScale) -> dict[str, Any]:
    """The parameters with the scale folded into the output layer: the model with these predicts in the
    target's units (``inspect --export``); the other arrays are passed through as they are."""
    weights, bias = SCALED_KINDS[kind] or _last_layer(params)
    std, mean = np.asarray(scale.std, dtype=np.float32), np.asarray(scale.mean, dtype=np.float32)
    return params | {weights: np.asarray(params[weights], dtype=np.float32) * std,
                     bias: np.asarray(params[bias], dtype=np.float32) * std + mean}


def _last_layer(params: dict[str, np.ndarray]) -> tuple[str, str]:
    """An MLP's output layer: its highest-numbered ``W<n>``, ``b<n>``."""
    last = max(int(name[1:]) for name in params if name.startswith("W") and name[1:].isdigit())
    return f"W{last}", f"b{last}"
