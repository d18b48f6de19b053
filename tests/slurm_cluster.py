"""A real Slurm on this machine for tests: Debian's ``slurm-wlm`` (slurmctld and N ``slurmd -N nX``) with munge.

Everything lives in one folder: the key, munge's socket, ``slurm.conf``, the controller's state, each node's
spool, the logs. The nodes are ``NodeName`` entries of this host, each slurmd on a port of its own on
127.0.0.1 (``Port=``), the controller on another; the ports are free ones picked at start. Every daemon runs
in the foreground in its own session; every wait is bounded; ``close`` cancels the jobs, waits (bounded) for
their processes to end, then ends the daemons and anything of theirs left (found by their pid, never by name).

``unavailable()`` says why this cannot run here (no slurm-wlm or munge installed, not root), for a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

START_SECONDS = 60.0  # for the controller to answer and every node to be idle
STOP_SECONDS = 15.0
COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "squeue", "scontrol", "sinfo", "srun")
INSTALL = "apt-get install -y slurm-wlm munge"

CONF = """\
ClusterName=memtrain-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={first_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
InactiveLimit=0
KillWait=10
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=60
"""


def unavailable() -> str | None:
    """Why a real Slurm cannot be started here, or None."""
    missing = [name for name in COMMANDS if shutil.which(name) is None]
    if missing:
        return f"slurm-wlm/munge not installed ({', '.join(missing)} not found): {INSTALL}"
    if os.geteuid() != 0:
        return "a slurmd must run as root to start jobs (SlurmdUser=root)"
    return None


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (held together while picked)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class SlurmCluster:
    root: Path
    nodes: int = 3
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm's commands (and what sbatch passes on to the job)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def start(self) -> None:
        for folder in ("munge", "state", "log", *(f"spool/{n}" for n in self.names)):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self._daemon("munged", ["munged", "--foreground", "--force", f"--socket={self.root}/munge/munge.socket",
                                f"--key-file={key}", f"--pid-file={self.root}/munge/munged.pid",
                                f"--log-file={self.root}/log/munged.log",
                                f"--seed-file={self.root}/munge/munged.seed"])
        self._wait(lambda: (self.root / "munge" / "munge.socket").exists(), "munged's socket")
        ports = free_ports(self.nodes + 1)
        host = socket.gethostname()
        lines = [CONF.format(host=host, root=self.root, ctld_port=ports[0], first_port=ports[1])]
        lines += [f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 State=UNKNOWN"
                  for name, port in zip(self.names, ports[1:], strict=True)]
        lines.append(f"PartitionName=test Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "plugstack.conf").write_text("")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self._run("scontrol", "ping").returncode == 0, "slurmctld to answer")
        for name in self.names:
            self._daemon(f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self._wait(self._idle, f"{self.nodes} idle nodes")

    def _idle(self) -> bool:
        done = self._run("sinfo", "-h", "-N", "-o", "%N %t")
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return all(states.get(name) == "idle" for name in self.names)

    def _daemon(self, name: str, command: list[str]) -> None:
        with open(self.root / "log" / f"{name}.out", "wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, env=self.env, cwd=self.root)
        self.processes.append(process)

    def _wait(self, ready, what: str, seconds: float = START_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{process.args[0]} exited with {process.returncode} while waiting for "
                                       f"{what}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {seconds:g} s:\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted((self.root / "log").glob("*")) if p.is_file())

    def _run(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)

    def run(self, *command: str, timeout: float = 30) -> str:
        """A Slurm command (sbatch, scancel, ...) on this cluster: its stdout; an error if it failed."""
        done = self._run(*command, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}: {done.stderr}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, Restarts, ...); {} once the job is gone."""
        done = self._run("scontrol", "-o", "show", "job", job_id)
        if done.returncode != 0:
            return {}
        return dict(item.split("=", 1) for item in done.stdout.split() if "=" in item)

    def wait_job(self, job_id: str, states: set[str], seconds: float, *, restarts: int = 0) -> dict[str, str]:
        """Wait (bounded) until the job is in one of ``states`` with at least ``restarts`` restarts."""
        deadline = time.monotonic() + seconds
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states and int(info.get("Restarts", "0")) >= restarts:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not {states} (restarts >= {restarts}) after {seconds:g} s: "
                                   f"{info}\n{self.logs()}")
            time.sleep(0.5)

    def close(self) -> None:
        """Cancel every job, wait (bounded) for their processes, end the daemons, then whatever they left."""
        with contextlib.suppress(Exception):
            self._run("scancel", "--full", "--partition", "test", timeout=10)
            deadline = time.monotonic() + STOP_SECONDS
            while self._run("squeue", "-h", timeout=10).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.5)
        left = self._descendants()
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(STOP_SECONDS)
        for pid in left | self._descendants():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.processes.clear()

    def _descendants(self) -> set[int]:
        """Processes that carry this cluster's SLURM_CONF (slurmstepd and the jobs' tasks), by pid."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
        return found - {p.pid for p in self.processes if p.poll() is not None}
