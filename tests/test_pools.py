"""Worker pools started and stopped many times while the server process has busy threads (RELIABILITY #36).

A forked child inherits only the forking thread, so a lock held by another thread at that moment (a
logging handler's, watchdog's) stays locked forever in the child. memtrain starts workers with
``spawn``; these tests hold such locks busy on purpose while pools come and go, and require every pool
to do real work, every worker to be a spawned interpreter (not a fork of the busy process) and to exit
by itself when asked.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset
from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

from memtrain.layout import partial_name, statistics_dir
from memtrain.train.messages import RoundSetup, StatsTask, WorkerSetup
from memtrain.train.optim import OptimizerConfig
from memtrain.train.server.exchange import WorkerPool
from memtrain.train.server.outline import outline_model

WORKERS = 2


class Busy:
    """A thread logging through a file handler and a watchdog observer fed by a thread touching files."""

    def __init__(self, root: Path):
        self.stop = threading.Event()
        self.logged = 0
        self.seen = 0
        watched = root / "watched"
        watched.mkdir()
        self.logger = logging.getLogger(f"memtrain-test-busy-{id(self)}")
        self.logger.propagate = False
        self.handler = logging.FileHandler(root / "busy.log")
        self.logger.addHandler(self.handler)
        self.observer = Observer()
        self.observer.schedule(self._Counter(self), str(watched))
        self.threads = [threading.Thread(target=self._log, daemon=True),
                        threading.Thread(target=self._touch, args=(watched,), daemon=True)]

    class _Counter(FileSystemEventHandler):
        def __init__(self, busy: Busy):
            self.busy = busy

        def on_any_event(self, event) -> None:
            self.busy.seen += 1

    def _log(self) -> None:
        """A line, then the handler's lock held a few ms: held nearly all the time (what a fork would inherit
        locked), without a thread logging flat out stealing a core from the workers."""
        while not self.stop.is_set():
            self.logger.warning("busy line %d", self.logged)
            self.logged += 1
            with self.handler.lock:
                self.stop.wait(0.005)

    def _touch(self, watched: Path) -> None:
        k = 0
        while not self.stop.is_set():
            (watched / f"f{k % 50}").write_text(str(k))
            k += 1
            time.sleep(0.004)

    def __enter__(self) -> Busy:
        self.observer.start()
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)
        self.observer.stop()
        self.observer.join(5)
        self.logger.removeHandler(self.handler)
        self.handler.close()


@pytest.fixture
def setup(tmp_path: Path) -> WorkerSetup:
    x, y = blobs(n=400, features=4)
    data = write_dataset(tmp_path / "data", x, y, val_rows=40)
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    statistics_dir(tmp_path / "run").mkdir(parents=True)  # the server makes it (train/loops/additive.py)
    rounds = RoundSetup(batch_size=None, tasks_per_update=WORKERS, seed=0, epochs=1, shuffle="rows", shuffle_window=64,
                        keep_versions=1,
                        on_nonfinite="stop", slots=WORKERS)
    return WorkerSetup(server_pid=os.getpid(), run_dir=str(tmp_path / "run"), exchange_dir=str(exchange),
                       dataset=str(data), normalize=False, model_kind="naive_bayes", model_options=(), blas_threads=1,
                       optimizer=OptimizerConfig(name="sgd"), rounds=rounds)


def spawned(pid: int) -> bool:
    """A spawned worker is a fresh interpreter running multiprocessing's spawn_main; a fork runs our argv."""
    return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()


def cycle_pools(setup: WorkerSetup, root: Path, cycles: int) -> None:
    with Busy(root) as busy:
        for cycle in range(cycles):
            pool = WorkerPool(setup, WORKERS)
            pids = pool.pids()
            for slot in pool.slots:
                lo = slot.index * 100
                pool.send(slot, StatsTask(task=slot.index, attempt=cycle, lo=lo, hi=lo + 100, chunk_rows=32))
            results = []
            deadline = time.monotonic() + 60
            while len(results) < WORKERS and time.monotonic() < deadline:
                for event in pool.wait(1.0):
                    assert event.answer is not None, f"cycle {cycle}: worker {event.slot.index} died"
                    assert event.answer.error is None, event.answer.error
                    results.append(event.answer)
            assert sorted(r.rows for r in results) == [100] * WORKERS, f"cycle {cycle}: {results}"
            assert all(spawned(pid) for pid in pids), f"cycle {cycle}: a worker is a fork of the server"
            for r in results:
                out = statistics_dir(Path(setup.run_dir)) / partial_name(r.task, r.attempt)
                assert np.isfinite(np.load(out)).all()
                out.unlink()
            processes = [slot.process for slot in pool.slots]
            pool.close(timeout=30)
            assert [p.exitcode for p in processes] == [0] * WORKERS, f"cycle {cycle}: pids {pids} had to be killed"
        assert busy.logged > 0 and busy.seen > 0  # the threads really were busy the whole time


def test_twenty_pools_come_and_go_while_threads_hold_locks(setup: WorkerSetup, tmp_path: Path) -> None:
    cycle_pools(setup, tmp_path, 20)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_hundred_pools_come_and_go_while_threads_hold_locks(setup: WorkerSetup, tmp_path: Path) -> None:
    cycle_pools(setup, tmp_path, 200)


def test_a_stopped_worker_runs_its_atexit_hooks_and_skips_the_teardown(setup: WorkerSetup, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker ends with os._exit after its atexit hooks (train/worker/launch.py exit_at_once): the interpreter's
    teardown, 0.35-0.52 s for a process that imported torch, is not waited for at every pool close."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("MEMTRAIN_TEST_EXIT_MARKS", str(marks))
    pool = WorkerPool(dataclasses.replace(setup, model_kind="exit_models:MarksItsExit"), WORKERS)
    deadline = time.monotonic() + 60
    while not pool.ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    pids, processes = pool.pids(), [slot.process for slot in pool.slots]
    pool.close(timeout=30)
    assert [p.exitcode for p in processes] == [0] * WORKERS
    assert sorted(path.name for path in marks.iterdir()) == sorted(f"atexit-{pid}" for pid in pids)


def ready_pool(pool: WorkerPool, *, seconds: float = 60) -> list:
    """Wait (bounded) until every worker of ``pool`` has started; the events seen on the way."""
    events, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        events += pool.wait(0.05)
        if pool.ready():
            return events
    raise AssertionError(f"the pool's workers did not start in {seconds} s")


def test_an_adopted_outline_child_that_dies_is_replaced_by_a_new_worker(setup: WorkerSetup) -> None:
    """train.workers = "auto" with an outlined model: the child that outlined it is the first worker
    (train/server/outline.py keep=True). Killed, it is reported like any worker's death and its slot gets a new
    process, which starts as every worker does."""
    setup = dataclasses.replace(setup, model_kind="softmax")
    outline = outline_model(dataset=setup.dataset, kind="softmax", options={}, normalize=False, seed=0, threads=1,
                            keep=True)
    kept = outline.adopt()
    pool = WorkerPool(setup, 1, adopt=kept)
    try:
        ready_pool(pool)
        assert pool.pids() == [kept.process.pid]
        os.kill(kept.process.pid, signal.SIGKILL)
        events, deadline = [], time.monotonic() + 30
        while not events and time.monotonic() < deadline:
            events = pool.wait(0.5)
        assert [(event.slot.index, event.answer) for event in events] == [(0, None)]
        assert events[0].exitcode == -signal.SIGKILL
        ready_pool(pool)
        assert pool.pids() != [kept.process.pid] and spawned(pool.pids()[0])
    finally:
        pool.close(timeout=30)


def test_a_worker_that_dies_while_the_pool_grows_is_started_again_unreported(setup: WorkerSetup) -> None:
    """A worker started beside the running ones (``grow``) is not sent anything until all have started: its
    death then only starts it again, and the pool is ready with both slots."""
    pool = WorkerPool(setup, 1)
    try:
        ready_pool(pool)
        pool.grow(2)
        doomed = pool.pending[0].process.pid
        os.kill(doomed, signal.SIGKILL)
        events = ready_pool(pool)
        assert events == [] and len(pool.slots) == 2 and not pool.pending
        assert doomed not in pool.pids() and all(spawned(pid) for pid in pool.pids())
    finally:
        pool.close(timeout=30)


def resident_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def test_a_kept_outline_child_hands_its_start_up_garbage_back_before_it_serves(setup: WorkerSetup) -> None:
    """A worker keeps freed memory for its next task (worker.py keep_freed_memory); the outline's kept child
    set that policy before it built the model, so version 0 and the dry run's temporaries would stay
    resident for the whole run: it trims its heap once (release_freed_memory) before it serves."""
    outline = outline_model(dataset=setup.dataset, kind="memory_models:ScratchAtInit", options={}, normalize=False,
                            seed=0, threads=1, keep=True)
    try:
        pid, deadline = outline.kept.process.pid, time.monotonic() + 20
        while resident_mib(pid) > 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert resident_mib(pid) < 200  # the 256 MiB scratch was filled: without the trim it stays
    finally:
        outline.release()
