"""A task's rows at a weight version -> its loss and gradient: the one gradient function of every engine.

The rounds (train/loops/rounds.py), the desk (train/loops/desk.py), a streamed task (train/loops/stream.py)
and the server computing by itself all call ``TaskGradient``. It owns what a task's computation carries besides the
model's arithmetic:

- the **seeded randomness**: a model with ``seeded = True`` (dropout in a torch module) draws from
  (the job's seed, the version, the task number) alone, so a task is pure and a re-run gives its bits;
- the **fault point** ``before_grad_write`` (memtrain/faults.py): a death before the gradient is written;
- the **compute time** (the logbook's per-task seconds) and the **straggler** test hook, which makes this
  process's gradients that many times slower (faults.straggler_factor);
- the **read audit** test hook (faults.read_audit_path): the version's bytes hashed before and after the
  computation, so a test sees that no weights changed under a reader.

The fault point after the write stays with each caller: where the gradient is "written" (a buffer, a
record, a renamed file) is the caller's to say. The hooks are read once, when the function is made (a
worker's environment does not change), so a task pays no look-up for them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.faults import fault_point, read_audit_path
from memtrain.files import append_jsonl
from memtrain.train.exchange.weights import array_checksum
from memtrain.train.timing import UNTIMED, Timer, timed


class TaskGradient:
    """``model``'s gradient of a task, with the task's seeds, fault point, timing and test hooks.

    >>> gradient = TaskGradient(model, seed=7)                                       # doctest: +SKIP
    >>> loss, seconds = gradient(weights, views(weights), x, y, views(out), version=3, task=1)  # doctest: +SKIP
    """

    __slots__ = ("model", "loss_and_grad", "seed", "seeded", "straggler", "audit")

    def __init__(self, model: Any, *, seed: int, straggler: float = 1.0, audit: str | None = None,
                 timer: Timer = UNTIMED):
        self.model, self.seed, self.straggler = model, seed, straggler
        # the model's (none for an additive model, which has no gradient), or its timed section
        loss_and_grad = getattr(model, "loss_and_grad", None)
        self.loss_and_grad = loss_and_grad and timed(timer, "model", loss_and_grad)
        self.seeded = bool(getattr(model, "seeded", False))
        self.audit = audit if audit is not None else read_audit_path()

    def seeds(self, version: int, task: int) -> dict[str, tuple[int, int, int]]:
        """The keyword a seeded model gets for ``task`` at ``version`` (none for a model without randomness)."""
        return {"seed": (self.seed, version, task)} if self.seeded else {}

    def __call__(self, weights: np.ndarray, weight_views: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                 out_views: dict[str, np.ndarray], *, version: int, task: int) -> tuple[float, float]:
        """The gradient of rows ``x``, ``y`` at ``weights`` (version ``version``, viewed as ``weight_views``) into
        ``out_views`` (every value overwritten); returns the summed loss and the compute seconds."""
        before = array_checksum(weights) if self.audit else ""
        fault_point("before_grad_write")
        started = time.perf_counter()
        if self.seeded:
            loss = self.loss_and_grad(weight_views, x, y, out_views, seed=(self.seed, version, task))
        else:
            loss = self.loss_and_grad(weight_views, x, y, out_views)
        if self.straggler > 1:
            time.sleep((self.straggler - 1) * (time.perf_counter() - started))
        seconds = time.perf_counter() - started
        if self.audit:
            append_jsonl(Path(self.audit), {"version": version, "before": before, "after": array_checksum(weights)})
        return float(loss), seconds
