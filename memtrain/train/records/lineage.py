"""Updates -> ``lineage.jsonl`` records and back: which weights and rows produced each weight version, in order.

One JSON line per published version (format in docs/formats.md). The first line, version 0, names the
format and its version; every later line names the rows whose gradients made the version, in the order
they were added, and the version each gradient was computed at (``at``). That is the whole schedule of
a run (read back by ``read_lineage``). Each update's line is made where it is logged, with its metric line, by
the one owner of an update's records (train/records/logbook.py ``update_record``); this module makes the
first line and an additive model's, and reads them all back.
Lines written before format 2 have no ``at``: their gradients were all computed at the parent.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrain.errors import CorruptFileError
from memtrain.files import SEAL_KEY, open_regular, unseal
from memtrain.layout import RUN_LINEAGE
from memtrain.records import LINEAGE_INIT, LINEAGE_SOLVE, make

FORMAT = "memtrain.lineage"
FORMAT_VERSION = 2  # 2: "at" (the version each gradient was computed at); 1 (no "format" field): no "at"


def init_record(seed: int, checksum: str) -> dict[str, Any]:
    """The first line: version 0, the initial weights drawn from ``seed`` (``RunDir.lineage`` seals each line)."""
    return make(LINEAGE_INIT, version=0, parent=None, init={"seed": seed}, checksum=checksum, format=FORMAT,
                format_version=FORMAT_VERSION)


def solve_record(*, tasks: list[tuple[int, int]], solve: str, checksum: str) -> dict[str, Any]:
    """The one line of an additive model's run: version 1, solved by the model ``solve`` names from the
    sufficient statistics of ``tasks`` (row ranges of the train split, summed in this order); no gradients."""
    return make(LINEAGE_SOLVE, version=1, parent=0, update=1, epoch=1, split="train", tasks=[list(t) for t in tasks],
                solve=solve, checksum=checksum)


@dataclass(frozen=True)
class Gradient:
    """One gradient added into an update: the task of positions [lo, hi) of its epoch's row sequence (train rows
    [lo, hi) unless the run's train.shuffle is "rows": ``Plan.rows``), computed at weight version ``at``."""

    lo: int
    hi: int
    at: int


@dataclass(frozen=True)
class Step:
    """One update as the lineage records it: ``parent`` + gradients (in the order they were added) -> ``version``."""

    version: int
    update: int
    epoch: int
    batch: int
    gradients: tuple[Gradient, ...]
    lr: float
    checksum: str
    line: int
    discarded: int = 0  # async mode: stale gradients recomputed while this update's gradients arrived
    ids: tuple[int, ...] = ()  # async mode: each gradient's task number in its epoch's task stream

    def task(self, i: int) -> int:
        """The task number the ``i``-th gradient was computed under (a model's randomness is seeded by it)."""
        return self.ids[i] if self.ids else i

    @property
    def parent(self) -> int:
        return self.version - 1

    @property
    def rows(self) -> int:
        return sum(g.hi - g.lo for g in self.gradients)

    @property
    def staleness(self) -> tuple[int, ...]:
        """How many versions behind the one it was applied to, for each gradient."""
        return tuple(self.parent - g.at for g in self.gradients)


@dataclass(frozen=True)
class Lineage:
    """A run's lineage as ``read_lineage`` checked it: the initial weights' seed and checksum, then one
    ``Step`` per published version, in order."""

    path: Path
    format_version: int
    seed: int | None
    init_checksum: str | None
    steps: tuple[Step, ...]  # versions 1, 2, ... in order
    other: tuple[dict[str, Any], ...]  # lines that are not gradient updates (an additive model's solve)

    @property
    def final_version(self) -> int:
        """The newest version recorded: a gradient update's or another line's (an additive model's solve).
        ``read_lineage`` checked that versions run 0, 1, 2, ... in order, so it is the last line's."""
        versions = [step.version for step in self.steps[-1:]] + [record["version"] for record in self.other[-1:]]
        return max(versions, default=0)

    def step(self, version: int) -> Step | None:
        index = version - 1
        return self.steps[index] if 0 <= index < len(self.steps) else None

    def staleness_histogram(self) -> dict[int, int]:
        """Gradients applied, by staleness (versions behind the one they were applied to)."""
        counts = Counter(s for step in self.steps for s in step.staleness)
        return dict(sorted(counts.items()))


def read_lineage(run: str | Path) -> Lineage:
    """Read and check a run's lineage: versions 0, 1, 2, ... each once, in order, each from the one before.

    A torn last line (a crash mid-append) is left out; anything else malformed, and a line whose seal
    (``record_checksum``) does not match, is a CorruptFileError naming the line.

    >>> read_lineage("runs/digits-mlp").step(12).gradients[0]       # doctest: +SKIP
    Gradient(lo=896, hi=960, at=11)
    """
    path = Path(run) / RUN_LINEAGE
    records = _read_lines(path)
    if not records or records[0][1].get("version") != 0:
        raise CorruptFileError("the lineage does not start with version 0", path=path, where="line 1")
    version = _format_version(records[0][1], path)
    if version >= 2 or SEAL_KEY in records[0][1]:  # format 1 came before records were sealed
        records = [(line, unseal(record, path=path, what="lineage record", where=f"line {line}"))
                   for line, record in records]
    first = records[0][1]
    steps, other = [], []
    for expected, (line, record) in enumerate(records[1:], start=1):
        if record.get("version") != expected or record.get("parent") != expected - 1:
            raise CorruptFileError("the lineage skips or repeats a version", path=path, where=f"line {line}",
                                   expected=f"version {expected} from {expected - 1}",
                                   found=f"version {record.get('version')} from {record.get('parent')}")
        if "tasks" in record and "lr" in record:
            steps.append(_step(record, line, path))
        else:
            other.append(record)
    seed = first.get("init", {}).get("seed") if isinstance(first.get("init"), dict) else None
    return Lineage(path, version, seed, first.get("checksum"), tuple(steps), tuple(other))


def continuous(records: list[dict[str, Any]], upto: int, checksum: str, path: Path) -> list[dict[str, Any]]:
    """The (unsealed) records of versions 0 to ``upto``, each once and in order: what a resume from a
    checkpoint of version ``upto``, whose weights have ``checksum``, keeps.

    A record repeated word for word (a line appended twice) is kept once. A version missing (a torn,
    damaged or lost line) or recorded twice with different content is a gap that nothing on disk can
    fill, and so is a record of ``upto`` whose checksum is not the checkpoint's: CorruptFileError naming
    it, since training on would leave a run that cannot be replayed.
    """
    kept: list[dict[str, Any]] = []
    for record in records:
        version = record.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version > upto:
            continue
        if version < len(kept) and record == kept[version]:
            continue  # the same line twice
        if version != len(kept):
            raise _gap(path, len(kept), upto, found=f"version {version} recorded after version {len(kept) - 1}")
        kept.append(record)
    if len(kept) <= upto:
        raise _gap(path, len(kept), upto, found=f"the lineage ends at version {len(kept) - 1}" if kept
                   else "no intact record")
    if kept[upto].get("checksum") != checksum:
        raise CorruptFileError(f"the lineage's record of version {upto} is not the checkpoint's weights", path=path,
                               expected=checksum, found=kept[upto].get("checksum"),
                               hint="the lineage does not describe the run being resumed; it cannot be replayed")
    return kept


def _gap(path: Path, first: int, upto: int, *, found: str) -> CorruptFileError:
    missing = f"version {first}" if first == upto else f"versions {first} to {upto}"
    return CorruptFileError(f"the lineage has a gap before the checkpoint (weight version {upto}): no intact record "
                            f"of {missing}", path=path, expected=f"versions 0 to {upto}, each once, in order",
                            found=found, hint="resuming would leave a run that cannot be replayed; restore "
                            "lineage.jsonl from a copy, or start the run again with --overwrite")


def _read_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    if not path.exists():
        raise CorruptFileError("the run has no lineage", path=path)
    with open_regular(path, what="a lineage file", text=True) as handle:  # a FIFO would block a plain open
        lines = handle.read().split("\n")
    torn_tail = lines[-1] != ""  # a complete file ends with a newline
    records = []
    for number, text in enumerate(lines[:-1] if not torn_tail else lines, start=1):
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            if torn_tail and number == len(lines):
                break
            raise CorruptFileError("a lineage line is not valid JSON", path=path, where=f"line {number}") from None
        if not isinstance(record, dict):
            raise CorruptFileError("a lineage line is not a JSON object", path=path, where=f"line {number}")
        records.append((number, record))
    return records


def _format_version(first: dict[str, Any], path: Path) -> int:
    if "format" not in first:
        return 1
    version = first.get("format_version")
    if first["format"] != FORMAT or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise CorruptFileError("unsupported lineage format", path=path, where="line 1",
                               expected=f"{FORMAT} version 1 to {FORMAT_VERSION}",
                               found=f"{first['format']} version {version}")
    return version


def _step(record: dict[str, Any], line: int, path: Path) -> Step:
    try:
        tasks = [(int(lo), int(hi)) for lo, hi in record["tasks"]]
        at = [int(v) for v in record.get("at", [record["parent"]] * len(tasks))]
        if len(at) != len(tasks) or any(not 0 <= v <= record["parent"] for v in at):
            raise ValueError("'at' must name one earlier version per row range")
        if "ids" in record and len(record["ids"]) != len(tasks):
            raise ValueError("'ids' must name one task per row range")
        return Step(record["version"], int(record["update"]), int(record["epoch"]), int(record.get("batch", 0)),
                    tuple(Gradient(lo, hi, v) for (lo, hi), v in zip(tasks, at, strict=True)),
                    float(record["lr"]), str(record["checksum"]), line, int(record.get("discarded", 0)),
                    tuple(int(i) for i in record.get("ids", ())))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptFileError(f"a lineage line is malformed ({exc})", path=path, where=f"line {line}") from None
