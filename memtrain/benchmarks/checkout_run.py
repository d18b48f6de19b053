"""A benchmark job as plain JSON -> run by whichever memtrain this interpreter imports -> its timings, as JSON.

The one place the benchmarks turn a problem into a memtrain job and run it (``bench train``'s memtrain
methods through memtrain_run.py, ``bench async``'s modes), so that the same code can run another
checkout's memtrain: ``bench train --against PATH`` / ``bench async --against PATH`` start this file as
a script, ``python -P .../checkout_run.py SPEC_JSON``, with ``PYTHONPATH=PATH`` and their working
directory in the scratch folder, so that ``import memtrain`` (here, in the run's workers and in anything
they start) is PATH's. The result names the ``memtrain`` it imported (``memtrain_file``), and the harness
checks it (``check_imported``).

So this file may import only what every memtrain the benchmarks compare with has (30339bc on):
``memtrain.config`` (Job, DataConfig, ModelConfig, TrainConfig, RunConfig), ``memtrain.train.optim``'s
OptimizerConfig, ``train`` and ``read_lineage`` (``memtrain.train.server.server`` and
``memtrain.train.records.lineage`` since train/ has folders, ``memtrain.train.server`` and ``memtrain.train.lineage``
before: ``MOVED`` says where each was), ``memtrain.files.read_jsonl`` and ``memtrain.layout``'s RUN_METRICS and
RUN_EVENTS; and it only passes ``[train]`` keys
that checkout knows (``train_keys``): a key in ``spec["train_if_known"]`` is left out where it is not known
(its value is what such a checkout does anyway, e.g. train.shuffle = "batches" before row shuffling); any
other unknown key is an error, never dropped.

Spec: {"dataset", "hidden", "epochs", "batch", "tasks", "workers", "seed", "optimizer": {...}, "exchange",
"cluster", "run_dir", "train": {TrainConfig field: value}, "train_if_known": {...}, "lineage": bool,
"quiet": bool (no progress on stderr: bench async), "data_limit_bytes": int | null}.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

# where a name this file uses lives, newest layout first (train/ got folders after ff71786)
MOVED = {"train": ("memtrain.train.server.server", "memtrain.train.server"),
         "read_lineage": ("memtrain.train.records.lineage", "memtrain.train.lineage")}
NEVER = 10_000  # checkpoint_every in epochs: no checkpoint but the last (the peers write none)
# [run] keys passed where the checkout knows them: no best epoch's checkpoint staged at each improving epoch
# (run.keep_best's default became true after ff71786, false there without train.patience: left to the
# default, the two checkouts ran different jobs, one copying the best epoch's files at every epoch)
RUN_IF_KNOWN = {"keep_best": False}
DECIDED = re.compile(r"rounds: (?:(?:on|in) .*? from update (\d+)|on \d+ worker processes \(|in the server \()")


class UnknownKey(ValueError):
    """A [train] key this memtrain does not know, whose value would change the work."""


def train_keys(known: set[str], train: dict[str, Any], if_known: dict[str, Any]) -> dict[str, Any]:
    """The [train] fields to pass: every one of ``train`` (UnknownKey if ``known`` lacks one), and those of
    ``if_known`` that ``known`` has.

    >>> train_keys({"epochs", "seed"}, {"epochs": 2}, {"shuffle": "batches"})
    {'epochs': 2}
    """
    unknown = sorted(set(train) - known)
    if unknown:
        raise UnknownKey(f"this memtrain has no train.{unknown[0]} (asked for {train[unknown[0]]!r})")
    return {**{k: v for k, v in if_known.items() if k in known}, **train}


def imported(name: str, modules: tuple[str, ...] | None = None) -> Any:
    """``name`` from the first of ``modules`` (default ``MOVED[name]``) that this memtrain has."""
    for module in modules or MOVED[name]:
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        if hasattr(found, name):
            return getattr(found, name)
    raise ImportError(f"this memtrain has no {name} in any of {', '.join(modules or MOVED[name])}")


def job_for(spec: dict[str, Any]) -> Any:
    """The memtrain job of ``spec`` (bench train's MLP unless ``spec["model"]``), as this memtrain spells it."""
    from memtrain.config import DataConfig, Job, ModelConfig, RunConfig, TrainConfig
    from memtrain.train.optim import OptimizerConfig

    known = {f.name for f in dataclasses.fields(TrainConfig)}
    run_known = {f.name for f in dataclasses.fields(RunConfig)}
    train = train_keys(known, spec.get("train", {}), spec.get("train_if_known", {}))
    model = spec.get("model") or {"kind": "mlp", "options": {"hidden": [spec["hidden"]]}}
    return Job(
        data=DataConfig(path=Path(spec["dataset"]), normalize=False),
        model=ModelConfig(model["kind"], dict(model["options"])),
        train=TrainConfig(**{"epochs": spec["epochs"], "batch_size": spec["batch"], "tasks_per_update": spec["tasks"],
                             "workers": spec["workers"], "seed": spec["seed"],
                             "optimizer": OptimizerConfig(**spec["optimizer"]), **train}),
        run=RunConfig(dir=Path(spec["run_dir"]), exchange=spec.get("exchange", "auto"), keep_versions=2,
                      checkpoint_every=NEVER, cluster=spec.get("cluster", ""),
                      **{key: value for key, value in RUN_IF_KNOWN.items() if key in run_known}),
    )


def decided_at(events: str) -> int | None:
    """The update from which the placement's choice holds (0 when train.workers forced it), or None yet."""
    for match in DECIDED.finditer(events):
        return int(match.group(1)) if match.group(1) else 0
    return None


def run_job(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the job to its end and read back its update records, events, validation (how many epochs evaluated,
    the last one's figures) and, if asked, staleness."""
    import memtrain
    from memtrain.files import read_jsonl
    from memtrain.layout import RUN_EVENTS, RUN_METRICS
    train = imported("train")

    job = job_for(spec)
    run_dir = job.run.dir
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.perf_counter()
    try:
        train(job, quiet=spec.get("quiet", False))
        total = time.perf_counter() - started
        metrics = read_jsonl(run_dir / RUN_METRICS)
        records = [r for r in metrics if r.get("kind") == "update"]
        epochs = [r for r in metrics if r.get("kind") == "epoch"]
        events = (run_dir / RUN_EVENTS).read_text(encoding="utf-8")
        staleness, discarded = [], 0
        if spec.get("lineage"):
            lineage = imported("read_lineage")(run_dir)
            staleness = [s for step in lineage.steps for s in step.staleness]
            discarded = sum(step.discarded for step in lineage.steps)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {"memtrain_file": memtrain.__file__, "total_seconds": total, "decided_at": decided_at(events) or 0,
            "records": [{k: r.get(k) for k in ("update", "time", "compute_s")} for r in records],
            "events": events.splitlines(), "staleness": staleness, "discarded": discarded,
            "val_passes": sum("val_loss" in r for r in epochs), "final": validation_of(epochs[-1] if epochs else {})}


def validation_of(epoch: dict[str, Any]) -> dict[str, float]:
    """An epoch record's validation figures that every method reports (``val_loss``, ``val_accuracy``)."""
    return {key: epoch[key] for key in ("val_loss", "val_accuracy") if key in epoch}


def check_imported(result: dict[str, Any], root: Path, what: str) -> None:
    """Raise RuntimeError unless the run imported memtrain from checkout ``root``."""
    imported = Path(result.get("memtrain_file") or "").resolve()
    if not imported.is_relative_to(root.resolve()):
        raise RuntimeError(f"{what} imported memtrain from {imported}, not from {root}")


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    limit = spec.get("data_limit_bytes")
    if limit:  # private (anonymous) memory only: file maps are MAP_SHARED and not counted
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        result = run_job(spec)
    except UnknownKey as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result["self_maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
