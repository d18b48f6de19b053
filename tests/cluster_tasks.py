"""Functions the cluster tests run on Dask workers (importable there as ``tests.cluster_tasks``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from distributed import get_worker

from memtrain.cluster.memory import anonymous_bytes
from memtrain.train.loops.maps import MapCache

CHUNK = 50 << 20


def scan(path: str, size: int) -> dict[str, object]:
    """Touch every page of ``path`` through a kept read-only map, noting the worker's state as it goes."""
    worker = get_worker()
    maps = MapCache()
    data = maps.get(Path(path), (size,), np.uint8)
    statuses, file_bytes = set(), 0
    for start in range(0, size, CHUNK):
        int(data[start:start + CHUNK:4096].sum())
        time.sleep(0.12)  # the monitors run every 100 ms: give them a look at each step
        statuses.add(worker.status.name)
        status = Path(f"/proc/{os.getpid()}/status").read_text()
        file_bytes = max(file_bytes, int(status.split("RssFile:")[1].split()[0]) * 1024)
    time.sleep(0.5)
    statuses.add(worker.status.name)
    return {"statuses": sorted(statuses), "pid": os.getpid(), "file_bytes": file_bytes,
            "anonymous": anonymous_bytes(os.getpid())}




def open_files_under(folder: str) -> list[str]:
    """The files under ``folder`` this process holds open (descriptors), on Linux."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder.rstrip("/") + "/"):
            found.append(target)
    return found


START_SLEEP = 2.0


def slow_worker_state(setup: object, alive: object) -> object:
    """``WorkerState`` (train/worker/worker.py) made slowly, as a worker opening a large dataset on a busy node: noting
    in the run directory when this process began and ended making it, so that a test sees whether the workers of a
    pool started side by side."""
    from memtrain.train.worker.worker import WorkerState

    began = time.time()
    time.sleep(START_SLEEP)
    state = WorkerState(setup, alive=alive)
    Path(setup.run_dir, f"started-{os.getpid()}.txt").write_text(f"{began} {time.time()}")  # type: ignore[attr-defined]
    return state
