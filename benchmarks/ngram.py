"""An order-k n-gram count model, the additive user model of docs/performance.md's large-partial run: rows of k
context symbols -> counts of the next symbol per context (float64, ``symbols**k`` x classes) -> smoothed
probabilities (float32, the same shape).

At order 4 over 64 symbols with 32 next symbols, one partial is 64**4 x 32 float64 = 4.3 GB and the solved
table 2.1 GB: the scale at which partials can no longer be pickled or held twice. Use it with
``[model] kind = "benchmarks.ngram:NgramCounts"`` and ``[data] normalize = false`` (the features are
symbol numbers). ``python -m benchmarks.ngram`` makes a dataset, trains it under a memory sampler and
checks every probability (see ``main``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from memtrain.errors import InputError
from memtrain.models.protocol import DataSpec

Params = dict[str, np.ndarray]
SOLVE_CONTEXTS = 1 << 16  # contexts solved at once: 2 MiB of float64 counts per 32 classes


@dataclass(frozen=True)
class NgramCounts:
    spec: DataSpec
    symbols: int = 64  # context symbols are 0 .. symbols - 1
    alpha: float = 1.0  # add-alpha smoothing: (count + alpha) / (total + alpha * classes)

    additive: ClassVar[bool] = True
    classifier: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.spec.task != "classification" or self.spec.n_classes < 2:
            raise InputError("model 'ngram' needs classification data (the next symbol)",
                             found=f"task {self.spec.task!r}")
        if not (isinstance(self.symbols, int) and self.symbols >= 1):
            raise InputError("bad value for model.symbols", expected="an integer >= 1", found=repr(self.symbols))
        if not self.alpha > 0:
            raise InputError("bad value for model.alpha", expected="a number > 0", found=repr(self.alpha))

    @property
    def contexts(self) -> int:
        return self.symbols ** self.spec.n_features

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"prob": (self.contexts, self.spec.n_classes)}

    def statistic_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"counts": (self.contexts, self.spec.n_classes)}

    def init(self, rng: np.random.Generator) -> Params:
        """Uniform (replaced by ``solve``); ``rng`` is unused. A broadcast view: no table-sized array."""
        return {"prob": np.broadcast_to(np.float32(1.0 / self.spec.n_classes), self.parameter_shapes()["prob"])}

    def context_index(self, x: np.ndarray) -> np.ndarray:
        """Each row's context as one number (the first symbol most significant)."""
        symbols = np.asarray(x).reshape(len(x), -1)
        if symbols.size and (not np.all(symbols == np.floor(symbols)) or symbols.min() < 0
                             or symbols.max() >= self.symbols):
            raise InputError("n-gram features must be symbol numbers 0 .. symbols - 1",
                             expected=f"integers below model.symbols = {self.symbols} (set data.normalize = false)",
                             found=f"values from {symbols.min()} to {symbols.max()}")
        index = np.zeros(len(symbols), dtype=np.int64)
        for column in range(symbols.shape[1]):
            index = index * self.symbols + symbols[:, column].astype(np.int64)
        return index

    def add_statistics(self, x: np.ndarray, y: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Adds one to ``counts[context, next]`` per row (into the mapped partial: only its touched pages)."""
        np.add.at(out["counts"], (self.context_index(x), np.asarray(y).reshape(-1).astype(np.int64)), 1.0)

    def solve(self, stats: dict[str, np.ndarray]) -> Params:
        """The smoothed table, SOLVE_CONTEXTS contexts at a time: the only full-size array is the float32 answer."""
        counts = stats["counts"]
        prob = np.empty(counts.shape, dtype=np.float32)
        denominator = self.alpha * self.spec.n_classes
        for lo in range(0, len(counts), SOLVE_CONTEXTS):
            block = counts[lo:lo + SOLVE_CONTEXTS]
            prob[lo:lo + SOLVE_CONTEXTS] = (block + self.alpha) / (block.sum(axis=1, keepdims=True) + denominator)
        return {"prob": prob}

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        rows = params["prob"][self.context_index(x)]
        return float(-np.sum(np.log(rows[np.arange(len(rows)), np.asarray(y).reshape(-1).astype(np.int64)]
                                    .astype(np.float64))))

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        return np.argmax(params["prob"][self.context_index(x)], axis=1)

    def predict_proba(self, params: Params, x: np.ndarray) -> np.ndarray:
        return np.array(params["prob"][self.context_index(x)])


# --- the large-partial run (docs/performance.md) ---

def make_source(folder: Path, rows: int, order: int, symbols: int, classes: int, seed: int) -> tuple[Path, Path]:
    """Rows of ``order`` random symbols; the next symbol is a fixed function of the context 3 times in 4."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, symbols, size=(rows, order)).astype(np.float32)
    index = np.zeros(rows, dtype=np.int64)
    for column in range(order):
        index = index * symbols + x[:, column].astype(np.int64)
    y = np.where(rng.random(rows) < 0.75, (index * 2654435761 >> 7) % classes, rng.integers(0, classes, rows))
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y.astype(np.int64))
    return folder / "x.npy", folder / "y.npy"


def anonymous_kib(pid: int) -> int:
    """``Anonymous`` of /proc/PID/smaps_rollup: private and shared anonymous pages, not mapped files."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("Anonymous:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class AnonymousPeak:
    """The largest total ``Anonymous`` over a process tree seen in one sample (every 50 ms)."""

    def __init__(self, root: int):
        self.root, self.peak_kib, self.stop = root, 0, threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        from memtrain.benchmarks.memory import descendants

        pids, count = [self.root], 0
        while not self.stop.wait(0.05):
            if count % 10 == 0:
                pids = descendants(self.root)
            self.peak_kib = max(self.peak_kib, sum(anonymous_kib(pid) for pid in pids))
            count += 1


def check_probabilities(weights: Path, x: np.ndarray, y: np.ndarray, model: NgramCounts) -> dict[str, int]:
    """Every seen context's row of the table against a direct count, bit for bit; a sample of unseen ones."""
    classes = model.spec.n_classes
    table = np.load(weights, mmap_mode="r").reshape(model.contexts, classes)
    index = model.context_index(x)
    counts: dict[int, np.ndarray] = {}
    order = np.argsort(index, kind="stable")
    seen, starts = np.unique(index[order], return_index=True)
    for context, lo, hi in zip(seen, starts, [*starts[1:], len(order)], strict=True):
        counts[int(context)] = np.bincount(y[order[lo:hi]], minlength=classes).astype(np.float64)
    wrong = 0
    for context, row in counts.items():
        expected = ((row + model.alpha) / (row.sum() + model.alpha * classes)).astype(np.float32)
        wrong += int(not np.array_equal(table[context], expected))
    unseen = np.setdiff1d(np.random.default_rng(0).integers(0, model.contexts, 100_000), seen)
    uniform = np.float32(model.alpha / (model.alpha * classes))
    wrong += int(np.count_nonzero(np.any(table[np.sort(unseen)] != uniform, axis=1)))
    return {"contexts_checked": len(counts) + len(unseen), "wrong": wrong}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where the source, the dataset and the run go (deleted: --clean)")
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--order", type=int, default=4)
    parser.add_argument("--symbols", type=int, default=64)
    parser.add_argument("--classes", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=2, help="train.tasks_per_update: one partial each")
    parser.add_argument("--chunk-rows", type=int, default=32768, help="train.chunk_rows")
    args = parser.parse_args(argv)
    folder = args.folder.resolve()
    x_path, y_path = make_source(folder / "source", args.rows, args.order, args.symbols, args.classes, seed=0)
    subprocess.run([sys.executable, "-m", "memtrain", "prepare", str(x_path), str(folder / "data"), "--y",
                    str(y_path), "--task", "classification", "--val-fraction", "0.05", "--overwrite", "-q"],
                   check=True)
    job = folder / "ngram.toml"
    job.write_text(f'[data]\npath = "{folder / "data"}"\nnormalize = false\n[model]\n'
                   f'kind = "benchmarks.ngram:NgramCounts"\nsymbols = {args.symbols}\n'
                   f"[train]\nworkers = {args.workers}\ntasks_per_update = {args.tasks}\ntask_timeout = 3600\n"
                   f"chunk_rows = {args.chunk_rows}\n"
                   f'[run]\ndir = "{folder / "run"}"\nkeep_checkpoints = 1\nkeep_versions = 1\n')
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "memtrain", "train", str(job), "--overwrite", "--quiet"])
    sampler = AnonymousPeak(process.pid)
    sampler.thread.start()
    code = process.wait()
    sampler.stop.set()
    sampler.thread.join()
    if code != 0:
        print(json.dumps({"error": f"memtrain train exited with {code}"}))
        return 1
    from memtrain.dataset import open_dataset
    from memtrain.layout import weight_versions, weights_path
    from memtrain.train.context import data_spec

    dataset = open_dataset(folder / "data")
    train = dataset.split("train")
    x, y = train.read(0, train.rows)
    model = NgramCounts(data_spec(dataset.manifest), symbols=args.symbols)
    run = folder / "run"
    report = {"rows": args.rows, "partial_bytes": model.contexts * args.classes * 8,
              "solved_bytes": model.contexts * args.classes * 4, "workers": args.workers,
              "peak_anonymous_bytes": sampler.peak_kib * 1024, "seconds": round(time.monotonic() - started, 1),
              **check_probabilities(weights_path(run, weight_versions(run)[-1]), np.asarray(x),
                                    np.asarray(y).astype(np.int64), model)}
    print(json.dumps(report))
    return 0 if report["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
