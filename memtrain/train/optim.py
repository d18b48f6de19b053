"""Mean gradient + weights + optimizer state (one slice) -> new weights + new state; and the learning rate.

Every update here is elementwise: element i of the output depends only on element i of the inputs and
on scalars. So applying it to the whole flat vector at once, or slice by slice in any split, gives
bitwise identical results -- which is what lets several processes each step their own slice of the
parameters. Nothing here may reduce over elements (no global norms, no gradient clipping by norm).

All array arithmetic is float32. Python scalars (lr, bias corrections) are computed in float64 and
cast to ``np.float32`` once, so results do not depend on numpy's scalar promotion rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memtrain.config import OPTIMIZER_NAMES, OptimizerConfig
from memtrain.errors import InputError

F32 = np.float32


def state_names(config: OptimizerConfig) -> tuple[str, ...]:
    """Names of the per-parameter state vectors (each as long as the weights, initially zeros)."""
    return optimizer_entry(config).state(config)


def optimizer_entry(config: OptimizerConfig) -> Optimizer:
    """The table's entry for ``config.name``; an unknown name is an error, never another optimizer."""
    entry = OPTIMIZERS.get(config.name)
    if entry is None:
        raise InputError("bad value for train.optimizer", expected=" or ".join(repr(c) for c in OPTIMIZERS),
                         found=repr(config.name))
    return entry


def learning_rate(config: OptimizerConfig, update: int, total_updates: int) -> float:
    """The learning rate of update ``update`` (0-based) of a run of ``total_updates`` updates.

    Warmup first: update u < warmup_updates gets lr * (u + 1) / warmup_updates. After it the schedule
    counts t = u - warmup_updates over T = total_updates - warmup_updates updates:
    constant: lr; step: lr * step_gamma ** (t // step_every);
    cosine: min_lr + (lr - min_lr) * (1 + cos(pi * t / T)) / 2 (lr at t = 0, min_lr at t = T).

    >>> learning_rate(OptimizerConfig(lr=1.0, warmup_updates=4), 0, 10)
    0.25
    """
    if update < config.warmup_updates:
        return config.lr * (update + 1) / config.warmup_updates
    t = update - config.warmup_updates
    if config.schedule == "step":
        return config.lr * config.step_gamma ** (t // config.step_every)
    if config.schedule == "cosine":
        progress = min(1.0, t / max(1, total_updates - config.warmup_updates))
        return config.min_lr + (config.lr - config.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.lr


def apply_update(config: OptimizerConfig, step: int, lr: float, weights: np.ndarray, grad: np.ndarray,
                 state_in: dict[str, np.ndarray], weights_out: np.ndarray, state_out: dict[str, np.ndarray], *,
                 scratch: np.ndarray | None = None) -> None:
    """One optimizer step on one slice; write ``weights_out`` and ``state_out``, never touch the inputs.

    The outputs must not overlap the inputs (the caller double-buffers, so a re-run step is idempotent).

    ``step`` is the 1-based number of this update (Adam's bias correction); ``grad`` is the mean
    gradient. The formulas are those documented for PyTorch's SGD (dampening 0), Adam and AdamW.
    ``scratch``: a float32 array as long as the slice for the temporary (Adam's, weight decay's, Nesterov's),
    so that a step allocates nothing; one is made when None. The arithmetic is the same either way.
    """
    entry = OPTIMIZERS.get(config.name)  # looked up here, not through optimizer_entry: once per chunk of a step
    if entry is None:
        optimizer_entry(config)  # raises: an unknown name is refused, never run as another optimizer
    entry.step(config, step, lr, weights, grad, state_in, weights_out, state_out, scratch)


def _with_l2(weight_decay: float, weights: np.ndarray, grad: np.ndarray, scratch: np.ndarray | None) -> np.ndarray:
    """grad + weight_decay * weights, into ``scratch`` (a new array when None); grad itself when there is no decay."""
    if weight_decay == 0:
        return grad
    g = np.multiply(weights, F32(weight_decay), dtype=F32, out=scratch)
    np.add(g, grad, out=g)
    return g


def _sgd(config: OptimizerConfig, step: int, lr: float, weights: np.ndarray, grad: np.ndarray,
         state_in: dict[str, np.ndarray], weights_out: np.ndarray, state_out: dict[str, np.ndarray],
         scratch: np.ndarray | None) -> None:
    """buf = momentum * buf + g; direction = g + momentum * buf (nesterov) or buf; w -= lr * direction."""
    g = _with_l2(config.weight_decay, weights, grad, scratch)
    direction = g
    if config.momentum > 0:
        buf = state_out["m"]
        np.multiply(state_in["m"], F32(config.momentum), out=buf)
        np.add(buf, g, out=buf)
        direction = buf
        if config.nesterov:  # g is only read from here on, so the temporary may overwrite it when it is scratch
            direction = np.multiply(buf, F32(config.momentum), dtype=F32,
                                    out=None if scratch is None or g is scratch else scratch)
            np.add(direction, g, out=direction)
    np.multiply(direction, F32(lr), out=weights_out)
    np.subtract(weights, weights_out, out=weights_out)


def _adam(config: OptimizerConfig, step: int, lr: float, weights: np.ndarray, grad: np.ndarray,
          state_in: dict[str, np.ndarray], weights_out: np.ndarray, state_out: dict[str, np.ndarray],
          temporary: np.ndarray | None) -> None:
    """m, v moments; w -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps). AdamW first scales w by 1 - lr * wd."""
    decoupled = config.name == "adamw"
    m, v = state_out["m"], state_out["v"]
    # with L2 decay, g = grad + wd * w is held in weights_out, which is read-free until its own write at the end
    g = grad if decoupled else _with_l2(config.weight_decay, weights, grad, weights_out)
    scratch = np.multiply(g, F32(1.0 - config.beta1), dtype=F32, out=temporary)
    np.multiply(state_in["m"], F32(config.beta1), out=m)
    np.add(m, scratch, out=m)
    np.multiply(g, g, out=scratch)
    np.multiply(scratch, F32(1.0 - config.beta2), out=scratch)
    np.multiply(state_in["v"], F32(config.beta2), out=v)
    np.add(v, scratch, out=v)
    # denominator sqrt(v) / sqrt(1 - beta2^t) + eps, then the step lr / (1 - beta1^t) * m / denominator
    np.sqrt(v, out=scratch)
    np.multiply(scratch, F32(1.0 / math.sqrt(1.0 - config.beta2 ** step)), out=scratch)
    np.add(scratch, F32(config.eps), out=scratch)
    np.divide(m, scratch, out=scratch)
    np.multiply(scratch, F32(lr / (1.0 - config.beta1 ** step)), out=scratch)
    if decoupled and config.weight_decay != 0:
        np.multiply(weights, F32(1.0 - lr * config.weight_decay), out=weights_out)
        np.subtract(weights_out, scratch, out=weights_out)
    else:
        np.subtract(weights, scratch, out=weights_out)


@dataclass(frozen=True, slots=True, kw_only=True)
class Optimizer:
    """One optimizer of the table: the state vectors it keeps, and its step on one slice (``apply_update``'s
    arguments, ``scratch`` last)."""

    state: Callable[[OptimizerConfig], tuple[str, ...]]  # the names of its state vectors
    step: Callable[..., None]


# Every optimizer, by its job name (train.optimizer): adding one is one entry here. ``apply_update`` and
# ``state_names`` look the name up; a name that is not here is refused, never run as another optimizer.
OPTIMIZERS: dict[str, Optimizer] = {
    "sgd": Optimizer(state=lambda config: ("m",) if config.momentum > 0 else (), step=_sgd),
    "adam": Optimizer(state=lambda config: ("m", "v"), step=_adam),
    "adamw": Optimizer(state=lambda config: ("m", "v"), step=_adam),
}
assert tuple(OPTIMIZERS) == OPTIMIZER_NAMES, "config.OPTIMIZER_NAMES names this table's optimizers"
