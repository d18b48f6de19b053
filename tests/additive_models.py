"""Additive test models: one counts the chunks memtrain hands it, one is killed as the OOM killer would kill it."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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

    def statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        super().statistics(x, y, out)
        out["calls"] += 1.0
        out["rows"] += len(x)

    def solve(self, stats: dict[str, np.ndarray]) -> Params:
        return {**super().solve(stats), "calls": np.asarray(stats["calls"]), "rows": np.asarray(stats["rows"])}


@dataclass(frozen=True)
class KilledByTheKernel(Ridge):
    """Ridge whose statistics task dies of SIGKILL, as under the kernel's out-of-memory killer: it counts the
    kill in the file that MEMTRAIN_TEST_OOM_EVENTS names (the cgroup's counter, for the test) when ``counted``."""

    counted: bool = True  # False: a SIGKILL from elsewhere (kill -9), which the OOM counter never sees

    def statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
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
