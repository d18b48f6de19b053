"""Faults of `memtrain train` on a reinforcement-learning job (docs/faults.md, "Reinforcement learning"), with real
processes killed: a worker SIGKILLed half way through a collection task (its task runs again: the same bits); a
SIGTERM (a clean stop with a checkpoint, then a resume: the same bits); a server SIGKILL then `--resume` (the
slots' episodes re-simulated from the checkpoint's recorded actions, no pickle: the same bits and the same
lineage as the uninterrupted run); an environment that raises (retried: the same bits; always: the run stops
naming the version, slot, seed and step)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from memtrain.files import open_npy, read_jsonl, read_sealed_jsonl
from memtrain.layout import EPISODES_DIR, RUN_EVENTS, RUN_LINEAGE, RUN_METRICS, episode_state_name, weights_path
from memtrain.rl.collect import read_state
from memtrain.rl.envs import DISCRETE, Spaces
from memtrain.rl.server import checkpoint_dir, checkpoints

pytestmark = pytest.mark.timeout(300)
TESTS = Path(__file__).parent
ROOT = TESTS.parent

JOB = """[env]
{env}
slots = 4
steps = 24
[model]
kind = "mlp"
hidden = [16, 16]
[train]
algorithm = "ppo"
env_steps = {budget}
epochs = 2
minibatches = 2
seed = 5
workers = {workers}
eval_every = 4
eval_episodes = 2
[run]
dir = "run"
checkpoint_every = 3
"""
CARTPOLE = 'id = "CartPole-v1"'
FLAKY = 'factory = "flaky:make_env"'
FLAKY_ENV = '''import os
import time
from pathlib import Path

import gymnasium as gym


class Flaky(gym.Wrapper):
    """CartPole whose step raises (hangs, with FLAKY_HANG) at the FLAKY_AT-th step of episode 1 of every slot:
    once per marker file (FLAKY_ONCE), or always without one."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
        self.resets, self.steps = 0, 0

    def reset(self, **kwargs):
        self.resets, self.steps = self.resets + 1, 0
        return self.env.reset(**kwargs)

    def step(self, action):
        self.steps += 1
        at = int(os.environ.get("FLAKY_AT", "0"))
        if at and self.resets == 2 and self.steps == at:
            once = os.environ.get("FLAKY_ONCE")
            if not once:
                self.fail("the simulator lost its state")
            try:
                Path(once).touch(exist_ok=False)
            except FileExistsError:
                pass
            else:
                self.fail("the simulator lost its state (once)")
        return self.env.step(action)

    def fail(self, why):
        if os.environ.get("FLAKY_HANG"):
            time.sleep(3600)  # hung: only a bound on the task ends it
        raise RuntimeError(why)


def make_env():
    return Flaky()
'''


def job(folder: Path, *, workers: int = 0, budget: int = 1152, env: str = CARTPOLE, **files: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    path = folder / "job.toml"
    path.write_text(JOB.format(env=env, budget=budget, workers=workers))
    return path


def memtrain(*args: object, cwd: Path, wait: bool = True, **env: str) -> subprocess.CompletedProcess | subprocess.Popen:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               **env}
    command = [sys.executable, "-m", "memtrain", *map(str, args)]
    if not wait:
        return subprocess.Popen(command, cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(command, cwd=cwd, env=environ, capture_output=True, text=True, timeout=240)


def weights(run: Path, version: int) -> bytes:
    return np.array(open_npy(weights_path(run, version))).tobytes()


def lineage_checksums(run: Path) -> list[tuple[int, str, list[str]]]:
    records, damaged = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage record")
    assert not damaged
    return [(r["version"], r["checksum"], [s["checksum"] for s in r.get("shards", [])]) for r in records]


class Started:
    """``memtrain ARGS`` started in the background when the module starts (``hung_runs``), so that its wait (a
    hang bounded by train.task_timeout, all idle) passes while the module's other tests run. Its output goes to
    files in FOLDER, never to a pipe it could fill; ``seconds`` is how long it ran, start to exit."""

    def __init__(self, folder: Path, args: list[object], env: dict[str, str]):
        self.folder = folder
        self._out, self._err = folder / "stdout.txt", folder / "stderr.txt"
        environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   **env}
        started = time.monotonic()
        with self._out.open("w") as out, self._err.open("w") as err:
            self._proc = subprocess.Popen([sys.executable, "-m", "memtrain", *map(str, args)], cwd=folder,
                                          stdout=out, stderr=err, env=environ)
        self.seconds = float("inf")

        def timed() -> None:
            self._proc.wait()
            self.seconds = time.monotonic() - started
        self._waiter = threading.Thread(target=timed, daemon=True)
        self._waiter.start()

    def result(self, timeout: float = 240) -> subprocess.CompletedProcess:
        self._waiter.join(timeout)
        code = self._proc.wait(timeout=1)
        return subprocess.CompletedProcess(self._proc.args, code, self._out.read_text(), self._err.read_text())

    def stop(self) -> None:
        self._proc.kill()
        self._proc.wait()


def hung_in_the_server(folder: Path, *, once: bool) -> Started:
    """0 workers, train.task_timeout = 1: the flaky environment hangs at step 3 of episode 1 (``once``: in one
    attempt only)."""
    path = job(folder / "b", env=FLAKY, **{"flaky.py": FLAKY_ENV})
    path.write_text(path.read_text().replace("workers = 0", "workers = 0\ntask_timeout = 1"))
    env = {"FLAKY_AT": "3", "FLAKY_HANG": "1", **({"FLAKY_ONCE": str(folder / "once")} if once else {})}
    return Started(folder / "b", ["train", path, "-q"], env)


def hung_collection(folder: Path) -> Started:
    """1 worker, train.task_timeout = 2: the worker stops (SIGSTOP) half way through its 4th collection task."""
    path = job(folder, workers=1)
    path.write_text(path.read_text().replace("workers = 1", "workers = 1\ntask_timeout = 2"))
    return Started(folder, ["train", path, "-q"], {"MEMTRAIN_FAULT": "rl_mid_collect:4",
                                                   "MEMTRAIN_FAULT_ACTION": "stop",
                                                   "MEMTRAIN_FAULT_ONCE": str(folder / "fired")})


# The tests whose run waits out a task_timeout, by test name: their runs start with the module (hung_runs).
HUNG_RUNS = {
    "test_an_environment_hung_in_the_server_runs_again_after_task_timeout_with_the_same_bits":
        lambda folder: hung_in_the_server(folder, once=True),
    "test_an_environment_always_hung_in_the_server_stops_the_run_naming_version_slot_seed_episode_and_step":
        lambda folder: hung_in_the_server(folder, once=False),
    "test_a_hung_collection_task_has_its_worker_killed_and_runs_again": hung_collection,
}


@pytest.fixture(scope="module", autouse=True)
def hung_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Started]]:
    """The runs of HUNG_RUNS whose tests are selected, started in the background when the module starts: their
    waits for train.task_timeout pass while the module's other tests run. The tests wait for them."""
    selected = {item.name for item in request.session.items if item.path == request.path}
    runs = {name: start(tmp_path_factory.mktemp("hung")) for name, start in HUNG_RUNS.items() if name in selected}
    yield runs
    for run in runs.values():
        run.stop()


def hung_run(runs: dict[str, Started], request: pytest.FixtureRequest, tmp_path: Path) -> Started:
    """This test's run (started now if the module's fixture did not start it)."""
    if request.node.name not in runs:
        runs[request.node.name] = HUNG_RUNS[request.node.name](tmp_path)
    return runs[request.node.name]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run, 0 workers: 12 versions."""
    folder = tmp_path_factory.mktemp("clean")
    result = memtrain("train", job(folder), "-q", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder / "run"


def test_a_worker_killed_mid_collection_has_its_task_run_again_with_the_same_bits(tmp_path: Path, clean: Path) -> None:
    result = memtrain("train", job(tmp_path, workers=2), "-q", cwd=tmp_path, MEMTRAIN_FAULT="rl_mid_collect:5",
                      MEMTRAIN_FAULT_ONCE=str(tmp_path / "fired"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "fired").exists()
    events = (tmp_path / "run" / RUN_EVENTS).read_text()
    assert "died with exit code -9 during collection task (version" in events
    assert "workers that died and were replaced: 1" in result.stdout
    assert weights(tmp_path / "run", 12) == weights(clean, 12)
    assert lineage_checksums(tmp_path / "run") == lineage_checksums(clean)


def test_a_server_killed_then_resumed_continues_the_episodes_bit_for_bit(tmp_path: Path, clean: Path) -> None:
    killed = memtrain("train", job(tmp_path), "-q", cwd=tmp_path, MEMTRAIN_FAULT="rl_after_publish:5")
    assert killed.returncode == -signal.SIGKILL
    run = tmp_path / "run"
    # the newest before the kill: 4, written off the schedule as its evaluation is the best so far (run.keep_best);
    # version 5 is made again
    assert checkpoints(run) == [3, 4]
    spaces = Spaces(obs_dim=4, kind=DISCRETE, n=2)
    states = [read_state(checkpoint_dir(run, 4) / episode_state_name(slot), spaces, version=4, slot=slot)
              for slot in range(4)]
    assert any(state.step > 0 for state in states)  # episodes under way: the resume must re-simulate them
    resumed = memtrain("train", "--resume", run, "-q", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert weights(run, 12) == weights(clean, 12)
    assert lineage_checksums(run) == lineage_checksums(clean)
    metrics, uninterrupted = read_jsonl(run / RUN_METRICS), read_jsonl(clean / RUN_METRICS)
    assert [m["version"] for m in metrics] == list(range(12))
    for key in ("episode_returns", "return_last100_mean", "approx_kl", "eval_return_mean"):  # rebuilt on resume
        assert [m.get(key) for m in metrics] == [m.get(key) for m in uninterrupted], key
    assert "resumed at weight version 4" in (run / RUN_EVENTS).read_text()


VERSIONS = 40  # of the SIGTERM test's job


def test_sigterm_stops_cleanly_with_a_checkpoint_and_the_resume_gives_the_same_bits(tmp_path: Path) -> None:
    """The signal comes at version 5 or a little later; the run is long enough that it still runs then (a stop
    after its end fails the test, never passes it), and every version after it is trained twice: the resume and
    the run straight through."""
    folder = tmp_path / "a"
    path = job(folder, budget=96 * VERSIONS, workers=2)  # still running when the signal comes (at ~5-10)
    process = memtrain("train", path, "-q", cwd=folder, wait=False)
    metrics = folder / "run" / RUN_METRICS
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 5):
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM at weight version" in err and "memtrain train --resume" in err
    assert "Traceback" not in err
    run = folder / "run"
    stopped_at = int(err.split("stopped by SIGTERM at weight version ")[1].split(";")[0])
    assert 5 <= stopped_at < VERSIONS and checkpoints(run)[-1] == stopped_at
    # the rest, resumed on another worker count: the same bits as a run straight through with none
    resumed = memtrain("train", "--resume", run, "--workers", "1", "-q", cwd=folder)
    assert resumed.returncode == 0, resumed.stderr
    other = tmp_path / "b"
    straight = memtrain("train", job(other, budget=96 * VERSIONS), "-q", cwd=other)
    assert straight.returncode == 0, straight.stderr
    assert weights(run, VERSIONS) == weights(other / "run", VERSIONS)
    assert "collection: 1 worker process\n" in (run / RUN_EVENTS).read_text()
    assert not list((run / EPISODES_DIR).glob(".*"))  # nothing left under a temporary name


@pytest.fixture(scope="module")
def flaky_clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run on the flaky environment with no fault set, 0 workers: 12 versions."""
    folder = tmp_path_factory.mktemp("flaky-clean")
    result = memtrain("train", job(folder, env=FLAKY, **{"flaky.py": FLAKY_ENV}), "-q", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder / "run"


def test_an_environment_that_raises_once_is_retried_with_the_same_bits(tmp_path: Path, flaky_clean: Path) -> None:
    retried = memtrain("train", job(tmp_path / "b", env=FLAKY, workers=1, **{"flaky.py": FLAKY_ENV}), "-q",
                       cwd=tmp_path / "b", FLAKY_AT="3", FLAKY_ONCE=str(tmp_path / "once"))
    assert retried.returncode == 0, retried.stderr
    assert (tmp_path / "once").exists()  # it did raise
    assert weights(tmp_path / "b" / "run", 12) == weights(flaky_clean, 12)


@pytest.mark.parametrize("workers", [0, 1])
def test_an_environment_that_always_raises_stops_the_run_naming_version_slot_seed_and_step(
        tmp_path: Path, workers: int) -> None:
    path = job(tmp_path, env='factory = "flaky:make_env"', workers=workers, **{"flaky.py": FLAKY_ENV})
    result = memtrain("train", path, "-q", cwd=tmp_path, FLAKY_AT="3")
    assert result.returncode == 1, result.stderr
    err = result.stderr
    assert "collection task (version" in err and "the environment failed in step, at each of 3 attempts" in err
    for words in ("slot ", "seed 5", "episode 1", "step 2", "RuntimeError: the simulator lost its state",
                  "reproduce it with reset(seed=", "memtrain train --resume"):
        assert words in err, (words, err)
    assert "Traceback" not in err


def test_an_environment_hung_in_the_server_runs_again_after_task_timeout_with_the_same_bits(
        hung_runs: dict[str, Started], request: pytest.FixtureRequest, tmp_path: Path, flaky_clean: Path) -> None:
    """0 workers: the server's own collection task is bounded by train.task_timeout, as a worker's is. The run
    was started with the module (hung_runs)."""
    started = hung_run(hung_runs, request, tmp_path)
    hung = started.result()
    assert hung.returncode == 0, hung.stderr
    assert (started.folder.parent / "once").exists()  # it did hang
    assert weights(started.folder / "run", 12) == weights(flaky_clean, 12)


def test_an_environment_always_hung_in_the_server_stops_the_run_naming_version_slot_seed_episode_and_step(
        hung_runs: dict[str, Started], request: pytest.FixtureRequest, tmp_path: Path) -> None:
    started = hung_run(hung_runs, request, tmp_path)
    result = started.result()
    assert result.returncode == 1, result.stderr
    assert started.seconds < 60  # 3 attempts of 1 s, not the environment's hour
    err = result.stderr
    for words in ("collection task (version 0, slot ", "the environment failed in step, at each of 3 attempts",
                  "seed 5", "episode 1", "step 2", "Overtime: the collection task ran for longer than "
                  "train.task_timeout = 1 s in the server (0 workers)", "reproduce it with reset(seed=",
                  "memtrain train --resume"):
        assert words in err, (words, err)
    assert "Traceback" not in err


def test_a_hung_collection_task_has_its_worker_killed_and_runs_again(hung_runs: dict[str, Started],
                                                                     request: pytest.FixtureRequest, tmp_path: Path,
                                                                     clean: Path) -> None:
    started = hung_run(hung_runs, request, tmp_path)
    result = started.result()
    assert result.returncode == 0, result.stderr
    events = (started.folder / "run" / RUN_EVENTS).read_text()
    assert "silent for 2 s on collection task (version" in events
    assert weights(started.folder / "run", 12) == weights(clean, 12)


def test_a_damaged_checkpoint_is_skipped_on_resume_and_the_one_before_gives_the_same_bits(tmp_path: Path,
                                                                                          clean: Path) -> None:
    result = memtrain("train", job(tmp_path), "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "run"
    assert checkpoints(run) == [6, 9, 12]
    damaged = checkpoint_dir(run, 12) / "weights.npy"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 1
    damaged.write_bytes(bytes(data))
    resumed = memtrain("train", "--resume", run, "-q", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    events = (run / RUN_EVENTS).read_text()
    assert "checkpoint c00000012 skipped" in events and "checksum mismatch" in events
    assert "resumed at weight version 9" in events
    assert weights(run, 12) == weights(clean, 12)
    assert memtrain("inspect", "--verify", checkpoint_dir(run, 12), cwd=tmp_path).returncode == 0  # made again
    assert lineage_checksums(run) == lineage_checksums(clean)
