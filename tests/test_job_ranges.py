"""Every job value is range-checked at the edge: exit 2 naming the key, the range and the value found, before
anything is written (issue 14, item 12). Also the numeric flags of `prepare` and `serve`."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from tiny_data import blobs, write_dataset

from memtrain.config import RANGES, SECTIONS, RunConfig, TrainConfig
from memtrain.errors import InputError
from memtrain.train.optim import OptimizerConfig

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
    # the upper bounds (config.py, "Upper bounds"): past them, a value ended in a traceback at every resume
    ("train.epochs", "1000001", "1000001", "1000000"),
    ("train.batch_size", str(2**40 + 1), str(2**40 + 1), str(2**40)),
    ("train.tasks_per_update", str(2**63 - 1), str(2**63 - 1), "1024"),
    ("train.eval_rows", str(2**80), str(2**80), str(2**40)),
    ("train.shuffle_window", str(2**80), str(2**80), str(2**40)),
    ("train.chunk_rows", str(2**40 + 1), str(2**40 + 1), str(2**40)),
    ("train.max_attempts", "1001", "1001", "1000"),
    ("train.patience", "1000001", "1000001", "1000000"),
    ("run.checkpoint_every", "1000001", "1000001", "1000000"),
    ("run.keep_checkpoints", "10001", "10001", "10000"),
    ("run.keep_versions", "10001", "10001", "10000"),
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


def keys_holding(kind: type) -> list[str]:
    """Every job key whose dataclass field takes a ``kind`` (int or float): [data], [model], [train], [run] and
    the optimizer's keys, which are [train] keys."""
    classes = [*SECTIONS.items(), ("train", OptimizerConfig)]
    return [f"{section}.{field.name}" for section, cls in classes for field in dataclasses.fields(cls)
            if kind in (hint := typing.get_type_hints(cls)[field.name], *typing.get_args(hint))]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=300, features=4, classes=3, seed=1)
    return write_dataset(tmp_path_factory.mktemp("ranges") / "ds", x, y, shard_rows=100)


@pytest.mark.parametrize("key", keys_holding(int))
def test_every_integer_key_has_an_upper_bound_checked_before_anything_is_written(cli, tmp_path: Path, dataset: Path,
                                                                                 key: str) -> None:
    """2**80 fits no C long: every integer key refuses it at the one validation (exit 2), never a traceback
    at start or at every resume of a run directory it left."""
    job = tmp_path / "job.toml"
    job.write_text(JOB.replace('path = "ds"', f'path = "{dataset}"'))
    mode = ["--set", "train.mode='async'"] if key in ("train.max_staleness", "train.async_group") else []
    result = cli("train", job, *mode, "--set", f"{key}={2**80}")
    assert result.code == 2, result.err
    assert f"{key} out of range" in result.err or f"bad value for {key}" in result.err, result.err
    assert "Traceback" not in result.err
    assert not (tmp_path / "run").exists()


def test_the_walk_finds_the_keys_it_should() -> None:
    assert {"train.epochs", "train.tasks_per_update", "train.shuffle_window", "train.workers", "train.patience",
            "train.max_staleness", "train.warmup_updates", "run.keep_versions"} <= set(keys_holding(int))


@pytest.mark.parametrize("key", keys_holding(float))
def test_an_integer_too_large_for_a_float_key_is_refused(cli, tmp_path: Path, key: str) -> None:
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    result = cli("train", job, "--set", f"{key}={10**400}")
    assert result.code == 2, result.err
    assert f"{key} out of range (expected a finite number" in result.err
    assert not (tmp_path / "run").exists()


def test_a_job_at_the_upper_bounds_runs(cli, tmp_path: Path, dataset: Path) -> None:
    """The largest rows and tasks the bounds allow train (a batch, a window, an evaluation task larger than the
    split), and an additive model's chunk too."""
    job = tmp_path / "job.toml"
    job.write_text(JOB.replace('path = "ds"', f'path = "{dataset}"'))
    result = cli("train", job, "--set", f"train.batch_size={2**40}", "--set", f"train.eval_rows={2**40}",
                 "--set", f"train.shuffle_window={2**40}", "--set", "train.tasks_per_update=1024",
                 "--set", "train.epochs=2", "--set", "train.workers=0")
    assert result.code == 0, result.err
    result = cli("train", job, "--set", "model.kind='ridge'", "--set", f"train.chunk_rows={2**40}",
                 "--set", "train.workers=0", "--run-dir", tmp_path / "ridge")
    assert result.code == 0, result.err


def test_more_tasks_than_the_open_files_limit_allows_is_refused_before_anything_is_written(tmp_path: Path,
                                                                                          dataset: Path) -> None:
    """Each task's gradient buffer is mapped, a file descriptor each: below the hard limit the soft one is
    raised (the run trains), at it the job is refused naming the key (exit 2), never EMFILE mid-run."""
    import os
    import resource
    import subprocess
    import sys

    job = tmp_path / "job.toml"
    job.write_text(JOB.replace('path = "ds"', f'path = "{dataset}"'))

    def run(soft: int, hard: int, run_dir: str) -> subprocess.CompletedProcess:
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        return subprocess.run([sys.executable, "-m", "memtrain", "train", str(job), "--set",
                               "train.tasks_per_update=1024", "--set", "train.epochs=1", "--set", "train.workers=1",
                               "--run-dir", run_dir],
                              capture_output=True, text=True, preexec_fn=limit, timeout=120, env=os.environ)
    result = run(1024, 1024, str(tmp_path / "refused"))
    assert result.returncode == 2, result.stderr
    assert "train.tasks_per_update needs more open files than this process may have" in result.stderr
    assert "found a hard limit of 1024 (ulimit -Hn)" in result.stderr
    assert not (tmp_path / "refused").exists()
    result = run(1024, 4096, str(tmp_path / "raised"))
    assert result.returncode == 0, result.stderr
