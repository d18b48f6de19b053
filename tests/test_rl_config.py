"""memtrain/rl/config.py: an RL job ([env] + [train] algorithm/env_steps + the learner's keys) validated once, at
the edge, with errors naming the file, the key, what was expected and what was found; the examples parse."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtrain.cli import main
from memtrain.config import load_job
from memtrain.errors import InputError
from memtrain.rl.config import RL_RANGES, EnvConfig, RLConfig, load_rl_job
from memtrain.rl.envs import CONTINUOUS, DISCRETE

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "jobs" / "examples"
JOB = """[env]
id = "CartPole-v1"
slots = 2
steps = 16
[train]
algorithm = "ppo"
env_steps = 320
[run]
dir = "run"
"""


def _job(tmp_path: Path, text: str = JOB, **files: str) -> Path:
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def _error(path: Path, *overrides: str) -> str:
    with pytest.raises(InputError) as err:
        load_rl_job(path, overrides)
    text = str(err.value)
    assert str(path) in text or path.name in text, text  # the file is named
    return text


@pytest.mark.parametrize("name", ["cartpole-ppo", "pendulum-ppo", "cartpole-torch-a2c", "user-env-ppo",
                                  "cartpole-dppo", "cartpole-a3c"])
def test_the_example_jobs_parse_and_validate(name: str) -> None:
    job = load_rl_job(EXAMPLES / f"{name}.toml")
    assert job.versions >= 1 and job.env.slots * job.env.steps * job.versions <= job.rl.env_steps
    kind = CONTINUOUS if name.startswith("pendulum") else DISCRETE
    assert job.spaces.kind == kind and job.run.dir == (ROOT / "runs" / name).resolve()


def test_a_job_gives_typed_values_and_defaults(tmp_path: Path) -> None:
    job = load_rl_job(_job(tmp_path), ["train.clip=0.1", "train.mode='async'"])
    assert (job.env.id, job.env.slots, job.env.steps, job.rl.algorithm, job.rl.env_steps) == (
        "CartPole-v1", 2, 16, "ppo", 320)
    assert job.rl.clip == 0.1 and job.rl.gamma == 0.99 and job.rl.max_policy_lag == 4  # the async default
    assert (job.train.optimizer.name, job.train.optimizer.lr) == ("adam", 2.5e-4)
    assert job.model.options["hidden"] == (64, 64) and job.versions == 10


@pytest.mark.parametrize("override, words", [
    ("env.slots=0", ["env.slots out of range", "from 1 to 4096", "found 0"]),
    ("env.steps=-3", ["env.steps out of range", "found -3"]),
    ("train.gamma=1.5", ["train.gamma out of range", "from 0 to 1", "1.5"]),
    ("train.gae_lambda=-0.1", ["train.gae_lambda out of range"]),
    ("train.clip=0", ["train.clip out of range", "> 0"]),
    ("train.clip=inf", ["train.clip out of range"]),
    ("train.ent_coef=-1", ["train.ent_coef out of range", ">= 0"]),
    ("train.vf_coef=nan", ["train.vf_coef out of range"]),
    ("train.max_grad_norm=-0.5", ["train.max_grad_norm out of range"]),
    ("train.epochs=0", ["train.epochs out of range"]),
    ("train.minibatches=0", ["train.minibatches out of range"]),
    ("train.eval_episodes=0", ["train.eval_episodes out of range"]),
    ("train.eval_every=-1", ["train.eval_every out of range", "an integer from 0 to 1000000"]),
    ("train.eval_every=1000001", ["train.eval_every out of range"]),
    ("train.epochs=2.5", ["wrong type for train.epochs", "int"]),
    ("train.gamma='high'", ["wrong type for train.gamma"]),
    ("train.anneal_lr=1", ["wrong type for train.anneal_lr", "bool"]),
    ("train.env_steps=20", ["env_steps is less than one version's steps", ">= env.slots * env.steps = 32"]),
    ("train.algorithm='dqn'", ["bad value for train.algorithm", "'ppo' or 'a2c'", "'dqn'"]),
    ("train.algoritm='ppo'", ["unknown key train.algoritm", "did you mean", "algorithm"]),
    ("train.batch_size=64", ["train.batch_size does not apply to a reinforcement-learning job"]),
    ("train.max_policy_lag=2", ["max_policy_lag applies only to train.mode = 'async'"]),
    ("train.staleness=2", ["train.staleness out of range", "0 (collect with v"]),
    ("train.lr=-1", ["train.lr"]),
    ("env.slot=3", ["unknown key env.slot", "slots"]),
    ("env.factory='rl_envs:walk'", ["exactly one of `id` and `factory`"]),
    ("model.kind='softmax'", ["model.kind", "'mlp' or 'torch'"]),
    ("model.hidden=[0]", ["bad value for model.hidden"]),
    ("model.widths=[3]", ["unknown key model.widths"]),
    ("data.path='x'", ["takes no [data]", "remove [data]"]),
    ("dataset.path='x'", ["unknown section [dataset]"]),
])
def test_bad_values_are_refused_naming_file_key_expected_and_found(tmp_path: Path, override: str,
                                                                   words: list[str]) -> None:
    text = _error(_job(tmp_path), override)
    for word in words:
        assert word in text, text


def test_every_range_is_checked_from_python_too() -> None:
    for key in RL_RANGES:
        section, name = key.split(".")
        cls = EnvConfig if section == "env" else RLConfig
        extra = {"id": "CartPole-v1"} if cls is EnvConfig else {}
        with pytest.raises(InputError, match=f"{key} out of range"):
            cls(**extra, **{name: -1})


@pytest.mark.parametrize("env, words", [
    ('id = "Cartpole-v1"', ["unknown environment id", "did you mean 'CartPole-v1'"]),
    ('factory = "envmod:not_an_env"', ["did not give an environment with the gymnasium API", "dict"]),
    ('factory = "envmod:image"', ["the policy cannot take this observation space", "a flat Box",
                                  "FlattenObservation"]),
    ('factory = "envmod:missing"', ["has no attribute 'missing'"]),
    ('factory = "nomodule:make"', ["cannot import module 'nomodule'"]),
    ('factory = "envmod/x.py:make"', ["bad env.factory", "'module:name'"]),
])
def test_environments_that_cannot_be_used_are_clear_errors(tmp_path: Path, env: str, words: list[str]) -> None:
    module = ("import gymnasium as gym\nimport numpy as np\n"
              "def not_an_env():\n    return {'reset': None}\n"
              "def image():\n    env = gym.make('CartPole-v1')\n"
              "    env.observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)\n    return env\n")
    text = _error(_job(tmp_path, JOB.replace('id = "CartPole-v1"', env), **{"envmod.py": module}))
    for word in words:
        assert word in text, text


def test_a_user_environment_beside_the_job_file_is_found(tmp_path: Path) -> None:
    module = (EXAMPLES / "gridwalk.py").read_text()
    job = load_rl_job(_job(tmp_path, JOB.replace('id = "CartPole-v1"', 'factory = "mywalk:make_env"'),
                           **{"mywalk.py": module}))
    assert job.env.code_dir == str(tmp_path) and (job.spaces.obs_dim, job.spaces.n) == (2, 2)


def test_an_rl_job_is_refused_as_a_supervised_job_and_named_to_memtrain_train(tmp_path: Path, capsys) -> None:
    path = _job(tmp_path)
    with pytest.raises(InputError, match="is run by `memtrain train JOB.toml`, not as a supervised job"):
        load_job(path)
    assert main(["train", str(_job(tmp_path, JOB + "[data]\npath = 'x'\n"))]) == 2  # bad RL input: refused
    err = capsys.readouterr().err
    assert "takes no [data]" in err and "Traceback" not in err
