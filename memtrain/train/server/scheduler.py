"""Work sent to a transport -> its answers, whatever dies, hangs or fails on the way.

Three kinds of work:
- ``run``: a list of tasks (evaluation, statistics; a cluster run's gradients and step slices) -> their
  results in task order. A dead worker's task is re-run (a new attempt number, so it writes a new file) on
  its replacement, and whatever the dead attempt may have written is deleted at once (``discard``); a task
  silent past ``task_timeout`` gets its worker killed (once), then the same. A straggler (``BackupRule``:
  a task running well past its finished peers while a worker is idle) gets a backup copy under the next
  attempt number on the idle worker; the first copy to answer is taken (tasks are pure: the same bits
  either way) and what the other wrote is discarded, at once and again when it answers.
- ``stream``: tasks submitted one at a time -> results as they arrive (the overlapping modes, train/loops/overlap.py:
  fixed staleness and async, whose steps never wait for a whole round), with the same fault rules.
- ``run_stretch``: one stretch on several slots at once (the rounds, train/loops/rounds.py, or the desk,
  train/loops/desk.py). The server is not in
  the rounds' path: it watches the processes, the board's activities (train/exchange/marks.py) and the clock.
  A death, a silent participant (killed), a failure or a stop signal calls the stretch off: every other
  participant ends at its next mark, and the server starts the next stretch from the ledger, after the
  last update that was finished. A desk stretch (async mode) ends at its first participant done: the others
  linger until they answer, left out of the next stretch (``free_slots``).

A piece of work that kills its worker ``max_attempts`` times stops the run naming it and its rows. Every other
death counts too: a worker that dies with no piece of work to blame (idle between tasks, at the start of a
stretch before its first activity) counts against its slot, and ``max_attempts`` such deaths of one slot in
a row (no answer from it in between) stop the run; one that dies before it said Ready never ran what it was
sent (the message goes to the next worker unchanged) and is counted by its pool (train/server/exchange.py), which
stops the run quoting the worker's error. How a stretch ended is a ``messages.Outcome``, as a task's or a
participant's answer is.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

from memtrain.errors import Interrupted, MemtrainError, WorkerFailure, plural
from memtrain.faults import fault_point
from memtrain.train.exchange.marks import WAITING, Activity, Board
from memtrain.train.memory import limit_words, oom_killed, oom_kills, sigkilled
from memtrain.train.messages import (
    BackupRule,
    Event,
    GradTask,
    Outcome,
    Result,
    Slot,
    Stretch,
    StretchEnd,
    Task,
    Transport,
)

WAIT_BOUND = 1.0  # seconds: the longest the server blocks without re-checking deadlines and signals
TICK = 0.1  # seconds between the server's chores while a stretch runs (progress, logs), and its time limits
CRASH_HINT = "the data or the model may crash the worker; check the rows named above, or raise train.max_attempts"
LOWER_MEMORY = ("Lower train.chunk_rows (an additive model's statistics; a resume takes --set train.chunk_rows=N) "
                "or the rows per task (train.batch_size, train.tasks_per_update), run fewer workers, or give the "
                "run more memory")
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class Race:
    """One ``Scheduler.run`` call's straggler bookkeeping: how long its finished tasks ran, the backup copy
    of each task that has one, and the highest attempt number started for a task (a re-run takes the next)."""

    rule: BackupRule | None
    seconds: list[float] = field(default_factory=list)
    copies: dict[tuple[int, int], Task] = field(default_factory=dict)
    highest: dict[tuple[int, int], int] = field(default_factory=dict)
    deaths: Counter[tuple[int, int]] = field(default_factory=Counter)

    def next_attempt(self, message: Task) -> int:
        key = task_key(message)
        self.highest[key] = max(self.highest.get(key, 0), message.attempt) + 1
        return self.highest[key]

    def live(self, message: object, current: dict[tuple[int, int], Task], done: dict[tuple[int, int], Result]) -> bool:
        """Whether ``message`` is a copy of a task of this call still wanted (not a stale or superseded one)."""
        key = task_key_of(message)
        return key is not None and key not in done and message in (current.get(key), self.copies.get(key))

    def wait_bound(self, slots: list[Slot], current: dict[tuple[int, int], Task],
                   done: dict[tuple[int, int], Result]) -> float:
        """Seconds until the earliest running task of this call becomes a straggler (inf if none can)."""
        if self.rule is None or not self.seconds or not any(slot.idle for slot in slots):
            return float("inf")
        due = self.rule.due(statistics.median(self.seconds))
        starts = [slot.since for slot in slots if self.live(slot.current, current, done)
                  and task_key_of(slot.current) not in self.copies]
        return max(0.0, min(starts) + due - time.monotonic()) if starts else float("inf")


class Scheduler:
    def __init__(self, *, task_timeout: float, max_attempts: int, describe_task: Callable[[Task], str],
                 log: Callable[[str], None],
                 stop_requested: Callable[[], bool], discard: Callable[[Task], None] = lambda task: None,
                 describe_memory: Callable[[Task], str] = lambda task: "", backup: BackupRule | None = None,
                 check_mapped: Callable[[], None] = lambda: None):
        self.backup = backup  # the straggler rule of ``run``; None: no backup copies, no slot set aside
        # after a worker's SIGBUS: checks the files workers map that may have shrunk (raises MemtrainError naming one)
        self.check_mapped = check_mapped
        self.task_timeout = task_timeout
        self.max_attempts = max_attempts
        self.describe_task = describe_task
        self.log = log
        self.stop_requested = stop_requested
        self.discard = discard  # deletes what an attempt that will never be used may have written
        self.describe_memory = describe_memory  # what a task holds in memory, for a worker the kernel killed
        self.oom_before = oom_kills()  # the cgroup's OOM kill count at start: a rise names the OOM killer
        self.killed: set[int] = set()  # pids killed for silence: killed (and logged) once, then awaited
        self.deaths = 0
        self.attempts: Counter[tuple[int, int, int]] = Counter()  # deaths per piece of a round (kind, update, item)
        self.unblamed: Counter[int] = Counter()  # per slot: deaths outside any piece of work since it last answered

    # --- tasks ---

    def run(self, transport: Transport, tasks: list[Task],
            chores: Callable[[], None] | None = None) -> list[Result]:
        """Run every task to a result; returns the results in the order of ``tasks``.

        ``chores`` is the server's own work that does not depend on these results. It is called
        once, as soon as a core is spare: at once if fewer workers are busy than there are cores, else
        when a worker has finished and nothing is left to send it while others still compute. It is
        called at the latest before returning.
        """
        pending = deque(tasks)
        current = {task_key(message): message for message in tasks}
        done: dict[tuple[int, int], Result] = {}
        race = Race(self.backup)
        while len(done) < len(tasks):
            for slot in transport.aside.usable(transport.slots) if self.backup is not None else transport.slots:
                if slot.idle and pending:
                    transport.send(slot, pending.popleft())
            if not pending:
                self._back_up(transport, current, done, race)
            bound = race.wait_bound(transport.slots, current, done)
            for event in transport.wait(min(self._wait_time(transport.slots), bound)):
                if event.answer is not None and race.live(event.message, current, done):
                    seconds = time.monotonic() - event.slot.since
                    if self.backup is not None:
                        self._judge(transport, event, seconds, race)
                    race.seconds.append(seconds)
                self._handle(event, current, pending, done, race)
            if chores is not None and self._core_for_chores(transport.slots, done, pending, len(tasks)):
                chores()
                chores = None
            self._check_stop()
            self._kill_overdue(transport)
        if chores is not None:
            chores()
        return [done[task_key(message)] for message in tasks]

    def stream(self, transport: Transport) -> TaskStream:
        return TaskStream(self, transport)

    def failure(self, message: Task, error: str) -> WorkerFailure:
        """The error that stops the run when a task the server ran itself raised (train/loops/stream.py's
        ``ServerGradients``): the words a worker's failure gets."""
        return worker_failure(self.describe_task(message), 0, error, self.describe_memory(message))

    def _judge(self, transport: Transport, event: Event, seconds: float, race: Race) -> None:
        """``SetAside.judge`` the slot that answered; when its answer is a backup copy's, taken, the slot
        still running the original too (it ran longer than the copy's whole wait)."""
        assert self.backup is not None
        aside = transport.aside
        aside.judge(event.slot, seconds, race.seconds, self.backup, self.log)
        key = task_key_of(event.message)
        if key is not None and race.copies.get(key) == event.message:
            for slot in transport.slots:
                if slot is not event.slot and task_key_of(slot.current) == key:
                    aside.judge(slot, time.monotonic() - slot.since, race.seconds + [seconds], self.backup, self.log)

    def _back_up(self, transport: Transport, current: dict[tuple[int, int], Task], done: dict[tuple[int, int], Result],
                 race: Race) -> None:
        """Start a backup copy of each straggler (``BackupRule``) on an idle worker, while there is one."""
        rule = race.rule
        if rule is None or not race.seconds:  # no rule (one machine), or nothing finished yet to compare with
            return
        idle = [slot for slot in transport.slots if slot.idle]
        if not idle:
            return
        median = statistics.median(race.seconds)
        now = time.monotonic()
        for slot in list(transport.slots):
            message = slot.current
            key = task_key_of(message)
            if key is None or key in done or key in race.copies or current.get(key) != message:
                continue
            ran = now - slot.since
            if ran <= rule.ratio * median or ran < rule.seconds:
                continue
            copy = replace(message, attempt=race.next_attempt(message))
            if getattr(copy, "spare", ""):  # never a file another copy of the task may be rewriting
                copy = replace(copy, spare="", in_place=False)
            race.copies[key] = copy
            target = idle.pop(0)
            self.log(f"{self.describe_task(message)} has run {ran:.2f} s on worker {slot.index}, over "
                     f"{rule.ratio:g} x the median {median:.3f} s of its finished peers: a backup copy (attempt "
                     f"{copy.attempt}) on worker {target.index}")
            transport.send(target, copy)
            if not idle:
                return

    def _raced(self, event: Event, key: tuple[int, int], current: dict[tuple[int, int], Task], race: Race) -> bool:
        """An event of a task that has a backup copy running: settles which copy is the task's from now on.
        Returns True when the event needs nothing more (a copy died while the other one goes on)."""
        message, copy = event.message, race.copies.pop(key)
        original = current[key]
        if message == copy and event.answer is None:  # the backup's worker died: the original goes on
            self.discard(copy)
            self.deaths += 1
            self.log(f"worker {event.slot.index} (pid {event.slot.pid}) died with exit code {event.exitcode} "
                     f"during the backup copy of {self.describe_task(copy)}; the original goes on")
            return True
        if message == original and event.answer is None:  # the original's worker died: the backup goes on
            current[key] = copy
            self.discard(original)
            self.deaths += 1
            self.log(f"worker {event.slot.index} (pid {event.slot.pid}) died with exit code {event.exitcode} "
                     f"during {self.describe_task(original)}; its backup copy goes on")
            return True
        loser = original if message == copy else copy
        current[key] = message  # the first to finish is taken; the other's answer will be stale
        self.discard(loser)  # what it wrote so far (and again when it answers): its file is never read
        self.log(f"{self.describe_task(message)}: the {'backup copy' if message == copy else 'original'} "
                 f"(attempt {message.attempt}) finished first and is taken")
        return False

    def _handle(self, event: Event, current: dict[tuple[int, int], Task], pending: deque[Task],
                done: dict[tuple[int, int], Result], race: Race | None = None) -> None:
        message = event.message
        key = task_key(message) if isinstance(message, Task) else None
        self._answered(event)
        if (race is not None and key is not None and key in race.copies and key not in done
                and message in (current.get(key), race.copies[key]) and self._raced(event, key, current, race)):
            return
        if key is None or current.get(key) != message or key in done:
            if key is not None and current.get(key) != message:
                self.discard(message)  # a superseded attempt answered late: its file is never read
            if event.answer is None:
                self._died_idle(event)
            return  # a stale attempt answered: nothing to do
        if event.answer is None and not event.started:  # it never ran the task: sent on unchanged, not counted
            self._died_idle(event)
            pending.appendleft(message)
            return
        if event.answer is not None:
            if event.answer.outcome == Outcome.FAILED:
                raise failed(self.describe_task(message), event, self.describe_memory(message))
            done[key] = event.answer
            fault_point("after_result")
            return
        self.discard(message)  # at once: the exchange holds only what the run reserved, whatever fails
        if race is None:
            self._died(event, self.describe_task(message), message.attempt + 1,
                       holding=self.describe_memory(message))
            retry = replace(message, attempt=message.attempt + 1)
        else:  # a backup copy may have taken the next attempt number: a name is never reused
            race.deaths[key] += 1
            self._died(event, self.describe_task(message), race.deaths[key], holding=self.describe_memory(message))
            retry = replace(message, attempt=race.next_attempt(message))
        current[key] = retry
        pending.appendleft(retry)

    def _core_for_chores(self, slots: list[Slot], done: dict[tuple[int, int], Result], pending: deque[Task],
                         total: int) -> bool:
        busy = sum(not slot.idle for slot in slots)
        return busy < CORES or (bool(done) and not pending and len(done) < total)

    def _wait_time(self, slots: list[Slot]) -> float:
        busy = [slot.since for slot in slots if not slot.idle and slot.pid not in self.killed]
        if not busy:
            return WAIT_BOUND
        return max(0.0, min(WAIT_BOUND, min(busy) + self.task_timeout - time.monotonic()))

    def _kill_overdue(self, transport: Transport, leaving_out: Collection[Slot] = ()) -> None:
        """Kill a worker silent past ``task_timeout`` on what it was sent (but the slots ``leaving_out``)."""
        now = time.monotonic()
        left_out = {id(slot) for slot in leaving_out}
        for slot in transport.slots:
            if (id(slot) not in left_out and slot.process is not None and not slot.idle
                    and now - slot.since > self.task_timeout and slot.pid not in self.killed
                    and slot.process.is_alive()):
                self.killed.add(slot.pid)
                what = ("the end of its stretch" if isinstance(slot.current, Stretch)  # lingering (run_stretch)
                        else self.describe_task(slot.current))
                self.log(f"worker {slot.index} (pid {slot.pid}) silent for {self.task_timeout:g} s "
                         f"on {what}; killing it")
                transport.kill(slot)

    # --- stretches ---

    def run_stretch(self, transport: Transport, board: Board, stretches: list[Stretch],
                    chores: Callable[[], None], describe: Callable[[Activity], str], *,
                    slots: list[Slot] | None = None, done_at_first_end: bool = False) -> Outcome:
        """Run one stretch: ``stretches[i]`` on ``slots[i]`` (slots 0..len(stretches)-1 unless given; a stretch's
        ``slot`` is its slot's index); ``chores`` (the server's logging) run every TICK; ``describe``: the engine's
        words for a participant's activity (what a dead or silent worker was doing).

        Returns once every participant has ended; or, with ``done_at_first_end`` (the desk's stretches: a
        participant ends DONE only when every piece of the stretch is applied, after which the others have
        nothing left to write), at the first participant that ends DONE while nothing failed (``_done_early``):
        the others **linger**, busy until they answer, and the engine leaves them out
        of its next stretch (a worker stopped at the end of an epoch no longer holds up the next one). A lingering
        slot silent for ``task_timeout`` more is killed (``_kill_overdue``). A failure, or a piece of work that
        killed its worker ``max_attempts`` times, raises WorkerFailure -- after the others have ended, so nobody
        still writes.
        """
        generation = stretches[0].generation
        slots = list(transport.slots[:len(stretches)]) if slots is None else slots
        for slot, stretch in zip(slots, stretches, strict=True):
            transport.send(slot, stretch)  # the server's own slot runs the whole stretch right here
        watch = _Watch(len(stretches), generation, describe, slots=slots)
        while len(watch.ended) < len(stretches):
            for event in transport.wait(TICK):
                self._stretch_event(event, watch, board)
            if done_at_first_end and self._done_early(watch, board):
                break
            self._kill_overdue(transport, leaving_out=slots)  # slots lingering in an earlier stretch
            chores()
            if self.stop_requested() and not watch.stopped:
                watch.stopped = True
                board.cancel(generation)
            self._kill_silent(transport, board, watch)
        if watch.failure is not None:
            raise watch.failure
        if watch.stopped:
            return Outcome.STOPPED
        if watch.faults:
            return Outcome.FAULT
        if any(end.outcome == Outcome.NONFINITE for end in watch.ended.values()):
            return Outcome.NONFINITE
        return Outcome.DONE

    def free_slots(self, transport: Transport) -> list[Slot]:
        """The slots not still ending an earlier stretch (``run_stretch``'s lingering ones), waiting for one if
        every slot is; their late answers are taken here as any stale answer is."""
        while not any(slot.idle for slot in transport.slots):
            for event in transport.wait(TICK):
                self._handle(event, {}, deque(), {})
            self._check_stop()
            self._kill_overdue(transport)
        return [slot for slot in transport.slots if slot.idle]

    @staticmethod
    def _done_early(watch: _Watch, board: Board) -> bool:
        """A participant ended DONE and nothing failed, stopped or died: the stretch is ended on the board (a
        participant that has not opened its files yet then touches nothing: they could be the next stretch's,
        which take the same names) and the others are left lingering, each given ``task_timeout`` from now to
        answer (then killed as silent)."""
        if (watch.failure is not None or watch.stopped or watch.faults or watch.killed
                or not any(end.outcome == Outcome.DONE for end in watch.ended.values())):
            return False
        board.end(watch.generation)
        now = time.monotonic()
        for slot in watch.slots:
            if slot.index not in watch.ended:
                slot.since = now
        return True

    def _stretch_event(self, event: Event, watch: _Watch, board: Board) -> None:
        message = event.message
        self._answered(event)
        if not (isinstance(message, Stretch) and message.generation == watch.generation):
            if event.answer is None:
                self._died_idle(event)
            return
        slot = message.slot
        if event.answer is None:
            activity = watch.activities.get(slot) or _current(board, watch.generation, slot)
            if activity is None or activity.kind == WAITING:  # no piece of work to blame: counted against the slot
                what = watch.describe(activity) if activity else "the start of a stretch"
                watch.failure = watch.failure or self._died_outside(event, f"during {what}")
            else:
                key = (activity.kind, activity.update, activity.item)
                self.attempts[key] += 1
                failure = self._died(event, watch.describe(activity), self.attempts[key], raise_at_limit=False)
                watch.failure = watch.failure or failure
            watch.faults += 1
            watch.ended[slot] = StretchEnd(generation=watch.generation, slot=slot, outcome=Outcome.CANCELLED)
            board.cancel(watch.generation)
            return
        watch.ended[slot] = event.answer
        if event.answer.outcome == Outcome.FAILED:
            activity = _current(board, watch.generation, slot)
            what = watch.describe(activity) if activity else "a stretch of rounds"
            watch.failure = watch.failure or failed(what, event)
            board.cancel(watch.generation)

    def _kill_silent(self, transport: Transport, board: Board, watch: _Watch) -> None:
        """Kill a participant that has worked on one piece for longer than ``task_timeout`` (hung)."""
        now = time.monotonic()
        activities = {a.slot: a for a in board.activities(watch.generation)}
        for slot in watch.slots:
            if slot.index in watch.ended or slot.index in watch.killed or slot.process is None:
                continue
            activity = activities.get(slot.index)
            started = activity.started if activity is not None else slot.since
            if (activity is None or activity.kind != WAITING) and now - started > self.task_timeout:
                what = watch.describe(activity) if activity else "the start of a stretch"
                self.log(f"worker {slot.index} (pid {slot.pid}) silent for {self.task_timeout:g} s on {what}; "
                         f"killing it")
                watch.activities[slot.index] = activity
                watch.killed.add(slot.index)
                transport.kill(slot)

    # --- both ---

    def _answered(self, event: Event) -> None:
        """An answer from a slot: its deaths outside any piece of work are no longer in a row."""
        if event.answer is not None:
            self.unblamed.pop(event.slot.index, None)

    def _died_idle(self, event: Event) -> None:
        """A worker died between two pieces of work: its replacement is already starting (or the run stops)."""
        failure = self._died_outside(event, "while idle")
        if failure is not None:
            raise failure

    def _died_outside(self, event: Event, when: str) -> WorkerFailure | None:
        """A worker died with no piece of work to blame. One that never started is its pool's to count; any
        other counts against its slot: the failure to raise at the ``max_attempts``-th in a row, else None."""
        self._bus_error(event)
        self.deaths += 1
        where = f"worker {event.slot.index} (pid {event.slot.pid})"
        if not event.started:
            self.log(f"{where} could not start (exit code {event.exitcode})")
            return None
        self.unblamed[event.slot.index] += 1
        count = self.unblamed[event.slot.index]
        self.log(f"{where} died with exit code {event.exitcode} {when} ({plural(count, 'death')} of this slot in a "
                 f"row)")
        if count < self.max_attempts:
            return None
        return WorkerFailure(f"worker {event.slot.index} died {plural(count, 'time')} in a row outside any piece of "
                             f"work (last exit code {exit_words(event.exitcode)})",
                             hint="something kills memtrain's workers while they wait (another process, a resource "
                                  "limit, the out-of-memory killer); or raise train.max_attempts")

    def _died(self, event: Event, what: str, attempts: int, *, raise_at_limit: bool = True,
              holding: str = "") -> WorkerFailure | None:
        """A worker died during a piece of work. A SIGKILL that memtrain did not send and that the cgroup
        counted as an OOM kill is said to be one, with the memory limit that applies and what the piece
        held; one the cgroup cannot tell about names both causes."""
        self._bus_error(event)
        self.deaths += 1
        oom = oom_killed(self.oom_before) if sigkilled(event.exitcode) and event.slot.pid not in self.killed \
            else False
        memory = memory_hint(holding)
        cause = (f" (killed by the kernel's out-of-memory killer: the run's memory cgroup counted an OOM kill; "
                 f"{memory_words(holding)})") if oom else ""
        self.log(f"worker {event.slot.index} (pid {event.slot.pid}) died with exit code {event.exitcode} "
                 f"during {what}, attempt {attempts}{cause}")
        if attempts < self.max_attempts:
            return None
        if oom:
            signal_text, hint = ": SIGKILL from the kernel's out-of-memory killer", memory
        elif oom is None:
            signal_text, hint = (": SIGKILL, which the kernel's out-of-memory killer sends",
                                 f"if it ran out of memory: {memory}; if not, {CRASH_HINT}")
        else:
            signal_text, hint = "", CRASH_HINT
        failure = WorkerFailure(f"{what} killed its worker {plural(attempts, 'time')} "
                                f"(last exit code {event.exitcode}{signal_text})", hint=hint)
        if raise_at_limit:
            raise failure
        return failure

    def _bus_error(self, event: Event) -> None:
        """A worker killed by SIGBUS touched a page of a mapped file past its end: a file shrank under the run
        (a shard truncated or rewritten in place). When ``check_mapped`` finds it, the run stops naming it
        (a replacement would die the same way); otherwise the death counts as any other."""
        if event.exitcode != -signal.SIGBUS:
            return
        try:
            self.check_mapped()
        except MemtrainError as exc:
            raise WorkerFailure(f"worker {event.slot.index} (pid {event.slot.pid}) was killed by SIGBUS: a file it "
                                f"had mapped shrank under the run: {exc}",
                                hint="restore the file (or prepare the dataset again)") from None
        self.log(f"worker {event.slot.index} (pid {event.slot.pid}) was killed by SIGBUS, and every shard still has "
                 f"its size: a mapped file of the run or of the exchange area shrank, or its disk failed")

    def _check_stop(self) -> None:
        if self.stop_requested():
            raise Interrupted("stopped by a signal")


def memory_words(holding: str) -> str:
    """The memory limit that applies, and what the piece of work held (``holding``; "" when unknown)."""
    return f"{limit_words()}; {holding or 'see the task above for what it held'}"


def memory_hint(holding: str) -> str:
    """The one hint of a piece of work that ran out of memory, whether a MemoryError said so or the kernel's
    OOM killer did: the limit, what it held, and what to lower (LOWER_MEMORY)."""
    return f"{memory_words(holding)}. {LOWER_MEMORY}"


def failed(what: str, event: Event, holding: str = "") -> WorkerFailure:
    """A piece of work that raised in its worker: the worker's text; the memory hint after a MemoryError."""
    return worker_failure(what, event.slot.index, event.answer.error if event.answer is not None else "", holding)


def worker_failure(what: str, slot: int, error: str, holding: str = "") -> WorkerFailure:
    """``what`` raised in worker ``slot`` (the server's own: 0) with the text ``error``."""
    error = error.rstrip()
    return WorkerFailure(f"{what} failed in worker {slot}:\n{error}",
                         hint=f"it ran out of memory: {memory_hint(holding)}" if "MemoryError" in error else None)


def exit_words(code: int | None) -> str:
    """``-9`` -> ``"-9: SIGKILL"``: an exit code, with the signal's name when a signal ended the process."""
    if code is None or code >= 0:
        return str(code)
    try:
        return f"{code}: {signal.Signals(-code).name}"
    except ValueError:
        return str(code)


def task_key(message: Task) -> tuple[int, int]:
    """What tells two tasks apart: a gradient task's ticket or a step slice's update number (0 otherwise), and
    its own number."""
    return (message.ticket if isinstance(message, GradTask) else getattr(message, "update", 0)), message.task


def task_key_of(message: object) -> tuple[int, int] | None:
    """``task_key`` of a task; None for anything else (a stretch, nothing)."""
    return task_key(message) if isinstance(message, Task) else None  # type: ignore[arg-type]


class TaskStream:
    """Tasks submitted one at a time -> their results as they arrive, whatever dies or hangs on the way.

    The fault rules are ``Scheduler.run``'s: a dead worker's task is re-run first under the next attempt
    number (so it writes a new file), a silent one has its worker killed, a task that kills its worker
    ``max_attempts`` times stops the run. A task is told apart by ``task_key``: no two in the stream at once
    may share one.
    """

    def __init__(self, scheduler: Scheduler, transport: Transport):
        self.scheduler, self.transport = scheduler, transport
        self.pending: deque[Task] = deque()  # submitted, not sent yet (re-runs go first)
        self.current: dict[tuple[int, int], Task] = {}  # key -> its live attempt, until its result is taken

    def submit(self, task: Task) -> None:
        key = task_key(task)
        if key in self.current:
            raise ValueError(f"task {key} is already in the stream")
        self.current[key] = task
        self.pending.append(task)
        self.send()

    @property
    def in_flight(self) -> int:
        """Tasks submitted whose results were not taken yet."""
        return len(self.current)

    def free(self) -> int:
        """Workers that would sit idle: fewer tasks in flight than slots. (A result not taken yet counts as in
        flight: the server's own slot computes a task the moment it is sent.)"""
        return max(0, len(self.transport.slots) - len(self.current))

    def send(self) -> None:
        for slot in self.transport.slots:
            if slot.idle and self.pending:
                self.transport.send(slot, self.pending.popleft())

    def wait(self) -> list[tuple[Task, Result]]:
        """Wait (a bounded time) for results; returns those that arrived, in arrival order, each with the
        attempt that made it (its file's name). Raises Interrupted on a stop signal."""
        scheduler, arrived = self.scheduler, {}
        timeout = scheduler._wait_time(self.transport.slots) if self.current else 0.0
        for event in self.transport.wait(timeout):
            scheduler._handle(event, self.current, self.pending, arrived)
        scheduler._check_stop()
        scheduler._kill_overdue(self.transport)
        self.send()  # a worker that just answered gets its next task before the caller's bookkeeping
        return [(self.current.pop(key), result) for key, result in arrived.items()]


@dataclass
class _Watch:
    """What the server knows about a running stretch."""

    participants: int
    generation: int
    describe: Callable[[Activity], str]  # the engine's words for an activity
    ended: dict[int, StretchEnd] = field(default_factory=dict)
    activities: dict[int, Activity | None] = field(default_factory=dict)  # of participants it killed
    killed: set[int] = field(default_factory=set)
    failure: WorkerFailure | None = None
    faults: int = 0
    stopped: bool = False
    slots: list[Slot] = field(default_factory=list)  # the transport's slots the stretch was sent to, in order


def _current(board: Board, generation: int, slot: int) -> Activity | None:
    return next((a for a in board.activities(generation) if a.slot == slot), None)
