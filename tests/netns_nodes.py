"""Simulated nodes on this machine: each "node" a network namespace of its own (its own loopback and an address on
a veth) and a mount namespace of its own (its own ``/dev/shm``, its own hostname), the rest of the filesystem
(the run directory, the dataset) shared.

The nodes' veths meet at a bridge inside a "switch" namespace that the helper also makes: every packet between
nodes stays inside namespaces made here (addresses 10.231.0.N/24 exist nowhere else); the machine's own network
namespace gets no address, route or setting. Each namespace lives as long as its holder process (``sleep``);
``close`` ends every process started in a node (its session, by pid), then the holders, and the namespaces and
veths go with them. Every wait is bounded.

``unavailable()`` says why namespaces cannot be made here (not root, no ``unshare``/``nsenter``/``ip``, or the
kernel refused: the measured error), for a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.231.0"
STOP_SECONDS = 10.0
HOLD = "ip link set lo up; {mounts} echo ready; exec sleep 86400"


def unavailable() -> str | None:
    """Why simulated nodes cannot be made here, or None (tries one namespace with a tmpfs and a veth)."""
    missing = [name for name in ("unshare", "nsenter", "ip") if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not found (util-linux, iproute2)"
    if os.geteuid() != 0:
        return "network and mount namespaces with veths need root"
    done = subprocess.run(["unshare", "--net", "--mount", "--uts", "--fork", "sh", "-c",
                           "mount -t tmpfs tmpfs /dev/shm && ip link add mtprobe0 type veth peer name mtprobe1"],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"namespaces not permitted here: {done.stderr.strip() or done.returncode}"
    return None


def _ip(*args: str, pid: int | None = None) -> None:
    command = ["ip", *args] if pid is None else ["nsenter", "-t", str(pid), "-n", "ip", *args]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)


@dataclass
class Node:
    name: str
    address: str
    holder: subprocess.Popen


@dataclass
class Nodes:
    """``add`` a node, ``start``/``run`` a command in it, ``close`` everything."""

    root: Path
    switch: subprocess.Popen | None = None
    nodes: dict[str, Node] = field(default_factory=dict)
    started: list[subprocess.Popen] = field(default_factory=list)

    def _hold(self, name: str, hide: tuple[Path, ...] = ()) -> subprocess.Popen:
        mounts = "mount -t tmpfs -o size=64m tmpfs /dev/shm;" + "".join(
            f" mount -t tmpfs -o size=1m tmpfs '{path}';" for path in hide)
        holder = subprocess.Popen(["unshare", "--net", "--mount", "--uts", "--fork", "sh", "-c",
                                   f"hostname {name}; " + HOLD.format(mounts=mounts)],
                                  stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True, text=True)
        assert holder.stdout is not None
        line = holder.stdout.readline()  # bounded: the shell prints it or dies (then EOF)
        if line.strip() != "ready":
            holder.kill()
            raise RuntimeError(f"namespace holder for {name} did not start (status {holder.wait(STOP_SECONDS)})")
        return holder

    def _namespace_pid(self, holder: subprocess.Popen) -> int:
        """The pid inside the new namespaces: unshare --fork's child (the shell, now ``sleep``)."""
        children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children").read_text().split()
        return int(children[0])

    def add(self, name: str, *, hide: tuple[Path, ...] = ()) -> Node:
        """A node: new namespaces, ``/dev/shm`` its own, ``hide``'s paths covered by an empty tmpfs (a node that
        lacks a shared mount), a veth to the switch with the next address."""
        if self.switch is None:
            self.switch = self._hold("switch")
            _ip("link", "add", "mtbr0", "type", "bridge", pid=self._namespace_pid(self.switch))
            _ip("link", "set", "mtbr0", "up", pid=self._namespace_pid(self.switch))
        index = len(self.nodes) + 1
        holder = self._hold(name, hide)
        node = Node(name, f"{SUBNET}.{index}", holder)
        self.nodes[name] = node
        pid, switch = self._namespace_pid(holder), self._namespace_pid(self.switch)
        outer, inner = f"mtsw{os.getpid() % 10000}x{index}", f"mtnd{os.getpid() % 10000}x{index}"
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)  # made here, moved out at once
        _ip("link", "set", outer, "netns", str(switch))
        _ip("link", "set", inner, "netns", str(pid))
        _ip("link", "set", outer, "master", "mtbr0", pid=switch)
        _ip("link", "set", outer, "up", pid=switch)
        _ip("link", "set", inner, "name", "eth0", pid=pid)
        _ip("addr", "add", f"{node.address}/24", "dev", "eth0", pid=pid)
        _ip("link", "set", "eth0", "up", pid=pid)
        return node

    def command(self, name: str, command: list[str]) -> list[str]:
        """``command`` run inside node ``name``'s namespaces (network, mount, hostname)."""
        pid = self._namespace_pid(self.nodes[name].holder)
        return ["nsenter", "-t", str(pid), "-n", "-m", "-u", "--", *command]

    def start(self, name: str, command: list[str], log: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        with open(log, "wb") as out:
            process = subprocess.Popen(self.command(name, command), stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd,
                                       env={**os.environ, **(env or {})})
        self.started.append(process)
        return process

    def close(self) -> None:
        for process in reversed(self.started):
            _end_group(process, signal.SIGTERM)
        for node in self.nodes.values():
            _end_group(node.holder, signal.SIGKILL)
        if self.switch is not None:
            _end_group(self.switch, signal.SIGKILL)
        self.started.clear()
        self.nodes.clear()
        self.switch = None


def _end_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(STOP_SECONDS)
    with contextlib.suppress(ProcessLookupError):  # a nanny's worker left in the group
        os.killpg(process.pid, signal.SIGKILL)
