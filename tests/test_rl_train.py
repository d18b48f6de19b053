"""`memtrain train` of a reinforcement-learning job (memtrain/rl/server.py), end to end through the CLI: the same
weight bits for 0, 1, 2 and 4 collecting workers and as memtrain/rl/reference.py's single-process loop; the
run's records (lineage per version with each shard's version and checksum, metrics.jsonl, the summary) and
`memtrain inspect` of the run."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from memtrain.cli import main
from memtrain.files import open_npy, read_jsonl, read_sealed_jsonl
from memtrain.layout import RUN_LINEAGE, RUN_METRICS, weights_path
from memtrain.rl.envs import EnvSpec
from memtrain.rl.ppo import PPOConfig
from memtrain.rl.reference import ReferenceConfig
from memtrain.rl.reference import train as reference_train
from memtrain.train.messages import CollectTask

pytestmark = pytest.mark.timeout(300)

JOB = """[env]
id = "CartPole-v1"
slots = 4
steps = 32
[model]
kind = "mlp"
hidden = [16, 16]
[train]
algorithm = "ppo"
env_steps = 1280
epochs = 2
minibatches = 2
ent_coef = 0.01
seed = 3
workers = 0
eval_every = 5
eval_episodes = 2
[run]
dir = "run"
"""
VERSIONS = 1280 // (4 * 32)


def write_job(folder: Path, text: str = JOB) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.toml"
    path.write_text(text)
    return path


def final_weights(run: Path, version: int = VERSIONS) -> bytes:
    return np.array(open_npy(weights_path(run, version))).tobytes()


def test_the_same_bits_for_0_1_2_and_4_workers_and_the_reference_loop(tmp_path: Path, capsys) -> None:
    job = write_job(tmp_path)
    bits = {}
    for workers in (0, 1, 2, 4):
        run = tmp_path / f"w{workers}"
        assert main(["train", str(job), "--workers", str(workers), "--run-dir", str(run)]) == 0
        out = capsys.readouterr().out
        assert f"done: {VERSIONS} versions (1,280 env steps), weight version {VERSIONS}" in out
        bits[workers] = final_weights(run)
    assert len(set(bits.values())) == 1
    config = ReferenceConfig(EnvSpec(id="CartPole-v1"), env_steps=1280, slots=4, steps=32, seed=3, hidden=(16, 16),
                             lr=2.5e-4, adam_eps=1e-5,
                             learner=PPOConfig(epochs=2, minibatches=2, ent_coef=0.01))
    reference, _ = reference_train(config, tmp_path / "reference")
    assert reference.tobytes() == bits[0]


def test_the_records_say_what_each_version_was_learned_from(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", str(write_job(tmp_path)), "-q"]) == 0
    lineage, damaged = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage record")
    assert not damaged and [r["version"] for r in lineage] == list(range(VERSIONS + 1))
    for record in lineage[1:]:
        assert record["parent"] == record["version"] - 1
        assert [s["slot"] for s in record["shards"]] == [0, 1, 2, 3]
        assert all(s["version"] == record["parent"] and s["checksum"].startswith("xxh3-128:") for s in record["shards"])
        assert record["optimizer_steps"] == 2 * 2
    metrics = read_jsonl(run / RUN_METRICS)
    assert [m["version"] for m in metrics] == list(range(VERSIONS))
    for key in ("return_mean", "return_min", "return_max", "length_mean", "env_steps_per_s", "approx_kl",
                "clip_fraction", "entropy", "value_loss", "explained_variance"):
        assert key in metrics[-1], key
    assert [m.get("eval_version") for m in metrics if "eval_version" in m] == [5, 10]
    assert metrics[-1]["eval_return_mean"] > 0
    assert main(["inspect", str(run)]) == 0
    shown = capsys.readouterr().out
    assert "reinforcement learning" in shown and "CartPole-v1" in shown and f"{VERSIONS}/{VERSIONS}" in shown
    assert main(["inspect", str(run), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["kind"] == "rl-run" and len(view["versions"]) == VERSIONS
    assert view["versions"][-1]["shards"] == 4 and view["versions"][-1]["eval_return_mean"] is not None


def test_a_run_directory_in_use_or_full_is_refused_clearly(tmp_path: Path, capsys) -> None:
    job = write_job(tmp_path)
    assert main(["train", str(job), "-q"]) == 0
    capsys.readouterr()
    assert main(["train", str(job), "-q"]) == 2
    err = capsys.readouterr().err
    assert "already holds files" in err and "--resume" in err and "Traceback" not in err
    assert main(["train", str(job), "-q", "--overwrite"]) == 0


def test_a_collection_task_is_a_few_names_and_numbers() -> None:
    huge = 10**12
    task = CollectTask(task=huge, attempt=99, update=huge, version=huge, episode=huge, step=huge, state_key="f" * 32,
                       state_file="/run/" + "x" * 60 + "/episodes/e-s00001.npy")
    assert len(pickle.dumps(task)) < 400


def test_a_resume_with_settings_is_refused_until_it_takes_them(tmp_path: Path, capsys) -> None:
    job = write_job(tmp_path)
    assert main(["train", str(job), "-q"]) == 0
    for args in (["--resume", str(tmp_path / "run")], [str(job), "--resume"]):
        assert main(["train", *args, "--set", "train.lr=0.1"]) == 2
        err = capsys.readouterr().err
        assert "--set does not apply yet" in err and "Traceback" not in err


def test_inspect_lineage_names_the_shards_a_version_was_learned_from(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", str(write_job(tmp_path)), "-q"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(run), "--lineage", "3", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["kind"] == "rl-lineage" and view["parent"] == 2 and view["optimizer_steps"] == 4
    assert [(s["slot"], s["version"]) for s in view["shards"]] == [(0, 2), (1, 2), (2, 2), (3, 2)]
    assert main(["inspect", str(run), "--lineage", "3"]) == 0
    assert "4 optimizer steps from version 2" in capsys.readouterr().out
    assert main(["inspect", str(run), "--export", str(tmp_path / "x.npz")]) == 0  # tests/test_rl_export.py
    assert (tmp_path / "x.npz").is_file()


def test_inspect_verify_rehashes_an_rl_runs_records_and_names_a_changed_checkpoint_file(tmp_path: Path,
                                                                                       capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", str(write_job(tmp_path)), "-q"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(run), "--verify"]) == 0
    assert "every checksum matches" in capsys.readouterr().out
    checkpoint = run / "checkpoints" / f"c{VERSIONS:08d}"
    assert main(["inspect", str(checkpoint)]) == 0
    assert f"weight version: {VERSIONS}" in capsys.readouterr().out
    changed = checkpoint / "opt-m.npy"
    data = bytearray(changed.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(bytes(data))
    for target in (run, checkpoint, changed):
        assert main(["inspect", str(target), "--verify"]) == 1
        err = capsys.readouterr().err
        assert f"{changed}: checksum mismatch" in err and "Traceback" not in err


def test_a_supervised_run_imports_nothing_of_rl_s_engine(tmp_path: Path) -> None:
    """`memtrain train`, `inspect` and `predict` ask whether a job or run is RL (memtrain/rl/kind.py); only an RL
    one loads rl/server.py and what it pulls in (the learner, policies, environments: about 50 ms of start-up)."""
    import subprocess
    import sys

    from tiny_data import blobs, write_dataset

    x, y = blobs(n=64, features=4, classes=3)
    data = write_dataset(tmp_path / "ds", x, y)
    (tmp_path / "job.toml").write_text(f'[data]\npath = "{data}"\n[model]\nkind = "softmax"\n[train]\nepochs = 1\n'
                                       f'workers = 0\n[run]\ndir = "{tmp_path / "run"}"\n')
    script = ("import sys\nfrom memtrain.cli import main\n"
              f"code = main(['train', {str(tmp_path / 'job.toml')!r}, '--quiet'])\n"
              f"code = code or main(['inspect', {str(tmp_path / 'run')!r}])\n"
              "print(code, sorted(m for m in sys.modules if m.startswith('memtrain.rl.') or m == 'gymnasium'))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "0 ['memtrain.rl.kind']"
