"""A process id -> the peak memory of it and all its descendants, sampled from /proc while they run.

``VmHWM`` is the kernel's own high-water mark of a process's resident set, so sampling misses nothing
of it as long as each process is seen once before it exits; ``RssAnon`` has no high-water mark and is
the largest value sampled. The sum over processes counts shared pages (mapped files, shared memory)
once per process that touches them, as ``ps``/``top`` do; the PSS total (sampled: a short peak between
two samples can be missed) splits them instead, counting each once.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrain.errors import MemtrainError

# Reading three status files costs ~0.1 ms; listing the whole /proc tree ~3 ms, so it is done only
# every RESCAN_EVERY samples (new processes are found within half a second, long before they peak).
SAMPLE_SECONDS = 0.05
RESCAN_EVERY = 10


@dataclass
class Peaks:
    hwm_kib: dict[int, int] = field(default_factory=dict)
    anon_kib: dict[int, int] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    pss_total_kib: int = 0  # the largest sum of PSS over the tree seen in one sample

    def total_mib(self) -> float:
        return sum(self.hwm_kib.values()) / 1024

    def pss_mib(self) -> float:
        return self.pss_total_kib / 1024

    def per_process(self) -> list[dict[str, object]]:
        return [{"pid": pid, "name": self.names.get(pid, ""), "peak_rss_mib": self.hwm_kib[pid] / 1024,
                 "peak_anon_mib": self.anon_kib.get(pid, 0) / 1024} for pid in sorted(self.hwm_kib)]


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from the parent ids in /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="utf-8") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            return dict(line.split(":", 1) for line in handle if ":" in line)
    except OSError:
        return {}


def pss_kib(pid: int) -> int:
    """Proportional set size: each shared page (a mapped file, torch's libraries) split among the processes
    that map it, so a sum over processes counts it once -- unlike VmHWM."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def sample(pids: list[int], peaks: Peaks) -> None:
    peaks.pss_total_kib = max(peaks.pss_total_kib, sum(pss_kib(pid) for pid in pids))
    for pid in pids:
        fields = status(pid)
        if "VmHWM" not in fields:
            continue
        peaks.names[pid] = fields.get("Name", "").strip()
        peaks.hwm_kib[pid] = max(peaks.hwm_kib.get(pid, 0), int(fields["VmHWM"].split()[0]))
        peaks.anon_kib[pid] = max(peaks.anon_kib.get(pid, 0), int(fields.get("RssAnon", "0 kB").split()[0]))


class Sampler:
    """Samples a process tree in a background thread until stopped."""

    def __init__(self, root: int):
        self.root = root
        self.peaks = Peaks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        pids, count = [self.root], 0
        while not self._stop.wait(SAMPLE_SECONDS):
            if count % RESCAN_EVERY == 0:
                pids = descendants(self.root)
            sample(pids, self.peaks)
            count += 1


def run_sampled(module: str, spec: dict[str, Any], *, what: str, timeout: float,
                env: dict[str, str] | None = None,
                alongside: Callable[[int], Callable[[], None]] | None = None,
                command: list[str] | None = None, cwd: Path | None = None) -> tuple[dict[str, Any], int, Peaks]:
    """``python -m module SPEC_JSON`` in a fresh process, its tree's memory sampled from here: its last line
    of output (JSON), its pid and the peaks. MemtrainError naming ``what`` if it fails or outlives ``timeout``.
    The result also holds ``cpu_seconds``: the CPU time the process and its waited-for descendants used.
    ``alongside(pid)``, if given, starts something that acts on the process while it runs (an outside
    straggler) and returns what ends it. ``command``: instead of ``python -m module``, e.g. a script run
    against another checkout (``bench train --against``), in the working directory ``cwd``."""
    argv = command if command is not None else [sys.executable, "-m", module]
    cpu_before = children_cpu_seconds()
    process = subprocess.Popen([*argv, json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=cwd)
    end = alongside(process.pid) if alongside is not None else None
    with Sampler(process.pid) as sampler:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise MemtrainError(f"{what} took longer than {timeout:g} s") from None
        finally:
            if end is not None:
                end()
    if process.returncode != 0 or not out.strip():
        raise MemtrainError(f"{what} failed (exit code {process.returncode})", found=err.strip()[-2000:])
    result = json.loads(out.strip().splitlines()[-1])
    result["cpu_seconds"] = children_cpu_seconds() - cpu_before
    return result, process.pid, sampler.peaks


def children_cpu_seconds() -> float:
    """User + system CPU time of this process's children that have exited and been waited for, and of their
    own waited-for descendants (a run's workers, DDP's ranks): the delta around one run is that run's CPU."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
