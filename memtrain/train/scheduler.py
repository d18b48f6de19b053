"""A list of tasks -> their results in task order, whatever dies, hangs or answers late on the way.

A dead worker's task is re-run (with a new attempt number, so it writes a new file) on a replacement, and
whatever the dead attempt may have published is deleted at once (``discard``);
a task silent past its time limit gets its worker killed, then the same; a task that kills its worker
``max_attempts`` times stops the run naming the task and its shards. Results of old attempts are ignored.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from memtrain.errors import WorkerFailure, plural
from memtrain.faults import fault_point
from memtrain.train.exchange import Event, WorkerPool
from memtrain.train.messages import Result, Task

WAIT_BOUND = 1.0  # seconds: the longest the server blocks without re-checking deadlines and signals
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Scheduler:
    def __init__(self, pool: WorkerPool, *, task_timeout: float, max_attempts: int,
                 describe: Callable[[Task], str], log: Callable[[str], None], check_stop: Callable[[], None],
                 discard: Callable[[Task], None] = lambda task: None):
        self.pool = pool
        self.task_timeout = task_timeout
        self.max_attempts = max_attempts
        self.describe = describe
        self.log = log
        self.check_stop = check_stop  # raises Interrupted when a stop was requested
        self.discard = discard  # deletes what an attempt that will never be used may have written
        self.deaths = 0
        self.killed: set[int] = set()  # pids killed for silence: killed (and logged) once, then awaited

    def run(self, tasks: list[Task], while_waiting: Callable[[], None] | None = None) -> list[Result]:
        """Run every task to a result; returns the results in the order of ``tasks``.

        ``while_waiting`` is the server's own work that does not depend on these results. It is called
        once, as soon as a core is spare: at once if fewer workers are busy than there are cores, else
        when a worker has finished and nothing is left to send it while others still compute. Called
        right after sending on a machine with a core per worker, it would hold up the worker on the
        server's core (measured: the second worker then started 0.5 ms after the first at 1e6
        parameters). It is called at the latest before returning.
        """
        pending = deque(tasks)
        current = {task.task: task for task in tasks}
        done: dict[int, Result] = {}
        while len(done) < len(tasks):
            for slot in self.pool.idle_slots():
                if not pending:
                    break
                self.pool.send(slot, pending.popleft())
            for event in self.pool.wait(self._wait_time()):
                self._handle(event, current, pending, done)
            if while_waiting is not None and self._core_to_spare(done, pending, len(tasks)):
                while_waiting()
                while_waiting = None
            self.check_stop()
            self._kill_overdue()
        if while_waiting is not None:
            while_waiting()
        return [done[task.task] for task in tasks]

    def _handle(self, event: Event, current: dict[int, Task], pending: deque[Task], done: dict[int, Result]) -> None:
        task = event.task
        if task is None or current.get(task.task) != task or task.task in done:
            if task is not None and current.get(task.task) != task:
                self.discard(task)  # a superseded attempt answered late: its file is never read
            return  # an idle worker died, or a stale attempt answered: nothing to do
        if event.result is not None:
            if event.result.error is not None:
                raise WorkerFailure(f"{self.describe(task)} failed in worker {event.slot.index}:\n"
                                    f"{event.result.error.rstrip()}")
            if event.result.peer_wait_expired:  # its worker waited in vain for a peer's step slice: not its fault
                pending.append(task)
                return
            done[task.task] = event.result
            fault_point("after_result")
            return
        self.deaths += 1
        self.discard(task)  # at once: the exchange holds only what the run reserved, whatever fails
        self.log(f"worker {event.slot.index} (pid {event.slot.process.pid}) died with exit code {event.exitcode} "
                 f"during {self.describe(task)}, attempt {task.attempt + 1}")
        if task.attempt + 1 >= self.max_attempts:
            raise WorkerFailure(f"{self.describe(task)} killed its worker {plural(task.attempt + 1, 'time')} "
                                f"(last exit code {event.exitcode})", hint="the data or the model may crash the "
                                "worker; check the rows named above, or raise train.max_attempts")
        retry = replace(task, attempt=task.attempt + 1)
        current[task.task] = retry
        pending.appendleft(retry)

    def _core_to_spare(self, done: dict[int, Result], pending: deque[Task], total: int) -> bool:
        busy = sum(not slot.idle for slot in self.pool.slots)
        return busy < CORES or (bool(done) and not pending and len(done) < total)

    def _wait_time(self) -> float:
        busy = [slot.since for slot in self.pool.slots if not slot.idle and slot.process.pid not in self.killed]
        if not busy:
            return WAIT_BOUND
        return max(0.0, min(WAIT_BOUND, min(busy) + self.task_timeout - time.monotonic()))

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for slot in self.pool.slots:
            overdue = not slot.idle and now - slot.since > self.task_timeout
            if overdue and slot.process.pid not in self.killed and slot.process.is_alive():
                self.killed.add(slot.process.pid)
                self.log(f"worker {slot.index} (pid {slot.process.pid}) silent for {self.task_timeout:g} s "
                         f"on {self.describe(slot.current)}; killing it")
                self.pool.kill(slot)
