"""A benchmark problem (dataset dir, MLP shape, updates, epochs, workers) -> the model every method computes with.

Every method builds its model, initial weights and optimizer here, from memtrain's own MLP and
optimizer code, so that the compute is identical and only the exchange differs; and every method
visits the batches in memtrain's order (train/plan.py: each epoch a seeded permutation of the
batches, each batch cut into ``workers`` tasks), so that the rows are the same update by update.
After every epoch every method evaluates the validation split with the epoch's weights, as memtrain's
job does (``Validation``: the summed loss, the correct predictions and the rows of a pass or a part of
one, added across the processes that evaluated a part).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from memtrain.dataset import open_dataset
from memtrain.train.context import ModelContext, model_context
from memtrain.train.optim import OptimizerConfig, apply_update
from memtrain.train.plan import epoch_updates, split_range
from memtrain.train.records.metrics import evaluation

BATCH = 512
LR = 0.01


@dataclass(frozen=True)
class Problem:
    dataset: str
    hidden: int
    updates: int  # per epoch: the dataset holds updates x batch training rows
    workers: int = 2
    epochs: int = 1
    batch: int = BATCH
    seed: int = 0
    # memtrain's train.shuffle (bench train --shuffle); the peers read contiguous batches (``batches``) either way
    shuffle: str = "batches"
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(name="sgd", lr=LR))

    def batches(self) -> list[tuple[int, int]]:
        """Rows [lo, hi) of every update of the run, in memtrain's order with ``train.shuffle = "batches"`` (its
        plan's, epoch by epoch)."""
        rows = self.updates * self.batch
        return [(update.tasks[0].lo, update.tasks[-1].hi) for epoch in range(self.epochs)
                for update in epoch_updates(rows, self.batch, self.workers, self.seed, epoch, shuffle="batches")]

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """A batch cut into one task per worker (as memtrain's plan cuts it)."""
        return split_range(lo, hi, self.workers)

    def ends_epoch(self, update: int) -> bool:
        """Whether update ``update`` (0-based, over the whole run) is the last of its epoch: the validation follows."""
        return (update + 1) % self.updates == 0


@dataclass(frozen=True, kw_only=True)
class Validation:
    """A validation pass, or one process's part of it: summed loss, correct predictions, rows (sums add up)."""

    loss: float = 0.0
    correct: int = 0
    rows: int = 0

    def __add__(self, other: Validation) -> Validation:
        return Validation(loss=self.loss + other.loss, correct=self.correct + other.correct,
                          rows=self.rows + other.rows)

    def metrics(self) -> dict[str, float]:
        """As memtrain's epoch record names them: ``val_loss`` (mean), ``val_accuracy``, and ``val_rows``."""
        rows = max(self.rows, 1)
        return {"val_loss": self.loss / rows, "val_accuracy": self.correct / rows, "val_rows": self.rows}


def validated(result: dict[str, object], passes: list[Validation], seconds: float) -> dict[str, object]:
    """A method's record with its validation: how many passes (one per epoch), the last pass's metrics as
    ``final`` (as memtrain's summary and the first job's loop report them) and the seconds the passes took."""
    final = passes[-1].metrics() if passes else {}
    return result | {"val_passes": len(passes), "final": final, "val_seconds": seconds}


class Model:
    """memtrain's MLP on the problem's dataset, and the SGD step on flat vectors."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.dataset = open_dataset(problem.dataset)
        self.context: ModelContext = model_context(self.dataset, "mlp", {"hidden": [problem.hidden]}, False)
        self.layout = self.context.layout
        self.train = self.dataset.split("train")

    @property
    def size(self) -> int:
        return self.layout.size

    def initial(self) -> np.ndarray:
        return self.layout.flatten(self.context.model.init(np.random.default_rng(self.problem.seed)))

    def rows(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        return self.train.read(lo, hi)

    def validation_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Every validation row, read once into memory (x float32, y int64)."""
        split = self.dataset.split("val")
        x, y = split.read(0, split.rows)
        return np.array(x, dtype=np.float32), np.array(y, dtype=np.int64)

    def validate(self, weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> Validation:
        """Forward only, as memtrain's evaluation task asks the model (train/records/metrics.py ``evaluation``: its
        ``loss`` and ``predict``, or one ``evaluate`` pass): the summed loss and the correct predictions."""
        seen = evaluation(self.context, self.layout.views(weights), x, y)
        return Validation(loss=float(seen.loss), correct=int(np.count_nonzero(seen.predicted == y)), rows=len(y))

    def grad(self, weights: np.ndarray, x: np.ndarray, y: np.ndarray, out: np.ndarray) -> tuple[float, float]:
        """Summed gradient of rows (x, y) into ``out``; returns (loss, compute seconds)."""
        start = time.perf_counter()
        loss = self.context.model.loss_and_grad(self.layout.views(weights), x, y, self.layout.views(out))
        return float(loss), time.perf_counter() - start

    def step(self, update: int, weights: np.ndarray, summed: np.ndarray, rows: int, out: np.ndarray) -> None:
        """out = optimizer step of ``weights`` with the mean gradient ``summed / rows`` (``summed`` is scaled)."""
        np.divide(summed, np.float32(rows), out=summed)
        apply_update(self.problem.optimizer, update + 1, self.problem.optimizer.lr, weights, summed, {}, out, {})


def timings(walls: list[float], computes: list[float], **extra: object) -> dict[str, object]:
    """The per-update record every method returns."""
    return {"update_seconds": walls, "compute_seconds": computes, **extra}
