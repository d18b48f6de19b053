"""memtrain on a real Dask cluster: a ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1.

Same weights as a local run, bitwise; a worker SIGKILLed mid-run (its task re-runs elsewhere, its
restarted process joins and gets used); a worker that cannot see the dataset is refused by name; the
scheduler lost mid-run stops the run with its checkpoints and ``--resume`` finishes it locally; bad
addresses, an unreachable scheduler and a missing extra are clear errors. Records stay small.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("distributed")

from distributed import Client  # noqa: E402
from distributed.protocol import dumps, to_serialize  # noqa: E402
from tiny_data import blobs, write_dataset  # noqa: E402

from memtrain.benchmarks.cluster_costs import print_costs, run_costs  # noqa: E402
from memtrain.cli import main  # noqa: E402
from memtrain.cluster.address import parse_cluster  # noqa: E402
from memtrain.cluster.broadcast import Broadcast, BroadcastPlugin  # noqa: E402
from memtrain.cluster.connect import connected  # noqa: E402
from memtrain.cluster.sharedfs import server_probe  # noqa: E402
from memtrain.cluster.transport import JOIN_SECONDS, SCHEDULER_SECONDS, ClusterPool  # noqa: E402
from memtrain.dataset import open_dataset  # noqa: E402
from memtrain.errors import InputError, MemtrainError  # noqa: E402
from memtrain.layout import (  # noqa: E402
    WEIGHTS_DIR,
    checkpoint_updates,
    streamed_gradient_name,
    weight_versions,
    weights_path,
)
from memtrain.train.context import model_context  # noqa: E402
from memtrain.train.exchange import weights  # noqa: E402
from memtrain.train.exchange.weights import publish_weights  # noqa: E402
from memtrain.train.loops.sliced import SlicedParticipant  # noqa: E402
from memtrain.train.messages import GradTask, Outcome, Result, RoundSetup, StepTask, WorkerSetup  # noqa: E402
from memtrain.train.optim import OptimizerConfig  # noqa: E402
from memtrain.train.server import server  # noqa: E402
from memtrain.train.server.pools import open_cluster  # noqa: E402
from memtrain.train.worker.worker import WorkerState  # noqa: E402
from tests.cluster_tasks import open_files_under  # noqa: E402
from tests.dask_processes import DaskProcesses  # noqa: E402

pytestmark = pytest.mark.timeout(180)

JOB = """
[data]
path = "{data}"

[model]
kind = "mlp"
hidden = {hidden}

[train]
epochs = {epochs}
batch_size = 200
tasks_per_update = 3
optimizer = "adam"
lr = 0.01
seed = 7
workers = 2
task_timeout = 60
backup_ratio = 0  # no backup copies but in the straggler's test: a busy machine's slow task would add attempts

[run]
dir = "run"
keep_versions = 2
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1500, features=8, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A scheduler and two workers, shared by the tests of this module; always torn down."""
    dask = DaskProcesses(tmp_path_factory.mktemp("dask"))
    try:
        dask.start_scheduler()
        dask.start_worker("w1")
        dask.start_worker("w2")
        with Client(dask.address, timeout=30) as client:
            dask.wait_for_workers(client, {"w1", "w2"})
            yield dask, client
    finally:
        dask.close()


def write_job(folder: Path, data: Path, epochs: int = 3, hidden: str = "[16]") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.toml"
    job.write_text(JOB.format(data=data, epochs=epochs, hidden=hidden))
    return job


# A model of 144,003 parameters: three checksum blocks of 64 Ki, so its step is cut into up to three slices.
WIDE = "[12000]"
WIDE_EPOCHS = 1


def digest(run: Path) -> str:
    weights = np.load(weights_path(run, weight_versions(run)[-1]), allow_pickle=False)
    return hashlib.sha256(weights.tobytes()).hexdigest()


def train(*args: object) -> int:
    return main(["train", *map(str, args)])


@pytest.fixture(scope="module")
def local_digest(tmp_path_factory: pytest.TempPathFactory, dataset: Path) -> dict[int, str]:
    """Final weights of local runs (worker processes on this machine) of the job, by epoch count."""
    digests = {}
    for epochs in (3, 12):
        folder = tmp_path_factory.mktemp(f"local{epochs}")
        assert train(write_job(folder, dataset, epochs)) == 0
        digests[epochs] = digest(folder / "run")
    return digests


@pytest.fixture(scope="module")
def wide_digest(tmp_path_factory: pytest.TempPathFactory, dataset: Path) -> str:
    """Final weights of a local run (worker processes on this machine) of the wide job."""
    folder = tmp_path_factory.mktemp("wide-local")
    assert train(write_job(folder, dataset, WIDE_EPOCHS, WIDE)) == 0
    return digest(folder / "run")


def sliced_run(folder: Path, dataset: Path, cluster: str, monkeypatch, *options: str) -> list[StepTask]:
    """A wide job on ``cluster``; returns the step tasks of its updates (one per slice), having checked that
    every update went through the broadcast round: one gradient record and one step record each."""
    steps: list = []
    records = spy_records(monkeypatch)
    run_steps = SlicedParticipant.run_step_tasks
    monkeypatch.setattr(SlicedParticipant, "run_step_tasks",
                        lambda participant, tasks, ranges: (steps.extend(tasks), run_steps(participant, tasks,
                                                                                             ranges))[1])
    assert train(write_job(folder, dataset, WIDE_EPOCHS, WIDE), "--cluster", cluster, *options) == 0
    monkeypatch.setattr(SlicedParticipant, "run_step_tasks", run_steps)
    updates = len({t.update for t in steps})
    assert [kind for kind, _ in records] == ["grads", "step"] * updates
    return steps


def spy_records(monkeypatch) -> list[tuple[str, object]]:
    """The records the server posts to its broadcast rounds (memtrain/cluster/broadcast.py), as (kind, body)."""
    records: list = []
    ask = Broadcast.ask
    monkeypatch.setattr(Broadcast, "ask", lambda round, kind, body, parts, chores: (
        records.append((kind, body)), ask(round, kind, body, parts, chores))[1])
    return records


def slice_counts(steps: list[StepTask]) -> set[int]:
    """How many slices each update's step was cut into."""
    return {len({t.task for t in steps if t.update == update}) for update in {t.update for t in steps}}


def test_the_step_sliced_across_1_2_3_dask_workers_gives_the_weights_of_a_local_run(cluster, dataset: Path,
                                                                                    wide_digest: str,
                                                                                    tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """Each worker steps a slice (train/loops/sliced.py); the server only sends and renames: same bits for any count."""
    dask, client = cluster
    steps = sliced_run(tmp_path / "two", dataset, dask.address, monkeypatch)
    assert slice_counts(steps) == {2} and digest(tmp_path / "two" / "run") == wide_digest
    assert all(t.attempts == (0, 0, 0) for t in steps)  # every gradient of the update, in task order
    # a worker a test starts and stops itself, which no fault restarts, runs without a nanny (one process fewer
    # importing distributed, ~0.6 s of CPU)
    third = dask.start_worker("w3", nanny=False)
    try:
        dask.wait_for_workers(client, {"w1", "w2", "w3"})
        steps = sliced_run(tmp_path / "three", dataset, dask.address, monkeypatch)
        assert slice_counts(steps) == {3} and digest(tmp_path / "three" / "run") == wide_digest
    finally:
        dask.stop(third)
        dask.started.remove(third)
    steps = sliced_run(tmp_path / "one", dataset, "local:1", monkeypatch)
    assert slice_counts(steps) == {1} and digest(tmp_path / "one" / "run") == wide_digest
    for folder in ("one", "two", "three"):  # nothing of the steps left behind
        assert not [p.name for p in (tmp_path / folder / "run").rglob("opt-*-n*")]


def test_a_sliced_run_resumes_locally_and_a_local_run_resumes_on_the_cluster(cluster, dataset: Path,
                                                                             tmp_path: Path) -> None:
    """The optimizer state (Adam's two slots) written by the slices is what checkpoints keep: an epoch on the
    cluster, then one more resumed locally, and the other way round, give the bits of two epochs in one go."""
    dask, _ = cluster
    straight = write_job(tmp_path / "straight", dataset, WIDE_EPOCHS + 1, WIDE)
    assert train(straight) == 0
    for first, then in ((dask.address, ""), ("", dask.address)):
        folder = tmp_path / f"from-{'cluster' if first else 'local'}"
        assert train(write_job(folder, dataset, WIDE_EPOCHS, WIDE), "--cluster", first) == 0
        assert train("--resume", folder / "run", "--cluster", then, "--set", f"train.epochs={WIDE_EPOCHS + 1}") == 0
        assert digest(folder / "run") == digest(tmp_path / "straight" / "run"), folder.name


def test_a_worker_killed_mid_step_has_its_slice_redone(cluster, dataset: Path, wide_digest: str,
                                                        tmp_path: Path) -> None:
    """A third worker SIGKILLs itself in the middle of its 2nd step slice (the fault point between two
    checksum blocks' writes of the step); the slice is redone elsewhere, nothing it half-wrote is read."""
    dask, client = cluster
    # without a nanny (one process fewer importing distributed): no restart is part of this case;
    # test_a_worker_killed_mid_run_changes_nothing has its nanny restart it
    faulty = dask.start_worker("faulty-step", env={"MEMTRAIN_FAULT": "mid_step:2",
                                                   "MEMTRAIN_FAULT_ONCE": str(tmp_path / "fired")}, nanny=False)
    try:
        dask.wait_for_workers(client, {"w1", "w2", "faulty-step"})
        assert train(write_job(tmp_path, dataset, WIDE_EPOCHS, WIDE), "--cluster", dask.address) == 0
        assert (tmp_path / "fired").exists()
        events = (tmp_path / "run" / "events.log").read_text()
        assert "lost Dask worker" in events
        assert "died with exit code None during step slice" in events
        assert digest(tmp_path / "run") == wide_digest
    finally:
        dask.stop(faulty)
        dask.started.remove(faulty)


def test_a_worker_killed_mid_round_ends_the_round_and_a_new_round_goes_on(
        cluster, dataset: Path, wide_digest: str, tmp_path: Path, monkeypatch) -> None:
    """A third worker SIGKILLs itself right after writing its 2nd gradient file, inside a broadcast round
    (memtrain/cluster/broadcast.py): the scheduler's plugin sees it leave, the round ends, that update's
    missing task runs per task (attempt 1), and the next update opens a round of the workers present."""
    dask, client = cluster
    faulty = dask.start_worker("faulty-round", env={"MEMTRAIN_FAULT": "after_grad_write:2",
                                                    "MEMTRAIN_FAULT_ONCE": str(tmp_path / "fired")}, nanny=False)
    records = spy_records(monkeypatch)
    opened: list[int] = []
    open_round = Broadcast.open
    monkeypatch.setattr(Broadcast, "open", lambda round: (open_round(round), opened.append(round.size))[0])
    try:
        dask.wait_for_workers(client, {"w1", "w2", "faulty-round"})
        assert train(write_job(tmp_path, dataset, WIDE_EPOCHS, WIDE), "--cluster", dask.address) == 0
        assert (tmp_path / "fired").exists()
        events = (tmp_path / "run" / "events.log").read_text()
        # the killed worker's task, and the healthy workers' too when their answers were not in yet (a loaded
        # machine: "2 of 3" or "3 of 3", the same path; a full suite at load 6 printed neither 1 nor 2)
        assert re.search(r"broadcast round of 3 workers ended: a worker of the round left the scheduler; [123] of 3 "
                         r"gradient tasks run per task", events), [line for line in events.splitlines()
                                                                    if "round" in line or "worker" in line]
        assert opened[0] == 3 and opened[1] == 2  # then one without it (no nanny restarts it)
        kinds = [kind for kind, _ in records]
        assert kinds.count("grads") == 7 and kinds.count("step") == 6  # 7 updates; one step ran per task
        assert digest(tmp_path / "run") == wide_digest
        assert not [p.name for p in (tmp_path / "run").rglob("g-*")]
    finally:
        dask.stop(faulty)
        dask.started.remove(faulty)


def test_a_worker_that_joins_mid_round_takes_part_from_the_next_round(cluster, dataset: Path, local_digest,
                                                                      tmp_path: Path, monkeypatch) -> None:
    """A worker joins the scheduler while the first broadcast round (of the two workers present) runs: the
    scheduler's plugin tells the server at the update's count, the round ends after that update, and the next
    round has three members; the weights are those of a local run."""
    dask, client = cluster
    opened: list[tuple[int, int]] = []  # (members, records posted before)
    late: list = []
    open_round = Broadcast.open
    records = spy_records(monkeypatch)

    def open_then_join(round: Broadcast) -> bool:
        started = open_round(round)
        opened.append((round.size, len(records)))
        if not late:  # joins while this round runs
            late.append(dask.start_worker("late-round", nanny=False))
            dask.wait_for_workers(client, {"w1", "w2", "late-round"})
        return started

    monkeypatch.setattr(Broadcast, "open", open_then_join)
    try:
        assert train(write_job(tmp_path, dataset), "--cluster", dask.address) == 0
        assert opened[:2] == [(2, 0), (3, 2)]  # the second round from the second update on (7 an epoch)
        events = (tmp_path / "run" / "events.log").read_text()
        assert "joined: slot 2" in events and "broadcast round of" not in events  # no round ended early
        assert digest(tmp_path / "run") == local_digest[3]
    finally:
        for started in late:
            dask.stop(started)
            dask.started.remove(started)


def test_a_straggler_is_outrun_by_a_backup_copy(cluster, dataset: Path, wide_digest: str, tmp_path: Path) -> None:
    """A third worker's gradients are made 40 times slower (the straggler test hook): the broadcast round's
    count says its answers are late (the backup rule), its tasks run again per task on the other workers
    (attempt 1: a backup copy), which finish first, and the loser's files are cleaned up."""
    dask, client = cluster
    slow = dask.start_worker("slow", env={"MEMTRAIN_STRAGGLER": f"40:{tmp_path / 'straggler'}"}, nanny=False)
    try:
        dask.wait_for_workers(client, {"w1", "w2", "slow"})
        job = write_job(tmp_path, dataset, WIDE_EPOCHS, WIDE)
        assert train(job, "--cluster", dask.address, "--set", "train.backup_ratio=3",
                     "--set", "train.backup_seconds=0.05") == 0
        events = (tmp_path / "run" / "events.log").read_text()
        assert "ended: the last answers are late" in events  # the broadcast round's straggler rule
        assert "1 of 3 gradient tasks run again per task (attempt 1: a backup copy" in events
        assert digest(tmp_path / "run") == wide_digest
        assert not [p.name for p in (tmp_path / "run").rglob("g-*")]
    finally:
        dask.stop(slow)
        dask.started.remove(slow)


def test_a_straggler_is_set_aside_and_the_next_rounds_go_on_without_it(cluster, dataset: Path, wide_digest: str,
                                                                       tmp_path: Path, monkeypatch) -> None:
    """A third worker's gradients are made 40 times slower, and the backup rule's floor is out of reach (60 s):
    the first round in which it lags sets it aside (the set-aside rule has no floor: a stall of milliseconds
    costs every update that waits for it), and the next rounds are opened with the two others only; the
    weights are those of a local run, bit for bit."""
    dask, client = cluster
    sizes: list[int] = []
    opened = Broadcast.open
    monkeypatch.setattr(Broadcast, "open", lambda round: (opened(round), sizes.append(round.size))[0])
    slow = dask.start_worker("lagging", env={"MEMTRAIN_STRAGGLER": f"40:{tmp_path / 'straggler'}"}, nanny=False)
    try:
        dask.wait_for_workers(client, {"w1", "w2", "lagging"})
        job = write_job(tmp_path, dataset, WIDE_EPOCHS, WIDE)
        assert train(job, "--cluster", dask.address, "--set", "train.backup_ratio=3",
                     "--set", "train.backup_seconds=60") == 0
        events = (tmp_path / "run" / "events.log").read_text()
        assert "over 3 x the median" in events and "set aside, its work goes to the others" in events
        assert "ended: the last answers are late" not in events  # no backup: the floor was never reached
        assert sizes[0] == 3 and 2 in sizes[1:], sizes  # a round of the three, then rounds of the two others
        assert digest(tmp_path / "run") == wide_digest
    finally:
        dask.stop(slow)
        dask.started.remove(slow)


def test_a_cluster_run_gives_the_weights_of_a_local_run_bitwise(cluster, dataset: Path, local_digest, tmp_path: Path,
                                                                 capsys, monkeypatch) -> None:
    """... and no shared-memory tricks across machines: only records travel, never a stretch of rounds (whose
    participants meet at marks in a shared file): per update one record of gradient tasks and one of the step
    to the broadcast round, whose workers step a slice each (train/loops/sliced.py); the evaluation's tasks to each
    worker; and no weight file is rewritten in place for a later version."""
    dask, _ = cluster
    sent, recycled = [], []
    send, retire = ClusterPool.send, weights.retire_weights
    records = spy_records(monkeypatch)
    monkeypatch.setattr(ClusterPool, "send", lambda pool, slot, task: (sent.append(task), send(pool, slot, task)))
    monkeypatch.setattr(weights, "retire_weights", lambda *args, **options: (recycled.append(options.get("recycle")),
                                                                             retire(*args, **options))[1])
    job = write_job(tmp_path, dataset)
    assert train(job, "--cluster", dask.address) == 0
    assert {type(task).__name__ for task in sent} == {"EvalTask"}
    updates = {body[0] for kind, body in records if kind == "grads"}  # the update's number: the workers
    assert len(updates) == 3 * 7  # derive its tasks from the plan (1500 rows, 1200 to train: 7 updates an epoch)
    assert [kind for kind, _ in records] == ["grads", "step"] * (3 * 7)  # the step, by slices (train/loops/sliced.py)
    assert all(isinstance(body, StepTask) for kind, body in records if kind == "step")
    assert recycled and not any(recycled)  # every weight version a new file: no other machine has it mapped
    run = tmp_path / "run"
    assert digest(run) == local_digest[3]
    events = (run / "events.log").read_text()
    assert f"Dask scheduler {dask.address}: workers" in events
    assert "exchange area: " + str(run) in events  # not /dev/shm: the other machines must see it
    assert not [p for p in run.iterdir() if p.name.startswith(("memtrain-x-", ".cluster-probe-"))]
    assert "done: 3 epochs" in capsys.readouterr().out


def test_a_scheduler_that_cannot_load_the_broadcast_plugin_runs_every_update_per_task(
        cluster, dataset: Path, local_digest, tmp_path: Path, monkeypatch) -> None:
    """The BroadcastPlugin is unpickled on the scheduler: one without memtrain (stood in for by a refusing
    ``register_plugin``) is said once in the event log, and every update's tasks and slices go one call each."""
    dask, _ = cluster
    sent: list = []
    send = ClusterPool.send
    monkeypatch.setattr(ClusterPool, "send", lambda pool, slot, task: (sent.append(task), send(pool, slot, task)))

    register = Client.register_plugin

    def refuse(client: Client, plugin: object, *args: object, **options: object) -> object:
        if isinstance(plugin, BroadcastPlugin):
            raise ModuleNotFoundError("No module named 'memtrain.cluster.broadcast'")
        return register(client, plugin, *args, **options)  # the memory monitor's plugins (cluster/memory.py)

    monkeypatch.setattr(Client, "register_plugin", refuse)
    assert train(write_job(tmp_path, dataset), "--cluster", dask.address) == 0
    grads = [task for task in sent if isinstance(task, GradTask)]
    assert len({task.ticket for task in grads}) == 3 * 7 and len(grads) == 3 * 7 * 3
    assert len([task for task in sent if isinstance(task, StepTask)]) == 3 * 7
    events = (tmp_path / "run" / "events.log").read_text()
    assert events.count("did not take memtrain's broadcast plugin (ModuleNotFoundError") == 1
    assert digest(tmp_path / "run") == local_digest[3]


def listening(pids: set[int]) -> set[str]:
    """The addresses the processes ``pids`` and their children listen on (TCP)."""
    import psutil

    family = {pid for pid in pids} | {c.pid for pid in pids for c in psutil.Process(pid).children(recursive=True)}
    return {f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.pid in family}


def test_a_local_dask_cluster_gives_the_weights_of_a_local_run(dataset: Path, local_digest, tmp_path: Path,
                                                               monkeypatch) -> None:
    """``--cluster local:2``: memtrain starts (and stops) two Dask worker processes itself, on loopback only."""
    sockets: set[str] = set()

    def open_and_look(*args: object, **kwargs: object) -> object:
        pool = open_cluster(*args, **kwargs)
        sockets.update(listening({os.getpid()}))  # the scheduler runs in this process, the workers below it
        return pool

    monkeypatch.setattr(server, "open_cluster", open_and_look)
    job = write_job(tmp_path, dataset)
    assert train(job, "--cluster", "local:2") == 0
    assert sockets and all(address.startswith("127.0.0.1:") for address in sockets), sockets
    assert digest(tmp_path / "run") == local_digest[3]
    events = (tmp_path / "run" / "events.log").read_text()
    assert events.count("tcp://127.0.0.1:") >= 3  # the scheduler and both workers, on loopback only


def test_every_dask_process_listens_on_loopback_only(cluster) -> None:
    dask, _ = cluster
    sockets = listening({started.process.pid for started in dask.started})
    assert sockets and all(address.startswith("127.0.0.1:") for address in sockets), sockets


def test_a_worker_killed_mid_run_changes_nothing(cluster, dataset: Path, local_digest, tmp_path: Path) -> None:
    """A third worker SIGKILLs itself right after writing its 4th gradient file, before it answers.

    Its task re-runs on another worker under a new attempt number (the file it left is never read).
    """
    dask, client = cluster
    faulty = dask.start_worker("faulty", env={"MEMTRAIN_FAULT": "after_grad_write:4",
                                              "MEMTRAIN_FAULT_ONCE": str(tmp_path / "fired")})
    try:
        dask.wait_for_workers(client, {"w1", "w2", "faulty"})
        job = write_job(tmp_path, dataset, epochs=12)
        assert train(job, "--cluster", dask.address) == 0
        assert (tmp_path / "fired").exists()
        events = (tmp_path / "run" / "events.log").read_text()
        assert "lost Dask worker" in events
        # seen as a death at once (the scheduler's plugin: the broadcast round ends), not after train.task_timeout.
        # The round's tasks not yet answered then run per task: the dead worker's, and those of the two live
        # workers that had not answered by the time the scheduler saw it go (on a quiet machine they have, "1 of
        # 3"; on a busy one a live worker may still be computing: "2 of 3" or "3 of 3", the same path).
        assert re.search(r"broadcast round of 3 workers ended: a worker of the round left the scheduler; "
                         r"[123] of 3 gradient tasks run per task", events)
        assert "silent for" not in events
        assert digest(tmp_path / "run") == local_digest[12]
    finally:
        dask.stop(faulty)
        dask.started.remove(faulty)


@pytest.mark.slow  # kept out of CI for time; the core fault tests above and below stay in
def test_a_hung_worker_is_left_out_and_its_task_runs_elsewhere(cluster, dataset: Path, local_digest,
                                                                tmp_path: Path) -> None:
    """A third worker SIGSTOPs itself inside its 3rd gradient task: silent past train.task_timeout."""
    dask, client = cluster
    hung = dask.start_worker("hung", env={"MEMTRAIN_FAULT": "before_grad_write:3", "MEMTRAIN_FAULT_ACTION": "stop",
                                          "MEMTRAIN_FAULT_ONCE": str(tmp_path / "fired")})
    try:
        dask.wait_for_workers(client, {"w1", "w2", "hung"})
        job = write_job(tmp_path, dataset)
        assert train(job, "--cluster", dask.address, "--set", "train.task_timeout=4") == 0
        events = (tmp_path / "run" / "events.log").read_text()
        assert "silent for 4 s" in events and "silent past train.task_timeout" in events
        assert digest(tmp_path / "run") == local_digest[3]
    finally:
        dask.kill(hung)  # SIGKILL: a stopped process does not act on SIGTERM
        dask.started.remove(hung)


def covering(folder: Path) -> tuple[str, ...]:
    """A command prefix: run in a mount namespace of its own where an empty tmpfs covers ``folder`` -- the
    same path, another filesystem, as on a node that lacks the shared mount."""
    if shutil.which("unshare") is None:
        pytest.fail("this test needs util-linux's unshare (and root) to give a worker its own mounts")
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c",
            f"mount -t tmpfs memtrain-test {folder} && exec \"$@\"", "sh")


def pool_of_the_workers(client: Client, dataset: Path, run: Path, exchange: Path, logs: list[str],
                        worker_state: Callable[..., object] = WorkerState) -> ClusterPool:
    """A ClusterPool of the cluster's workers for a run of the small MLP in ``run`` (its version 0 published)."""
    (run / WEIGHTS_DIR).mkdir(parents=True)
    exchange.mkdir()
    context = model_context(open_dataset(dataset), "mlp", {"hidden": [16]}, True)
    publish_weights(run, 0, context.layout.flatten(context.model.init(np.random.default_rng(0))))
    rounds = RoundSetup(batch_size=100, tasks_per_update=1, seed=0, epochs=1, shuffle="rows", shuffle_window=64,
                        keep_versions=2, on_nonfinite="stop",
                        slots=1)
    setup = WorkerSetup(server_pid=os.getpid(), run_dir=str(run), exchange_dir=str(exchange), dataset=str(dataset),
                        normalize=True, model_kind="mlp", model_options=(("hidden", [16]),), blas_threads=1,
                        optimizer=OptimizerConfig(), rounds=rounds)
    return ClusterPool(client, setup, server_probe(dataset, run, exchange), worker_state, log=logs.append)


def test_the_workers_of_a_pool_start_side_by_side(cluster, dataset: Path, tmp_path: Path) -> None:
    """Each worker's start (the view check, the dataset and the model opened: seconds on a busy machine) is called on
    every worker before any answer is awaited: the pool's start takes about one worker's start, not the sum of
    them (the pool once awaited each worker's start before calling the next one's)."""
    from tests.cluster_tasks import START_SLEEP, slow_worker_state

    run = tmp_path / "run"
    pool = pool_of_the_workers(cluster[1], dataset, run, tmp_path / "exchange", [], slow_worker_state)
    try:
        spans = [tuple(map(float, path.read_text().split())) for path in run.glob("started-*.txt")]
        assert len(spans) == 2 == len(pool.slots), spans
        (began_1, ended_1), (began_2, ended_2) = sorted(spans)
        assert began_2 < ended_1, f"the second worker began its start {began_2 - ended_1:.2f} s after the first ended"
        assert ended_1 - began_1 >= START_SLEEP
    finally:
        pool.close()


def test_a_worker_that_leaves_before_its_memtrain_worker_starts_is_given_up_then(cluster, dataset: Path,
                                                                                  tmp_path: Path) -> None:
    """A Dask worker the pool sees join, which leaves the scheduler before its actor started -- as a worker that
    died while the scheduler still listed it, which the pool took for one that joined (a node's Dask worker killed
    by a fault in tests/test_node_processes.py did so in full suite runs): its slot is given up as soon as the
    scheduler no longer lists it, not after JOIN_SECONDS (20 s) of the server's loop waiting for an actor bound to a
    worker that is gone."""
    dask, client = cluster
    logs: list[str] = []
    pool = pool_of_the_workers(client, dataset, tmp_path / "run", tmp_path / "exchange", logs)
    leaving = dask.start_worker("leaving", nanny=False)
    try:
        address = dask.wait_for_workers(client, {"w1", "w2", "leaving"})["leaving"]["address"]
        os.kill(leaving.process.pid, signal.SIGSTOP)  # still listed, but it starts no actor
        killer = threading.Timer(1.0, os.kill, (leaving.process.pid, signal.SIGKILL))
        killer.start()
        started = time.monotonic()
        while address not in pool.excluded and time.monotonic() < started + 2 * JOIN_SECONDS:
            assert pool.wait(0.2) == []
        took = time.monotonic() - started
        assert any(f"not using a Dask worker that joined: Dask worker {address} left the scheduler before its "
                   "memtrain worker started" in line for line in logs), logs
        assert address not in pool.started and len(pool.slots) == 2
        assert took < JOIN_SECONDS / 2, took
    finally:
        pool.close()
        dask.kill(leaving)
        dask.started.remove(leaving)


@pytest.mark.slow  # kept out of CI for time; the core fault tests above and below stay in
def test_a_worker_that_joins_later_gets_a_slot_and_work_and_its_leaving_is_seen(cluster, dataset: Path,
                                                                                 tmp_path: Path) -> None:
    """... while one that joins at the same time but cannot see the run directory is left out."""
    dask, client = cluster
    run, exchange = tmp_path / "run", tmp_path / "exchange"
    logs: list[str] = []
    pool = pool_of_the_workers(client, dataset, run, exchange, logs)
    late = []
    try:
        assert len(pool.slots) == 2
        late = [dask.start_worker("late"), dask.start_worker("lateblind", prefix=covering(run))]
        joined = dask.wait_for_workers(client, {"w1", "w2", "late", "lateblind"})
        address = joined["late"]["address"]
        deadline = time.monotonic() + 30
        while {address, joined["lateblind"]["address"]} - set(pool.started) - pool.excluded:
            assert pool.wait(0.2) == [] and time.monotonic() < deadline
        assert joined["lateblind"]["address"] in pool.excluded and len(pool.slots) == 3
        assert any(f"not using a Dask worker that joined: Dask worker {joined['lateblind']['address']}" in line
                   and "cannot see the run directory's probe" in line for line in logs)
        slot = next(s for s in pool.slots if s.process.address == address)
        task = GradTask(task=5, attempt=0, ticket=0, version=0, epoch=0, lo=0, hi=100)
        pool.send(slot, task)
        events = []
        while not events and time.monotonic() < deadline:
            events = pool.wait(1.0)
        assert [(e.slot.process.address, e.message, e.answer.rows) for e in events] == [(address, task, 100)]
        assert (exchange / streamed_gradient_name(0, 5, 0)).exists()
        dask.stop(late[0])
        events = []
        while not events and time.monotonic() < deadline:
            events = pool.wait(1.0)
        assert [(e.slot.process.address, e.answer) for e in events] == [(address, None)]
        assert address not in pool.started and len(pool.slots) == 2
        assert any("joined" in line for line in logs) and any("left the scheduler" in line for line in logs)
    finally:
        pool.close()
        for started in late:
            dask.stop(started)
            dask.started.remove(started)
    held = client.run(open_files_under, str(exchange))
    assert held and not any(held.values())  # and the workers, which outlive the run, hold none of its files


def test_a_worker_that_sees_another_filesystem_is_refused_by_name(cluster, dataset: Path, tmp_path: Path,
                                                                  capsys) -> None:
    """The worker runs in its own mount namespace where an empty tmpfs covers the dataset's directory:
    the same path, another filesystem -- as on a node that lacks the shared mount."""
    dask, client = cluster
    blind = dask.start_worker("blind", prefix=covering(dataset), nanny=False)
    try:
        info = dask.wait_for_workers(client, {"w1", "w2", "blind"})
        job = write_job(tmp_path, dataset)
        assert train(job, "--cluster", dask.address) == 2
        err = capsys.readouterr().err
        assert f"Dask worker {info['blind']['address']}" in err
        assert "cannot read the dataset" in err and "manifest.json" in err
        assert "mounted at the same path on every node" in err
        assert weight_versions(tmp_path / "run") == [0]  # refused before the first update
    finally:
        dask.stop(blind)
        dask.started.remove(blind)


def test_losing_the_scheduler_stops_the_run_and_resume_finishes_it_locally(dataset: Path, local_digest,
                                                                            tmp_path: Path) -> None:
    """The server is a `memtrain train` process; its scheduler is SIGKILLed after the first checkpoint."""
    dask = DaskProcesses(tmp_path / "dask")
    try:
        dask.start_scheduler()
        dask.start_worker("w1")
        with Client(dask.address, timeout=30) as client:
            dask.wait_for_workers(client, {"w1"})
        job = write_job(tmp_path, dataset, epochs=12)
        run = tmp_path / "run"
        server = subprocess.Popen([sys.executable, "-m", "memtrain", "train", str(job), "--cluster", dask.address],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not checkpoint_updates(run) and time.monotonic() < deadline and server.poll() is None:
                time.sleep(0.02)
            dask.kill(dask.started[0])  # the scheduler, SIGKILLed
            killed = time.monotonic()
            _, err = server.communicate(timeout=60)
        finally:
            server.kill()
        assert server.returncode == 1, err
        assert "lost the Dask scheduler" in err and f"memtrain train --resume {run}" in err
        assert "Traceback" not in err
        # Usually 0.13 s (the comm closes at once). Where a call to the killed scheduler hangs instead, each is
        # bounded by SCHEDULER_SECONDS: one fresh-check stopped after 20.1 s (cause of the hang not found)
        took = time.monotonic() - killed
        assert took < 3 * SCHEDULER_SECONDS, (took, err)
        assert checkpoint_updates(run)
    finally:
        dask.close()
    assert train("--resume", run, "--cluster", "") == 0
    assert digest(run) == local_digest[12]


def test_a_stop_signal_mid_run_checkpoints_and_resume_finishes_it(cluster, dataset: Path, local_digest,
                                                                    tmp_path: Path) -> None:
    """SIGINT to a cluster run's server, mid-stream (a weight version past the first epoch's): exit 130,
    a checkpoint where it stood, and ``--resume`` on the cluster ends on the bits of a local run."""
    dask, _ = cluster
    job = write_job(tmp_path, dataset, epochs=12)
    run = tmp_path / "run"
    server = subprocess.Popen([sys.executable, "-m", "memtrain", "train", str(job), "--cluster", dask.address],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while (not (run / WEIGHTS_DIR).is_dir() or max(weight_versions(run), default=0) < 10) \
                and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.01)
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=60)
    finally:
        server.kill()
    assert server.returncode == 130, err
    assert f"resume with: memtrain train --resume {run}" in err and "Traceback" not in err
    assert max(checkpoint_updates(run)) >= 10  # where it stood, not only the last epoch's checkpoint
    assert not [p for p in run.rglob("g-*")]
    assert train("--resume", run, "--cluster", dask.address) == 0
    assert digest(run) == local_digest[12]


def test_an_unreachable_scheduler_is_a_clear_error_within_the_bound() -> None:
    import socket

    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    # a 0.5 s bound, waited out whole (Dask retries a refused connection until its timeout): the same path as 20 s
    unreachable = rf"cannot reach the Dask scheduler at tcp://127.0.0.1:{port} within 0\.5 s"
    with pytest.raises(MemtrainError, match=unreachable), \
            connected(parse_cluster(f"tcp://127.0.0.1:{port}"), connect_seconds=0.5):
        pass
    assert time.monotonic() - started < 15


@pytest.mark.parametrize(("text", "message"), [
    ("127.0.0.1:8786", "not a Dask cluster address"),
    ("udp://127.0.0.1:8786", "unsupported protocol udp://"),
    ("tcp://127.0.0.1:99999", "port out of range"),
    ("local:0", "1 to 256 workers"),
    ("local:two", "not a Dask cluster address"),
])
def test_bad_cluster_addresses_are_usage_errors(text: str, message: str, tmp_path: Path, dataset: Path,
                                                capsys) -> None:
    with pytest.raises(InputError, match=message):
        parse_cluster(text)
    assert train(write_job(tmp_path, dataset), "--cluster", text) == 2
    err = capsys.readouterr().err
    assert "run.cluster" in err and message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_good_cluster_addresses() -> None:
    assert parse_cluster("tcp://node-7.cluster:8786").scheduler == "tcp://node-7.cluster:8786"
    assert parse_cluster("tls://[::1]:8786").scheduler == "tls://[::1]:8786"
    assert parse_cluster(" local:3 ").local_workers == 3


def test_without_the_cluster_extra_the_error_says_how_to_install_it(tmp_path: Path, dataset: Path) -> None:
    job = write_job(tmp_path, dataset)
    blocker = ("import sys\n"
               "class Block:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name == 'distributed' or name.startswith('distributed.'):\n"
               "            raise ImportError(f'No module named {name!r}')\n"
               "sys.meta_path.insert(0, Block())\n"
               "from memtrain.cli import main\n"
               f"sys.exit(main(['train', {str(job)!r}, '--cluster', 'local:1']))\n")
    done = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert 'pip install "memtrain[cluster]"' in done.stderr and "Traceback" not in done.stderr


def test_the_records_dask_carries_are_small() -> None:
    """The frames of an actor call carrying a task, and of its answer, as Dask serializes them."""
    task = GradTask(task=12, attempt=2, ticket=10**9, version=123_456_789, epoch=10**6, lo=10**12, hi=10**12 + 10**9)
    call = dumps({"op": "actor_execute", "function": "run", "actor": "memtrain-worker-0123456789ab",
                  "args": [to_serialize(task)], "kwargs": {}})
    result = Result(task=12, attempt=2, outcome=Outcome.DONE, loss=1e30, rows=10**9, seconds=12.5)
    answer = dumps({"status": "OK", "result": to_serialize(result)})
    assert sum(map(len, call)) < 600
    assert sum(map(len, answer)) < 600
    # a step slice of 1e7 / 16 parameters, of an update of 64 tasks: no file names, its digests 16 bytes a block
    step = StepTask(task=15, attempt=1, update=10**9, version=123_456_789, lo=9_375_000, hi=10**7, rows=10**6,
                    lr=1e-3, tasks=64, retried=((60, 1), (61, 2)))
    assert step.attempts == (0,) * 60 + (1, 2, 0, 0)
    # without retries a slice's record is the same size for 300 tasks or 60,000: N slices cost N records, not N^2
    sizes = {len(dumps(to_serialize(StepTask(task=1, attempt=0, update=7, version=7, lo=0, hi=10**7, rows=10**6,
                                             lr=1e-3, tasks=tasks)))[-1]) for tasks in (300, 60_000)}
    assert len(sizes) == 1
    call = dumps({"op": "actor_execute", "function": "run", "actor": "memtrain-worker-0123456789ab",
                  "args": [to_serialize(step)], "kwargs": {}})
    done = Result(task=15, attempt=1, outcome=Outcome.DONE, rows=625_000, digests=bytes(16 * 10))
    answer = dumps({"status": "OK", "result": to_serialize(done)})
    assert sum(map(len, call)) < 800
    assert sum(map(len, answer)) < 800


def test_the_slurm_example_parses_its_arguments() -> None:
    example = Path(__file__).resolve().parent.parent / "jobs" / "examples" / "slurm-dask.py"
    done = subprocess.run([sys.executable, str(example), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "--nodes" in done.stdout and "--partition" in done.stdout


def test_the_servers_bytes_per_update_do_not_grow_with_the_workers(cluster, tmp_path: Path, capsys,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost bench's counters (``memtrain bench train --cluster ADDRESS --costs``), 3 tasks per update on 2,
    then 3 workers: the server's records per update are the same (one gradient record and one step record
    posted, two counts awaited: memtrain/cluster/broadcast.py), it writes the same few KiB and no parameter;
    the workers together move (2T + 1) vectors in and (T + 1) out for T tasks, whatever N."""
    dask, client = cluster
    tasks = 3
    rows = {2: run_costs([300_000], dask.address, 5, 1, tmp_path / "two", tasks)["rows"][0]}
    third = dask.start_worker("costs-w3", nanny=False)
    try:
        dask.wait_for_workers(client, {"w1", "w2", "costs-w3"})
        rows[3] = run_costs([300_000], dask.address, 5, 1, tmp_path / "three", tasks)["rows"][0]
    finally:
        dask.stop(third)
        dask.started.remove(third)
    for n, row in rows.items():
        server, vector, each = row["server"], row["vector_bytes"], row["each_worker"]
        assert row["workers"] == n and len(each) == n
        assert 0 < server["records"] < 8 * 1024  # records only: two posts and two counts, about 2 KiB
        assert server["wchar"] < 16 * 1024 and server["write_bytes"] < 64 * 1024 < vector  # logs and records
        # the gradients (one version read, one gradient written each) and the slices (every gradient's slice and
        # the version's read, the new version's written): which worker takes a task is fixed by its rank; and
        # each worker's task rows and Dask's own traffic (its rchar counts socket reads)
        assert sum(w["read"] for w in each) <= (2 * tasks + 1) * vector * 1.05
        assert sum(w["written"] for w in each) <= (tasks + 1) * vector * 1.01
        assert row["server_cpu_ms"] > row["server_loop_cpu_ms"] > 0
    two, three = rows[2]["server"], rows[3]["server"]
    assert abs(three["wchar"] - two["wchar"]) < 4 * 1024 and abs(three["write_bytes"] - two["write_bytes"]) < 64 * 1024
    assert abs(three["records"] - two["records"]) <= 16  # the same records: N is not in them
    # the Markdown table, as a pipe or a log shows it: pytest-xdist's workers run with COLUMNS=80, where it is
    # laid out to fit (render.print_table) and has no "|" to split on
    monkeypatch.delenv("COLUMNS", raising=False)
    print_costs({"cluster": dask.address, "updates": 5, "warmup": 1, "loadavg_before": (0, 0, 0),
                 "loadavg_after": (0, 0, 0), "rows": [rows[2], rows[3]]})
    table = capsys.readouterr().out.splitlines()
    assert [line.split("|")[1:3] for line in table[3:]] == [[" 300,160 ", " 2 "], [" 300,160 ", " 3 "]]
