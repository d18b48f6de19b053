"""Links planted where memtrain reuses a name (issue 30, defect 1): memtrain reuses, recycles, rewrites or maps
writable only regular files it made; a link is removed, never followed (docs/faults.md, "Rules that hold
everywhere"). Every test plants a link to a user's file of exactly the right size and checks the file's bytes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from in_process import here
from tiny_data import blobs, write_dataset

from memtrain.errors import MemtrainError
from memtrain.layout import RUN_FILES, RUN_FOLDERS, parse_exchange_owner, tmp_target, weight_versions, weights_path
from memtrain.train.exchange.weights import retire_weights

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
    """``memtrain ARGS`` through the CLI's entry point in this process (its workers spawned as always): none of
    these runs is killed, so none needs an interpreter of its own."""
    return here(*args)


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


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory: pytest.TempPathFactory, data: Path) -> Path:
    """A finished softmax run that writes every log memtrain has (metrics.csv, TensorBoard), its exchange
    area in the run directory: trained once for the module. Tests only read it, or change a copy of its
    folder (``copy_of``), which holds its job.toml and its ``run``."""
    folder = tmp_path_factory.mktemp("logged")
    (folder / "job.toml").write_text(JOB.format(data=data, workers=2, train="").replace(
        "keep_versions = 2", 'keep_versions = 2\nlog_to = ["csv", "tensorboard"]\nexchange = "run"'))
    result = memtrain("train", folder / "job.toml")
    assert result.returncode == 0, result.stderr
    return folder / "run"


def copy_of(run: Path, tmp_path: Path) -> Path:
    """The run (and its job.toml beside it) copied into ``tmp_path``, links kept as links: a test's own to change."""
    shutil.copytree(run.parent, tmp_path, symlinks=True, dirs_exist_ok=True)
    return tmp_path / run.name


@pytest.mark.parametrize("folder", RUN_FOLDERS)
def test_a_link_at_any_folder_of_a_run_is_refused_never_written_through(tmp_path: Path, logged_run: Path,
                                                                        folder: str) -> None:
    """Issue 41, #1: a link planted at ``tensorboard/`` was written through, also after ``--overwrite`` ("left in
    place"): event files landed outside the run. Every folder memtrain writes into goes through the one check
    (run_dir.check_entries over layout.RUN_FOLDERS): a resume and an overwrite are refused, naming it; the
    link and the folder it points to stay as they were."""
    run = copy_of(logged_run, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "mine.txt").write_text("the user's\n")
    if os.path.lexists(run / folder):
        os.rename(run / folder, tmp_path / "moved")
    (run / folder).symlink_to(outside)
    for extra in (("--resume", run, "--set", "train.epochs=2"),
                  (tmp_path / "job.toml", "--run-dir", run, "--overwrite")):
        result = memtrain("train", *extra)
        assert result.returncode == 1, result.stderr
        assert f"{run / folder}: expected a directory that memtrain made, found a symbolic link" in result.stderr
        assert "Traceback" not in result.stderr
        assert sorted(os.listdir(outside)) == ["mine.txt"] and (run / folder).is_symlink()


def test_every_name_a_run_writes_is_declared_and_so_checked(tmp_path: Path, data: Path, logged_run: Path) -> None:
    """The rule is structural, not a list each feature must remember: a run made with every feature that writes
    under its directory (both logs, checkpoints, weights, an additive pass killed mid-way with its statistics and
    exchange area left) holds only names layout.py declares (RUN_FILES, RUN_FOLDERS, whose folders the one
    link check covers), exchange areas and temporary names."""
    run = logged_run
    (tmp_path / "additive").mkdir()
    (tmp_path / "additive" / "job.toml").write_text(
        f'[data]\npath = "{data}"\n[model]\nkind = "naive_bayes"\n[train]\nworkers = 1\ntasks_per_update = 3\n'
        f'[run]\ndir = "run"\nexchange = "run"\nlog_to = ["csv", "tensorboard"]\n')
    killed = subprocess.run([sys.executable, "-m", "memtrain", "train", "job.toml"], capture_output=True, text=True,
                            timeout=100, cwd=tmp_path / "additive",
                            env={**os.environ, "MEMTRAIN_FAULT": "after_result:1"})
    assert killed.returncode == -9, killed.stderr
    names = set(os.listdir(run)) | set(os.listdir(tmp_path / "additive" / "run"))
    assert {"tensorboard", "metrics.csv", "statistics", "weights", "checkpoints"} <= names
    undeclared = {n for n in names if n not in RUN_FILES + RUN_FOLDERS and parse_exchange_owner(n) is None
                  and tmp_target(n) is None}
    assert not undeclared, f"written under a run directory but not declared in layout.py: {undeclared}"
