"""The best checkpoint of a reinforcement-learning run by its greedy evaluation return (``train.eval_every``):
kept by the supervised runs' keep rule (a best-only checkpoint off the schedule, pruned once another is better),
loaded by ``memtrain.load_model(run, which="best")``, the same bits for any worker count, carried through a resume.
End to end through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import memtrain
from memtrain.cli import main
from memtrain.errors import InputError
from memtrain.files import read_json, read_jsonl
from memtrain.layout import RUN_METRICS
from memtrain.rl.envs import EnvSpec
from memtrain.rl.metrics import evaluate

pytest.importorskip("gymnasium")
pytestmark = pytest.mark.timeout(300)

# a run whose greedy evaluation peaks before its end (version 14 of 20; checked below, not assumed)
JOB = """[env]
id = "CartPole-v1"
slots = 2
steps = 64
[model]
kind = "mlp"
hidden = [16]
[train]
algorithm = "ppo"
env_steps = 2560
epochs = 4
minibatches = 2
lr = 0.03
seed = 2
workers = 0
eval_every = 2
eval_episodes = 2
[run]
dir = "run"
checkpoint_every = 8
keep_checkpoints = 1
"""


def train(folder: Path, *args: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(JOB)
    assert main(["train", str(folder / "job.toml"), "-q", *args]) == 0
    return folder / "run"


def evaluations(run: Path) -> list[tuple[int, float]]:
    return [(r["eval_version"], r["eval_return_mean"]) for r in read_jsonl(run / RUN_METRICS) if "eval_version" in r]


def checkpoints(run: Path) -> list[int]:
    return sorted(int(name[1:]) for name in (p.name for p in (run / "checkpoints").iterdir()) if name[0] == "c")


def test_the_best_evaluations_checkpoint_is_kept_and_loaded_the_same_for_any_worker_count(tmp_path: Path,
                                                                                            capsys) -> None:
    run = train(tmp_path / "w0")
    capsys.readouterr()
    scores = evaluations(run)
    best_version, best_return = max(scores, key=lambda s: (s[1], -s[0]))  # the earliest of the highest
    assert best_version == 14 < 20 and best_version % 8  # off the checkpoint schedule, not the last version
    # the newest checkpoint and the best's; the earlier bests' best-only checkpoints and the older regular ones pruned
    assert checkpoints(run) == [best_version, 20]
    meta = read_json(run / "checkpoints" / f"c{best_version:08d}" / "meta.json", what="meta")
    assert meta["best_only"] is True and meta["best"] == {"version": best_version, "eval_return_mean": best_return}
    best = memtrain.load_model(run, which="best")
    last = memtrain.load_model(run)
    assert not np.array_equal(best.weights, last.weights)
    returns, _ = evaluate(lambda obs: best.policy.greedy(best.policy.forward(best.weights, obs)),
                          EnvSpec(id="CartPole-v1"), 2, 2, version=best_version)
    assert float(np.mean(returns)) == best_return  # the checkpoint is the evaluated version's policy
    again = memtrain.load_model(train(tmp_path / "w2", "--workers", "2"), which="best")
    assert again.weights.tobytes() == best.weights.tobytes()  # the same bits with 2 workers


def test_a_resume_carries_the_best_and_the_keep_rule_and_bad_requests_are_clear(tmp_path: Path, capsys) -> None:
    run = train(tmp_path / "a")
    best = memtrain.load_model(run, which="best").weights.tobytes()
    shutil.rmtree(run / "checkpoints" / "c00000020")  # as if the run died after its best-only checkpoint
    assert main(["train", "--resume", str(run), "-q"]) == 0  # resumed from c00000014, the best-only one
    capsys.readouterr()
    assert checkpoints(run) == [14, 20] and memtrain.load_model(run, which="best").weights.tobytes() == best
    unkept = train(tmp_path / "b", "--set", "run.keep_best=false")
    assert checkpoints(unkept) == [20]
    with pytest.raises(InputError, match=r"the checkpoint of the best evaluation \(version 14\) was pruned "
                                         r"\(run\.keep_best = false\)"):
        memtrain.load_model(unkept, which="best")
    never = train(tmp_path / "c", "--set", "train.eval_every=0")
    with pytest.raises(InputError, match=r"the run records no best evaluation .*train\.eval_every = 0"):
        memtrain.load_model(never, which="best")
    with pytest.raises(InputError, match="which= of a reinforcement-learning run"):
        memtrain.load_model(never, which="first")
    assert json.loads(json.dumps(evaluations(never))) == []
