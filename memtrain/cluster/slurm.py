"""``--cluster slurm``: the tasks of one Slurm allocation, all started by ``srun`` with the same command, make
the cluster; nothing submits further jobs, nothing listens but Dask.

Each task finds its place in Slurm's environment (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_JOB_ID``,
``SLURM_RESTART_COUNT``). Rank 0 starts a Dask scheduler (``dask scheduler`` in its own session, so that a
stop signal reaches the server, not the scheduler it still needs to checkpoint), writes its address into a
**rendezvous file** beside the run directory on the shared filesystem (atomically: a rename), and runs the
server on it; when the server ends, however it ends, it publishes the end in the file, waits (bounded) for the
workers to leave, ends the scheduler and deletes the file. Ranks above 0 wait for the file (bounded; a clear
error naming it when it never comes), start ``dask worker`` processes configured as memtrain's workers (one
thread each; the server registers its plugins on them), and end them and exit when the file says the run
ended. The run directory already holding a run (a requeued job, or the same script submitted again) means
resume: the job is the saved one.

The file's name holds the job id and the restart count, so a requeued job never reads its previous
attempt's address.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrain.cluster import dask_settings
from memtrain.cluster.address import ClusterAddress
from memtrain.errors import InputError, Interrupted, MemtrainError
from memtrain.files import read_json, write_json
from memtrain.layout import slurm_rendezvous_path
from memtrain.stopping import on_stop_signals

SCHEDULER_SECONDS = 60.0  # for rank 0's scheduler to write its address
RENDEZVOUS_SECONDS = 300.0  # for ranks > 0: rank 0 may start late, and then starts Python and a scheduler
POLL_SECONDS = 0.2
STOP_SECONDS = 10.0  # for a scheduler or worker process to end once told to
# After a stop signal, a worker rank keeps its Dask workers serving while the server checkpoints (which needs
# them to finish the update under way); past this it ends them.
WORKER_GRACE_SECONDS = 90.0
LEAVE_SECONDS = 20.0  # for rank 0 to see every worker leave once the end is published
DEATH_SECONDS = 60  # a Dask worker that lost its scheduler (rank 0 killed) gives up after this
# Dask's commands, closing at SIGUSR1 only: Slurm's stop signal reaches every process of a task (dask_child.py)
SCHEDULER = [sys.executable, "-m", "memtrain.cluster.dask_child", "scheduler"]
WORKER = [sys.executable, "-m", "memtrain.cluster.dask_child", "worker"]
OUTSIDE_HINT = ("start it inside an allocation with srun, one task per node (jobs/examples/slurm-memtrain.sbatch); "
                "to try a cluster run on one machine use --cluster local:N")


@dataclass(frozen=True, kw_only=True)
class SlurmTask:
    """This process's place in the allocation, from Slurm's environment."""

    rank: int
    tasks: int
    job_id: str
    restart: int
    cpus: int  # on this node, for this task

    @property
    def requeued(self) -> bool:
        return self.restart > 0


def slurm_task(environ: Mapping[str, str] = os.environ) -> SlurmTask:
    """Slurm's variables -> SlurmTask; outside an ``srun`` task (or with too few tasks) an InputError."""
    missing = [name for name in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS") if not environ.get(name)]
    if missing:
        raise InputError("--cluster slurm runs in the tasks of a Slurm job step, started by srun",
                         found=f"{', '.join(missing)} not set", hint=OUTSIDE_HINT)
    values = {name: _count(environ, name) for name in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_RESTART_COUNT")}
    if values["SLURM_NTASKS"] < 2:
        raise InputError("--cluster slurm needs at least 2 tasks: rank 0 is the server, the others run the workers",
                         found=f"SLURM_NTASKS={values['SLURM_NTASKS']}",
                         hint="ask for 2 or more nodes with one task each (#SBATCH --nodes=N --ntasks-per-node=1)")
    if values["SLURM_PROCID"] >= values["SLURM_NTASKS"]:
        raise InputError("SLURM_PROCID is not below SLURM_NTASKS", found=f"{values['SLURM_PROCID']} of "
                         f"{values['SLURM_NTASKS']}")
    cpus = environ.get("SLURM_CPUS_PER_TASK") or environ.get("SLURM_CPUS_ON_NODE") or "1"
    return SlurmTask(rank=values["SLURM_PROCID"], tasks=values["SLURM_NTASKS"], job_id=environ["SLURM_JOB_ID"],
                     restart=values["SLURM_RESTART_COUNT"], cpus=_count({"cpus": cpus}, "cpus") or 1)


def _count(environ: Mapping[str, str], name: str) -> int:
    text = environ.get(name, "0").strip()
    if not text.isdigit():
        raise InputError(f"Slurm's {name} is not a count", expected="an integer >= 0", found=repr(text))
    return int(text)


def listen_host(address: ClusterAddress) -> str | None:
    """The IPv4 address of ``slurm:INTERFACE``'s interface on this node; None: Dask's default."""
    if address.interface is None:
        return None
    import socket

    import psutil  # a dependency of distributed

    interfaces = psutil.net_if_addrs()
    found = [a.address for a in interfaces.get(address.interface, ()) if a.family == socket.AF_INET]
    if not found:
        raise InputError(f"no IPv4 address on network interface {address.interface!r} of this node",
                         where="run.cluster", expected="one of " + ", ".join(sorted(interfaces)),
                         found=address.text)
    return found[0]


def _listening(host: str | None) -> list[str]:
    """Where a Dask process listens: on ``host`` (its HTTP health checks too), or Dask's default."""
    if host is None:
        return ["--dashboard-address", ":0"]  # any free port: two jobs may share a node
    return ["--host", host, "--dashboard-address", f"{host}:0"]


def serve(task: SlurmTask, address: ClusterAddress, run_dir: Path, train: Callable[[str], int],
          stopped: Callable[[], int | None]) -> int:
    """Rank 0: a scheduler, the rendezvous file, ``train(scheduler_address)``; then, however it ended, the end
    published in the file, the workers' leaving awaited (bounded), the scheduler ended and the file deleted."""
    rendezvous = slurm_rendezvous_path(run_dir, task.job_id, task.restart)
    with tempfile.TemporaryDirectory(prefix="memtrain-slurm-") as scratch, contextlib.ExitStack() as stack:
        info = Path(scratch) / "scheduler.json"
        scheduler = _spawn([*SCHEDULER, "--port", "0", "--no-dashboard", *_listening(listen_host(address)),
                            "--scheduler-file", str(info), "--preload", "memtrain.cluster.dask_settings"],
                           Path(scratch))
        stack.callback(_end, scheduler)
        scheduler_address = _scheduler_address(scheduler, info, stopped)
        record = {"scheduler": scheduler_address, "job_id": task.job_id, "restart": task.restart,
                  "ranks": task.tasks, "ended": False}
        rendezvous.parent.mkdir(parents=True, exist_ok=True)
        write_json(rendezvous, record, durable=True)
        stack.callback(rendezvous.unlink, missing_ok=True)
        stack.callback(_let_workers_leave, scheduler_address)
        stack.callback(write_json, rendezvous, {**record, "ended": True}, durable=True)
        return train(scheduler_address)


def _let_workers_leave(scheduler_address: str) -> None:
    """Wait (bounded) until the worker ranks, told by the rendezvous file, have ended their Dask workers: a
    worker that loses its scheduler first logs tracebacks of Dask's own before it exits."""
    from memtrain.cluster.connect import _quiet, bounded, import_distributed

    distributed = import_distributed()

    def wait() -> None:
        with distributed.Client(scheduler_address, timeout=STOP_SECONDS) as client:
            deadline = time.monotonic() + LEAVE_SECONDS
            while client.ncores() and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)

    with _quiet("distributed"), contextlib.suppress(Exception):  # the scheduler is ended next, whatever happens
        bounded(wait, seconds=LEAVE_SECONDS + STOP_SECONDS, stopped=lambda: None, doing="letting the workers leave",
                timeout_error=MemtrainError("the Dask workers did not leave"))


def _scheduler_address(scheduler: subprocess.Popen, info: Path, stopped: Callable[[], int | None]) -> str:
    deadline = time.monotonic() + SCHEDULER_SECONDS
    while True:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(info.read_text())["address"]  # Dask writes it once listening
        _stop_check(stopped, "starting the Dask scheduler")
        if scheduler.poll() is not None or time.monotonic() > deadline:
            found = (f"it exited with status {scheduler.returncode}" if scheduler.poll() is not None
                     else f"no address after {SCHEDULER_SECONDS:g} s")
            raise MemtrainError("rank 0 could not start its Dask scheduler", found=found,
                                hint="run `python -m distributed.cli.dask_scheduler` on this node to see why")
        time.sleep(POLL_SECONDS / 4)


def work(task: SlurmTask, address: ClusterAddress, run_dir: Path, worker_processes: int,
         stopped: Callable[[], int | None], node_processes: int = 0) -> int:
    """A rank above 0: Dask workers on rank 0's scheduler until rank 0 publishes the end in the rendezvous file
    (checked every POLL_SECONDS: exit 0), or they fail. ``node_processes`` > 0: they are nodes of that many
    processes (``MEMTRAIN_NODE_PROCESSES`` in their environment: memtrain/cluster/nodes.py)."""
    from memtrain.cluster.nodes import PROCESSES_ENV

    rendezvous = slurm_rendezvous_path(run_dir, task.job_id, task.restart)
    scheduler_address = wait_for_rendezvous(rendezvous, seconds=RENDEZVOUS_SECONDS, stopped=stopped)
    with tempfile.TemporaryDirectory(prefix="memtrain-slurm-") as scratch:
        workers = _spawn([*WORKER, scheduler_address, "--nthreads", "1", "--nworkers", str(worker_processes),
                          "--name", f"slurm-{task.rank}", "--no-dashboard", *_listening(listen_host(address)),
                          "--local-directory", scratch, "--death-timeout", str(DEATH_SECONDS),
                          "--preload", "memtrain.cluster.dask_child"], Path(scratch),
                         {PROCESSES_ENV: str(node_processes)} if node_processes else {})
        try:
            stop_seen: float | None = None
            while workers.poll() is None and not _ended(rendezvous):
                if stop_seen is None and stopped() is not None:
                    stop_seen = time.monotonic()  # the server is checkpointing with these workers: keep serving
                if stop_seen is not None and time.monotonic() - stop_seen > WORKER_GRACE_SECONDS:
                    break
                time.sleep(POLL_SECONDS)
            ended = workers.poll() is None  # told to end, or past the grace: these workers are ended cleanly
        finally:
            _end(workers)
        if stopped() is not None:
            return 128 + (stopped() or 0)
        if not ended and workers.returncode != 0:
            raise MemtrainError(f"the Dask workers of rank {task.rank} exited with status {workers.returncode}",
                                hint="their messages are above; rank 0's output says how the run ended")
        return 0


def _ended(rendezvous: Path) -> bool:
    """Rank 0 published the run's end (a new file renamed over the old: reopening it shows the new one)."""
    try:
        return bool(read_json(rendezvous, what="Slurm rendezvous file").get("ended"))
    except MemtrainError:  # gone (rank 0 deleted it after the end) or unreadable: the end
        return True


def wait_for_rendezvous(path: Path, *, seconds: float = RENDEZVOUS_SECONDS,
                        stopped: Callable[[], int | None] = lambda: None) -> str:
    """The scheduler address rank 0 published in ``path``, waited for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(OSError):
            os.listdir(path.parent)  # a network filesystem may cache the name's absence: reread the folder
        if path.exists():
            record = read_json(path, what="Slurm rendezvous file")
            if not isinstance(record, dict) or not isinstance(record.get("scheduler"), str):
                raise MemtrainError("the Slurm rendezvous file holds no scheduler address", path=path,
                                    found=repr(record)[:200])
            return record["scheduler"]
        _stop_check(stopped, "waiting for rank 0's rendezvous file")
        if time.monotonic() > deadline:
            raise MemtrainError(f"no rendezvous from rank 0 after {seconds:g} s", path=path,
                                found="the file was never written",
                                hint="rank 0 (the server) writes it once its Dask scheduler is up: see rank 0's "
                                     "output; the run's folder must be on a filesystem shared by every node")
        time.sleep(POLL_SECONDS)


def _stop_check(stopped: Callable[[], int | None], doing: str) -> None:
    signum = stopped()
    if signum is not None:
        error = Interrupted(f"stopped by {signal.Signals(signum).name} while {doing}",
                            hint="nothing was trained meanwhile; run the same command again")
        error.exit_code = 128 + signum
        raise error


def _spawn(command: list[str], folder: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """A Dask process in its own session: a signal to this task's process group does not reach it."""
    return subprocess.Popen(command, cwd=folder, stdin=subprocess.DEVNULL, start_new_session=True,
                            env={"DASK_LOGGING__DISTRIBUTED": "warning", **dask_settings.environment(), **os.environ,
                                 **(env or {})})  # no INFO lines per task; Dask's background turned down


def _end(process: subprocess.Popen) -> None:
    """SIGUSR1 (dask_child.END_SIGNAL: Dask's processes close cleanly), a bounded wait, then SIGKILL."""
    from memtrain.cluster.dask_child import END_SIGNAL

    if process.poll() is None:
        process.send_signal(END_SIGNAL)
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_SECONDS)


@contextlib.contextmanager
def stop_requests() -> Iterator[Callable[[], int | None]]:
    """While inside, a stop signal is recorded (the returned callable gives it) instead of ending the process."""
    seen: dict[str, int] = {}
    with on_stop_signals(lambda signum: seen.setdefault("signum", signum)):
        yield lambda: seen.get("signum")


def worker_count(task: SlurmTask, workers: Any, blas_threads: int) -> int:
    """Dask worker processes on a worker rank's node: ``train.workers`` when a number, else one per
    ``train.blas_threads`` cores of the task (``SLURM_CPUS_PER_TASK``, else ``SLURM_CPUS_ON_NODE``)."""
    if isinstance(workers, int) and workers > 0:
        return workers
    return max(1, task.cpus // max(1, blas_threads))


def worker_layout(task: SlurmTask, *, workers: Any, blas_threads: int, model_kind: str,
                  environ: Mapping[str, str] = os.environ) -> tuple[int, int, str]:
    """How a worker rank serves its node: (Dask worker processes, processes per worker as a node -- 0: not a
    node --, why). Always one Dask worker standing for the node's processes (a two-level round: docs/cluster.md,
    "The round with nodes"): ``MEMTRAIN_NODE_PROCESSES`` when set in the task's environment, else
    ``worker_count``. Its processes are the worker's threads when the model may be called from several threads at
    once (``thread_safe``) and BLAS runs on one thread, else real worker processes the node's Dask worker spawns
    (train/loops/node_compute.py ``NodeProcesses``): the why says which."""
    from memtrain.cluster.nodes import PROCESSES_ENV, node_processes
    from memtrain.models.registry import model_class

    given = node_processes(dict(environ))
    if given:
        return 1, given, f"{PROCESSES_ENV}={given} in the task's environment"
    processes = worker_count(task, workers, blas_threads)
    if blas_threads != 1:
        return 1, processes, f"worker processes: train.blas_threads = {blas_threads}"
    try:
        safe = bool(getattr(model_class(model_kind), "thread_safe", False))
    except MemtrainError as exc:
        return 1, processes, f"worker processes: the model kind {model_kind!r} did not import here ({exc})"
    if not safe:
        return 1, processes, f"worker processes: the model ({model_kind}) does not say thread_safe = True"
    return 1, processes, f"threads: thread_safe model ({model_kind})"
