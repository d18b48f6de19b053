"""A job -> its run directory: lock, resolved job, logs, and the exchange area for gradient files.

The run lock is an ``flock`` on ``run.lock``: the kernel drops it when its owner dies, so a crashed run
never blocks the next one. The exchange area holds gradient files and the optimizer's double buffers;
its name carries the owner's pid, so that leftovers of dead runs can be swept without touching live runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from memtrain.config import Job
from memtrain.errors import InputError, MemtrainError
from memtrain.files import LockHeld, append_jsonl, take_pid_lock
from memtrain.layout import (
    RUN_EVENTS,
    RUN_JOB,
    RUN_LINEAGE,
    RUN_LOCK,
    RUN_METRICS,
    WEIGHTS_DIR,
    exchange_dir_name,
    parse_exchange_owner,
    tmp_owner_pid,
)

SHM = Path("/dev/shm")
# Probe size for choosing the exchange filesystem: big enough to see page-fault and copy costs, small
# enough to take a few milliseconds. On a machine like ours ext4's page cache beat /dev/shm.
PROBE_BYTES = 16 << 20


@dataclass
class RunDir:
    path: Path
    exchange: Path
    lock: IO[str]

    def event(self, text: str) -> None:
        log_event(self.path, text)

    def metric(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / RUN_METRICS, record)

    def lineage(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / RUN_LINEAGE, record)

    def close(self) -> None:
        shutil.rmtree(self.exchange, ignore_errors=True)
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        self.lock.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_lock(path: Path) -> IO[str]:
    try:
        return take_pid_lock(path / RUN_LOCK)
    except LockHeld as held:
        raise InputError("another memtrain train is using this run directory", path=path,
                         found=f"lock held by pid {held.owner}",
                         hint="wait for it to finish or choose another run.dir") from None


def sweep_leftovers(run_dir: Path, exchange_parents: list[Path]) -> list[Path]:
    """Remove temporary files in the run (we hold its lock) and exchange dirs whose owner is dead."""
    removed = []
    for folder in (run_dir / WEIGHTS_DIR, run_dir):
        if folder.is_dir():
            for name in os.listdir(folder):
                if tmp_owner_pid(name) is not None and (folder / name).is_file():
                    (folder / name).unlink(missing_ok=True)
                    removed.append(folder / name)
    for parent in exchange_parents:
        with contextlib.suppress(OSError):
            for name in os.listdir(parent):
                owner = parse_exchange_owner(name)
                if owner is not None and not pid_alive(owner):
                    shutil.rmtree(parent / name, ignore_errors=True)
                    removed.append(parent / name)
    return removed


def exchange_candidates(job: Job) -> list[Path]:
    run_parent = job.run.dir
    choice = job.run.exchange
    if choice == "shm":
        return [SHM]
    if choice == "run":
        return [run_parent]
    if choice != "auto":
        return [Path(choice)]
    return [SHM, run_parent] if SHM.is_dir() and os.access(SHM, os.W_OK) else [run_parent]


def probe_write_seconds(folder: Path) -> float:
    """Time to write, map and read back a probe file in ``folder`` (best of three)."""
    data = np.ones(PROBE_BYTES // 4, dtype=np.float32)
    best = float("inf")
    for _ in range(3):
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-") as handle:
            start = time.perf_counter()
            handle.write(memoryview(data).cast("B"))
            handle.flush()
            float(np.fromfile(handle.name, dtype=np.float32).sum())
            best = min(best, time.perf_counter() - start)
    return best


def choose_exchange(job: Job, need_bytes: int, log: Any) -> Path:
    """Pick the exchange parent: among the candidates with room for ``need_bytes``, the fastest measured."""
    roomy = []
    for folder in exchange_candidates(job):
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
        if free >= need_bytes:
            roomy.append(folder)
        else:
            log(f"exchange: {folder} has {free >> 20} MiB free, needs {need_bytes >> 20} MiB; not used")
    if not roomy:
        raise MemtrainError("no room for the exchange area (gradient files and optimizer state)",
                            expected=f"{need_bytes >> 20} MiB free", found=", ".join(
                                f"{f}: {shutil.disk_usage(f).free >> 20} MiB" for f in exchange_candidates(job)),
                            hint="free space, lower train.tasks_per_update, or set run.exchange to a roomier dir")
    if len(roomy) == 1:
        return roomy[0]
    if need_bytes < PROBE_BYTES:  # a few small files: where they live cannot matter as much as the probe costs
        log(f"exchange: {roomy[0]} (no probe: the exchange needs {need_bytes >> 10} KiB)")
        return roomy[0]
    timings = {}
    for folder in roomy:
        try:
            timings[folder] = probe_write_seconds(folder)
        except OSError as exc:  # e.g. room for the exchange but not for the probe: not the faster one anyway
            log(f"exchange probe failed in {folder}: {exc.strerror}; not used")
    if not timings:
        return roomy[-1]
    log("exchange probe: " + ", ".join(f"{f} {t * 1e3:.1f} ms" for f, t in timings.items()))
    return min(timings, key=lambda folder: timings[folder])


def open_run_dir(job: Job, *, resume: bool, need_exchange: int, need_run: int, overwrite: bool = False) -> RunDir:
    """Create or reopen the run directory, take its lock, sweep leftovers and set up the exchange area."""
    path = job.run.dir
    existing = path.exists() and any(path.iterdir())
    if existing and not resume and not overwrite:
        raise InputError("the run directory already exists and is not empty", path=path,
                         hint=f"resume it with `memtrain train --resume {path}`, replace it with --overwrite, "
                              "or choose another run.dir")
    if existing and overwrite and not (path / RUN_JOB).exists():
        raise InputError("refusing to overwrite a directory that is not a memtrain run (no job.json)", path=path)
    path.mkdir(parents=True, exist_ok=True)
    lock = acquire_lock(path)
    try:
        if existing and overwrite:
            _empty_run_dir(path)
        (path / WEIGHTS_DIR).mkdir(exist_ok=True)
        free = shutil.disk_usage(path).free
        if free < need_run:
            raise MemtrainError("not enough free space for the run's weight versions and checkpoints", path=path,
                                expected=f"{need_run >> 20} MiB", found=f"{free >> 20} MiB free")
        candidates = exchange_candidates(job)
        sweep_leftovers(path, candidates)
        parent = choose_exchange(job, need_exchange, lambda text: log_event(path, text))
        exchange = parent / exchange_dir_name(uuid.uuid4().hex[:8], os.getpid())
        exchange.mkdir()
    except BaseException:
        lock.close()
        raise
    run = RunDir(path, exchange, lock)
    run.event(f"exchange area: {exchange}")
    return run


def _empty_run_dir(path: Path) -> None:
    for entry in path.iterdir():
        if entry.name == RUN_LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def log_event(path: Path, text: str) -> None:
    """One timestamped line in the run's event log."""
    with open(path / RUN_EVENTS, "a", encoding="utf-8") as handle:
        handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")
