"""``--cluster`` text -> a ClusterAddress: a running Dask scheduler, a local Dask cluster of N workers, or
``slurm``: the tasks of one Slurm allocation, started by ``srun``, make the cluster (cluster/slurm.py).

Parsed when the job is loaded (config.py), so a bad address is a usage error (exit 2) before anything starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memtrain.errors import InputError

SCHEMES = ("tcp", "tls")  # Dask's network protocols between machines (ucx/inproc are not for memtrain)
MAX_LOCAL_WORKERS = 256
_SCHEDULER = re.compile(r"^(?P<scheme>[a-z]+)://(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):(?P<port>\d+)$")
_LOCAL = re.compile(r"^local:(?P<count>\d+)$")
_SLURM = re.compile(r"^slurm(?::(?P<interface>[A-Za-z0-9._-]{1,15}))?$")  # 15: Linux's IFNAMSIZ - 1
EXAMPLES = ("tcp://HOST:PORT (a running Dask scheduler), local:N (a Dask cluster of N workers on this machine) "
            "or slurm[:INTERFACE] (the tasks of this Slurm allocation, started by srun)")


@dataclass(frozen=True, kw_only=True)
class ClusterAddress:
    """``scheduler`` set: connect to it. ``local_workers`` set: start that many Dask workers here. ``slurm``:
    launched by srun, rank 0 starts the scheduler (listening on ``interface``, or Dask's default) and serves."""

    text: str
    scheduler: str | None = None
    local_workers: int | None = None
    slurm: bool = False
    interface: str | None = None

    @property
    def local(self) -> bool:
        return self.local_workers is not None


def parse_cluster(text: str, *, where: str = "--cluster") -> ClusterAddress:
    """``"tcp://10.0.0.5:8786"``, ``"local:4"`` or ``"slurm:ib0"`` -> ClusterAddress; anything else is an
    InputError."""
    value = text.strip()
    if match := _SLURM.match(value):
        return ClusterAddress(text=value, slurm=True, interface=match["interface"])
    if match := _LOCAL.match(value):
        count = int(match["count"])
        if not 1 <= count <= MAX_LOCAL_WORKERS:
            raise InputError("a local Dask cluster needs 1 to 256 workers", where=where, found=value)
        return ClusterAddress(text=value, local_workers=count)
    match = _SCHEDULER.match(value)
    if match is None:
        raise InputError("not a Dask cluster address", where=where, expected=EXAMPLES, found=repr(text))
    if match["scheme"] not in SCHEMES:
        raise InputError(f"unsupported protocol {match['scheme']}://", where=where,
                         expected=" or ".join(f"{s}://" for s in SCHEMES), found=value)
    if not 0 < int(match["port"]) < 65536:
        raise InputError("port out of range", where=where, expected="1-65535", found=match["port"])
    return ClusterAddress(text=value, scheduler=value)
