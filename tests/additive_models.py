"""Additive test models: one counts the chunks memtrain hands it, one is killed as the OOM killer would kill it,
one solves into Inf, and a bigram count model written to the whole-rows contract (it overwrites ``out``)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from memtrain.models.protocol import DataSpec
from memtrain.models.ridge import Ridge
from memtrain.train.memory import OOM_EVENTS_ENV

Params = dict[str, np.ndarray]


@dataclass(frozen=True)
class CountsChunks(Ridge):
    """Ridge that also counts its ``statistics`` calls and the rows of the largest one (as parameters)."""

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {**super().parameter_shapes(), "calls": (1,), "rows": (1,)}

    def statistic_shapes(self) -> dict[str, tuple[int, ...]]:
        return {**super().statistic_shapes(), "calls": (1,), "rows": (1,)}

    def init(self, rng: np.random.Generator) -> Params:
        return {name: np.zeros(shape, dtype=np.float32) for name, shape in self.parameter_shapes().items()}

    def add_statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        super().add_statistics(x, y, out)
        out["calls"] += 1.0
        out["rows"] += len(x)

    def solve(self, stats: dict[str, np.ndarray]) -> Params:
        return {**super().solve(stats), "calls": np.asarray(stats["calls"]), "rows": np.asarray(stats["rows"])}


@dataclass(frozen=True)
class KilledByTheKernel(Ridge):
    """Ridge whose statistics task dies of SIGKILL, as under the kernel's out-of-memory killer: it counts the
    kill in the file that MEMTRAIN_TEST_OOM_EVENTS names (the cgroup's counter, for the test) when ``counted``."""

    counted: bool = True  # False: a SIGKILL from elsewhere (kill -9), which the OOM counter never sees

    def add_statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        counter = os.environ.get(OOM_EVENTS_ENV)
        if counter and self.counted:
            kills = int(Path(counter).read_text().split()[1])
            Path(counter).write_text(f"oom_kill {kills + 1}\n")
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class SolvesNonFinite(Ridge):
    """Ridge whose solve turns finite statistics into an infinite intercept (a model's bug, or an overflow)."""

    def solve(self, stats: dict[str, np.ndarray]) -> Params:
        params = super().solve(stats)
        return {**params, "b": np.full_like(params["b"], np.inf)}


@dataclass(frozen=True)
class BigramCounts:
    """A user's bigram model written when memtrain called ``statistics`` once per task: it OVERWRITES ``out``
    (zeroes it, then counts). Feature 0 is the previous symbol, the class the next one; log-probabilities with
    add-one smoothing."""

    spec: DataSpec
    additive: ClassVar[bool] = True

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"logp": (self.spec.n_classes, self.spec.n_classes)}

    def statistic_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"counts": (self.spec.n_classes, self.spec.n_classes)}

    def init(self, rng: np.random.Generator) -> Params:
        return {"logp": np.zeros(self.parameter_shapes()["logp"], dtype=np.float32)}

    def statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        out["counts"][...] = 0.0
        np.add.at(out["counts"], (np.asarray(x)[:, 0].astype(np.int64), np.asarray(y).astype(np.int64)), 1.0)

    def solve(self, stats: dict[str, np.ndarray]) -> Params:
        counts = np.asarray(stats["counts"], dtype=np.float64)
        return {"logp": np.log((counts + 1.0) / (counts.sum(axis=1, keepdims=True) + len(counts))).astype(np.float32)}

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        rows = params["logp"][np.asarray(x)[:, 0].astype(np.int64)]
        return float(-rows[np.arange(len(rows)), np.asarray(y).astype(np.int64)].astype(np.float64).sum())

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        return np.argmax(params["logp"][np.asarray(x)[:, 0].astype(np.int64)], axis=1)


@dataclass(frozen=True)
class RidgeWholeRows(Ridge):
    """A subclass of a built-in model that overrides ``statistics`` (the whole-rows contract) and calls it."""

    def statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        super().statistics(x, y, out)
