"""Where a streamed update's time goes (train/loops/stream.py): the server's pieces, timed around each update.

Run: ``python -m benchmarks.stream_profile [--params 1e6] [--updates 40] [--cluster local:2]``.
Trains the benchmark's MLP (memtrain/benchmarks/synthetic.py) for one epoch on the cluster and prints,
per piece, the median over the updates after the first few. The pieces are the server's named sections
(memtrain/train/timing.py), timed by the timer this script hands to ``train``: no class is patched.
``--cluster processes`` streams to two local worker processes (train/server/exchange.WorkerPool) instead of
Dask workers: the same stream without Dask, which separates what Dask costs from what the stream itself
costs (the one patch left: the server's ``open_cluster`` swapped for that pool).

- ``round``: one whole update in the server (its step, then the next update's gradients);
- ``step``: the server's step of the whole parameter vector (train/loops/reduce.py);
- ``publish``: the link that publishes a version (and its sync, on a network filesystem);
- ``tasks``: from sending an update's gradient tasks to having every answer;
- ``tasks - slowest compute``: what the tasks cost beyond the longest gradient computation: the actor
  round trips, the workers' reading of the rows and the new version, their writing of the gradient files;
- ``file_chores``: the server's chores on files while the workers compute (deleting the stepped gradient files,
  readying and faulting in the next version's file): off the update's path when a core is spare.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrain.benchmarks.memtrain_run import job_for
from memtrain.benchmarks.problem import BATCH, Problem
from memtrain.benchmarks.synthetic import mlp_shape, write_dataset
from memtrain.train.timing import Recording

SKIP = 3  # first updates left out (maps and caches warming up)
PROCESSES = "processes"
PRINTED = ("round", "step", "publish", "tasks", "tasks - slowest compute", "file_chores")


class StreamTimer(Recording):
    """The server's named sections (memtrain/train/timing.py) in wall time; the update's tasks also less their
    slowest compute (each result carries its compute seconds)."""

    def timed(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        if name != "tasks":
            return super().timed(name, function)

        def run_tasks(tasks: list, chores: Callable[[], None]) -> list:
            started = time.perf_counter()
            results = function(tasks, chores)
            wall = time.perf_counter() - started
            self.times["tasks"].append(wall)
            self.times["tasks - slowest compute"].append(wall - max(r.seconds for r in results))
            return results

        return run_tasks


def main(argv: list[str] | None = None) -> int:
    from memtrain.train.server.server import train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=1e6, help="parameters of the MLP (1e6)")
    parser.add_argument("--updates", type=int, default=40, help="updates to run (40)")
    parser.add_argument("--cluster", default="local:2",
                        help=f"run.cluster (local:2), or {PROCESSES!r}: local worker processes, no Dask")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="memtrain-stream-profile-"))
    shape = mlp_shape(int(args.params))
    data = write_dataset(scratch / "data", args.updates * BATCH, BATCH, features=shape.features, classes=shape.classes)
    timer = StreamTimer()
    cluster = args.cluster
    if cluster == PROCESSES:
        from memtrain.train.server import server
        from memtrain.train.server.exchange import WorkerPool

        server.open_cluster = lambda job, setup, run, log, stopped=None: WorkerPool(setup, 2)
        cluster = "local:2"  # a cluster run, on the pool above
    train(job_for(Problem(str(data), shape.hidden, args.updates, workers=2), scratch / "run", workers=2,
                  cluster=cluster), quiet=True, timer=timer)
    print(f"{shape.params:,} parameters, {args.updates} updates on {args.cluster}; medians in ms")
    for name in PRINTED:
        values = timer.times.get(name, [])
        kept = values[SKIP:] or values
        if not kept:
            continue
        print(f"{name:>24}: {statistics.median(kept) * 1e3:8.2f}   (n={len(kept)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
