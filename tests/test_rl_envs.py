"""memtrain/rl/envs.py: env specs resolved with clear errors, the seeding rule, failures named."""

from __future__ import annotations

import numpy as np
import pytest

from memtrain.errors import InputError, WorkerFailure
from memtrain.rl.envs import CONTINUOUS, DISCRETE, EnvSpec, Slot, make_env, reset_seed


def test_gymnasium_ids_and_factories_give_their_spaces() -> None:
    cart = Slot(EnvSpec(id="CartPole-v1"), seed=1, slot=0).spaces
    assert (cart.obs_dim, cart.kind, cart.n) == (4, DISCRETE, 2)
    pend = Slot(EnvSpec(factory="rl_envs:pendulum"), seed=1, slot=0).spaces
    assert (pend.obs_dim, pend.kind, pend.n, pend.low, pend.high) == (3, CONTINUOUS, 1, (-2.0,), (2.0,))


def test_spec_needs_exactly_one_name() -> None:
    with pytest.raises(InputError, match="exactly one of `id` and `factory`"):
        EnvSpec()
    with pytest.raises(InputError, match="exactly one"):
        EnvSpec(id="CartPole-v1", factory="rl_envs:walk")


def test_unknown_id_suggests_close_names() -> None:
    with pytest.raises(InputError) as err:
        make_env(EnvSpec(id="Cartpole-v1"))
    text = str(err.value)
    assert "unknown environment id" in text and "'Cartpole-v1'" in text and "did you mean 'CartPole-v1'" in text
    assert err.value.exit_code == 2


@pytest.mark.parametrize(("factory", "words"), [
    ("rl_envs", ['"module:callable"']),
    ("no_such_module_xyz:make", ["cannot import module 'no_such_module_xyz'", "ModuleNotFoundError"]),
    ("rl_envs:walkk", ["has no attribute 'walkk'", "did you mean `walk`?"]),
    ("rl_envs:NOT_CALLABLE", ["is not callable", "found int"]),
    ("rl_envs:raises", ["raised while making the environment", "ValueError: no licence for the simulator"]),
    ("rl_envs:not_an_env", ["did not give an environment with the gymnasium API", "found dict without reset, step"]),
])
def test_bad_factories_are_named(factory: str, words: list[str]) -> None:
    with pytest.raises(InputError) as err:
        make_env(EnvSpec(factory=factory))
    for word in words:
        assert word in str(err.value)


def test_spaces_the_policy_cannot_take_say_what_was_found() -> None:
    with pytest.raises(InputError, match=r"cannot take this observation space.*Box\(0, 255, \(8, 8, 3\), uint8\)"):
        make_env(EnvSpec(factory="rl_envs:image_observations"))
    with pytest.raises(InputError, match=r"cannot take this observation space.*Discrete\(16\)"):
        make_env(EnvSpec(id="FrozenLake-v1"))
    with pytest.raises(InputError, match=r"unsupported action space.*MultiDiscrete\(\[2 3\]\)"):
        make_env(EnvSpec(factory="rl_envs:multi_discrete_actions"))


def test_reset_seed_is_a_function_of_seed_slot_episode_only() -> None:
    seeds = {reset_seed(s, e, k) for s in range(3) for e in range(4) for k in range(5)}
    assert len(seeds) == 60 and reset_seed(2, 3, 4) == reset_seed(2, 3, 4)
    a, b = Slot(EnvSpec(id="CartPole-v1"), 7, 2), Slot(EnvSpec(id="CartPole-v1"), 7, 2)
    assert np.array_equal(a.reset(5, version=0), b.reset(5, version=9))
    assert not np.array_equal(a.reset(5, version=0), a.reset(6, version=0))


def test_an_environment_that_raises_is_reported_with_version_slot_seed_and_step() -> None:
    slot = Slot(EnvSpec(factory="rl_envs:raises_at_step_3"), seed=11, slot=5)
    slot.reset(2, version=7)
    for step in range(3):
        slot.step(np.int64(0), version=7, step=step)
    with pytest.raises(WorkerFailure) as err:
        slot.step(np.int64(0), version=7, step=3)
    assert str(err.value).startswith("version 7, slot 5, seed 11, episode 2, step 3: the environment failed in step")
    assert "RuntimeError: the simulator lost its state" in str(err.value)


def test_a_non_finite_observation_is_a_failure_not_a_meaningless_action() -> None:
    slot = Slot(EnvSpec(factory="rl_envs:nan_observation_at_step_2"), seed=4, slot=1)
    slot.reset(0, version=2)
    slot.step(np.int64(0), version=2, step=0)
    with pytest.raises(WorkerFailure, match=r"^version 2, slot 1, seed 4, episode 0, step 1: the environment failed in "
                                            r"observation \(found a non-finite observation \[nan, nan\]\)"):
        slot.step(np.int64(0), version=2, step=1)
    slot = Slot(EnvSpec(factory="rl_envs:infinite_reward_at_step_2"), seed=4, slot=1)
    slot.reset(0, version=2)
    slot.step(np.int64(0), version=2, step=0)
    with pytest.raises(WorkerFailure, match=r"step 1: the environment failed in step \(found a non-finite reward"):
        slot.step(np.int64(0), version=2, step=1)
