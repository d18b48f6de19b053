"""The schedules: which gradients each update adds, and at which weight version. Pure: no I/O, no clock.

A schedule says *what* is computed; an engine (the rounds, the desk, the server stepping the whole vector)
says *who* computes and steps it. Every engine asks its schedule the same few questions, so a rule lives
here once, whoever runs it:

- ``Planned(staleness=k)``: update n of the run adds the gradients of its plan tasks (train/plan.py), in
  task order, computed at the version after ``at(n)`` = max(0, n - k) updates. k = 0 is synchronous
  training. A function of n and k alone: bitwise the same for any worker count, fault or resume.
- ``Arrival(group=g, max_staleness=s)``: async mode. Gradients are added in the order they arrive, g at a
  time (the epoch's last group may be smaller); a gradient computed more than s versions before the
  version its group steps from is computed again, never added.
- ``Recorded(steps)``: a replay. Each recorded step's gradients at their recorded versions, added in the
  recorded order (with the recorded learning rate): the run again, bitwise.

Each schedule also runs: ``Planned.agenda``, ``Arrival.agenda`` and ``Recorded.agenda`` give the state of one
epoch's work (a replay: the whole lineage's) behind one interface, ``Agenda``, which the one loop of the
server's whole-vector engine asks (train/loops/overlap.py ``Overlap.run``): ``start`` what can be computed now,
``arrived`` each gradient as it comes back, ``due`` the next update whose gradients are all in (in the order
they are added, with the oldest version still read), ``applied`` once it is stepped, ``done`` at the end.
An agenda holds the arrived gradients' records (tasks and results: names and numbers), never files or arrays.

What a schedule keeps across updates, stretches and checkpoints is its own state object (``schedule_state``), which
the position carries without knowing its kind and a checkpoint stores under the schedule's name:
``PlannedState`` (fixed staleness's versions still read) and ``ArrivalState`` (async mode's tasks applied this
epoch). A replay keeps its job's schedule's state, as the run it replays did.

The rows of a task are the plan's (``Plan.updates``, ``plan.task_stream``; ``Plan.rows`` turns a task into rows of the
train split, in the epoch's order: ``train.shuffle``): the one place they are decided.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from memtrain.errors import MemtrainError
from memtrain.train.messages import GradTask, Result
from memtrain.train.plan import TaskRange, Update, gradient_base, live_bases, startable_updates, task_stream
from memtrain.train.records.lineage import Step

if TYPE_CHECKING:
    from memtrain.config import TrainConfig
    from memtrain.train.records.state import Position

Arrived = tuple[GradTask, Result]  # a gradient task and its result, as the task stream returns them

NO_EXTRA: Mapping[str, Any] = {}  # a planned update's lineage line has no fields beyond the common ones


class ScheduleState(Protocol):
    """What a schedule keeps across updates and checkpoints (a checkpoint's position stores ``to_json()`` under
    ``NAME``). The position carries it and the logbook reports each logged update to it, neither knowing its kind."""

    NAME: ClassVar[str]

    def logged(self, update: int, before: int, after: int) -> None:
        """Update ``update`` (the run's count) was logged: the newest version went from ``before`` to ``after``."""

    def epoch_done(self) -> None:
        """The epoch's updates are all logged."""

    def read_versions(self) -> list[int]:
        """The versions later updates still read (a checkpoint carries the older ones, the keep rule keeps them)."""

    def to_json(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class PlannedState:
    """``Planned(k)``'s state: ``bases``, [updates done, version then] of the versions the next updates' gradients
    are computed at (plan.live_bases); always empty when k = 0."""

    NAME: ClassVar[str] = "planned"
    staleness: int = 0
    bases: list[list[int]] = field(default_factory=list)

    def logged(self, update: int, before: int, after: int) -> None:
        if self.staleness:
            live = live_bases(update + 1, self.staleness)
            bases = {update: before} | dict(self.bases) | {update + 1: after}
            self.bases = [[n, v] for n, v in sorted(bases.items()) if n in live]

    def epoch_done(self) -> None:
        pass  # the versions read carry over into the next epoch

    def read_versions(self) -> list[int]:
        return [version for _, version in self.bases]

    def to_json(self) -> dict[str, Any]:
        return {"bases": self.bases}


@dataclass(slots=True)
class ArrivalState:
    """``Arrival``'s state: ``applied``, the epoch's tasks already applied (their numbers in the epoch's task
    stream), so that a stretch or a resume mid-epoch hands out only the others."""

    NAME: ClassVar[str] = "arrival"
    applied: list[int] = field(default_factory=list)

    def logged(self, update: int, before: int, after: int) -> None:
        pass  # the engine that formed the group adds its tasks (``add``): the logbook does not know them

    def add(self, tasks: Sequence[int]) -> None:
        self.applied = self.applied + list(tasks)

    def epoch_done(self) -> None:
        self.applied = []

    def read_versions(self) -> list[int]:
        return []

    def to_json(self) -> dict[str, Any]:
        return {"applied": self.applied}


def schedule_state(train: TrainConfig, stored: Mapping[str, Any] | None = None) -> ScheduleState:
    """The state of the job's schedule: fresh, or as a checkpoint's position ``stored`` it (under the schedule's
    name; a checkpoint written before schedules owned their state kept ``bases`` and ``applied`` at the
    position's top level: read alike)."""
    stored = stored or {}
    if train.mode == "async":
        own = stored.get(ArrivalState.NAME) or {"applied": stored.get("applied", [])}
        return ArrivalState(applied=list(own["applied"]))
    own = stored.get(PlannedState.NAME) or {"bases": stored.get("bases", [])}
    return PlannedState(staleness=train.staleness, bases=[list(pair) for pair in own["bases"]])


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """Fixed staleness k (``train.staleness``; 0: synchronous): the plan's updates, each at a fixed version."""

    staleness: int = 0

    def at(self, update: int) -> int:
        """After how many applied updates stood the weights ``update``'s gradients are computed at.

        >>> [Planned(staleness=2).at(n) for n in range(5)]
        [0, 0, 0, 1, 2]
        """
        return gradient_base(update, self.staleness)

    def startable(self, done: int, total: int) -> range:
        """The updates whose gradients can be computed once ``done`` of ``total`` are applied (the next k + 1)."""
        return startable_updates(done, self.staleness, total)

    def live(self, done: int) -> range:
        """The counts of applied updates whose versions later gradients may still read, once ``done`` are
        applied: the versions to keep (and that a checkpoint carries)."""
        return live_bases(done, self.staleness)

    def agenda(self, position: Position, updates: Sequence[Update]) -> PlannedAgenda:
        """The rest of ``position``'s epoch (its plan ``updates``) under this schedule."""
        return PlannedAgenda(self, updates, position)


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    """Async mode (``train.mode = "async"``): arrival order, ``group`` gradients per update, a staleness bound.
    The server's agendas also use ``per_epoch`` (updates per epoch: groups) and ``tickets`` (each task handed
    out takes the next: its file's name, unique over the server's life)."""

    group: int = 1
    max_staleness: int = 4
    per_epoch: int = 0
    tickets: Iterator[int] = field(default_factory=lambda: itertools.count(1), compare=False, repr=False)

    def stale(self, base: int, at: int) -> bool:
        """Whether a gradient computed at version ``at`` is too stale to add to a group stepped from ``base``:
        it is then computed again (at a newer version), never added.

        >>> Arrival(max_staleness=3).stale(10, 7), Arrival(max_staleness=3).stale(10, 6)
        (False, True)
        """
        return base - at > self.max_staleness

    @staticmethod
    def base(newest: int, handed: int, stepped: int) -> int:
        """The version the group being filled will step from, at most: the ``newest`` published, plus one for
        each group ``handed`` over to a stepper and not ``stepped`` yet (the desk's words)."""
        return newest + handed - stepped

    def full(self, count: int, last: bool) -> bool:
        """Whether a group of ``count`` gradients is handed over to be stepped: it is full, or it holds the
        epoch's ``last`` gradient."""
        return count >= self.group or last

    def agenda(self, position: Position, updates: Sequence[Update]) -> ArrivalAgenda:
        """The rest of ``position``'s epoch (the task stream of its plan ``updates``: plan.task_stream) under
        this schedule."""
        return ArrivalAgenda(self, task_stream(updates), position, per_epoch=self.per_epoch, tickets=self.tickets)


@dataclass(frozen=True, slots=True)
class Recorded:
    """A replay: the lineage's steps, in order (``memtrain train --replay``), read from ``lineage``."""

    steps: Sequence[Step]
    lineage: Path | None = None

    def ready(self, index: int, version: int) -> bool:
        """Whether step ``index``'s gradients can all be computed once ``version`` is published."""
        return max(g.at for g in self.steps[index].gradients) <= version

    def reads_from(self) -> list[int]:
        """Per step, the oldest version that step or any later one reads (what must stay on disk)."""
        oldest = [min(g.at for g in step.gradients) for step in self.steps]
        for i in range(len(oldest) - 2, -1, -1):
            oldest[i] = min(oldest[i], oldest[i + 1])
        return oldest

    def agenda(self, position: Position, updates: Sequence[Update] = ()) -> RecordedAgenda:
        """The whole replay, from ``position`` (version 0): the record's steps, not the plan's ``updates``."""
        return RecordedAgenda(self, position, lineage=self.lineage)


@dataclass(slots=True, kw_only=True)  # not frozen: made once per update, and a frozen init costs more
class Due:
    """An update whose gradients have all arrived: what the engine steps next."""

    update: Update
    gradients: list[Arrived]  # the arrived gradients it adds (each task and its result), in the order added
    oldest: int  # the oldest version a task in flight or still to come reads: older ones may be retired
    extra: Mapping[str, Any]  # lineage fields beyond the common ones (async's ids; NO_EXTRA)
    lr: float | None = None  # None: the optimizer's schedule's (a replay uses the recorded one)


class Start(NamedTuple):
    """A gradient to hand out: ``rows`` (a task of epoch ``epoch``) at ``version``; ``ticket``: the number that
    names its file and finds it again (``GradTask.ticket``): the plan's update number, async's ticket or a
    replay's step index."""

    ticket: int
    epoch: int
    rows: TaskRange
    version: int


class Schedule(Protocol):
    """What every schedule gives the server's loop: the agenda of the rest of ``position``'s epoch (a replay:
    the whole record), ``updates`` the epoch's plan (plan.updates)."""

    def agenda(self, position: Position, updates: Sequence[Update]) -> Agenda: ...


class Agenda(Protocol):
    """One epoch's work under a schedule (a replay's: the whole lineage), as the server's loop asks it
    (train/loops/overlap.py ``Overlap.run``). Pure: records in, records out; the loop holds the files."""

    def start(self, free: int, version: int) -> list[Start]:
        """Every gradient that can be computed now, to hand out in this order: ``free`` workers are idle (each
        task handed out takes one; read only by a schedule that cares), ``version`` is the newest published."""

    def arrived(self, task: GradTask, result: Result, more: bool) -> bool:
        """A gradient came back (``more``: others are still out). False: it is not added (too stale: it is
        computed again), and its file can go."""

    def due(self) -> Due | None:
        """The next update whose gradients are all in, or None."""

    def applied(self, position: Position, checksum: str | None) -> None:
        """The due update was stepped (``checksum``: its version's, None if skipped) and logged in ``position``."""

    def done(self) -> bool:
        """Whether nothing is left to hand out or to apply (the loop still waits for tasks in flight)."""


class Pending:
    """Arrived gradients held by update until all of that update's are in (the planned and the recorded
    agendas: an update is due in their order, whatever order its gradients came back in)."""

    __slots__ = ("got", "count")

    def __init__(self) -> None:
        self.got: dict[tuple[int, int], Arrived] = {}  # (update, task) -> its gradient, not applied yet
        self.count: dict[int, int] = {}  # update -> its gradients in

    def add(self, task: GradTask, result: Result) -> None:
        self.got[task.ticket, task.task] = (task, result)
        self.count[task.ticket] = self.count.get(task.ticket, 0) + 1

    def complete(self, update: int, tasks: int) -> bool:
        return self.count.get(update, 0) >= tasks

    def take(self, update: int, tasks: Iterable[int]) -> list[Arrived]:
        """``update``'s gradients, in the order of ``tasks`` (the order they are added)."""
        del self.count[update]
        return [self.got.pop((update, task)) for task in tasks]


class PlannedAgenda:
    """``Planned``: the plan's updates in order, update n's gradients at the version after ``at(n)`` updates,
    started k + 1 ahead; each due once all its tasks are in, added in task order."""

    def __init__(self, planned: Planned, updates: Sequence[Update], position: Position):
        self.planned, self.updates = planned, updates
        self.first = updates[0].update  # the epoch's first update, counted over the run
        self.end = self.first + len(updates)
        self.submitted = position.batch
        self.pending = Pending()
        self.applied(position, None)

    def start(self, free: int, version: int) -> list[Start]:
        starts = []
        while self.first + self.submitted in self.startable:
            update = self.updates[self.submitted]
            at = self.bases[self.planned.at(update.update)]
            starts += [Start(update.update, update.epoch, rows, at) for rows in update.tasks]
            self.submitted += 1
        return starts

    def arrived(self, task: GradTask, result: Result, more: bool) -> bool:
        self.pending.add(task, result)
        return True

    def due(self) -> Due | None:
        if self.batch >= self.submitted:
            return None
        update = self.updates[self.batch]
        if not self.pending.complete(update.update, len(update.tasks)):
            return None
        live = self.planned.live(update.update + 1)  # the bases of every later update
        return Due(update=update, gradients=self.pending.take(update.update, (t.task for t in update.tasks)),
                   oldest=self.bases.get(live.start, self.version), extra=NO_EXTRA)

    def applied(self, position: Position, checksum: str | None) -> None:
        self.batch, self.version = position.batch, position.version
        # updates done -> the version then (the logbook reports each update to the PlannedState)
        state = position.schedule
        assert isinstance(state, PlannedState)
        self.bases = dict(state.bases)
        self.bases[self.first + position.batch] = position.version
        self.startable = self.planned.startable(self.first + self.batch, self.end)  # asked per arrival: kept

    def done(self) -> bool:
        return self.first + self.batch >= self.end


class ArrivalAgenda:
    """``Arrival``: each free worker gets the epoch's next task not applied yet, at the newest version; the
    gradients are added in the order they arrive, ``group`` at a time; a too-stale one is computed again."""

    def __init__(self, arrival: Arrival, tasks: Sequence[TaskRange], position: Position, *, per_epoch: int,
                 tickets: Iterator[int]):
        self.arrival, self.per_epoch, self.tickets = arrival, per_epoch, tickets
        self.epoch, self.batch, self.version = position.epoch, position.batch, position.version
        self.state = position.schedule
        assert isinstance(self.state, ArrivalState)
        applied = set(self.state.applied)
        self.remaining = deque(t for t in tasks if t.task not in applied)
        self.reading: Counter[int] = Counter()  # versions read by the tasks in flight
        self.group: list[Arrived] = []  # the group filling, in arrival order
        self.full = False  # the group is handed over: due
        self.recomputed = 0  # stale gradients computed again while this group filled
        self.ids: list[int] = []  # the due group's task numbers (the state's applied grows by them)

    def start(self, free: int, version: int) -> list[Start]:
        starts = []
        while self.remaining and len(starts) < free:
            self.reading[version] += 1
            starts.append(Start(next(self.tickets), self.epoch, self.remaining.popleft(), version))
        return starts

    def arrived(self, task: GradTask, result: Result, more: bool) -> bool:
        self.reading[task.version] -= 1
        if not self.reading[task.version]:
            del self.reading[task.version]  # the oldest read is looked up per group: only live versions
        if self.arrival.stale(self.version, task.version):
            self.remaining.appendleft(TaskRange(task.task, task.lo, task.hi))
            self.recomputed += 1
            return False
        self.group.append((task, result))
        self.full = self.arrival.full(len(self.group), not (self.remaining or more))  # the epoch's last?
        return True

    def due(self) -> Due | None:
        if not self.full:
            return None
        group, self.group, self.full = self.group, [], False
        update = Update(self.epoch, self.batch, self.epoch * self.per_epoch + self.batch,
                        tuple(TaskRange(i, task.lo, task.hi) for i, (task, _) in enumerate(group)))
        self.ids = [task.task for task, _ in group]
        due = Due(update=update, gradients=group,
                  oldest=min(self.reading, default=self.version),
                  extra={"ids": self.ids, "discarded": self.recomputed})
        self.recomputed = 0
        return due

    def applied(self, position: Position, checksum: str | None) -> None:
        self.batch, self.version = position.batch, position.version
        self.state.add(self.ids)

    def done(self) -> bool:
        return not (self.remaining or self.group)


class RecordedAgenda:
    """``Recorded``: each step's gradients at their recorded versions, started once those exist; each due
    once all are in, added in the recorded order with the recorded learning rate; its version's checksum
    checked against the record."""

    def __init__(self, recorded: Recorded, position: Position, *, lineage: Path):
        self.steps, self.recorded, self.lineage = recorded.steps, recorded, lineage
        self.reads_from = recorded.reads_from()  # the oldest version any step from i on reads
        self.submitted = self.index = 0
        self.version = position.version
        self.pending = Pending()  # by step index

    def start(self, free: int, version: int) -> list[Start]:
        starts = []
        while self.submitted < len(self.steps) and self.recorded.ready(self.submitted, version):
            step = self.steps[self.submitted]
            starts += [Start(self.submitted, step.epoch - 1, TaskRange(step.task(i), gradient.lo, gradient.hi),
                             gradient.at) for i, gradient in enumerate(step.gradients)]
            self.submitted += 1
        return starts

    def arrived(self, task: GradTask, result: Result, more: bool) -> bool:
        self.pending.add(task, result)
        return True

    def due(self) -> Due | None:
        index = self.index
        if index >= self.submitted or not self.pending.complete(index, len(self.steps[index].gradients)):
            return None
        step = self.steps[index]
        update = Update(step.epoch - 1, step.batch - 1, step.update - 1,
                        tuple(TaskRange(i, g.lo, g.hi) for i, g in enumerate(step.gradients)))
        gradients = self.pending.take(index, (step.task(i) for i in range(len(step.gradients))))
        return Due(update=update, gradients=gradients,
                   oldest=self.reads_from[index + 1] if index + 1 < len(self.steps) else self.version,
                   extra={"ids": list(step.ids)} if step.ids else NO_EXTRA, lr=step.lr)

    def applied(self, position: Position, checksum: str | None) -> None:
        step = self.steps[self.index]
        if step.checksum is not None and checksum != step.checksum:
            raise replay_mismatch(step.version, step.checksum, checksum, self.lineage)
        self.index += 1
        self.version = position.version

    def done(self) -> bool:
        return self.index >= len(self.steps)


def replay_mismatch(version: int, recorded: str, found: str | None, lineage: Path) -> MemtrainError:
    """A replayed version whose checksum is not the recorded one (``lineage``: the lineage file)."""
    return MemtrainError(f"the replay differs from the run at weight version {version}", path=lineage,
                         where=f"version {version}", expected=recorded,
                         found=found or "a non-finite update (nothing published)",
                         hint="the data, the code or the machine's numerics changed since the run")
