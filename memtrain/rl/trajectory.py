"""Trajectory shards: what one collection task (version v, slot e) publishes, as ONE standard ``.npy`` file.

The file holds a single record (shape ``()``) of a structured dtype whose fields are fixed-size arrays, so
a shard is one write and one rename (one file, not one per field: on CartPole one file costs about 0.4x the
time of the 128 steps it records, nine files 1.5x). Fields, for ``T`` steps, observation length ``D`` and
``n`` actions (categorical) or action dimensions (Gaussian):

| field | dtype, shape | meaning |
|---|---|---|
| ``meta`` | int64 [12] | what the shard is (below) |
| ``obs`` | float32 [T, D] | the observation each step acted on |
| ``actions`` | int64 [T] or float32 [T, n] | the action recorded (a Gaussian's sample, unclipped) |
| ``rewards`` | float64 [T] | |
| ``terminated``, ``truncated`` | uint8 [T] | the episode ended at this step (by the MDP / by a limit) |
| ``logp``, ``value`` | float32 [T] | log pi(action), V(obs) under version v |
| ``next_obs`` | float32 [T, D] | the observation that followed (before any reset: the final one at an episode's end) |
| ``next_value`` | float32 [T] | V(next_obs) under version v: the bootstrap at a truncation and at the shard's end |
| ``episode_return`` | float64 [T] | the whole episode's return at the step that ends it, else 0 |
| ``checksum`` | uint8 [16] | xxh3-128 of every byte of the record before it |

``meta``: format version (1), weight version, slot, seed, T, D, kind (0 categorical, 1 Gaussian), n, the
slot's episode index and the step in that episode at the shard's first step, then two zeros (reserved).

The reader (``read_shard``) validates the .npy header and exact size (``files.open_npy``: never unpickles),
the format version, what the shard was written for (version, slot, seed, T, spaces) and the checksum, and
names the file and the field in every error.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import xxhash

from memtrain.errors import CorruptFileError
from memtrain.files import open_npy, publish_array
from memtrain.layout import rl_gradient_name, trajectory_name
from memtrain.rl.envs import DISCRETE, Spaces

FORMAT_VERSION = 1
META_LEN = 12
KINDS = {0: "discrete", 1: "continuous"}
_META = ("format", "version", "slot", "seed", "steps", "obs_dim", "kind", "n", "episode", "step")


def shard_dtype(steps: int, spaces: Spaces) -> np.dtype:
    """The record's dtype for ``steps`` steps of an environment with ``spaces``."""
    t, d = int(steps), spaces.obs_dim
    actions = ("<i8", (t,)) if spaces.kind == DISCRETE else ("<f4", (t, spaces.n))
    return np.dtype([("meta", "<i8", (META_LEN,)), ("obs", "<f4", (t, d)), ("actions", *actions),
                     ("rewards", "<f8", (t,)), ("terminated", "u1", (t,)), ("truncated", "u1", (t,)),
                     ("logp", "<f4", (t,)), ("value", "<f4", (t,)), ("next_obs", "<f4", (t, d)),
                     ("next_value", "<f4", (t,)), ("episode_return", "<f8", (t,)), ("checksum", "u1", (16,))])


@dataclass(frozen=True)
class Trajectory:
    """One shard's content (arrays as in the module's table; flags as bool)."""

    version: int
    slot: int
    seed: int
    episode: int  # the slot's episode index at the shard's first step
    step: int  # ... and the step in that episode
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    logp: np.ndarray
    value: np.ndarray
    next_obs: np.ndarray
    next_value: np.ndarray
    episode_return: np.ndarray

    @property
    def steps(self) -> int:
        return len(self.rewards)

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


ARRAYS = tuple(f.name for f in fields(Trajectory))[5:]


def shard_path(folder: Path, version: int, slot: int) -> Path:
    return Path(folder) / trajectory_name(version, slot)


def gradient_path(folder: Path, version: int, slot: int) -> Path:
    """The A3C gradient of collection task (version, slot), beside its shard."""
    return Path(folder) / rl_gradient_name(version, slot)


def write_shard(path: Path, traj: Trajectory, spaces: Spaces, *, durable: bool = False) -> None:
    """Publish ``traj`` whole at ``path`` (temporary name, then rename: a reader sees all of it or nothing)."""
    record = np.zeros((), dtype=shard_dtype(traj.steps, spaces))
    kind = 0 if spaces.kind == DISCRETE else 1
    record["meta"][:len(_META)] = (FORMAT_VERSION, traj.version, traj.slot, traj.seed, traj.steps, spaces.obs_dim,
                                   kind, spaces.n, traj.episode, traj.step)
    for name in ARRAYS:
        record[name] = getattr(traj, name)
    record["checksum"] = np.frombuffer(_digest(record), np.uint8)
    publish_array(Path(path), record, durable=durable)


def _digest(record: np.ndarray) -> bytes:
    raw = memoryview(np.ascontiguousarray(record).reshape(1).view(np.uint8))
    return xxhash.xxh3_128_digest(raw[:-16])


def read_shard(path: Path, *, spaces: Spaces | None = None, steps: int | None = None, version: int | None = None,
               slot: int | None = None, seed: int | None = None) -> Trajectory:
    """The shard at ``path``, validated; the keyword arguments, when given, are what it must have been written for."""
    path = Path(path)
    mapped = open_npy(path)
    if mapped.shape != () or mapped.dtype.names is None or "meta" not in mapped.dtype.names:
        raise CorruptFileError("not a trajectory shard", path=path, expected="one record with a `meta` field",
                               found=f"shape {mapped.shape}, dtype {mapped.dtype}")
    record = np.array(mapped)  # one copy: the checksum and every field read from the same bytes
    meta = record["meta"]
    if meta.shape != (META_LEN,) or int(meta[0]) != FORMAT_VERSION:
        raise CorruptFileError("unknown trajectory shard format", path=path, where="meta",
                               expected=f"format {FORMAT_VERSION}", found=f"{meta[:1].tolist()}")
    found = dict(zip(_META, (int(v) for v in meta[:len(_META)]), strict=True))
    asked = {"version": version, "slot": slot, "seed": seed, "steps": steps}
    if spaces is not None:
        asked |= {"obs_dim": spaces.obs_dim, "kind": 0 if spaces.kind == DISCRETE else 1, "n": spaces.n}
    for key, want in asked.items():
        if want is not None and found[key] != int(want):
            raise CorruptFileError(f"the shard was written for another {key}", path=path, where=f"meta.{key}",
                                   expected=want, found=found[key])
    written = Spaces(obs_dim=found["obs_dim"], kind=KINDS.get(found["kind"], "?"), n=found["n"])
    if found["kind"] not in KINDS or record.dtype != shard_dtype(found["steps"], written):
        raise CorruptFileError("the shard's fields differ from what its meta describes", path=path,
                               expected=str(shard_dtype(max(found["steps"], 0), written)), found=str(record.dtype))
    stored = bytes(record["checksum"])
    computed = _digest(record)
    if stored != computed:
        raise CorruptFileError("checksum mismatch: the shard changed since it was written", path=path,
                               where="checksum", expected=f"xxh3-128:{computed.hex()}",
                               found=f"xxh3-128:{stored.hex()}",
                               hint="collect it again (a collection task is pure: the same bits come back)")
    arrays = {name: record[name] for name in ARRAYS}
    arrays["terminated"], arrays["truncated"] = arrays["terminated"] != 0, arrays["truncated"] != 0
    return Trajectory(version=found["version"], slot=found["slot"], seed=found["seed"], episode=found["episode"],
                      step=found["step"], **arrays)
