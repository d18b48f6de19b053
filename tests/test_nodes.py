"""memtrain across simulated nodes (tests/netns_nodes.py): each node its own network namespace (address
10.231.0.N on a veth, its own loopback), mount namespace (its own ``/dev/shm``) and hostname; the dataset and the
run directory shared. The Dask scheduler, each worker and the server run on different nodes.

The run gives a local run's weights, bitwise; a node whose mount namespace covers the run's folder with an empty
filesystem (a node that lacks the shared mount) is refused by the pre-flight check, naming the worker, its host
(the node's hostname) and the path. Skipped, saying why, where namespaces cannot be made (not root, no ``ip``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from netns_nodes import Nodes, unavailable  # noqa: E402
from test_cluster import digest, train, write_job  # noqa: E402
from tiny_data import blobs, write_dataset  # noqa: E402

from memtrain.layout import weight_versions  # noqa: E402

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parent.parent
START_SECONDS = 60.0
PORT = 8786


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1500, features=8, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=300)


@pytest.fixture
def nodes(tmp_path: Path):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    made = Nodes(tmp_path)
    try:
        yield made
    finally:
        made.close()


def env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
            "DASK_LOGGING__DISTRIBUTED": "error"}


def start_cluster(nodes: Nodes, folder: Path, workers: dict[str, tuple[Path, ...]]) -> str:
    """A scheduler on node ``sched``, a worker on each node of ``workers`` (with its hidden paths), the server's
    node ``server``; returns the scheduler's address once every worker is registered."""
    nodes.add("server")
    scheduler = nodes.add("sched")
    address = f"tcp://{scheduler.address}:{PORT}"
    nodes.start("sched", [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", scheduler.address,
                          "--port", str(PORT), "--no-dashboard", "--dashboard-address", f"{scheduler.address}:0"],
                folder / "sched.txt", env(), cwd=folder)
    for name, hide in workers.items():
        node = nodes.add(name, hide=hide)
        local = folder / f"{name}-local"
        local.mkdir()
        nodes.start(name, [sys.executable, "-m", "distributed.cli.dask_worker", address, "--host", node.address,
                           "--nthreads", "1", "--name", name, "--no-dashboard", "--dashboard-address",
                           f"{node.address}:0", "--local-directory", str(local), "--memory-limit", "0",
                           "--no-nanny"],  # no restart is part of these tests: a process fewer importing distributed
                    folder / f"{name}.txt", env(), cwd=folder)
    wait_for_workers(nodes, address, set(workers), folder)
    return address


# One process on the server's node asks until every named worker is listed (a process for each question imported
# distributed again, ~1 s of CPU, every half second); it prints the names it saw last.
PROBE = """import sys, time, distributed
address, deadline, names = sys.argv[1], time.monotonic() + float(sys.argv[2]), set(sys.argv[3:])
seen = set()
while not names <= seen and time.monotonic() < deadline:
    try:
        with distributed.Client(address, timeout=20) as c:
            while True:
                seen = {str(w["name"]) for w in c.scheduler_info()["workers"].values()}
                if names <= seen or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
    except OSError:
        time.sleep(0.5)
print(" ".join(sorted(seen)))
"""


def wait_for_workers(nodes: Nodes, address: str, names: set[str], folder: Path) -> None:
    """Asked from the server's node (bounded): the scheduler lists every worker of ``names``."""
    done = subprocess.run(nodes.command("server", [sys.executable, "-c", PROBE, address, str(START_SECONDS),
                                                   *sorted(names)]),
                          capture_output=True, text=True, timeout=START_SECONDS + 60, env={**os.environ, **env()})
    if not names <= set(done.stdout.split()):
        logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in folder.glob("*.txt"))
        raise TimeoutError(f"workers {names} not registered: {done.stdout} {done.stderr}\n{logs}")


def serve(nodes: Nodes, folder: Path, job: Path, address: str) -> subprocess.CompletedProcess:
    """``memtrain train JOB --cluster ADDRESS`` on the server's node."""
    return subprocess.run(nodes.command("server", [sys.executable, "-m", "memtrain", "train", str(job),
                                                   "--cluster", address]),
                          capture_output=True, text=True, timeout=180, cwd=folder, env={**os.environ, **env()})


def test_a_run_across_three_namespace_nodes_gives_the_weights_of_a_local_run(nodes: Nodes, dataset: Path,
                                                                             tmp_path: Path) -> None:
    assert train(write_job(tmp_path / "local", dataset, 3)) == 0
    address = start_cluster(nodes, tmp_path, {"node1": (), "node2": ()})
    job = write_job(tmp_path / "cluster", dataset, 3)
    done = serve(nodes, tmp_path / "cluster", job, address)
    assert done.returncode == 0, done.stderr
    assert digest(tmp_path / "cluster" / "run") == digest(tmp_path / "local" / "run")
    events = (tmp_path / "cluster" / "run" / "events.log").read_text()
    assert "10.231.0." in events and "Traceback" not in done.stderr  # the workers were reached on the nodes


def test_a_node_that_cannot_see_the_run_directory_is_named_with_its_host_and_the_path(nodes: Nodes, dataset: Path,
                                                                                    tmp_path: Path) -> None:
    """node2's mount namespace covers the run's folder with an empty tmpfs: the same path, another filesystem."""
    shared = tmp_path / "cluster"
    shared.mkdir()
    address = start_cluster(nodes, tmp_path, {"node1": (), "node2": (shared,)})
    job = write_job(shared, dataset, 3)
    done = serve(nodes, shared, job, address)
    assert done.returncode == 2, done.stderr
    worker = next(line for line in done.stderr.splitlines() if "Dask worker" in line)
    assert "Dask worker tcp://10.231.0.4:" in done.stderr and "(host node2," in done.stderr, done.stderr
    assert "cannot see the run directory" in done.stderr and str(shared / "run") in done.stderr, worker
    assert "mounted at the same path on every node" in done.stderr
    assert "node1" not in done.stderr and "Traceback" not in done.stderr
    assert weight_versions(shared / "run") == [0]  # refused before the first update
