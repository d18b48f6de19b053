"""``model.loss`` + DataSpec -> per-row loss function and target tensors; the dry run's shape checks.

Built in: ``cross_entropy`` (classification default: torch.nn.functional.cross_entropy on raw scores,
targets are class indices) and ``mse`` (regression default: squared error per target column, no 1/2,
targets float32 rows x K). A custom ``"module:fn"`` is called as ``fn(output, target)`` and returns one
loss per row (first dimension = rows); memtrain sums them, as it sums every loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from memtrain.errors import InputError, MemtrainError
from memtrain.models.checks import CLASSIFICATION, output_width
from memtrain.models.losses import class_indices, regression_targets
from memtrain.models.protocol import DataSpec
from memtrain.models.registry import import_object

BUILTIN_LOSSES = ("cross_entropy", "mse")


@dataclass(frozen=True)
class Loss:
    name: str
    per_row: Callable[[Any, Any], Any]  # (output, target) -> losses, first dimension = rows
    builtin: bool

    def total(self, output: Any, target: Any) -> Any:
        return self.per_row(output, target).sum()


def _cross_entropy(output: Any, target: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(output, target, reduction="none")


def _mse(output: Any, target: Any) -> Any:
    import torch.nn.functional as F

    return F.mse_loss(output, target, reduction="none")


def resolve_loss(name: str | None, spec: DataSpec) -> Loss:
    classifier = spec.task == CLASSIFICATION
    name = name if name is not None else ("cross_entropy" if classifier else "mse")
    if not isinstance(name, str):
        raise InputError("wrong type for model.loss", expected="a string", found=repr(name))
    if name == "cross_entropy":
        if not classifier:
            raise InputError("model.loss 'cross_entropy' needs classification data", expected="task 'classification'",
                             found=f"task {spec.task!r}",
                             hint="use loss = \"mse\" (the regression default) or a 'module:fn'")
        return Loss(name, _cross_entropy, True)
    if name == "mse":
        return Loss(name, _mse, True)
    if ":" not in name:
        raise InputError("unknown model.loss", expected=f"{' or '.join(BUILTIN_LOSSES)}, or 'module:fn'",
                         found=repr(name))
    fn = import_object(name, "loss function")
    if not callable(fn):
        raise InputError(f"loss {name!r} is not callable", expected="fn(output, target) -> per-row losses",
                         found=type(fn).__name__)
    return Loss(name, fn, False)


def targets(y: np.ndarray, spec: DataSpec) -> Any:
    """Class indices (int64, [n]) or float32 targets [n, K], as tensors."""
    import torch

    if spec.task == CLASSIFICATION:  # copies: y may be a read-only map
        return torch.from_numpy(np.array(class_indices(y, spec.n_classes), dtype=np.int64))
    return torch.from_numpy(np.array(regression_targets(y, spec.n_targets), dtype=np.float32))


def check_output(factory: str, loss: Loss, spec: DataSpec, rows: int, output: Any, target: Any) -> None:
    """The module's output fits the loss and the targets (dry run); InputError naming the shapes if not."""
    import torch

    if not isinstance(output, torch.Tensor):
        raise InputError(f"model factory {factory!r}: the module must return one tensor of scores",
                         expected="a torch.Tensor", found=type(output).__name__)
    if loss.builtin:
        expected = (rows, output_width(spec))
        if tuple(output.shape) != expected:
            what = f"{spec.n_classes} class scores" if spec.task == CLASSIFICATION else \
                f"{spec.n_targets} target value(s)"
            raise InputError(f"model factory {factory!r}: the module's output does not fit loss {loss.name!r}",
                             expected=f"output shape {list(expected)} ({rows} rows x {what})",
                             found=f"output shape {list(output.shape)} for input shape "
                                   f"{[rows, *spec.feature_shape]}, target shape {list(target.shape)}")
        return
    losses = _call_loss(factory, loss, output, target)
    if not isinstance(losses, torch.Tensor) or losses.dim() == 0 or losses.shape[0] != rows:
        found = f"shape {list(losses.shape)}" if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise InputError(f"loss {loss.name!r} must return one loss per row", expected=f"a tensor of shape [{rows}]",
                         found=f"{found} for output shape {list(output.shape)}, target shape {list(target.shape)}")


def _call_loss(factory: str, loss: Loss, output: Any, target: Any) -> Any:
    try:
        return loss.per_row(output, target)
    except MemtrainError:
        raise
    except BaseException as exc:  # noqa: BLE001 - the user's loss on the dry run's rows: may raise anything
        raise InputError(f"loss {loss.name!r} of model factory {factory!r} raised {type(exc).__name__}: {exc}",
                         expected="fn(output, target) -> one loss per row",
                         found=f"output shape {list(output.shape)}, target shape {list(target.shape)} "
                               f"({target.dtype})") from exc
