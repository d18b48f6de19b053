"""A node's processes as real worker processes (issue 42; memtrain/train/loops/node_compute.py ``NodeProcesses``):
a model that does not say ``thread_safe = True`` has each node's range computed in P spawned workers of the local
pool, whose gradient files stay in the node's scratch; the same bits as a local run for 1+2 and 2+1+3 nodes, when a
process of a node is killed mid-task (its task computed again by its replacement), and when a whole node is killed
(its processes die with it; the round's tasks after the furthest partial run per task); and a torch module
through nodes of 1+2 worker processes (and 2+1+3, with -m slow).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from distributed import Client  # noqa: E402

from tests import test_node_round  # noqa: E402
from tests.dask_processes import REPO, DaskProcesses  # noqa: E402
from tests.test_cluster import WIDE, WIDE_EPOCHS, digest, train, write_job  # noqa: E402
from tests.test_node_round import EVERY_NODE, TASKS, kept_segments_taken, node_run, start_nodes  # noqa: E402

pytestmark = pytest.mark.timeout(400)

scheduler, dask, dataset = test_node_round.scheduler, test_node_round.dask, test_node_round.dataset  # its fixtures

KIND = "tests.node_models:UnsafeMLP"  # the MLP, not thread_safe
PYTHONPATH = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)  # KIND's tests package


def unsafe_job(folder: Path, dataset: Path) -> Path:
    job = write_job(folder, dataset, WIDE_EPOCHS, WIDE)
    job.write_text(job.read_text().replace('kind = "mlp"', f'kind = "{KIND}"'))
    return job


@pytest.fixture(scope="module")
def unsafe_digest(tmp_path_factory: pytest.TempPathFactory, dataset: Path) -> str:
    folder = tmp_path_factory.mktemp("local")
    assert train(unsafe_job(folder, dataset), *TASKS) == 0
    return digest(folder / "run")


def unsafe_run(folder: Path, dataset: Path, address: str, monkeypatch) -> tuple[list, list]:
    monkeypatch.setattr("tests.test_node_round.write_job", lambda folder, dataset, *_: unsafe_job(folder, dataset))
    return node_run(folder, dataset, address, monkeypatch)


def check_scratch_and_log(root: Path, counts: list[int]) -> None:
    for j, count in enumerate(counts):
        assert not list((root / f"node{j}" / "local").rglob("g-*"))  # each node's scratch emptied after its fold
        log = (root / f"node{j}" / "log.txt").read_text()
        if count > 1:
            assert f"memtrain node of {count} processes: its tasks in {count} worker processes" in log, log[-2000:]


# [1+2] is kept out of CI for time (-m slow): [2+1+3] takes the same path with a node of 1 process and nodes of 2
# and 3 worker processes, and test_a_torch_model_on_nodes_of_worker_processes_gives_a_local_runs_weights[1+2] the
# 1+2 layout in worker processes.
@pytest.mark.parametrize("counts", [pytest.param([1, 2], marks=pytest.mark.slow), [2, 1, 3]], ids=["1+2", "2+1+3"])
def test_nodes_in_worker_processes_give_the_weights_of_a_local_run(counts: list[int], dask, dataset: Path,
                                                                   unsafe_digest: str, tmp_path: Path,
                                                                   monkeypatch) -> None:
    processes, client = dask
    start_nodes(processes, client, counts)
    records, steps = unsafe_run(tmp_path / "job", dataset, processes.address, monkeypatch)
    assert {kind for kind, _ in records} == {"nodes", "node-step"}
    assert {t.chained for t in steps} == {6}  # every step read the last partial
    assert digest(tmp_path / "job" / "run") == unsafe_digest
    # the node ending each chain stepped its own slice of it from the memory of its Dask worker, where both its fold
    # and its step run (its worker processes compute gradients only): at least one segment per update
    assert kept_segments_taken(client) >= len({t.update for t in steps})
    run = tmp_path / "job" / "run"
    assert not [p.name for p in run.rglob("g-*")] and not [p.name for p in run.rglob("c-u*")]
    check_scratch_and_log(tmp_path / "dask", counts)


def test_a_process_of_a_node_killed_mid_task_is_replaced_and_the_bits_stay(dask, dataset: Path, unsafe_digest: str,
                                                                           tmp_path: Path, monkeypatch) -> None:
    """A worker process of the node of 3 SIGKILLs itself after writing its 1st gradient (once): the node's pool
    replaces it and sends the task again; the node still answers its whole range (every step reads the last
    partial) and the weights are a local run's."""
    processes, client = dask
    fired = tmp_path / "fired"
    start_nodes(processes, client, [1, 3], {1: {"MEMTRAIN_FAULT": "after_grad_write:1",
                                               "MEMTRAIN_FAULT_ONCE": str(fired)}})
    records, steps = unsafe_run(tmp_path / "job", dataset, processes.address, monkeypatch)
    assert fired.exists()
    assert {t.chained for t in steps} == {6}  # the node recovered inside its round: no task ran per task
    assert digest(tmp_path / "job" / "run") == unsafe_digest
    check_scratch_and_log(tmp_path / "dask", [1, 3])


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_node_killed_with_its_processes_has_its_range_run_again(dask, dataset: Path, unsafe_digest: str,
                                                                  tmp_path: Path, monkeypatch) -> None:
    """The node of 2 processes among 1+2+1: one of its worker processes stops itself (SIGSTOP) after writing its
    2nd gradient, once; the test then SIGKILLs the node's Dask worker mid-round. Its worker processes die with
    it (parent-death signal), the round ends, the tasks after the furthest partial run per task: the same bits."""
    processes, client = dask
    fired = tmp_path / "fired"
    start_nodes(processes, client, [1, 2, 1], {1: {"MEMTRAIN_FAULT": "after_grad_write:2",
                                                  "MEMTRAIN_FAULT_ACTION": "stop",
                                                  "MEMTRAIN_FAULT_ONCE": str(fired)}})
    node = processes.wait_for_workers(client, {"node1"})["node1"]["pid"]
    killed: list[int] = []

    def kill_the_node() -> None:
        while not fired.exists():
            time.sleep(0.05)
        time.sleep(0.2)
        killed.extend(children(node))
        os.kill(node, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_node, daemon=True)
    killer.start()
    records, steps = unsafe_run(tmp_path / "job", dataset, processes.address, monkeypatch)
    killer.join(5)
    assert fired.exists() and len(killed) >= 2  # the node's worker processes (and the resource tracker)
    assert not [pid for pid in killed if Path(f"/proc/{pid}").exists()
                and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    events = (tmp_path / "job" / "run" / "events.log").read_text()
    assert re.search(r"broadcast round of 3 workers ended: a worker of the round left the scheduler", events), events
    assert [t.chained for t in steps if t.chained != 6]  # that update's tasks after the partial ran per task
    assert digest(tmp_path / "job" / "run") == unsafe_digest


def states(pids: list[int]) -> list[str]:
    """The state letters (R, S, T stopped, Z ...) of the processes of ``pids`` still there."""
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            found.append(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
    return found


HUNG = "test_a_process_of_a_live_node_that_hangs_is_killed_at_the_task_timeout_and_its_task_sent_again"
HUNG_TIMEOUT_S = 8  # train.task_timeout of the hung process's run: a loaded machine's process start fits in it


class HungNodeRun:
    """The run of HUNG, started in the background when the module starts (``hung_node_run``), so that its wait (a
    process hung until train.task_timeout, all idle) passes while the module's other tests run: a thread starts a
    scheduler and nodes of 1 and 2 processes (a process of the node of 2 stops itself at its 1st gradient, once),
    then ``memtrain train`` in a process of its own, its output in files of ``folder``; ``result`` waits for it."""

    def __init__(self, folder: Path, dataset: Path):
        self.folder, self.fired = folder, folder / "fired"
        self.dask = DaskProcesses(folder / "dask")
        self.node = 0  # the node of 2's Dask worker's pid
        self._process: subprocess.Popen | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, args=(dataset,), daemon=True)
        self._thread.start()

    def _start(self, dataset: Path) -> None:
        try:
            self.dask.start_scheduler()
            with Client(self.dask.address, timeout=30, set_as_default=False) as client:
                start_nodes(self.dask, client, [1, 2], {1: {"MEMTRAIN_FAULT": "before_grad_write:1",
                                                            "MEMTRAIN_FAULT_ACTION": "stop",
                                                            "MEMTRAIN_FAULT_ONCE": str(self.fired)}})
                self.node = self.dask.wait_for_workers(client, {"node1"})["node1"]["pid"]
            job = unsafe_job(self.folder / "job", dataset)
            with (self.folder / "out.txt").open("w") as out:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "memtrain", "train", str(job), "--cluster", self.dask.address, *TASKS,
                     "--set", f"train.task_timeout={HUNG_TIMEOUT_S}"], stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": PYTHONPATH})
        except BaseException as exc:  # noqa: BLE001 - raised in the test that waits for the run
            self._error = exc

    def result(self, timeout: float = 240) -> tuple[int, str]:
        """The run's exit code and output."""
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        assert self._process is not None, "the hung node's run did not start"
        code = self._process.wait(timeout)
        return code, (self.folder / "out.txt").read_text()

    def close(self) -> None:
        self._thread.join(120)
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self.dask.close()


@pytest.fixture(scope="module", autouse=True)
def hung_node_run(request: pytest.FixtureRequest, dataset: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, HungNodeRun]]:
    """HUNG's run, started when the module starts if HUNG is selected (``-k`` included); closed at its end."""
    selected = {item.name for item in request.session.items if item.path == request.path}
    runs = {HUNG: HungNodeRun(tmp_path_factory.mktemp("hung-node"), dataset)} if HUNG in selected else {}
    yield runs
    for run in runs.values():
        run.close()


def test_a_process_of_a_live_node_that_hangs_is_killed_at_the_task_timeout_and_its_task_sent_again(
        hung_node_run: dict[str, HungNodeRun], dataset: Path, unsafe_digest: str, tmp_path: Path) -> None:
    """A worker process of the node of 2 stops itself (SIGSTOP) before computing its 1st gradient, once: a hung
    process in a live node. The server's rule ends the round at train.task_timeout (8 s) and completes the update
    per task; inside the node the same timeout kills the process, its replacement gets the task again, and the
    node's thread returns -- no process of the node is left stopped. Before, the node's thread waited for the
    stopped process for ever. The weights are a local run's. (The run started with the module: ``hung_node_run``.)"""
    run = hung_node_run.get(HUNG) or hung_node_run.setdefault(HUNG, HungNodeRun(tmp_path, dataset))
    code, out = run.result()
    assert code == 0, out[-3000:]
    node, folder = run.node, run.folder
    assert run.fired.exists()
    # the node's own timeout runs from the task's send to the process (after the processes started): a little
    # after the server's, which ends the round; then the replacement's task, the fold of a round that ended (bounded)
    killing = re.compile(r"memtrain node node1 \(Dask worker tcp://127\.0\.0\.1:\d+, host [^)]+\): worker process \d "
                         rf"\(pid \d+\) silent for {HUNG_TIMEOUT_S} s on gradient task \d of update \d+; killing it")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and ("T" in states(children(node)) or not killing.search(
            (folder / "dask" / "node1" / "log.txt").read_text())):
        time.sleep(0.1)
    log = (folder / "dask" / "node1" / "log.txt").read_text()
    assert killing.search(log), log[-3000:]
    assert "T" not in states(children(node))
    assert digest(folder / "job" / "run") == unsafe_digest
    run.close()  # its Dask processes, now rather than at the module's end


def test_a_task_that_kills_every_process_of_a_node_fails_after_max_attempts_naming_the_node_task_and_process(
        dask, dataset: Path, unsafe_digest: str, tmp_path: Path) -> None:
    """Every worker process of the node of 2 SIGKILLs itself at its 1st gradient (no once-marker: replacements
    too). After train.max_attempts (2 here) deaths with one task, the node answers that task's error -- naming the
    node, the task and the process -- instead of replacing processes for ever; the server ends the round, quotes it
    and completes the update per task (the node's Dask worker, computing in its own process, dies there too); the
    run ends on the other node with a local run's bits."""
    processes, client = dask
    start_nodes(processes, client, [1, 2], {1: {"MEMTRAIN_FAULT": "before_grad_write:1"}})
    job = unsafe_job(tmp_path / "job", dataset)
    assert train(job, "--cluster", processes.address, *TASKS, "--set", "train.max_attempts=2") == 0
    events = (tmp_path / "job" / "run" / "events.log").read_text()
    assert re.search(r"ended: a task failed: node node1 \(Dask worker tcp://127\.0\.0\.1:\d+, host [^)]+\): gradient "
                     r"task \d of update \d+ lost its worker process 2 time\(s\) \(train\.max_attempts\); the last, "
                     r"process \d \(pid \d+\), died \(exit code -9\)", events), events[-3000:]
    assert digest(tmp_path / "job" / "run") == unsafe_digest


# [2+1+3] is kept out of CI for time (-m slow: 3 more processes importing torch and one more Dask worker than
# [1+2]): [1+2] takes the same path, a node of 1 process and a node of worker processes, and
# test_nodes_in_worker_processes_give_the_weights_of_a_local_run[2+1+3] the 2+1+3 layout with a model that is not
# thread_safe either (the numpy MLP, in worker processes).
@pytest.mark.parametrize("counts", [[1, 2], pytest.param([2, 1, 3], marks=pytest.mark.slow)], ids=["1+2", "2+1+3"])
def test_a_torch_model_on_nodes_of_worker_processes_gives_a_local_runs_weights(counts: list[int], dask,
                                                                              tmp_path: Path) -> None:
    """A torch module (not thread_safe) through nodes of 1+2 and 2+1+3 worker processes, 6 tasks an update: a
    local run's bits (tests/test_torch.py's job and factory, found beside the job file). The local run is the
    server alone (--workers 0: this process has torch already), whose bits are those of workers
    (tests/test_torch.py::test_server_killed_then_resumed_is_bitwise_identical resumes in the server)."""
    pytest.importorskip("torch")
    from tiny_data import blobs, write_dataset

    from tests import test_torch as torch_tests

    x, y = blobs(n=600, features=6, classes=3, seed=2)
    data = write_dataset(tmp_path / "blobs", x, y, shard_rows=250)
    runs = {}
    for name, options in (("local", ("--workers", "0")), ("nodes", ("--cluster", dask[0].address))):
        torch_tests.copy_nets(tmp_path / name)
        job = torch_tests.write_job(tmp_path / name, data, "torch_nets:bn_dropout", optimizer="adamw", lr=0.01,
                                    train="weight_decay = 0.1")
        if name == "nodes":
            start_nodes(dask[0], dask[1], counts)
            options = (*options, *EVERY_NODE)  # every node's log says its processes (check_scratch_and_log)
        assert train(job, *options, *TASKS) == 0
        runs[name] = torch_tests.digest(tmp_path / name / "run")
    assert runs["nodes"] == runs["local"]
    check_scratch_and_log(tmp_path / "dask", counts)


def test_a_node_whose_processes_cannot_start_answers_their_error_and_its_tasks_run_per_task(
        dask, dataset: Path, unsafe_digest: str, tmp_path: Path, monkeypatch) -> None:
    """A model that cannot be built in a node's worker process: the node's pool gives up after 3 deaths before
    Ready in a row and starts no more; the node answers that error in every round, the server runs the tasks per
    task (on the Dask worker itself, where the model builds): the run ends with a local run's bits and its
    events.log quotes the error."""
    processes, client = dask
    start_nodes(processes, client, [2])
    job = unsafe_job(tmp_path / "job", dataset)
    job.write_text(job.read_text().replace(KIND, "tests.node_models:NotInNodeProcesses"))
    assert train(job, "--cluster", processes.address, *TASKS) == 0
    events = (tmp_path / "job" / "run" / "events.log").read_text()
    assert "worker processes could not start 3 times in a row" in events, events
    assert "this model is not built in a node's worker process" in events
    assert "could not start 4 times" not in events  # no more starts after the pool gave up
    assert digest(tmp_path / "job" / "run") == unsafe_digest
