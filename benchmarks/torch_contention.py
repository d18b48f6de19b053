"""Parameter counts -> what the cores give plain torch: one process alone, two at once, one on two threads.

``python -m benchmarks.torch_contention [--sizes 1e6,1e7] [--rows 256] [--updates 12]``

No memtrain in it: the benchmark MLP (features -> hidden -> classes, Linear + ReLU) computes the summed
cross-entropy forward + backward of ``rows`` rows on private parameters, as a DDP rank (or a memtrain
worker) does, in three settings:

- one process alone, one intra-op thread (what a worker would take with the machine to itself);
- ``processes`` processes at once, one thread each, ``rows`` rows each (memtrain's workers, DDP's ranks);
- one process, ``processes`` threads, ``processes * rows`` rows (the all-core torch process).

Each line gives the median milliseconds per update (each process's, wall clock), the process CPU time
per update, and rows per second of the whole machine. A second table times the first layer's forward
GEMM alone, one thread, in torch (``torch.nn.functional.linear``: oneMKL on x86), in oneDNN
(``torch.utils.mkldnn``: inference only, which torch's autograd does not use for float32) and in numpy's
BLAS, to show how fast the same matrix product can be on this CPU.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from memtrain.benchmarks.synthetic import CLASSES, FEATURES, Shape, mlp_shape


@dataclass(frozen=True, kw_only=True)
class Timing:
    """One process's updates: median wall and process CPU seconds."""

    wall: float
    cpu: float


@dataclass(frozen=True, kw_only=True)
class Setting:
    label: str
    rows_per_update: int  # rows of the whole machine per update
    timings: tuple[Timing, ...]

    def rows_per_second(self) -> float:
        return self.rows_per_update / max(t.wall for t in self.timings)


def time_updates(shape: Shape, rows: int, threads: int, updates: int, seed: int = 0) -> Timing:
    """Median wall and process-CPU seconds of ``updates`` forward + backward passes, after two warm ones."""
    import torch
    import torch.nn.functional as F

    from benchmarks.torch_binding import torch_mlp

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    module = torch_mlp(shape.features, shape.hidden, shape.classes)
    generator = np.random.default_rng(seed)
    x = torch.from_numpy(generator.standard_normal((rows, shape.features), dtype=np.float32))
    y = torch.from_numpy(generator.integers(0, shape.classes, rows))
    walls, cpus = [], []
    for index in range(updates + 2):
        for param in module.parameters():
            param.grad = None
        started, cpu = time.perf_counter(), time.process_time()
        F.cross_entropy(module(x), y, reduction="sum").backward()
        if index >= 2:
            walls.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu)
    return Timing(wall=statistics.median(walls), cpu=statistics.median(cpus))


def _child(shape: Shape, rows: int, updates: int, seed: int, start: Any, answers: Any) -> None:
    from memtrain.train.worker.worker import keep_freed_memory

    keep_freed_memory()  # as in a memtrain worker: no page faults for each update's fresh gradient
    import torch

    torch.set_num_threads(1)
    time_updates(shape, rows, 1, 1, seed)  # imports and first allocations before the start line
    start.wait()
    answers.put(time_updates(shape, rows, 1, updates, seed))


def at_once(shape: Shape, rows: int, updates: int, processes: int) -> tuple[Timing, ...]:
    """``processes`` spawned processes, one thread each, timing their updates at the same time."""
    context = multiprocessing.get_context("spawn")
    start, answers = context.Barrier(processes), context.Queue()
    children = [context.Process(target=_child, args=(shape, rows, updates, seed, start, answers), daemon=True)
                for seed in range(processes)]
    for child in children:
        child.start()
    timings: list[Timing] = []
    try:
        while len(timings) < processes:
            try:
                timings.append(answers.get(timeout=1.0))
            except queue.Empty:
                if any(child.exitcode not in (None, 0) for child in children):
                    codes = [c.exitcode for c in children]
                    raise RuntimeError(f"a timing process failed: exit codes {codes}") from None
        return tuple(timings)
    finally:
        for child in children:
            child.join(60)
            if child.is_alive():
                child.kill()


def settings(shape: Shape, rows: int, updates: int, processes: int) -> list[Setting]:
    from memtrain.train.worker.worker import keep_freed_memory

    keep_freed_memory()
    return [
        Setting(label="1 process alone, 1 thread", rows_per_update=rows,
                timings=(time_updates(shape, rows, 1, updates),)),
        Setting(label=f"{processes} processes at once, 1 thread each", rows_per_update=processes * rows,
                timings=at_once(shape, rows, updates, processes)),
        Setting(label=f"1 process, {processes} threads", rows_per_update=processes * rows,
                timings=(time_updates(shape, processes * rows, processes, updates),)),
    ]


def gemm_backends(shape: Shape, rows: int, repeats: int) -> dict[str, float]:
    """Best seconds of the first layer's forward product (rows x features times features x hidden), 1 thread."""
    import torch
    import torch.nn.functional as F
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    generator = np.random.default_rng(0)
    x = generator.standard_normal((rows, shape.features), dtype=np.float32)
    w = generator.standard_normal((shape.hidden, shape.features), dtype=np.float32)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    runs = {"torch linear (oneMKL)": lambda: F.linear(tx, tw)}
    if torch.backends.mkldnn.is_available():
        from torch.utils import mkldnn

        layer = torch.nn.Linear(shape.features, shape.hidden, bias=False)
        with torch.no_grad():
            layer.weight.copy_(tw)
            fast = mkldnn.to_mkldnn(layer)
        runs["oneDNN linear (torch.utils.mkldnn)"] = lambda: fast(tx.to_mkldnn()).to_dense()
    runs["numpy x @ w.T (its BLAS)"] = lambda: x @ w.T
    best = {}
    with threadpool_limits(limits=1), torch.no_grad():
        for name, run in runs.items():
            run()
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                run()
                times.append(time.perf_counter() - started)
            best[name] = min(times)
    return best


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.torch_contention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e6,1e7")
    parser.add_argument("--rows", type=int, default=256, help="rows per process (default %(default)s: 512 / 2)")
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"MLP {FEATURES}-H-{CLASSES}, forward + backward, plain torch; load average {os.getloadavg()[0]:.2f}")
    for size in (int(float(s)) for s in args.sizes.split(",")):
        shape = mlp_shape(size)
        for setting in settings(shape, args.rows, args.updates, args.processes):
            walls = " ".join(f"{t.wall * 1e3:7.1f}" for t in setting.timings)
            cpus = " ".join(f"{t.cpu * 1e3:7.1f}" for t in setting.timings)
            print(f"{shape.params:>12,}  {setting.label:<36} ms/update {walls:<16} cpu ms {cpus:<16} "
                  f"{setting.rows_per_second():9,.0f} rows/s")
        for name, best in gemm_backends(shape, args.rows, max(3, args.updates // 2)).items():
            print(f"{shape.params:>12,}  first layer forward GEMM, {name:<34} best {best * 1e3:7.1f} ms")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
