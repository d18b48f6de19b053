"""The collection task: (weight version v, slot e) -> one trajectory shard, published whole.

The task maps version v read-only, brings slot e's environment to where its episode stands, steps it
``steps`` times with the policy and publishes the shard (memtrain/rl/trajectory.py). Its bits depend on the
job (environment, seed, steps, architecture), the weights of v and the slot's episode state only:

- actions are sampled from ``action_rng(seed, v, e)``, never from anything of the worker's;
- episode k of slot e starts from ``reset(seed=reset_seed(seed, e, k))`` (memtrain/rl/envs.py);
- episodes continue across versions: the slot's ``EpisodeState`` (episode index, the actions since the
  episode's reset, the return so far) is plain arrays. Any process can rebuild the environment from it by
  re-simulation -- the seeded reset, then the recorded actions -- so no environment is ever pickled, and a
  slot resumed after a crash continues bit for bit as the uninterrupted one. A worker that still holds
  the slot's live environment at exactly that state (``SlotCache``) skips the re-simulation.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash
from threadpoolctl import ThreadpoolController

from memtrain.errors import CorruptFileError, InputError, MemtrainError, WorkerFailure
from memtrain.faults import fault_point
from memtrain.files import open_npy, publish_array
from memtrain.rl.envs import DISCRETE, EnvSpec, Slot, Spaces, reset_seed
from memtrain.rl.policy import Policy
from memtrain.rl.trajectory import Trajectory, shard_path, write_shard


@dataclass(frozen=True)
class EpisodeState:
    """Where a slot's current episode stands: its index, the actions taken since its seeded reset (int64 [k] or
    float32 [k, n]) and the return so far. A slot's state between versions; arrays only (``to_arrays``)."""

    episode: int
    actions: np.ndarray
    ret: float = 0.0

    @classmethod
    def start(cls, spaces: Spaces) -> EpisodeState:
        """A slot before its first step: episode 0 just reset."""
        return cls(0, _no_actions(spaces))

    @property
    def step(self) -> int:
        return len(self.actions)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """For a checkpoint (plain .npy arrays, never a pickle): episode, step (in the episode), actions, ret."""
        return {"episode": np.array(self.episode, np.int64), "step": np.array(self.step, np.int64),
                "actions": self.actions, "ret": np.array(self.ret, np.float64)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], spaces: Spaces, *,
                    where: str = "episode state") -> EpisodeState:
        """The state ``to_arrays`` gave, checked against ``spaces``: a damaged record is an error, never replayed."""
        missing = sorted({"episode", "step", "actions", "ret"} - set(arrays))
        if missing:
            raise CorruptFileError("the episode state is incomplete", where=where,
                                   expected="episode, step, actions, ret", found=f"no {', '.join(missing)}")
        actions, empty = np.asarray(arrays["actions"]), _no_actions(spaces)
        episode, step = np.asarray(arrays["episode"]), np.asarray(arrays["step"])
        if actions.dtype != empty.dtype or actions.shape[1:] != empty.shape[1:]:
            raise CorruptFileError("the episode state's actions do not fit the action space", where=where,
                                   expected=f"{empty.dtype} [k{''.join(f', {n}' for n in empty.shape[1:])}]",
                                   found=f"{actions.dtype} {list(actions.shape)}")
        if episode.shape or step.shape or episode < 0 or step != len(actions):
            raise CorruptFileError("the episode state's counters disagree with its actions", where=where,
                                   expected=f"episode >= 0 and step = {len(actions)} (the actions recorded)",
                                   found=f"episode {episode.tolist()}, step {step.tolist()}")
        return cls(int(episode), actions, float(arrays["ret"]))

    def key(self) -> tuple[int, int, bytes]:
        """Identifies the state (episode, step, digest of the actions): what a cached live environment must match."""
        return self.episode, self.step, xxhash.xxh3_128_digest(np.ascontiguousarray(self.actions).tobytes())


def _no_actions(spaces: Spaces) -> np.ndarray:
    return np.zeros(0, np.int64) if spaces.kind == DISCRETE else np.zeros((0, spaces.n), np.float32)


@functools.cache
def blas_controller() -> ThreadpoolController:
    """The BLAS libraries numpy loaded, found once (each ``threadpool_limits`` call would look them up again)."""
    return ThreadpoolController()


def action_rng(seed: int, version: int, slot: int) -> np.random.Generator:
    """The only randomness of collection task (version, slot)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([0x616374, int(seed), int(version), int(slot)])))


@dataclass
class _Live:
    slot: Slot
    key: tuple[int, int, bytes]
    obs: np.ndarray


@dataclass
class SlotCache:
    """Live environments a worker keeps between tasks, by slot; used only when the state matches exactly."""

    live: dict[int, _Live] = field(default_factory=dict)

    def close(self) -> None:
        for entry in self.live.values():
            entry.slot.close()
        self.live.clear()


@dataclass(frozen=True)
class Collected:
    """What a collection task gives back: the published shard, its content and the slot's state after it."""

    path: Path
    trajectory: Trajectory
    state: EpisodeState


class Overtime(Exception):  # noqa: N818 - what it says: the task ran over its time
    """A run of a collection task the server makes itself (0 workers) went past ``train.task_timeout``: raised
    by ``time_limit``'s alarm wherever the task stands, most often inside the environment's call (which names
    the step), and then handled as an environment's failure."""


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Bound the block by ``seconds`` of wall time: SIGALRM raises ``Overtime`` in it. The server's own
    collection tasks (0 workers) under ``train.task_timeout``, the rule the scheduler applies to a worker's
    task (a worker silent that long is killed and its task runs again). Only the main thread gets signals: in
    another thread, or with ``seconds`` None (a worker process, which the scheduler watches), nothing is armed.
    An environment hung in C code that holds the interpreter lock is not interrupted (a worker process is)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum: int, frame: object) -> None:
        raise Overtime(f"the collection task ran for longer than train.task_timeout = {seconds:g} s in the server "
                       "(0 workers)")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def collect(weights_path: Path, version: int, slot: int, spec: EnvSpec, seed: int, steps: int,
            state: EpisodeState, *, out_dir: Path, hidden: tuple[int, ...] = (64, 64),
            cache: SlotCache | None = None, attempts: int = 1, policy: Policy | None = None,
            limit: float | None = None) -> Collected:
    """Run collection task (``version``, ``slot``): ``steps`` steps from ``state``, published in ``out_dir``.

    An environment that fails (raises, or gives a non-finite reward or observation: a ``WorkerFailure`` from
    memtrain/rl/envs.py) is retried, up to ``attempts`` runs of the task in all (the job's ``train.max_attempts``):
    each retry starts a new environment re-simulated to ``state``, so a retry that succeeds writes the bits the
    first run would have. After the last one the error names the version, slot, seed, episode, step and the
    episode's reset seed, so that the failure can be reproduced.

    ``policy``: the actor-critic acting (default: the numpy MLP of ``hidden``); a torch one
    (memtrain/rl/torch_policy.py) runs its forward on the mapped weights the same way. ``limit``: seconds each
    run of the task may take (``time_limit``: the server's own tasks); one that takes longer fails as an
    environment that raised, naming where it stood (``Overtime``).
    """
    for key, value, least in (("version", version, 0), ("slot", slot, 0), ("env.steps", steps, 1), ("seed", seed, 0),
                              ("train.max_attempts", attempts, 1)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
            raise InputError(f"bad value for {key}", expected=f"an integer >= {least}", found=repr(value))
    for attempt in range(1, int(attempts) + 1):
        with time_limit(limit):
            done, failure, episode = _attempt(weights_path, version, slot, spec, seed, steps, state, out_dir, hidden,
                                              cache, policy)
        if done is not None:
            return done
        if attempt == attempts:
            raise _gave_up(failure, spec, seed, slot, episode, attempts) from failure
    raise AssertionError("unreachable: the last attempt returns or raises")


def _attempt(weights_path: Path, version: int, slot: int, spec: EnvSpec, seed: int, steps: int, state: EpisodeState,
             out_dir: Path, hidden: tuple[int, ...], cache: SlotCache | None,
             policy: Policy | None) -> tuple[Collected | None, WorkerFailure, int]:
    """One run of the task: (the result, -, -), or (None, the environment's failure, the episode it was in)."""
    try:  # a failure while re-simulating: _environment closed its environment
        env, obs = _environment(spec, seed, slot, version, state, cache)
    except WorkerFailure as exc:
        return None, exc, state.episode
    except Overtime as exc:  # between the environment's calls: where the task stood
        return None, WorkerFailure(str(exc), where=f"version {version}, slot {slot}, seed {seed}"), state.episode
    try:
        return _collect(env, obs, weights_path, version, slot, seed, steps, state, out_dir,
                        policy or Policy(env.spaces, tuple(hidden)), cache), None, 0  # type: ignore[return-value]
    except (WorkerFailure, Overtime) as exc:
        env.close()  # past the task's start now: a retry re-simulates a new one (the cache no longer holds it)
        if isinstance(exc, Overtime):
            exc = WorkerFailure(str(exc), where=f"version {version}, slot {slot}, seed {seed}, episode {env.episode}")
        return None, exc, env.episode
    except BaseException:
        env.close()
        raise


def _gave_up(exc: WorkerFailure, spec: EnvSpec, seed: int, slot: int, episode: int, attempts: int) -> WorkerFailure:
    """The run-stopping error: the last failure, where it happened and how to reproduce it."""
    tried = "once" if attempts == 1 else f"at each of {attempts} attempts"
    return WorkerFailure(f"{exc.message}, {tried} (train.max_attempts): the run stops",
                         where=exc.where, found=exc.found,
                         hint=f"env {spec}: reproduce it with reset(seed={reset_seed(seed, slot, episode)}) (job seed "
                              f"{seed}, slot {slot}, episode {episode}) and the actions recorded since, as "
                              "memtrain.rl.collect.resimulate does")


def _collect(env: Slot, obs: np.ndarray, weights_path: Path, version: int, slot: int, seed: int, steps: int,
             state: EpisodeState, out_dir: Path, policy: Policy, cache: SlotCache | None) -> Collected:
    if policy.spaces != env.spaces:
        raise InputError("the policy was made for other spaces than the environment's", expected=str(env.spaces),
                         found=str(policy.spaces))
    weights = open_npy(Path(weights_path), dtype=np.float32)
    if weights.shape != (policy.layout.size,):
        raise CorruptFileError("the weights do not fit the policy", path=weights_path,
                               expected=f"shape ({policy.layout.size},) for {_described(policy)} and {env.spaces}",
                               found=f"shape {weights.shape}")
    if not np.isfinite(weights).all():
        raise CorruptFileError("the weights hold NaN or Inf: the policy's actions would be meaningless",
                               path=weights_path, found=f"{int(np.size(weights) - np.isfinite(weights).sum())} "
                               "non-finite values")
    with blas_controller().limit(limits=1):  # one BLAS thread: the same kernels, hence the same bits, in any process
        traj, after, obs = _run(policy, np.asarray(weights), env, version, seed, steps, state, obs)
    path = shard_path(out_dir, version, slot)
    write_shard(path, traj, env.spaces)
    if cache is not None:
        cache.live[slot] = _Live(env, after.key(), obs)
    else:
        env.close()
    return Collected(path, traj, after)


def _described(policy: Policy) -> str:
    return "its torch module" if hasattr(policy, "module") else f"hidden {policy.hidden}"


def _environment(spec: EnvSpec, seed: int, slot: int, version: int, state: EpisodeState,
                 cache: SlotCache | None) -> tuple[Slot, np.ndarray]:
    """The slot's environment at ``state``: the cached live one if it is exactly there, else re-simulated."""
    live = cache.live.pop(slot, None) if cache is not None else None
    if live is not None and live.slot.spec == spec and live.slot.seed == seed and live.key == state.key():
        return live.slot, live.obs
    if live is not None:
        live.slot.close()
    env = Slot(spec, seed, slot)
    try:
        return env, resimulate(env, state, version=version)
    except BaseException:
        env.close()
        raise


def resimulate(env: Slot, state: EpisodeState, *, version: int) -> np.ndarray:
    """Bring ``env`` to ``state`` (its seeded reset, then the recorded actions); the observation it is at.

    The replay must reproduce the episode: an end before the last recorded action, or a different return,
    means the environment is not a function of its reset seed and the actions, and is an error.
    """
    obs, ret = env.reset(state.episode, version=version), 0.0
    for step, action in enumerate(state.actions):
        obs, reward, terminated, truncated = env.step(action, version=version, step=step)
        ret += reward
        if terminated or truncated:
            raise MemtrainError("re-simulating the slot's episode ended it early: the environment does not replay "
                                "from its seeded reset and the recorded actions", where=env.where(version, step),
                                expected=f"{state.step} steps without an end", found=f"an end at step {step}")
    if ret != state.ret:
        raise MemtrainError("re-simulating the slot's episode gave another return: the environment does not replay "
                            "from its seeded reset and the recorded actions", where=env.where(version, state.step),
                            expected=state.ret, found=ret)
    return obs


def _run(policy: Policy, weights: np.ndarray, env: Slot, version: int, seed: int, steps: int,
         state: EpisodeState, obs: np.ndarray) -> tuple[Trajectory, EpisodeState, np.ndarray]:
    rng = action_rng(seed, version, env.slot)
    d = env.spaces.obs_dim
    rec = {"obs": np.zeros((steps, d), np.float32), "next_obs": np.zeros((steps, d), np.float32),
           "rewards": np.zeros(steps), "terminated": np.zeros(steps, bool), "truncated": np.zeros(steps, bool),
           "logp": np.zeros(steps, np.float32), "value": np.zeros(steps, np.float32),
           "next_value": np.zeros(steps, np.float32), "episode_return": np.zeros(steps)}
    acts: list[np.ndarray] = []
    episode, since_reset, ret = state.episode, [state.actions], state.ret
    step_in_episode = state.step
    fwd = policy.forward(weights, obs[None])
    for t in range(steps):
        if t == steps // 2:
            fault_point("rl_mid_collect")  # a test's worker killed half way through its steps
        action = policy.sample(fwd, rng)
        rec["obs"][t], rec["logp"][t], rec["value"][t] = obs, policy.log_prob(fwd, action)[0], fwd.value[0]
        next_obs, reward, terminated, truncated = env.step(action[0], version=version, step=step_in_episode)
        acts.append(action)
        since_reset.append(action)
        ret += reward
        step_in_episode += 1
        rec["next_obs"][t], rec["rewards"][t] = next_obs, reward
        rec["terminated"][t], rec["truncated"][t] = terminated, truncated
        if terminated or truncated:
            rec["next_value"][t] = policy.forward(weights, next_obs[None]).value[0]
            rec["episode_return"][t] = ret
            episode, since_reset, ret, step_in_episode = episode + 1, [], 0.0, 0
            obs = env.reset(episode, version=version)
        else:
            obs = next_obs
        fwd = policy.forward(weights, obs[None])
        if not (terminated or truncated):
            rec["next_value"][t] = fwd.value[0]  # V(next_obs), the same computation as at the next step
    empty = _no_actions(env.spaces)
    actions = np.concatenate(acts) if acts else empty
    after = EpisodeState(episode, np.concatenate([empty, *since_reset]) if since_reset else empty, ret)
    traj = Trajectory(version=version, slot=env.slot, seed=seed, episode=state.episode, step=state.step,
                      actions=actions, **rec)
    return traj, after, obs


def state_after(trajectories: Sequence[Trajectory], spaces: Spaces) -> EpisodeState:
    """A slot's state after its shards ``trajectories`` (consecutive versions, oldest first), rebuilt from what they
    recorded: what a resumed run re-simulates from when its checkpoint does not carry the state.

    Only the shards since the start of the current episode are needed; earlier ones may be left out. An error if
    the shards are not consecutive or do not reach back to the episode's start.
    """
    if not trajectories:
        return EpisodeState.start(spaces)
    episode, actions, ret, known = trajectories[0].episode, [], 0.0, trajectories[0].step == 0
    step = trajectories[0].step
    for traj in trajectories:
        if (traj.episode, traj.step) != (episode, step):
            raise MemtrainError("the slot's shards are not consecutive", where=f"version {traj.version}, slot "
                                f"{traj.slot}", expected=f"episode {episode} at step {step}",
                                found=f"episode {traj.episode} at step {traj.step}")
        for t in range(traj.steps):
            actions.append(traj.actions[t:t + 1])
            ret += float(traj.rewards[t])
            step += 1
            if traj.done[t]:
                episode, actions, ret, step, known = episode + 1, [], 0.0, 0, True
    if not known:
        first = trajectories[0]
        raise MemtrainError("the shards do not reach back to the start of the slot's episode",
                            where=f"version {first.version}, slot {first.slot}",
                            expected="step 0 of the episode", found=f"episode {first.episode} from step {first.step}",
                            hint="pass the slot's shards from the one where its current episode began")
    empty = _no_actions(spaces)
    return EpisodeState(episode, np.concatenate([empty, *actions]), ret)


def advance(state: EpisodeState, traj: Trajectory, spaces: Spaces) -> EpisodeState:
    """The slot's state after ``traj``, the shard collected from ``state``: the same sums, in the same order, as
    the collection task made (so that a re-simulation from it finds the same return)."""
    if (traj.episode, traj.step) != (state.episode, state.step):
        raise MemtrainError("the shard does not continue the slot's episode", where=f"version {traj.version}, slot "
                            f"{traj.slot}", expected=f"episode {state.episode} at step {state.step}",
                            found=f"episode {traj.episode} at step {traj.step}")
    episode, parts, ret = state.episode, [state.actions], state.ret
    start = 0
    for t in range(traj.steps):
        ret += float(traj.rewards[t])
        if traj.done[t]:
            episode, parts, ret, start = episode + 1, [], 0.0, t + 1
    parts.append(traj.actions[start:])
    return EpisodeState(episode, np.concatenate([_no_actions(spaces), *parts]), ret)


def _state_dtype(spaces: Spaces, k: int) -> np.dtype:
    actions = ("<i8", (k,)) if spaces.kind == DISCRETE else ("<f4", (k, spaces.n))
    return np.dtype([("meta", "<i8", (4,)), ("ret", "<f8"), ("actions", *actions)])


def write_state(path: Path, state: EpisodeState, spaces: Spaces, *, version: int, slot: int,
                durable: bool = False) -> None:
    """Publish ``state`` (slot ``slot`` at the start of ``version``) as one .npy record: meta (version, slot,
    episode, step), the return so far, the actions since the seeded reset. Plain arrays: never a pickle."""
    record = np.zeros((), _state_dtype(spaces, state.step))
    record["meta"] = (version, slot, state.episode, state.step)
    record["ret"] = state.ret
    record["actions"] = state.actions
    publish_array(Path(path), record, durable=durable)


def read_state(path: Path, spaces: Spaces, *, version: int | None = None, slot: int | None = None) -> EpisodeState:
    """The state ``write_state`` published, checked: the record's fields, what it was written for, its counters."""
    path = Path(path)
    record = open_npy(path)
    names = record.dtype.names or ()
    if record.shape != () or names != ("meta", "ret", "actions") or record["meta"].shape != (4,):
        raise CorruptFileError("not a slot's episode state", path=path, expected="one record (meta, ret, actions)",
                               found=f"shape {record.shape}, dtype {record.dtype}")
    meta = [int(v) for v in record["meta"]]
    for key, want, found in (("version", version, meta[0]), ("slot", slot, meta[1])):
        if want is not None and found != want:
            raise CorruptFileError(f"the episode state was written for another {key}", path=path,
                                   where=f"meta.{key}", expected=want, found=found)
    if record.dtype != _state_dtype(spaces, max(meta[3], 0)):
        raise CorruptFileError("the episode state's fields do not fit the action space and its step count",
                               path=path, expected=str(_state_dtype(spaces, max(meta[3], 0))), found=str(record.dtype))
    return EpisodeState.from_arrays({"episode": np.array(meta[2]), "step": np.array(meta[3]),
                                     "actions": np.array(record["actions"]), "ret": np.array(record["ret"])},
                                    spaces, where=str(path))
