"""`memtrain train` runs each kind of RL job end to end through the CLI: A2C (the same bits as the reference loop),
the torch actor-critic (`[model] kind = "torch"`, the same bits with 0 and 2 workers), Pendulum's Gaussian
policy, and a user environment (`env.factory`), each from its example job in jobs/examples with a small budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memtrain.cli import main
from memtrain.files import open_npy, read_json, read_jsonl, read_sealed_jsonl
from memtrain.layout import RUN_LINEAGE, RUN_METRICS, RUN_PARAMS, weights_path
from memtrain.rl.envs import EnvSpec
from memtrain.rl.ppo import PPOConfig
from memtrain.rl.reference import ReferenceConfig
from memtrain.rl.reference import train as reference_train

pytestmark = pytest.mark.timeout(300)
EXAMPLES = Path(__file__).resolve().parent.parent / "jobs" / "examples"


def run(example: str, run_dir: Path, *settings: str, workers: int = 0) -> Path:
    args = ["train", str(EXAMPLES / f"{example}.toml"), "--run-dir", str(run_dir), "--workers", str(workers), "-q"]
    for setting in settings:
        args += ["--set", setting]
    assert main(args) == 0
    return run_dir


def weights(run_dir: Path, version: int) -> bytes:
    return np.array(open_npy(weights_path(run_dir, version))).tobytes()


def test_a2c_takes_one_step_per_version_and_equals_the_reference_loop(tmp_path: Path) -> None:
    text = (EXAMPLES / "cartpole-torch-a2c.toml").read_text()
    job = tmp_path / "a2c.toml"
    job.write_text(text.replace('kind = "torch"\nfactory = "rl_nets:make_actor_critic"\nhidden = 64',
                                'kind = "mlp"\nhidden = [32, 32]'))
    assert main(["train", str(job), "--run-dir", str(tmp_path / "run"), "--set", "train.env_steps=800", "-q",
                 "--set", "train.workers=1"]) == 0
    lineage, _ = read_sealed_jsonl(tmp_path / "run" / RUN_LINEAGE, what="lineage record")
    assert {r["optimizer_steps"] for r in lineage[1:]} == {1} and len(lineage) == 21
    config = ReferenceConfig(EnvSpec(id="CartPole-v1"), algorithm="a2c", env_steps=800, slots=8, steps=5, seed=1,
                             hidden=(32, 32), lr=7e-4, adam_eps=1e-5,
                             learner=PPOConfig(gamma=0.99, gae_lambda=1.0, ent_coef=0.01))
    reference, _ = reference_train(config, tmp_path / "reference")
    assert reference.tobytes() == weights(tmp_path / "run", 20)


def test_a_torch_actor_critic_gives_the_same_bits_with_0_and_2_workers(tmp_path: Path) -> None:
    settings = ("train.env_steps=400", "train.eval_every=5", "train.eval_episodes=1")
    zero = run("cartpole-torch-a2c", tmp_path / "w0", *settings, workers=0)
    two = run("cartpole-torch-a2c", tmp_path / "w2", *settings, workers=2)
    assert weights(zero, 10) == weights(two, 10)
    names = [p["name"] for p in read_json(zero / RUN_PARAMS)["params"]]
    assert names and not any(name.startswith("pi.") for name in names)  # the module's own parameters
    assert read_jsonl(zero / RUN_METRICS)[-1]["eval_version"] == 10


def test_pendulum_runs_a_gaussian_policy(tmp_path: Path) -> None:
    done = run("pendulum-ppo", tmp_path / "run", "train.env_steps=2048", "train.eval_every=2",
               "train.eval_episodes=1", "train.minibatches=4", workers=1)
    names = [p["name"] for p in read_json(done / RUN_PARAMS)["params"]]
    assert "log_std" in names
    metrics = read_jsonl(done / RUN_METRICS)
    assert [m["version"] for m in metrics] == [0, 1]
    assert metrics[-1]["episodes"] == 4 and metrics[-1]["return_mean"] < 0  # 200-step episodes, rewards <= 0
    assert metrics[-1]["eval_return_mean"] is not None and metrics[-1]["entropy"] > 0


def test_a_user_environment_runs_on_workers(tmp_path: Path) -> None:
    done = run("user-env-ppo", tmp_path / "run", "train.env_steps=1024", workers=2)
    metrics = read_jsonl(done / RUN_METRICS)
    assert len(metrics) == 4 and sum(m["episodes"] for m in metrics) > 0
    assert weights(done, 4) == weights(run("user-env-ppo", tmp_path / "zero", "train.env_steps=1024"), 4)


def test_load_model_of_an_rl_run_acts_greedy_or_sampled(tmp_path: Path) -> None:
    import memtrain
    from memtrain.errors import InputError
    from memtrain.rl.server import job_policy, read_run_job

    done = run("cartpole-ppo", tmp_path / "run", "train.env_steps=512", "train.eval_every=0")
    model = memtrain.load_model(done)
    policy = job_policy(read_run_job(done))
    final = np.array(open_npy(weights_path(done, 2)))
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    greedy = model.act(obs)
    assert greedy.dtype == np.int64 and greedy.shape == (16,)
    assert np.array_equal(greedy, policy.greedy(policy.forward(final, obs)))  # the final version's policy
    assert int(model.act(obs[0])) == greedy[0]  # one observation, one action
    sampled = model.act(obs, greedy=False, rng=7)
    assert np.array_equal(sampled, model.act(obs, greedy=False, rng=7)) and set(sampled) <= {0, 1}
    with pytest.raises(InputError, match="observations of the wrong shape"):
        model.act(np.zeros((2, 3)))
    with pytest.raises(InputError, match="the run records no best evaluation"):  # eval_every = 0: none made
        memtrain.load_model(done, which="best")


def test_load_model_of_a_continuous_policy_gives_actions_within_the_box(tmp_path: Path) -> None:
    import memtrain

    done = run("pendulum-ppo", tmp_path / "run", "train.env_steps=1024", "train.eval_every=0",
               "train.minibatches=4")
    actions = memtrain.load_model(done).act(np.ones((5, 3), np.float32) * 100, greedy=False, rng=0)
    assert actions.shape == (5, 1) and actions.dtype == np.float32 and np.all(np.abs(actions) <= 2.0)
