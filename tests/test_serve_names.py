"""`memtrain serve`: whatever is in the jobs folder, it moves what it cannot run to failed/ with a reason and goes
on, and its own record names are derived safely from any job name (issue 14, item 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_serve import FAST, dataset

from memtrain.layout import (
    MAX_RECORD_STEM,
    spool_archive_name,
    spool_log_file,
    spool_record_stem,
    spool_result_file,
    spool_state_file,
    tmp_sibling,
)

pytestmark = pytest.mark.timeout(120)
NAME_MAX = 255

GOOD = """[data]
path = "{data}"
[model]
kind = "softmax"
[train]
epochs = 1
workers = 1
"""

LONG = "j" * 230  # NAME.toml is 235 bytes: a valid file name; NAME.state.json's temporary name is not
ODD = os.fsdecode(b"caf\xe9-\xff")  # Latin-1 bytes: not UTF-8


def serve_once(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memtrain", "serve", "--jobs", str(folder), *FAST, "--once"],
                          capture_output=True, text=True, timeout=100, errors="replace")


@pytest.fixture
def folder(tmp_path: Path, cli) -> Path:
    dataset(cli, tmp_path / "data")
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o755)
    return jobs


def results(folder: Path, outcome: str) -> dict[str, dict]:
    found = {}
    for path in (folder / outcome).glob("*.result.json"):
        record = json.loads(path.read_text())
        found[record["name"]] = record
    return found


def test_serve_runs_or_fails_every_kind_of_entry_and_goes_on(folder: Path) -> None:
    (folder / "dir.toml").mkdir()
    os.mkfifo(folder / "fifo.toml")
    (folder / "ok.toml").write_text(GOOD.format(data="../data"))
    for name in (LONG, ODD):  # each reaches `memtrain train`, which fails at once: no such dataset
        (folder / f"{name}.toml").write_text(GOOD.format(data="../no-such-data"))
    (folder / "logs").mkdir(mode=0o755)
    (folder / "logs" / "blocked.log").mkdir()  # where its log would go: a directory
    os.mkfifo(folder / "logs" / "piped.log")  # ... or a FIFO, which would block a plain open() forever
    (folder / "running").mkdir(mode=0o755)
    (folder / "running" / "taken.state.json").mkdir()  # where its claim record would go: a directory
    for name in ("blocked", "piped", "taken"):
        (folder / f"{name}.toml").write_text(GOOD.format(data="../data"))
    result = serve_once(folder)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert set(results(folder, "done")) == {"ok"}
    failed = results(folder, "failed")
    assert set(failed) == {"dir", "fifo", LONG, ODD, "blocked", "piped", "taken"}
    assert "found a directory" in failed["dir"]["error"] and "found a FIFO" in failed["fifo"]["error"]
    for name in (LONG, ODD):
        assert "dataset directory not found" in failed[name]["error"]
        assert (folder / "logs" / spool_log_file(name)).exists()
    assert "blocked.log: expected a regular file (found a directory)" in failed["blocked"]["error"]
    assert "piped.log: expected a regular file (found a FIFO" in failed["piped"]["error"]
    assert "the service could not run this job: MemtrainError" in failed["taken"]["error"]
    assert os.listdir(folder / "running") == ["taken.state.json"]  # not a record the service wrote: left
    assert serve_once(folder).returncode == 0  # and the next start finds nothing to trip on


def test_a_job_left_in_running_with_a_long_name_does_not_stop_every_start(folder: Path) -> None:
    """What an older service left: the job file claimed, and no claim record (it crashed writing it)."""
    (folder / "running").mkdir(mode=0o755)
    (folder / "running" / f"{LONG}.toml").write_text(GOOD.format(data="../no-such-data"))
    (folder / "later.toml").write_text(GOOD.format(data="../data"))
    result = serve_once(folder)
    assert result.returncode == 0, result.stderr
    assert set(results(folder, "done")) == {"later"} and set(results(folder, "failed")) == {LONG}
    assert (folder / "failed" / f"{spool_archive_name(LONG, 0)}.toml").exists()


names = st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1,
                max_size=250).filter(lambda n: len(os.fsencode(n)) <= NAME_MAX - len(".toml"))
raw_names = st.binary(min_size=1, max_size=250).filter(lambda b: b"/" not in b and b"\x00" not in b)


@given(st.one_of(names, raw_names.map(os.fsdecode)))
def test_record_names_fit_any_job_name(name: str) -> None:
    stem = spool_record_stem(name)
    assert len(stem.encode()) <= MAX_RECORD_STEM  # valid UTF-8, short
    assert "/" not in stem and not stem.startswith(".")
    for record in (spool_state_file(name), spool_log_file(name), spool_result_file(spool_archive_name(name, 999))):
        assert len(tmp_sibling(Path(record)).name.encode()) <= NAME_MAX


def test_record_names_of_different_jobs_differ() -> None:
    assert spool_record_stem("a" * 230) != spool_record_stem("a" * 229)
    assert spool_record_stem(os.fsdecode(b"x\xff")) != spool_record_stem(os.fsdecode(b"x\xfe"))
    assert spool_record_stem("nightly") == "nightly"
