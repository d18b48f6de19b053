"""``--cluster slurm`` on a real Slurm started here (tests/slurm_cluster.py: slurmctld, 3 slurmd on 127.0.0.1,
munge): ``sbatch`` of the shipped jobs/examples/slurm-memtrain.sbatch, whose ``srun`` runs ``memtrain train ...
--cluster slurm`` on every node.

The run gives a local run's weights, bitwise. The time limit's warning (``scancel --signal=TERM --batch``: what
``#SBATCH --signal=B:TERM@120`` sends) ends with a checkpoint, the script requeues the job, and the requeued job
resumes to the uninterrupted run's bits.

Marked ``slurm`` (kept out of the default run: CI has Python and pip only): ``python -m pytest -m slurm
tests/test_slurm_real.py``, as root, with ``apt-get install -y slurm-wlm munge``; skipped, saying why, without.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from slurm_cluster import SlurmCluster, unavailable  # noqa: E402
from test_cluster import digest, train, write_job  # noqa: E402
from tiny_data import blobs, write_dataset  # noqa: E402

from memtrain.layout import WEIGHTS_DIR, checkpoint_updates, slurm_rendezvous_path, weight_versions  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "jobs" / "examples" / "slurm-memtrain.sbatch"
NODES = 3
RUN_SECONDS = 180.0


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=NODES)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


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


def submit(slurm: SlurmCluster, folder: Path, job: Path) -> str:
    """``sbatch --nodes 3 slurm-memtrain.sbatch JOB --cluster slurm:lo`` from ``folder``, with this checkout's memtrain
    on the path: the script's extra arguments go to memtrain train, the last ``--cluster`` wins, and Dask listens on
    loopback only (the nodes are this host)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["PYTHONPATH"] = path  # sbatch passes the submitting environment on to the job (--export=ALL)
    out = slurm.run("sbatch", "--parsable", f"--nodes={NODES}", f"--chdir={folder}",
                    f"--output={folder}/slurm-%j.out", str(SCRIPT), str(job), "--cluster", "slurm:lo")
    return out.strip().split(";")[0]


def job_output(folder: Path, job_id: str) -> str:
    path = folder / f"slurm-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else "(no output file)"


def test_an_sbatch_of_the_example_script_on_3_nodes_gives_the_weights_of_a_local_run(
        slurm: SlurmCluster, dataset: Path, local_digest, tmp_path: Path) -> None:
    job_id = submit(slurm, tmp_path, write_job(tmp_path, dataset, epochs=3))
    info = slurm.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, RUN_SECONDS)
    out = job_output(tmp_path, job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out
    assert info["NumNodes"] == str(NODES)
    assert digest(tmp_path / "run") == local_digest[3]
    assert not slurm_rendezvous_path(tmp_path / "run", job_id, 0).exists()  # rank 0 cleaned up
    assert "Traceback" not in out


def test_the_time_limit_warning_checkpoints_and_the_requeued_job_resumes_to_the_same_bits(
        slurm: SlurmCluster, dataset: Path, local_digest, tmp_path: Path) -> None:
    """``scancel --signal=TERM --batch``: the batch shell's trap passes it on to every task, rank 0 checkpoints
    where it stands and exits 143, the script requeues the job; Slurm runs it again (restart count 1) and rank 0
    resumes the run from the checkpoint to the bits of an uninterrupted local run."""
    job_id = submit(slurm, tmp_path, write_job(tmp_path, dataset, epochs=12))
    run = tmp_path / "run"
    deadline = time.monotonic() + RUN_SECONDS
    while not (run / WEIGHTS_DIR).is_dir() or max(weight_versions(run), default=0) < 10:
        assert time.monotonic() < deadline, job_output(tmp_path, job_id) + slurm.logs()
        assert slurm.job(job_id).get("JobState") in {"PENDING", "RUNNING"}, job_output(tmp_path, job_id)
        time.sleep(0.05)
    slurm.run("scancel", "--signal=TERM", "--batch", job_id)
    # Slurm 22.05 makes a requeued job eligible again only 120 s after the requeue (EligibleTime)
    info = slurm.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, RUN_SECONDS + 120,
                          restarts=1)
    out = job_output(tmp_path, job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out
    assert info["Restarts"] == "1", info  # requeued once, by the script
    events = (run / "events.log").read_text()
    assert "resumed from" in events, events
    stopped = [int(u) for u in checkpoint_updates(run)]
    assert stopped and max(stopped) >= 10
    assert digest(run) == local_digest[12]
    # the first attempt's output: up to the requeued attempt's first line (each worker rank says its layout once
    # per attempt). Not up to srun's first "srun: error:" report of a task's 143: rank 0 marks the end in the
    # rendezvous file before its own message is printed, so a worker rank may exit, and srun say so, before it
    again = "memtrain train: rank 1:"
    assert out.count(again) == 2, out
    first = out[:out.find(again, out.find(again) + 1)]
    assert "stopped by SIGTERM" in first and "resume with" in first and "Traceback" not in first
    for restart in (0, 1):
        assert not slurm_rendezvous_path(run, job_id, restart).exists()
