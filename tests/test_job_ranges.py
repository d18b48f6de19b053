"""Every job value is range-checked at the edge: exit 2 naming the key, the range and the value found, before
anything is written (issue 14, item 12). Also the numeric flags of `prepare` and `serve`."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtrain.config import RANGES, RunConfig, TrainConfig
from memtrain.errors import InputError

JOB = """[data]
path = "ds"
[model]
kind = "softmax"
[run]
dir = "run"
"""

# key, a value just outside its range (as --set text), the value printed back, a value on its edge.
CASES = [
    ("train.epochs", "0", "0", "1"),
    ("train.batch_size", "0", "0", "1"),
    ("train.tasks_per_update", "-2", "-2", "1"),
    ("train.workers", "1025", "1025", "1"),
    ("train.seed", "-1", "-1", "0"),
    ("train.blas_threads", "0", "0", "1024"),
    ("train.server_threads", "0", "0", "1024"),
    ("train.server_threads", "1025", "1025", "1"),
    ("train.eval_rows", "0", "0", "1"),
    ("train.task_timeout", "nan", "nan", "0.001"),
    ("train.task_timeout", "inf", "inf", "1e9"),
    ("train.task_timeout", "-1.5", "-1.5", "0.5"),
    ("train.task_timeout", "0", "0.0", "1"),
    ("train.max_attempts", "0", "0", "1"),
    ("train.chunk_rows", "0", "0", "1"),
    ("train.backup_ratio", "0.5", "0.5", "1"),
    ("train.backup_ratio", "nan", "nan", "0"),
    ("train.backup_seconds", "-0.1", "-0.1", "0"),
    ("train.backup_seconds", "inf", "inf", "1e9"),
    ("train.patience", "0", "0", "1"),
    ("train.shuffle_window", "0", "0", "1"),
    ("run.checkpoint_every", "0", "0", "1"),
    ("run.keep_checkpoints", "0", "0", "1"),
    ("run.keep_versions", "0", "0", "1"),
]


def test_every_ranged_key_is_covered_here() -> None:
    assert {key for key, *_ in CASES} == set(RANGES)


@pytest.mark.parametrize(("key", "bad", "shown", "edge"), CASES)
def test_a_value_out_of_range_is_exit_2_naming_key_range_and_value(cli, tmp_path: Path, key: str, bad: str,
                                                                    shown: str, edge: str) -> None:
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    result = cli("train", job, "--set", f"{key}={bad}")
    assert result.code == 2, result.err
    expected = RANGES[key][0]
    assert f"job.toml: {key} out of range (expected {expected}, found {shown})" in result.err
    assert "Traceback" not in result.err
    assert not (tmp_path / "run").exists()
    # the edge of the range passes validation: the run then stops only at the missing dataset
    result = cli("train", job, "--set", f"{key}={edge}")
    assert result.code == 2 and "dataset directory not found" in result.err, result.err


def test_a_job_file_value_out_of_range_names_the_file(cli, tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(JOB.replace("[run]", "[train]\nseed = -1\n[run]"))
    result = cli("train", job)
    assert result.code == 2
    assert f"{job}: train.seed out of range (expected an integer from 0 to {2**63 - 1}, found -1)" in result.err


def test_configs_made_in_python_are_checked_too() -> None:
    with pytest.raises(InputError, match=r"train.seed out of range .*found -1"):
        TrainConfig(seed=-1)
    with pytest.raises(InputError, match=r"train.task_timeout out of range .*found nan"):
        TrainConfig(task_timeout=float("nan"))
    with pytest.raises(InputError, match=r"run.keep_versions out of range .*found 0"):
        RunConfig(keep_versions=0)
    TrainConfig(seed=0, task_timeout=0.25)


@pytest.mark.parametrize("exchange", ["/nonexistent/dir", "no-such-subdir", "a-file"])
def test_an_exchange_directory_that_does_not_exist_is_refused_and_never_created(cli, tmp_path: Path,
                                                                                exchange: str) -> None:
    job = tmp_path / "job.toml"
    job.write_text(JOB.replace('dir = "run"', f'dir = "run"\nexchange = "{exchange}"'))
    (tmp_path / "a-file").write_text("not a directory")
    result = cli("train", job)
    assert result.code == 2, result.err
    assert "run.exchange is not an existing directory" in result.err
    assert "found nothing there" in result.err or "found a file" in result.err
    assert not Path("/nonexistent").exists() and not (tmp_path / "no-such-subdir").exists()


def test_a_relative_exchange_directory_is_relative_to_the_job_file(cli, tmp_path: Path, monkeypatch) -> None:
    from memtrain.config import load_job

    (tmp_path / "scratch").mkdir()
    job = tmp_path / "job.toml"
    job.write_text(JOB.replace('dir = "run"', 'dir = "run"\nexchange = "scratch"'))
    monkeypatch.chdir("/")
    assert load_job(job).run.exchange == str(tmp_path / "scratch")


@pytest.mark.parametrize(("flag", "value"), [("--shard-mb", "nan"), ("--chunk-mb", "inf"), ("--shard-mb", "-1"),
                                             ("--seed", "-1")])
def test_prepare_flags_out_of_range(cli, tmp_path: Path, flag: str, value: str) -> None:
    result = cli("prepare", "--synthetic", "100x3", tmp_path / "out", flag, value)
    assert result.code == 2, result.err
    assert f"{flag} out of range" in result.err and "Traceback" not in result.err


@pytest.mark.parametrize("flag", ["--settle", "--grace", "--rescan"])
@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_serve_flags_out_of_range(cli, tmp_path: Path, flag: str, value: str) -> None:
    result = cli("serve", "--jobs", tmp_path, "--once", flag, value)
    assert result.code == 2, result.err
    assert f"--{flag[2:]} out of range (expected a finite number of seconds > 0" in result.err
