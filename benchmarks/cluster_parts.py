"""What the server's CPU pays per message, per future and per worker on Dask (the measurement behind the
cluster's cost table, docs/cluster.md "Cost per update").

Run: ``python -m benchmarks.cluster_parts [--workers 1,2,4,8] [--waves 200] [--json]``. For each
count N it starts a ``dask scheduler`` and ``dask worker --nworkers N --nthreads 1`` as processes of their own
on 127.0.0.1 (so this process is a client only, as the server is against a real cluster), one Echo actor
per worker (benchmarks/cluster_transports.py), and measures this process's CPU time (all threads;
in brackets the part in threads other than the main one: Dask's event loop) for:

- ``actor call``: waves shaped like an update's: a gradient-task-sized record sent to every actor at once
  (the way ``ClusterPool.send`` calls them), then every answer awaited; CPU per call (one call and its answer);
- ``future``: the same waves as ``client.submit(..., workers=[w], pure=False)`` and ``client.gather``;
  CPU per future;
- ``broadcast``: the same waves, the way a server could send one record per update whatever N: one
  ``distributed.Event`` set per wave (the scheduler wakes every worker waiting on it: a long-running seceded
  task per worker), each worker's answer counted by a scheduler plugin (``Counter``), which sets one event
  when all are in; the client sends one message and awaits one. CPU per wave (not per call);
- the wall time per wave of the actor calls and of the broadcast (a busy machine's figures), and the scheduler
  process's CPU per wave (``psutil``: clock ticks, 10 ms, over the whole run of waves);
- ``identity``: ``scheduler.identity`` (what ``ClusterPool`` asks once a second to see workers come and go);
  CPU per call;
- ``idle``: nothing sent for a few seconds, the actors held; CPU per second (Dask's own heartbeats).

CPU counts are indicative on a busy machine; the counts of calls are exact.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.cluster_transports import RECORD, Echo, answer
from memtrain.benchmarks.cluster_costs import other_threads_cpu

LOOPBACK = ("--host", "127.0.0.1", "--no-dashboard", "--dashboard-address", "127.0.0.1:0")
START_SECONDS = 60.0


class Counter:
    """A scheduler plugin (``distributed.diagnostics.plugin.SchedulerPlugin``'s interface): the handler
    ``memtrain_count(name, total)`` counts calls per name and sets the Dask event ``name`` at the ``total``-th."""

    name = "memtrain-count"

    async def start(self, scheduler: Any) -> None:
        self.scheduler, self.counts = scheduler, {}
        scheduler.handlers["memtrain_count"] = self.count

    def count(self, name: str = "", total: int = 0) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
        if self.counts[name] == total:
            del self.counts[name]
            self.scheduler.extensions["events"].event_set(name=name)


def follower(prefix: str, waves: int, total: int) -> int:
    """A worker's long-running loop: wait for wave k's event, answer by counting itself in at the scheduler."""
    from distributed import Event, get_client, secede

    secede()
    client = get_client()
    for wave in range(waves):
        Event(f"{prefix}-go-{wave}", client=client).wait()
        client.sync(client.scheduler.memtrain_count, name=f"{prefix}-done-{wave}", total=total)
    return waves


@contextlib.contextmanager
def external_cluster(workers: int, folder: Path) -> Iterator[tuple[str, int]]:
    """A scheduler and ``workers`` single-threaded workers, each a process of its own session; ended on exit.
    Yields the scheduler's address and pid. Started with the Dask settings of the clusters memtrain starts
    (memtrain/cluster/dask_settings.py: the environment, and the scheduler's preload), as its Slurm launch does."""
    from memtrain.cluster.dask_settings import environment

    info = folder / "scheduler.json"
    processes = []
    path = os.pathsep.join(p for p in (str(Path.cwd()), os.environ.get("PYTHONPATH", "")) if p)
    env = {**environment(), **os.environ, "PYTHONPATH": path}
    try:
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0", *LOOPBACK, "--scheduler-file",
             str(info), "--preload", "memtrain.cluster.dask_settings"], cwd=folder, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, env=env))
        deadline = time.monotonic() + START_SECONDS
        while not info.exists() or not info.read_text().strip().endswith("}"):
            if time.monotonic() > deadline:
                raise RuntimeError("the dask scheduler did not start within 60 s")
            time.sleep(0.05)
        address = json.loads(info.read_text())["address"]
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", str(workers), "--nthreads",
             "1", "--memory-limit", "0", "--local-directory", str(folder), *LOOPBACK], cwd=folder,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env))
        yield address, processes[0].pid
    finally:
        for process in reversed(processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def cpu(scheduler: int) -> tuple[float, float, float]:
    """This process's CPU seconds, those of its threads but the main one, and the scheduler process's."""
    import psutil

    times = psutil.Process(scheduler).cpu_times()
    return time.process_time(), other_threads_cpu(), times.user + times.system


def per_item(work: Callable[[], None], items: int, scheduler: int) -> dict[str, float]:
    """CPU ms per item of ``work`` (all threads, Dask's threads; the scheduler's, to 10 ms a run), wall seconds."""
    start, wall = cpu(scheduler), time.perf_counter()
    work()
    end = cpu(scheduler)
    return {"cpu_ms": (end[0] - start[0]) / items * 1e3, "loop_cpu_ms": (end[1] - start[1]) / items * 1e3,
            "scheduler_cpu_ms": (end[2] - start[2]) / items * 1e3, "wall_s": time.perf_counter() - wall}


def measure(workers: int, waves: int, idle_seconds: float) -> dict[str, Any]:
    from distributed import Client
    from distributed.diagnostics.plugin import SchedulerPlugin

    with tempfile.TemporaryDirectory() as folder, external_cluster(workers, Path(folder)) as (address, pid), \
            Client(address, timeout=30, direct_to_workers=True) as client:
        client.wait_for_workers(workers, timeout=START_SECONDS)
        names = sorted(client.scheduler_info()["workers"])
        actors = [client.submit(Echo, actor=True, workers=[name], pure=False).result() for name in names]

        def actor_waves(count: int) -> None:
            for _ in range(count):
                for call in [actor.run(RECORD) for actor in actors]:
                    call.result()

        def future_waves(count: int) -> None:
            for _ in range(count):
                client.gather([client.submit(answer, RECORD, workers=[name], pure=False) for name in names])

        def broadcast_waves(prefix: str, count: int) -> None:
            from distributed import Event

            loops = [client.submit(follower, prefix, count, workers, workers=[name], pure=False) for name in names]
            for wave in range(count):
                Event(f"{prefix}-go-{wave}", client=client).set()
                Event(f"{prefix}-done-{wave}", client=client).wait()
            client.gather(loops)

        def identities(count: int) -> None:
            for _ in range(count):
                client.sync(client.scheduler.identity)

        client.register_plugin(type("CounterPlugin", (Counter, SchedulerPlugin), {})())
        actor_waves(10)  # connections opened, code warm
        future_waves(5)
        broadcast_waves("warm", 5)
        row: dict[str, Any] = {"workers": workers, "waves": waves}
        row["actor_call"] = per_item(lambda: actor_waves(waves), waves * workers, pid)
        row["future"] = per_item(lambda: future_waves(max(1, waves // 4)), max(1, waves // 4) * workers, pid)
        row["broadcast_wave"] = per_item(lambda: broadcast_waves("timed", waves), waves, pid)
        row["identity"] = per_item(lambda: identities(50), 50, pid)
        row["idle_per_s"] = per_item(lambda: time.sleep(idle_seconds), 1, pid)
        row["idle_per_s"] = {key: value / idle_seconds for key, value in row["idle_per_s"].items()}
        return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts, comma-separated (1,2,4,8)")
    parser.add_argument("--waves", type=int, default=200, help="update-shaped waves of actor calls (200)")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds measured with nothing sent (5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    threading.current_thread().name = "main"
    load_before = os.getloadavg()
    rows = [measure(int(n), args.waves, args.idle) for n in args.workers.split(",")]
    report = {"loadavg_before": load_before, "loadavg_after": os.getloadavg(), "rows": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"client CPU, external scheduler and workers on 127.0.0.1 (load average "
          f"{' '.join(f'{v:.1f}' for v in load_before)} before, "
          f"{' '.join(f'{v:.1f}' for v in report['loadavg_after'])} after); in brackets Dask's threads")
    print("| workers | per actor call ms | per future ms | per broadcast wave ms | per identity call ms "
          "| idle ms per s | wall per wave ms: actor calls / broadcast | scheduler CPU per wave ms: actor calls / "
          "broadcast |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        cells = [f"{row[k]['cpu_ms']:.3f} ({row[k]['loop_cpu_ms']:.3f})"
                 for k in ("actor_call", "future", "broadcast_wave", "identity", "idle_per_s")]
        walls = (row["actor_call"]["wall_s"] / row["waves"] * 1e3, row["broadcast_wave"]["wall_s"] / row["waves"] * 1e3)
        waves = (row["actor_call"]["scheduler_cpu_ms"] * row["workers"], row["broadcast_wave"]["scheduler_cpu_ms"])
        print(f"| {row['workers']} | " + " | ".join(cells) + f" | {walls[0]:.2f} / {walls[1]:.2f} "
              f"| {waves[0]:.2f} / {waves[1]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
