"""``--cluster slurm`` with a faked Slurm environment: every rank is a real ``memtrain train`` process on
127.0.0.1 (``slurm:lo``), started with the ``SLURM_*`` variables srun would give it.

Rank 0 starts a Dask scheduler and serves, ranks 1 and 2 run its workers: the weights of a local run,
bitwise. SIGTERM to every task mid-run (what ``scancel --signal=TERM`` and srun's forwarding of the batch
shell's ``--signal=B:TERM@120`` deliver) ends with a checkpoint, every rank exits, and the same command
started again as a requeue (``SLURM_RESTART_COUNT=1``) resumes to the uninterrupted run's bits. Outside an
allocation, a rendezvous that never comes and a bad interface are clear errors.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from test_cluster import digest, train, write_job  # noqa: E402
from tiny_data import blobs, write_dataset  # noqa: E402

from memtrain.cluster.address import parse_cluster  # noqa: E402
from memtrain.cluster.slurm import wait_for_rendezvous  # noqa: E402
from memtrain.errors import MemtrainError  # noqa: E402
from memtrain.layout import WEIGHTS_DIR, checkpoint_updates, slurm_rendezvous_path, weight_versions  # noqa: E402

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parent.parent
RANKS = 3


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1500, features=8, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=300)


@pytest.fixture(scope="module")
def local_digest(tmp_path_factory: pytest.TempPathFactory, dataset: Path) -> dict[int, str]:
    digests = {}
    for epochs in (3, 12):
        folder = tmp_path_factory.mktemp(f"local{epochs}")
        assert train(write_job(folder, dataset, epochs)) == 0
        digests[epochs] = digest(folder / "run")
    return digests


def slurm_env(rank: int, *, restart: int = 0, job_id: str = "4242") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, "SLURM_JOB_ID": job_id, "SLURM_PROCID": str(rank),
            "SLURM_NODEID": str(rank), "SLURM_NTASKS": str(RANKS), "SLURM_CPUS_ON_NODE": "1",
            "SLURM_RESTART_COUNT": str(restart)}


def start_ranks(folder: Path, job: Path, *, restart: int = 0) -> list[subprocess.Popen]:
    """The srun of the example script, faked: the same command in every task, rank 0 last (the workers wait)."""
    ranks = []
    for rank in reversed(range(RANKS)):
        log = open(folder / f"rank{rank}-{restart}.txt", "w")  # noqa: SIM115 - closed with the process
        ranks.append(subprocess.Popen([sys.executable, "-m", "memtrain", "train", str(job), "--cluster", "slurm:lo"],
                                      cwd=folder, stdout=log, stderr=subprocess.STDOUT, text=True,
                                      env=slurm_env(rank, restart=restart), start_new_session=True))
        log.close()
    return ranks[::-1]


def finish(ranks: list[subprocess.Popen], seconds: float = 120) -> list[int]:
    deadline = time.monotonic() + seconds
    try:
        for process in ranks:
            process.wait(max(0.1, deadline - time.monotonic()))
    finally:
        for process in ranks:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return [process.returncode for process in ranks]


def output(folder: Path, rank: int, restart: int = 0) -> str:
    return (folder / f"rank{rank}-{restart}.txt").read_text()


def test_one_server_rank_and_two_worker_ranks_give_the_weights_of_a_local_run(dataset: Path, local_digest,
                                                                                tmp_path: Path) -> None:
    job = write_job(tmp_path, dataset, epochs=3)
    codes = finish(start_ranks(tmp_path, job))
    assert codes == [0, 0, 0], [output(tmp_path, rank) for rank in range(RANKS)]
    assert digest(tmp_path / "run") == local_digest[3]
    assert not slurm_rendezvous_path(tmp_path / "run", "4242", 0).exists()  # rank 0 cleaned up
    assert "Traceback" not in "".join(output(tmp_path, rank) for rank in range(RANKS))


def test_sigterm_checkpoints_and_the_requeued_job_resumes_to_the_same_bits(dataset: Path, local_digest,
                                                                           tmp_path: Path) -> None:
    """SIGTERM to every task (srun forwarding the batch shell's), then, in the requeued job, to rank 0 alone: each
    time rank 0 checkpoints where it stands and the worker ranks end (143 if they were signalled, else 0); the job
    requeued once more ends on the uninterrupted bits. One job takes both signals (before, a job each: one start
    of 3 ranks and their Dask processes more)."""
    job = write_job(tmp_path, dataset, epochs=12)
    run = tmp_path / "run"
    stopped_at = 0
    for restart, signalled in enumerate(["every task", "rank 0"]):
        stopped_at = stop_mid_run(tmp_path, job, restart, signalled, past=stopped_at + 10)
    codes = finish(start_ranks(tmp_path, job, restart=2))  # the requeue: the same command, restart count 2
    assert codes == [0, 0, 0], [output(tmp_path, rank, 2) for rank in range(RANKS)]
    assert digest(run) == local_digest[12]
    assert (run / "events.log").read_text().count("resumed from") == 2
    assert "Traceback" not in "".join(output(tmp_path, rank, restart) for rank in range(RANKS)
                                      for restart in (0, 1, 2))


def stop_mid_run(folder: Path, job: Path, restart: int, signalled: str, past: int) -> int:
    """The job's ranks (of this restart count) SIGTERMed (``signalled``: every task or rank 0) once a weight version
    past ``past`` is out; checks how each rank ended and returns the update of the checkpoint rank 0 wrote."""
    run = folder / "run"
    ranks = start_ranks(folder, job, restart=restart)
    try:
        deadline = time.monotonic() + 120
        while (not (run / WEIGHTS_DIR).is_dir() or max(weight_versions(run), default=0) < past) \
                and time.monotonic() < deadline and ranks[0].poll() is None:
            time.sleep(0.01)
        for process in ranks if signalled == "every task" else ranks[:1]:
            process.send_signal(signal.SIGTERM)
    finally:
        codes = finish(ranks)
    assert codes[0] == 128 + signal.SIGTERM, output(folder, 0, restart)
    assert "resume with" in output(folder, 0, restart) and "Traceback" not in output(folder, 0, restart)
    assert codes[1:] == [128 + signal.SIGTERM if signalled == "every task" else 0] * (RANKS - 1), codes
    stopped_at = max(checkpoint_updates(run))
    assert stopped_at >= past  # where it stood, not only the last epoch's checkpoint
    assert not slurm_rendezvous_path(run, "4242", restart).exists()
    return stopped_at


def test_outside_an_allocation_the_error_says_how_to_start_it(dataset: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-m", "memtrain", "train", str(write_job(tmp_path, dataset)),
                           "--cluster", "slurm"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "SLURM_JOB_ID, SLURM_PROCID, SLURM_NTASKS not set" in done.stderr and "srun" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_a_single_task_is_refused(dataset: Path, tmp_path: Path) -> None:
    env = {**slurm_env(0), "SLURM_NTASKS": "1"}
    done = subprocess.run([sys.executable, "-m", "memtrain", "train", str(write_job(tmp_path, dataset)),
                           "--cluster", "slurm"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "needs at least 2 tasks" in done.stderr and "SLURM_NTASKS=1" in done.stderr


def test_a_rendezvous_that_never_comes_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = slurm_rendezvous_path(tmp_path / "run", "4242", 0)
    started = time.monotonic()
    with pytest.raises(MemtrainError, match="no rendezvous from rank 0 after 0.5 s") as caught:
        wait_for_rendezvous(path, seconds=0.5)
    assert str(path) in str(caught.value) and time.monotonic() - started < 5


def test_a_worker_rank_whose_rendezvous_never_comes_exits_with_the_error(dataset: Path, tmp_path: Path, capsys,
                                                                        monkeypatch) -> None:
    from memtrain.cluster import slurm

    monkeypatch.setattr(slurm, "RENDEZVOUS_SECONDS", 0.5)
    for name, value in slurm_env(1).items():
        if name.startswith("SLURM_"):
            monkeypatch.setenv(name, value)
    assert train(write_job(tmp_path, dataset), "--cluster", "slurm") == 1
    err = capsys.readouterr().err
    assert "no rendezvous from rank 0 after 0.5 s" in err and "run.slurm-4242-0.json" in err
    assert not (tmp_path / "run").exists()


def test_slurm_addresses() -> None:
    assert parse_cluster("slurm").slurm and parse_cluster("slurm").interface is None
    assert parse_cluster(" slurm:ib0 ").interface == "ib0"
    with pytest.raises(MemtrainError, match="not a Dask cluster address"):
        parse_cluster("slurm:")


def test_an_interface_this_node_lacks_is_a_clear_error(dataset: Path, tmp_path: Path, capsys,
                                                      monkeypatch) -> None:
    for name, value in slurm_env(0).items():
        if name.startswith("SLURM_"):
            monkeypatch.setenv(name, value)
    assert train(write_job(tmp_path, dataset), "--cluster", "slurm:nosuch0") == 2
    err = capsys.readouterr().err
    assert "no IPv4 address on network interface 'nosuch0'" in err and "lo" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_heartbeat_to_a_closed_scheduler_is_a_line_not_a_traceback() -> None:
    """Rank 0 ending the run while a worker's heartbeat is in flight: Dask logs the failure with its traceback,
    which once made a clean requeued run print one. The worker processes' preload keeps the line, drops the
    traceback; every other record passes untouched."""
    import io
    import logging

    from memtrain.cluster.dask_child import dask_setup

    logger, stream = logging.getLogger("distributed.worker"), io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    before = list(logger.filters)
    try:
        dask_setup(object())
        for message in ("Failed to communicate with scheduler during heartbeat.", "another failure"):
            try:
                raise OSError("Stream is closed")
            except OSError:
                logger.exception(message)
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = before
    printed = stream.getvalue()
    assert "Failed to communicate with scheduler during heartbeat." in printed
    assert printed.count("Traceback") == 1 and printed.index("another failure") < printed.index("Traceback")
