"""The server's one loop (memtrain/train/loops/overlap.py ``Overlap.run``) driven by a fake task stream under each
schedule's agenda (memtrain/train/schedule.py): gradients come back in a random order from a random number of
workers; the step is replaced by a record of what it was given. No files, no processes."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrain.errors import MemtrainError
from memtrain.train.loops.overlap import Overlap
from memtrain.train.messages import GradTask, Outcome, Result
from memtrain.train.plan import TaskRange, Update
from memtrain.train.records.lineage import Gradient, Step
from memtrain.train.records.state import Position
from memtrain.train.schedule import Arrival, ArrivalState, Planned, PlannedState, Recorded

RESULT = Result(task=0, attempt=0, outcome=Outcome.DONE, loss=1.0)


class FakeStream:
    """``TaskStream``'s interface: ``slots`` workers; ``wait`` returns a random non-empty share of the tasks
    in flight, in a random order."""

    def __init__(self, slots: int, rng: random.Random):
        self.slots, self.rng, self.current = slots, rng, []
        self.submitted: list[GradTask] = []

    def submit(self, task: GradTask) -> None:
        assert (task.ticket, task.task) not in {(t.ticket, t.task) for t in self.current}, "a key twice in flight"
        self.current.append(task)
        self.submitted.append(task)

    @property
    def in_flight(self) -> int:
        return len(self.current)

    def free(self) -> int:
        return max(0, self.slots - len(self.current))

    def wait(self) -> list[tuple[GradTask, Result]]:
        assert self.current, "waited with nothing in flight: the loop would hang"
        self.rng.shuffle(self.current)
        count = self.rng.randint(1, len(self.current))
        back, self.current = self.current[:count], self.current[count:]
        return [(task, Result(task=task.task, attempt=0, outcome=Outcome.DONE, loss=1.0)) for task in back]


class Recording(Overlap):
    """The loop as it is, its step replaced: each applied update is recorded, and the position moved as the
    logbook moves it (a new version; fixed staleness's live bases)."""

    def __init__(self, stream: FakeStream, staleness: int = 0, checksums: dict[int, str] | None = None):
        files = SimpleNamespace(exchange=Path("/nonexistent"))  # a stale gradient's file: none to delete here
        super().__init__(epochs=1, files=files, stream=stream, logbook=None, per_epoch=1, chores=lambda position: None)
        self.staleness, self.checksums = staleness, checksums or {}
        self.steps: list[tuple[Update, list[GradTask], int, float | None, dict]] = []

    def apply(self, position: Position, update: Update, arrived: list, *, oldest: int, lr: float | None = None,
              **lineage: object) -> str | None:
        self.steps.append((update, [task for task, _ in arrived], oldest, lr, lineage))
        reading = [task.version for task in self.stream.current]  # the versions tasks in flight read
        assert oldest <= min(reading, default=oldest), "a version a task in flight reads is retired"
        before = position.version
        position.version += 1
        position.batch += 1
        position.schedule.logged(update.update, before, position.version)  # as the logbook reports it
        return self.checksums.get(position.version, f"v{position.version}")


def plan_updates(updates: int, tasks: int) -> list[Update]:
    return [Update(0, b, b, tuple(TaskRange(t, 10 * (b * tasks + t), 10 * (b * tasks + t + 1)) for t in range(tasks)))
            for b in range(updates)]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(0, 3), updates=st.integers(1, 12), tasks=st.integers(1, 4),
       workers=st.integers(1, 6))
def test_planned_applies_the_plan_in_order_each_update_at_its_fixed_version(seed: int, k: int, updates: int,
                                                                           tasks: int, workers: int) -> None:
    stream = FakeStream(workers, random.Random(seed))
    loop, plan = Recording(stream, staleness=k), plan_updates(updates, tasks)
    position = Position(schedule=PlannedState(staleness=k))
    loop.run(position, Planned(staleness=k).agenda(position, plan))
    assert [update for update, *_ in loop.steps] == plan, "every update once, in plan order"
    for n, (update, got, oldest, lr, lineage) in enumerate(loop.steps):
        assert [t.task for t in got] == [t.task for t in update.tasks], "added in task order"
        assert {t.version for t in got} == {max(0, n - k)}, "at the version after max(0, n - k) updates"
        later = [max(0, m - k) for m in range(n + 1, updates)]
        assert oldest <= min(later, default=n + 1), "no version a later update reads is retired"
        assert lr is None and not lineage
    assert position.version == position.batch == updates and stream.in_flight == 0


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), group=st.integers(1, 4), bound=st.integers(0, 3), count=st.integers(1, 20),
       workers=st.integers(1, 6), done=st.integers(0, 5))
def test_arrival_applies_every_task_once_in_arrival_order_within_the_bound(seed: int, group: int, bound: int,
                                                                           count: int, workers: int,
                                                                           done: int) -> None:
    stream = FakeStream(workers, random.Random(seed))
    loop = Recording(stream)
    updates = plan_updates(count, 1)
    applied = list(range(min(done, count - 1)))  # a resumed epoch: these tasks were applied before the stop
    position = Position(schedule=ArrivalState(applied=list(applied)))
    loop.run(position, Arrival(group=group, max_staleness=bound, per_epoch=99).agenda(position, updates))
    got = [task for _, tasks_in, *_ in loop.steps for task in tasks_in]
    assert sorted(t.task for t in got) == sorted(set(range(count)) - set(applied)), "each task not applied, once"
    sizes = [len(tasks_in) for _, tasks_in, *_ in loop.steps]
    assert all(size == group for size in sizes[:-1]) and 0 < sizes[-1] <= group
    for n, (update, tasks_in, oldest, _, lineage) in enumerate(loop.steps):
        assert all(n - t.version <= bound for t in tasks_in), "no gradient staler than max_staleness"
        assert lineage["ids"] == [t.task for t in tasks_in], "the lineage names the tasks in the order added"
        assert [(r.lo, r.hi) for r in update.tasks] == [(t.lo, t.hi) for t in tasks_in]
        assert update.batch == n and update.update == n, "an update's number counts the groups"
        assert oldest <= n
    discarded = sum(lineage["discarded"] for *_, lineage in loop.steps)
    assert len(stream.submitted) == len(got) + discarded, "every stale gradient was computed again"
    assert len({t.ticket for t in stream.submitted}) == len(stream.submitted), "each hand-out has its own ticket"
    assert position.schedule == ArrivalState(applied=[]), "the epoch's end clears the record of applied tasks"


def test_arrival_counts_applied_tasks_mid_epoch() -> None:
    """Mid-epoch (a stop after the first group), the schedule's state names the tasks applied so far."""
    position = Position(schedule=ArrivalState())
    agenda = Arrival(group=2, per_epoch=2).agenda(position, plan_updates(4, 1))
    handed = [GradTask(task=rows.task, attempt=0, ticket=ticket, version=version, epoch=epoch, lo=rows.lo, hi=rows.hi)
              for ticket, epoch, rows, version in agenda.start(2, 0)]  # two idle workers: each task takes one
    assert [t.task for t in handed] == [0, 1] and [t.ticket for t in handed] == [1, 2]
    assert agenda.arrived(handed[1], RESULT, more=True) and agenda.due() is None
    assert agenda.arrived(handed[0], RESULT, more=False)
    due = agenda.due()
    assert due is not None and [task.ticket for task, _ in due.gradients] == [2, 1], "arrival order"
    position.version, position.batch = 1, 1
    agenda.applied(position, "c")
    assert position.schedule == ArrivalState(applied=[1, 0]) and not agenda.done()


def steps(ats: list[list[int]], ids: bool) -> list[Step]:
    return [Step(version=n + 1, update=n + 1, epoch=1, batch=n + 1, lr=0.5 / (n + 1), checksum=f"v{n + 1}", line=n,
                 gradients=tuple(Gradient(10 * i, 10 * i + 10, a) for i, a in enumerate(at)),
                 ids=tuple(range(len(at)))[::-1] if ids else ()) for n, at in enumerate(ats)]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), data=st.data(), workers=st.integers(1, 6), ids=st.booleans())
def test_recorded_replays_each_step_as_recorded(seed: int, data: st.DataObject, workers: int, ids: bool) -> None:
    count = data.draw(st.integers(1, 12))
    ats = [data.draw(st.lists(st.integers(max(0, n - 3), n), min_size=1, max_size=4)) for n in range(count)]
    stream = FakeStream(workers, random.Random(seed))
    loop, position, recorded = Recording(stream), Position(), steps(ats, ids)
    loop.run(position, Recorded(recorded).agenda(position))
    assert len(loop.steps) == count
    for step, (update, got, oldest, lr, lineage) in zip(recorded, loop.steps, strict=True):
        assert [t.version for t in got] == [g.at for g in step.gradients], "each gradient at its recorded version"
        assert [t.task for t in got] == [step.task(i) for i in range(len(step.gradients))], "in the recorded order"
        assert lr == step.lr and (update.epoch, update.batch, update.update) == (0, step.batch - 1, step.update - 1)
        assert lineage == ({"ids": list(step.ids)} if ids else {})
        assert oldest <= min((g.at for later in recorded[step.update:] for g in later.gradients), default=oldest)


def test_recorded_stops_at_the_first_version_that_differs() -> None:
    stream = FakeStream(2, random.Random(0))
    loop, position = Recording(stream, checksums={2: "something else"}), Position()
    with pytest.raises(MemtrainError, match="differs from the run at weight version 2"):
        loop.run(position, Recorded(steps([[0], [1], [2]], ids=False)).agenda(position))
    assert len(loop.steps) == 2, "nothing stepped after the mismatch"
