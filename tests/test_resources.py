"""Resources (issue 14, items 9-11): the exchange holds at most what the start-up room check reserved, whatever
fails; the room check covers every file the run will write (an additive model's statistics too) and refuses
up front with the figure; the orphan sweep knows every temporary name memtrain makes."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from test_faults import data, events, memtrain, write_job
from tiny_data import write_dataset

from memtrain.config import load_job
from memtrain.dataset import open_dataset
from memtrain.train.context import model_context
from memtrain.train.plan import Plan
from memtrain.train.server.room import room_needed
from memtrain.train.server.server import round_slots

pytestmark = pytest.mark.timeout(180)
__all__ = ["data"]
DEAD_PID = 999_999  # above the default pid_max: never a live process


def exchange_usage(run: Path, stop: threading.Event, peak: dict[str, int]) -> None:
    """Sample the run's exchange area until ``stop``: the most bytes and gradient files it ever held."""
    while not stop.is_set():
        for area in run.glob("memtrain-x-*"):
            try:
                names = os.listdir(area)
                sizes = {}
                for name in names:
                    info = os.stat(area / name)
                    sizes[info.st_ino] = info.st_blocks * 512  # hard links counted once
            except FileNotFoundError:
                continue
            peak["bytes"] = max(peak["bytes"], sum(sizes.values()))
            peak["gradients"] = max(peak["gradients"], sum(n.startswith("g-") for n in names))
        stop.wait(0.002)


def test_killed_participants_never_grow_the_exchange(tmp_path: Path, data: Path) -> None:  # noqa: F811
    """Every worker dies right after writing its 5th gradient, before it marks it: each death leaves a complete
    gradient of a round that is called off and run again. The exchange must never hold more than one gradient
    buffer per task (3), nor more bytes than the start-up check reserved."""
    job = write_job(tmp_path, data, epochs=1, model_extra="hidden = [2000]")
    job.write_text(job.read_text().replace('dir = "run"', 'dir = "run"\nexchange = "run"')
                   .replace("task_timeout", "max_attempts = 100\ntask_timeout"))
    resolved = load_job(job)
    dataset = open_dataset(resolved.data.path)
    plan = Plan(dataset.split("train").rows, resolved.train.batch_size, resolved.train.tasks_per_update,
                resolved.train.seed, resolved.train.epochs, shuffle=resolved.train.shuffle)
    reserved = room_needed(resolved, model_context(dataset, "mlp", {"hidden": (2000,)}, True),
                           per_epoch=plan.per_epoch, slots=round_slots(resolved)).exchange
    peak = {"bytes": 0, "gradients": 0}
    stop = threading.Event()
    sampler = threading.Thread(target=exchange_usage, args=(tmp_path / "run", stop, peak))
    sampler.start()
    try:
        result = memtrain("train", job, env={"MEMTRAIN_FAULT": "after_grad_write:5"})
    finally:
        stop.set()
        sampler.join()
    assert result.returncode == 0, result.stderr
    assert events(tmp_path / "run").count("died with exit code -9") >= 2
    assert peak["gradients"] <= 3, peak
    assert 0 < peak["bytes"] <= reserved, (peak, reserved)


def wide_dataset(folder: Path, features: int) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, features)).astype(np.float32)
    return write_dataset(folder / "wide", x, x[:, 0].copy(), task="regression", val_rows=2)


def test_an_additive_models_statistics_are_counted_and_refused_up_front(tmp_path: Path) -> None:
    """ridge on 150,000 features: every statistics task writes a 180 GB file (in the run directory, with their
    sum); refused before any worker starts."""
    data = wide_dataset(tmp_path, 150_000)
    job = write_job(tmp_path, data, kind="ridge", model_extra="", normalize="false")
    result = memtrain("train", job)
    assert result.returncode == 1, result.stderr
    assert "not enough free space for the run's weight versions and checkpoints" in result.stderr
    need = re.search(r"expected ([\d.]+) GiB free", result.stderr)
    assert need and float(need.group(1)) >= 0.99 * 4 * 150_000**2 * 8 / 2**30  # 3 tasks' partials and their sum
    assert "Traceback" not in result.stderr and "died" not in events(tmp_path / "run")


def test_the_run_directory_needs_room_for_every_version_and_checkpoint_it_keeps(tmp_path: Path,
                                                                               data: Path) -> None:  # noqa: F811
    job = write_job(tmp_path, data, model_extra="hidden = [1000000]")  # 40 MB per weight version
    # 10^4 checkpoints (the most a job may keep, config.MAX_KEPT) of weights and two Adam slots: 1.2 TB
    job.write_text(job.read_text().replace("keep_checkpoints = 10", "keep_checkpoints = 10000"))
    result = memtrain("train", job)
    assert result.returncode == 1, result.stderr
    assert "not enough free space for the run's weight versions and checkpoints" in result.stderr
    assert re.search(r"expected [\d.]+ GiB free, found [\d.]+ [KMG]iB free", result.stderr)


def test_a_probe_left_by_an_older_server_killed_during_start_up_is_swept(tmp_path: Path, data: Path) -> None:  # noqa: F811
    """Until issue 32 a server timed a 16 MiB probe file in /dev/shm and in the run directory to place the
    exchange area, and one killed while it measured left the probe behind. The next start removes a dead
    server's probes, and leaves a live server's and a file that merely looks like one."""
    job = write_job(tmp_path, data, epochs=1)
    run = tmp_path / "run"
    assert memtrain("train", job).returncode == 0
    sleeper = subprocess.Popen(["sleep", "30"])
    folders = [run] + ([Path("/dev/shm")] if os.access("/dev/shm", os.W_OK) else [])
    dead = [folder / f".memtrain-probe.tmp-{DEAD_PID}-0a1b2c3d" for folder in folders]
    kept = [run / f".memtrain-probe.tmp-{sleeper.pid}-0a1b2c3d", run / f".my-probe.tmp-{DEAD_PID}-0a1b2c3d"]
    try:
        for path in dead + kept:
            path.write_bytes(bytes(4096))
        resumed = memtrain("train", job, "--resume", "--set", "train.epochs=2")
        assert resumed.returncode == 0, resumed.stderr
        assert [p for p in dead if p.exists()] == []
        assert all(p.exists() for p in kept)
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in dead + kept:
            path.unlink(missing_ok=True)


def test_serve_sweeps_the_records_a_killed_service_was_writing(cli, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o755)
    for sub in ("running", "done", "failed"):
        (jobs / sub).mkdir(mode=0o755)
    orphans = [jobs / f".status.json.tmp-{DEAD_PID}-0a1b2c3d",
               jobs / "running" / f".a.state.json.tmp-{DEAD_PID}-deadbeef",
               jobs / "done" / f".a.result.json.tmp-{DEAD_PID}-00ff00ff"]
    kept = [jobs / ".notes.tmp-123-abc", jobs / f".status.json.tmp-{os.getpid()}-0a1b2c3d",  # not ours; alive
            jobs / "done" / f".mine.txt.tmp-{DEAD_PID}-0a1b2c3d"]  # not a record the service writes
    for path in orphans + kept:
        path.write_text("{")
    result = cli("serve", "--jobs", jobs, "--once")
    assert result.code == 0, result.err
    assert [p for p in orphans if p.exists()] == []
    assert all(p.exists() for p in kept)


def test_an_export_sweeps_what_a_killed_export_to_the_same_file_left(cli, tmp_path: Path) -> None:
    np.save(tmp_path / "weights.npy", np.arange(10, dtype=np.float32))
    out = tmp_path / "params.npz"
    orphan = tmp_path / f".params.npz.tmp-{DEAD_PID}-0a1b2c3d"
    other = tmp_path / f".other.npz.tmp-{DEAD_PID}-0a1b2c3d"
    for path in (orphan, other):
        path.write_bytes(b"partial")
    result = cli("inspect", tmp_path / "weights.npy", "--export", out)
    assert result.code == 0, result.err
    assert out.exists() and not orphan.exists() and other.exists()


def test_auto_puts_a_large_exchange_in_dev_shm(tmp_path: Path, data: Path) -> None:  # noqa: F811
    """The exchange's buffers are rewritten by every update and never need a disk: "auto" takes /dev/shm when
    it has room, whatever a first write would time on the run's filesystem (there, the kernel writes the
    pages back and the next update faults them again)."""
    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)):
        pytest.skip("no writable /dev/shm")
    job = write_job(tmp_path, data, epochs=1, model_extra="hidden = [200000]")  # an exchange of over 16 MiB
    result = memtrain("train", job)
    assert result.returncode == 0, result.stderr
    log = events(tmp_path / "run")
    assert "exchange area: /dev/shm/memtrain-x-" in log, log
