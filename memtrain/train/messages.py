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
    seed: int = 0  # train.seed: a seeded model's randomness is drawn from (seed, version, task)


@dataclass(frozen=True, slots=True)
class StepTask:
    """Reduce the gradient files ``grads`` over parameters [lo, hi), apply the optimizer, write ``out``.

    ``out`` is the unpublished next weight file (each slice owner writes only its slice). The optimizer
    state is read from buffer ``parity`` and written to the other one, so re-running a step is harmless.
    When done, the owner marks slice ``task`` with ``seq`` (train/marks.py).
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
    seq: int


@dataclass(frozen=True, slots=True)
class Building:
    """The weights a fused round's gradient tasks compute at: being written by this round's slice owners."""

    path: str  # the unpublished weight file
    seq: int  # the step's sequence number; every slice owner marks it when its slice is written
    slices: int
    wait_limit: float  # seconds to wait for a peer's slice before handing the task back to the server


@dataclass(frozen=True, slots=True)
class GradTask:
    """Loss and summed gradient of train rows [lo, hi) at weight ``version``.

    Written to the exchange file ``layout.gradient_name(version, task, attempt)``: every attempt its own file.
    In a fused round (``building`` set) ``version`` is not published yet: the task first does its ``slice``
    of the step that makes it (if it owns one), waits until every slice is written, then computes at
    ``building.path``. One dispatch round per update instead of two.
    """

    task: int
    attempt: int
    version: int
    lo: int
    hi: int
    slice: StepTask | None = None
    building: Building | None = None


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
    step_finite: bool = True  # the task's step slice (step task, or fused round) came out finite
    new_version_void: bool = False  # a slice of the version it was to compute at was not finite: nothing computed
    peer_wait_expired: bool = False  # a peer's slice did not land in time: nothing computed, send it again
