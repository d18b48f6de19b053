"""`memtrain bench rl`: PPO on CartPole-v1, env steps/s and wall time to a mean return >= 475, side by side.

Sides (each run in a fresh process, ``python -m memtrain.benchmarks.rl_bench SPEC``; seed k+1 in repeat k,
the sides interleaved by ``compare.interleaved``):

- ``sb3_subproc``: Stable-Baselines3 ``PPO("MlpPolicy")`` on ``make_vec_env(n_envs, SubprocVecEnv)``;
- ``sb3_dummy``: the same on ``DummyVecEnv`` (the environments stepped in the learner's process);
- ``cleanrl``: a port of CleanRL's ``ppo.py`` (one process, torch, ``SyncVectorEnv``), as its author wrote it
  but for two settings made equal to the others: the value loss unclipped (SB3's ``clip_range_vf=None`` and
  memtrain have none) and the clip range annealed as the learning rate is (the tuned set's ``lin_0.2``);
- ``memtrain_2`` / ``memtrain_0``: ``memtrain train`` itself (``train_memtrain``): the tuned set written as a job
  file (``memtrain_job``) and run by the command line's entry point, ``memtrain.cli.main(["train", JOB,
  "--workers", N])``, with 2 worker processes / the collection in the server. A thread of the side's process
  follows the run's ``metrics.jsonl`` and applies the stop rule to each version's line; at the target it sends
  the process SIGTERM, which ``memtrain train`` answers as it answers a user's (a checkpoint, then exit 143).

Every side runs the same published tuned hyperparameters (``ZOO``: rl-baselines3-zoo's CartPole-v1 PPO set),
on ``envs`` environment copies x ``steps`` steps per update = the set's 8 x 32 = 256 samples, torch and BLAS
on one thread per process (a 64-64 MLP gains nothing from more), the same budget of env steps (the
learning rate and clip anneal over it), and the same stop rule: after each update's collection, the mean
return of the last 100 episodes that ended; a run stops when it reaches the target (its steps and wall time
from the start of its training, environments and workers included, are its time to the target) or at the
budget ("not reached": no figure is made up).

``exchange`` is not a side: it times one collection task of ``steps`` CartPole steps and the exchange of its
shard (write + publish by rename, then read back and checked), the issue's "share of a collection task".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.benchmarks.compare import Spread, Target, interleaved, median, pairwise
from memtrain.errors import InputError, MemtrainError

SIDES = ("memtrain_2", "memtrain_0", "sb3_subproc", "sb3_dummy", "cleanrl")
LABELS = {"memtrain_2": "memtrain train: 2 workers", "memtrain_0": "memtrain train: 0 workers",
          "sb3_subproc": "SB3 PPO, SubprocVecEnv", "sb3_dummy": "SB3 PPO, DummyVecEnv",
          "cleanrl": "CleanRL-style ppo.py"}
PEERS = ("sb3_subproc", "sb3_dummy", "cleanrl")
NEEDS_SB3 = ("sb3_subproc", "sb3_dummy")
ENV_ID = "CartPole-v1"
WINDOW = 100  # episodes in the mean return that must reach the target
RUN_TIMEOUT = 3600.0
# rl-baselines3-zoo, hyperparams/ppo.yml, CartPole-v1 ("# Tuned"; DLR-RM/rl-baselines3-zoo at 208b6fd):
# n_envs 8, n_timesteps 1e5, n_steps 32, batch_size 256, gae_lambda 0.8, gamma 0.98, n_epochs 20,
# ent_coef 0.0, learning_rate lin_0.001, clip_range lin_0.2. The rest are SB3's PPO defaults, which the set
# keeps: vf_coef 0.5, max_grad_norm 0.5, normalized advantages, Adam eps 1e-5, 64-64 tanh actor and critic.
ZOO = {"source": "rl-baselines3-zoo hyperparams/ppo.yml CartPole-v1", "samples": 256, "budget": 100_000,
       "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0, "lr": 1e-3,
       "clip": 0.2, "vf_coef": 0.5, "max_grad_norm": 0.5, "adam_eps": 1e-5, "hidden": (64, 64)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``bench rl``'s own options (with bench.py's --dir, --repeats, --json)."""
    parser.add_argument("--env-steps", type=int, default=ZOO["budget"],
                        help="the budget of each run in env steps; a run that has not reached the target by then "
                             "reports 'not reached' (default %(default)s: the tuned set's n_timesteps)")
    parser.add_argument("--target", type=float, default=475.0,
                        help=f"mean return of the last {WINDOW} episodes to reach (default %(default)s)")
    parser.add_argument("--envs", type=int, default=2,
                        help="environment copies (memtrain's slots, SB3's n_envs); steps per update = "
                             f"{ZOO['samples']} / envs, the tuned set's samples per update (default %(default)s)")
    parser.add_argument("--sides", help=f"comma-separated subset of {','.join(SIDES)} (default: all)")


def run(args: argparse.Namespace) -> int:
    """``memtrain bench rl``: the table (or JSON)."""
    sides = parse_sides(args.sides)
    settings = _settings(args)
    from memtrain.benchmarks.train_bench import machine

    scratch = Path(tempfile.mkdtemp(prefix="memtrain-bench-rl-", dir=getattr(args, "dir", None)))
    try:
        load_before = os.getloadavg()

        def one(side: str, repeat: int) -> dict[str, Any]:
            return run_once({"side": side, "seed": repeat + 1, "dir": str(scratch / f"{side}-{repeat}")} | settings)

        runs = interleaved([*sides, "exchange"], args.repeats, one)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    exchange = runs.pop("exchange")
    results = summarize(runs)
    report = {"machine": machine() | {"loadavg_before": load_before, "loadavg_after": os.getloadavg()},
              "settings": settings | {"repeats": args.repeats, "sides": sides, "hyperparameters": ZOO},
              "results": results, "exchange": summarize_exchange(exchange), "bits": same_bits(runs),
              "targets": verdicts(results), "runs": runs | {"exchange": exchange}}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def parse_sides(text: str | None) -> list[str]:
    sides = [s.strip() for s in (text or ",".join(SIDES)).split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides:
        raise InputError("unknown --sides for bench rl", expected=", ".join(SIDES), found=", ".join(unknown) or text)
    _check_libraries(sides)
    return sides


def _check_libraries(sides: list[str]) -> None:
    """A clear error before any run when a side's library is missing (never a child's traceback)."""
    from importlib.util import find_spec

    missing = [(name, extra) for name, extra, needed in (
        ("gymnasium", "rl", True), ("torch", "bench-rl", any(s in PEERS for s in sides)),
        ("stable_baselines3", "bench-rl", any(s in NEEDS_SB3 for s in sides))) if needed and find_spec(name) is None]
    if missing:
        names = " and ".join(name for name, _ in missing)
        raise InputError(f"bench rl needs {names}, which {'is' if len(missing) == 1 else 'are'} not installed",
                         hint=f'pip install "memtrain[{missing[-1][1]}]" (or leave those sides out with --sides)')


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    envs, budget = args.envs, args.env_steps
    if envs < 1 or ZOO["samples"] % envs:
        raise InputError("--envs must divide the tuned set's samples per update", expected=f"a divisor of "
                         f"{ZOO['samples']} (8 x 32 in the set)", found=envs)
    steps = ZOO["samples"] // envs
    if budget < ZOO["samples"]:
        raise InputError("--env-steps is less than one update's samples", expected=f">= {ZOO['samples']}",
                         found=budget)
    if args.repeats < 1:
        raise InputError("--repeats must be at least 1", found=args.repeats)
    return {"env": ENV_ID, "envs": envs, "steps": steps, "env_steps": budget, "target": args.target,
            "window": WINDOW}


def run_once(spec: dict[str, Any]) -> dict[str, Any]:
    """One side, one seed, in a fresh process: its JSON result and the CPU seconds of its process tree. Nothing
    samples it from outside (this bench reports no memory): the runs have the machine's cores to themselves."""
    import subprocess

    from memtrain.benchmarks.memory import children_cpu_seconds

    what = f"bench rl {spec['side']} (seed {spec['seed']})"
    cpu_before = children_cpu_seconds()
    try:
        done = subprocess.run([sys.executable, "-m", "memtrain.benchmarks.rl_bench", json.dumps(spec)],
                              capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise MemtrainError(f"{what} took longer than {RUN_TIMEOUT:g} s") from None
    if done.returncode != 0 or not done.stdout.strip():
        raise MemtrainError(f"{what} failed (exit code {done.returncode})", found=done.stderr.strip()[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"seed": spec["seed"],
                                                               "cpu_seconds": children_cpu_seconds() - cpu_before}


# --- the report ---


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per side: env steps/s and time to the target (median, range over the seeds that reached it), and per seed
    the ratios to SB3 with SubprocVecEnv (steps/s) and the faster peer's time over this side's."""
    rate = {side: [steps_per_second(r) for r in results] for side, results in runs.items()}
    reach = {side: [r["reached_seconds"] for r in results] for side, results in runs.items()}
    faster = _faster_peer(reach)
    rows = []
    for side, results in runs.items():
        reached = [s for s in reach[side] if s is not None]
        steps_to = [r["reached_steps"] for r in results if r["reached_steps"] is not None]
        rows.append({"side": side, "label": LABELS[side], "seeds": [r["seed"] for r in results],
                     "env_steps_per_s": Spread.of(rate[side]).as_dict(),
                     "reached": len(reached), "runs": len(results),
                     "seconds_to_target": Spread.of(reached).as_dict() if reached else None,
                     "env_steps_to_target": Spread.of(steps_to).as_dict() if steps_to else None,
                     "last_mean": [r["last_mean"] for r in results],
                     "vs_sb3_subproc": _ratio(rate[side], rate.get("sb3_subproc")),
                     "faster_peer_time_ratio": _ratio(faster, reach[side]) if faster else None,
                     "cpu_seconds": Spread.of([r["cpu_seconds"] for r in results]).as_dict(),
                     "digests": [r.get("digest") for r in results]})
    return rows


def steps_per_second(run: dict[str, Any]) -> float:
    """Env steps/s up to the check that stopped the run: to the target when reached (SB3's callback can stop it
    only after one more update and env step, which are not counted), else over the whole budget."""
    if run["reached_steps"] is not None:
        return run["reached_steps"] / run["reached_seconds"]
    return run["env_steps"] / run["seconds"]


def _faster_peer(reach: dict[str, list[float | None]]) -> list[float | None] | None:
    """Per seed: the shortest time to the target among the peers that reached it that seed (None if none did)."""
    peers = [reach[p] for p in PEERS if p in reach]
    if not peers:
        return None
    return [min((t for t in times if t is not None), default=None) for times in zip(*peers, strict=True)]


def _ratio(numerators: list[float | None] | None, denominators: list[float | None] | None) -> dict[str, Any] | None:
    if numerators is None or denominators is None:
        return None
    spread = pairwise(numerators, denominators)
    return None if spread is None else spread.as_dict()


def same_bits(runs: dict[str, list[dict[str, Any]]]) -> list[bool] | None:
    """Per seed: did memtrain with 2 workers end on the same weight bits as with 0 workers?"""
    if "memtrain_2" not in runs or "memtrain_0" not in runs:
        return None
    return [a["digest"] == b["digest"] for a, b in zip(runs["memtrain_2"], runs["memtrain_0"], strict=True)]


def summarize_exchange(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per repeat's median task: exchange (write + publish + read) / the task's steps, and its share of the task."""
    return {key: Spread.of([r[key] for r in runs]).as_dict()
            for key in ("task_ms", "steps_ms", "write_ms", "read_ms", "exchange_ms", "vs_steps", "share")} | {
        "steps": runs[0]["steps"], "tasks": runs[0]["tasks"], "shard_bytes": runs[0]["shard_bytes"]}


def verdicts(results: list[dict[str, Any]]) -> list[str]:
    """The issue's targets for memtrain with 2 workers: time to the target <= the faster peer's (ratio >= 1 by
    median) and env steps/s >= 2x SB3's with SubprocVecEnv, ratios of runs made side by side with the same seed."""
    lines = []
    for row in (r for r in results if r["side"] == "memtrain_2"):
        for key, name, bound in (("faster_peer_time_ratio", "faster peer's time to target / memtrain's", 1.0),
                                 ("vs_sb3_subproc", "env steps/s, memtrain / SB3 SubprocVecEnv", 2.0)):
            spread = _spread(row[key])
            lines.append(Target(name=name, at_least=bound).verdict(spread) if spread else
                         f"{name}: no figure (no seed where both reached the target)")
    return lines


def _spread(value: dict[str, Any] | None) -> Spread | None:
    if value is None:
        return None
    return Spread(median=value["median"], low=value["low"], high=value["high"], runs=tuple(value["runs"]))


def _text(value: dict[str, Any] | None, digits: int = 2) -> str:
    spread = _spread(value)
    return "-" if spread is None else spread.text(digits)


def _percent(value: dict[str, Any]) -> str:
    spread = Spread.of([100 * v for v in value["runs"]])
    return spread.text(0).replace(" (", "% (") + ("%" if len(spread.runs) < 2 else "")


COLUMNS = ("side", "env copies", "env steps/s", "÷ SB3 Subproc", "reached", "s to target", "env steps to target",
           "faster peer's s ÷ this", "CPU s")


def print_table(report: dict[str, Any]) -> None:
    """The report for people: the table (split to fit a narrow terminal: render.print_table), the exchange, the
    bits, the targets, the machine."""
    from rich.text import Text

    from memtrain.benchmarks.train_bench import machine_caption
    from memtrain.inspection.render import make_console, table
    from memtrain.inspection.render import print_table as print_grid

    s, h = report["settings"], report["settings"]["hyperparameters"]
    title = (f"bench rl: PPO on {s['env']} to a mean return >= {s['target']:g} over the last {s['window']} episodes, "
             f"budget {s['env_steps']:,} env steps; {h['source']} (n_envs x n_steps {h['samples']} as "
             f"{s['envs']} x {s['steps']}, batch {h['batch_size']}, {h['n_epochs']} epochs, gamma {h['gamma']}, "
             f"lambda {h['gae_lambda']}, ent {h['ent_coef']}, lr lin_{h['lr']:g}, clip lin_{h['clip']:g}, vf "
             f"{h['vf_coef']}, grad norm {h['max_grad_norm']}, Adam eps {h['adam_eps']:g}) on every side; median "
             f"(range) over seeds 1-{s['repeats']}, interleaved; ratios per seed")
    rows = []
    for r in report["results"]:
        copies = f"{s['envs']}" + (", 2 workers" if r["side"] == "memtrain_2" else "")
        steps_to = _text(r["env_steps_to_target"], 0) if r["reached"] else "not reached"
        rows.append((r["label"], copies, _text(r["env_steps_per_s"], 0), _text(r["vs_sb3_subproc"]),
                     f"{r['reached']}/{r['runs']}", _text(r["seconds_to_target"], 1) if r["reached"] else "not reached",
                     steps_to, _text(r["faster_peer_time_ratio"]), _text(r["cpu_seconds"], 1)))
    console = make_console()
    print_grid(console, table(title, COLUMNS, rows, right=COLUMNS[1:], keys=1))
    for line in [*_notes(report), *report["targets"], machine_caption(report["machine"])]:
        console.print(Text(line))


def _notes(report: dict[str, Any]) -> list[str]:
    x, lines = report["exchange"], []
    lines.append(f"exchange of one shard ({x['steps']} steps, {x['shard_bytes']:,} bytes, one file): write + publish "
                 f"{_text(x['write_ms'])} ms, read + check {_text(x['read_ms'])} ms = {_text(x['vs_steps'])}x the "
                 f"task's {x['steps']} steps ({_text(x['steps_ms'])} ms): {_percent(x['share'])} of a collection task "
                 f"with its read (median task of {x['tasks']} per repeat)")
    if report["bits"] is not None:
        same = report["bits"]
        verdict = "the same bits" if all(same) else "DIFFER"
        lines.append(f"weights of memtrain train with 2 workers and with 0 at the stop: {verdict} for "
                     f"{sum(same)}/{len(same)} seeds")
    if any(r["side"].startswith("memtrain") for r in report["results"]):
        lines.append("memtrain: `memtrain train JOB --workers N` (the command line's entry point in the side's "
                     "process), the tuned set as its job, stopped by SIGTERM at the target; its time includes the "
                     "update that follows the target version's collection")
    return lines


# --- the child process: one side, one seed ---


@dataclass
class Progress:
    """The stop rule every side applies after each update's collection: the mean return of the last
    ``window`` episodes that ended reaches ``target``, or the budget is spent."""

    target: float
    window: int
    started: float
    returns: list[float]
    reached_steps: int | None = None
    reached_seconds: float | None = None

    @classmethod
    def start(cls, spec: dict[str, Any]) -> Progress:
        return cls(spec["target"], spec["window"], time.perf_counter(), [])

    def after_collection(self, env_steps: int, ended: Any) -> bool:
        """Add the returns of the episodes that ended; True once the target is reached (the run stops)."""
        self.returns.extend(float(r) for r in ended)
        last = self.returns[-self.window:]
        if self.reached_steps is None and len(last) == self.window and float(np.mean(last)) >= self.target:
            self.reached_steps, self.reached_seconds = env_steps, time.perf_counter() - self.started
        return self.reached_steps is not None

    def result(self, env_steps: int, **extra: Any) -> dict[str, Any]:
        last = self.returns[-self.window:]
        return {"env_steps": env_steps, "seconds": time.perf_counter() - self.started,
                "reached_steps": self.reached_steps, "reached_seconds": self.reached_seconds,
                "episodes": len(self.returns), "last_mean": float(np.mean(last)) if last else None} | extra


def memtrain_job(spec: dict[str, Any], run_dir: Path) -> str:
    """The tuned set as ``memtrain train``'s job file (TOML): no evaluation (no peer evaluates), the rest the
    defaults a user gets (checkpoints every 10 versions, the run's records)."""
    tables = {"env": {"id": spec["env"], "slots": spec["envs"], "steps": spec["steps"]},
              "model": {"kind": "mlp", "hidden": list(ZOO["hidden"])},
              "train": {"algorithm": "ppo", "env_steps": spec["env_steps"], "gamma": ZOO["gamma"],
                        "gae_lambda": ZOO["gae_lambda"], "clip": ZOO["clip"], "epochs": ZOO["n_epochs"],
                        "minibatches": ZOO["samples"] // ZOO["batch_size"], "ent_coef": ZOO["ent_coef"],
                        "vf_coef": ZOO["vf_coef"], "max_grad_norm": ZOO["max_grad_norm"], "norm_adv": True,
                        "anneal_lr": True, "anneal_clip": True, "optimizer": "adam", "lr": ZOO["lr"],
                        "eps": ZOO["adam_eps"], "seed": spec["seed"], "eval_every": 0},
              "run": {"dir": str(run_dir)}}
    return "".join(f"[{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in table.items()) + "\n"
                   for name, table in tables.items())


class Follow:
    """A thread that follows a run's ``metrics.jsonl`` and applies ``progress``'s stop rule to each version's line
    (its ``env_steps_total`` and ``episode_returns``: the episodes that ended, in slot order); at the target it
    sends this process SIGTERM (unless the line is the run's last: the run ends by itself)."""

    POLL = 0.01  # seconds between looks at the file: the time to the target is at most this late

    def __init__(self, metrics: Path, progress: Progress, last: int):
        import threading

        self.metrics, self.progress, self.last = metrics, progress, last
        self.line: dict[str, Any] | None = None  # the last version line the rule was applied to
        self.stopped = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="bench-rl-follow", daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        import signal

        offset, held = 0, b""
        while True:
            # ``done`` is checked before the read: once the run has ended, one more read takes every line it wrote
            # (stopping at ``done`` alone left the last lines unread, and 0 and 2 workers compared different versions)
            finished = self.done.is_set()
            try:
                with open(self.metrics, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except FileNotFoundError:
                data = b""
            offset += len(data)
            *lines, held = (held + data).split(b"\n")  # a line is whole once its newline is written
            for text in lines:
                self.line = json.loads(text)
                if self.progress.after_collection(self.line["env_steps_total"], self.line["episode_returns"]):
                    if self.line["version"] != self.last:
                        self.stopped = True
                        os.kill(os.getpid(), signal.SIGTERM)  # memtrain train's stop: a checkpoint, then exit 143
                    return
            if finished:
                return
            self.done.wait(self.POLL)

    def join(self) -> None:
        self.done.set()
        self.thread.join()


def train_memtrain(spec: dict[str, Any], progress: Progress, workers: int) -> dict[str, Any]:
    """``memtrain train`` on the tuned set's job with ``workers`` workers, stopped at the target: its figures and
    the checksum of the weights learned from the version that stopped it (its lineage's record)."""
    import signal

    from memtrain import cli
    from memtrain.files import read_sealed_jsonl
    from memtrain.layout import RUN_LINEAGE, RUN_METRICS

    folder = Path(spec["dir"])
    folder.mkdir(parents=True)
    job, run_dir = folder / "job.toml", folder / "run"
    job.write_text(memtrain_job(spec, run_dir))
    follow = Follow(run_dir / RUN_METRICS, progress, spec["env_steps"] // (spec["envs"] * spec["steps"]) - 1)
    code = cli.main(["train", str(job), "--workers", str(workers), "--quiet"])
    follow.join()
    if code != (128 + signal.SIGTERM if follow.stopped else 0) or follow.line is None:
        raise MemtrainError(f"bench rl: memtrain train ended with exit code {code}", path=run_dir)
    lineage, _ = read_sealed_jsonl(run_dir / RUN_LINEAGE, what="lineage record")
    digest = next(r["checksum"] for r in lineage if r["version"] == follow.line["version"] + 1)
    return progress.result(progress.reached_steps or follow.line["env_steps_total"], digest=digest)


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    side = spec["side"]
    if side == "exchange":
        return exchange(spec)
    if side.startswith("memtrain"):
        return train_memtrain(spec, Progress.start(spec), workers=int(side.split("_")[1]))
    import torch

    torch.set_num_threads(1)
    from memtrain.benchmarks import rl_peers

    return rl_peers.sb3(spec, Progress.start(spec)) if side in NEEDS_SB3 else rl_peers.cleanrl(spec,
                                                                                                Progress.start(spec))


def exchange(spec: dict[str, Any], tasks: int = 30) -> dict[str, Any]:
    """One collection task of ``steps`` steps against the exchange of its shard: medians of ``tasks`` tasks."""
    from memtrain.files import publish_array
    from memtrain.rl.collect import EpisodeState, SlotCache, blas_controller, collect
    from memtrain.rl.envs import EnvSpec, Slot
    from memtrain.rl.policy import Policy
    from memtrain.rl.trajectory import read_shard, shard_path, write_shard

    env, folder = EnvSpec(id=spec["env"]), Path(spec["dir"])
    folder.mkdir(parents=True)
    spaces = Slot(env, spec["seed"], 0).spaces
    weights = folder / "v0.npy"
    publish_array(weights, Policy(spaces, ZOO["hidden"]).init(np.random.default_rng(spec["seed"])), durable=False)
    state, cache, times = EpisodeState.start(spaces), SlotCache(), []
    try:
        for version in range(tasks):
            started = time.perf_counter()
            done = collect(weights, version, 0, env, spec["seed"], spec["steps"], state, out_dir=folder,
                           hidden=ZOO["hidden"], cache=cache)
            task = time.perf_counter() - started
            state, again = done.state, folder / "again.npy"
            started = time.perf_counter()
            write_shard(again, done.trajectory, spaces)  # the task's own write, timed apart
            write = time.perf_counter() - started
            started = time.perf_counter()
            with blas_controller().limit(limits=1):
                read_shard(shard_path(folder, version, 0), spaces=spaces, version=version, slot=0,
                           seed=spec["seed"], steps=spec["steps"])
            times.append((task, write, time.perf_counter() - started))
    finally:
        cache.close()
    task, write, read = (median([t[k] for t in times]) * 1e3 for k in range(3))
    steps = task - write
    return {"tasks": tasks, "steps": spec["steps"], "shard_bytes": os.path.getsize(again), "task_ms": task,
            "steps_ms": steps, "write_ms": write, "read_ms": read, "exchange_ms": write + read,
            "vs_steps": (write + read) / steps, "share": (write + read) / (task + read)}


if __name__ == "__main__":
    print(json.dumps(run_child(json.loads(sys.argv[1]))))
