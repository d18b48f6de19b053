"""A target -> every file it records a checksum for, re-hashed: ok, mismatch, missing (or gone, on a live run).

What is checked: a dataset's shards against ``manifest.json``; a checkpoint's files against its
``meta.json``; a run's checkpoints, and each weight version still on disk against ``lineage.jsonl``
(plus the dataset's shards with ``dataset=True``). A file a live run retires between listing and hashing
(an old weight version, a pruned checkpoint) is reported as ``gone``, not as a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from memtrain.dataset import read_manifest, shard_file
from memtrain.errors import CorruptFileError, InputError, MemtrainError
from memtrain.files import checksum_algo, checksum_file, read_sealed_jsonl
from memtrain.inspection.detect import Target
from memtrain.layout import (
    CHECKPOINT_META,
    MANIFEST,
    RUN_JOB,
    RUN_LINEAGE,
    RUN_PARAMS,
    checkpoint_path,
    checkpoint_updates,
    weight_versions,
    weights_path,
)
from memtrain.train.records.checkpoint import read_meta
from memtrain.train.records.lineage import read_lineage
from memtrain.train.records.record import recorded_job
from memtrain.train.records.run_dir import read_params, run_is_live

FAILURES = ("mismatch", "missing", "unreadable", "discontinuous")
# How long a failing checkpoint of a run gets to disappear before its failure counts: a live run prunes
# old checkpoints with rmtree, which removes the files one by one before the directory itself.
PRUNE_GRACE = 1.0


@dataclass(frozen=True)
class Check:
    """One file's verdict. status: ok | mismatch | missing | unreadable | discontinuous | gone | unrecorded.

    ``discontinuous``: the lineage's intact lines do not run from version 0 to the newest checkpoint's (a lost
    or repeated line): not a checksum that differs, so not worded as one."""

    path: Path
    status: str
    expected: str | None = None
    found: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in FAILURES

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "status": self.status, "expected": self.expected, "found": self.found}

    def message(self) -> str:
        text = {"mismatch": "checksum mismatch: the file changed since it was written",
                "missing": "file is missing", "unreadable": "cannot be read",
                "discontinuous": "the lineage is not continuous"}.get(self.status, self.status)
        return f"{self.path}: {text} (expected {self.expected}, found {self.found})"


def verify(target: Target, *, dataset: bool = False) -> list[Check]:
    """Re-hash every file ``target`` records a checksum for."""
    if target.kind == "dataset":
        return dataset_checks(target.path)
    if target.kind == "checkpoint":
        return checkpoint_checks(target.path)
    if target.kind == "run":
        return run_checks(target.path, dataset=dataset)
    if target.kind == "weights" and target.run is not None:
        return [weights_check(target.run, target.version, lineage_checksums(target.run), gone_ok=False)]
    if target.kind == "npy" and target.checkpoint is not None:
        return [c for c in checkpoint_checks(target.checkpoint) if c.path == target.path]
    return [Check(target.path, "unrecorded")]


def hash_check(path: Path, expected: str | None, *, gone_ok: bool) -> Check:
    if expected is None:
        return Check(path, "unrecorded")
    try:
        found = checksum_file(path, algo=checksum_algo(expected))
    except FileNotFoundError:
        return Check(path, "gone" if gone_ok else "missing", expected, "no file")
    except OSError as exc:
        return Check(path, "unreadable", expected, exc.strerror or str(exc))
    return Check(path, "ok" if found == expected else "mismatch", expected, found)


def dataset_checks(root: Path) -> list[Check]:
    manifest = read_manifest(root)
    try:
        records = [(shard_file(root, shard[part], where=f"splits.{name}.shards[{i}].{part}"),
                    shard.get(f"{part}_checksum")) for name, split in manifest["splits"].items()
                   for i, shard in enumerate(split["shards"]) for part in ("x", "y")]
    except (KeyError, TypeError, AttributeError) as exc:
        raise CorruptFileError(f"manifest has a missing or malformed shard list ({exc})", path=root / MANIFEST,
                               where="splits") from exc
    return [hash_check(path, checksum, gone_ok=False) for path, checksum in records]


def checkpoint_checks(path: Path, *, prunable: Callable[[], bool] | None = None) -> list[Check]:
    """``prunable``: whether a live run may be deleting this checkpoint; if so, its failures become ``gone``."""
    checks = list(_checkpoint_checks(path))
    failed = prunable is not None and any(c.failed for c in checks)
    if failed and (not path.exists() or (prunable() and vanishes(path))):
        checks = [Check(c.path, "gone", c.expected, c.found) for c in checks]
    return checks


def _checkpoint_checks(path: Path) -> Iterator[Check]:
    try:
        meta = read_meta(path)
    except MemtrainError as exc:
        yield Check(path / CHECKPOINT_META, "unreadable", "a readable meta.json", str(exc))
        return
    for name, record in meta.get("files", {}).items():
        yield hash_check(path / name, record.get("checksum"), gone_ok=False)


def vanishes(path: Path, within: float = PRUNE_GRACE) -> bool:
    """True if ``path`` is (or soon is) gone: a pruning ``rmtree`` deletes files one by one, then the dir."""
    deadline = time.monotonic() + within
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def lineage_checksums(run: Path) -> dict[int, str]:
    """Version -> checksum recorded when it was published (the last record wins: resumes rewrite it).

    Only records whose seal matches: a version with a damaged record counts as unrecorded."""
    records, _ = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage record")
    return {r["version"]: r["checksum"] for r in records if "version" in r and "checksum" in r}


def record_checks(run: Path) -> list[Check]:
    """The run's own records: job.json, history.jsonl, params.json and every lineage line, each sealed."""
    checks, damaged = sealed_checks(run, job=lambda: recorded_job(run))
    if not damaged:  # each damaged line is reported above; continuity is about intact ones
        checks.append(continuity_check(run))
    return checks


def sealed_checks(run: Path, *, job: Callable[[], object]) -> tuple[list[Check], bool]:
    """job.json (read by ``job``: a supervised or an RL run's reader), params.json and every lineage line, each
    checked against its seal; and whether a lineage line was damaged."""
    checks = []
    for path, read in ((run / RUN_JOB, job), (run / RUN_PARAMS, lambda: read_params(run))):
        try:
            read()
            checks.append(Check(path, "ok", "a sealed record", "its checksum matches"))
        except MemtrainError as exc:
            checks.append(Check(path, "mismatch", "a sealed record", str(exc)))
    _, damaged = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage record")
    checks += [Check(run / RUN_LINEAGE, "mismatch", "a sealed record", str(exc)) for exc in damaged]
    return checks, bool(damaged)


def continuity_check(run: Path) -> Check:
    """The lineage is continuous (versions 0, 1, 2, ... each once, in order: ``read_lineage``) and reaches
    every checkpoint's version: a run that passes can be resumed and replayed. (Versions published after the
    newest record are a crashed or live run's, which a resume unpublishes: they count as unrecorded.)"""
    path = run / RUN_LINEAGE
    expected = "versions 0 to the newest checkpoint's, each once, in order"
    # listed before the lineage is read: a live run records a version before it checkpoints it, so a
    # checkpoint that appears meanwhile is one whose record the read already has
    newest = max((version_of_checkpoint(run, u) for u in checkpoint_updates(run)), default=0)
    if not path.exists() or path.stat().st_size == 0:  # a live run's first line may be on its way: not a failure
        return Check(path, "gone" if run_is_live(run) else "missing", expected,
                     "no file" if not path.exists() else "an empty file")
    try:
        final = read_lineage(run).final_version
    except MemtrainError as exc:
        return Check(path, "discontinuous", expected, str(exc))
    if final < newest:
        return Check(path, "discontinuous", expected,
                     f"the lineage ends at version {final}, before the checkpoint of version {newest}")
    return Check(path, "ok", expected, f"versions 0 to {final}")


def version_of_checkpoint(run: Path, update: int) -> int:
    try:
        return int(read_meta(checkpoint_path(run, update))["position"]["version"])
    except (MemtrainError, KeyError, TypeError, ValueError):
        return 0  # an unreadable checkpoint is reported by its own check


def weights_check(run: Path, version: int, recorded: dict[int, str], *, gone_ok: bool) -> Check:
    return hash_check(weights_path(run, version), recorded.get(version), gone_ok=gone_ok)


def run_checks(run: Path, *, dataset: bool) -> list[Check]:
    checks = record_checks(run)
    try:
        job = recorded_job(run)
    except MemtrainError:
        job = {}
    keep = job.get("run", {}).get("keep_checkpoints")
    for update in checkpoint_updates(run):
        checks.extend(checkpoint_checks(checkpoint_path(run, update), prunable=partial(pruned_soon, run, update, keep)))
    recorded = lineage_checksums(run)
    checks.extend(weights_check(run, version, recorded, gone_ok=True) for version in weight_versions(run))
    if dataset:
        data = job.get("data", {}).get("path")
        if data is None:
            raise InputError("--with-dataset: the run's job.json does not name its dataset", path=run / RUN_JOB)
        checks.extend(dataset_checks(Path(data)))
    return checks


def pruned_soon(run: Path, update: int, keep: int | None) -> bool:
    """A checkpoint older than the newest ``keep`` (listed now) is one the run is about to delete."""
    if not isinstance(keep, int) or keep < 1:
        return True
    return update in checkpoint_updates(run)[:-keep]


def summary(checks: list[Check]) -> dict[str, Any]:
    """The ``verify`` block of the JSON output."""
    failures = [c for c in checks if c.failed]
    return {"checked": sum(c.status not in ("gone", "unrecorded") for c in checks), "ok": not failures,
            "failures": [c.to_dict() for c in failures],
            "unrecorded": [str(c.path) for c in checks if c.status == "unrecorded"]}


def annotate(view: dict[str, Any], checks: list[Check]) -> None:
    """Fill the ``verified`` fields of a view (True, False, or None where nothing was checked) and ``verify``."""
    status = {str(c.path): c.status for c in checks}
    if view["kind"] == "dataset":
        for split in view["splits"].values():
            for shard in split["shards"]:
                shard["verified"] = verdict(status, [str(Path(view["path"]) / shard[p]) for p in ("x", "y")])
    elif view["kind"] == "run":
        for entry in view["entries"]:
            prefix = entry["path"] + "/" if entry["type"] == "checkpoint" else entry["path"]
            entry["verified"] = verdict(status, [p for p in status if p == prefix or p.startswith(prefix)])
    else:
        for record in view.get("files", []):
            record["verified"] = verdict(status, [str(Path(view["path"]) / record["name"])])
        view["verified"] = verdict(status, list(status))
    view["verify"] = summary(checks)


def verdict(status: dict[str, str], paths: list[str]) -> bool | None:
    found = [status[p] for p in paths if p in status and status[p] not in ("gone", "unrecorded")]
    if not found:
        return None
    return all(s == "ok" for s in found)
