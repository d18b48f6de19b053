"""Scheduler and server CPU per update of the two-level round (issue 42) against today's one-worker-per-process round.

For each N nodes x P processes: a Dask scheduler and N single-threaded workers on 127.0.0.1, each started with
``MEMTRAIN_NODE_PROCESSES=P`` (a node: memtrain/cluster/nodes.py), then ``cluster_costs.measure`` of the
benchmark's MLP with N x P tasks per update; and the same job on N x P workers without it (today's round: one
Dask worker per process). Per update: the scheduler's CPU (and per second: its background work per worker is
paid per second, so a longer update carries more of it), the messages the scheduler's BroadcastPlugin handled
(every handler, over the whole run, per update stepped), the server's CPU, updates/s.

    python -m benchmarks.node_round --params 1e6 --nodes 1,2,4 --processes 1,2 --updates 7 --warmup 2 --repeats 3

``--nodes-only`` leaves today's round out (half the time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cluster_parts import external_cluster
from memtrain.benchmarks.cluster_costs import measure
from memtrain.cluster.nodes import PROCESSES_ENV


def wait_for(address: str, workers: int, seconds: float = 120.0) -> None:
    from distributed import Client

    with Client(address, timeout=30) as client:
        deadline = time.monotonic() + seconds
        while len(client.scheduler_info()["workers"]) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(client.scheduler_info()['workers'])} of {workers} workers joined")
            time.sleep(0.2)


def one(params: int, workers: int, tasks: int, processes: int, updates: int, warmup: int, folder: Path) -> dict:
    """``measure`` on ``workers`` Dask workers, each a node of ``processes`` (0: not nodes)."""
    if processes:
        os.environ[PROCESSES_ENV] = str(processes)  # the workers' environment (external_cluster copies it)
    else:
        os.environ.pop(PROCESSES_ENV, None)
    folder.mkdir(parents=True)
    steps = StepCount()
    try:
        with external_cluster(workers, folder) as (address, _):
            wait_for(address, workers)
            row = measure(params, address, updates, warmup, folder, tasks, others=steps)
            return row | {"node_steps": sum(1 for c in steps.chained if c == tasks), "steps": len(steps.chained),
                          "messages": plugin_messages(address) / max(1, len(steps.chained)),
                          "scheduler_cpu_ms_per_s": row["scheduler_cpu_ms"] * row["updates_per_s"]}
    finally:
        os.environ.pop(PROCESSES_ENV, None)


def plugin_messages(address: str) -> int:
    """The messages the BroadcastPlugin handled in the run (every handler: memtrain/cluster/broadcast.py)."""
    from distributed import Client

    with Client(address, timeout=30) as client:
        return sum(client.run_on_scheduler(lambda dask_scheduler: dict(
            getattr(dask_scheduler.plugins.get("memtrain-broadcast"), "calls", {}))).values())


class StepCount:
    """A timer (memtrain/train/timing.py) that counts rather than times: per step, how many of the update's
    tasks' sum it read from a chain's partial (section ``node_step``; 0: no node round)."""

    def __init__(self) -> None:
        self.chained: list[int] = []

    def timed(self, name: str, function: Any) -> Any:
        if name != "node_step":
            return function

        def counted(tasks: list, ranges: list) -> Any:
            self.chained.append(tasks[0].chained)
            return function(tasks, ranges)

        return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=1e6)
    parser.add_argument("--nodes", default="1,2,4")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--updates", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="the whole grid this many times (median, range)")
    parser.add_argument("--nodes-only", action="store_true", help="skip today's round of a worker per process")
    args = parser.parse_args()
    before = os.getloadavg()
    cells: dict[tuple[str, str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="node-round-") as scratch:
        for repeat in range(args.repeats):
            for nodes in map(int, args.nodes.split(",")):
                for processes in map(int, args.processes.split(",")):
                    tasks = nodes * processes
                    rounds = (("nodes", nodes, processes), ("a worker per process", tasks, 0))
                    for label, workers, as_node in rounds[:1] if args.nodes_only else rounds:
                        row = one(int(args.params), workers, tasks, as_node, args.updates, args.warmup,
                                  Path(scratch) / f"{repeat}-{nodes}x{processes}-{label[:5]}")
                        cells.setdefault((f"{nodes} x {processes}", label, workers), []).append(row)
    after = os.getloadavg()
    print(f"load average {' '.join(f'{v:.1f}' for v in before)} before, {' '.join(f'{v:.1f}' for v in after)} after; "
          f"{int(args.params):,} parameters, updates {args.warmup + 1}-{args.updates - 1} counted, "
          f"{args.repeats} repeat(s): median (range)")
    print("| nodes x processes | round | Dask workers | scheduler CPU ms/update | scheduler CPU ms/s "
          "| plugin messages/update | server CPU ms/update | updates/s | steps from the last partial |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (layout, label, workers), runs in cells.items():
        print(f"| {layout} | {label} | {workers} | {spread(runs, 'scheduler_cpu_ms')} "
              f"| {spread(runs, 'scheduler_cpu_ms_per_s')} | {spread(runs, 'messages')} "
              f"| {spread(runs, 'server_cpu_ms')} | {spread(runs, 'updates_per_s', 2)} "
              f"| {sum(r['node_steps'] for r in runs)} of {sum(r['steps'] for r in runs)} |")


def spread(runs: list[dict], key: str, digits: int = 1) -> str:
    values = sorted(run[key] for run in runs)
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} ({values[0]:.{digits}f}-{values[-1]:.{digits}f})"


if __name__ == "__main__":
    main()
