"""The reduction of a two-level round (issue 42): the nodes of a cluster continue one fold, in task order.

Today's step (train/loops/reduce.py) adds an update's gradients in task order: a sequential fold,
``((g0 + g1) + g2) + ...``. Float addition is not associative, so a grouping of the gradients by node
would change bits. But a fold can be *continued*: if node j owns a **contiguous range** of tasks
[lo, hi), reads the partial sum of tasks [0, lo) that the node before it wrote, adds its own tasks'
gradients to it in order and writes the partial of [0, hi), then the last partial (tasks [0, T)) is the
local fold bit for bit, whatever the number of nodes, their ranges, or the processes inside each.

- **Ranges** (``node_tasks``, train/plan.py): derived from the update's task count and the nodes' process counts only,
  contiguous, in node order, weighted by processes; a node may get none (more nodes than tasks) and then
  takes no part. A partial is named by how many tasks it holds, never by the node that wrote it: node j
  reads the partial of ``lo`` tasks, whoever made it.
- **Segments** (``segment_ranges``): the vector is cut into segments of whole 64 Ki-parameter checksum
  blocks, each a file published on its own, so node j + 1 starts segment s as soon as node j has
  published it (the chain is pipelined: its latency is one node's fold of the whole vector plus one
  segment per further node). A node's processes share its segments (``fold_node``: process i folds
  segments i, i + p, ...); the elementwise fold does not care who adds which segment.
- **The file** (``PartialSum``): one .npy per (update, attempt, tasks, segment) holding a structured
  scalar -- the identity (update, attempt, version, tasks, the segment's [lo, hi) and the vector's size),
  the segment's block digests (``files.block_digest``, as a version's), a seal over identity and
  digests, then the values. Written under a temporary name and published by a rename that never
  replaces (``files.rename_new``). A reader checks the header, the size, the seal, that the identity is
  the one it expects (a partial of another update, attempt or version is never used: ``StalePartial``)
  and every block's digest.
- **A node lost mid-chain** (``resume_point``): a new attempt continues from the lost attempt's furthest
  partial that is whole in every segment, on the nodes left (``fold_node(..., source=)``): the same bits.

Bytes per node per update over the shared filesystem: the version read once, the previous partial
read, its own partial written -- three vectors, whatever its process count (the issue's bound).
The step then starts from the last partial: ``reduce_and_step(grads=[last partial])`` gives the same
weights as from every gradient (tests/test_node_sum.py checks both). Each slice owner reads its slice of
the last partial, except the node that wrote it: that node keeps the segments of its own step slice in
memory (``KeptSum``), never publishes them, and steps them from there; with SGD only the chain's first and
last nodes step, the last at least half the vector (``plan.node_step_deal``): at most 3 vectors per node per
update, the step included (docs/cluster.md, "Bytes per node per update"). A step of the kept slice anywhere
else finds the last partial not whole and the server computes the tasks after the furthest whole one again
(train/loops/node_round.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from memtrain.errors import CorruptFileError, MemtrainError
from memtrain.files import (
    DIGEST_BYTES,
    block_checksum_digest,
    block_digest,
    npy_header_bytes,
    open_regular,
    publish_new,
)
from memtrain.train.exchange.area import CHAIN_SUM
from memtrain.train.exchange.weights import BLOCK
from memtrain.train.messages import StepTask
from memtrain.train.plan import SEGMENT_BLOCKS
from memtrain.train.plan import node_tasks as node_tasks  # the ranges are the plan's (the cluster derives them too)

MAGIC = b"mtchain1"
POLL_SECONDS = (0.0002, 0.005)  # waiting for the previous partial: first and longest sleep between looks
IDENTITY = ("update", "attempt", "version", "tasks", "lo", "hi", "size")

READ_SECONDS = 60.0  # a step slice's wait for the last partial (published before its node answered)


class StalePartial(CorruptFileError):
    """A partial sum whose identity is not the one its reader expects (another update, attempt or version)."""


class Abandoned(Exception):  # noqa: N818 - a signal to stop waiting, not an error
    """The waiter's ``abandoned()`` said the partial awaited will not come (its round ended)."""


def segment_ranges(size: int, segment_blocks: int = SEGMENT_BLOCKS) -> list[tuple[int, int]]:
    """The vector's segments: [lo, hi) of ``segment_blocks`` whole checksum blocks each, the last one shorter."""
    step = segment_blocks * BLOCK
    return [(lo, min(lo + step, size)) for lo in range(0, size, step)]


def fold(acc: np.ndarray, grads: Sequence[np.ndarray], *, continued: bool) -> None:
    """Add ``grads`` into ``acc`` in order: onto the partial it holds (``continued``), or from nothing.

    From nothing it is exactly reduce.py's order (the first two added in one pass, then each next one);
    continued, each gradient is added to the running sum: either way the sequential fold in task order.
    """
    if not grads:
        if not continued:
            raise ValueError("a fold from nothing needs at least one gradient")
        return
    if continued:
        rest = grads
    elif len(grads) == 1:
        np.copyto(acc, grads[0])
        rest = []
    else:
        np.add(grads[0], grads[1], out=acc)
        rest = grads[2:]
    for grad in rest:
        np.add(acc, grad, out=acc)


@dataclass(frozen=True)
class PartialSum:
    """The partial sums of one attempt at one update's chain, in ``folder`` (the shared exchange area)."""

    folder: Path
    update: int
    attempt: int
    version: int  # the weight version the update's gradients were computed at
    size: int  # parameters in the whole vector
    segment_blocks: int = SEGMENT_BLOCKS
    sync: bool = False  # fsync each partial before its rename (a filesystem that needs it for other machines)

    def segments(self) -> list[tuple[int, int]]:
        return segment_ranges(self.size, self.segment_blocks)

    def path(self, tasks: int, segment: int) -> Path:
        return CHAIN_SUM.path(self.folder, self.update, self.attempt, tasks, segment)

    def identity(self, tasks: int, segment: int) -> dict[str, int]:
        lo, hi = self.segments()[segment]
        return dict(zip(IDENTITY, (self.update, self.attempt, self.version, tasks, lo, hi, self.size), strict=True))

    def record(self, segment: int) -> np.ndarray:
        """An empty record (a structured scalar, as an array of one) for ``segment``: fill its ``values``."""
        lo, hi = self.segments()[segment]
        return np.zeros(1, dtype=record_dtype(hi - lo))

    def write(self, tasks: int, segment: int, record: np.ndarray) -> Path:
        """Stamp ``record`` (its values filled) with its identity, digests and seal, and publish it as the
        partial of ``tasks`` tasks. Published already (a backup copy of the same link, which wrote the same
        bits): ours is dropped."""
        stamp(record, self.identity(tasks, segment))
        path = self.path(tasks, segment)

        def write(handle: IO[bytes]) -> None:
            handle.write(npy_header_bytes((), record.dtype))
            handle.write(memoryview(record.view(np.uint8)))

        publish_new(path, write, durable=self.sync)
        return path

    def read(self, tasks: int, segment: int, into: np.ndarray) -> np.ndarray:
        """Read the partial of ``tasks`` tasks, ``segment``, into the record ``into`` (``record(segment)``), and
        check it whole: header, size, seal, identity, every block's digest. Returns ``into``."""
        path = self.path(tasks, segment)
        header = npy_header_bytes((), into.dtype)
        body = into.view(np.uint8)
        try:
            handle = open_regular(path, what="a partial sum", error=CorruptFileError)
        except FileNotFoundError:
            raise CorruptFileError("the partial sum is gone", path=path, hint="deleted while its chain was still "
                                   "reading it: a bug in memtrain, please report it") from None
        with handle:
            head = handle.read(len(header))
            got = handle.readinto(memoryview(body)) if head == header else 0
            extra = handle.read(1)
        if head != header or got != body.size or extra:
            raise CorruptFileError("not a whole partial sum of this segment", path=path,
                                   expected=f"{len(header) + body.size} bytes with this header",
                                   found=f"{len(head) + got + len(extra)}{'+' if extra else ''} bytes")
        check(into, self.identity(tasks, segment), path)
        return into

    def wait(self, tasks: int, segment: int, deadline: float, abandoned: Callable[[], bool] | None = None) -> Path:
        """Wait until the partial of ``tasks`` tasks, ``segment``, is published (polled, with backoff); raise
        ``Abandoned`` as soon as ``abandoned()`` is true."""
        path, pause = self.path(tasks, segment), POLL_SECONDS[0]
        while not path.exists():
            if abandoned is not None and abandoned():
                raise Abandoned(f"update {self.update}: the partial of its first {tasks} tasks is no longer awaited")
            if time.monotonic() > deadline:
                raise MemtrainError(f"the partial sum of the first {tasks} tasks of update {self.update} (segment "
                                    f"{segment}) was not published in time", path=path,
                                    hint="the node before this one in the chain is late or lost")
            time.sleep(pause)
            pause = min(pause * 2, POLL_SECONDS[1])
        return path


def record_dtype(length: int) -> np.dtype:
    """One partial of a segment of ``length`` parameters: identity, seal, block digests, values (packed)."""
    blocks = -(-length // BLOCK)
    return np.dtype([("magic", "S8"), *((name, "<i8") for name in IDENTITY), ("seal", "u1", (DIGEST_BYTES,)),
                     ("digests", "u1", (blocks, DIGEST_BYTES)), ("values", "<f4", (length,))])


def digests_of(values: np.ndarray, out: np.ndarray) -> None:
    for k, a in enumerate(range(0, values.size, BLOCK)):
        out[k] = np.frombuffer(block_digest(values[a:a + BLOCK]), dtype=np.uint8)


def seal_of(record: np.ndarray) -> bytes:
    """The seal: a hash of the identity and the block digests (which cover the values)."""
    body = record.view(np.uint8)
    seal_at = record.dtype.fields["seal"][1]
    digests_at = record.dtype.fields["digests"][1]
    values_at = record.dtype.fields["values"][1]
    return block_checksum_digest(body[:seal_at].tobytes(), body[digests_at:values_at].tobytes())


def stamp(record: np.ndarray, identity: dict[str, int]) -> None:
    record["magic"] = MAGIC
    for name, value in identity.items():
        record[name] = value
    digests_of(record["values"][0], record["digests"][0])
    record["seal"][0] = np.frombuffer(seal_of(record), dtype=np.uint8)


def check(record: np.ndarray, expected: dict[str, int], path: Path) -> None:
    """Raise unless ``record`` is sealed, is the partial ``expected`` names, and its values match its digests."""
    if record["magic"][0] != MAGIC or bytes(record["seal"][0]) != seal_of(record):
        raise CorruptFileError("partial sum's seal does not match its identity and digests", path=path)
    found = {name: int(record[name][0]) for name in expected}
    if found != expected:
        raise StalePartial("a partial sum of another update, attempt or version: never used", path=path,
                           expected=expected, found=found)
    values, digests = record["values"][0], record["digests"][0]
    for k, a in enumerate(range(0, values.size, BLOCK)):
        if block_digest(values[a:a + BLOCK]) != bytes(digests[k]):
            raise CorruptFileError(f"partial sum's block {k} does not match its digest", path=path)


class KeptSum:
    """The segments of the update's last partial that the node which wrote it will step itself (its own step
    slice), kept in its memory by ``fold_node`` (``keep``) and taken by ``read_sum`` instead of reading them back
    from the shared filesystem: the same values, so the same bits. Holds one chain's segments at a time (a new
    chain's drops the old ones: at most the node's step slice plus a segment); a step run elsewhere (the node lost,
    a backup) reads the published file, which is always written too."""

    taken_in_process = 0  # segments any KeptSum of this process gave instead of their file (a node's Dask worker:
    # tests/test_node_round.py asks it through ``client.run``)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.chain: tuple = ()  # the identity of the chain whose segments are kept
        self.segments: dict[tuple[int, int], np.ndarray] = {}  # (tasks, segment) -> the partial's values
        self.want = (0, 0)  # the slice [lo, hi) of the vector whose segments are kept
        self.taken = 0  # segments read from here rather than from their file

    @staticmethod
    def key(chain: PartialSum) -> tuple:
        return chain.folder, chain.update, chain.attempt, chain.version, chain.size, chain.segment_blocks

    def expect(self, chain: PartialSum, lo: int, hi: int) -> None:
        """Keep, from now on, the segments of ``chain`` in the step slice [lo, hi) -- whole segments
        (``plan.node_step_deal``): ``fold_node`` keeps them instead of publishing them; forget any other."""
        step = chain.segment_blocks * BLOCK
        if lo % step or (hi % step and hi != chain.size):
            raise ValueError(f"[{lo}, {hi}) is not a run of whole segments of {step} parameters")
        with self.lock:
            self.chain, self.segments, self.want = self.key(chain), {}, (lo, hi)

    def wants(self, chain: PartialSum, segment: int) -> bool:
        """Whether ``segment`` of ``chain`` is one this node keeps (and does not publish)."""
        a, b = chain.segments()[segment]
        with self.lock:
            return self.key(chain) == self.chain and a < self.want[1] and b > self.want[0]

    def put(self, chain: PartialSum, tasks: int, segment: int, values: np.ndarray) -> None:
        if self.wants(chain, segment):
            with self.lock:
                self.segments[(tasks, segment)] = values

    def take(self, chain: PartialSum, tasks: int, segment: int) -> np.ndarray | None:
        """The values of the partial of ``tasks`` tasks, ``segment``, if kept (then no longer kept), else None."""
        with self.lock:
            if self.key(chain) != self.chain:
                return None
            values = self.segments.pop((tasks, segment), None)
            if values is not None:
                self.taken += 1
                KeptSum.taken_in_process += 1
            return values


def fold_node(chain: PartialSum, lo: int, hi: int, grad: Callable[[int], np.ndarray], *, deadline: float,
              share: tuple[int, int] = (0, 1), source: PartialSum | None = None,
              abandoned: Callable[[], bool] | None = None, keep: KeptSum | None = None) -> list[Path]:
    """One node's part of the chain: for its tasks [lo, hi), each of its segments (``share`` = (i, p): process
    i of the node's p takes segments i, i + p, ...) -- wait for the partial of the first ``lo`` tasks, read
    it, add ``grad(t)[segment]`` for t in [lo, hi) in order, publish the partial of the first ``hi``.
    ``grad(t)``: task t's whole gradient (a map of its file). Returns the paths published.

    ``source``: where the partial of the first ``lo`` tasks is read (default: ``chain``). After a node was lost
    mid-chain, a new attempt continues from an earlier attempt's furthest whole partial (``resume_point``):
    the same sum, so the same bits. ``abandoned``: asked while waiting; true raises ``Abandoned``. ``keep``: the
    segments it expects (``KeptSum.expect``: the node ending the chain, its own step slice) are kept in memory
    instead of published -- the step that reads them runs in this process (``plan.node_step_deal``)."""
    if hi <= lo:
        return []
    source = source or chain
    if (source.update, source.version, source.size, source.segment_blocks) != \
            (chain.update, chain.version, chain.size, chain.segment_blocks):
        raise ValueError(f"a chain continues only from a partial of its own update and version: {source} -> {chain}")
    first, step = share
    published = []
    for segment in range(first, len(chain.segments()), step):
        a, b = chain.segments()[segment]
        record = chain.record(segment)
        if lo:
            source.wait(lo, segment, deadline, abandoned)
            source.read(lo, segment, record)
        fold(record["values"][0], [grad(t)[a:b] for t in range(lo, hi)], continued=lo > 0)
        if keep is not None and keep.wants(chain, segment):
            keep.put(chain, hi, segment, record["values"][0])
        else:
            published.append(chain.write(hi, segment, record))
    return published


def resume_point(chain: PartialSum, boundaries: Sequence[int]) -> int:
    """The most tasks among ``boundaries`` (where the node ranges of ``chain``'s attempt ended) whose partial is
    published whole, every segment there and checked: where a new attempt continues after a node was lost
    (``fold_node(..., source=chain)``); 0 if none (the new attempt starts from nothing)."""
    for tasks in sorted({t for t in boundaries if t > 0}, reverse=True):
        try:
            for segment in range(len(chain.segments())):
                chain.read(tasks, segment, chain.record(segment))
        except (CorruptFileError, FileNotFoundError):
            continue
        return tasks
    return 0


def read_sum(chain: PartialSum, tasks: int, *, deadline: float, lo: int = 0, hi: int | None = None,
             kept: KeptSum | None = None) -> np.ndarray:
    """Elements [lo, hi) (default: all) of the sum of the first ``tasks`` tasks -- with every task of the update,
    the last partial, what the step starts from: a slice owner reads its slice only (the segments it overlaps,
    each checked whole; those ``kept`` holds, this node's own, from its memory). A new array."""
    hi = chain.size if hi is None else hi
    if not 0 <= lo <= hi <= chain.size:
        raise ValueError(f"[{lo}, {hi}) is not a slice of a vector of {chain.size}")
    out = np.empty(hi - lo, dtype=np.float32)
    for segment, (a, b) in enumerate(chain.segments()):
        if b <= lo or a >= hi:
            continue
        values = kept.take(chain, tasks, segment) if kept is not None else None
        if values is None:
            chain.wait(tasks, segment, deadline)
            values = chain.read(tasks, segment, chain.record(segment))["values"][0]
        out[max(a, lo) - lo: min(b, hi) - lo] = values[max(a, lo) - a: min(b, hi) - a]
    return out


def chained_sum(message: StepTask, exchange: Path, size: int, kept: KeptSum | None = None) -> np.ndarray:
    """Slice [lo, hi) of the sum of the first ``message.chained`` tasks of the update: its chain's partial (the
    segments ``kept`` holds from this node's memory)."""
    chain = PartialSum(exchange, update=message.update, attempt=0, version=message.version, size=size)
    return read_sum(chain, message.chained, deadline=time.monotonic() + READ_SECONDS, lo=message.lo, hi=message.hi,
                    kept=kept)
