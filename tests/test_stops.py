"""How a run ends (issue 14, item 14; items 11 and 15 where a stop shows them): a run that did not finish never
exits 0; a lost stdout/stderr (a closed pipe, a closed terminal) never stops training, and the run's log still
gets everything; SIGHUP stops like SIGTERM (a checkpoint where the run stands, "interrupted" in events.log),
with no leaked-semaphore warning; a stop during start-up is a clean message, not a silent kill; and the stop
message, events.log, metrics.jsonl and `memtrain inspect` all number the same epoch, batch and update."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_faults import TESTS, data, digest, events, train_here, wait_for_version, wait_gone, worker_pids, write_job

from memtrain.layout import checkpoint_updates

pytestmark = pytest.mark.timeout(180)
EPOCHS = 8  # 5 updates per epoch: 40 in all, so that a stop at version 7 lands mid-run
__all__ = ["data"]


def popen(job: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           **kwargs.pop("env", {})}
    return subprocess.Popen([sys.executable, "-m", "memtrain", "train", str(job)], env=env, **kwargs)


@pytest.fixture(scope="module")
def clean(data: Path, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: F811
    job = write_job(tmp_path_factory.mktemp("clean"), data, epochs=EPOCHS)
    result = train_here(job)
    assert result.returncode == 0, result.stderr
    return digest(job.parent / "run")


@pytest.fixture(scope="module")
def hung_up(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:  # noqa: F811
    """A run whose whole process group got SIGHUP mid-run, as when its terminal closes (server, workers and
    multiprocessing's resource tracker alike): (run dir, exit code, stderr)."""
    job = write_job(tmp_path_factory.mktemp("hup"), data, epochs=EPOCHS)
    proc = popen(job, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    run = job.parent / "run"
    wait_for_version(run, 7)
    os.killpg(proc.pid, signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    return run, proc.returncode, err


def test_sighup_stops_like_sigterm_with_a_checkpoint_and_no_leaked_semaphores(hung_up) -> None:
    run, code, err = hung_up
    assert code == 128 + signal.SIGHUP, err
    # the stop lands after a batch, or exactly at an epoch's end on a loaded machine: both are named positions
    assert re.search(r"stopped by SIGHUP (after batch \d+ of \d+ of|at the end of) epoch \d+", err), err
    assert f"resume with: memtrain train --resume {run}" in err
    assert "leaked semaphore" not in err and "resource_tracker" not in err, err
    assert re.search(r"interrupted by SIGHUP (after batch \d+ of 5 of epoch \d+|at the end of epoch \d+)",
                     events(run))
    assert wait_gone(worker_pids(run), 5) == [], "a worker outlived the stop"


def test_the_stop_message_events_metrics_and_inspect_name_the_same_place(hung_up, cli) -> None:
    run, _, err = hung_up
    where = re.search(r"stopped by SIGHUP (.+?) \(weight version (\d+)\)", err)
    assert where, err
    place, version = where.group(1), int(where.group(2))
    log = events(run)
    assert f"checkpoint c{checkpoint_updates(run)[-1]:08d} written ({place}, weight version {version})" in log
    assert f"interrupted by SIGHUP {place} (weight version {version})" in log
    found = re.fullmatch(r"after batch (\d+) of 5 of epoch (\d+)|at the end of epoch (\d+)", place)
    batch, epoch = (int(found.group(1)), int(found.group(2))) if found.group(1) else (5, int(found.group(3)))
    update = (epoch - 1) * 5 + batch  # updates are counted from 1 over the run; checkpoints are named by it
    assert checkpoint_updates(run)[-1] == update
    last = [r for r in map(json.loads, (run / "metrics.jsonl").open()) if r["kind"] == "update"][-1]
    assert (last["epoch"], last["batch"], last["update"], last["version"]) == (epoch, batch, update, version)
    view = json.loads(cli("inspect", run, "--json").out)
    newest = next(e for e in view["entries"] if e["name"] == view["newest_complete"])
    assert (newest["epoch"], newest["update"], newest["version"]) == (epoch, update, version)


def test_a_run_stopped_by_sighup_resumes_identically(hung_up, clean: str) -> None:
    run, _, _ = hung_up
    resumed = train_here("--resume", run)
    assert resumed.returncode == 0, resumed.stderr
    assert digest(run) == clean


def test_closing_the_terminal_stops_the_run_like_sigterm(data: Path, tmp_path: Path) -> None:  # noqa: F811
    """The run's terminal is a pty it controls; closing the other end is what closing a terminal window does:
    SIGHUP to the run's process group, then EIO on every write to the terminal."""
    job = write_job(tmp_path, data, epochs=EPOCHS)
    master, slave = pty.openpty()

    def take_terminal() -> None:  # in the child, after setsid: the pty becomes its controlling terminal
        import fcntl
        import termios
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = popen(job, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, preexec_fn=take_terminal)
    os.close(slave)
    run = tmp_path / "run"
    wait_for_version(run, 7)
    os.close(master)
    assert proc.wait(timeout=60) == 128 + signal.SIGHUP
    assert "interrupted by SIGHUP" in events(run)
    assert wait_gone(worker_pids(run), 5) == []


def test_a_closed_pipe_never_stops_training(data: Path, tmp_path: Path, clean: str) -> None:  # noqa: F811
    """`memtrain train JOB 2>&1 | head -2`: the reader leaves after two lines; the run trains to the end."""
    job = write_job(tmp_path, data, epochs=EPOCHS)
    proc = popen(job, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = [proc.stdout.readline() for _ in range(2)]
    assert all(b"epoch" in line for line in lines), lines
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    run = tmp_path / "run"
    assert digest(run) == clean
    log = events(run)
    assert f"epoch {EPOCHS}/{EPOCHS}" in log and f"done: {EPOCHS} epochs" in log  # the log has what the pipe lost


def test_a_run_that_fails_with_no_one_reading_exits_1_and_its_log_says_why(data: Path, tmp_path: Path) -> None:  # noqa: F811
    """stdout and stderr are a pipe whose reader is gone from the start; the run fails later (an injected full
    disk while the server logs an update): exit 1, not 0, and events.log says why."""
    job = write_job(tmp_path, data, epochs=EPOCHS)
    read, write = os.pipe()
    os.close(read)
    proc = popen(job, stdout=write, stderr=write, env={"MEMTRAIN_FAULT": "after_update_logged:12",
                                                       "MEMTRAIN_FAULT_ACTION": "raise"})
    os.close(write)
    assert proc.wait(timeout=120) == 1
    log = events(tmp_path / "run")
    assert f"epoch 2/{EPOCHS}" in log  # it went on after its first console write failed
    assert "failed: " in log and "injected fault at after_update_logged" in log


def test_sigterm_during_start_up_is_a_clean_stop_that_leaves_nothing(data: Path, tmp_path: Path) -> None:  # noqa: F811
    """Stopped while it creates the run directory (the server is SIGSTOPped with the records written under the
    directory's temporary name, then gets SIGTERM): a message and exit 143, and neither the temporary
    directory nor the run directory is left."""
    job = write_job(tmp_path, data)
    proc = popen(job, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 env={"MEMTRAIN_FAULT": "run_before_commit:1", "MEMTRAIN_FAULT_ACTION": "stop"})
    building = []
    deadline = time.monotonic() + 60
    while not building:
        assert time.monotonic() < deadline and proc.poll() is None, "the server never reached the run's creation"
        building = list(tmp_path.glob(f".run.tmp-{proc.pid}-*"))
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGTERM)
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM during start-up, before training began" in err
    assert not any(p.exists() for p in building) and not (tmp_path / "run").exists()
