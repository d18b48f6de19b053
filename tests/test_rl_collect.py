"""memtrain/rl/collect.py: a collection task's bits depend on the job, the version and the slot's state only."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from memtrain.errors import CorruptFileError, InputError, MemtrainError, WorkerFailure
from memtrain.files import publish_array
from memtrain.rl.collect import EpisodeState, SlotCache, collect, state_after
from memtrain.rl.envs import EnvSpec, Slot
from memtrain.rl.policy import Policy
from memtrain.rl.trajectory import read_shard

HIDDEN = (16, 16)
SPECS = {"cartpole": EnvSpec(id="CartPole-v1"), "pendulum": EnvSpec(factory="rl_envs:pendulum"),
         "walk": EnvSpec(factory="rl_envs:walk")}


def _weights(folder: Path, spec: EnvSpec, versions: int) -> list[Path]:
    """A different weight vector per version (so every version's policy is another one)."""
    policy = Policy(Slot(spec, 0, 0).spaces, HIDDEN)
    paths = []
    for v in range(versions):
        path = folder / f"w{v}.npy"
        flat = policy.init(np.random.default_rng(v))
        flat[policy.layout.views(flat)["pi.out.w"].size:] *= 3  # not the near-uniform initial policy
        publish_array(path, flat, durable=False)
        paths.append(path)
    return paths


def _run(folder: Path, spec: EnvSpec, weights: list[Path], slot: int, state: EpisodeState, first: int,
         cache: SlotCache | None = None) -> tuple[list[bytes], EpisodeState]:
    out = folder / "shards"
    out.mkdir(exist_ok=True)
    shards = []
    for v in range(first, len(weights)):
        done = collect(weights[v], v, slot, spec, 99, 64, state, out_dir=out, hidden=HIDDEN, cache=cache)
        shards.append(done.path.read_bytes())
        state = done.state
    return shards, state


@pytest.mark.parametrize("name", ["cartpole", "pendulum", "walk"])
def test_a_resimulated_slot_continues_bitwise_as_the_uninterrupted_one(tmp_path: Path, name: str) -> None:
    spec = SPECS[name]
    weights = _weights(tmp_path, spec, 6)
    start_spaces = Slot(spec, 0, 0).spaces
    start = EpisodeState.start(start_spaces)
    cache = SlotCache()  # the uninterrupted run: one live environment through every version
    (tmp_path / "a").mkdir()
    straight, end = _run(tmp_path / "a", spec, weights, 3, start, 0, cache)
    cache.close()
    # the "crash": after version 2 the process and its environment are gone; only arrays survive
    (tmp_path / "b").mkdir()
    before, state = _run(tmp_path / "b", spec, weights[:3], 3, start, 0)
    kept = {k: np.array(v) for k, v in state.to_arrays().items()}
    after, resumed_end = _run(tmp_path / "b", spec, weights, 3, EpisodeState.from_arrays(kept, start_spaces), 3)
    assert before + after == straight
    assert resumed_end.key() == end.key() and resumed_end.ret == end.ret
    assert state.step > 0  # the crash fell inside an episode: re-simulation had something to replay


def test_the_state_rebuilt_from_the_shards_is_the_carried_one(tmp_path: Path) -> None:
    spec = SPECS["cartpole"]
    spaces = Slot(spec, 0, 0).spaces
    weights = _weights(tmp_path, spec, 5)
    state, trajectories = EpisodeState.start(spaces), []
    for v in range(5):
        done = collect(weights[v], v, 0, spec, 99, 64, state, out_dir=tmp_path, hidden=HIDDEN)
        trajectories.append(read_shard(done.path, spaces=spaces, version=v, slot=0, seed=99, steps=64))
        state = done.state
    rebuilt = state_after(trajectories, spaces)
    assert rebuilt.key() == state.key() and rebuilt.ret == state.ret
    assert sum(t.done.sum() for t in trajectories) >= 2  # episodes ended and continued across versions
    with pytest.raises(MemtrainError, match="not consecutive"):
        state_after([trajectories[0], trajectories[2]], spaces)
    last_start = max(i for i, t in enumerate(trajectories) if t.done.any() or t.step == 0)
    if last_start + 1 < len(trajectories):
        with pytest.raises(MemtrainError, match="do not reach back to the start"):
            state_after(trajectories[last_start + 1:], spaces)


def _collect_in_child(args: tuple) -> bytes:
    weights, out, state_arrays = args
    spec = SPECS["walk"]
    state = EpisodeState.from_arrays(state_arrays, Slot(spec, 0, 0).spaces)
    done = collect(weights, 2, 5, spec, 99, 64, state, out_dir=out, hidden=HIDDEN)
    return done.path.read_bytes()


def test_the_same_shard_bits_in_this_process_and_in_a_spawned_one(tmp_path: Path) -> None:
    spec = SPECS["walk"]
    weights = _weights(tmp_path, spec, 3)
    _, state = _run(tmp_path, spec, weights[:2], 5, EpisodeState.start(Slot(spec, 0, 0).spaces), 0)
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    here = collect(weights[2], 2, 5, spec, 99, 64, state, out_dir=tmp_path / "here", hidden=HIDDEN).path.read_bytes()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        there = pool.map(_collect_in_child, [(weights[2], tmp_path / "there", state.to_arrays())])[0]
    assert here == there


def test_actions_depend_on_seed_version_and_slot(tmp_path: Path) -> None:
    spec = SPECS["cartpole"]
    weights = _weights(tmp_path, spec, 1)[0]
    start = EpisodeState.start(Slot(spec, 0, 0).spaces)

    def actions(version: int, slot: int, seed: int) -> np.ndarray:
        done = collect(weights, version, slot, spec, seed, 64, start, out_dir=tmp_path, hidden=HIDDEN)
        return done.trajectory.actions

    base = actions(0, 0, 1)
    assert np.array_equal(base, actions(0, 0, 1))
    for other in (actions(1, 0, 1), actions(0, 1, 1), actions(0, 0, 2)):
        assert not np.array_equal(base, other)


def test_the_shard_records_what_gae_needs(tmp_path: Path) -> None:
    spec = SPECS["walk"]
    traj = collect(_weights(tmp_path, spec, 1)[0], 0, 0, spec, 5, 200, EpisodeState.start(Slot(spec, 0, 0).spaces),
                   out_dir=tmp_path, hidden=HIDDEN).trajectory
    assert traj.truncated.any() and traj.terminated.any()
    going_on = ~traj.done[:-1]
    assert np.array_equal(traj.next_obs[:-1][going_on], traj.obs[1:][going_on])
    assert np.array_equal(traj.next_value[:-1][going_on], traj.value[1:][going_on])
    ended = np.flatnonzero(traj.done[:-1])
    assert not np.array_equal(traj.next_obs[ended], traj.obs[ended + 1])  # the final observation, not the reset
    assert np.count_nonzero(traj.episode_return) == traj.done.sum()


def test_weights_that_do_not_fit_the_policy_are_named(tmp_path: Path) -> None:
    spec = SPECS["cartpole"]
    publish_array(tmp_path / "w.npy", np.zeros(10, np.float32), durable=False)
    with pytest.raises(CorruptFileError, match=r"w.npy: the weights do not fit the policy \(expected shape \(755,\) "
                       r"for hidden \(16, 16\) and 4 observations, 2 actions, found shape \(10,\)\)"):
        collect(tmp_path / "w.npy", 0, 0, spec, 1, 8, EpisodeState.start(Slot(spec, 0, 0).spaces), out_dir=tmp_path,
                hidden=HIDDEN)


def test_an_environment_that_does_not_replay_is_refused(tmp_path: Path) -> None:
    spec = SPECS["cartpole"]
    spaces = Slot(spec, 0, 0).spaces
    weights = _weights(tmp_path, spec, 1)[0]
    state = collect(weights, 0, 0, spec, 1, 5, EpisodeState.start(spaces), out_dir=tmp_path, hidden=HIDDEN).state
    wrong = EpisodeState(state.episode, state.actions, state.ret + 1.0)  # not what these actions give
    with pytest.raises(MemtrainError, match="re-simulating the slot's episode gave another return"):
        collect(weights, 1, 0, spec, 1, 5, wrong, out_dir=tmp_path, hidden=HIDDEN)


def test_weights_with_nan_and_bad_task_numbers_are_refused(tmp_path: Path) -> None:
    spec = SPECS["cartpole"]
    start = EpisodeState.start(Slot(spec, 0, 0).spaces)
    flat = np.load(_weights(tmp_path, spec, 1)[0])
    flat[7] = np.nan
    publish_array(tmp_path / "nan.npy", flat, durable=False)
    with pytest.raises(CorruptFileError, match=r"nan.npy: the weights hold NaN or Inf.*found 1 non-finite values"):
        collect(tmp_path / "nan.npy", 0, 0, spec, 1, 8, start, out_dir=tmp_path, hidden=HIDDEN)
    for args, key in (((-1, 0, 1, 8), "version"), ((0, 0, 1, 0), "env.steps"), ((0, -2, 1, 8), "slot")):
        version, slot, seed, steps = args
        with pytest.raises(InputError, match=f"bad value for {key}"):
            collect(tmp_path / "nan.npy", version, slot, spec, seed, steps, start, out_dir=tmp_path, hidden=HIDDEN)


def test_a_damaged_episode_state_is_refused_not_replayed() -> None:
    spaces = Slot(SPECS["cartpole"], 0, 0).spaces
    good = EpisodeState(3, np.array([0, 1, 1], np.int64), 3.0).to_arrays()
    assert EpisodeState.from_arrays(good, spaces).key() == EpisodeState(3, np.array([0, 1, 1]), 3.0).key()
    for change, message in (({"step": np.array(2)}, "counters disagree with its actions"),
                            ({"episode": np.array(-1)}, "counters disagree"),
                            ({"actions": np.zeros((3, 1), np.float32)}, "do not fit the action space"),
                            ({"ret": None}, "incomplete")):
        arrays = {k: v for k, v in (good | change).items() if v is not None}
        with pytest.raises(CorruptFileError, match=message):
            EpisodeState.from_arrays(arrays, spaces, where="checkpoint slot 3")


def test_a_task_whose_environment_fails_publishes_nothing_and_its_retry_resimulates(tmp_path: Path) -> None:
    spec = EnvSpec(factory="rl_envs:raises_at_step_3")
    weights = _weights(tmp_path, spec, 1)[0]
    out = tmp_path / "out"
    out.mkdir()
    cache = SlotCache()
    with pytest.raises(WorkerFailure, match="version 0, slot 2, seed 99, episode 0, step 3"):
        collect(weights, 0, 2, spec, 99, 8, EpisodeState.start(Slot(spec, 0, 0).spaces), out_dir=out,
                hidden=HIDDEN, cache=cache)
    assert list(out.iterdir()) == [] and cache.live == {}


@pytest.mark.parametrize("failures", [1, 2])
def test_a_transient_environment_fault_is_retried_and_gives_the_same_bits(tmp_path: Path, failures: int) -> None:
    import rl_envs

    weights = _weights(tmp_path, SPECS["walk"], 1)[0]
    start = EpisodeState.start(Slot(SPECS["walk"], 0, 0).spaces)
    (tmp_path / "clean").mkdir()
    clean = collect(weights, 0, 2, SPECS["walk"], 99, 64, start, out_dir=tmp_path / "clean", hidden=HIDDEN)
    rl_envs.FLAKY.update(failures=failures, made=0)
    (tmp_path / "flaky").mkdir()
    done = collect(weights, 0, 2, EnvSpec(factory="rl_envs:flaky"), 99, 64, start, out_dir=tmp_path / "flaky",
                   hidden=HIDDEN, cache=SlotCache(), attempts=3)
    assert done.path.read_bytes() == clean.path.read_bytes() and done.state.key() == clean.state.key()
    assert {"failures": 0, "made": failures + 1} == rl_envs.FLAKY  # a new environment for each attempt


def test_an_environment_that_keeps_failing_stops_naming_what_reproduces_it(tmp_path: Path) -> None:
    import rl_envs

    spec = EnvSpec(factory="rl_envs:flaky")
    weights = _weights(tmp_path, spec, 1)[0]
    out = tmp_path / "out"
    out.mkdir()
    # the slot is in the middle of episode 4 (2 steps in): the failure at its step 3 comes after one step of the task
    actions = np.array([0, 2], np.int64)
    state = EpisodeState(4, actions, _replayed_return(Slot(SPECS["walk"], 99, 2), 4, actions))
    rl_envs.FLAKY.update(failures=10, made=0)
    with pytest.raises(WorkerFailure) as err:
        collect(weights, 7, 2, spec, 99, 16, state, out_dir=out, hidden=HIDDEN, attempts=3)
    text = str(err.value)
    assert "version 7, slot 2, seed 99, episode 4, step 3" in text and "at each of 3 attempts" in text
    assert "ConnectionError: the simulator's server did not answer" in text
    from memtrain.rl.envs import reset_seed
    assert f"reset(seed={reset_seed(99, 2, 4)})" in text
    assert rl_envs.FLAKY == {"failures": 7, "made": 3} and list(out.iterdir()) == []


def _replayed_return(env: Slot, episode: int, actions: np.ndarray) -> float:
    env.reset(episode, version=0)
    ret = sum(env.step(a, version=0, step=t)[1] for t, a in enumerate(actions))
    env.close()
    return ret


@pytest.mark.parametrize("name", ["cartpole", "pendulum"])
def test_a_slot_resumed_from_its_shards_alone_steps_on_bitwise(tmp_path: Path, name: str) -> None:
    """No state kept at all: the slot's state rebuilt from the shards it wrote (state_after), then re-simulated,
    gives the same observations and shards as the uninterrupted run."""
    spec = SPECS[name]
    spaces = Slot(spec, 0, 0).spaces
    weights = _weights(tmp_path, spec, 6)
    (tmp_path / "a").mkdir()
    straight, _ = _run(tmp_path / "a", spec, weights, 1, EpisodeState.start(spaces), 0, SlotCache())
    (tmp_path / "b").mkdir()
    before, carried = _run(tmp_path / "b", spec, weights[:4], 1, EpisodeState.start(spaces), 0)
    shards = [read_shard(tmp_path / "b" / "shards" / f"r-v{v:08d}-s00001.npy", spaces=spaces, version=v, slot=1,
                         seed=99, steps=64) for v in range(4)]
    rebuilt = state_after(shards, spaces)
    assert rebuilt.key() == carried.key() and rebuilt.step > 0
    after, _ = _run(tmp_path / "b", spec, weights, 1, rebuilt, 4)
    assert before + after == straight
