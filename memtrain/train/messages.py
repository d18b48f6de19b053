"""The small records that cross the queues: file names and integers only, never arrays.

A test pickles each of them and checks that it stays a few hundred bytes whatever the model and data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerSetup:
    """Sent once, when a worker process starts."""

    server_pid: int
    run_dir: str
    exchange_dir: str
    dataset: str
    normalize: bool
    model_kind: str
    model_options: tuple[tuple[str, object], ...]
    blas_threads: int
    optimizer: tuple[tuple[str, object], ...]  # OptimizerConfig fields
    slot: int


@dataclass(frozen=True, slots=True)
class GradTask:
    """Loss and summed gradient of train rows [lo, hi) at weight ``version``.

    Written to the exchange file ``layout.gradient_name(version, task, attempt)``: every attempt its own file.
    """

    task: int
    attempt: int
    version: int
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class StatsTask:
    """Sufficient statistics of train rows [lo, hi) (additive models), to ``gradient_name(0, task, attempt)``."""

    task: int
    attempt: int
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class EvalTask:
    """Loss sum and correct count of validation rows [lo, hi) at weight ``version``."""

    task: int
    attempt: int
    version: int
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class StepTask:
    """Reduce the gradient files ``grads`` over parameters [lo, hi), apply the optimizer, write ``out``.

    ``out`` is the unpublished next weight file (each slice owner writes only its slice). The optimizer
    state is read from buffer ``parity`` and written to the other one, so re-running a step is harmless.
    """

    task: int
    attempt: int
    version: int
    step: int
    lr: float
    rows: int
    parity: int
    lo: int
    hi: int
    grads: tuple[str, ...]
    out: str


@dataclass(frozen=True, slots=True)
class Stop:
    """Tell a worker to exit."""


Task = GradTask | StatsTask | EvalTask | StepTask


@dataclass(frozen=True, slots=True)
class Result:
    task: int
    attempt: int
    loss: float = 0.0
    rows: int = 0
    correct: int = 0
    finite: bool = True
    error: str | None = None
    seconds: float = 0.0  # time the worker spent computing (gradient tasks): what the benchmark subtracts
