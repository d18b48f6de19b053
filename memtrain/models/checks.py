"""Model options and DataSpec -> InputError naming the option, what was expected and what was found."""

from __future__ import annotations

import math
from numbers import Real

from memtrain.errors import InputError
from memtrain.models.protocol import DataSpec

CLASSIFICATION = "classification"
REGRESSION = "regression"


def require_task(kind: str, spec: DataSpec, task: str, hint: str) -> None:
    """Reject data of the wrong task, e.g. softmax on regression targets."""
    if spec.task != task:
        raise InputError(f"model '{kind}' needs {task} data", expected=f"task {task!r}", found=f"task {spec.task!r}",
                         hint=hint)


def require_classes(kind: str, spec: DataSpec) -> None:
    if spec.task == CLASSIFICATION and spec.n_classes < 2:
        raise InputError(f"model '{kind}' needs at least 2 classes", expected=">= 2 classes",
                         found=f"{spec.n_classes} classes")


def check_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InputError(f"bad value for {key}", expected=" or ".join(repr(c) for c in choices), found=repr(value))


def check_nonnegative(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise InputError(f"bad value for {key}", expected="a number >= 0", found=repr(value))


def check_sizes(key: str, value: object) -> None:
    """A non-empty tuple of positive integers (layer widths)."""
    ok = isinstance(value, tuple) and len(value) > 0
    ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    if not ok:
        found = list(value) if isinstance(value, tuple) else value
        raise InputError(f"bad value for {key}", expected="a non-empty list of positive integers", found=repr(found))


def output_width(spec: DataSpec) -> int:
    """Width of the model output: one score per class, or one value per regression target."""
    return spec.n_classes if spec.task == CLASSIFICATION else spec.n_targets
