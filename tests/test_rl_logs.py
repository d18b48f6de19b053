"""The metric logs of a reinforcement-learning run, written by the supervised runs' code
(memtrain/train/server/monitor.py ``metric_logs``): ``metrics.csv`` and TensorBoard per version, through a
resume; ``memtrain inspect RUN --plot``; and A3C's versions carrying the learner's statistics. End to end through
the CLI."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from memtrain.cli import main
from memtrain.files import read_jsonl
from memtrain.layout import RUN_METRICS
from memtrain.rl.metrics import LOG_COLUMNS

pytest.importorskip("gymnasium")
pytestmark = pytest.mark.timeout(300)

JOB = """[env]
id = "CartPole-v1"
slots = 2
steps = 32
[model]
kind = "mlp"
hidden = [8]
[train]
algorithm = "ppo"
env_steps = 512
epochs = 2
minibatches = 2
seed = 5
workers = 0
eval_every = 3
eval_episodes = 2
[run]
dir = "run"
checkpoint_every = 3
log_to = ["csv", "tensorboard"]
"""
VERSIONS = 512 // 64
WATCHED = ("return_mean", "length_mean", "value_loss", "policy_loss", "entropy", "approx_kl", "clip_fraction",
           "explained_variance", "env_steps_per_s")


def _versions(run: Path) -> list[dict]:
    return [r for r in read_jsonl(run / RUN_METRICS) if r.get("kind") == "version"]


def test_csv_and_tensorboard_follow_an_rl_run_through_a_resume_and_inspect_plots_it(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "job.toml").write_text(JOB)
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "job.toml"), "-q"]) == 0
    # the newest checkpoints go, as if the run had died after version 3's: the resume repeats versions 3 to 7
    for name in ("c00000006", "c00000008"):
        shutil.rmtree(run / "checkpoints" / name)
    assert main(["train", "--resume", str(run), "-q"]) == 0
    capsys.readouterr()
    lines = _versions(run)
    assert [r["version"] for r in lines] == list(range(VERSIONS))
    with open(run / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(LOG_COLUMNS) and [int(r["version"]) for r in rows] == list(range(VERSIONS))
    for row, line in zip(rows, lines, strict=True):
        for key in LOG_COLUMNS:
            assert row[key] == ("" if line.get(key) is None else str(line[key])), (key, row, line)
    assert rows[2]["eval_return_mean"] != "" and rows[1]["eval_return_mean"] == ""  # every 3 versions
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert set(WATCHED) | {"return_last100_mean", "eval_return_mean"} <= set(events.Tags()["scalars"])
    for key in WATCHED:
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == [r["version"] + 1 for r in lines if r[key] is not None], key
        assert [s.value for s in scalars] == pytest.approx([r[key] for r in lines if r[key] is not None], rel=1e-6)
    assert main(["inspect", str(run), "--plot", str(tmp_path / "returns.png"), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["versions"] == VERSIONS and {"return_mean", "eval_return_mean"} <= set(view["curves"])
    assert (tmp_path / "returns.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["inspect", str(run), "--plot", str(tmp_path / "returns.svg")]) == 0
    assert f"({VERSIONS} versions)" in capsys.readouterr().out


def test_a3c_versions_carry_the_learner_statistics(tmp_path: Path, capsys) -> None:
    job = JOB.replace('algorithm = "ppo"', 'algorithm = "a2c"\nmode = "async"').replace("workers = 0", "workers = 2")
    (tmp_path / "job.toml").write_text(job.replace('log_to = ["csv", "tensorboard"]', 'log_to = ["csv"]'))
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "job.toml"), "-q"]) == 0
    capsys.readouterr()
    lines = _versions(run)
    assert len(lines) == VERSIONS * 2  # a version is one shard in async mode
    for line in lines:
        for key in ("value_loss", "policy_loss", "entropy", "explained_variance", "env_steps_per_s"):
            assert isinstance(line[key], float), (key, line)
        assert line["approx_kl"] == 0.0 and line["clip_fraction"] == 0.0  # A2C's step at the version it collected
        assert line["entropy"] > 0
    with open(run / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(LOG_COLUMNS)
    assert [float(r["value_loss"]) for r in rows] == [r["value_loss"] for r in lines]
