"""The lineage stays continuous across a resume, and `inspect --verify` checks continuity, not only seals
(issue 30, defect 6; docs/faults.md). An async run's lineage.jsonl gets a torn last line, loses its last lines
or gets a line twice: resume restores continuity up to the checkpoint or refuses naming the gap; it never
trains on leaving a run that replay refuses."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from in_process import here
from tiny_data import blobs, write_dataset

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
workers = 2
mode = "async"
max_staleness = 2

[run]
dir = "run"
"""


def async_run(folder: Path, epochs: int) -> Path:
    x, y = blobs(n=1000, features=4, classes=3, seed=2)
    data = write_dataset(folder / "data", x, y, shard_rows=300)
    (folder / "job.toml").write_text(JOB.format(data=data))
    result = here("train", folder / "job.toml", "--set", f"train.epochs={epochs}")
    assert result.returncode == 0, result.stderr
    return folder / "run"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch of an async run, finished (its only checkpoint is its last version)."""
    return async_run(tmp_path_factory.mktemp("async"), 1)


def torn(lines: list[str]) -> str:
    return "".join(lines[:-1]) + lines[-1][:len(lines[-1]) // 2]


def missing(lines: list[str]) -> str:
    return "".join(lines[:-2])


def repeated(lines: list[str]) -> str:
    return "".join(lines[:4] + lines[3:])


def damage(run: Path, tmp_path: Path, how: Callable[[list[str]], str]) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    lineage = copy / "lineage.jsonl"
    lineage.write_text(how(lineage.read_text().splitlines(keepends=True)))
    return copy


@pytest.mark.parametrize("how", [torn, missing, repeated])
def test_verify_checks_the_lineage_continuity(finished: Path, tmp_path: Path, how: Callable) -> None:
    assert here("inspect", finished, "--verify").returncode == 0
    run = damage(finished, tmp_path, how)
    result = here("inspect", run, "--verify")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "lineage.jsonl" in result.stdout + result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("how", [torn, missing])
def test_resume_refuses_a_gap_before_its_checkpoint(finished: Path, tmp_path: Path, how: Callable) -> None:
    run = damage(finished, tmp_path, how)
    before = (run / "lineage.jsonl").read_bytes()
    result = here("train", "--resume", run, "--set", "train.epochs=2")
    assert result.returncode == 1, result.stderr
    assert "the lineage has a gap before the checkpoint" in result.stderr and "Traceback" not in result.stderr
    assert (run / "lineage.jsonl").read_bytes() == before, "a refused resume changed nothing"


def test_resume_drops_a_repeated_line_and_the_run_replays(finished: Path, tmp_path: Path) -> None:
    run = damage(finished, tmp_path, repeated)
    result = here("train", "--resume", run, "--set", "train.epochs=2")
    assert result.returncode == 0, result.stderr
    assert here("inspect", run, "--verify").returncode == 0
    replay = here("train", "--replay", run, "--run-dir", tmp_path / "replay")
    assert replay.returncode == 0, replay.stderr


def test_resume_falls_back_to_the_newest_checkpoint_before_the_gap(tmp_path: Path) -> None:
    """Two checkpoints, the lineage torn after the first: resume continues from the first (the second lies
    beyond the gap), so the run stays replayable."""
    run = async_run(tmp_path, 2)
    lines = (run / "lineage.jsonl").read_text().splitlines(keepends=True)
    (run / "lineage.jsonl").write_text(torn(lines))
    result = here("train", "--resume", run, "--set", "train.epochs=3")
    assert result.returncode == 0, result.stderr
    assert "skipping checkpoint" in result.stdout and "the lineage has a gap before the checkpoint" in result.stdout
    assert here("inspect", run, "--verify").returncode == 0
    replay = here("train", "--replay", run, "--run-dir", tmp_path / "replay")
    assert replay.returncode == 0, replay.stderr


def test_verify_passes_an_intact_additive_run_and_words_a_lost_solve_line_as_a_gap(tmp_path: Path) -> None:
    """An additive run's lineage is version 0 and its solve (version 1, no gradients): intact, it verifies
    (issue 41, #5: it was reported as a checksum mismatch); its solve line lost, the finding names the
    continuity, not a checksum."""
    x, y = blobs(n=300, features=4, classes=3, seed=2)
    data = write_dataset(tmp_path / "data", x, y, shard_rows=100)
    (tmp_path / "job.toml").write_text(f'[data]\npath = "{data}"\n[model]\nkind = "naive_bayes"\n'
                                       f'[train]\nworkers = 1\n[run]\ndir = "{tmp_path / "run"}"\n')
    assert here("train", tmp_path / "job.toml").returncode == 0
    verified = here("inspect", tmp_path / "run", "--verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "every checksum matches" in verified.stdout
    lineage = tmp_path / "run" / "lineage.jsonl"
    lineage.write_text(lineage.read_text().splitlines(keepends=True)[0])
    broken = here("inspect", tmp_path / "run", "--verify")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "lineage.jsonl: the lineage is not continuous" in broken.stderr
    assert "the lineage ends at version 0, before the checkpoint of version 1" in broken.stderr
    assert "checksum mismatch" not in broken.stderr and "Traceback" not in broken.stderr
