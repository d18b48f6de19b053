"""Random chaos (slow, kept out of CI): many runs, each with a random process killed at a random moment.

Run with ``python -m pytest -m slow tests/test_chaos.py`` (``MEMTRAIN_CHAOS_KILLS=N`` changes the number of
kills, 50 by default; a run that ended before its kill does not count). In each run the server or one of its
workers, chosen at random, is SIGKILLed at a
random moment from start-up (imports, the room check, the run directory's creation) to the last epoch; a run
whose server died is resumed. Every run must end with weights identical to a fault-free run, with no
process of it left (the processes of a run are found by a tag in their environment, so a worker that
was never logged is found too), and with no file left behind: no temporary name or exchange area in the
run directory, nothing of its servers in /dev/shm (exchange areas), and nothing in its
private TMPDIR.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_faults import TESTS, data, digest, leftovers, memtrain, write_job

KILLS = int(os.environ.get("MEMTRAIN_CHAOS_KILLS", "50"))
SHM = Path("/dev/shm")
__all__ = ["data"]


def tagged(tag: str) -> list[tuple[int, bytes]]:
    """(pid, command line) of every live process whose environment carries ``tag``."""
    found = []
    needle = f"MEMTRAIN_CHAOS_TAG={tag}\0".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if needle in Path(f"/proc/{entry}/environ").read_bytes():
                stat = Path(f"/proc/{entry}/stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    found.append((int(entry), Path(f"/proc/{entry}/cmdline").read_bytes()))
        except OSError:
            continue
    return found


def wait_until_gone(tag: str, seconds: float) -> list[tuple[int, bytes]]:
    deadline = time.monotonic() + seconds
    while (alive := tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def run(*args: object, tag: str, tmpdir: Path, background: bool = False):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "MEMTRAIN_CHAOS_TAG": tag, "TMPDIR": str(tmpdir)}
    command = [sys.executable, "-m", "memtrain", *map(str, args)]
    if background:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def strays_in_shm(servers: list[int]) -> list[str]:
    """What the given server processes left in /dev/shm: exchange areas carry their pid."""
    if not SHM.is_dir():
        return []
    return [name for name in os.listdir(SHM) for pid in servers
            if name.endswith(f"-{pid}") and name.startswith("memtrain-x-")]


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_random_kills_always_end_identical(tmp_path: Path, data: Path) -> None:  # noqa: F811
    clean = write_job(tmp_path / "clean", data, epochs=3)
    assert memtrain("train", clean).returncode == 0
    expected = digest(tmp_path / "clean" / "run")
    chance = random.Random(int(os.environ.get("MEMTRAIN_CHAOS_SEED", "2026")))
    tally = {"server": 0, "worker": 0, "missed": 0}
    attempt = 0
    while tally["server"] + tally["worker"] < KILLS:
        attempt += 1
        assert attempt <= 2 * KILLS, f"too many runs ended before their kill: {tally}"
        folder, tag = tmp_path / f"chaos{attempt}", f"{os.getpid()}-{attempt}"
        tmpdir = folder / "tmpdir"
        tmpdir.mkdir(parents=True)
        job = write_job(folder, data, epochs=3)
        proc = run("train", job, tag=tag, tmpdir=tmpdir, background=True)
        time.sleep(chance.uniform(0.0, 3.0))
        candidates = [(pid, "server" if pid == proc.pid else "worker") for pid, cmdline in tagged(tag)
                      if b"resource_tracker" not in cmdline]
        victim, kind = chance.choice(candidates) if candidates else (proc.pid, "server")
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:  # it had finished already
            kind = "missed"
        tally[kind] += 1
        _, err = proc.communicate(timeout=300)
        servers = [proc.pid]
        run_dir = folder / "run"
        if proc.returncode != 0:
            assert proc.returncode == -9, f"run {attempt}: exit {proc.returncode}: {err}"
            assert wait_until_gone(tag, 10) == [], f"run {attempt}: processes outlived their server"
            resumed = run("train", job, "--resume", tag=tag, tmpdir=tmpdir, background=True)
            _, resumed_err = resumed.communicate(timeout=300)
            servers.append(resumed.pid)
            assert resumed.returncode == 0, f"run {attempt}: resume failed: {resumed_err}"
        assert digest(run_dir) == expected, f"run {attempt} (killed {kind} {victim}) differs"
        assert wait_until_gone(tag, 10) == [], f"run {attempt}: processes left after the run"
        assert leftovers(run_dir) == [], f"run {attempt}: leftovers in the run directory"
        assert strays_in_shm(servers) == [], f"run {attempt}: leftovers in /dev/shm"
        assert os.listdir(tmpdir) == [], f"run {attempt}: leftovers in TMPDIR"
    print(f"chaos: {attempt} runs; kills: {tally}")
