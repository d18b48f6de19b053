"""The scheduler's fault rules on their own (memtrain/train/server/scheduler.py), with a scripted transport: no process
is started. A dead worker's task re-runs under the next attempt number (first in line, what it wrote
discarded), a task that kills its worker ``max_attempts`` times stops the run naming it, a failure stops it
with the worker's text, and the results come back in task order (``run``) or as they arrive (``TaskStream``)."""

from __future__ import annotations

import time

import pytest

from memtrain.errors import WorkerFailure
from memtrain.train.messages import EvalTask, Event, GradTask, Message, Outcome, Result, SetAside, Slot
from memtrain.train.server.scheduler import Scheduler


class Scripted:
    """Workers that answer every message at the next wait, as ``script[(task, attempt)]`` says: "ok" (the
    default), "die" (the process dies: no answer), "nostart" (once: it dies before it started) or "fail" (the
    work raised)."""

    def __init__(self, slots: int, script: dict[tuple[int, int], str]):
        self.slots = [Slot(index=i, process=None, ready=True) for i in range(slots)]
        self.script, self.sent = script, []
        self.aside = SetAside()

    def send(self, slot: Slot, message: Message) -> None:
        slot.current, slot.since = message, time.monotonic()
        self.sent.append(message)

    def wait(self, timeout: float) -> list[Event]:
        events = []
        for slot in self.slots:
            message, slot.current = slot.current, None
            if message is None:
                continue
            what = self.script.get((message.task, message.attempt), "ok")
            if what == "nostart":  # once: the process dies before it said Ready, so it never ran the message
                self.script[message.task, message.attempt] = "ok"
                events.append(Event(slot, None, message, exitcode=1, started=False))
            elif what == "die":
                events.append(Event(slot, None, message, exitcode=-9))
            elif what == "oom":
                events.append(Event(slot, Result(task=message.task, attempt=message.attempt, outcome=Outcome.FAILED,
                                                 error="MemoryError: Unable to allocate 8.00 GiB"), message))
            elif what == "fail":
                events.append(Event(slot, Result(task=message.task, attempt=message.attempt, outcome=Outcome.FAILED,
                                                 error="ValueError: bad rows"), message))
            else:
                events.append(Event(slot, Result(task=message.task, attempt=message.attempt, outcome=Outcome.DONE,
                                                 loss=float(message.task), rows=1), message))
        return events

    def kill(self, slot: Slot) -> None:
        raise AssertionError("nothing here is silent")

    def close(self, timeout: float = 5.0) -> None:
        pass


def scheduler(logs: list[str], discarded: list, max_attempts: int = 3) -> Scheduler:
    return Scheduler(task_timeout=60, max_attempts=max_attempts, describe_task=lambda t: f"task {t.task}",
                     log=logs.append, stop_requested=lambda: False,
                     discard=discarded.append)


def tasks(count: int) -> list[EvalTask]:
    return [EvalTask(task=t, attempt=0, version=3, lo=10 * t, hi=10 * t + 10) for t in range(count)]


def test_a_dead_workers_task_reruns_first_under_the_next_attempt_and_results_come_in_task_order() -> None:
    logs, discarded = [], []
    transport = Scripted(2, {(1, 0): "die", (1, 1): "die"})
    results = scheduler(logs, discarded).run(transport, tasks(4))
    assert [(r.task, r.attempt) for r in results] == [(0, 0), (1, 2), (2, 0), (3, 0)]
    assert [(t.task, t.attempt) for t in discarded] == [(1, 0), (1, 1)], "what a dead attempt wrote is deleted"
    sent = [(t.task, t.attempt) for t in transport.sent]
    assert sent.index((1, 1)) < sent.index((3, 0)), "a re-run goes before the tasks not sent yet"
    assert sum("died with exit code -9 during task 1" in line for line in logs) == 2


def test_a_task_that_kills_its_worker_max_attempts_times_stops_the_run_naming_it() -> None:
    logs, discarded = [], []
    transport = Scripted(1, {(2, a): "die" for a in range(3)})
    with pytest.raises(WorkerFailure, match="task 2 killed its worker 3 times"):
        scheduler(logs, discarded).run(transport, tasks(3))


def test_a_failure_stops_the_run_with_the_workers_text() -> None:
    with pytest.raises(WorkerFailure, match="task 1 failed in worker 0:\nValueError: bad rows"):
        scheduler([], []).run(Scripted(1, {(1, 0): "fail"}), tasks(2))


def test_the_task_stream_gives_results_as_they_arrive_with_the_attempt_that_made_them() -> None:
    logs, discarded = [], []
    stream = scheduler(logs, discarded).stream(Scripted(2, {(5, 0): "die"}))
    for t in (5, 6, 7):
        stream.submit(GradTask(task=t, attempt=0, ticket=t, version=1, epoch=0, lo=0, hi=1))
    with pytest.raises(ValueError, match="already in the stream"):
        stream.submit(GradTask(task=6, attempt=0, ticket=6, version=1, epoch=0, lo=0, hi=1))
    arrived = []
    while stream.in_flight:
        arrived += [(task.task, task.attempt, result.attempt) for task, result in stream.wait()]
    assert sorted(arrived) == [(5, 1, 1), (6, 0, 0), (7, 0, 0)]
    assert [(t.task, t.attempt) for t in discarded] == [(5, 0)]


def test_a_worker_that_never_started_costs_its_task_no_attempt() -> None:
    logs, discarded = [], []
    results = scheduler(logs, discarded, max_attempts=1).run(Scripted(1, {(1, 0): "nostart"}), tasks(2))
    assert [(r.task, r.attempt) for r in results] == [(0, 0), (1, 0)]  # sent on unchanged, not a death of task 1
    assert any("could not start (exit code 1)" in line for line in logs)


class DiesWhileIdle(Scripted):
    """Slot 0 computes its task forever; slot 1's worker dies at every wait while it waits for work."""

    def wait(self, timeout: float) -> list[Event]:
        return [Event(self.slots[1], None, None, exitcode=-9)]


def test_a_slot_whose_workers_keep_dying_outside_any_task_stops_the_run() -> None:
    logs = []
    with pytest.raises(WorkerFailure, match=r"worker 1 died 3 times in a row outside any piece of work \(last exit "
                                            r"code -9: SIGKILL\)"):
        scheduler(logs, []).run(DiesWhileIdle(2, {}), tasks(1))
    assert sum("died with exit code -9 while idle" in line for line in logs) == 3


def test_an_answer_from_the_slot_ends_its_deaths_in_a_row() -> None:
    logs = []
    sched = scheduler(logs, [])
    transport = Scripted(2, {})
    for _ in range(2):
        sched._died_idle(Event(transport.slots[1], None, None, exitcode=-9))  # noqa: SLF001
    sched.run(transport, tasks(2))  # slot 1 answers task 1
    sched._died_idle(Event(transport.slots[1], None, None, exitcode=-9))  # noqa: SLF001 - 1 in a row, not 3
    assert "(1 death of this slot in a row)" in logs[-1]


def test_a_memory_error_gets_the_hint_the_oom_killer_gets() -> None:
    with pytest.raises(WorkerFailure) as caught:
        scheduler([], []).run(Scripted(1, {(1, 0): "oom"}), tasks(2))
    assert "it ran out of memory" in caught.value.hint and "Lower train.chunk_rows" in caught.value.hint
