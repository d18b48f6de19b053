"""This process's memory limits (cgroup v2 or v1, rlimits, the machine's RAM) -> the words for a worker the kernel
killed (SIGKILL, the OOM killer's signal): which limit applies and whether the kernel counted an OOM kill.

Workers are spawned by the server, so they share its cgroup and inherit its rlimits: the server reads them
for them. A SIGKILL is put down to the OOM killer only when the cgroup's counter of OOM kills rose (or
cannot be read: then both causes are named). Tests only: ``MEMTRAIN_WORKER_DATA_LIMIT`` makes each worker
lower its own RLIMIT_DATA, ``MEMTRAIN_TEST_OOM_EVENTS`` names a file that stands for the counter.
"""

from __future__ import annotations

import os
import resource
import signal
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a huge page-rounded number (9223372036854771712)
WORKER_DATA_LIMIT_ENV = "MEMTRAIN_WORKER_DATA_LIMIT"  # MiB a worker may allocate beyond what it holds at start
OOM_EVENTS_ENV = "MEMTRAIN_TEST_OOM_EVENTS"  # a file that stands for the cgroup's OOM kill counter


@dataclass(frozen=True, kw_only=True)
class MemoryLimit:
    size: int  # bytes
    source: str  # what and where, in words: "the cgroup v2 limit /sys/fs/cgroup/.../memory.max"


def memory_limits() -> list[MemoryLimit]:
    """Every memory limit that applies to this process (and so to the workers it spawns), tightest first."""
    found = [*_cgroup_limits(), *_rlimits()]
    ram = _machine_ram()
    if ram is not None:
        found.append(MemoryLimit(size=ram, source="the machine's RAM, MemTotal in /proc/meminfo"))
    return sorted(found, key=lambda limit: limit.size)


def oom_kills() -> int | None:
    """OOM kills the kernel has counted in this process's memory cgroup (and below), or None if unknown.

    ``MEMTRAIN_TEST_OOM_EVENTS`` (tests only) names a file read instead, in the same ``oom_kill N`` form."""
    test_file = os.environ.get(OOM_EVENTS_ENV)
    sources = [(Path(test_file), "oom_kill")] if test_file else \
        _cgroup_files(("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill"))
    for path, key in sources:
        try:
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def sigkilled(exitcode: int | None) -> bool:
    """An exit by SIGKILL: the kernel's OOM killer's signal (or anyone's ``kill -9``)."""
    return exitcode == -signal.SIGKILL


def oom_killed(oom_before: int | None) -> bool | None:
    """Whether the kernel counted an OOM kill in this run's cgroup since ``oom_before``; None if it cannot tell."""
    now = oom_kills()
    return None if oom_before is None or now is None else now > oom_before


def limit_words() -> str:
    """``the memory limit that applies is 1.5 GiB, the cgroup v1 limit ... (then 23.5 GiB, the machine's RAM)``."""
    limits = memory_limits()
    if not limits:
        return "no memory limit could be read"
    others = "; ".join(f"{size_text(limit.size)}, {limit.source}" for limit in limits[1:])
    return (f"the memory limit that applies is {size_text(limits[0].size)}, {limits[0].source}"
            + (f" (then {others})" if others else ""))


def apply_test_limit() -> None:
    """In a worker: lower RLIMIT_DATA to what it holds now plus ``MEMTRAIN_WORKER_DATA_LIMIT`` MiB (tests)."""
    extra = os.environ.get(WORKER_DATA_LIMIT_ENV)
    if not extra:
        return
    held = _status_bytes("VmData") or 0
    limit = held + int(float(extra) * (1 << 20))
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _cgroup_limits() -> list[MemoryLimit]:
    found = []
    for path, _ in _cgroup_files(("memory.max", ""), ("memory.limit_in_bytes", "")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < UNLIMITED:
            version = "v2" if path.name == "memory.max" else "v1"
            found.append(MemoryLimit(size=int(text), source=f"the cgroup {version} limit {path}"))
    return found


def _cgroup_files(v2: tuple[str, str], v1: tuple[str, str]) -> list[tuple[Path, str]]:
    """The (file, key) pairs to read for this process's memory cgroup and its ancestors, nearest first."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # cgroup v2 (the unified hierarchy)
            base, (name, key) = CGROUP_ROOT, v2
            if not (CGROUP_ROOT / "cgroup.controllers").exists():
                base = CGROUP_ROOT / "unified"
        elif "memory" in controllers.split(","):
            base, (name, key) = CGROUP_ROOT / "memory", v1
        else:
            continue
        folder = base / group.lstrip("/")
        while True:
            if (folder / name).exists():
                found.append((folder / name, key))
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return found


def _rlimits() -> list[MemoryLimit]:
    found = []
    extra = os.environ.get(WORKER_DATA_LIMIT_ENV)
    if extra:
        found.append(MemoryLimit(size=int(float(extra) * (1 << 20)), source="RLIMIT_DATA of each worker above what "
                                 f"it held at start ({WORKER_DATA_LIMIT_ENV})"))
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        soft, _ = resource.getrlimit(getattr(resource, name))
        if soft != resource.RLIM_INFINITY:
            found.append(MemoryLimit(size=soft, source=f"{name} of the server, which its workers inherit"))
    return found


def _machine_ram() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _status_bytes(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def size_text(size: int) -> str:
    """``80.0 GiB``, ``1.5 MiB``, ``12 KiB``: a figure a person can compare with ``df -h``."""
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{-(-size // 1024)} KiB"
