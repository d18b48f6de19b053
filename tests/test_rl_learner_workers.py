"""The update data-parallel across the workers (``train.learner = "workers"``, issue 40): each minibatch's gradient
is the fold in chunk order of ``train.learner_chunks`` row ranges' shares, so the server computing every chunk and
the workers computing them as tasks give the same bits, with 0, 1, 2 or 4 workers, and with a worker SIGKILLed
during a learner task (its task runs again). End to end through ``memtrain train`` in real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memtrain.cli import main
from memtrain.files import open_npy, read_jsonl, read_sealed_jsonl
from memtrain.layout import RUN_EVENTS, RUN_LINEAGE, RUN_METRICS, TRAJECTORIES_DIR, weights_path
from memtrain.rl.envs import EnvSpec
from memtrain.rl.ppo import PPOConfig
from memtrain.rl.reference import ReferenceConfig
from memtrain.rl.reference import train as reference_train

pytest.importorskip("gymnasium")
pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parent.parent
JOB = """[env]
id = "{env}"
slots = 4
steps = 32
[model]
kind = "mlp"
hidden = [16, 16]
[train]
algorithm = "{algorithm}"
env_steps = 640
epochs = 2
minibatches = 2
seed = 3
workers = 0
eval_every = 0
learner_chunks = 3
[run]
dir = "run"
"""


def write(folder: Path, env: str = "CartPole-v1", algorithm: str = "ppo") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(JOB.format(env=env, algorithm=algorithm))
    return folder / "job.toml"


def outcome(run: Path) -> tuple[bytes, list, list]:
    """The last version's weights, the lineage's checksums and the metrics lines without their clock."""
    lineage, damaged = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage")
    assert not damaged
    clock = ("seconds", "env_steps_per_s")
    metrics = [{k: v for k, v in line.items() if k not in clock} for line in read_jsonl(run / RUN_METRICS)]
    return (np.array(open_npy(weights_path(run, 5))).tobytes(), [r["checksum"] for r in lineage], metrics)


@pytest.mark.parametrize(("env", "algorithm"), [("CartPole-v1", "ppo"), ("Pendulum-v1", "a2c")])
def test_the_learner_on_the_workers_gives_the_servers_bits_for_any_worker_count(tmp_path: Path, env: str,
                                                                               algorithm: str, capsys) -> None:
    job = write(tmp_path, env, algorithm)
    runs = {}
    for learner, workers in (("server", 0), ("workers", 0), ("workers", 1), ("workers", 2), ("workers", 4),
                             ("server", 2)):
        name = f"{learner}-{workers}"
        assert main(["train", str(job), "-q", "--workers", str(workers), "--run-dir", str(tmp_path / name),
                     "--set", f"train.learner={learner}"]) == 0
        runs[name] = outcome(tmp_path / name)
        events = (tmp_path / name / RUN_EVENTS).read_text()
        assert f"learner: the {'workers' if learner == 'workers' and workers else 'server'} (3 chunks" in events
        assert not [n for n in os.listdir(tmp_path / name / TRAJECTORIES_DIR) if n[:2] in ("m-", "h-")]
    assert all(result == runs["server-0"] for result in runs.values())
    # and memtrain/rl/reference.py's single-process loop with the same chunks
    spec = EnvSpec(id=env)
    config = ReferenceConfig(spec, algorithm, env_steps=640, slots=4, steps=32, seed=3, hidden=(16, 16), lr=2.5e-4,
                             learner=PPOConfig(epochs=2, minibatches=2), learner_chunks=3)
    reference, _ = reference_train(config, tmp_path / "reference")
    assert reference.tobytes() == runs["server-0"][0]
    # the chunks are the job's: one chunk is another computation (the minibatch's gradient in one piece)
    assert main(["train", str(job), "-q", "--run-dir", str(tmp_path / "one"), "--set", "train.learner_chunks=1"]) == 0
    assert outcome(tmp_path / "one")[0] != runs["server-0"][0]


def test_a_torch_actor_critics_learner_on_the_workers_gives_the_servers_bits(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    text = JOB.format(env="CartPole-v1", algorithm="ppo").replace(
        'kind = "mlp"\nhidden = [16, 16]',
        f'kind = "torch"\nfactory = "rl_nets:make_actor_critic"\ncode_dir = "{ROOT / "jobs" / "examples"}"\n'
        'hidden = 16')
    assert 'kind = "torch"' in text
    (tmp_path / "job.toml").write_text(text)
    for learner, workers in (("server", 0), ("workers", 2)):
        assert main(["train", str(tmp_path / "job.toml"), "-q", "--workers", str(workers), "--run-dir",
                     str(tmp_path / learner), "--set", f"train.learner={learner}"]) == 0
    assert outcome(tmp_path / "workers") == outcome(tmp_path / "server")


def test_a_worker_killed_during_a_learner_task_has_it_run_again_with_the_same_bits(tmp_path: Path) -> None:
    job = write(tmp_path)
    assert main(["train", str(job), "-q", "--run-dir", str(tmp_path / "clean")]) == 0
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               "MEMTRAIN_FAULT": "rl_mid_share:7", "MEMTRAIN_FAULT_ONCE": str(tmp_path / "fired")}
    result = subprocess.run([sys.executable, "-m", "memtrain", "train", str(job), "-q", "--workers", "2",
                             "--run-dir", str(tmp_path / "killed"), "--set", "train.learner=workers"],
                            env=environ, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "fired").exists()
    events = (tmp_path / "killed" / RUN_EVENTS).read_text()
    assert "died with exit code -9 during learner task (optimizer step" in events
    assert outcome(tmp_path / "killed") == outcome(tmp_path / "clean")
    folder = tmp_path / "killed" / TRAJECTORIES_DIR
    assert not [name for name in os.listdir(folder) if name[:2] in ("m-", "h-")]  # every step's files removed
    # what a killed server's step left is removed when the run starts again
    (folder / "m-p00000003.npy").write_bytes(b"left")
    (folder / "h-p00000003-c00001-a000.npy").write_bytes(b"left")
    assert main(["train", "--resume", str(tmp_path / "killed"), "-q"]) == 0
    assert not [name for name in os.listdir(folder) if name[:2] in ("m-", "h-")]


def test_bad_learner_settings_are_clear_errors(tmp_path: Path, capsys) -> None:
    job = write(tmp_path)
    for setting, message in (("train.learner=gpu", "bad value for train.learner"),
                             ("train.learner_chunks=0", "train.learner_chunks out of range"),
                             ("train.staleness=1", "train.learner = 'workers' applies to train.mode = 'sync'")):
        extra = [] if setting.startswith("train.learner") else ["--set", "train.learner=workers"]
        assert main(["train", str(job), "-q", "--set", setting, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
@pytest.mark.parametrize("algorithm", ["ppo", "a2c"])
def test_the_chunks_shares_add_up_to_the_minibatchs_loss_and_gradient(kind: str, algorithm: str) -> None:
    from memtrain.rl.envs import CONTINUOUS, DISCRETE, Spaces
    from memtrain.rl.learner import Learner, fold_shares
    from memtrain.rl.policy import Policy
    from memtrain.rl.ppo import Batch, PPOConfig, a2c_loss, ppo_loss
    from memtrain.train.optim import OptimizerConfig

    spaces = {"categorical": Spaces(obs_dim=3, kind=DISCRETE, n=3),
              "gaussian": Spaces(obs_dim=3, kind=CONTINUOUS, n=2, low=(-1.0, -1.0), high=(1.0, 1.0))}[kind]
    policy, rng, rows = Policy(spaces, hidden=(6, 5)), np.random.default_rng(4), 23
    flat = policy.init(rng).astype(np.float64) + 0.3 * rng.standard_normal(policy.layout.size)
    obs = rng.standard_normal((rows, 3)).astype(np.float32)
    fwd = policy.forward(flat, obs)
    actions = policy.sample(fwd, rng)
    logp_old = (policy.log_prob(fwd, actions) + rng.uniform(-0.6, 0.6, rows)).astype(np.float32)
    data = Batch(obs, actions, logp_old, rng.standard_normal(rows).astype(np.float32), rng.standard_normal(rows),
                 rng.standard_normal(rows))
    config = PPOConfig(ent_coef=0.01)
    whole = (a2c_loss if algorithm == "a2c" else ppo_loss)(policy, flat, data, config)
    for chunks in (2, 3, 5, 40):  # 40 > rows: the empty ranges are left out
        learner = Learner(policy, OptimizerConfig(name="adam"), config, algorithm, 1, 10, chunks=chunks)
        shares = [learner.share(flat, data, chunk, config) for chunk in range(learner.chunk_count(rows))]
        assert len(shares) == min(chunks, rows)
        folded = fold_shares(shares)
        np.testing.assert_allclose(folded.grad, whole.grad, rtol=1e-10, atol=1e-12)
        for name in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
            assert getattr(folded, name) == pytest.approx(getattr(whole, name), rel=1e-10, abs=1e-12), name
