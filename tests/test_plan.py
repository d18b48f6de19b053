"""The plan: tasks per update, deterministic, reading every row once per epoch (whatever train.shuffle)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from memtrain.order import SHUFFLES
from memtrain.train.plan import (
    Plan,
    TaskRange,
    async_updates_per_epoch,
    epoch_updates,
    eval_tasks,
    gradient_base,
    live_bases,
    run_updates_per_epoch,
    split_range,
    startable_updates,
    task_stream,
    updates_per_epoch,
)


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 64))
def test_split_range_cuts_contiguous_near_equal_pieces(lo: int, length: int, parts: int) -> None:
    hi = lo + length
    pieces = split_range(lo, hi, parts)
    if length == 0:
        assert pieces == [(lo, hi)] or pieces == []
        return
    assert pieces[0][0] == lo and pieces[-1][1] == hi
    assert all(a < b for a, b in pieces)
    assert all(pieces[i][1] == pieces[i + 1][0] for i in range(len(pieces) - 1))
    assert len(pieces) == min(parts, length)
    sizes = [b - a for a, b in pieces]
    assert max(sizes) - min(sizes) <= 1


@given(rows=st.integers(1, 5_000), batch=st.one_of(st.none(), st.integers(1, 700)), tasks=st.integers(1, 9),
       seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 50), shuffle=st.sampled_from(SHUFFLES),
       window=st.integers(1, 6_000))
def test_an_epoch_visits_every_row_exactly_once(rows: int, batch: int | None, tasks: int, seed: int,
                                                epoch: int, shuffle: str, window: int) -> None:
    updates = epoch_updates(rows, batch, tasks, seed, epoch, shuffle=shuffle)
    assert len(updates) == updates_per_epoch(rows, batch)
    covered = sorted((t.lo, t.hi) for u in updates for t in u.tasks)
    assert covered[0][0] == 0 and covered[-1][1] == rows
    assert all(covered[i][1] == covered[i + 1][0] for i in range(len(covered) - 1))
    for number, update in enumerate(updates):
        assert update.epoch == epoch and update.batch == number
        assert update.update == epoch * len(updates) + number
        assert [t.task for t in update.tasks] == list(range(len(update.tasks)))
        assert len(update.tasks) <= tasks
        assert batch is None or update.rows <= batch
    assert updates == epoch_updates(rows, batch, tasks, seed, epoch, shuffle=shuffle), "the plan must be deterministic"
    plan = Plan(rows, batch, tasks, seed, epoch + 1, shuffle=shuffle, window=window)
    read = np.concatenate([np.asarray(plan.rows(epoch, t.lo, t.hi)) for u in updates for t in u.tasks])
    np.testing.assert_array_equal(np.sort(read), np.arange(rows))  # the rows the tasks read: each row once


def test_batch_order_changes_between_epochs_but_not_between_runs() -> None:
    orders = [[u.tasks[0].lo for u in epoch_updates(10_000, 100, 2, 7, epoch, shuffle="batches")]
              for epoch in range(3)]
    assert orders[0] != orders[1] != orders[2]
    assert orders[1] == [u.tasks[0].lo for u in epoch_updates(10_000, 100, 2, 7, 1, shuffle="batches")]


def test_every_epoch_has_the_same_batches_whose_tasks_are_made_once() -> None:
    """An epoch's updates are the same batches in another order: each batch's tasks are one tuple for every epoch
    (a plan's list of updates made its tasks anew every epoch: most of its cost, per update of the rounds)."""
    tasks = [{u.tasks[0].lo: u.tasks for u in epoch_updates(10_000, 100, 2, 7, epoch, shuffle="batches")}
             for epoch in range(2)]
    assert tasks[0].keys() == tasks[1].keys()
    assert all(tasks[0][lo] is tasks[1][lo] for lo in tasks[0])
    assert tasks[0][300] == (TaskRange(0, 300, 350), TaskRange(1, 350, 400))


@given(st.integers(0, 100_000), st.integers(1, 10_000), st.integers(1, 16))
def test_eval_tasks_cover_the_validation_split(rows: int, per_task: int, at_least: int) -> None:
    tasks = eval_tasks(rows, per_task, at_least=at_least)
    assert sum(t.rows for t in tasks) == rows
    assert all(t.rows <= per_task for t in tasks)
    assert len(tasks) >= min(rows, at_least), "as many tasks as the update's, while there are rows for them"
    assert [(t.lo, t.hi) for t in tasks] == [(t.lo, t.hi) for t in eval_tasks(rows, per_task, at_least=at_least)]


@given(staleness=st.integers(0, 64), total=st.integers(1, 300), done=st.integers(0, 300))
def test_fixed_staleness_keeps_k_plus_1_updates_and_versions_in_flight(staleness: int, total: int, done: int) -> None:
    done = min(done, total)
    bases = [gradient_base(n, staleness) for n in range(total)]
    assert all(n - staleness <= base <= n for n, base in enumerate(bases)), "k updates behind, never ahead"
    assert bases == sorted(bases), "a later update never uses older weights"
    assert staleness or bases == list(range(total)), "staleness 0 is synchronous training"
    startable = startable_updates(done, staleness, total)
    assert len(startable) <= staleness + 1
    assert all(bases[n] <= done for n in startable), "every startable update has its weights"
    assert all(bases[n] > done for n in range(startable.stop, total)), "the next one is not startable yet"
    live = live_bases(done, staleness)
    assert len(live) <= staleness + 1 and live.stop - 1 == done
    assert {bases[n] for n in startable} <= set(live), "in-flight gradients need only the live versions"
    assert all(bases[n] >= live.start for n in range(done, total)), \
        "a checkpoint after `done` updates that carries the live versions has every version the rest needs"


@given(rows=st.integers(1, 3_000), batch=st.one_of(st.none(), st.integers(1, 500)), tasks=st.integers(1, 9),
       group=st.integers(1, 9), seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 20),
       shuffle=st.sampled_from(SHUFFLES))
def test_the_async_task_stream_is_the_epochs_tasks_in_plan_order(rows: int, batch: int | None, tasks: int,
                                                                 group: int, seed: int, epoch: int,
                                                                 shuffle: str) -> None:
    updates = epoch_updates(rows, batch, tasks, seed, epoch, shuffle=shuffle)
    stream = task_stream(updates)
    assert [t.task for t in stream] == list(range(len(stream)))
    assert [(t.lo, t.hi) for t in stream] == [(t.lo, t.hi) for u in updates for t in u.tasks]
    per_epoch = run_updates_per_epoch(rows, batch, tasks, group)
    assert per_epoch == async_updates_per_epoch(len(stream), group)
    assert (per_epoch - 1) * group < len(stream) <= per_epoch * group, "every group full but the last"
    assert run_updates_per_epoch(rows, batch, tasks, None) == updates_per_epoch(rows, batch)
