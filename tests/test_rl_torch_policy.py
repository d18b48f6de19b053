"""memtrain/rl/torch_policy.py: a torch.nn.Module actor-critic on the flat vector, against a plain torch forward,
its gradient through ppo_loss and a2c_loss against finite differences, and modules it cannot take."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from memtrain.errors import InputError
from memtrain.rl.envs import CONTINUOUS, DISCRETE, Spaces
from memtrain.rl.ppo import Batch, PPOConfig, a2c_loss, ppo_loss
from memtrain.rl.torch_policy import torch_policy

EXAMPLES = str(Path(__file__).resolve().parent.parent / "jobs" / "examples")
SPACES = {"categorical": Spaces(obs_dim=3, kind=DISCRETE, n=4),
          "gaussian": Spaces(obs_dim=3, kind=CONTINUOUS, n=2, low=(-1.0, -1.0), high=(1.0, 1.0))}


def _policy(kind: str, hidden: int = 8):
    return torch_policy("rl_nets:make_actor_critic", SPACES[kind], {"hidden": hidden}, seed=3, code_dir=EXAMPLES)


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_forward_on_the_flat_vector_is_the_modules_own_forward(kind: str) -> None:
    policy = _policy(kind)
    flat = policy.init(np.random.default_rng(0))
    flat = flat + np.random.default_rng(1).standard_normal(flat.shape).astype(np.float32)  # not the init's values
    sys.path.insert(0, EXAMPLES)
    try:
        import rl_nets
    finally:
        sys.path.remove(EXAMPLES)
    plain = rl_nets.make_actor_critic(3, SPACES[kind].n, SPACES[kind].kind, hidden=8)
    with torch.no_grad():
        for name, param in plain.named_parameters():
            param.copy_(torch.from_numpy(policy.layout.views(flat)[name]))
        obs = np.random.default_rng(2).standard_normal((20, 3)).astype(np.float32)
        out, value = plain(torch.from_numpy(obs))
    fwd = policy.forward(flat, obs)
    assert np.allclose(fwd.out, out.numpy(), rtol=1e-6, atol=1e-7)  # to the last bits: see the collection test
    assert np.allclose(fwd.value, value.numpy(), rtol=1e-6, atol=1e-7)
    assert fwd.out.dtype == np.float32
    if kind == "gaussian":
        assert np.array_equal(fwd.log_std, policy.layout.views(flat)["log_std"])
    assert np.array_equal(policy.init(np.random.default_rng(9)), _policy(kind).init(np.random.default_rng(5)))


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
@pytest.mark.parametrize("learner", [ppo_loss, a2c_loss])
def test_loss_gradients_through_the_module_match_finite_differences(kind: str, learner) -> None:
    policy = _policy(kind, hidden=3)
    policy.module.double()
    rng = np.random.default_rng(11)
    flat = policy.init(rng).astype(np.float64) + 0.3 * rng.standard_normal(policy.layout.size)
    rows = 12
    obs = rng.standard_normal((rows, 3)).astype(np.float32)
    fwd = policy.forward(flat, obs)
    actions = policy.sample(fwd, rng)
    logp_old = (policy.log_prob(fwd, actions) + rng.uniform(-0.6, 0.6, rows)).astype(np.float32)
    data = Batch(obs, actions, logp_old, rng.standard_normal(rows).astype(np.float32), rng.standard_normal(rows),
                 rng.standard_normal(rows))
    config = PPOConfig(ent_coef=0.05, vf_coef=0.7, clip=0.2)
    result = learner(policy, flat, data, config)
    numeric = np.zeros_like(flat)
    for i in range(len(flat)):
        step = np.zeros_like(flat)
        step[i] = 1e-6
        numeric[i] = (learner(policy, flat + step, data, config).loss - learner(policy, flat - step, data,
                                                                                  config).loss) / 2e-6
    assert np.allclose(result.grad, numeric, rtol=1e-5, atol=1e-7), np.abs(result.grad - numeric).max()


def test_modules_it_cannot_take_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "bad_nets.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class One(nn.Module):\n    def __init__(self, d, n):\n        super().__init__()\n"
        "        self.l = nn.Linear(d, n)\n    def forward(self, x):\n        return self.l(x)\n"
        "class Norm(One):\n    def __init__(self, d, n):\n        super().__init__(d, n)\n"
        "        self.bn = nn.BatchNorm1d(d)\n"
        "def one_output(d, n, kind):\n    return One(d, n)\n"
        "def with_buffers(d, n, kind):\n    return Norm(d, n)\n"
        "def not_a_module(d, n, kind):\n    return 3\n")
    for factory, kind, message in (("bad_nets:one_output", "categorical", "wrong outputs"),
                                   ("bad_nets:with_buffers", "categorical", "buffers"),
                                   ("bad_nets:not_a_module", "categorical", "did not return a torch.nn.Module"),
                                   ("bad_nets:one_output", "gaussian", "needs a parameter log_std")):
        with pytest.raises(InputError, match=message):
            policy = torch_policy(factory, SPACES[kind], code_dir=str(tmp_path))
            policy.forward(policy.init(np.random.default_rng(0)), np.zeros((2, 3), np.float32))


def test_a_collection_task_acts_with_the_torch_policy_on_the_mapped_weights(tmp_path: Path) -> None:
    from memtrain.files import publish_array
    from memtrain.rl.collect import EpisodeState, collect
    from memtrain.rl.envs import EnvSpec, Slot

    spec = EnvSpec(id="CartPole-v1")
    spaces = Slot(spec, 0, 0).spaces
    policy = torch_policy("rl_nets:make_actor_critic", spaces, {"hidden": 16}, seed=1, code_dir=EXAMPLES)
    flat = policy.init(np.random.default_rng(0))
    publish_array(tmp_path / "w.npy", flat, durable=False)
    runs = [collect(tmp_path / "w.npy", 0, 1, spec, 7, 64, EpisodeState.start(spaces), out_dir=tmp_path / name,
                    policy=policy) for name in ("a", "b") if not (tmp_path / name).mkdir()]
    traj = runs[0].trajectory
    with torch.no_grad():
        for name, param in policy.module.named_parameters():
            param.copy_(torch.from_numpy(policy.layout.views(flat)[name]))
        rows = [policy.module(torch.from_numpy(traj.obs[t:t + 1])) for t in range(traj.steps)]  # one at a time
        out, value = torch.cat([o for o, _ in rows]), torch.cat([v for _, v in rows])
    # the same arithmetic; the last bit may differ (the views of the flat vector are aligned otherwise than the
    # module's own parameters, and the kernels choose their path by alignment)
    assert np.allclose(traj.value, value.numpy(), rtol=1e-6, atol=1e-7)
    logp = torch.log_softmax(out, dim=1).gather(1, torch.from_numpy(traj.actions)[:, None])[:, 0]
    assert np.allclose(traj.logp, logp.numpy(), atol=1e-6)
    assert runs[0].path.read_bytes() == runs[1].path.read_bytes()
    with pytest.raises(InputError, match="other spaces"):
        collect(tmp_path / "w.npy", 0, 1, EnvSpec(factory="rl_envs:walk"), 7, 8,
                EpisodeState.start(Slot(EnvSpec(factory="rl_envs:walk"), 0, 0).spaces), out_dir=tmp_path / "a",
                policy=policy)
