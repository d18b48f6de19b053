"""Scheduler and server CPU per update of the two-level round (issue 42) against today's one-worker-per-process round.

For each N nodes x P processes: a Dask scheduler and N single-threaded workers on 127.0.0.1, each started with
``MEMTRAIN_NODE_PROCESSES=P`` (a node: memtrain/cluster/nodes.py), then ``cluster_costs.measure`` of the
benchmark's MLP with N x P tasks per update; and the same job on N x P workers without it (today's round: one
Dask worker per process). Per update: the scheduler's CPU (and per second: its background work per worker is
paid per second, so a longer update carries more of it), the messages the scheduler's BroadcastPlugin handled
(every handler, over the whole run, per update stepped), the server's CPU, updates/s.

    python -m benchmarks.node_round --params 1e6 --nodes 1,2,4 --processes 1,2 --updates 7 --warmup 2 --repeats 3

``--nodes-only`` leaves today's round out (half the time). ``--idle SECONDS`` prints instead, for each node count,
the scheduler's CPU per second with the nodes and one client connected and no run (Dask's own background:
heartbeats, periodic callbacks), the part of its CPU per update that is not the round's.

``--handlers`` adds, per cell, what the scheduler handled per update over the whole run, by handler (every
message a Dask scheduler takes: memtrain's plugin's, the workers' heartbeats, the client's, Dask's pub/sub): the
count per update and, for handlers that are plain functions, their CPU per update on the scheduler's event loop
(``time.thread_time`` around the call; not the comms' reading and decoding): the itemised rest of its CPU.

``--bytes`` adds, per node, the bytes it moved over the shared filesystem per update (the most of any node, as a
multiple of the parameter vector): each node's Dask worker is traced with ``strace -f -y`` over the counted
updates (from the end of update ``warmup``'s step to the end of the last counted step; started from the server's
step hook), and its system calls on files under the run directory (versions, partials, optimizer state, wave files)
are summed: ``read``/``pread64``/``readv`` and ``write``/``pwrite64``/``writev`` by their return values, and each
shared file it maps (``mmap``: a version, read in place by the gradients: ``rchar`` never sees these bytes) by the
mapped length, once per file per node -- the node's threads share its page cache, so a network filesystem's client
fetches a mapped file once for the node. Files of the node's own scratch (its gradients, under the Dask worker's
local directory) are not counted, nor the dataset's rows: its shards are mapped once, at the run's start, and the
pages a task touches are not system calls (``rows_mib`` counts only the rows read by calls: none here). Traced
nodes are slower (every system call stops); bytes are bytes, but the other columns of a ``--bytes`` run are not
comparable.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
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


def one(params: int, workers: int, tasks: int, processes: int, updates: int, warmup: int, folder: Path,
        traced: bool = False, handlers: bool = False) -> dict:
    """``measure`` on ``workers`` Dask workers, each a node of ``processes`` (0: not nodes); ``traced``: with each
    node's shared-filesystem bytes per update (``NodeBytes``); ``handlers``: the scheduler's handlers counted."""
    if processes:
        os.environ[PROCESSES_ENV] = str(processes)  # the workers' environment (external_cluster copies it)
    else:
        os.environ.pop(PROCESSES_ENV, None)
    folder.mkdir(parents=True)
    try:
        with external_cluster(workers, folder) as (address, _):
            wait_for(address, workers)
            trace = NodeBytes(folder, worker_pids(address), window=(warmup, updates - 1)) if traced else None
            with HandlerCounts(address) if handlers else contextlib.nullcontext() as counts:
                steps = StepCount(trace, counts, window=(warmup, updates - 1))
                try:
                    row = measure(params, address, updates, warmup, folder, tasks, others=steps)
                finally:
                    if trace is not None:
                        trace.stop()
            extra = trace.per_update(updates - 1 - warmup, params) if trace is not None else {}
            if counts is not None:
                extra["handlers"] = counts.per_update(updates - 1 - warmup)
            return row | extra | {"node_steps": sum(1 for c in steps.chained if c == tasks),
                                  "steps": len(steps.chained),
                                  "messages": plugin_messages(address) / max(1, len(steps.chained)),
                                  "scheduler_cpu_ms_per_s": row["scheduler_cpu_ms"] * row["updates_per_s"]}
    finally:
        os.environ.pop(PROCESSES_ENV, None)


def idle_scheduler(nodes: int, seconds: float, folder: Path) -> float:
    """The scheduler's CPU in ms per second over ``seconds`` with ``nodes`` node workers and a client, no run."""
    from distributed import Client

    folder.mkdir(parents=True)
    os.environ[PROCESSES_ENV] = "1"
    try:
        with external_cluster(nodes, folder) as (address, pid), Client(address, timeout=30):
            wait_for(address, nodes)
            time.sleep(3.0)  # past the workers' and the client's start
            before, started = process_seconds(pid), time.monotonic()
            time.sleep(seconds)
            return 1000 * (process_seconds(pid) - before) / (time.monotonic() - started)
    finally:
        os.environ.pop(PROCESSES_ENV, None)


def process_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (``/proc/PID/stat``, clock ticks)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_pids(address: str) -> list[int]:
    from distributed import Client

    with Client(address, timeout=30) as client:
        return sorted(client.run(os.getpid).values())


SYSCALL = re.compile(r"^\d+\s+(read|pread64|readv|preadv|write|pwrite64|writev|pwritev)\((\d+)<([^>]*)>.*\)"
                     r"\s+=\s+(\d+)")
MAPPED = re.compile(r"^\d+\s+mmap\([^,]+, (\d+), [^,]+, [^,]+, \d+<([^>]*)>")


class NodeBytes:
    """Each node's (Dask worker's) system calls on files, traced with ``strace -f -y`` over the counted updates:
    ``start`` and ``stop`` are called by the server's step hook (``StepCount``); see the module's docstring."""

    def __init__(self, folder: Path, pids: list[int], window: tuple[int, int]):
        self.folder, self.pids, self.window = folder, pids, window
        self.tracers: list[tuple[subprocess.Popen, Path]] = []

    def start(self) -> None:
        for pid in self.pids:
            out = self.folder / f"strace-{pid}.txt"
            self.tracers.append((subprocess.Popen(
                ["strace", "-f", "-qq", "-y", "-e", "trace=read,pread64,readv,preadv,write,pwrite64,writev,pwritev,"
                 "mmap", "-o", str(out), "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out))
        time.sleep(1.0)  # attached to every thread before the next update's record is posted

    def stop(self) -> None:
        for tracer, _ in self.tracers:
            with contextlib.suppress(ProcessLookupError):
                tracer.send_signal(signal.SIGINT)
        for tracer, _ in self.tracers:
            try:
                tracer.wait(30)
            except subprocess.TimeoutExpired:
                tracer.kill()

    def per_update(self, updates: int, params: int) -> dict:
        """The most any node moved per update, as multiples of the parameter vector: parameters' files read (by
        system calls, and mapped), written, both together (issue 42's bound: the most of any one node); and the
        dataset's rows read (MiB)."""
        run = [node_bytes(out, self.folder) for _, out in self.tracers]
        vector = params * 4
        most = {key: max((r[key] for r in run), default=0) / max(1, updates) for key in ("read", "mapped", "written",
                                                                                      "rows")}
        both = max((r["read"] + r["mapped"] + r["written"] for r in run), default=0) / max(1, updates)
        return {"shared_read": (most["read"] + most["mapped"]) / vector, "shared_written": most["written"] / vector,
                "shared_mapped": most["mapped"] / vector, "shared_both": both / vector,
                "rows_mib": most["rows"] / 2**20}


def node_bytes(trace: Path, folder: Path) -> dict[str, int]:
    """One node's bytes in a trace: run directory files read, mapped (once per file), written; dataset rows read."""
    found: dict[str, int] = defaultdict(int)
    maps: dict[str, int] = {}
    run, data = str(folder / "run-"), str(folder / "data-")
    for line in trace.read_text(errors="replace").splitlines():
        call = SYSCALL.match(line)
        if call:
            name, _, path, count = call.groups()
            if path.startswith(run) and "/dask-scratch-space/" not in path:
                found["written" if "write" in name else "read"] += int(count)
            elif path.startswith(data):
                found["rows"] += int(count)
            continue
        mapped = MAPPED.match(line)
        if mapped and mapped.group(2).startswith(run):
            maps[mapped.group(2)] = max(maps.get(mapped.group(2), 0), int(mapped.group(1)))
        elif mapped and mapped.group(2).startswith(data):
            maps.setdefault(mapped.group(2), 0)  # the dataset's shards are mapped once for the run: not per update
    found["mapped"] = sum(maps.values())
    return found


class HandlerCounts:
    """The scheduler's handlers counted (``count_handlers``) from the end of the step of update ``warmup`` to the
    end of the last (``mark``, from the server's step hook, ``StepCount``), read through a client of its own that
    asks the scheduler nothing periodically (its scheduler-info interval an hour): in the window, its only
    message is the first mark's ``run_function``."""

    def __init__(self, address: str) -> None:
        self.address, self.marks = address, []

    def __enter__(self) -> HandlerCounts:
        import dask
        from distributed import Client

        with dask.config.set({"distributed.client.scheduler-info-interval": "1h"}):
            self.client = Client(self.address, timeout=30)
        self.client.run_on_scheduler(count_handlers)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.close()

    def mark(self) -> None:
        self.marks.append(self.client.run_on_scheduler(handler_counts))

    def per_update(self, updates: int) -> dict[str, tuple[float, float]]:
        """Messages and CPU ms per update by handler, between the first and the last mark."""
        first, last = self.marks[0], self.marks[-1]
        return {op: ((n - first.get(op, (0, 0.0))[0]) / updates, (cpu - first.get(op, (0, 0.0))[1]) * 1e3 / updates)
                for op, (n, cpu) in last.items() if n > first.get(op, (0, 0.0))[0]}


def count_handlers(dask_scheduler: Any) -> None:
    """Run on the scheduler: each handler (``handlers``: messages answered; ``stream_handlers``: the workers' and
    clients' batched streams) counted, and a plain function's CPU on the event loop's thread timed."""
    import functools
    import inspect

    counts: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    dask_scheduler.memtrain_handler_counts = counts

    def counted(op: str, function: Any) -> Any:
        if inspect.iscoroutinefunction(function):
            @functools.wraps(function)
            async def wrapped(*args: Any, **kwargs: Any) -> Any:
                counts[op][0] += 1
                return await function(*args, **kwargs)
        else:
            @functools.wraps(function)
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                started = time.thread_time()
                try:
                    return function(*args, **kwargs)
                finally:
                    counts[op][0] += 1
                    counts[op][1] += time.thread_time() - started
        wrapped.__signature__ = inspect.signature(function)  # Dask passes ``comm`` by the handler's signature
        return wrapped

    for table in (dask_scheduler.handlers, dask_scheduler.stream_handlers):
        for op, function in list(table.items()):
            table[op] = counted(op, function)


def handler_counts(dask_scheduler: Any) -> dict[str, tuple[int, float]]:
    return {op: (int(n), cpu) for op, (n, cpu) in dask_scheduler.memtrain_handler_counts.items()}


def plugin_messages(address: str) -> int:
    """The messages the BroadcastPlugin handled in the run (every handler: memtrain/cluster/broadcast.py)."""
    from distributed import Client

    with Client(address, timeout=30) as client:
        return sum(client.run_on_scheduler(lambda dask_scheduler: dict(
            getattr(dask_scheduler.plugins.get("memtrain-broadcast"), "calls", {}))).values())


class StepCount:
    """A timer (memtrain/train/timing.py) that counts rather than times: per step, how many of the update's
    tasks' sum it read from a chain's partial (section ``node_step``; 0: no node round); ``trace``: started after
    step ``window[0]``, stopped after step ``window[1]`` (counting from 1); ``counts``: marked after both."""

    def __init__(self, trace: NodeBytes | None = None, counts: HandlerCounts | None = None,
                 window: tuple[int, int] = (0, 0)) -> None:
        self.chained: list[int] = []
        self.trace, self.counts, self.window = trace, counts, window

    def timed(self, name: str, function: Any) -> Any:
        if name != "node_step":
            return function

        def counted(tasks: list, ranges: list) -> Any:
            self.chained.append(tasks[0].chained)
            result = function(tasks, ranges)
            if self.trace is not None and len(self.chained) == self.trace.window[0]:
                self.trace.start()
            if self.trace is not None and len(self.chained) == self.trace.window[1]:
                self.trace.stop()
            if self.counts is not None and len(self.chained) in self.window:
                self.counts.mark()
            return result

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
    parser.add_argument("--idle", type=float, default=0.0, help="only the idle scheduler's CPU per second, over "
                        "this many seconds per node count")
    parser.add_argument("--handlers", action="store_true", help="the scheduler's messages per update by handler "
                        "(see the module's docstring)")
    parser.add_argument("--bytes", action="store_true", help="each node's shared-filesystem bytes per update "
                        "(strace; see the module's docstring)")
    args = parser.parse_args()
    before = os.getloadavg()
    if args.idle:
        with tempfile.TemporaryDirectory(prefix="node-round-") as scratch:
            rates = {n: idle_scheduler(n, args.idle, Path(scratch) / str(n)) for n in map(int, args.nodes.split(","))}
        print(f"load average {' '.join(f'{v:.1f}' for v in before)} before, "
              f"{' '.join(f'{v:.1f}' for v in os.getloadavg())} after; the scheduler idle, {args.idle:g} s each")
        print("| nodes | scheduler CPU ms/s, idle |\n|---|---|")
        for nodes, rate in rates.items():
            print(f"| {nodes} | {rate:.1f} |")
        return
    cells: dict[tuple[str, str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="node-round-") as scratch:
        for repeat in range(args.repeats):
            for nodes in map(int, args.nodes.split(",")):
                for processes in map(int, args.processes.split(",")):
                    tasks = nodes * processes
                    rounds = (("nodes", nodes, processes), ("a worker per process", tasks, 0))
                    for label, workers, as_node in rounds[:1] if args.nodes_only else rounds:
                        row = one(int(args.params), workers, tasks, as_node, args.updates, args.warmup,
                                  Path(scratch) / f"{repeat}-{nodes}x{processes}-{label[:5]}", args.bytes,
                                  args.handlers)
                        cells.setdefault((f"{nodes} x {processes}", label, workers), []).append(row)
    after = os.getloadavg()
    print(f"load average {' '.join(f'{v:.1f}' for v in before)} before, {' '.join(f'{v:.1f}' for v in after)} after; "
          f"{int(args.params):,} parameters, updates {args.warmup + 1}-{args.updates - 1} counted, "
          f"{args.repeats} repeat(s): median (range)")
    shared = (" | shared FS read per node (x vector) | of it mapped | shared FS written per node (x vector) "
              "| read + written, the most of one node (x vector)" if args.bytes else "")
    print("| nodes x processes | round | Dask workers | scheduler CPU ms/update | scheduler CPU ms/s "
          f"| plugin messages/update | server CPU ms/update | updates/s | steps from the last partial{shared} |")
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" * 4 if args.bytes else ""))
    for (layout, label, workers), runs in cells.items():
        moved = (f" | {spread(runs, 'shared_read', 2)} | {spread(runs, 'shared_mapped', 2)} "
                 f"| {spread(runs, 'shared_written', 2)} | {spread(runs, 'shared_both', 2)}" if args.bytes else "")
        print(f"| {layout} | {label} | {workers} | {spread(runs, 'scheduler_cpu_ms')} "
              f"| {spread(runs, 'scheduler_cpu_ms_per_s')} | {spread(runs, 'messages')} "
              f"| {spread(runs, 'server_cpu_ms')} | {spread(runs, 'updates_per_s', 2)} "
              f"| {sum(r['node_steps'] for r in runs)} of {sum(r['steps'] for r in runs)}{moved} |")
    if args.handlers:
        print_handlers(cells)


def print_handlers(cells: dict[tuple[str, str, int], list[dict]]) -> None:
    """The scheduler's handlers per update, per cell (the first run's), the busiest first."""
    print("\n| nodes x processes | scheduler handler | messages/update | its CPU ms/update (plain functions) |")
    print("|---|---|---|---|")
    for (layout, _, _), runs in cells.items():
        for op, (count, cpu) in sorted(runs[0]["handlers"].items(), key=lambda item: -item[1][0]):
            print(f"| {layout} | {op} | {count:.2f} | {cpu:.2f} |")


def spread(runs: list[dict], key: str, digits: int = 1) -> str:
    values = sorted(run[key] for run in runs)
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} ({values[0]:.{digits}f}-{values[-1]:.{digits}f})"


if __name__ == "__main__":
    main()
