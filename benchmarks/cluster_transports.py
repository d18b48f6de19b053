"""Round trip of one small task record through each way Dask can carry it (the measurement behind cluster/).

Run: ``python -m benchmarks.cluster_transports [--calls 300] [--json]``. Starts a local Dask cluster
on 127.0.0.1 (2 worker processes, one thread each, no dashboard) and times, for a gradient-task-sized
record sent to one named worker and a result-sized record back:

- ``simple_queue``: the single-machine baseline, a ``multiprocessing.SimpleQueue`` pair to a spawned process;
- ``actor``: a method call on a Dask actor (client -> worker directly, run on the worker's actor thread);
- ``actor_via_scheduler``: the same from a client without ``direct_to_workers`` (the scheduler relays it);
- ``future``: ``client.submit(..., workers=[w], pure=False).result()`` (through the scheduler);
- ``seceded_queue``: a long-running task that seceded from the worker's thread pool and loops on a pair
  of ``distributed.Queue`` (both through the scheduler);
- ``client_run``: ``client.run(f, workers=[w])`` on a function reading a worker plugin's per-worker state
  (through the scheduler; runs on the worker's event loop, so a long task would block its heartbeats).

Prints the median and 90th percentile per mechanism and the pickled size of the records.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

from memtrain.train.messages import GradTask, Outcome, Result

RECORD = GradTask(task=3, attempt=0, ticket=5678, version=1234, epoch=5, lo=1_000_000, hi=2_000_000)
ANSWER = Result(task=3, attempt=0, outcome=Outcome.DONE, loss=123.456, rows=1_000_000, seconds=0.01)


def answer(record: GradTask) -> Result:
    return Result(task=record.task, attempt=record.attempt, outcome=Outcome.DONE, loss=ANSWER.loss,
                  rows=record.hi - record.lo, seconds=ANSWER.seconds)


class Echo:
    """The actor: answers a task record with a result record."""

    def run(self, record: GradTask) -> Result:
        return answer(record)


def _echo_process(tasks: Any, results: Any) -> None:
    while (record := tasks.get()) is not None:
        results.put(answer(record))


def _seceded_loop(inbox: str, outbox: str) -> int:
    from distributed import Queue, secede

    secede()
    tasks, results = Queue(inbox), Queue(outbox)
    served = 0
    while (record := tasks.get()) is not None:
        results.put(answer(record))
        served += 1
    return served


def _from_plugin(record: GradTask, dask_worker: Any = None) -> Result:
    dask_worker.plugins["memtrain-echo"].served += 1
    return answer(record)


class EchoPlugin:
    name = "memtrain-echo"
    served = 0

    def setup(self, worker: Any) -> None:
        self.served = 0


def time_calls(call: Callable[[], Result], calls: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        call()
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        result = call()
        seconds.append(time.perf_counter() - start)
        assert result.rows == RECORD.hi - RECORD.lo
    return seconds


def simple_queue(calls: int) -> list[float]:
    context = multiprocessing.get_context("spawn")
    tasks, results = context.SimpleQueue(), context.SimpleQueue()
    process = context.Process(target=_echo_process, args=(tasks, results), daemon=True)
    process.start()
    try:
        def call() -> Result:
            tasks.put(RECORD)
            return results.get()
        return time_calls(call, calls)
    finally:
        tasks.put(None)
        process.join(5)


def dask_mechanisms(calls: int) -> dict[str, list[float]]:
    from distributed import Client, LocalCluster, Queue
    from distributed.diagnostics.plugin import WorkerPlugin

    plugin_class = type("EchoWorkerPlugin", (EchoPlugin, WorkerPlugin), {})
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster, direct_to_workers=True) as client:
        worker = sorted(client.scheduler_info()["workers"])[0]
        out: dict[str, list[float]] = {}
        actor = client.submit(Echo, actor=True, workers=[worker]).result()
        out["actor"] = time_calls(lambda: actor.run(RECORD).result(), calls)
        with Client(cluster, direct_to_workers=False) as proxied, proxied.as_current():
            relayed = proxied.submit(Echo, actor=True, workers=[worker]).result()
            out["actor_via_scheduler"] = time_calls(lambda: relayed.run(RECORD).result(), calls)
        out["future"] = time_calls(
            lambda: client.submit(answer, RECORD, workers=[worker], pure=False).result(), calls)
        inbox, outbox = Queue("memtrain-bench-in", client=client), Queue("memtrain-bench-out", client=client)
        loop = client.submit(_seceded_loop, inbox.name, outbox.name, workers=[worker], pure=False)

        def through_queues() -> Result:
            inbox.put(RECORD)
            return outbox.get(timeout=10)
        out["seceded_queue"] = time_calls(through_queues, calls)
        inbox.put(None)
        loop.result(timeout=10)
        client.register_plugin(plugin_class())
        out["client_run"] = time_calls(lambda: client.run(_from_plugin, RECORD, workers=[worker])[worker], calls)
        return out


def summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"median_ms": statistics.median(ordered) * 1e3, "p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1e3,
            "calls": len(ordered)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="timed round trips per mechanism (300)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    timings = {"simple_queue": simple_queue(args.calls), **dask_mechanisms(args.calls)}
    report = {"mechanisms": {name: summary(values) for name, values in timings.items()},
              "record_bytes": len(pickle.dumps(RECORD)), "result_bytes": len(pickle.dumps(ANSWER))}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for name, row in report["mechanisms"].items():
        print(f"{name:>20}: median {row['median_ms']:7.3f} ms   p90 {row['p90_ms']:7.3f} ms   ({row['calls']} calls)")
    print(f"pickled task record {report['record_bytes']} B, result record {report['result_bytes']} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
