"""A real Dask cluster for tests: a ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1 only.

Each process is started in its own session (process group) from its own working directory, with
``--no-dashboard`` and every listening socket on 127.0.0.1, each worker with its own
``--local-directory``; every wait is bounded and ``close`` ends every group it started (SIGTERM, then
SIGKILL), so a failing test leaves no orphans.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

START_SECONDS = 60.0  # a scheduler or worker that has not registered by then fails the test
STOP_SECONDS = 10.0
DASK = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
DASK_WORKER = [sys.executable, "-m", "distributed.cli.dask_worker"]
# Without a dashboard Dask still serves health and metrics over HTTP, by default on 0.0.0.0:8787 (scheduler)
# and on 0.0.0.0 (workers): keep them on loopback, on free ports.
LOOPBACK_HTTP = ("--dashboard-address", "127.0.0.1:0")
REPO = Path(__file__).resolve().parent.parent  # on the workers' path: tasks of the tests live in tests/


@dataclass
class Started:
    name: str
    process: subprocess.Popen
    log: Path


@dataclass
class DaskProcesses:
    root: Path
    address: str = ""
    started: list[Started] = field(default_factory=list)

    def start_scheduler(self) -> str:
        folder = self.root / "scheduler"
        folder.mkdir(parents=True)
        info = folder / "scheduler.json"
        self._spawn("scheduler", [*DASK, "--host", "127.0.0.1", "--port", "0", "--no-dashboard", *LOOPBACK_HTTP,
                                  "--scheduler-file", str(info)], folder)
        deadline = time.monotonic() + START_SECONDS
        while not info.exists() or not info.read_text().strip().endswith("}"):
            self._check_alive("scheduler", deadline)
            time.sleep(0.05)
        self.address = json.loads(info.read_text())["address"]
        return self.address

    def start_worker(self, name: str, *, memory_limit: str = "0", prefix: tuple[str, ...] = (),
                     nanny: bool = True, env: dict[str, str] | None = None) -> Started:
        """A worker process (under a nanny unless ``nanny`` is False), from ``root/name`` as working directory.

        ``prefix`` runs the worker through another command, e.g. ``unshare --mount ...`` for a worker
        whose view of the filesystem differs from the server's.
        """
        folder = self.root / name
        (folder / "local").mkdir(parents=True)
        command = [*prefix, *DASK_WORKER, self.address, "--host", "127.0.0.1", "--no-dashboard", "--nthreads", "1",
                   "--name", name, "--local-directory", str(folder / "local"), "--memory-limit", memory_limit,
                   *LOOPBACK_HTTP, "--nanny" if nanny else "--no-nanny"]
        return self._spawn(name, command, folder, env or {})

    def _spawn(self, name: str, command: list[str], folder: Path, env: dict[str, str] | None = None) -> Started:
        log = folder / "log.txt"
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        with open(log, "wb") as out:
            process = subprocess.Popen(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       env={**os.environ, **(env or {}), "PYTHONPATH": path})
        started = Started(name, process, log)
        self.started.append(started)
        return started

    def _check_alive(self, name: str, deadline: float) -> None:
        for item in self.started:
            if item.name == name and item.process.poll() is not None:
                raise RuntimeError(f"dask {name} exited with {item.process.returncode}:\n{item.log.read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"dask {name} did not start within {START_SECONDS:g} s")

    def wait_for_workers(self, client: object, names: set[str], timeout: float = START_SECONDS) -> dict[str, dict]:
        """Wait until the workers called ``names`` are registered; returns their scheduler records."""
        deadline = time.monotonic() + timeout
        while True:
            workers = client.scheduler_info()["workers"]  # type: ignore[attr-defined]
            found = {info["name"]: {**info, "address": address} for address, info in workers.items()}
            if names <= set(found):
                pids = client.run(os.getpid, workers=[found[n]["address"] for n in names])  # type: ignore[attr-defined]
                return {name: {**found[name], "pid": pids[found[name]["address"]]} for name in names}
            for name in names - set(found):
                self._check_alive(name, deadline)
            time.sleep(0.1)

    def stop(self, started: Started) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(started.process.pid, signal.SIGTERM)
        try:
            started.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(started.process.pid, signal.SIGKILL)
            started.process.wait(STOP_SECONDS)
        with contextlib.suppress(ProcessLookupError):  # a nanny's worker left behind in the group
            os.killpg(started.process.pid, signal.SIGKILL)

    def kill(self, started: Started) -> None:
        """SIGKILL the process group: no goodbye to the scheduler or the workers."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(started.process.pid, signal.SIGKILL)
        started.process.wait(STOP_SECONDS)

    def close(self) -> None:
        for started in reversed(self.started):
            self.stop(started)
        self.started.clear()


def set_environ(values: dict[str, str]) -> None:
    """Run on a Dask worker (``client.run(set_environ, {...}, workers=[...])``): variables into its environment."""
    os.environ.update(values)
