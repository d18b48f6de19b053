"""memtrain reads only regular files: a FIFO, a socket, a device or a directory where a file is expected is an
error naming it and saying what was found -- never a hang (issue 14, item 6).

Every test here would hang without the rule (a FIFO without a writer blocks ``open`` forever), so each has a
short timeout (pytest-timeout's SIGALRM interrupts a blocked ``open``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from tiny_data import blobs, write_dataset

pytestmark = pytest.mark.timeout(20)


def make_fifo(path: Path) -> str:
    os.mkfifo(path)
    return "a FIFO (named pipe)"


def make_socket(path: Path) -> str:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))  # the file stays after the socket is closed
    server.close()
    return "a socket"


def make_directory(path: Path) -> str:
    path.mkdir()
    return "a directory"


MAKERS: dict[str, Callable[[Path], str]] = {"fifo": make_fifo, "socket": make_socket, "directory": make_directory}


def replace_with(path: Path, kind: str) -> str:
    if path.exists():
        path.unlink()
    return MAKERS[kind](path)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    x, y = blobs(n=600, features=4, classes=3)
    return write_dataset(tmp_path / "ds", x, y, shard_rows=200)


def job_file(folder: Path, data: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(f'[data]\npath = "{data}"\n[model]\nkind = "softmax"\n'
                                     '[train]\nepochs = 1\nworkers = 1\n[run]\ndir = "run"\n')
    return folder / "job.toml"


@pytest.mark.parametrize(("kind", "shard"), [("fifo", "train/y-00001.npy"), ("socket", "val/x-00000.npy"),
                                           ("directory", "train/x-00002.npy")])
def test_a_shard_that_is_not_a_regular_file_stops_train_at_once(cli, tmp_path: Path, dataset: Path, kind: str,
                                                                 shard: str) -> None:
    found = replace_with(dataset / shard, kind)
    result = cli("train", job_file(tmp_path / "job", dataset))
    assert result.code == 1, result.err
    assert f"{shard}: expected a .npy file, found {found}" in result.err
    assert not (tmp_path / "job" / "run").exists()


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_manifest_that_is_not_a_regular_file_is_named(cli, tmp_path: Path, dataset: Path, kind: str) -> None:
    found = replace_with(dataset / "manifest.json", kind)
    result = cli("train", job_file(tmp_path / "job", dataset))
    assert result.code == 1, result.err
    assert f"manifest.json: expected a dataset manifest, found {found}" in result.err
    result = cli("inspect", dataset / "manifest.json")
    assert result.code == 2, result.err
    assert f"manifest.json: expected a regular file or a directory, found {found}" in result.err


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_inspect_refuses_a_target_that_is_not_a_regular_file(cli, tmp_path: Path, kind: str) -> None:
    found = replace_with(tmp_path / "weights.npy", kind)
    result = cli("inspect", tmp_path / "weights.npy")
    assert result.code == 2, result.err
    assert f"weights.npy: expected a regular file or a directory, found {found}" in result.err


def test_inspect_refuses_a_device(cli) -> None:
    result = cli("inspect", "/dev/zero")
    assert result.code == 2
    assert "/dev/zero: expected a regular file or a directory, found a character device" in result.err


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_job_file_that_is_not_a_regular_file_is_a_usage_error(cli, tmp_path: Path, kind: str) -> None:
    found = replace_with(tmp_path / "job.toml", kind)
    result = cli("train", tmp_path / "job.toml")
    assert result.code == 2, result.err
    assert f"job.toml: expected a job file, found {found}" in result.err


@pytest.mark.parametrize("which", ["csv", "npy", "labels"])
def test_prepare_refuses_a_source_that_is_not_a_regular_file(cli, tmp_path: Path, which: str) -> None:
    import numpy as np

    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x, np.zeros((10, 2)))
    np.save(y, np.zeros(10))
    named = {"csv": tmp_path / "table.csv", "npy": x, "labels": y}[which]
    found = replace_with(named, "fifo")
    args = [named, tmp_path / "out"] if which == "csv" else [x, tmp_path / "out", "--y", y]
    result = cli("prepare", *args)
    assert result.code == 2, result.err
    assert f"{named}: expected a .csv, .npy, .npz, .h5 or .parquet file, found {found}" in result.err
    assert not (tmp_path / "out").exists()


def test_serve_reading_a_run_lock_that_is_a_fifo_does_not_hang(tmp_path: Path) -> None:
    """`serve` reads the lock of a job's run directory to see whether an earlier train still runs."""
    from memtrain.serve.runner import run_lock_owner

    run = tmp_path / "run"
    run.mkdir()
    make_fifo(run / "run.lock")
    assert run_lock_owner(run) == "unknown (run.lock is not a regular file)"


@pytest.mark.parametrize("command", [("train", "--replay", "{run}", "--run-dir", "{out}"),
                                     ("train", "--resume", "{run}"), ("inspect", "{run}", "--lineage", "1"),
                                     ("inspect", "{run}", "--verify")],
                         ids=["replay", "resume", "inspect-lineage", "inspect-verify"])
def test_every_reader_of_a_lineage_refuses_a_fifo(cli, tmp_path: Path, dataset: Path, command: tuple) -> None:
    """`train --replay` opened lineage.jsonl with a plain open and hung on a FIFO (issue 30, defect 4)."""
    assert cli("train", job_file(tmp_path / "job", dataset), "--workers", "0").code == 0
    run = tmp_path / "job" / "run"
    found = replace_with(run / "lineage.jsonl", "fifo")
    result = cli(*(part.format(run=run, out=tmp_path / "replay") for part in command))
    assert result.code == 1, result.out + result.err
    assert "lineage.jsonl: expected a" in result.out + result.err and found in result.out + result.err
