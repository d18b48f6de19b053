"""Real faults on real processes and files: kills at every write point, hangs, poison tasks, server crashes,
signals, corrupt and truncated files, full disks, leftovers. "Identical" = sha256 of the final weights
equals a fault-free run of the same job."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from crash_models import POISON
from in_process import here
from tiny_data import blobs, write_dataset

from memtrain.layout import checkpoint_path, checkpoint_updates, weight_versions, weights_path
from memtrain.train.exchange.weights import BLOCK
from memtrain.train.plan import step_slices

pytestmark = pytest.mark.timeout(180)

TESTS = Path(__file__).parent
PYTHONPATH = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))  # and the caller's
JOB = """
[data]
path = "{data}"
normalize = {normalize}

[model]
kind = "{kind}"
{model_extra}

[train]
epochs = {epochs}
batch_size = 200
tasks_per_update = 3
optimizer = "adam"
lr = 0.01
seed = 3
workers = {workers}
task_timeout = {task_timeout}

[run]
dir = "run"
keep_checkpoints = 10
"""


def write_job(folder: Path, data: Path, *, kind: str = "mlp", model_extra: str = "hidden = [16]", epochs: int = 2,
              workers: int = 2, task_timeout: float = 60, normalize: str = "true", **extra: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = JOB.format(data=data, kind=kind, model_extra=model_extra, epochs=epochs, workers=workers,
                      task_timeout=task_timeout, normalize=normalize)
    for key, value in extra.items():
        text = text.replace("[run]\n", f"[run]\n{key} = {value}\n") if key == "exchange" else text
    (folder / "job.toml").write_text(text)
    return folder / "job.toml"


def memtrain(*args: object, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memtrain", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})}, timeout=timeout)


def train_here(*args: object) -> subprocess.CompletedProcess:
    """``memtrain train ARGS`` in this process (tests/in_process.py), with the PYTHONPATH ``memtrain`` gets here, for
    a run with no fault armed in its server and no signal sent to it: an interpreter's start saved."""
    return here("train", *args, env={"PYTHONPATH": PYTHONPATH})


def start(*args: object, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "memtrain", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})})


def digest(run: Path) -> str:
    path = weights_path(run, weight_versions(run)[-1])
    return hashlib.sha256(np.load(path, allow_pickle=False).tobytes()).hexdigest()


def events(run: Path) -> str:
    log = run / "events.log"
    return log.read_text() if log.exists() else ""  # a server killed early may not have written it yet


def worker_pids(run: Path) -> list[int]:
    return [int(p) for line in re.findall(r"workers started: pids ([\d ]+)", events(run)) for p in line.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] not in ("Z", "X")


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def wait_for_version(run: Path, version: int, seconds: float = 30) -> None:
    """Wait until ``version`` has been published (old versions may already be retired from weights/)."""
    deadline = time.monotonic() + seconds
    lineage = run / "lineage.jsonl"
    while not (lineage.exists() and lineage.read_text().count("\n") > version):
        assert time.monotonic() < deadline, f"version {version} of {run} never appeared"
        time.sleep(0.02)


def leftovers(run: Path) -> list[str]:
    """Temporary files or exchange areas left in the run directory."""
    names = [p.name for p in run.rglob("*")]
    return [n for n in names if ".tmp-" in n or n.startswith("memtrain-x-")]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1000, features=6, classes=3, seed=1)
    return write_dataset(tmp_path_factory.mktemp("faults") / "blobs", x, y, shard_rows=300)


@pytest.fixture(scope="module")
def baseline(data: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    job = write_job(tmp_path_factory.mktemp("baseline"), data)
    result = train_here(job)
    assert result.returncode == 0, result.stderr
    return digest(job.parent / "run")


@pytest.fixture(scope="module")
def clean_digest(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """``clean_digest(*args, **job)``: the digest of a fault-free ``memtrain train`` of ``write_job(data, **job)``
    with ``args``, run once per module for every test (and parameter) that compares against it."""
    digests: dict[tuple, str] = {}

    def get(*args: object, **job: object) -> str:
        key = (args, tuple(sorted(job.items())))
        if key not in digests:
            clean = write_job(tmp_path_factory.mktemp("clean"), data, **job)
            result = train_here(clean, *args)
            assert result.returncode == 0, result.stderr
            digests[key] = digest(clean.parent / "run")
        return digests[key]
    return get


# --- workers dying ---

@pytest.mark.parametrize("point", ["before_grad_write:2", "after_grad_write:2", "mid_step:1", "after_publish:2"])
def test_worker_killed_at_each_point_recovers_identically(tmp_path: Path, data: Path, baseline: str,
                                                          point: str) -> None:
    job = write_job(tmp_path, data)
    result = memtrain("train", job, env={"MEMTRAIN_FAULT": point, "MEMTRAIN_FAULT_ONCE": str(tmp_path / "fired")})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "fired").exists(), "the fault never fired"
    run = tmp_path / "run"
    assert "died with exit code -9" in events(run)
    assert "workers that died and were replaced: 1" in result.stdout
    assert digest(run) == baseline
    assert leftovers(run) == []


def test_killing_workers_from_outside_including_idle_ones(tmp_path: Path, data: Path) -> None:
    job = write_job(tmp_path / "clean", data, epochs=60, workers=4)  # long enough for every kill to land mid-run
    # the reference in the server: the same bits as any worker count (test_rounds.py), without 4 more interpreters
    assert train_here(job, "--workers", 0).returncode == 0
    job = write_job(tmp_path / "chaos", data, epochs=60, workers=4)
    proc = start("train", job)
    run = tmp_path / "chaos" / "run"
    wait_for_version(run, 2)
    killed = []
    for pid in worker_pids(run)[:4]:  # four workers, three tasks per update: one is always idle
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        time.sleep(0.15)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "done: 60 epochs" in out  # not a silent early exit (a message to a just-killed worker once ended it)
    assert events(run).count("died with exit code -9") == len(killed)  # idle or busy, every death is seen
    assert digest(run) == digest(tmp_path / "clean" / "run")


def test_a_shard_truncated_under_a_live_run_stops_it_when_workers_cannot_start(tmp_path: Path) -> None:
    """Every replacement worker dies at its start (the manifest's size check): those deaths count against
    train.max_attempts, and the run stops quoting the worker's error once, not a traceback per death."""
    x, y = blobs(n=1000, features=6, classes=3, seed=1)
    data = write_dataset(tmp_path / "d", x, y, shard_rows=300)
    job = write_job(tmp_path, data, epochs=400, workers=2)
    proc = start("train", job)
    run = tmp_path / "run"
    try:
        wait_for_version(run, 2)
        shard = data / "train" / "x-00001.npy"
        os.truncate(shard, shard.stat().st_size - 100)
        os.kill(worker_pids(run)[0], signal.SIGKILL)  # its replacement opens the dataset again
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert "train/x-00001.npy: file is truncated" in err
    assert "could not start 3 times" in err
    assert "Traceback" not in err
    assert err.count("file is truncated") == 1  # quoted once, by the server


def test_a_shard_truncated_under_workers_reading_it_names_the_file_not_a_bus_error(tmp_path: Path) -> None:
    """Workers read a page past the new end of a mapped shard: SIGBUS, exit -7, no message of their own. The
    server checks the shards' sizes then and stops naming the one that shrank. The rows (40 MB) are more than a
    worker keeps (ROW_CACHE_BYTES), so every epoch reads the shards again."""
    x, y = blobs(n=160_000, features=64, classes=3, seed=1)
    data = write_dataset(tmp_path / "d", x, y, shard_rows=40_000)
    job = write_job(tmp_path, data, kind="softmax", model_extra="", epochs=50, workers=2)
    proc = start("train", job)
    try:
        wait_for_version(tmp_path / "run", 2, seconds=60)
        os.truncate(data / "train" / "x-00001.npy", 4096)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert "was killed by SIGBUS: a file it had mapped shrank under the run: " in err
    assert "train/x-00001.npy: file is truncated (expected 10240128 bytes, found 4096 bytes)" in err
    assert "Traceback" not in err


# train.task_timeout of the tests whose worker hangs (SIGSTOP). The bound also covers a replacement worker's start
# (its task's clock runs from the hand-out): at 2 s, on a machine at load average 14, every replacement was killed
# while it still imported, and the run stopped ("could not start 3 times in a row"); at 3 s so did the step-slice
# test's (load average 9, two test processes). 8 s keeps the hang the only silence.
HUNG_TIMEOUT_S = 8


class Started:
    """A ``memtrain train`` of JOB started in the background when the module starts (``hung_runs``), so that its
    wait (a hang of HUNG_TIMEOUT_S, all idle) passes while the module's other tests run; ``result`` waits for it.
    Its output goes to files in FOLDER, never to a pipe it could fill."""

    def __init__(self, folder: Path, job: Path, env: dict[str, str]):
        self.folder = folder
        self._out, self._err = folder / "stdout.txt", folder / "stderr.txt"
        with self._out.open("w") as out, self._err.open("w") as err:
            self._proc = subprocess.Popen([sys.executable, "-m", "memtrain", "train", str(job)], stdout=out,
                                          stderr=err, env={**os.environ, "PYTHONPATH": PYTHONPATH, **env})

    def result(self, timeout: float = 120) -> subprocess.CompletedProcess:
        code = self._proc.wait(timeout=timeout)
        return subprocess.CompletedProcess(self._proc.args, code, self._out.read_text(), self._err.read_text())

    def stop(self) -> None:
        self._proc.kill()
        self._proc.wait()


# The tests whose worker hangs (SIGSTOP, once) at a fault point, by test id: their runs start with the module.
HUNG_RUNS = {
    "test_hung_worker_is_killed_and_its_task_rerun": ("before_grad_write:2", lambda: {}),
    "test_worker_lost_in_its_step_slice_while_its_peer_waits_recovers_identically[stop]":
        ("mid_step:10", lambda: {"model_extra": TWO_SLICES}),
}


def start_hung(name: str, folder: Path, data: Path) -> Started:
    point, job = HUNG_RUNS[name]
    return Started(folder, write_job(folder, data, task_timeout=HUNG_TIMEOUT_S, **job()),
                   {"MEMTRAIN_FAULT": point, "MEMTRAIN_FAULT_ACTION": "stop",
                    "MEMTRAIN_FAULT_ONCE": str(folder / "fired")})


@pytest.fixture(scope="module", autouse=True)
def hung_runs(request: pytest.FixtureRequest, data: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Started]]:
    """The runs of HUNG_RUNS whose tests are selected, started in the background when the module starts: their
    2 x HUNG_TIMEOUT_S of idle wait pass while the module's other tests run. The tests wait for them."""
    selected = {item.name for item in request.session.items if item.path == request.path}
    runs = {name: start_hung(name, tmp_path_factory.mktemp("hung"), data) for name in HUNG_RUNS if name in selected}
    yield runs
    for run in runs.values():
        run.stop()


def hung_run(runs: dict[str, Started], request: pytest.FixtureRequest, data: Path, tmp_path: Path) -> Started:
    """This test's run (started now if the module's fixture did not start it)."""
    if request.node.name not in runs:
        runs[request.node.name] = start_hung(request.node.name, tmp_path, data)
    return runs[request.node.name]


def test_hung_worker_is_killed_and_its_task_rerun(hung_runs: dict[str, Started], baseline: str, data: Path,
                                                  tmp_path: Path, request: pytest.FixtureRequest) -> None:
    started = hung_run(hung_runs, request, data, tmp_path)
    result = started.result()
    assert result.returncode == 0, result.stderr
    assert events(started.folder / "run").count(f"silent for {HUNG_TIMEOUT_S} s") == 1  # killed, and logged, once
    assert digest(started.folder / "run") == baseline


def poisoned(folder: Path, row: int = 700) -> Path:
    x, y = blobs(n=1000, features=6, classes=3, seed=1)
    x[row, 0] = 4242.0
    return write_dataset(folder / "poison", x, y, shard_rows=300)


def test_a_task_that_always_kills_its_worker_stops_the_run_naming_it(tmp_path: Path) -> None:
    job = write_job(tmp_path, poisoned(tmp_path), kind="crash_models:KillsItsWorker", model_extra="",
                    normalize="false")
    result = train_here(job)
    assert result.returncode == 1
    assert "killed its worker 3 times" in result.stderr
    # the default train.shuffle = "rows": the task is a part of a shuffled batch, and says so
    assert re.search(r"positions \d+-\d+ of epoch \d+'s shuffled row order of the train split \(train.shuffle = "
                     r"'rows'\): rows (\d+, ){4}\d+ and \d+ more, shards x-0000[0-3]\.npy", result.stderr)
    assert "Traceback" not in result.stderr


def test_a_task_that_raises_stops_the_run_with_the_worker_traceback(tmp_path: Path) -> None:
    job = write_job(tmp_path, poisoned(tmp_path), kind="crash_models:RaisesOnPoison", model_extra="",
                    normalize="false")
    result = train_here(job)
    assert result.returncode == 1
    assert "failed in worker" in result.stderr and "ValueError: poisoned row in this batch" in result.stderr
    assert re.search(r"gradient task \d \(positions \d+-\d+ of epoch 1's shuffled row order of the train split",
                     result.stderr)



@pytest.mark.parametrize("mode", [["train.mode=async"], ["train.staleness=1", "train.staleness_in=stream"]])
def test_a_task_the_server_computes_itself_that_raises_stops_the_run_with_its_traceback(tmp_path: Path,
                                                                                          mode: list[str]) -> None:
    """Async mode and fixed staleness streamed with no worker: the server computes each gradient itself
    (train/loops/stream.py ``ServerGradients``), and a task that raises is reported as a worker's would be."""
    job = write_job(tmp_path, poisoned(tmp_path), kind="crash_models:RaisesOnPoison", model_extra="",
                    normalize="false")
    sets = [arg for key in mode for arg in ("--set", key)]
    result = train_here(job, "--workers", 0, *sets)
    assert result.returncode == 1, result.stderr
    assert re.search(r"gradient task .*\(positions \d+-\d+ of epoch 1's shuffled row order of the train split.* "
                     r"failed in worker 0:", result.stderr), result.stderr
    assert "ValueError: poisoned row in this batch" in result.stderr and "Traceback" not in result.stderr.split(
        "failed in worker 0:")[0]


# --- rounds: each worker steps its slice of the parameters, meets its peers at the marks, then computes ---

TWO_SLICES = "hidden = [90000]"  # 14 checksum blocks: with 2 workers every step is cut into 2 slices


@pytest.mark.parametrize("workers", [2, 0])
def test_a_memory_error_in_the_rounds_gets_the_one_memory_hint(tmp_path: Path, workers: int) -> None:
    """A MemoryError raised in a gradient (the rounds, on workers or in the server) names the limit and the
    remedies the OOM killer's hint names: the rows per task, train.chunk_rows, fewer workers."""
    job = write_job(tmp_path, poisoned(tmp_path), kind="crash_models:OutOfMemoryOnPoison", model_extra="",
                    normalize="false", workers=workers)
    result = train_here(job)
    assert result.returncode == 1, result.stderr
    err = " ".join(result.stderr.split())
    assert "MemoryError: Unable to allocate 1.00 TiB" in err
    assert "it ran out of memory: the memory limit that applies is" in err
    assert "Lower train.chunk_rows" in err and "(train.batch_size, train.tasks_per_update)" in err


@pytest.fixture(scope="module")
def two_slice_baseline(data: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    job = write_job(tmp_path_factory.mktemp("two-slices"), data, model_extra=TWO_SLICES)
    result = train_here(job)
    assert result.returncode == 0, result.stderr
    run = job.parent / "run"
    assert len(step_slices(np.load(weights_path(run, weight_versions(run)[-1])).size, 2, BLOCK)) == 2
    return digest(job.parent / "run")


@pytest.mark.parametrize("action", ["kill", "stop"])
def test_worker_lost_in_its_step_slice_while_its_peer_waits_recovers_identically(
        tmp_path: Path, data: Path, two_slice_baseline: str, action: str, hung_runs: dict[str, Started],
        request: pytest.FixtureRequest) -> None:
    """Killed (or hung, then killed after task_timeout) in the middle of its slice: the server calls the
    stretch off, the peer that waits for that slice ends it, and the next stretch, with a replacement,
    redoes the update from the ledger. The hung run was started with the module (hung_runs)."""
    if action == "stop":
        started = hung_run(hung_runs, request, data, tmp_path)
        folder, result = started.folder, started.result()
    else:
        folder = tmp_path
        job = write_job(folder, data, model_extra=TWO_SLICES, task_timeout=HUNG_TIMEOUT_S)
        result = memtrain("train", job, env={"MEMTRAIN_FAULT": "mid_step:10", "MEMTRAIN_FAULT_ACTION": action,
                                             "MEMTRAIN_FAULT_ONCE": str(folder / "fired")})
    assert result.returncode == 0, result.stderr
    assert (folder / "fired").exists(), "the fault never fired"
    run = folder / "run"
    assert "died with exit code -9" in events(run)
    if action == "stop":
        assert f"silent for {HUNG_TIMEOUT_S} s" in events(run)
    assert digest(run) == two_slice_baseline
    assert leftovers(run) == []


# a poisoned batch is contiguous rows: the order that keeps them one batch (train.shuffle = "rows" mixes them)
BATCHES = ("--set", 'train.shuffle="batches"')


def poisoned_batch(folder: Path) -> Path:
    """Train rows 400-599 poisoned: the whole of batch 2 (batch_size 200), in every task of its update, with
    train.shuffle = "batches" (``BATCHES``)."""
    x, y = blobs(n=1000, features=6, classes=3, seed=1)
    x[500:700, 0] = POISON  # the first 100 rows are the validation split
    return write_dataset(folder / "poison", x, y, shard_rows=300)


@pytest.mark.parametrize("workers", [2, 0])
def test_a_nonfinite_step_skips_its_update_like_a_nonfinite_gradient(tmp_path: Path, workers: int) -> None:
    """Every task's gradient finite, their sum not: the update is skipped at its step, inside the round
    that already computes the next gradients. Those are recomputed at the unchanged version, so the run
    ends bitwise where a run that skipped the same update at its gradients ends. On workers, and in the server
    alone (which meets nobody: it knows the finiteness itself)."""
    data = poisoned_batch(tmp_path)
    runs = {}
    for kind in ("NanLossOnPoison", "HugeGradientOnPoison"):
        job = write_job(tmp_path / kind, data, kind=f"crash_models:{kind}", model_extra=TWO_SLICES,
                        normalize="false", workers=workers)
        result = train_here(job, "--set", 'train.on_nonfinite="skip"', *BATCHES)
        assert result.returncode == 0, result.stderr
        runs[kind] = tmp_path / kind / "run"
        updates = [r for r in map(json.loads, (runs[kind] / "metrics.jsonl").open()) if r["kind"] == "update"]
        skipped = [r for r in updates if r["skipped"]]
        assert [(r["epoch"], r["batch"]) for r in skipped] == [(1, 2), (2, 4)]  # neither last in its epoch
    assert "the mean gradient or the new weights" in events(runs["HugeGradientOnPoison"])
    assert digest(runs["NanLossOnPoison"]) == digest(runs["HugeGradientOnPoison"])
    for version in weight_versions(runs["HugeGradientOnPoison"]):
        assert np.isfinite(np.load(weights_path(runs["HugeGradientOnPoison"], version))).all()


@pytest.mark.parametrize("workers", [2, 0])
def test_a_nonfinite_step_stops_the_run_with_the_published_weights_intact(tmp_path: Path, workers: int) -> None:
    job = write_job(tmp_path, poisoned_batch(tmp_path), kind="crash_models:HugeGradientOnPoison",
                    model_extra=TWO_SLICES, normalize="false", workers=workers)
    result = train_here(job, *BATCHES)
    assert result.returncode == 1
    assert ("non-finite loss or gradient at update 2 (epoch 1, batch 2): the mean gradient or the new weights"
            in result.stderr)
    run = tmp_path / "run"
    assert weight_versions(run)[-1] == 1  # update 0 published; update 1's step void
    assert leftovers(run) == []


# --- the server dying, signals, resume ---

@pytest.mark.parametrize("point", ["after_update_logged:3", "after_result:2", "ckpt_after_data:1",
                                   "ckpt_before_commit:2", "write:9"])
def test_server_killed_then_resumed_is_identical_and_leaves_no_orphans(tmp_path: Path, data: Path, baseline: str,
                                                                        point: str) -> None:
    job = write_job(tmp_path, data)
    crashed = memtrain("train", job, env={"MEMTRAIN_FAULT": point, "MEMTRAIN_FAULT_ONCE": str(tmp_path / "fired")})
    assert crashed.returncode == -9, crashed.stderr
    run = tmp_path / "run"
    assert wait_gone(worker_pids(run), 5) == [], "workers outlived their server"
    resumed = train_here("--resume", run)
    assert resumed.returncode == 0, resumed.stderr
    assert digest(run) == baseline
    assert leftovers(run) == []


@pytest.mark.parametrize(("sig", "code"), [
    (signal.SIGINT, 130),
    # out of CI for time: SIGINT, SIGTERM and SIGHUP take one handler (memtrain/stopping.py) and differ only in the
    # name and code the stop reports; SIGTERM's are test_server_running_the_rounds_stops_cleanly_on_a_signal[15-143]'s
    # (and test_slurm.py's, test_rl_faults.py's, test_serve.py's), a stop with workers this test's [2-130]
    pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow),
])
def test_interrupt_checkpoints_and_says_how_to_resume(tmp_path: Path, data: Path, clean_digest: Callable[..., str],
                                                     sig: int, code: int) -> None:
    job = write_job(tmp_path / "stopped", data, epochs=12)  # 60 updates: the stop at version 7 lands mid-run
    proc = start("train", job)
    run = tmp_path / "stopped" / "run"
    wait_for_version(run, 7)
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert f"resume with: memtrain train --resume {run}" in err
    assert f"memtrain train: stopped by {signal.Signals(sig).name} " in err and "error" not in err, err  # a stop
    assert checkpoint_updates(run), "no checkpoint after the interrupt"
    assert wait_gone(worker_pids(run), 5) == []
    assert train_here("--resume", run).returncode == 0
    # the reference in the server: the same bits as any worker count (test_rounds.py), without 2 more interpreters
    assert digest(run) == clean_digest("--workers", 0, epochs=12)


# --- the server running the rounds itself (train.workers = 0): the same guarantees ---

@pytest.mark.parametrize("point", ["before_grad_write:7", "mid_step:4", "after_publish:3", "after_update_logged:5",
                                   # the second epoch's stretch, stepping into the ring's file the first one left
                                   "mid_step:8", "after_publish:7"])
def test_server_running_the_rounds_killed_then_resumed_is_identical(tmp_path: Path, data: Path, baseline: str,
                                                                    point: str) -> None:
    """The baseline ran on 2 worker processes: the same bits from the server alone, across a crash."""
    job = write_job(tmp_path, data, workers=0)
    crashed = memtrain("train", job, env={"MEMTRAIN_FAULT": point})
    assert crashed.returncode == -9, crashed.stderr
    run = tmp_path / "run"
    assert "rounds: in the server (train.workers = 0)" in events(run)
    resumed = train_here("--resume", run)
    assert resumed.returncode == 0, resumed.stderr
    assert digest(run) == baseline
    assert leftovers(run) == []


@pytest.mark.parametrize(("sig", "code"), [
    # out of CI for time: one handler for SIGINT and SIGTERM (memtrain/stopping.py); SIGINT's name and code are
    # test_interrupt_checkpoints_and_says_how_to_resume[2-130]'s, the server alone stopped by a signal [15-143]'s
    pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow),
    (signal.SIGTERM, 143),
])
def test_server_running_the_rounds_stops_cleanly_on_a_signal(tmp_path: Path, data: Path,
                                                             clean_digest: Callable[..., str], sig: int,
                                                             code: int) -> None:
    job = write_job(tmp_path / "stopped", data, epochs=40, workers=0)
    proc = start("train", job)
    run = tmp_path / "stopped" / "run"
    wait_for_version(run, 30)
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert f"resume with: memtrain train --resume {run}" in err
    stopped_at = json.loads((run / "lineage.jsonl").read_text().splitlines()[-1])["version"]
    assert stopped_at < 200, "the signal landed after the run had finished"
    assert train_here("--resume", run).returncode == 0
    assert digest(run) == clean_digest(epochs=40, workers=2)  # the workers' bits, from the server alone


def test_a_version_an_outside_reader_locks_is_never_rewritten(tmp_path: Path, data: Path) -> None:
    """Retired versions are recycled as later versions' files, unless a reader holds flock on them: a
    locked version is only unlinked, so the reader keeps its bytes."""
    job = write_job(tmp_path, data, epochs=8)
    proc = start("train", job)
    run = tmp_path / "run"
    wait_for_version(run, 2)
    for version in range(2, 40):
        try:
            fd = os.open(weights_path(run, version), os.O_RDONLY)
            break
        except FileNotFoundError:  # already retired: take a newer one
            continue
    fcntl.flock(fd, fcntl.LOCK_SH)
    before = os.pread(fd, 1 << 20, 0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert version not in weight_versions(run), "the locked version was still published at the end"
    assert os.pread(fd, 1 << 20, 0) == before, "a locked version was rewritten"
    lineage = {r["version"]: r["checksum"] for r in map(json.loads, (run / "lineage.jsonl").open())}
    assert checksum_bytes(before) == lineage[version]
    os.close(fd)


def checksum_bytes(data: bytes) -> str:
    from memtrain.files import block_checksum, block_digest, npy_data_offset

    offset = npy_data_offset(data)
    blocks = [data[offset + k:offset + k + (256 << 10)] for k in range(0, len(data) - offset, 256 << 10)]
    return block_checksum(data[:offset], b"".join(block_digest(block) for block in blocks))


# --- corrupt files ---

def flip_byte(path: Path, offset_from_end: int = 5) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))


def test_verify_names_a_flipped_byte_in_a_shard(tmp_path: Path) -> None:
    x, y = blobs(n=600, features=6, classes=3)
    data = write_dataset(tmp_path / "d", x, y, shard_rows=300)
    flip_byte(data / "train" / "x-00001.npy")
    result = train_here(write_job(tmp_path, data), "--verify")
    assert result.returncode == 1
    assert "train/x-00001.npy: checksum mismatch" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: os.truncate(p, p.stat().st_size - 100), "file is truncated"),
    (lambda p: p.write_bytes(p.read_bytes() + b"junk"), "file has trailing bytes"),
    (lambda p: p.write_bytes(b"not a numpy file at all"), "not a .npy file"),
])
def test_damaged_shards_are_clear_errors_not_crashes(tmp_path: Path, damage, message: str) -> None:
    x, y = blobs(n=600, features=6, classes=3)
    data = write_dataset(tmp_path / "d", x, y, shard_rows=300)
    damage(data / "train" / "x-00000.npy")
    result = train_here(write_job(tmp_path, data))
    assert result.returncode == 1
    assert f"train/x-00000.npy: {message}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_pickled_shard_is_refused_and_its_payload_never_runs(tmp_path: Path) -> None:
    x, y = blobs(n=600, features=6, classes=3)
    data = write_dataset(tmp_path / "d", x, y, shard_rows=300)
    sentinel = tmp_path / "payload-ran"
    payload = np.array([Payload(str(sentinel))], dtype=object)
    with open(data / "train" / "y-00000.npy", "wb") as handle:
        np.save(handle, payload, allow_pickle=True)
    result = train_here(write_job(tmp_path, data))
    assert result.returncode == 1
    assert "refusing a .npy file that holds Python objects" in result.stderr
    assert not sentinel.exists()


class Payload:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_header_claiming_a_huge_shape_is_refused_before_allocating(tmp_path: Path) -> None:
    x, y = blobs(n=600, features=6, classes=3)
    data = write_dataset(tmp_path / "d", x, y, shard_rows=300)
    shard = data / "train" / "x-00000.npy"
    raw = shard.read_bytes()
    header_end = raw.index(b"\n") + 1
    header = raw[:header_end].replace(b"(300, 6)", b"(1000000000000, 6)")
    shard.write_bytes(header[:8] + (len(header) - 10).to_bytes(2, "little") + header[10:] + raw[header_end:])
    result = train_here(write_job(tmp_path, data))
    assert result.returncode == 1
    assert "train/x-00000.npy: shape differs from what was recorded" in result.stderr
    assert "(1000000000000, 6)" in result.stderr and "Traceback" not in result.stderr


def test_resume_skips_a_corrupt_newest_checkpoint_and_says_so(tmp_path: Path, data: Path,
                                                              clean_digest: Callable[..., str]) -> None:
    job = write_job(tmp_path / "run3", data, epochs=3)
    assert train_here(job, "--set", "train.epochs=2").returncode == 0
    run = tmp_path / "run3" / "run"
    newest = checkpoint_path(run, checkpoint_updates(run)[-1])
    flip_byte(newest / "weights.npy")
    resumed = train_here("--resume", run, "--set", "train.epochs=3")
    assert resumed.returncode == 0, resumed.stderr
    assert f"skipping checkpoint {newest.name}" in resumed.stdout + resumed.stderr
    assert "weights.npy: checksum mismatch" in resumed.stdout + resumed.stderr
    assert digest(run) == clean_digest("--workers", 0, epochs=3)  # any worker count: the same bits


# --- numerical failure ---

def exploding(folder: Path) -> Path:
    x, y = blobs(n=600, features=6, classes=3)
    x[400:420] = 3e38  # finite in float32, but the loss overflows to inf
    return write_dataset(folder / "big", x, y, shard_rows=300)


def test_nonfinite_loss_stops_naming_update_and_task(tmp_path: Path) -> None:
    job = write_job(tmp_path, exploding(tmp_path), kind="softmax", model_extra="", normalize="false")
    result = train_here(job)
    assert result.returncode == 1
    assert re.search(r"non-finite loss or gradient at update \d+ \(epoch 1, batch \d+\): task \d \(positions \d+-\d+ "
                     r"of epoch 1's shuffled row order of the train split \(train.shuffle = 'rows'\): rows \d+",
                     result.stderr)
    assert "RuntimeWarning" not in result.stderr
    for version in weight_versions(tmp_path / "run"):
        assert np.isfinite(np.load(weights_path(tmp_path / "run", version))).all()


def test_nonfinite_updates_can_be_skipped(tmp_path: Path) -> None:
    job = write_job(tmp_path, exploding(tmp_path), kind="softmax", model_extra="", normalize="false")
    result = train_here(job, "--set", 'train.on_nonfinite="skip"')
    assert result.returncode == 0, result.stderr
    assert "update skipped" in events(tmp_path / "run")
    for version in weight_versions(tmp_path / "run"):
        assert np.isfinite(np.load(weights_path(tmp_path / "run", version))).all()


# --- full disks and small exchange areas (real tmpfs mounts; root is needed) ---

@pytest.fixture
def tmpfs(tmp_path: Path):
    mounted = []

    def mount(size: str) -> Path:
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}); the injected variant still runs")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def test_disk_full_during_training_is_clear_and_resumable(tmp_path: Path, data: Path, tmpfs) -> None:
    """The start-up check reserves room for every file of the run; here something else fills the disk."""
    big = 'hidden = [2048]'  # 82 KB per weight file
    clean = write_job(tmp_path / "clean", data, model_extra=big, epochs=30)
    assert train_here(clean).returncode == 0
    small = tmpfs("8m")
    job = write_job(small / "job", data, model_extra=big, epochs=30)
    job.write_text(job.read_text().replace('dir = "run"', f'dir = "run"\nexchange = "{tmp_path}"'))
    proc = start("train", job)
    run = small / "job" / "run"
    wait_for_version(run, 3)
    with open(small / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:  # another program takes every free block (unbuffered: the last write fails here)
            filler.write(b"\0" * 4096)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "no space left on the device" in err
    assert "Traceback" not in err and "Bus error" not in err
    assert leftovers(run) == []
    (small / "filler").unlink()
    resumed = train_here("--resume", run)
    assert resumed.returncode == 0, resumed.stderr
    assert digest(run) == digest(tmp_path / "clean" / "run")


@pytest.mark.parametrize("hit", [1, 5, 12, 20])
def test_injected_disk_full_at_a_write_keeps_the_last_checkpoint(tmp_path: Path, data: Path, baseline: str,
                                                                  hit: int) -> None:
    job = write_job(tmp_path, data)
    full = memtrain("train", job, env={"MEMTRAIN_FAULT": f"write:{hit}", "MEMTRAIN_FAULT_ACTION": "raise",
                                       "MEMTRAIN_FAULT_ONCE": str(tmp_path / "fired")})
    assert full.returncode == 1, full.stderr
    assert "no space left on the device" in full.stderr and "Traceback" not in full.stderr
    resumed = train_here(job, "--resume")  # works even when the run failed before writing job.json
    assert resumed.returncode == 0, resumed.stderr
    assert digest(tmp_path / "run") == baseline


def test_exchange_without_room_is_refused_before_starting(tmp_path: Path, data: Path, tmpfs) -> None:
    small = tmpfs("64k")
    job = write_job(tmp_path, data, model_extra="hidden = [512]")
    job.write_text(job.read_text().replace('dir = "run"', f'dir = "run"\nexchange = "{small}"'))
    result = train_here(job)
    assert result.returncode == 1
    assert "no room for the exchange area" in result.stderr
    assert re.search(rf"expected [\d.]+ [KM]iB free in {small}, found {small}: [\d.]+ KiB free", result.stderr)
    assert not (tmp_path / "run").exists()  # refused after it was made: the run directory is removed again
    assert train_here(job, "--set", 'run.exchange="run"').returncode == 0  # so the hint's fix just works


def test_auto_exchange_falls_back_when_dev_shm_is_small(tmp_path: Path, data: Path) -> None:
    job = write_job(tmp_path, data, model_extra="hidden = [4096]")  # the exchange needs ~2 MiB
    script = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} -m memtrain train {job}"
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": PYTHONPATH})
    if "unshare failed" in result.stderr or "mount:" in result.stderr:
        pytest.skip(f"no mount namespace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    log = events(tmp_path / "run")
    assert "exchange: /dev/shm has" in log and "not used" in log
    assert f"exchange area: {tmp_path / 'run'}" in log


# --- leftovers ---

def test_leftovers_of_dead_runs_are_swept_and_live_ones_kept(tmp_path: Path, data: Path) -> None:
    job = write_job(tmp_path, data, epochs=1)
    run = tmp_path / "run"
    assert train_here(job).returncode == 0
    dead = subprocess.run(["true"]).returncode or 999_999
    sleeper = subprocess.Popen(["sleep", "30"])
    live = Path("/dev/shm") / f"memtrain-x-a11e0001-{sleeper.pid}"
    try:
        stale = [run / f"memtrain-x-dead0001-{dead}", Path("/dev/shm") / f"memtrain-x-dead0002-{dead}"]
        for folder in [*stale, live]:
            folder.mkdir()
            (folder / ".memtrain-exchange.json").write_text(str(dead))
            (folder / "g-v00000001-t00000-a000.npy").write_bytes(b"stale")
        (run / "weights" / f".v00000001.npy.tmp-{dead}-abcdef12").write_bytes(b"partial")
        (run / f".metrics.jsonl.tmp-{dead}-0123abcd").write_bytes(b"partial")
        result = train_here(job, "--resume", "--set", "train.epochs=2")
        assert result.returncode == 0, result.stderr
        assert not any(folder.exists() for folder in stale)
        assert live.exists()
        assert leftovers(run) == []
    finally:
        sleeper.kill()
        import shutil
        shutil.rmtree(live, ignore_errors=True)
