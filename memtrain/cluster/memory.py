"""Dask's worker memory monitor -> one that counts a worker's own (anonymous) memory, not mapped file pages.

Dask pauses a worker above ``distributed.worker.memory.pause`` (80 %) of its memory limit and its nanny
restarts it above ``terminate`` (95 %), both measured as the process's resident set size. A memtrain
worker maps dataset shards and weight files read-only: every page it touches counts in its RSS as a
file page, which the kernel drops under pressure and rereads from the file -- it is page cache, not
memory the worker holds. A worker scanning a shard larger than its limit would be paused or killed
while using a few hundred MB of its own. These plugins make both checks measure the anonymous pages
(``RssAnon``: heap, stacks, private copies) instead, which is the memory a worker can run out of; a
worker that really leaks still gets paused and restarted. Registered on the scheduler, they also reach
workers that join later.
"""

from __future__ import annotations

import sys
from typing import Any

from distributed.diagnostics.plugin import NannyPlugin, WorkerPlugin

PLUGIN_NAME = "memtrain-memory"


def anonymous_bytes(pid: int) -> int | None:
    """Resident anonymous memory of process ``pid`` (``RssAnon`` in /proc), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class WorkerMemory(WorkerPlugin):
    """Pause (and spill) decisions of the worker measure its anonymous memory.

    ``SystemMonitor.get_process_memory`` is the one function Dask's worker memory manager reads the
    process size from (Dask keeps it a one-liner so that it can be replaced).
    """

    name = PLUGIN_NAME
    idempotent = True

    def setup(self, worker: Any) -> None:
        monitor = worker.monitor
        rss = monitor.get_process_memory
        pid = monitor.proc.pid

        def own_memory() -> int:
            anonymous = anonymous_bytes(pid)
            return rss() if anonymous is None else anonymous

        monitor.get_process_memory = own_memory


class NannyMemory(NannyPlugin):
    """The nanny's restart check runs only when the worker's anonymous memory is over the terminate fraction.

    Dask's check itself measures RSS, which is never below the anonymous memory, so it then restarts
    the worker exactly as before; below the fraction (whatever the mapped pages) it is not consulted.
    """

    name = PLUGIN_NAME
    idempotent = True

    def setup(self, nanny: Any) -> None:
        manager = nanny.memory_manager
        callback = nanny.periodic_callbacks.get("memory_monitor")
        if callback is None or not manager.memory_limit:
            return  # no limit, or the check is off: nothing counts pages
        check = callback.callback

        def gated() -> None:
            process = nanny.process.process if nanny.process is not None else None
            if process is None or process.pid is None:
                return
            anonymous = anonymous_bytes(process.pid)
            if anonymous is None or anonymous / manager.memory_limit > manager.memory_terminate_fraction:
                check()

        callback.callback = gated


def register(client: Any) -> None:
    """Install both plugins on every present and future worker of the client's cluster."""
    client.register_plugin(NannyMemory())
    client.register_plugin(WorkerMemory())
