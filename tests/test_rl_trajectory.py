"""memtrain/rl/trajectory.py: one .npy file per (version, slot), written whole, read back validated."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memtrain.errors import CorruptFileError
from memtrain.rl.envs import CONTINUOUS, DISCRETE, Spaces
from memtrain.rl.trajectory import ARRAYS, Trajectory, read_shard, shard_path, write_shard


def _trajectory(rng: np.random.Generator, spaces: Spaces, steps: int, **meta: int) -> Trajectory:
    d = spaces.obs_dim
    actions = (rng.integers(0, spaces.n, steps) if spaces.kind == DISCRETE
               else rng.standard_normal((steps, spaces.n)).astype(np.float32))
    ends = rng.random((2, steps)) < 0.1
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return Trajectory(version=meta.get("version", 3), slot=meta.get("slot", 1), seed=meta.get("seed", 42),
                      episode=meta.get("episode", 5), step=meta.get("step", 17), obs=f32(steps, d), actions=actions,
                      rewards=rng.standard_normal(steps), terminated=ends[0], truncated=ends[1] & ~ends[0],
                      logp=f32(steps), value=f32(steps), next_obs=f32(steps, d), next_value=f32(steps),
                      episode_return=rng.standard_normal(steps))


SPACES = st.builds(lambda d, kind, n: Spaces(obs_dim=d, kind=kind, n=n), st.integers(1, 6),
                   st.sampled_from([DISCRETE, CONTINUOUS]), st.integers(1, 5))


@given(spaces=SPACES, steps=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), version=st.integers(0, 10**6),
       slot=st.integers(0, 999), draw=st.integers(0, 2**32 - 1))
def test_round_trip_is_bitwise(tmp_path_factory: pytest.TempPathFactory, spaces: Spaces, steps: int, seed: int,
                               version: int, slot: int, draw: int) -> None:
    traj = _trajectory(np.random.default_rng(draw), spaces, steps, version=version, slot=slot, seed=seed)
    path = shard_path(tmp_path_factory.mktemp("shards"), version, slot)
    write_shard(path, traj, spaces)
    assert path.name == f"r-v{version:08d}-s{slot:05d}.npy"
    back = read_shard(path, spaces=spaces, steps=steps, version=version, slot=slot, seed=seed)
    assert (back.version, back.slot, back.seed, back.episode, back.step) == (version, slot, seed, 5, 17)
    for name in ARRAYS:
        mine, theirs = getattr(traj, name), getattr(back, name)
        assert mine.shape == theirs.shape and np.array_equal(mine, theirs), name
        assert mine.tobytes() == np.asarray(theirs, mine.dtype).tobytes(), name
    assert back.terminated.dtype == bool and back.steps == steps
    assert os.listdir(path.parent) == [path.name]  # one file, no temporary left behind
    assert np.load(path).shape == ()  # plain numpy reads it (no pickle)


SPACES_2 = Spaces(obs_dim=4, kind=DISCRETE, n=2)


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = shard_path(tmp_path, 3, 1)
    write_shard(path, _trajectory(np.random.default_rng(0), SPACES_2, 16), SPACES_2)
    return path


def test_a_flipped_byte_is_a_checksum_error_naming_the_file(shard: Path) -> None:
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(CorruptFileError) as err:
        read_shard(shard)
    assert str(err.value).startswith(f"{shard}:checksum: checksum mismatch")


def test_a_truncated_shard_is_an_error(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(CorruptFileError, match="file is truncated"):
        read_shard(shard)


@pytest.mark.parametrize(("asked", "message"), [
    ({"version": 4}, "meta.version: the shard was written for another version (expected 4, found 3)"),
    ({"slot": 0}, "meta.slot: the shard was written for another slot (expected 0, found 1)"),
    ({"steps": 32}, "another steps (expected 32, found 16)"),
    ({"spaces": Spaces(obs_dim=5, kind=DISCRETE, n=2)}, "another obs_dim (expected 5, found 4)"),
    ({"spaces": Spaces(obs_dim=4, kind=CONTINUOUS, n=2)}, "another kind (expected 1, found 0)"),
])
def test_a_shard_written_for_another_task_is_refused(shard: Path, asked: dict, message: str) -> None:
    with pytest.raises(CorruptFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_shard(shard, **asked)


def test_other_npy_files_are_not_shards(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros(3))
    with pytest.raises(CorruptFileError, match="not a trajectory shard"):
        read_shard(tmp_path / "x.npy")
    np.save(tmp_path / "o.npy", np.array([None]), allow_pickle=True)
    with pytest.raises(CorruptFileError, match="would unpickle"):
        read_shard(tmp_path / "o.npy")
