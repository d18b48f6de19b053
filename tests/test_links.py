"""Links planted where memtrain reuses a name (issue 30, defect 1): memtrain reuses, recycles, rewrites or maps
writable only regular files it made; a link is removed, never followed (docs/faults.md, "Rules that hold
everywhere"). Every test plants a link to a user's file of exactly the right size and checks the file's bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

from memtrain.errors import MemtrainError
from memtrain.layout import weight_versions, weights_path
from memtrain.train.weights import retire_weights

pytestmark = pytest.mark.timeout(120)

JOB = """
[data]
path = "{data}"

[model]
kind = "softmax"

[train]
epochs = 1
batch_size = 200
tasks_per_update = 2
lr = 0.1
seed = 3
workers = {workers}
{train}

[run]
dir = "run"
keep_versions = 2
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1000, features=4, classes=3, seed=2)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=300)


def memtrain(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memtrain", *map(str, args)], capture_output=True, text=True,
                          timeout=100)


@pytest.mark.parametrize("workers, train", [(0, ""), (2, ""), (2, 'mode = "async"\nmax_staleness = 2')],
                         ids=["server-only", "rounds", "async"])
def test_resume_never_rewrites_a_linked_users_file(tmp_path: Path, data: Path, workers: int, train: str) -> None:
    """The reproduction: the version the next update retires (and recycles) is replaced by a link to a user's
    .npy of the same shape; ``--resume`` for one more epoch must leave the user's file as it was."""
    (tmp_path / "job.toml").write_text(JOB.format(data=data, workers=workers, train=train))
    first = memtrain("train", tmp_path / "job.toml")
    assert first.returncode == 0, first.stderr
    run = tmp_path / "run"
    oldest = weight_versions(run)[0]
    victim = tmp_path / "precious.npy"
    np.save(victim, np.load(weights_path(run, oldest)) + 7.0)
    before = victim.read_bytes()
    weights_path(run, oldest).unlink()
    weights_path(run, oldest).symlink_to(victim)
    resumed = memtrain("train", "--resume", run, "--set", "train.epochs=2")
    assert resumed.returncode == 0, resumed.stderr
    assert victim.read_bytes() == before, "memtrain wrote through a link it did not make"
    assert not any(p.is_symlink() for p in (run / "weights").iterdir()), "the link was removed, not kept"


def test_retire_removes_a_link_and_a_hard_link_instead_of_recycling_them(tmp_path: Path) -> None:
    """The rule at its helper: neither a symbolic nor a hard link to a file outside the run is recycled."""
    run = tmp_path / "run"
    (run / "weights").mkdir(parents=True)
    precious = tmp_path / "precious.npy"
    np.save(precious, np.arange(8, dtype=np.float32))
    before = precious.read_bytes()
    for version in (1, 2, 3):
        np.save(weights_path(run, version), np.zeros(8, dtype=np.float32))
    weights_path(run, 1).unlink()
    weights_path(run, 1).symlink_to(precious)
    size = precious.stat().st_size
    assert retire_weights(run, 1, 3, recycle=(tmp_path / "spare", size)) == tmp_path / "spare"  # version 2, ours
    assert not os.path.lexists(weights_path(run, 1)) and precious.read_bytes() == before
    weights_path(run, 3).unlink()
    os.link(precious, weights_path(run, 4))
    assert retire_weights(run, 1, 5, recycle=(tmp_path / "spare2", size)) is None
    assert not os.path.lexists(weights_path(run, 4)) and precious.read_bytes() == before


def test_writable_maps_and_reuse_never_follow_a_link(tmp_path: Path) -> None:
    from memtrain.files import open_fd, open_reused

    target = tmp_path / "target"
    target.write_bytes(b"user data")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(MemtrainError, match="refusing to write through a symbolic link"):
        open_fd(link, write=True)
    os.close(open_fd(link))  # reading through a link stays allowed
    assert open_reused(link, os.O_WRONLY) is None
    assert not os.path.lexists(link) and target.read_bytes() == b"user data"


def test_a_cluster_workers_probe_never_writes_through_a_link(tmp_path: Path, data: Path) -> None:
    """The exchange-area probe a Dask worker writes (cluster/sharedfs.py) is published by rename, not opened
    with "w" (which truncated and wrote the link's target)."""
    from memtrain.cluster.sharedfs import look, server_probe
    from memtrain.layout import cluster_probe_name

    run, exchange = tmp_path / "run", tmp_path / "exchange"
    run.mkdir()
    exchange.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_text("user data")
    probe = server_probe(data, run, exchange)
    (exchange / cluster_probe_name("worker-1")).symlink_to(victim)
    view = look(probe, "worker-1")
    assert view.problems == () and victim.read_text() == "user data"
    assert not (exchange / cluster_probe_name("worker-1")).is_symlink()
