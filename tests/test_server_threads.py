"""The server's task threads (train/loops/threads.py): an update's tasks computed at once when the server runs the
rounds itself, bitwise as one thread and as workers; errors raised as alone; the choice (train/server/placement.py)."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

from memtrain.cli import main
from memtrain.config import TrainConfig
from memtrain.errors import InputError
from memtrain.layout import weight_versions, weights_path
from memtrain.train.loops.threads import TaskThreads
from memtrain.train.server.placement import PROBE_UPDATES, ServerThreads, thread_candidates

pytestmark = pytest.mark.timeout(300)

JOB = """
[data]
path = "{data}"

[model]
{model}

[train]
epochs = 2
batch_size = 60
tasks_per_update = 3
optimizer = "adam"
lr = 0.01
seed = 11
workers = {workers}
task_timeout = 60
shuffle = "{shuffle}"
shuffle_window = 64
{train}

[run]
dir = "run"
"""
MLP = 'kind = "mlp"\nhidden = [8]'
DROPOUT = 'kind = "thread_models:DropoutSoftmax"'
ON_THREADS = "an update's tasks on 2 threads"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=400, features=6, classes=3, seed=2)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=100)


def train(folder: Path, data: Path, *, model: str, workers: int, shuffle: str = "batches", train: str = "") -> int:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.toml"
    job.write_text(JOB.format(data=data, model=model, workers=workers, shuffle=shuffle, train=train))
    return main(["train", str(job), "--quiet"])


def digests(run: Path) -> tuple[str, str]:
    """The final weight file's bytes and the lineage's (every version's checksum), hashed."""
    final = np.load(weights_path(run, weight_versions(run)[-1]), allow_pickle=False)
    return (hashlib.sha256(final.tobytes()).hexdigest(),
            hashlib.sha256((run / "lineage.jsonl").read_bytes()).hexdigest())


@pytest.mark.parametrize("shuffle", ["batches", "rows"])
@pytest.mark.parametrize("model", [MLP, DROPOUT], ids=["mlp", "dropout"])
def test_the_threads_give_the_bits_of_one_thread_and_of_two_workers(data: Path, tmp_path: Path, model: str,
                                                                    shuffle: str) -> None:
    record = tmp_path / "threads.txt"
    options = f'\nrecord = "{record}"' if model == DROPOUT else ""
    runs = {"one thread": (0, "server_threads = 1"), "threads": (0, "server_threads = 2"), "workers": (2, "")}
    found = {}
    for name, (workers, keys) in runs.items():
        if name == "threads" and record.exists():
            record.unlink()
        assert train(tmp_path / name, data, model=model + options, workers=workers, shuffle=shuffle, train=keys) == 0
        found[name] = digests(tmp_path / name / "run")
        if name == "threads" and model == DROPOUT:  # the tasks really ran on both threads
            names = {line.split()[1] for line in record.read_text().splitlines()}
            assert names == {"MainThread", "memtrain-task-thread-1"}
    assert ON_THREADS in (tmp_path / "threads" / "run" / "events.log").read_text()
    assert found["threads"] == found["one thread"] == found["workers"]


def test_a_task_threads_error_stops_the_run_as_on_one_thread(data: Path, tmp_path: Path) -> None:
    """Task 1 runs on the helper thread: its model error ends the run as it does on one thread."""
    record = tmp_path / "threads.txt"
    model = f'{DROPOUT}\nfail_task = 1\nrecord = "{record}"'
    for name, threads in (("one", 1), ("two", 2)):
        assert train(tmp_path / name, data, model=model, workers=0, train=f"server_threads = {threads}") != 0
        events = (tmp_path / name / "run" / "events.log").read_text()
        assert "injected failure in task 1 at version 3" in events
    assert "1 memtrain-task-thread-1" in record.read_text().splitlines()  # task 1 ran (and failed) on the helper
    assert ON_THREADS in (tmp_path / "two" / "run" / "events.log").read_text()
    assert not [t for t in threading.enumerate() if t.name.startswith("memtrain-task")]  # none left behind


def test_an_updates_compute_on_the_threads_is_the_busiest_threads_not_the_sum(data: Path, tmp_path: Path) -> None:
    """metrics.jsonl's compute_s (what bench train's compute column reads) is the slowest participant's
    compute: on 2 threads, each of an update's 3 tasks sleeping 40 ms, 80 ms (tasks 0 and 2 on one thread),
    not 120."""
    import json

    model = f"{DROPOUT}\nsleep = 0.04"
    assert train(tmp_path, data, model=model, workers=0, train="server_threads = 2") == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    computes = [record["compute_s"] for record in map(json.loads, lines) if record.get("kind") == "update"]
    assert computes and min(computes) >= 0.08 and sorted(computes)[len(computes) // 2] < 0.11, computes


def test_task_threads_run_every_job_in_order_on_its_thread() -> None:
    with TaskThreads(2) as threads:
        for _ in range(3):  # the same helper, call after call
            assert threads.run([lambda t, i=i: (i, t, threading.current_thread().name) for i in range(5)]) == [
                (0, 0, "MainThread"), (1, 1, "memtrain-task-thread-1"), (2, 0, "MainThread"),
                (3, 1, "memtrain-task-thread-1"), (4, 0, "MainThread")]
    assert not [t for t in threading.enumerate() if t.name.startswith("memtrain-task")]


def test_a_jobs_error_is_raised_after_every_thread_is_done() -> None:
    finished = []

    def slow(thread: int) -> None:
        time.sleep(0.05)
        finished.append(thread)

    def fail(thread: int) -> None:
        raise KeyboardInterrupt if thread else ZeroDivisionError("the first")

    with TaskThreads(2) as threads:
        with pytest.raises(KeyboardInterrupt):  # job 1, on the helper: the first failed job in job order
            threads.run([slow, fail, fail])
        with pytest.raises(ZeroDivisionError, match="the first"):
            threads.run([fail, slow])
        assert finished == [0, 1]  # the helper's slow job was done before the caller raised
        assert threads.run([lambda t: t, lambda t: t]) == [0, 1]  # and the threads still work
    assert not [t for t in threading.enumerate() if t.name.startswith("memtrain-task")]


class Safe:
    thread_safe = True


def test_threads_need_a_thread_safe_model_one_blas_thread_and_two_tasks() -> None:
    assert thread_candidates(setting="auto", tasks=4, cores=2, blas_threads=1, model=Safe())[0] == 2
    assert thread_candidates(setting=3, tasks=4, cores=2, blas_threads=1, model=Safe())[0] == 3
    assert thread_candidates(setting=3, tasks=2, cores=2, blas_threads=1, model=Safe())[0] == 2
    assert thread_candidates(setting="auto", tasks=1, cores=2, blas_threads=1, model=Safe())[0] == 1
    assert thread_candidates(setting="auto", tasks=4, cores=1, blas_threads=1, model=Safe())[0] == 1
    assert thread_candidates(setting="auto", tasks=4, cores=2, blas_threads=2, model=Safe())[0] == 1
    count, why = thread_candidates(setting=2, tasks=4, cores=2, blas_threads=1, model=object())
    assert count == 1 and "thread_safe" in why


@pytest.mark.parametrize(("one", "many", "chosen"), [(1.0, 0.6, 2), (1.0, 0.97, 1), (1.0, 1.4, 1)])
def test_auto_times_one_thread_then_the_threads_and_keeps_the_faster(one: float, many: float,
                                                                     chosen: int) -> None:
    lines: list[str] = []
    threads = ServerThreads(count=2, timed=True, why="", log=lines.append)
    assert threads.current() == 1 and not threads.decided
    threads.observe([one * 1e-3] * PROBE_UPDATES, 7)
    assert threads.current() == 2 and not threads.decided
    threads.observe([many * 1e-3] * PROBE_UPDATES, 14)
    assert threads.decided and threads.current() == chosen
    assert f"{many:.2f} ms per update on 2 threads, {one:.2f} ms on one" in lines[-1]


def test_server_threads_is_auto_or_a_count_of_at_least_one() -> None:
    assert TrainConfig().server_threads == "auto"
    for bad in (0, -1, "two", 1.5):
        with pytest.raises(InputError, match="train.server_threads out of range"):
            TrainConfig(server_threads=bad)
