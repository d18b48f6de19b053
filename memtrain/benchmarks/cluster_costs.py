"""A cluster run's cost per update, by who pays it: ``memtrain bench train --cluster ADDRESS --costs``.

For each size, one run of the benchmark's MLP (memtrain/benchmarks/synthetic.py) on the Dask cluster
``--cluster`` (``local:N``: N workers started here), with as many tasks per update as the cluster has
workers (``run_costs``'s ``tasks``: another count), trained by this process (the server). From the end
of the step of update ``--warmup`` (counted from 0) to the end of the last update's step -- the
gradients and the step of each update after it -- it counts:

- the bytes of the records the server sent and received (``Records``: memtrain's own, apart from Dask's);
- the server's CPU seconds (``time.process_time``: every thread of this process, so with ``local:N`` the
  Dask scheduler's too), and the part of them spent outside the main thread (the process's CPU clock
  less the main thread's: Dask's event loop -- the client's comms, and with ``local:N`` the scheduler --
  and its helpers; the main thread runs memtrain's loop: the plan, the Scheduler, the calls it hands on),
  and its bytes read and written: ``/proc/self/io``'s ``rchar``/``wchar`` (every read and write call,
  sockets included) and ``read_bytes``/``write_bytes`` (what reached storage);
- each Dask worker's bytes (asked of the workers themselves, ``Client.run``): the same ``/proc/self/io``
  counts, plus the bytes its tasks read through maps (``stream.MappedBytes``: ``rchar`` does not see them);
- the scheduler's CPU seconds (``Client.run_on_scheduler``; with ``local:N`` the scheduler runs in the
  server's process, and its CPU is in the server's);
- updates per second (wall time over the counted updates).

The snapshots' own messages (``Client.run`` to every worker, ``run_on_scheduler``: a few ms of the scheduler's
and the server's CPU each, more with more workers) are left out of the counts: the CPU clocks and the wall time are
read before a snapshot's messages and again after them, and the window runs from the first snapshot's "after" to
the last one's "before"; the scheduler's CPU is read from ``/proc`` when it runs on this machine (every thread's
``schedstat``, to the nanosecond: no message), else asked of it.

Byte counts are counts: they hold on a busy machine. CPU seconds and updates/s are not: the table says
the load average before and after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from memtrain.benchmarks.memtrain_run import job_for
from memtrain.benchmarks.problem import BATCH, Problem
from memtrain.benchmarks.synthetic import mlp_shape, write_dataset
from memtrain.train.timing import UNTIMED, Timer, timed

IO_FIELDS = ("rchar", "wchar", "read_bytes", "write_bytes")


def process_io() -> dict[str, int]:
    """This process's ``/proc/self/io`` counts (IO_FIELDS), plus ``mapped``: the bytes its tasks read through maps."""
    from memtrain.train.loops.stream import MappedBytes

    counts = {"mapped": MappedBytes.read}
    with open("/proc/self/io", encoding="ascii") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in IO_FIELDS:
                counts[key] = int(value)
    return counts


class Records:
    """Bytes of the records the server sent and received (task and result records, pickled as Dask carries
    them, framing left out): what memtrain itself puts on the wire, apart from Dask's own traffic (heartbeats,
    and with ``local:N`` the scheduler's, which runs in the server's process)."""

    bytes = 0


class CostsTimer:
    """The run's timing hook (memtrain/train/timing.py), used to count rather than to time: the pool the server
    opens (section ``cluster``), the records' sizes (``task out``, ``result in``, ``broadcast call``: the
    broadcast round's posts and counts, memtrain/cluster/broadcast.py) added to ``Records.bytes``, and a
    ``snapshot`` after the step of update ``warmup`` and of the last one (``step``). Every other section goes
    to ``others`` (a script's own timer; untouched by default); nothing of memtrain is patched."""

    def __init__(self, *, counted: tuple[int, int], others: Timer = UNTIMED):
        self.counted = counted  # the updates after whose step a snapshot is taken
        self.others = others  # the sections it does not count itself go to this timer (a script's own)
        self.pools: list[Any] = []
        self.marks: list[dict[str, Any]] = []
        self.scheduler_pid: int | None = None  # the scheduler's, when it runs on this machine in a process of its own

    def timed(self, name: str, function: Any) -> Any:
        wrapper = {"cluster": self._cluster, "task out": self._task_out, "result in": self._result_in,
                   "broadcast call": self._broadcast_call, "step": self._step}.get(name)
        return timed(self.others, name, function) if wrapper is None else wrapper(function)

    def _cluster(self, open_cluster: Any) -> Any:
        def opened(*args: Any, **kwargs: Any) -> Any:
            self.pools.append(open_cluster(*args, **kwargs))
            return self.pools[-1]
        return opened

    @staticmethod
    def _task_out(send: Any) -> Any:
        def sent(slot: Any, task: Any) -> None:
            Records.bytes += len(pickle.dumps(task, protocol=5))
            send(slot, task)
        return sent

    @staticmethod
    def _result_in(completed: Any) -> Any:
        def taken(item: Any) -> Any:
            if item.result is not None:
                Records.bytes += len(pickle.dumps(item.result, protocol=5))
            return completed(item)
        return taken

    @staticmethod
    def _broadcast_call(call: Any) -> Any:
        def called(handler: str, **arguments: Any) -> Any:
            Records.bytes += len(pickle.dumps((handler, arguments), protocol=5))
            answer = call(handler, **arguments)
            Records.bytes += len(pickle.dumps(answer, protocol=5))
            return answer
        return called

    def _step(self, step: Any) -> Any:
        def stepped(*args: Any, **kwargs: Any) -> Any:
            result = step(*args, **kwargs)
            update = args[0] if args else None  # the cluster's SlicedParticipant.step(update); the rounds' step
            if getattr(update, "batch", None) in self.counted and self.pools:  # is keyword-only: not counted
                if not self.marks:
                    self.scheduler_pid = local_scheduler(self.pools[-1])
                self.marks.append(snapshot(self.pools[-1], self.scheduler_pid))
            return result
        return stepped


def other_threads_cpu() -> float:
    """CPU seconds of this process's threads other than the main one (Dask's event loop and helpers), threads
    that ended included: the process's CPU time less the main thread's (both clocks to the nanosecond)."""
    main = time.pthread_getcpuclockid(threading.main_thread().ident)  # type: ignore[arg-type]
    return time.process_time() - time.clock_gettime(main)


def process_cpu() -> tuple[int, float, str]:
    """This process's pid, CPU seconds and host (run on the scheduler: what the broadcast round costs it)."""
    return os.getpid(), time.process_time(), socket.gethostname()


def local_scheduler(pool: Any) -> int | None:
    """The scheduler's pid when it runs on this machine in a process of its own (its CPU read from ``/proc``)."""
    pid, _, host = pool.client.run_on_scheduler(process_cpu)
    return pid if host == socket.gethostname() and pid != os.getpid() and threads_cpu(pid) is not None else None


def threads_cpu(pid: int) -> float | None:
    """CPU seconds of process ``pid``'s live threads (``/proc/PID/task/*/schedstat``: ns); None if unreadable."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                total += int((task / "schedstat").read_text().split()[0])
    except OSError:
        return None
    return total / 1e9


def clocks(scheduler_pid: int | None) -> dict[str, Any]:
    """The wall and CPU clocks a window is measured by (no message: the scheduler's from ``/proc``, or None)."""
    return {"wall": time.perf_counter(), "cpu": time.process_time(), "loop_cpu": other_threads_cpu(),
            "scheduler_local": threads_cpu(scheduler_pid) if scheduler_pid else None}


def snapshot(pool: Any, scheduler_pid: int | None = None) -> dict[str, Any]:
    """The counts now; the clocks read before the snapshot's messages (its keys) and after them (``after``)."""
    before = clocks(scheduler_pid)
    server = process_io() | {"records": Records.bytes}
    found = {"server": server, "workers": pool.client.run(process_io),
             "scheduler": pool.client.run_on_scheduler(process_cpu)[:2]}
    return before | found | {"after": clocks(scheduler_pid)}


def measure(params: int, cluster: str, updates: int, warmup: int, scratch: Path, tasks: int | None = None,
            others: Timer = UNTIMED) -> dict[str, Any]:
    """One run of ``params`` parameters on ``cluster``: the counts per update (see the module's docstring);
    ``tasks`` per update (default: one per worker); the sections it does not count handed to ``others``."""
    from memtrain.train.server import server

    shape = mlp_shape(params)
    data = scratch / f"data-{shape.params}"
    if not data.exists():
        write_dataset(data, updates * BATCH, BATCH, features=shape.features, classes=shape.classes)
    # counted: the gradients and the step of each update after ``warmup``
    timer = CostsTimer(counted=(warmup, updates - 1), others=others)
    count = int(cluster.split(":")[1]) if cluster.startswith("local:") else len(cluster_workers(cluster))
    problem = Problem(str(data), shape.hidden, updates, workers=tasks or count, epochs=1)
    run_dir = scratch / f"run-{shape.params}-{count}"
    try:
        server.train(steady(job_for(problem, run_dir, "run", count, cluster=cluster)), quiet=True, timer=timer)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return per_update(timer.marks, updates - 1 - warmup, shape.params, count)


def steady(job: Any) -> Any:
    """``job`` without the straggler rule (``train.backup_ratio = 0``): the counts are the round's own, never a
    healthy worker set aside by a busy machine's jitter, whose closed and reopened rounds are the rule's cost,
    not the round's (docs/cluster.md, "What a straggler costs")."""
    return dataclasses.replace(job, train=dataclasses.replace(job.train, backup_ratio=0.0))


def cluster_workers(cluster: str) -> list[str]:
    """The workers of the scheduler at ``cluster`` (tasks per update: one per worker)."""
    from memtrain.cluster.address import parse_cluster
    from memtrain.cluster.connect import connected

    with connected(parse_cluster(cluster, where="--cluster")) as client:
        return sorted(client.scheduler_info()["workers"])


def per_update(marks: list[dict[str, Any]], steps: int, params: int, workers: int) -> dict[str, Any]:
    first, last = marks[0], marks[-1]
    start = first.get("after", first)  # the window: after the first snapshot's messages, before the last one's
    local = start.get("scheduler_local") is not None and last.get("scheduler_local") is not None

    def delta(before: dict[str, int], after: dict[str, int], key: str) -> float:
        return (after.get(key, 0) - before.get(key, 0)) / steps

    server = {key: delta(first["server"], last["server"], key) for key in (*IO_FIELDS, "records")}
    each = []
    for address, after in sorted(last["workers"].items()):
        before = first["workers"].get(address, {})
        each.append({"address": address, "read": delta(before, after, "rchar") + delta(before, after, "mapped"),
                     "written": delta(before, after, "wchar"), "read_bytes": delta(before, after, "read_bytes"),
                     "write_bytes": delta(before, after, "write_bytes")})
    return {"params": params, "workers": workers, "vector_bytes": params * 4,
            "server_cpu_ms": (last["cpu"] - start["cpu"]) / steps * 1e3,
            "server_loop_cpu_ms": (last["loop_cpu"] - start["loop_cpu"]) / steps * 1e3,
            # None when the scheduler runs in the server's process (local:N): its CPU is in the server's then
            "scheduler_cpu_ms": None if last["scheduler"][0] == os.getpid() else
            (last["scheduler_local"] - start["scheduler_local"]) / steps * 1e3 if local else
            (last["scheduler"][1] - first["scheduler"][1]) / steps * 1e3,
            "server": server, "each_worker": each,
            "updates_per_s": steps / (last["wall"] - start["wall"])}


def run_costs(sizes: list[int], cluster: str, updates: int, warmup: int, scratch: Path, tasks: int | None = None
              ) -> dict[str, Any]:
    load_before = os.getloadavg()
    rows = [measure(size, cluster, updates, warmup, scratch, tasks) for size in sizes]
    return {"cluster": cluster, "updates": updates, "warmup": warmup, "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(), "rows": rows}


COST_COLUMNS = ("params", "workers", "server CPU ms", "of it, Dask's threads ms", "scheduler CPU ms",
                "server records KiB", "server read KiB", "server written KiB", "server storage r/w KiB",
                "worker read (x vector)", "worker written (x vector)", "worker storage r/w MiB", "updates/s")


def print_costs(report: dict[str, Any]) -> None:
    """The table: per update, the server's CPU (all of it; of it, Dask's threads) and bytes (KiB), each worker's
    bytes (the most of any worker, as a multiple of the parameter vector), updates/s.

    A Markdown table (to paste into docs/cluster.md) where it fits: a pipe, a log, a wide terminal; in a
    terminal narrower than it, the same cells laid out to fit (``render.print_table``), never broken."""
    from memtrain.inspection.render import fits_width, make_console, print_table, table

    before = " ".join(f"{v:.1f}" for v in report["loadavg_before"])
    after = " ".join(f"{v:.1f}" for v in report["loadavg_after"])
    title = (f"cluster {report['cluster']}: per update, over updates {report['warmup'] + 1}-{report['updates'] - 1} "
             f"(load average {before} before, {after} after)")
    rows = [_cost_cells(row) for row in report["rows"]]
    lines = ["| " + " | ".join(cells) + " |" for cells in [list(COST_COLUMNS), *rows]]
    console = make_console()
    if fits_width(console) and max(len(line) for line in lines) > console.width:
        print_table(console, table(title, COST_COLUMNS, rows, right=COST_COLUMNS[2:], keys=2))
        return
    print(title)
    print(lines[0])
    print("|" + "---|" * len(COST_COLUMNS))
    for line in lines[1:]:
        print(line)


def _cost_cells(row: dict[str, Any]) -> list[str]:
    server, each, vector = row["server"], row["each_worker"], row["vector_bytes"]
    read = max(w["read"] for w in each)
    written = max(w["written"] for w in each)
    storage = (max(w["read_bytes"] for w in each) / 2**20, max(w["write_bytes"] for w in each) / 2**20)
    kib = {key: value / 1024 for key, value in server.items()}
    scheduler = "in the server" if row["scheduler_cpu_ms"] is None else f"{row['scheduler_cpu_ms']:.1f}"
    return [f"{row['params']:,}", f"{row['workers']}", f"{row['server_cpu_ms']:.1f}",
            f"{row['server_loop_cpu_ms']:.1f}", scheduler, f"{kib['records']:.2f}", f"{kib['rchar']:.1f}",
            f"{kib['wchar']:.1f}", f"{kib['read_bytes']:.0f} / {kib['write_bytes']:.0f}",
            f"{read / 2**20:.1f} MiB ({read / vector:.2f})", f"{written / 2**20:.1f} MiB ({written / vector:.2f})",
            f"{storage[0]:.1f} / {storage[1]:.1f}", f"{row['updates_per_s']:.2f}"]
