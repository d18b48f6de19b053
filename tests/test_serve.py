"""`memtrain serve` on real folders with a real observer: arrivals, exactly-once claims, restarts, safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from in_process import here

from memtrain.errors import InputError
from memtrain.layout import RUN_EVENTS, RUN_JOB, RUN_METRICS
from memtrain.serve.admit import MAX_JOB_BYTES, admit
from memtrain.serve.arrivals import Arrivals, Rejected, Settled

pytestmark = pytest.mark.timeout(60)

# Small waits keep the tests fast; --rescan is long unless a test needs it, so that a job picked up
# after the start is proof that the observer's events work, not the periodic scan.
FAST = ("--settle", "0.3", "--grace", "1", "--rescan", "60")
# A job that must still be running when the test stops the service: the stop comes as soon as the run's
# metrics.jsonl shows epoch 2 (within a tick of the service's loop, 0.1 s), about 12 epochs on the development
# machine (200 took ~3.5 s there); the resume then trains the rest, so longer costs twice. (Waiting for
# status.json, rewritten every second, took up to a second more: 200 epochs, where 40 raced the stop.)
LONG_EPOCHS = 60

JOB = """
[data]
path = "{data}"

[model]
kind = "softmax"

[train]
epochs = {epochs}
batch_size = 60
tasks_per_update = 1
workers = 1
lr = 0.05

[run]
dir = "../runs/{name}"
"""


def dataset(cli: Callable[..., Any], out: Path) -> Path:
    """A tiny classification dataset made by `memtrain prepare --synthetic`."""
    assert cli("prepare", "--synthetic", "400x4", "--classes", "3", "--plain", out).code == 0
    return out


@pytest.fixture
def spool(tmp_path: Path, cli: Callable[..., Any]) -> Path:
    """An empty jobs folder (mode 755) beside a tiny dataset at ../data."""
    dataset(cli, tmp_path / "data")
    folder = tmp_path / "jobs"
    folder.mkdir()
    folder.chmod(0o755)
    return folder


def job_text(name: str, epochs: int = 2, data: str = "../data") -> str:
    return JOB.format(name=name, epochs=epochs, data=data)


def drop(folder: Path, name: str, text: str) -> Path:
    """The documented way to submit: write NAME.toml.tmp, then rename it to NAME.toml."""
    tmp = folder / f"{name}.toml.tmp"
    tmp.write_text(text)
    os.rename(tmp, folder / f"{name}.toml")
    return folder / f"{name}.toml"


def serve(folder: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    log = open(folder.parent / "serve.err", "a")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([sys.executable, "-m", "memtrain", "serve", "--jobs", str(folder), *FAST, *args],
                            stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **(env or {})})


def serve_once(folder: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``memtrain serve --once`` on ``folder``: a process of its own when a fault is armed (it kills the service),
    else in this process (tests/in_process.py: an interpreter's start saved; its jobs' trains are processes still)."""
    if env and "MEMTRAIN_FAULT" in env:
        return subprocess.run([sys.executable, "-m", "memtrain", "serve", "--jobs", str(folder), *FAST, "--once",
                               *args], capture_output=True, text=True, timeout=50, env={**os.environ, **env})
    return here("serve", "--jobs", folder, *FAST, "--once", *args, env=env)


def wait_for(condition: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


def result(folder: Path, outcome: str, name: str) -> dict:
    return json.loads((folder / outcome / f"{name}.result.json").read_text())


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def train_starts(run_dir: Path) -> int:
    """How many times `memtrain train` opened this run directory."""
    return (run_dir / RUN_EVENTS).read_text().count("exchange area:")


def test_job_renamed_in_runs_once_despite_duplicate_events(spool: Path) -> None:
    proc = serve(spool)
    try:
        wait_for((spool / "status.json").exists)
        path = drop(spool, "a", job_text("a"))
        for _ in range(20):  # duplicate events: attribute changes and closes, while the file is still there
            try:
                os.utime(path)
                os.close(os.open(path, os.O_WRONLY))
            except FileNotFoundError:
                break
        wait_for((spool / "done" / "a.result.json").exists)
        time.sleep(1.0)  # a second run, if there were one, would have started by now
    finally:
        assert stop(proc) == 143
    assert names(spool / "done") == ["a.result.json", "a.toml"]
    assert names(spool / "failed") == [] and names(spool / "running") == []
    assert train_starts(spool.parent / "runs" / "a") == 1
    record = result(spool, "done", "a")
    assert record["final"]["epoch"] == 2 and record["run_dir"] == str(spool.parent / "runs" / "a")
    assert record["claimed_at"] <= record["started_at"] <= record["finished_at"]
    assert "done: 2 epochs" in (spool / "logs" / "a.log").read_text()


def test_slow_writer_is_never_read_half_written(spool: Path) -> None:
    text = job_text("slow", epochs=3)
    cut = text.index("[train]")  # the first half alone is a valid job too (10 epochs by default)
    # a writer seen writing is waited for until it closes (or grace); a short settle, for a short pause
    proc = serve(spool, "--grace", "10", "--settle", "0.1")
    try:
        wait_for((spool / "status.json").exists)
        with open(spool / "slow.toml", "w") as handle:
            handle.write(text[:cut])
            handle.flush()
            time.sleep(0.5)  # five settle times: quiet alone does not make it complete
            handle.write(text[cut:])
        wait_for((spool / "done" / "slow.result.json").exists)
    finally:
        assert stop(proc) == 143
    saved = json.loads((spool.parent / "runs" / "slow" / RUN_JOB).read_text())
    assert saved["train"]["epochs"] == 3
    assert names(spool / "failed") == []
    assert train_starts(spool.parent / "runs" / "slow") == 1


def test_hostile_files_fail_cleanly_and_the_service_keeps_going(spool: Path, tmp_path: Path) -> None:
    (spool / "not-toml.toml").write_text("this is = not [ toml\n")
    (spool / "unknown-key.toml").write_text(job_text("unknown-key") + "\n[data2]\nx = 1\n")
    (spool / "huge.toml").write_bytes(b"# " + b"x" * (MAX_JOB_BYTES + 10) + b"\n")
    (spool / "empty.toml").write_text("")
    (tmp_path / "outside.toml").write_text(job_text("outside"))
    (spool / "link.toml").symlink_to(tmp_path / "outside.toml")
    os.mkfifo(spool / "fifo.toml")
    (spool / "absurd.toml").write_text(job_text("absurd").replace("workers = 1", "workers = 100000"))
    drop(spool, "good", job_text("good"))
    done = serve_once(spool)
    assert done.returncode == 0, done.stderr
    assert names(spool / "done") == ["good.result.json", "good.toml"]
    errors = {name: result(spool, "failed", name)["error"]
              for name in ("not-toml", "unknown-key", "huge", "empty", "link", "fifo", "absurd")}
    assert "not valid TOML" in errors["not-toml"]
    assert "unknown section [data2]" in errors["unknown-key"]
    assert "too large" in errors["huge"]
    assert "empty" in errors["empty"]
    assert "symbolic link" in errors["link"]
    assert "regular file" in errors["fifo"]
    assert "train.workers" in errors["absurd"]
    assert (tmp_path / "outside.toml").exists()  # the link moved to failed/, never its target
    assert not (tmp_path / "runs" / "outside").exists()
    assert sorted(p.name for p in spool.glob("*.toml")) == []


def test_job_left_in_running_is_resumed_on_start(spool: Path) -> None:
    (spool / "running").mkdir(mode=0o755)
    (spool / "running" / "left.toml").write_text(job_text("left"))
    done = serve_once(spool)
    assert done.returncode == 0, done.stderr
    assert names(spool / "done") == ["left.result.json", "left.toml"]
    assert names(spool / "running") == []
    assert result(spool, "done", "left")["final"]["epoch"] == 2


@pytest.mark.parametrize("point", ["serve_after_claim", "serve_after_launch"])
def test_service_killed_leaves_no_orphan_and_the_restart_finishes_the_job(spool: Path, point: str) -> None:
    drop(spool, "k", job_text("k", epochs=3))
    killed = serve_once(spool, env={"MEMTRAIN_FAULT": f"{point}:1"})
    assert killed.returncode == -signal.SIGKILL
    assert names(spool / "running")[-1] == "k.toml"
    if point == "serve_after_launch":
        state = json.loads((spool / "running" / "k.state.json").read_text())
        wait_for(lambda: not _alive(state["pid"]), timeout=20)  # PR_SET_PDEATHSIG stopped the child
    done = serve_once(spool)
    assert done.returncode == 0, done.stderr
    record = result(spool, "done", "k")
    assert record["final"]["epoch"] == 3 and record["starts"] == (2 if point == "serve_after_launch" else 1)
    assert names(spool / "running") == []


def test_two_jobs_run_at_once_with_max_concurrent_2(spool: Path) -> None:
    drop(spool, "one", job_text("one", epochs=6))
    drop(spool, "two", job_text("two", epochs=6))
    done = serve_once(spool, "--max-concurrent", "2")
    assert done.returncode == 0, done.stderr
    one, two = result(spool, "done", "one"), result(spool, "done", "two")
    assert one["started_at"] < two["finished_at"] and two["started_at"] < one["finished_at"]


def test_second_service_on_the_same_folder_is_refused(spool: Path) -> None:
    first = serve(spool)
    try:
        wait_for((spool / "status.json").exists)
        second = serve_once(spool)
        status = here("serve", "--jobs", spool, "--status", "--json")
    finally:
        assert stop(first) == 143
    assert json.loads(status.stdout)["service"]["pid"] == first.pid
    assert second.returncode == 2
    assert "another memtrain serve is already watching this folder" in second.stderr
    assert f"pid {first.pid}" in second.stderr


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_folder_others_can_write_is_refused(spool: Path, mode: int) -> None:
    drop(spool, "a", job_text("a"))
    spool.chmod(mode)
    refused = serve_once(spool)
    assert refused.returncode == 2
    assert "other users can write to" in refused.stderr and "chmod go-w" in refused.stderr
    assert (spool / "a.toml").exists() and not (spool / "running").exists()


def test_root_refuses_paths_that_resolve_outside_it(tmp_path: Path, cli: Callable[..., Any]) -> None:
    root = tmp_path / "root"
    folder = root / "jobs"
    folder.mkdir(parents=True, mode=0o755)
    dataset(cli, root / "data")
    dataset(cli, tmp_path / "elsewhere")
    (root / "link").symlink_to(tmp_path / "elsewhere")
    drop(folder, "escape", job_text("escape", data="../../elsewhere"))
    drop(folder, "absolute", job_text("absolute", data=str(tmp_path / "elsewhere")))
    drop(folder, "symlink", job_text("symlink", data="../link"))
    drop(folder, "rundir", job_text("rundir").replace('"../runs/rundir"', '"../../runs/rundir"'))
    drop(folder, "code", job_text("code").replace('kind = "softmax"', 'kind = "evil:Model"\ncode_dir = "../.."'))
    drop(folder, "inside", job_text("inside"))
    done = serve_once(folder, "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert names(folder / "done") == ["inside.result.json", "inside.toml"]
    for name, key in (("escape", "data.path"), ("absolute", "data.path"), ("symlink", "data.path"),
                      ("rundir", "run.dir"), ("code", "model.code_dir")):
        assert f"{key} resolves outside the root" in result(folder, "failed", name)["error"]
    assert not (tmp_path / "runs").exists()


def test_sigterm_checkpoints_and_the_next_start_resumes(spool: Path) -> None:
    drop(spool, "long", job_text("long", epochs=LONG_EPOCHS))
    metrics = spool.parent / "runs" / "long" / RUN_METRICS
    proc = serve(spool)
    try:
        wait_for(lambda: metrics.exists() and metrics.read_text().count('"kind": "epoch"') >= 2)
    finally:
        assert stop(proc) == 143
    running = _running(spool)
    assert [(r["name"], r["state"], r["epochs"]) for r in running] == [("long", "stopped", LONG_EPOCHS)]
    assert running[0]["progress"]["epochs_done"] >= 2  # where the run stood, read from its metrics
    assert metrics.read_text().count('"kind": "epoch"') < LONG_EPOCHS
    assert names(spool / "running") == ["long.state.json", "long.toml"]
    assert json.loads((spool / "running" / "long.state.json").read_text())["clean_stop"] is True
    table = here("serve", "--jobs", spool, "--status")
    assert "no service running" in " ".join(table.stdout.split()) and "stopped" in table.stdout  # lines wrap
    done = serve_once(spool)
    assert done.returncode == 0, done.stderr
    assert "resumed from" in (spool.parent / "runs" / "long" / RUN_EVENTS).read_text()
    assert result(spool, "done", "long")["final"]["epoch"] == LONG_EPOCHS


def test_status_fits_80_columns_and_never_breaks_a_path(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """``--status`` at COLUMNS=80: paths are relative to the folder or cut in the middle (head…tail), never
    broken mid-word across lines as rich's folding did."""
    dataset(cli, tmp_path / "data")
    folder = tmp_path / "a-jobs-folder-whose-name-is-long-enough-to-matter"
    folder.mkdir()
    folder.chmod(0o755)
    name = "a-job-with-a-name-long-enough-to-be-cut"
    missing = "../no-such-dataset-anywhere-on-this-machine"
    drop(folder, name, job_text(name, epochs=1))
    drop(folder, "no-data", job_text("no-data", data=missing))
    assert serve_once(folder).returncode == 0
    drop(folder, "waiting", job_text("waiting"))
    status = here("serve", "--jobs", folder, "--status", env={"COLUMNS": "80"})
    assert status.returncode == 0, status.stderr
    shown = status.stdout.splitlines()
    assert max(map(len, shown)) <= 80
    paths = [str(folder) + ":", str(tmp_path / "runs" / name), str(tmp_path / missing[3:]) + ":"]
    for word in " ".join(shown).replace("│", " ").split():
        if "/" in word and word != "/":  # a path, not the heading "progress / result"
            head, _, tail = word.partition("…")
            assert any(path.startswith(head) and path.endswith(tail) for path in paths) if tail else word in paths, word
    rows = [line for line in shown if line.startswith("│ ") and line[2:8].strip()]
    assert [row.split("│")[1].strip() for row in rows] == ["queued", "done", "failed"]
    assert rows[0].split("│")[4].strip() == "waiting.toml"  # inside the folder: relative to it
    error = " ".join(line.split("│")[4].strip() for line in shown[shown.index(rows[2]):-1])
    assert "no-data" in rows[2] and ": dataset directory not found. create one with `memtrain prepare" in error


def test_polling_observer_sees_new_jobs(spool: Path) -> None:
    proc = serve(spool, "--polling")
    try:
        wait_for((spool / "status.json").exists)
        assert json.loads((spool / "status.json").read_text())["service"]["observer"] == "polling"
        drop(spool, "p", job_text("p"))
        wait_for((spool / "done" / "p.result.json").exists)
    finally:
        assert stop(proc) == 143
    assert names(spool / "failed") == []


def test_a_misspelt_model_kind_fails_at_submission_with_a_suggestion(spool: Path) -> None:
    """Validated when the file arrives (docs/serve.md), so no slot is taken and no child started; an import
    path is checked for its form only: the service never imports a job's code."""
    drop(spool, "typo", job_text("typo").replace('kind = "softmax"', 'kind = "sofmax"'))
    drop(spool, "bare", job_text("bare").replace('kind = "softmax"', 'kind = "nets:"'))
    done = serve_once(spool)
    assert done.returncode == 0, done.stderr
    assert "started typo" not in done.stderr and not list(spool.glob("logs/typo*"))
    error = result(spool, "failed", "typo")["error"]
    assert error.startswith(f"{spool / 'typo.toml'}: unknown model kind 'sofmax'")
    assert error.endswith("did you mean `softmax`?")
    assert "bad model.kind 'nets:'" in result(spool, "failed", "bare")["error"]  # its form, checked as the job is read


def test_arrivals_wait_for_a_writer_to_close_and_for_quiet_after_a_scan(tmp_path: Path) -> None:
    arrivals = Arrivals(tmp_path, settle=1.0, grace=10.0)
    path = tmp_path / "a.toml"
    path.write_text("[train]\nepochs = 1\n")
    arrivals.note(path, "created")
    assert arrivals.poll(0.0) == [] and arrivals.poll(5.0) == []  # written, not closed: wait
    arrivals.note(path, "closed")
    assert arrivals.poll(5.1) == [Settled(path, path.read_bytes())]
    arrivals.note(path, "closed")  # a duplicate event hands nothing out twice
    assert arrivals.poll(5.2) == []
    other = tmp_path / "b.toml"
    other.write_text("[train]\nepochs = 2\n")
    arrivals.note(other, "scan")
    assert arrivals.poll(6.0) == []
    assert arrivals.poll(7.1) == [Settled(other, other.read_bytes())]
    assert arrivals.settled() == [path, other]
    broken = tmp_path / "c.toml"
    broken.write_text("[train\n")
    arrivals.note(broken, "moved")
    assert arrivals.poll(8.0) == []
    assert [type(x) for x in arrivals.poll(18.1)] == [Rejected]
    for ignored in ("c.toml.tmp", ".d.toml"):
        arrivals.note(tmp_path / ignored, "closed")
    assert set(arrivals.candidates) == {path, other}


def test_admit_resolves_paths_against_the_folder_and_rejects_unknown_keys(tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    admission = admit(b'[data]\npath = "../d"\n', folder / "x.toml", base=folder, root=None, spool=folder)
    assert admission.job.data.path == tmp_path / "d" and admission.job.run.dir == folder / "runs" / "x"
    args = admission.train_args(folder / "running" / "x.toml", resume=True)
    assert args[-1] == "--resume" and f'data.path="{tmp_path / "d"}"' in args
    with pytest.raises(InputError, match="unknown key train.bogus") as caught:
        admit(b"[train]\nbogus = 1\n", folder / "x.toml", base=folder, root=None, spool=folder)
    assert str(caught.value).startswith(f"{folder / 'x.toml'}: ")  # the job file, not `job:` (issue 41)
    with pytest.raises(InputError, match="inside the service's own folders"):
        admit(b'[run]\ndir = "done"\n', folder / "x.toml", base=folder, root=None, spool=folder)


def _running(folder: Path) -> list[dict]:
    """The running jobs in the service's status.json (rewritten every second, atomically)."""
    try:
        return json.loads((folder / "status.json").read_text())["running"]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False
