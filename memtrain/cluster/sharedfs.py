"""The run's files as the server sees them -> does every Dask worker see the same? (checked before training).

The dataset, the run directory and the exchange area must be one filesystem mounted at the same path on
every node. The server writes a probe into the run directory; each worker reads it, verifies the dataset
manifest (its checksum) and the shards' headers and sizes (no hashing), and writes a probe of its own
into the exchange area, which the server reads back. Any miss names the worker, its host and what it
could not see. Across machines, a file is read only after its writer closed it (and synced it where the
filesystem needs that) and a message said so: that is also how every probe here travels.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from memtrain.dataset import open_dataset
from memtrain.errors import InputError, MemtrainError
from memtrain.files import checksum_file, publish, read_json
from memtrain.layout import MANIFEST, cluster_probe_name
from memtrain.train.exchange.area import CLUSTER_PROBE, discard

# Filesystem types whose clients do not share one page cache: a file written on one node must be
# synced before a message tells another node to read it. Everything else (ext4, xfs, tmpfs, ...) is
# local to one machine, whose processes share the page cache.
NETWORK_FILESYSTEMS = {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "glusterfs", "9p",
                       "fuse.glusterfs", "fuse.ceph", "fuse.sshfs", "panfs", "wekafs", "orangefs", "virtiofs"}
SHARED_FS_HINT = ("the dataset, the run directory and the exchange area must be on a filesystem mounted at the "
                  "same path on every node (see docs/cluster.md)")


@dataclass(frozen=True, kw_only=True)
class ViewProbe:
    """What the server sees: sent to each worker, which checks it sees the same."""

    dataset: str
    manifest_checksum: str
    run_dir: str
    run_probe: str  # a file the server wrote into the run directory, holding ``token``
    exchange: str
    token: str


@dataclass(frozen=True, kw_only=True)
class View:
    """A worker's answer: where it runs, what it could not see, and the probe it wrote (None if it could not)."""

    host: str
    pid: int
    problems: tuple[str, ...]
    probe: str | None


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (``/proc/mounts``, longest mount point); "" if unknown."""
    try:
        with open("/proc/mounts", encoding="utf-8") as handle:
            mounts = [line.split()[1:3] for line in handle if len(line.split()) >= 3]
    except OSError:
        return ""
    target = os.path.realpath(path)
    best, kind = "", ""
    for point, fs in mounts:
        point = point.replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fs
    return kind


def needs_sync(path: Path) -> bool:
    """True when files under ``path`` must be synced before another node may read them."""
    return filesystem_type(path) in NETWORK_FILESYSTEMS


def sync_for_readers(path: Path) -> None:
    """fsync ``path`` when readers on other machines would otherwise not see its latest writes."""
    if needs_sync(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def server_probe(dataset: Path, run_dir: Path, exchange: Path) -> ViewProbe:
    """Write the run directory's probe and describe the server's view (``cleanup`` removes the probe)."""
    token = os.urandom(8).hex()
    path = run_dir / cluster_probe_name(token)
    _write_synced(path, {"token": token})
    return ViewProbe(dataset=str(dataset), manifest_checksum=checksum_file(dataset / MANIFEST), run_dir=str(run_dir),
                     run_probe=str(path), exchange=str(exchange), token=token)


def look(probe: ViewProbe, worker: str) -> View:
    """On a worker: check its view of the run's files against the server's; write its exchange probe."""
    problems = []
    manifest = Path(probe.dataset) / MANIFEST
    try:
        found = checksum_file(manifest)
        if found != probe.manifest_checksum:
            problems.append(f"sees a different dataset manifest at {manifest} "
                            f"(expected {probe.manifest_checksum}, found {found})")
        else:
            dataset = open_dataset(probe.dataset)
            for split in dataset.splits.values():
                split.check_files()
    except (OSError, MemtrainError) as exc:
        problems.append(f"cannot read the dataset: {_reason(exc)}")
    try:
        record = read_json(Path(probe.run_probe), what="run directory probe")  # a regular file only
        token = record.get("token") if isinstance(record, dict) else None
        if token != probe.token:
            problems.append(f"sees another run directory at {probe.run_dir} (its probe holds {token!r})")
    except (OSError, ValueError, MemtrainError) as exc:
        problems.append(f"cannot see the run directory's probe {probe.run_probe}: {_reason(exc)}")
    written = None
    path = CLUSTER_PROBE.path(Path(probe.exchange), worker)
    try:
        _write_synced(path, {"token": probe.token, "worker": worker})
        written = str(path)
    except (OSError, MemtrainError) as exc:
        problems.append(f"cannot write into the exchange area {probe.exchange}: {_reason(exc)}")
    return View(host=socket.gethostname(), pid=os.getpid(), problems=tuple(problems), probe=written)


def read_back(probe: ViewProbe, worker: str, view: View) -> list[str]:
    """On the server: the problems of ``view``, plus whether the server sees the probe the worker wrote."""
    problems = list(view.problems)
    if view.probe is not None:
        try:
            record = json.loads(Path(view.probe).read_text(encoding="utf-8"))
            if record != {"token": probe.token, "worker": worker}:
                problems.append(f"wrote a probe into the exchange area that the server reads differently: {record}")
        except (OSError, ValueError) as exc:
            problems.append(f"wrote a probe into the exchange area ({view.probe}) that the server cannot read: "
                            f"{_reason(exc)}")
        discard([Path(view.probe)])
    return problems


def refuse(worker: str, view: View, problems: list[str]) -> InputError:
    what = "; ".join(problems)
    return InputError(f"Dask worker {worker} (host {view.host}, pid {view.pid}) {what}", hint=SHARED_FS_HINT)


def cleanup(probe: ViewProbe) -> None:
    Path(probe.run_probe).unlink(missing_ok=True)


def _write_synced(path: Path, record: dict[str, str]) -> None:
    """Publish durably (fsync, then rename; never through a link at ``path``): another node may read it once a
    message says it is there."""
    text = json.dumps(record).encode()
    publish(path, lambda handle: handle.write(text), durable=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)
