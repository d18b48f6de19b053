"""The model protocol: what a worker needs from a model, and what a user model must implement.

A model is built once per process from its options and a ``DataSpec``. Parameters are named float32
arrays (see ``params.ParamLayout``); the flat vector is what weight files hold.

Gradient models (``additive = False``) implement ``loss_and_grad``: the SUM over the given rows of the
per-row loss, with the SUM of per-row gradients written into ``grads``. Sums, not means, so that the
server can add task results in a fixed order and divide once by the row count of the update.

Additive models (``additive = True``) implement ``statistic_shapes``, one of two statistics methods (sums
of sufficient statistics over rows, e.g. X^T X for least squares) and ``solve`` (statistics -> parameters):
one pass over the data. memtrain zeroes a task's partial, a file it maps, and passes views of it as ``out``:

- ``add_statistics(x, y, out)`` (the adding contract, the built-in models'): ADDS the sums of the rows it is
  given into ``out``, never overwrites; called once per chunk of ``train.chunk_rows`` rows, so neither the
  task's rows nor a second copy of the statistics is ever in memory.
- ``statistics(x, y, out)`` (the whole-rows contract, for models written before chunks): the statistics of
  the rows it is given into ``out`` (it may overwrite); called once per task with the task's whole rows, as
  it always was, so the task's rows are in memory at once (fewer rows per task: ``train.tasks_per_update``).

A class defining both is called by the one defined lower in its class hierarchy (``add_statistics`` if one
class defines both): a subclass of a built-in model that overrides ``statistics`` gets the whole-rows
contract (train/loops/additive.py, ``statistics_contract``).
``solve`` gets read-only views of the mapped sum; it may return arrays of any float dtype, which memtrain
writes into the weight file one parameter at a time.

Optional, for models that need them (a torch module uses all four; see models/torch_model.py):

- ``buffer_shapes()``: state that is not trained (running statistics). It follows the parameters in the
  flat vector; ``loss_and_grad`` writes, for each buffer, (updated value - given value) * rows into
  ``grads``, and the step adds the mean of those over the update's tasks (the row-weighted mean of each
  task's updated buffer), in task order.
- ``seeded = True``: ``loss_and_grad`` takes a keyword ``seed=(train.seed, version, task)`` and draws
  every random number (dropout) from it alone, so results never depend on the worker count.
- ``thread_safe = True``: ``loss_and_grad`` may run in several threads at once (it keeps no state between
  calls and writes only the ``grads`` it is given), so the server running the rounds itself may compute an
  update's tasks on its task threads (train/loops/threads.py, ``train.server_threads``). The numpy models say so.
- ``in_worker(threads)``: called once in each worker process before its first task (pin thread pools).
- ``startup(x, y, threads)``: run by the server on two training rows before any worker starts; raises
  ``InputError`` for a model that cannot train on this data, returns a line for the run's event log.
- ``evaluate(params, x, y)``: an ``Evaluation`` -- what ``loss``, ``predict`` and ``predict_proba`` give
  for the same rows, bitwise, from one pass of the model over them. An evaluation task needs all three
  (train/worker/worker.py); without it, each is asked for and the model runs over the rows three times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from memtrain.errors import did_you_mean


@dataclass(frozen=True)
class DataSpec:
    """What a model may know about the data: feature count, task, classes or target width."""

    n_features: int
    task: str  # "classification" | "regression"
    n_classes: int = 0  # classification only
    n_targets: int = 1  # regression: 1 for a scalar target, K for a vector target
    target_shape: tuple[int, ...] = ()  # shape of one y row as stored in the dataset
    feature_shape: tuple[int, ...] = ()  # shape of one x row as stored in the dataset (() when unknown)


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """One pass of a model over evaluation rows: the summed loss, the predictions (None: not made), and (a
    classifier with ``predict_proba``) the class probabilities, else None."""

    loss: float
    predicted: np.ndarray | None
    proba: np.ndarray | None


@runtime_checkable
class Model(Protocol):
    additive: ClassVar[bool]

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Ordered names and shapes of the parameters."""

    def init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Initial parameters (float32), drawn from ``rng`` only, so a seed fixes them."""

    def loss(self, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
        """Summed loss over rows (evaluation)."""

    def predict(self, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        """Class indices (classification) or target values (regression)."""


@runtime_checkable
class GradientModel(Model, Protocol):
    def loss_and_grad(self, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                      grads: dict[str, np.ndarray]) -> float:
        """Return the summed loss; write the summed gradient into ``grads`` (overwrite, do not add)."""


@runtime_checkable
class AdditiveModel(Model, Protocol):
    def statistic_shapes(self) -> dict[str, tuple[int, ...]]:
        """Ordered names and shapes of the sufficient statistics (float64)."""

    def add_statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Add the statistics of these rows into ``out`` (never overwrite: called once per chunk of rows).
        (Or, instead, ``statistics(x, y, out)``: called once per task with its whole rows, ``out`` zeroed.)"""

    def solve(self, stats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Parameters from the statistics summed over all training rows."""


def build_options_error(kind: str, key: str, allowed: Any) -> str:
    guess = did_you_mean(key, allowed)
    return (f"model '{kind}' has no option '{key}' (options: {', '.join(sorted(allowed)) or 'none'})"
            + (f". {guess}" if guess else ""))
