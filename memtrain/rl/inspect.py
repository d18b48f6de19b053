"""``memtrain inspect RUN`` of a reinforcement-learning run: the job, where the run stands, one row per version
(its metrics line and its lineage: how many shards, collected at which version), the checkpoints.

Safe on a live run, as the supervised view is: it reads the logs (a torn last line skipped) and lists names.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from memtrain.errors import MemtrainError
from memtrain.files import read_json, read_jsonl, read_sealed_jsonl, unseal
from memtrain.inspection.tensor_view import SCHEMA
from memtrain.layout import CHECKPOINT_META, RUN_JOB, RUN_LINEAGE, RUN_METRICS, weight_versions
from memtrain.rl.server import checkpoints

SHOWN = ("return_mean", "return_min", "return_max", "return_last100_mean", "length_mean", "env_steps_per_s",
         "approx_kl", "clip_fraction", "entropy", "value_loss", "explained_variance", "eval_return_mean")


def rl_run_view(run: Path) -> dict[str, Any]:
    """The plain-dict view (what ``--json`` prints)."""
    problems: list[str] = []
    job: dict[str, Any] = {}
    try:
        job = read_json(run / RUN_JOB, what="the run's job record").get("job", {})
    except (MemtrainError, AttributeError) as exc:
        problems.append(str(exc))
    lineage, damaged = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage record")
    problems += [str(exc) for exc in damaged]
    made = {r["version"]: r for r in lineage if isinstance(r.get("version"), int)}
    rows, lines = [], read_jsonl(run / RUN_METRICS)
    for line in lines:
        version = line.get("version")
        record = made.get(version + 1, {}) if isinstance(version, int) else {}
        shards = record.get("shards", [])
        rows.append({"version": version, **{key: line.get(key) for key in SHOWN}, "episodes": line.get("episodes"),
                     "shards": len(shards), "collected_at": sorted({s.get("version") for s in shards}) or None})
    env, train = job.get("env", {}), job.get("train", {})
    budget = train.get("env_steps")
    per_version = env.get("slots", 8) * env.get("steps", 128)
    versions = budget // per_version if isinstance(budget, int) else None
    collected = [s for r in lineage for s in r.get("shards", [])]
    if versions is not None and train.get("mode") == "async":
        versions, per_version = versions * env.get("slots", 8), env.get("steps", 128)  # a version is one shard
    elif versions is not None:
        versions += int(train.get("staleness", 0))  # staleness 1: one more version, on the last shards
    return {"schema": SCHEMA, "kind": "rl-run", "path": str(run), "job": job, "record_problems": problems,
            "progress": {"versions_done": max(made, default=0), "versions": versions,
                         "env_steps_done": len(collected) * env.get("steps", 128)},
            "versions": rows, "weights": weight_versions(run), "checkpoints": checkpoints(run),
            "best": best_evaluation(lines, checkpoints(run))}


def best_evaluation(lines: list[dict[str, Any]], kept: list[int]) -> dict[str, Any] | None:
    """The version whose greedy evaluation return is the highest (the earliest of equals), by the rule the run keeps
    it by (server._version_done: ``monitor.improves``), and whether its checkpoint is on disk; None if the run has
    evaluated nothing."""
    from memtrain.train.server.monitor import improves

    best: dict[str, Any] | None = None
    for line in lines:
        if isinstance(line.get("eval_version"), int) and improves(
                line.get("eval_return_mean"), (best or {}).get("eval_return_mean"), "max"):
            best = {"version": line["eval_version"], "eval_return_mean": line["eval_return_mean"]}
    return None if best is None else best | {"checkpoint": best["version"] in kept}


def render_rl_run(view: dict[str, Any], console: Any) -> None:
    from memtrain.inspection.render import lines, print_table, table

    job, progress = view["job"], view["progress"]
    env, train, model = job.get("env", {}), job.get("train", {}), job.get("model", {})
    lines(console, [
        ("run", view["path"]),
        ("kind", "reinforcement learning"),
        ("environment", f"{env.get('id') or env.get('factory')}: {env.get('slots')} slots x {env.get('steps')} steps"),
        ("algorithm", f"{train.get('algorithm', 'ppo')}, model {model.get('kind', 'mlp')}"),
        ("progress", f"versions {progress['versions_done']}/{progress['versions']}, "
                     f"{progress['env_steps_done']:,} env steps"),
        ("weight versions on disk", ", ".join(map(str, view["weights"])) or "none"),
        ("checkpoints", ", ".join(map(str, view["checkpoints"])) or "none"),
        ("best evaluation", _best_line(view.get("best"))),
    ])
    columns = ("version", "episodes", "return mean", "min", "max", "last 100", "length", "steps/s", "approx KL",
               "clip frac", "entropy", "value loss", "expl. var", "eval of v+1")
    keys = ("version", "episodes", "return_mean", "return_min", "return_max", "return_last100_mean", "length_mean",
            "env_steps_per_s", "approx_kl", "clip_fraction", "entropy", "value_loss", "explained_variance",
            "eval_return_mean")
    rows = [tuple(row.get(key) if row.get(key) is not None else "" for key in keys) for row in view["versions"]]
    print_table(console, table("versions", columns, rows, right=columns))
    for problem in view["record_problems"]:
        console.print(f"record problem: {problem}")


def _best_line(best: dict[str, Any] | None) -> str:
    if best is None:
        return "none (train.eval_every = 0, or no evaluation yet)"
    kept = "its checkpoint kept" if best["checkpoint"] else "its checkpoint not on disk"
    return f"version {best['version']}: greedy return {best['eval_return_mean']:g} ({kept})"


def rl_lineage_view(run: Path, version: int) -> dict[str, Any]:
    """``inspect RUN --lineage VERSION`` of an RL run: the version's parent, the shards it was learned from (slot,
    the version each was collected at, checksum), its optimizer steps and checksum."""
    from memtrain.errors import InputError

    lineage, damaged = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage record")
    made = {r["version"]: r for r in lineage if isinstance(r.get("version"), int)}
    if version not in made:
        raise InputError(f"weight version {version} is not in the run's lineage", path=run / RUN_LINEAGE,
                         expected=f"a version from 0 to {max(made, default=0)}", found=version)
    record = made[version]
    return {"schema": SCHEMA, "kind": "rl-lineage", "path": str(run), "version": version,
            "on_disk": version in weight_versions(run), "parent": record.get("parent"),
            "seed": record.get("seed"), "optimizer_steps": record.get("optimizer_steps"),
            "shards": record.get("shards", []), "checksum": record.get("checksum"),
            "record_problems": [str(exc) for exc in damaged]}


def render_rl_lineage(view: dict[str, Any], console: Any) -> None:
    from memtrain.inspection.render import lines, print_table, table

    origin = (f"the initialisation (seed {view['seed']})" if view["parent"] is None else
              f"{view['optimizer_steps']} optimizer steps from version {view['parent']}, on the shards below")
    lines(console, [("run", view["path"]),
                    ("version", f"{view['version']} ({'on disk' if view['on_disk'] else 'retired: not on disk'})"),
                    ("origin", origin), ("recorded checksum", view["checksum"])])
    if view["shards"]:
        rows = [(s.get("slot"), s.get("version"), s.get("checksum")) for s in view["shards"]]
        print_table(console, table("trajectory shards, in the order they were learned from",
                                   ("slot", "collected at version", "checksum"), rows,
                                   right=("slot", "collected at version")))


def rl_checkpoint_view(folder: Path) -> dict[str, Any]:
    """``inspect`` of one checkpoint directory of an RL run: its version, optimizer steps and files."""
    meta = unseal(read_json(folder / CHECKPOINT_META, what="checkpoint meta"), path=folder / CHECKPOINT_META,
                  what="checkpoint meta")
    return {"schema": SCHEMA, "kind": "rl-checkpoint", "path": str(folder), "version": meta.get("version"),
            "optimizer_steps": meta.get("step"), "slots": meta.get("slots"), "checksums": meta.get("files", {})}


def render_rl_checkpoint(view: dict[str, Any], console: Any) -> None:
    from memtrain.inspection.render import lines, print_table, table

    lines(console, [("checkpoint", view["path"]), ("kind", "reinforcement learning"),
                    ("weight version", view["version"]), ("optimizer steps", view["optimizer_steps"]),
                    ("slots", view["slots"])])
    print_table(console, table("files", ("file", "checksum"), sorted(view["checksums"].items())))


def rl_checks(target: Any) -> list[Any]:
    """``inspect --verify`` of an RL run, one of its checkpoints or files: every sealed record and every file whose
    checksum a record holds (job.json, params.json, the lineage's lines; each checkpoint's files against its
    meta.json; each weight version on disk against the lineage)."""
    from memtrain.inspection.verify import Check, hash_check, lineage_checksums, sealed_checks, weights_check
    from memtrain.rl.server import checkpoint_dir, read_run_job

    run = target.run

    def checkpoint(folder: Path) -> list[Check]:
        try:
            files = rl_checkpoint_view(folder)["checksums"]
        except MemtrainError as exc:
            return [Check(folder / CHECKPOINT_META, "unreadable", "a sealed meta.json", str(exc))]
        return [hash_check(folder / name, expected, gone_ok=False) for name, expected in sorted(files.items())]

    if target.kind == "checkpoint":
        return checkpoint(target.path)
    if target.kind == "npy" and target.checkpoint is not None:
        return [c for c in checkpoint(target.checkpoint) if c.path == target.path]
    if target.kind == "weights":
        return [weights_check(run, target.version, lineage_checksums(run), gone_ok=False)]
    checks, _ = sealed_checks(run, job=lambda: read_run_job(run))
    for version in checkpoints(run):
        checks += checkpoint(checkpoint_dir(run, version))
    recorded = lineage_checksums(run)
    checks += [weights_check(run, version, recorded, gone_ok=True) for version in weight_versions(run)]
    return checks


def rl_source_tensors(target: Any, which: str | None = "last") -> tuple[Any, dict[str, Any] | None]:
    """What ``inspect --export`` and ``--diff`` read of an RL run or checkpoint (the supervised
    ``tensors.source_tensors``' counterpart): the checkpoint's weights named by the run's ``params.json`` (the numpy
    actor-critic's layers, a torch module's state_dict keys) and its meta.

    Of a run, ``which``: "last" the newest complete checkpoint; "best" the best greedy evaluation's (an error if
    the run records none or it was pruned); None (``--export``'s default) the best's if the run has it, else the
    newest, with a note saying why. A checkpoint's files are checked against their checksums first. A ``.npy`` of a
    checkpoint: its array(s), no meta."""
    from memtrain.errors import InputError
    from memtrain.inspection.tensors import run_layout, with_layout
    from memtrain.layout import CHECKPOINT_WEIGHTS, RUN_PARAMS
    from memtrain.rl.server import checkpoint_dir, job_policy, load_checkpoint, read_checkpoint, read_run_job

    run = target.run
    job = read_run_job(run)
    policy = job_policy(job)
    if target.kind == "checkpoint":
        folder = target.path
        read_checkpoint(folder, job, policy)  # every checksum, or CorruptFileError naming the file
    elif target.kind == "run":
        newest = load_checkpoint(run, job, policy)
        folder = checkpoint_dir(run, newest.version)
        if which != "last" and newest.best is not None:
            best = checkpoint_dir(run, newest.best["version"])
            try:
                read_checkpoint(best, job, policy)
                folder = best
            except MemtrainError as exc:
                reason = (f"the checkpoint of the best evaluation (version {newest.best['version']}) was pruned "
                          f"(run.keep_best = false) or is damaged ({exc})")
                if which == "best":
                    raise InputError(reason, path=best, hint="run.keep_best = true keeps it; --which last exports "
                                                             "the newest checkpoint") from exc
                print(f"memtrain inspect: note: {reason}: using the newest checkpoint, {folder.name}, instead",
                      file=sys.stderr)
        elif which == "best":
            raise InputError("the run records no best evaluation", path=run,
                             found=f"train.eval_every = {job.rl.eval_every}",
                             hint="train.eval_every = N evaluates the greedy policy every N versions; --which last "
                                  "exports the newest checkpoint")
    else:  # one of a checkpoint's files: named by the layout if it fits it (the weights, an optimizer state)
        return with_layout(target.path, run_layout(run), run / RUN_PARAMS, strict=False), None
    meta = unseal(read_json(folder / CHECKPOINT_META, what="checkpoint meta"), path=folder / CHECKPOINT_META,
                  what="checkpoint meta")
    return with_layout(folder / CHECKPOINT_WEIGHTS, run_layout(run), run / RUN_PARAMS, strict=True), meta
