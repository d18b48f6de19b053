"""The schedules on their own (memtrain/train/schedule.py): planned with staleness k, arrival order with groups
and a staleness bound, recorded. Pure code, so property tests of their rules, no files and no processes."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from memtrain.train.messages import GradTask, Outcome, Result
from memtrain.train.plan import TaskRange, Update
from memtrain.train.records.lineage import Gradient, Step
from memtrain.train.records.state import Position
from memtrain.train.schedule import Arrival, Planned, PlannedState, Recorded


@given(k=st.integers(0, 64), update=st.integers(0, 10_000))
def test_planned_computes_update_n_at_the_version_of_n_minus_k(k: int, update: int) -> None:
    planned = Planned(staleness=k)
    assert planned.at(update) == max(0, update - k)
    assert planned.at(update) <= planned.at(update + 1) <= planned.at(update) + 1, "versions never go back"
    assert Planned().at(update) == update, "k = 0 is synchronous: each update at the newest version"


@given(k=st.integers(0, 16), done=st.integers(0, 500), extra=st.integers(0, 500))
def test_planned_starts_only_updates_whose_version_exists_and_keeps_what_they_read(k: int, done: int,
                                                                                  extra: int) -> None:
    planned, total = Planned(staleness=k), done + extra
    startable = planned.startable(done, total)
    assert all(planned.at(u) <= done for u in startable), "a started update reads a version already made"
    assert len(startable) == min(k + 1, extra), "at most k + 1 updates in flight"
    if done + k + 1 < total:
        assert planned.at(done + k + 1) > done, "the next one needs a version not made yet"
    live = planned.live(done)
    assert all(planned.at(u) in live for u in range(done, total) if planned.at(u) <= done), \
        "every version made and still to be read is kept"
    assert len(live) <= k + 1


@given(group=st.integers(1, 8), bound=st.integers(0, 8), base=st.integers(0, 1000), back=st.integers(0, 20))
def test_arrival_discards_exactly_the_gradients_beyond_the_bound(group: int, bound: int, base: int,
                                                                 back: int) -> None:
    arrival = Arrival(group=group, max_staleness=bound)
    assert arrival.stale(base, base - back) == (back > bound)


@given(group=st.integers(1, 8), count=st.integers(1, 8), last=st.booleans())
def test_arrival_hands_a_group_over_when_full_or_holding_the_last_gradient(group: int, count: int,
                                                                            last: bool) -> None:
    assert Arrival(group=group).full(count, last) == (count >= group or last)


def test_arrival_base_counts_the_groups_handed_over_and_not_stepped() -> None:
    assert Arrival.base(newest=10, handed=4, stepped=4) == 10
    assert Arrival.base(newest=10, handed=6, stepped=4) == 12


@given(seed=st.integers(0, 2**32 - 1), tasks=st.integers(1, 40), group=st.integers(1, 5), bound=st.integers(0, 4),
       workers=st.integers(1, 6))
def test_arrival_in_a_simulated_run_applies_every_task_once_within_the_bound(seed: int, tasks: int, group: int,
                                                                               bound: int, workers: int) -> None:
    """Tasks computed by ``workers`` at the newest version and arriving in a random order, as the server's
    async loop applies them (train/loops/overlap.py): each task is applied once, none staler than the bound."""
    arrival, rng = Arrival(group=group, max_staleness=bound), random.Random(seed)
    remaining, in_flight, filling, applied, version = list(range(tasks)), [], [], [], 0
    for _ in range(100 * tasks * workers):  # a bound: a schedule that discards everything never ends
        if not (remaining or in_flight or filling):
            break
        while remaining and len(in_flight) < workers:
            in_flight.append((remaining.pop(0), version))
        task, at = in_flight.pop(rng.randrange(len(in_flight)))
        if arrival.stale(version, at):
            remaining.insert(0, task)
            continue
        filling.append((task, at))
        if arrival.full(len(filling), last=not (remaining or in_flight)):
            applied += [(task, version - at) for task, at in filling]
            filling, version = [], version + 1
    assert not (remaining or in_flight or filling), "the run ended"
    assert sorted(task for task, _ in applied) == list(range(tasks))
    assert all(staleness <= bound for _, staleness in applied)


def steps(ats: list[list[int]]) -> list[Step]:
    return [Step(version=n + 1, update=n + 1, epoch=1, batch=n + 1, gradients=tuple(Gradient(0, 1, a) for a in at),
                 lr=0.1, checksum="", line=n + 2) for n, at in enumerate(ats)]


@given(st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=4), min_size=1, max_size=30))
def test_recorded_keeps_every_version_a_later_step_reads_and_waits_for_the_newest(ats: list[list[int]]) -> None:
    recorded = Recorded(steps(ats))
    oldest = recorded.reads_from()
    for i in range(len(ats)):
        assert oldest[i] == min(a for later in ats[i:] for a in later)
        assert recorded.ready(i, max(ats[i])) and not recorded.ready(i, max(ats[i]) - 1)


@given(k=st.integers(0, 4), batch=st.integers(0, 6), extra=st.integers(1, 8), tasks=st.integers(1, 3))
def test_a_planned_agenda_starts_the_next_k_plus_1_updates_each_at_its_version(k: int, batch: int, extra: int,
                                                                              tasks: int) -> None:
    """Mid-epoch (``batch`` updates done, the versions they made in its ``PlannedState``), the agenda starts
    updates batch .. batch + k, each task at the version after max(0, n - k) updates; nothing more until one
    is applied; then it is due, its gradients in task order."""
    updates = [Update(0, b, b, tuple(TaskRange(t, t, t + 1) for t in range(tasks))) for b in range(batch + extra)]
    versions = {n: 100 + n for n in range(batch + 1)}  # a skipped update would make these differ from n
    state = PlannedState(staleness=k, bases=[[n, versions[n]] for n in range(max(0, batch - k), batch + 1)])
    position = Position(batch=batch, version=versions[batch], schedule=state)
    agenda, started = Planned(staleness=k).agenda(position, updates), []
    started += agenda.start(0, position.version)
    expected = [(n, versions[max(0, n - k)]) for n in range(batch, min(batch + k + 1, batch + extra))]
    assert [(t.ticket, t.version) for t in started[::tasks]] == expected
    assert len(started) == len(expected) * tasks
    started += agenda.start(0, position.version)
    assert len(started) == len(expected) * tasks, "nothing more before an update is applied"
    for task in reversed(started[:tasks]):  # the first update's gradients, arriving last task first
        assert agenda.due() is None
        gradient = GradTask(task=task.rows.task, attempt=0, ticket=task.ticket, version=task.version,
                            epoch=0, lo=task.rows.lo, hi=task.rows.hi)
        assert agenda.arrived(gradient, Result(task=gradient.task, attempt=0, outcome=Outcome.DONE), more=True)
    due = agenda.due()
    assert due is not None and due.update is updates[batch]
    assert [task.task for task, _ in due.gradients] == list(range(tasks)), "added in task order"
