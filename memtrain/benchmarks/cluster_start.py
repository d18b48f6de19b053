"""``memtrain bench train --cluster local:N --startup``: how long ``memtrain train JOB --cluster local:N`` takes
to be ready, on the README's first job (jobs/examples/digits-mlp.toml on the shipped data/digits.csv).

Each run is a fresh ``memtrain train`` process (``python -m memtrain``, as a user's command), timed from just
before it is started to the moment its ``events.log`` shows

- ``workers listed``: the line ``Dask scheduler ...: workers ...`` (the cluster up, its workers registered and
  set up for memtrain), and
- ``rounds``: the placement's line ``rounds: ...``, written just before the first task is sent;

the log is polled every POLL_SECONDS, so a figure is late by at most that. The process is then stopped (SIGINT,
which memtrain answers by ending its run, exit 130) and waited for: the training itself is not timed. Beside
each cluster run, the same job without ``--cluster`` (``local``: its workers in this machine's pool) is timed
to its ``rounds`` line, interleaved, so that the load both met is visible: the difference is what the cluster
costs at start-up. The table gives the medians and ranges and the load average before and after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from memtrain.benchmarks.compare import Spread, interleaved
from memtrain.benchmarks.first_job import JOB, prepare_digits
from memtrain.errors import MemtrainError

POLL_SECONDS = 0.01
READY_SECONDS = 300.0  # a run that shows no rounds line by then is an error, not a figure
LISTED = "Dask scheduler "
ROUNDS = "rounds: "


def time_start(cluster: str, dataset: Path, run_dir: Path) -> dict[str, float | None]:
    """One ``memtrain train`` of the first job (with ``--cluster cluster`` unless empty): seconds from the
    process's start to the workers listed (None without a cluster) and to its rounds line."""
    command = [sys.executable, "-m", "memtrain", "train", str(JOB), "--overwrite", "--run-dir", str(run_dir),
               "--set", f'data.path="{dataset}"'] + (["--cluster", cluster] if cluster else [])
    events = run_dir / "events.log"
    seen: dict[str, float] = {}
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while ROUNDS not in seen:
            if process.poll() is not None:
                raise MemtrainError(f"memtrain train {'--cluster ' + cluster if cluster else ''} ended before "
                                    f"its rounds line (exit {process.returncode})",
                                    found=(process.stderr.read() if process.stderr else "")[-2000:])
            if time.perf_counter() - started > READY_SECONDS:
                raise MemtrainError(f"memtrain train showed no rounds line within {READY_SECONDS:g} s",
                                    found=events.read_text(encoding="utf-8")[-2000:] if events.exists() else "")
            text = events.read_text(encoding="utf-8") if events.exists() else ""
            now = time.perf_counter() - started
            for mark in (LISTED, ROUNDS):
                if mark not in seen and any(line.split(" ", 1)[-1].startswith(mark) for line in text.splitlines()):
                    seen[mark] = now
            time.sleep(POLL_SECONDS)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
    return {"listed": seen.get(LISTED), "rounds": seen[ROUNDS]}


def run_startup(cluster: str, repeats: int, scratch: Path) -> dict[str, Any]:
    """``repeats`` interleaved pairs (the cluster run, the local run) -> their start-up figures (JSON-able)."""
    dataset = prepare_digits(scratch)
    load_before = os.getloadavg()
    names = {"cluster": cluster, "local": ""}
    runs = interleaved(list(names), repeats,
                       lambda name, repeat: time_start(names[name], dataset, scratch / f"run-{name}-{repeat}"))
    return {"cluster": cluster, "repeats": repeats, "job": str(JOB.relative_to(JOB.parents[2])),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "listed_s": Spread.of([run["listed"] for run in runs["cluster"]]).as_dict(),
            "cluster_rounds_s": Spread.of([run["rounds"] for run in runs["cluster"]]).as_dict(),
            "local_rounds_s": Spread.of([run["rounds"] for run in runs["local"]]).as_dict()}


def print_startup(report: dict[str, Any]) -> None:
    """The table: median (range) seconds from the process's start, cluster and local, and the load."""
    def text(key: str) -> str:
        spread = report[key]
        return Spread(median=spread["median"], low=spread["low"], high=spread["high"],
                      runs=tuple(spread["runs"])).text(2)

    before, after = (" ".join(f"{x:.2f}" for x in report[key]) for key in ("loadavg_before", "loadavg_after"))
    print(f"memtrain train {report['job']} --cluster {report['cluster']}: seconds from the process's start, "
          f"median (range) of {report['repeats']} run(s), interleaved with the same job without --cluster")
    print(f"load average before {before}, after {after}")
    print("| run | to workers listed | to the first task (rounds line) |")
    print("|---|---|---|")
    print(f"| --cluster {report['cluster']} | {text('listed_s')} | {text('cluster_rounds_s')} |")
    print(f"| without --cluster | - | {text('local_rounds_s')} |")
    verdict = "met" if report["listed_s"]["median"] <= 5.0 else "NOT met"
    print(f"ready (workers listed) <= 5 s by median: {verdict}")
