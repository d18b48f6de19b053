"""Random chaos (slow, kept out of CI): many runs, each with a random process killed at a random moment.

Run with ``python -m pytest -m slow tests/test_chaos.py``. Every run must end identical to a fault-free
run, with no orphaned worker and no temporary file left behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from pathlib import Path

import pytest
from test_faults import data, digest, leftovers, memtrain, start, wait_gone, worker_pids, write_job  # noqa: F401

RUNS = int(os.environ.get("MEMTRAIN_CHAOS_RUNS", "30"))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_random_kills_always_end_identical(tmp_path: Path, data: Path) -> None:  # noqa: F811
    clean = write_job(tmp_path / "clean", data, epochs=3)
    assert memtrain("train", clean).returncode == 0
    expected = digest(tmp_path / "clean" / "run")
    chance = random.Random(2026)
    for attempt in range(RUNS):
        folder = tmp_path / f"chaos{attempt}"
        job = write_job(folder, data, epochs=3)
        proc = start("train", job)
        time.sleep(chance.uniform(0.3, 2.5))
        run = folder / "run"
        victims = [proc.pid] + (worker_pids(run) if (run / "events.log").exists() else [])
        victim = chance.choice(victims)
        with contextlib.suppress(ProcessLookupError):  # it may have finished already
            os.kill(victim, signal.SIGKILL)
        proc.communicate(timeout=300)
        if proc.returncode != 0:
            assert wait_gone(worker_pids(run), 5) == [], f"run {attempt}: orphaned workers"
            resumed = memtrain("train", job, "--resume")
            assert resumed.returncode == 0, resumed.stderr
        assert digest(run) == expected, f"run {attempt} (killed pid {victim}) differs"
        assert leftovers(run) == [], f"run {attempt}: leftovers"
