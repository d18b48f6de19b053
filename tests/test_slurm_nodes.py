"""``--cluster slurm`` with nodes (issue 42): a worker rank serves its node as one Dask worker standing for the
node's processes (``MEMTRAIN_NODE_PROCESSES``: memtrain/cluster/nodes.py) when the model's tasks may run as its
threads, instead of a Dask worker per core. The faked Slurm environment of tests/test_slurm.py, with 2 CPUs per
worker rank."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from test_cluster import digest, write_job  # noqa: E402
from test_slurm import RANKS, dataset, finish, local_digest, output, slurm_env  # noqa: E402, F401 - fixtures

from memtrain.cluster.nodes import PROCESSES_ENV  # noqa: E402
from memtrain.cluster.slurm import SlurmTask, worker_layout  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def test_worker_ranks_of_two_cpus_are_one_node_each_and_give_the_weights_of_a_local_run(
        dataset: Path, local_digest, tmp_path: Path) -> None:  # noqa: F811 - test_slurm's fixtures
    job = write_job(tmp_path, dataset, epochs=3)
    ranks = []
    for rank in reversed(range(RANKS)):
        with open(tmp_path / f"rank{rank}-0.txt", "w") as log:
            ranks.append(subprocess.Popen(
                [sys.executable, "-m", "memtrain", "train", str(job), "--cluster", "slurm:lo"], cwd=tmp_path,
                stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                env={**slurm_env(rank), "SLURM_CPUS_ON_NODE": "2"}))
    codes = finish(ranks[::-1])
    assert codes == [0, 0, 0], [output(tmp_path, rank) for rank in range(RANKS)]
    assert digest(tmp_path / "run") == local_digest[3]
    for rank in (1, 2):
        assert f"rank {rank}: one Dask worker, a node of 2 processes" in output(tmp_path, rank)
    events = (tmp_path / "run" / "events.log").read_text()
    first = next(line for line in events.splitlines() if ": workers " in line)  # those present at the start
    joined = [line for line in events.splitlines() if ") joined: slot " in line]  # and those that came later
    assert first.count("(host ") + len(joined) == 2, events  # one per worker rank, not one per CPU


def test_the_worker_layout_of_a_rank() -> None:
    task = SlurmTask(rank=1, tasks=3, job_id="1", restart=0, cpus=8)
    assert worker_layout(task, workers="auto", blas_threads=1, model_kind="mlp", environ={})[:2] == (1, 8)
    assert worker_layout(task, workers=4, blas_threads=1, model_kind="mlp", environ={})[:2] == (1, 4)
    # BLAS on 2 threads: a node of 4 worker processes (train/loops/node_compute.py NodeProcesses)
    workers, node, why = worker_layout(task, workers="auto", blas_threads=2, model_kind="mlp", environ={})
    assert (workers, node) == (1, 4) and why.startswith("worker processes")
    assert worker_layout(task, workers="auto", blas_threads=1, model_kind="mlp", environ={PROCESSES_ENV: "3"}
                         )[:2] == (1, 3)
    # a model whose loss_and_grad may not run in several threads at once: a node of 8 worker processes
    workers, node, why = worker_layout(task, workers="auto", blas_threads=1,
                                       model_kind="tests.test_slurm_nodes:Unsafe", environ={})
    assert (workers, node) == (1, 8) and why.startswith("worker processes") and "thread_safe" in why


class Unsafe:
    """A model class that does not say ``thread_safe = True``."""
