"""One definition of each counter, used by every writer (issue 14, item 15): epochs, batches and updates count
from 1 in every record and message; weight versions carry the time they were published; and a dataset that
cannot be trained on (no training rows, a non-finite validation value) is an error at start naming the
split and the row. (The stop message, events.log and inspect agreeing after a stop: tests/test_stops.py.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

from memtrain.files import read_jsonl
from memtrain.layout import weights_path
from memtrain.train.exchange.weights import commit_weights, ready_building
from memtrain.train.records.counters import position_text

pytestmark = pytest.mark.timeout(120)

JOB = """[data]
path = "{data}"
[model]
kind = "{kind}"
[train]
epochs = 3
batch_size = 100
tasks_per_update = 2
workers = 2
[run]
dir = "run"
"""


def job_file(folder: Path, data: Path, kind: str = "softmax") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(JOB.format(data=data, kind=kind))
    return folder / "job.toml"


def test_update_records_and_the_epoch_record_of_an_epoch_agree(cli, tmp_path: Path) -> None:
    x, y = blobs(n=500, features=4, classes=3)
    data = write_dataset(tmp_path / "ds", x, y, val_rows=50, shard_rows=200)  # 450 train rows: 5 batches
    result = cli("train", job_file(tmp_path, data))
    assert result.code == 0, result.err
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    lineage = {r["version"]: r for r in read_jsonl(tmp_path / "run" / "lineage.jsonl")}
    for epoch in (1, 2, 3):
        updates = [r for r in records if r["kind"] == "update" and r["epoch"] == epoch]
        (closing,) = [r for r in records if r["kind"] == "epoch" and r["epoch"] == epoch]
        assert [r["batch"] for r in updates] == [1, 2, 3, 4, 5]
        assert [r["update"] for r in updates] == list(range(5 * epoch - 4, 5 * epoch + 1))
        assert closing["update"] == updates[-1]["update"] and closing["version"] == updates[-1]["version"]
        for record in updates:  # the version an update published says which update, epoch and batch made it
            origin = lineage[record["version"]]
            assert (origin["update"], origin["epoch"], origin["batch"]) == (
                record["update"], record["epoch"], record["batch"])
    assert "done: 3 epochs" in (tmp_path / "run" / "events.log").read_text()


def test_position_text_counts_from_one() -> None:
    assert position_text(0, 0, 5) == "before epoch 1"
    assert position_text(0, 1, 5) == "after batch 1 of 5 of epoch 1"
    assert position_text(2, 0, 5) == "at the end of epoch 2"


def test_a_recycled_weight_file_is_published_with_the_time_of_publication(tmp_path: Path) -> None:
    """A retired version's file is renamed and rewritten through maps; a write to a page still dirty from its
    earlier life does not touch its mtime, so `inspect` would show it older than the version before it."""
    (tmp_path / "weights").mkdir()
    for version in (1, 2):
        commit_weights(ready_building(tmp_path, version, 1000, os.getpid(), keep=1), tmp_path, version)
    os.utime(weights_path(tmp_path, 1), (1e9, 1e9))  # its earlier life, long ago
    building = ready_building(tmp_path, 3, 1000, os.getpid(), keep=1)  # retires version 1 into this file
    assert not weights_path(tmp_path, 1).exists() and os.stat(building).st_mtime == 1e9
    before = time.time()
    commit_weights(building, tmp_path, 3)
    assert os.stat(weights_path(tmp_path, 3)).st_mtime >= before - 1


def test_a_dataset_without_training_rows_is_an_error_at_start(cli, tmp_path: Path) -> None:
    x, y = blobs(n=60, features=4, classes=3)
    data = write_dataset(tmp_path / "ds", x, y, val_rows=60)
    result = cli("train", job_file(tmp_path, data))
    assert result.code == 2, result.err
    assert "the dataset has no training rows" in result.err and "train split" in result.err
    assert "found 0 rows" in result.err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("task", "part", "row", "column"), [("classification", "x", 57, 2),
                                                            ("classification", "x", 3, 0),
                                                            ("regression", "y", 41, None)])
def test_a_non_finite_validation_value_is_an_error_at_start_naming_split_and_row(
        cli, tmp_path: Path, task: str, part: str, row: int, column: int | None) -> None:
    x, y = blobs(n=400, features=4, classes=3)
    if task == "regression":
        y = x[:, 0] * 0.5
    (x if part == "x" else y)[(row, column) if part == "x" else row] = np.nan if row % 2 else np.inf
    data = write_dataset(tmp_path / "ds", x, y, task=task, val_rows=80, shard_rows=50)
    result = cli("train", job_file(tmp_path, data, "softmax" if task == "classification" else "linear"))
    assert result.code == 2, result.err
    what = f"feature {column}" if part == "x" else "the target"
    assert f"non-finite value in the val split: row {row}, {what}" in result.err
    assert f"val/{part}-{row // 50:05d}.npy:row {row % 50}" in result.err
    assert not (tmp_path / "run").exists()
