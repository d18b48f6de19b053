"""The rounds' machinery on its own: the doorbell waiters sleep on, and where the rounds run (train.workers).

End to end: the server running the rounds itself gives the same bits as worker processes, and
``train.workers = "auto"`` records its choice and the figures it chose by in the event log.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

from memtrain.cli import main
from memtrain.files import open_npy, publish_array
from memtrain.layout import weight_versions, weights_path
from memtrain.train.exchange import doorbell
from memtrain.train.exchange import weights as weights_module
from memtrain.train.exchange.doorbell import Doorbell
from memtrain.train.exchange.marks import Board
from memtrain.train.loops import mapped, rounds
from memtrain.train.loops.mapped import RowCache, _private_bytes
from memtrain.train.loops.maps import MapCache
from memtrain.train.server import placement
from memtrain.train.server.placement import MIN_GAIN_S, PROBE_UPDATES, SPAWN_COST_S
from memtrain.train.server.scheduler import CORES

pytestmark = pytest.mark.timeout(180)


def _ring_later(path: str, offset: int, delay: float) -> None:
    fd = os.open(path, os.O_RDWR)
    time.sleep(delay)
    Doorbell(fd, offset).ring()


@pytest.mark.skipif(not doorbell.available(), reason="futexes are Linux-only; elsewhere the waiters nap")
def test_a_sleeper_is_woken_by_a_ring_from_another_process_and_never_misses_one(tmp_path: Path) -> None:
    path = tmp_path / "board"
    path.write_bytes(bytes(4096))
    bell = Doorbell(os.open(path, os.O_RDWR), 48)
    seen = bell.value
    started = time.monotonic()
    bell.sleep(seen, 0.3)  # nobody rings: the timeout ends it
    assert time.monotonic() - started >= 0.25
    ringer = multiprocessing.get_context("spawn").Process(target=_ring_later, args=(str(path), 48, 0.5))
    ringer.start()
    started = time.monotonic()
    bell.sleep(seen, 60.0)  # woken by the other process long before the timeout
    assert time.monotonic() - started < 30
    ringer.join(30)
    assert bell.value == (seen + 1) & 0xFFFFFFFF
    started = time.monotonic()
    bell.sleep(seen, 60.0)  # the word moved since it was read: a ring that came first is not missed
    assert time.monotonic() - started < 30
    bell.close()


JOB = """
[data]
path = "{data}"
[model]
kind = "mlp"
hidden = {hidden}
[train]
epochs = {epochs}
batch_size = 200
tasks_per_update = 3
optimizer = "adam"
lr = 0.01
seed = 5
{workers}
[run]
dir = "run"
keep_versions = 2
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1500, features=8, classes=3, seed=4)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=300)


def train(folder: Path, data: Path, workers: str, *, hidden: str = "[16]", epochs: int = 2) -> Path:
    folder.mkdir(parents=True)
    (folder / "job.toml").write_text(JOB.format(data=data, hidden=hidden, epochs=epochs, workers=workers))
    assert main(["train", str(folder / "job.toml")]) == 0
    return folder / "run"


def digest(run: Path) -> str:
    return hashlib.sha256(np.load(weights_path(run, weight_versions(run)[-1])).tobytes()).hexdigest()


def events(run: Path) -> str:
    return (run / "events.log").read_text()


def test_the_server_running_the_rounds_itself_gives_the_bits_of_worker_processes(tmp_path: Path,
                                                                                 dataset: Path) -> None:
    server = train(tmp_path / "server", dataset, "workers = 0")
    workers = train(tmp_path / "workers", dataset, "workers = 2")
    assert "rounds: in the server (train.workers = 0)" in events(server)
    assert "workers started" not in events(server)
    assert "rounds: on 2 worker processes (train.workers = 2)" in events(workers)
    assert digest(server) == digest(workers)
    for name in ("lineage.jsonl", "metrics.jsonl"):  # the same versions, checksums, losses
        strip = re.compile(r'"(time|compute_s|samples_per_s)": [0-9.e+-]+')
        assert strip.sub("", (server / name).read_text()) == strip.sub("", (workers / name).read_text())


def test_the_server_alone_publishes_a_stretchs_newest_versions_at_its_end_not_a_file_per_update(
        tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """No other process maps the versions of the server's own rounds: each update's digest goes into the lineage,
    and only the newest keep_versions (2) of each stretch (an epoch here) become files, at its end; the run
    leaves the files, bits and records that worker processes, which publish every version, leave."""
    published: list[int] = []
    commit = rounds.commit_weights

    def counted(tmp: Path, run_dir: Path, version: int) -> None:
        published.append(version)
        commit(tmp, run_dir, version)

    monkeypatch.setattr(rounds, "commit_weights", counted)
    server = train(tmp_path / "server", dataset, "workers = 0", epochs=3)
    per_epoch = 7  # 1,350 train rows in batches of 200
    assert published == [per_epoch - 1, per_epoch, 2 * per_epoch - 1, 2 * per_epoch, 3 * per_epoch - 1, 3 * per_epoch]
    published.clear()
    workers = train(tmp_path / "workers", dataset, "workers = 2", epochs=3)
    assert published == []  # the workers publish: every version, in their own processes
    assert weight_versions(server) == weight_versions(workers) == [3 * per_epoch - 1, 3 * per_epoch]
    for version in weight_versions(server):
        assert weights_path(server, version).read_bytes() == weights_path(workers, version).read_bytes()
    lineage = [json.loads(line) for line in (server / "lineage.jsonl").read_text().splitlines()]
    assert [record["version"] for record in lineage] == list(range(3 * per_epoch + 1))  # every version's digest
    assert lineage == [json.loads(line) for line in (workers / "lineage.jsonl").read_text().splitlines()]
    capsys.readouterr()
    assert main(["inspect", str(server), "--verify"]) == 0, capsys.readouterr().out
    assert not [name for name in os.listdir(server / "weights") if name.startswith(".")]  # no ring file left


def test_the_server_alone_keeps_its_ring_file_across_stretches_unless_its_name_no_longer_holds_it(
        tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring has keep_versions + 1 files; a stretch publishes its newest keep_versions, and the file left is
    stepped into again by the next stretch without being readied anew (no folder listing, header check or new
    map). A file that is no longer the one at its name (here a copy renamed over it) is readied again."""
    readied: list[Path] = []
    ready = mapped.ready_building

    def counted(*args: object, **kwargs: object) -> Path:
        readied.append(kwargs["path"])  # type: ignore[arg-type]
        return ready(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mapped, "ready_building", counted)
    kept = train(tmp_path / "kept", dataset, "workers = 0", epochs=3)
    assert len(readied) == 3 + 2 + 2  # the first stretch readies the whole ring, later ones the keep_versions gone
    readied.clear()
    publish_ring = rounds.Participant.publish_ring

    def swapped(self: rounds.Participant) -> None:
        publish_ring(self)
        for name in os.listdir(self.files.run_dir / "weights"):
            if name.startswith(".p"):  # the ring's file left: a copy takes its name
                path = self.files.run_dir / "weights" / name
                shutil.copyfile(path, path.with_name(name + "-copy"))
                os.replace(path.with_name(name + "-copy"), path)

    monkeypatch.setattr(rounds.Participant, "publish_ring", swapped)
    copied = train(tmp_path / "copied", dataset, "workers = 0", epochs=3)
    assert len(readied) == 3 + 3 + 3
    assert digest(copied) == digest(kept)
    assert (copied / "lineage.jsonl").read_text() == (kept / "lineage.jsonl").read_text()


def test_the_server_alone_lists_its_versions_once_per_stretch_and_leaves_only_the_newest(
        tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stretch readies keep_versions ring files (3 in the first, the whole ring); only the first lists weights/ to
    retire the versions older than the newest kept, the later ones retire from where it left. The run leaves
    exactly the newest keep_versions versions, as worker processes do."""
    listings: list[Path] = []
    readying: list[bool] = []
    listing, ready = weights_module.weight_versions, mapped.ready_building

    def counted(run_dir: Path) -> list[int]:
        if readying:  # a ring file readied (an evaluation retires the versions it no longer needs, listing too)
            listings.append(run_dir)
        return listing(run_dir)

    def readied(*args: object, **kwargs: object) -> Path:
        readying.append(True)
        try:
            return ready(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            readying.pop()

    monkeypatch.setattr(weights_module, "weight_versions", counted)
    monkeypatch.setattr(mapped, "ready_building", readied)
    server = train(tmp_path / "server", dataset, "workers = 0", epochs=3)
    assert len(listings) == 3  # one per stretch (an epoch here); 7 before: one per file readied
    monkeypatch.undo()
    workers = train(tmp_path / "workers", dataset, "workers = 2", epochs=3)
    assert weight_versions(server) == weight_versions(workers) == [20, 21]  # 7 updates per epoch


def test_the_server_alone_meets_nobody_it_writes_no_marks_and_waits_for_none(
        tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone participant's marks and waits would only read back its own mark: the server alone skips them (its
    activity words and the ledger stay), and still gives the bits of worker processes, which meet."""
    met: list[str] = []

    def noted(name: str) -> Callable[..., object]:
        method = getattr(Board, name)

        def call(self: Board, *args: object, **kwargs: object) -> object:
            met.append(name)
            return method(self, *args, **kwargs)
        return call

    for name in ("mark_step", "mark_gradients", "mark_ready", "wait_step", "wait_gradients", "wait_both"):
        monkeypatch.setattr(Board, name, noted(name))
    server = train(tmp_path / "server", dataset, "workers = 0")
    assert met == []
    workers = train(tmp_path / "workers", dataset, "workers = 2")
    assert digest(server) == digest(workers)


def test_auto_keeps_a_tiny_model_in_the_server_and_says_why(tmp_path: Path, dataset: Path) -> None:
    run = train(tmp_path / "auto", dataset, "")  # train.workers defaults to "auto"
    log = events(run)
    if CORES < 2:
        assert 'rounds: in the server (train.workers = "auto": 1 core(s)' in log
    else:
        found = re.search(r"rounds: in the server from update (\d+): an update takes ([\d.]+) ms in the server, "
                          r"([\d.]+) ms of it computing; 2 workers could save at most ([\d.]+) (ms of it|s over the "
                          r"(\d+) updates left)(, no more than the ([\d.]+) ms an update spends outside)?", log)
        assert found, log
        assert int(found.group(1)) == 2 * (PROBE_UPDATES + 1)  # timed on one thread, then on the task threads
        saved = float(found.group(4))
        limit = MIN_GAIN_S * 1e3 if found.group(5) == "ms of it" else SPAWN_COST_S * 2
        if found.group(7):  # the saving no more than the overhead measured where the rounds run (placement.py)
            limit = float(found.group(8))
        assert saved <= limit * 1.01, (saved, limit)  # the log rounds (2 decimals, 3 digits): 0.149 prints as 0.15
    assert "workers started" not in log
    assert digest(run) == digest(train(tmp_path / "two", dataset, "workers = 2"))


@pytest.mark.skipif(CORES < 2, reason="with one core there is nothing to compare: covered by the test above")
def test_auto_times_workers_against_the_server_and_keeps_the_faster(tmp_path: Path, dataset: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Whether workers are worth trying at all (the spawn cost against the updates left) is the test above's;
    # here they must be tried: a lower spawn cost lets a 140-update job try them on a fast machine too, still
    # long enough for them to start and be timed (a few ms of compute per update; at load 6 on 2 cores they
    # were timed and the choice made by update 42).
    monkeypatch.setattr(placement, "SPAWN_COST_S", 0.05)
    monkeypatch.setattr(placement, "OVERHEAD_RATIO", 0.0)  # nor the overhead a loaded machine's probe measures
    big = "[1024, 512]"
    run = train(tmp_path / "auto", dataset, "", hidden=big, epochs=20)
    log = events(run)
    assert re.search(r"rounds: an update takes [\d.]+ ms in the server, [\d.]+ ms of it computing; starting 2 "
                     r"workers to compare", log), log
    assert "workers started: pids" in log
    decided = re.search(r"rounds: (on 2 workers|in the server) from update (\d+): ([\d.]+) ms per update on 2 "
                        r"workers, ([\d.]+) ms in the server", log)
    assert decided, log
    faster = "on 2 workers" if float(decided.group(3)) < float(decided.group(4)) else "in the server"
    assert decided.group(1) == faster
    assert ("workers stopped" in log) == (faster == "in the server")
    assert digest(run) == digest(train(tmp_path / "server", dataset, "workers = 0", hidden=big, epochs=20))


# --- what a participant keeps between updates ---


def test_rows_are_kept_within_the_budget_and_only_copies_count(tmp_path: Path) -> None:
    x, _ = blobs(n=40, features=4, classes=2)
    publish_array(tmp_path / "x.npy", x.astype(np.float32), durable=False)
    mapped = open_npy(tmp_path / "x.npy", shape=(40, 4), dtype=np.float32)
    reads: list[tuple[int, int]] = []

    def copies(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:  # as normalized rows are
        reads.append((lo, hi))
        return np.array(mapped[lo:hi]), np.arange(lo, hi)

    cache = RowCache(budget=2 * (10 * 4 * 4 + 10 * 8))  # room for the copies of two tasks of 10 rows
    for lo in (0, 10, 20, 0, 10, 20):
        got_x, got_y = cache.get(lo, lo + 10, copies)
        assert np.array_equal(got_x, mapped[lo:lo + 10]) and np.array_equal(got_y, np.arange(lo, lo + 10))
    assert reads == [(0, 10), (10, 20), (20, 30), (20, 30)]  # the third task did not fit: read each time
    assert cache.used == cache.budget
    kept_x, kept_y = cache.get(0, 10, copies)
    assert not kept_x.flags.writeable and not kept_y.flags.writeable  # shared by every later epoch

    views = RowCache(budget=0)  # views of a file map take no memory: always kept
    first = views.get(0, 40, lambda lo, hi: (mapped[lo:hi], mapped[lo:hi, 0]))
    assert views.get(0, 40, copies) is first and views.used == 0
    assert _private_bytes(np.ones((4, 4)).reshape(16)[:4]) == 128  # a view of a copy holds the whole copy


def test_a_map_is_reused_by_inode_and_a_read_map_of_a_written_file_is_a_view_of_its_map(tmp_path: Path) -> None:
    path = tmp_path / "v.npy"
    publish_array(path, np.zeros(8, np.float32), durable=False)
    maps = MapCache()
    written = maps.get(path, (8,), np.float32, "r+")
    assert maps.get(path, (8,), np.float32, "r+") is written
    os.rename(path, tmp_path / "w.npy")  # a new name for the same inode (a version published): the same map
    assert maps.get(tmp_path / "w.npy", (8,), np.float32, "r+") is written
    read = maps.get(tmp_path / "w.npy", (8,), np.float32, "r")
    written[:] = 7
    assert np.shares_memory(read, written) and (read == 7).all() and not read.flags.writeable
    publish_array(path, np.ones(8, np.float32), durable=False)  # another file under an old name: a new map
    fresh = maps.get(path, (8,), np.float32, "r+")
    assert fresh is not written and (fresh == 1).all()
