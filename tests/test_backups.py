"""The straggler rule of ``Scheduler.run`` (memtrain/train/server/scheduler.py ``BackupRule``), with a scripted
transport whose workers answer after a set time: a task running more than ``ratio`` x its finished peers' median
time, and at least ``seconds``, gets one backup copy on an idle worker under the next attempt number; the first copy to
answer is taken, what the other wrote is discarded (at once, and again when it answers), and a death of either
copy leaves the other to finish."""

from __future__ import annotations

import time

import pytest

from memtrain.train.messages import BackupRule, Event, GradTask, Message, Outcome, Result, SetAside, Slot
from memtrain.train.server.scheduler import Scheduler


class Timed:
    """Workers that answer a message ``delay[(task, attempt)]`` seconds after it was sent (default 0), or die
    then if (task, attempt) is in ``die``."""

    def __init__(self, slots: int, delay: dict[tuple[int, int], float], die: frozenset = frozenset()):
        self.slots = [Slot(index=i, process=None, ready=True) for i in range(slots)]
        self.delay, self.die, self.sent = delay, die, []
        self.aside = SetAside()

    def send(self, slot: Slot, message: Message) -> None:
        slot.current, slot.since = message, time.monotonic()
        self.sent.append((message.task, message.attempt, slot.index))

    def _due(self, slot: Slot) -> float:
        return slot.since + self.delay.get((slot.current.task, slot.current.attempt), 0.0)

    def wait(self, timeout: float) -> list[Event]:
        busy = [slot for slot in self.slots if slot.current is not None]
        if busy:
            time.sleep(max(0.0, min(timeout, min(self._due(slot) for slot in busy) - time.monotonic())))
        events = []
        for slot in busy:
            if self._due(slot) > time.monotonic():
                continue
            message, slot.current = slot.current, None
            if (message.task, message.attempt) in self.die:
                events.append(Event(slot, None, message, exitcode=-9))
            else:
                events.append(Event(slot, Result(task=message.task, attempt=message.attempt, outcome=Outcome.DONE,
                                                 loss=float(message.task), rows=1), message))
        return events

    def kill(self, slot: Slot) -> None:
        raise AssertionError("nothing here is silent")

    def close(self, timeout: float = 5.0) -> None:
        pass


def scheduler(logs: list[str], discarded: list, rule: BackupRule | None) -> Scheduler:
    return Scheduler(task_timeout=60, max_attempts=3, describe_task=lambda t: f"task {t.task}",
                     log=logs.append, stop_requested=lambda: False,
                     discard=discarded.append, backup=rule)


def tasks(count: int) -> list[GradTask]:
    return [GradTask(task=t, attempt=0, ticket=4, version=4, epoch=0, lo=t, hi=t + 1, spare=f"g-s{t}")
            for t in range(count)]


RULE = BackupRule(ratio=3.0, seconds=0.1)


def test_a_straggler_gets_a_backup_on_an_idle_worker_and_the_first_to_finish_is_taken() -> None:
    logs, discarded = [], []
    transport = Timed(3, {(1, 0): 5.0, (0, 0): 0.02})
    started = time.monotonic()
    results = scheduler(logs, discarded, RULE).run(transport, tasks(3))
    assert time.monotonic() - started < 2.0, "the straggler was outrun, not waited for"
    assert [(r.task, r.attempt) for r in results] == [(0, 0), (1, 1), (2, 0)]
    assert (1, 1) in [(task, attempt) for task, attempt, _ in transport.sent]
    assert [(t.task, t.attempt) for t in discarded] == [(1, 0)], "the loser's file is discarded, never read"
    assert any("task 1 has run" in line and "a backup copy (attempt 1)" in line for line in logs)
    assert any("the backup copy (attempt 1) finished first" in line for line in logs)
    backup = next(t for t in transport.slots if t.current is not None).current
    assert (backup.task, backup.attempt) == (1, 0), "the loser still runs; its answer, when it comes, is stale"


def test_a_backup_copy_never_rewrites_the_spare_its_original_may_be_writing() -> None:
    logs, discarded = [], []
    sent = []
    transport = Timed(2, {(1, 0): 5.0})
    send = transport.send
    transport.send = lambda slot, message: (sent.append(message), send(slot, message))
    scheduler(logs, discarded, RULE).run(transport, tasks(2))
    copy = next(m for m in sent if m.attempt == 1)
    assert copy.spare == "" and sent[1].spare == "g-s1"


def test_the_original_is_taken_when_it_finishes_first_and_the_backups_late_answer_is_discarded() -> None:
    logs, discarded = [], []
    transport = Timed(2, {(1, 0): 0.4, (1, 1): 5.0})
    rule = BackupRule(ratio=2.0, seconds=0.1)
    results = scheduler(logs, discarded, rule).run(transport, tasks(2))
    assert [(r.task, r.attempt) for r in results] == [(0, 0), (1, 0)]
    assert [(t.task, t.attempt) for t in discarded] == [(1, 1)]
    assert any("the original (attempt 0) finished first" in line for line in logs)
    # the next call gets the loser's late answer: stale, discarded again, never taken
    transport.delay[(1, 1)] = 0.0
    later = [GradTask(task=0, attempt=0, ticket=5, version=5, epoch=0, lo=0, hi=1)]
    assert [(r.task, r.attempt) for r in scheduler(logs, discarded, rule).run(transport, later)] == [(0, 0)]
    assert [(t.task, t.attempt) for t in discarded] == [(1, 1), (1, 1)]


def test_no_backup_below_the_rules_thresholds_or_without_a_rule() -> None:
    for rule, delay in ((BackupRule(ratio=3.0, seconds=2.0), 0.5), (BackupRule(ratio=100.0, seconds=0.0), 0.3),
                        (None, 0.5)):
        logs, discarded = [], []
        transport = Timed(3, {(1, 0): delay, (0, 0): 0.01, (2, 0): 0.01})
        results = scheduler(logs, discarded, rule).run(transport, tasks(3))
        assert [(r.task, r.attempt) for r in results] == [(0, 0), (1, 0), (2, 0)], rule
        assert all(attempt == 0 for _, attempt, _ in transport.sent) and not discarded


def test_a_death_of_either_copy_leaves_the_other_to_finish_and_a_rerun_takes_a_new_attempt_number() -> None:
    logs, discarded = [], []
    transport = Timed(2, {(1, 0): 0.5, (1, 1): 0.1}, die=frozenset({(1, 0)}))  # the original dies after the backup
    results = scheduler(logs, discarded, BackupRule(ratio=2.0, seconds=0.1)).run(transport, tasks(2))
    assert [(r.task, r.attempt) for r in results] == [(0, 0), (1, 1)]

    logs, discarded = [], []
    # the backup dies: the original goes on (and may get another backup, which here is slower still)
    transport = Timed(2, {(1, 0): 1.0, (1, 1): 0.2, (1, 2): 5.0}, die=frozenset({(1, 1)}))
    results = scheduler(logs, discarded, BackupRule(ratio=2.0, seconds=0.1)).run(transport, tasks(2))
    assert [(r.task, r.attempt) for r in results] == [(0, 0), (1, 0)]
    assert (1, 1) in [(t.task, t.attempt) for t in discarded]
    assert any("during the backup copy of task 1; the original goes on" in line for line in logs)

    logs, discarded = [], []  # both die: the re-run takes attempt 2, never a name a copy used
    transport = Timed(2, {(1, 0): 0.6, (1, 1): 0.1}, die=frozenset({(1, 0), (1, 1)}))
    results = scheduler(logs, discarded, BackupRule(ratio=2.0, seconds=0.1)).run(transport, tasks(2))
    assert [(r.task, r.attempt) for r in results] == [(0, 0), (1, 2)]


def test_the_rule_comes_from_the_job_on_a_cluster_only_and_its_values_are_range_checked() -> None:
    from memtrain.config import DataConfig, Job, ModelConfig, RunConfig, TrainConfig
    from memtrain.errors import InputError
    from memtrain.train.server.server import backup_rule

    def job(cluster: str, **train: float) -> Job:
        return Job(DataConfig(), ModelConfig(), TrainConfig(**train), RunConfig(cluster=cluster))

    assert backup_rule(job("local:2")) == BackupRule(ratio=3.0, seconds=0.5)
    assert backup_rule(job("local:2", backup_ratio=1.5, backup_seconds=0)) == BackupRule(ratio=1.5, seconds=0)
    assert backup_rule(job("")) is None, "on one machine the rounds run the gradients: no backups"
    assert backup_rule(job("local:2", backup_ratio=0)) is None
    for key, value in (("backup_ratio", 0.5), ("backup_ratio", float("inf")), ("backup_seconds", -1.0)):
        with pytest.raises(InputError, match=f"train.{key} out of range"):
            TrainConfig(**{key: value})


class SlowSlot(Timed):
    """Workers whose every answer takes ``slow`` seconds on the slots in ``lagging``, 0.01 s elsewhere."""

    def __init__(self, slots: int, lagging: set[int], slow: float):
        super().__init__(slots, {})
        self.lagging, self.slow = lagging, slow

    def _due(self, slot: Slot) -> float:
        return slot.since + (self.slow if slot.index in self.lagging else 0.01)


def test_a_worker_that_lagged_is_set_aside_and_the_next_calls_tasks_go_to_the_others() -> None:
    """Below the backup floor (2 s) a 0.3 s lag gets no backup copy, but it sets the worker aside: the next
    call's tasks all go to the healthy worker (queued there) instead of waiting 0.3 s for the straggler."""
    logs, discarded = [], []
    transport = SlowSlot(2, lagging={1}, slow=0.3)
    run = scheduler(logs, discarded, BackupRule(ratio=3.0, seconds=2.0))
    assert [(r.task, r.attempt) for r in run.run(transport, tasks(2))] == [(0, 0), (1, 0)]
    assert any("worker 1 took 0.3" in line and "set aside, its work goes to the others" in line for line in logs)
    transport.sent.clear()
    started = time.monotonic()
    assert [(r.task, r.attempt) for r in run.run(transport, tasks(3))] == [(0, 0), (1, 0), (2, 0)]
    assert time.monotonic() - started < 0.25, "the straggler was not waited for"
    assert {index for _, _, index in transport.sent} == {0} and not discarded


def test_without_a_rule_no_worker_is_set_aside() -> None:
    logs, discarded = [], []
    transport = SlowSlot(2, lagging={1}, slow=0.1)
    run = scheduler(logs, discarded, None)
    for _ in range(2):
        transport.sent.clear()
        run.run(transport, tasks(2))
        assert {index for _, _, index in transport.sent} == {0, 1}
    assert not any("set aside" in line for line in logs)


def test_an_answer_in_time_while_still_aside_does_not_clear_a_stragglers_record(monkeypatch) -> None:
    """A worker stopped most of the time answers a small share in time now and then: that is not a probe (its time
    aside is not over), so its next lag sets it aside for twice as long, not for the first time again (before, a
    worker stopped 80% of the time was set aside 30 times a run for 0.5 s each, and taken back at once)."""
    from memtrain.train import messages

    now = [100.0]
    monkeypatch.setattr(messages.time, "monotonic", lambda: now[0])
    logs: list[str] = []
    aside, rule, slot = SetAside(), BackupRule(ratio=3.0, seconds=0.5), Slot(index=1, process=None)
    aside.judge(slot, 0.9, [0.01], rule, logs.append)
    assert aside.until[1] == 100.5 and not aside.usable_now(slot)
    aside.judge(slot, 0.01, [0.01], rule, logs.append)  # in time, but still aside: its record stands
    assert aside.strikes[1] == 1 and not any("keeps up with its peers again" in line for line in logs)
    aside.judge(slot, 0.9, [0.01], rule, logs.append)
    assert aside.until[1] == 101.0  # twice as long: the second set-aside in a row
    now[0] = 101.5  # its time aside is over: an answer in time now is a probe, and clears its record
    aside.judge(slot, 0.01, [0.01], rule, logs.append)
    assert 1 not in aside.strikes and any("worker 1 keeps up with its peers again" in line for line in logs)


def test_when_every_worker_is_aside_those_whose_time_ends_first_get_the_work(monkeypatch) -> None:
    """Two workers, both set aside: the one set aside by a short false alarm gets the work, not both (before,
    every slot was usable again when all were aside, and the straggler came back with the healthy one)."""
    from memtrain.train import messages

    now = [100.0]
    monkeypatch.setattr(messages.time, "monotonic", lambda: now[0])
    aside, rule = SetAside(), BackupRule(ratio=3.0, seconds=0.5)
    healthy, straggler = Slot(index=0, process=None), Slot(index=1, process=None)
    for _ in range(3):  # three lags in a row: aside for 2 s
        aside.judge(straggler, 0.9, [0.01], rule, lambda line: None)
    aside.judge(healthy, 0.05, [0.01], rule, lambda line: None)  # a false alarm: aside for 0.5 s
    assert aside.usable([healthy, straggler]) == [healthy]
    now[0] = 100.6
    assert aside.usable([healthy, straggler]) == [healthy]
    assert aside.usable([]) == []
