"""`memtrain bench rl` on tiny budgets: every side runs, the figures come from the runs (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult
from table_widths import assert_fits_or_whole

from memtrain.benchmarks.rl_bench import COLUMNS, LABELS, SIDES, ZOO, Follow, Progress, parse_sides, print_table
from memtrain.errors import InputError

pytest.importorskip("gymnasium")
pytestmark = pytest.mark.timeout(300)


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="250")
    return subprocess.run([sys.executable, "-m", "memtrain", "bench", "rl", "--dir", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=280, env=env)


def test_every_side_runs_and_none_reaches_475_in_a_budget_too_small_for_it(
        tmp_path: Path, cli: Callable[..., CliResult], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """100 episodes averaging 475 need 47,500 steps: with 256 (one update, the least --env-steps takes) no side can
    reach it, and every one says so."""
    pytest.importorskip("stable_baselines3")
    # a short temp dir of its own: SubprocVecEnv's forkserver puts a socket there (AF_UNIX paths are <= 107 bytes)
    temp = Path(tempfile.mkdtemp(prefix="mt-"))
    try:
        monkeypatch.setenv("TMPDIR", str(temp))  # the sides' processes' temp dir
        result = cli("bench", "rl", "--dir", tmp_path, "--env-steps", "256", "--repeats", "1", "--json")
        leaked = [name for name in os.listdir(temp) if name.startswith("SB3-")]
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert result.code == 0, result.err
    report = json.loads(result.out)
    # SB3's default logger made an empty SB3-<time> folder in the temp dir on every run (torch's own compile
    # cache, torchinductor_<user>, is torch's to keep)
    assert leaked == []
    rows = report["results"]
    assert [r["side"] for r in rows] == list(SIDES)
    for row in rows:
        assert row["reached"] == 0 and row["seconds_to_target"] is None and row["faster_peer_time_ratio"] is None
        assert row["env_steps_per_s"]["median"] > 0 and row["runs"] == 1 and row["seeds"] == [1]
    sb3 = next(r for r in rows if r["side"] == "sb3_subproc")
    assert sb3["vs_sb3_subproc"]["median"] == pytest.approx(1.0)
    assert report["bits"] == [True]  # 2 workers end on the bits of 0 workers
    assert report["exchange"]["steps"] == 128 and 0 < report["exchange"]["share"]["median"] < 1
    assert report["settings"]["hyperparameters"]["source"].startswith("rl-baselines3-zoo")
    assert any("no figure" in line for line in report["targets"])  # nothing made up for an unreached target
    assert os.listdir(tmp_path) == []  # the runs' files are removed
    assert_fits_or_whole(print_table, report, COLUMNS, capsys, monkeypatch)
    table = _printed(report, capsys)  # at 250 columns: one row a side
    for row in rows:
        line = next(line for line in table.splitlines() if line.startswith(LABELS[row["side"]]))
        assert line.count("not reached") == 2 and "0/1" in line


def _printed(report: dict, capsys: pytest.CaptureFixture[str]) -> str:
    print_table(report)
    return capsys.readouterr().out


def test_a_target_reached_is_timed_per_seed_and_compared_with_the_faster_peer(
        tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    """A target every side reaches once 100 episodes have ended (at most 100 x 500 steps: inside the budget): steps
    and seconds to it, per seed."""
    result = cli("bench", "rl", "--dir", tmp_path, "--sides", "memtrain_2,memtrain_0,cleanrl", "--env-steps",
                 "51200", "--target", "9", "--repeats", "2", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    for row in report["results"]:
        assert row["reached"] == 2 == len(row["seconds_to_target"]["runs"]), row
        steps = row["env_steps_to_target"]["runs"]
        assert all(s % 256 == 0 and 100 * 8 <= s < 51200 for s in steps), steps  # checked after each update
    memtrain = {r["side"]: r for r in report["results"]}
    assert memtrain["memtrain_2"]["env_steps_to_target"] == memtrain["memtrain_0"]["env_steps_to_target"]
    assert len(memtrain["memtrain_2"]["faster_peer_time_ratio"]["runs"]) == 2
    assert report["bits"] == [True, True]
    assert [line.split(":")[0] for line in report["targets"]] == [
        "faster peer's time to target / memtrain's", "env steps/s, memtrain / SB3 SubprocVecEnv"]


def test_memtrains_side_is_memtrain_train_on_the_tuned_set_stopped_at_the_target(tmp_path: Path) -> None:
    """memtrain's side runs `memtrain train` on a job file holding the tuned set, and stops it by SIGTERM (a
    checkpoint, the run's records) once the stop rule holds; its digest is the lineage's record of the version
    learned from the target version's shards."""
    from memtrain.files import read_sealed_jsonl
    from memtrain.rl.config import load_rl_job

    spec = {"side": "memtrain_0", "seed": 2, "dir": str(tmp_path / "side"), "env": "CartPole-v1", "envs": 2,
            "steps": 128, "env_steps": 51200, "target": 9.0, "window": 100}
    done = subprocess.run([sys.executable, "-m", "memtrain.benchmarks.rl_bench", json.dumps(spec)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    reached = result["reached_steps"]
    assert reached is not None and reached == result["env_steps"] and reached % 256 == 0 and reached < 51200
    run = tmp_path / "side" / "run"
    job = load_rl_job(tmp_path / "side" / "job.toml")
    assert (job.env.id, job.env.slots, job.env.steps, job.rl.env_steps, job.train.seed) == \
        ("CartPole-v1", 2, 128, 51200, 2)
    assert (job.rl.gamma, job.rl.gae_lambda, job.rl.clip, job.rl.epochs, job.rl.max_grad_norm, job.rl.eval_every,
            job.train.optimizer.lr, job.train.optimizer.eps) == (ZOO["gamma"], ZOO["gae_lambda"], ZOO["clip"],
                                                                ZOO["n_epochs"], ZOO["max_grad_norm"], 0, ZOO["lr"],
                                                                ZOO["adam_eps"])
    assert job.rl.anneal_lr and job.rl.anneal_clip
    assert "stopped by SIGTERM" in (run / "events.log").read_text()  # memtrain train's own stop
    lineage, damaged = read_sealed_jsonl(run / "lineage.jsonl", what="lineage record")
    assert not damaged
    assert result["digest"] == next(r["checksum"] for r in lineage if r["version"] == reached // 256)
    assert "memtrain train: stopped by SIGTERM" in done.stderr and "Traceback" not in done.stderr


def test_a_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "stable_baselines3" else real(name, *a))
    with pytest.raises(InputError, match=r"needs stable_baselines3.*memtrain\[bench-rl\]"):
        parse_sides(None)
    assert parse_sides("memtrain_0,cleanrl") == ["memtrain_0", "cleanrl"]  # sides without SB3 still run
    with pytest.raises(InputError, match="unknown --sides"):
        parse_sides("memtrain_0,rllib")


def test_bad_options_are_clear_errors_before_any_run(tmp_path: Path) -> None:
    for args, message in ((("--envs", "3"), "--envs must divide the tuned set's samples per update (expected a "
                                            "divisor of 256"),
                          (("--env-steps", "100"), "--env-steps is less than one update's samples"),
                          (("--sides", "memtrain_0,rllib"), "unknown --sides for bench rl")):
        result = bench(tmp_path, *args)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result
    assert os.listdir(tmp_path) == []


def test_the_follower_reads_every_line_the_run_wrote_before_it_ended(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The run ends (``join``) right after its last lines are written: the follower still applies the rule to
    them, so the digest compared between 0 and 2 workers is the last version's on both sides (a follower that
    stopped at ``join`` without a last read compared whichever version each side happened to have read)."""
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setattr(Follow, "POLL", 60.0)  # the follower's first look finds no file, then it waits: the run ends
    follow = Follow(metrics, Progress(target=475.0, window=100, started=0.0, returns=[]), last=3)
    time.sleep(0.3)
    metrics.write_text("".join(json.dumps({"version": v, "env_steps_total": 256 * (v + 1), "episode_returns": [9.0]})
                               + "\n" for v in range(4)))
    follow.join()
    assert follow.line is not None and follow.line["version"] == 3
    assert not follow.stopped and follow.progress.returns == [9.0] * 4
