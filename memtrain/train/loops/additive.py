"""An additive model's one pass: train rows -> per-task partial statistics (a worker streams its rows in chunks)
-> their sum (the server, in task order and in chunks, into a mapped file) -> ``solve`` on views of that file.

Memory is bounded by a chunk, never by a task's rows or by the statistics: a task maps its partial file and
the model adds each chunk's sums into it (docs/models.md, "Additive models"); the server adds the partials
element by element into the mapped sum, so every element is ``((0 + p0) + p1) + ...`` in task order whatever
the worker count, and the chunk boundaries are the job's (``train.chunk_rows``, counted from each task's
first row), never the machine's.

The files live in the run directory (``statistics/``, layout.py), not in the exchange area, so that a
killed server resumes without computing again the partials it has: each is published by rename once whole
(``files.writing_npy``), so a half-written one is never read, and ``plan.json`` (sealed) says which pass
they belong to. Like a shard or a checkpoint, each partial and the sum carry a checksum recorded when they
are published (a sealed ``.json`` beside each, written after the rename), verified before a later start
reuses them: one without its record, with a checksum that does not match, or a link in its place, is absent
(its name removed, never what it points to) and computed again, with a line in ``events.log``. The folder is
removed once the solved weights are checkpointed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import MemtrainError
from memtrain.faults import fault_point
from memtrain.files import (
    check_npy,
    checksum_file,
    json_checksum,
    open_npy,
    read_sealed_json,
    verify_checksum,
    write_sealed_json,
    writing_npy,
)
from memtrain.layout import (
    STATISTICS_PLAN,
    STATISTICS_SUM,
    parse_partial_name,
    partial_name,
    statistics_dir,
    statistics_record_name,
    tmp_target,
)
from memtrain.models.params import ParamLayout
from memtrain.train.exchange.weights import finite

STATS_DTYPE = np.dtype(np.float64)
# Elements per piece of the server's sum: 4 Mi float64 = 32 MiB of each partial and of the sum at a time.
# The sum is element-wise, so the piece size changes nothing in the result, only how much is touched at once.
SUM_CHUNK = 1 << 22
PLAN_FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class PassPlan:
    """What a pass's partials are the statistics of: the tasks' row ranges, the chunk rows, the size."""

    tasks: tuple[tuple[int, int], ...]
    chunk_rows: int
    size: int  # float64 elements of one partial (the model's statistics layout)
    source: str  # what the rows and the statistics are: the dataset's manifest, the model and normalization

    def to_json(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "tasks": [list(t) for t in self.tasks], "chunk_rows": self.chunk_rows,
                "size": self.size, "source": self.source}


def pass_source(manifest: dict[str, Any], kind: str, options: dict[str, Any], normalize: bool) -> str:
    """A checksum of what a pass's partials depend on besides the plan: a dataset prepared again, another
    model or another normalization makes every partial on disk another pass's."""
    return json_checksum({"manifest": manifest, "kind": kind, "options": options, "normalize": normalize})


@contextlib.contextmanager
def publishing_statistics(path: Path, size: int) -> Iterator[np.memmap]:
    """A writable map of the new statistics file ``path`` (zeroed), published by rename when the block ends,
    then its checksum in its sealed record (``statistics_record_name``): a file without one is never reused."""
    with writing_npy(path, (size,), STATS_DTYPE, durable=True) as flat:
        yield flat
    record = {"file": path.name, "checksum": checksum_file(path, mapped=True)}
    write_sealed_json(path.with_name(statistics_record_name(path.name)), record, durable=True)


@dataclass(frozen=True)
class StatisticsContract:
    """How a model takes its statistics (models/protocol.py): ``method`` is called with ``out`` views of a zeroed
    partial, once per chunk of ``train.chunk_rows`` rows (``chunked``: the adding contract, ``add_statistics``)
    or once per task with its whole rows (the whole-rows contract, ``statistics``, which may overwrite)."""

    method: str
    chunked: bool


def statistics_contract(model: Any) -> StatisticsContract:
    """The contract of ``model``'s class: the statistics method defined lowest in its class hierarchy
    (``add_statistics`` when one class defines both). A model written when memtrain called ``statistics`` once
    per task stays right, and a subclass of a built-in model that overrides ``statistics`` is called by it."""
    mro = type(model).__mro__

    def depth(name: str) -> int:
        return next((i for i, cls in enumerate(mro) if callable(vars(cls).get(name))), len(mro))

    chunked = depth("add_statistics") <= depth("statistics")
    return StatisticsContract("add_statistics" if chunked else "statistics", chunked)


def contract_note(model: Any, kind: str, plan: PassPlan) -> str | None:
    """For the run's event log: a model of the whole-rows contract, and what it holds at once; else None."""
    if statistics_contract(model).chunked:
        return None
    largest = max((hi - lo for lo, hi in plan.tasks), default=0)
    return (f"statistics: model {kind!r} defines statistics() but not add_statistics(): each task's rows are read "
            f"and passed at once (up to {largest:,} rows), not train.chunk_rows at a time; a model whose "
            "add_statistics(x, y, out) adds into out is streamed in chunks (docs/models.md)")


def plan_chunk_rows(model: Any, chunk_rows: int, train_rows: int) -> int:
    """The rows a statistics task reads at once: ``train.chunk_rows`` for the adding contract; for the
    whole-rows contract every task's rows at once (the train split's count, more than any task's)."""
    return chunk_rows if statistics_contract(model).chunked else max(train_rows, 1)


def task_partial(path: Path, layout: ParamLayout, model: Any, lo: int, hi: int, chunk_rows: int,
                 read: Callable[[int, int], tuple[np.ndarray, np.ndarray]]) -> None:
    """In a worker: the statistics of train rows [lo, hi) into the new file ``path``, ``chunk_rows`` rows at a
    time (``read(a, b)``: normalized rows [a, b)). The map starts zeroed; the model's statistics method
    (``statistics_contract``) adds into it, chunk by chunk, or (the whole-rows contract, whose plan's
    ``chunk_rows`` covers every task: ``plan_chunk_rows``) fills it from the task's rows in one call."""
    contract = statistics_contract(model)
    if not contract.chunked and hi - lo > chunk_rows:
        raise AssertionError(f"a whole-rows statistics task of {hi - lo} rows cut into chunks of {chunk_rows}")
    take = getattr(model, contract.method)
    with publishing_statistics(path, layout.size) as flat:
        out = layout.views(flat)
        for a in range(lo, hi, chunk_rows):
            x, y = read(a, min(hi, a + chunk_rows))
            take(x, y, out)
            del x, y
            fault_point("statistics_chunk")


def solve(model: Any, kind: str, stats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``model.solve`` of the summed statistics; whatever it raises (the model's code: a built-in's or the user's)
    is an error naming the model, exit 1, never a traceback (a stop request passes through)."""
    try:
        return model.solve(stats)
    except MemtrainError:
        raise
    except Exception as exc:  # the model's code may raise anything
        raise MemtrainError(f"the solve of model {kind!r} raised {type(exc).__name__}: {exc}",
                            hint="the statistics summed over the training rows are finite; nothing was "
                                 "published") from exc


class StatisticsPass:
    """The server's side of the pass: which partials are already there, their sum, the folder's cleanup."""

    def __init__(self, run_dir: Path, plan: PassPlan, log: Callable[[str], None], *,
                 describe_rows: Callable[[int, int], str] = lambda lo, hi: f"rows {lo}-{hi} of the train split"):
        self.folder, self.plan, self.log, self.describe_rows = statistics_dir(run_dir), plan, log, describe_rows
        self.sum_trusted = False  # the sum on disk is whole and verified (``start``), or this pass published it

    @property
    def sum_path(self) -> Path:
        return self.folder / STATISTICS_SUM

    def partial_path(self, task: int, attempt: int) -> Path:
        return self.folder / partial_name(task, attempt)

    def start(self) -> dict[int, Path]:
        """Make the folder ready; returns the partials a killed earlier start of this pass left whole, by task
        (all of them when their sum was published). Anything from another pass, or unreadable, is removed."""
        recorded = self._recorded_plan()
        if recorded != self.plan.to_json():
            if recorded is not None:
                self.log("statistics: what is on disk belongs to another pass (tasks, chunk_rows, the data "
                         "or the model differ); computing them again")
            self.clear()
            self.folder.mkdir(parents=True, exist_ok=True)
            write_sealed_json(self.folder / STATISTICS_PLAN, self.plan.to_json(), durable=True)
            return {}
        self._sweep_temporary()
        self.sum_trusted = self._trusted(self.sum_path)
        if self.sum_trusted:
            return {task: self.sum_path for task in range(len(self.plan.tasks))}
        found: dict[int, Path] = {}
        for name in sorted(os.listdir(self.folder)):
            numbers = parse_partial_name(name)
            if numbers is None or numbers[0] >= len(self.plan.tasks) or numbers[0] in found:
                continue
            if self._trusted(self.folder / name):
                found[numbers[0]] = self.folder / name
        return found

    def summed(self, partials: dict[int, Path]) -> np.ndarray:
        """The partials (one per task) added in task order into the published sum file, mapped read-only.

        Each partial is removed once the sum is published (a kill before that leaves them all, and the next
        start adds them again)."""
        tasks = len(self.plan.tasks)
        if not self.sum_trusted:
            if sorted(partials) != list(range(tasks)):
                raise MemtrainError(f"statistics: {tasks - len(partials)} of {tasks} partials are missing",
                                    hint="this is a bug in memtrain: please report it with the run's events.log")
            maps = [open_npy(partials[task], shape=(self.plan.size,), dtype=STATS_DTYPE) for task in range(tasks)]
            zeros = np.zeros(min(SUM_CHUNK, self.plan.size), dtype=STATS_DTYPE)
            with publishing_statistics(self.sum_path, self.plan.size) as total:
                for lo in range(0, self.plan.size, SUM_CHUNK):
                    piece = total[lo:lo + SUM_CHUNK]
                    for partial in maps:  # task order: the bits never depend on who computed what, or when
                        piece += partial[lo:lo + SUM_CHUNK]
                    if not finite(piece, zeros):  # the gradient path's check (weights.finite): nothing published
                        raise self._nonfinite([t for t, partial in enumerate(maps)
                                               if not finite(partial[lo:lo + SUM_CHUNK], zeros)])
            del maps
            self.sum_trusted = True
        for name in os.listdir(self.folder):
            if _partial_file(name):
                (self.folder / name).unlink(missing_ok=True)
        fault_point("statistics_summed")
        return open_npy(self.sum_path, shape=(self.plan.size,), dtype=STATS_DTYPE)

    def _nonfinite(self, bad: list[int]) -> MemtrainError:
        where = ", ".join(f"task {t} ({self.describe_rows(*self.plan.tasks[t])})" for t in bad) or \
            "their sum (each task's partial was finite: it overflowed)"
        return MemtrainError(f"non-finite statistics (NaN or Inf) in the pass: {where}",
                             hint="check the data: a training row holds NaN or Inf, or values too large for "
                                  "float64 sums (memtrain prepare refuses non-finite rows, or drops them with "
                                  "--drop-nonfinite); nothing was solved or published")

    def discard(self, task: int, attempt: int) -> None:
        """A dead or superseded attempt: its partial (if it published one) and its temporary file, at once."""
        names = (partial_name(task, attempt), statistics_record_name(partial_name(task, attempt)))
        with contextlib.suppress(FileNotFoundError):
            for entry in os.listdir(self.folder):
                if entry in names or tmp_target(entry) in names:
                    (self.folder / entry).unlink(missing_ok=True)

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def _recorded_plan(self) -> dict[str, Any] | None:
        path = self.folder / STATISTICS_PLAN
        if not path.is_file():
            return None
        try:
            record = read_sealed_json(path, what="statistics plan")
        except MemtrainError as exc:
            self.log(f"statistics: {exc}; computing the partials again")
            return None
        return record

    def _sweep_temporary(self) -> None:
        """Temporary files of a killed start (its workers are dead: the run's lock is ours)."""
        for name in os.listdir(self.folder):
            if tmp_target(name) is not None:
                (self.folder / name).unlink(missing_ok=True)

    def _trusted(self, path: Path) -> bool:
        """Whether the published statistics file ``path`` may be reused: a regular file (not a link), its header
        and size the plan's, its bytes those its sealed record's checksum was taken of. Otherwise it is absent:
        the name and its record are removed (never what a link points to), the reason logged."""
        record = path.with_name(statistics_record_name(path.name))
        if not os.path.lexists(path):
            record.unlink(missing_ok=True)
            return False
        try:
            if path.is_symlink():
                raise MemtrainError("a symbolic link, not a file memtrain published", path=path)
            check_npy(path, shape=(self.plan.size,), dtype=STATS_DTYPE)
            if not os.path.lexists(record):
                raise MemtrainError("no checksum recorded (its publication was cut short)", path=path)
            expected = read_sealed_json(record, what="statistics checksum record").get("checksum")
            verify_checksum(path, expected if isinstance(expected, str) else "no checksum")
        except (MemtrainError, OSError) as exc:
            self.log(f"statistics: {exc}; computing it again")
            path.unlink(missing_ok=True)
            record.unlink(missing_ok=True)
            return False
        return True


def _partial_file(name: str) -> bool:
    """A partial (``t00000-a000.npy``) or its record (``t00000-a000.json``)."""
    return parse_partial_name(name) is not None or (
        name.endswith(".json") and parse_partial_name(name.removesuffix(".json") + ".npy") is not None)
