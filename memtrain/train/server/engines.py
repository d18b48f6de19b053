"""The engines: who steps. Each runs the rest of an epoch from a position, the same way for the epoch loop.

``Trainer.choose`` (train/server/server.py) makes the run's engine once, as the ``Choice`` made at start
says (train/server/choice.py: one table), the reasons logged, and hands it an ``EngineContext``: what it uses of
the server, and nothing else (never the Trainer). The epoch loop (``Trainer.fit``) then calls
``engine.run(position)`` until the engine says the epoch is done (``epoch_done``), and ``engine.close()`` at
the end. No engine asks which mode it is in: what it computes is its schedule's (train/schedule.py), decided
when it was built.

- ``Rounds``: the workers (or the server alone) meet at marks, each stepping a slice (train/loops/rounds.py):
  synchronous training and fixed staleness in the rounds. ``ClusterRounds``: the same stretch on a cluster,
  run by the server alone, its gradient tasks (and step slices) sent to the Dask workers (train/loops/sliced.py).
- ``Desk``: async mode on worker processes; they claim tasks and step whole groups at the desk (train/loops/desk.py).
- ``ServerSteps``: the server steps the whole vector (train/loops/overlap.py), the gradients streamed to it by
  worker processes, or computed by itself when it has none (``ServerGradients``, train/loops/stream.py): fixed
  staleness streamed and async mode in the server, each the one loop ``Overlap.run`` asking its schedule's
  agenda (``Planned``, ``Arrival``); ``Replay`` (train/server/replay.py) is the same loop with ``Recorded``.
- ``OnePass`` (train/server/onepass.py): an additive model's one pass of statistics, then its solve.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from memtrain.errors import Interrupted, MemtrainError
from memtrain.stopping import StopRequest
from memtrain.train.exchange.area import STREAMED_GRADIENT, discard
from memtrain.train.exchange.marks import GRADIENT, PUBLISH, READYING, STEP, Activity, Board, Ledger
from memtrain.train.exchange.weights import BLOCK, ready_building, rounds_keep, unpublish_after
from memtrain.train.loops.desk import DeskLog, create_desk
from memtrain.train.loops.mapped import RoundFiles
from memtrain.train.loops.node_round import NodeParticipant
from memtrain.train.loops.overlap import Overlap
from memtrain.train.loops.stream import ServerGradients
from memtrain.train.messages import GradTask, Loop, Outcome, Stretch, Task
from memtrain.train.plan import Plan, RowWords, step_slices, task_stream
from memtrain.train.records.counters import update_number
from memtrain.train.records.logbook import Chores, Logbook
from memtrain.train.records.state import Position
from memtrain.train.schedule import ArrivalState, PlannedState, Schedule
from memtrain.train.server.exchange import InServer
from memtrain.train.server.scheduler import Scheduler, TaskStream
from memtrain.train.timing import UNTIMED, Timer, timed
from memtrain.train.worker.worker import error_text

if TYPE_CHECKING:
    from memtrain.config import TrainConfig
    from memtrain.train.server.placement import Placement
    from memtrain.train.server.pools import OnCluster, Streamed


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineContext:
    """What an engine uses of the server, built once by ``Trainer.choose``: the job's training settings and
    its plan, the run's places, the placement (the transport its work goes to, and what it measures), the
    scheduler that watches that work, the logbook and the server's chores, the stop request and the log.
    """

    train: TrainConfig
    keep_versions: int  # run.keep_versions
    plan: Plan
    per_epoch: int  # updates per epoch (async mode: groups)
    size: int  # parameters in the weight vector
    run_path: Path
    exchange: Path
    placement: Placement | Streamed | OnCluster
    scheduler: Scheduler
    logbook: Logbook
    chores: Chores
    board: Board  # the exchange's board, where worker processes meet
    memory_board: Board  # the server's own, when it runs a stretch alone
    stop: StopRequest
    log: Callable[[str], None]
    describe_rows: RowWords
    timer: Timer = UNTIMED  # the named sections' timing hook (train/timing.py): untimed but in a measurement

    def stretch_ends(self) -> bool:
        """Whether a stretch the server runs itself ends at its chores: a stop, or the placement's probe is over."""
        return self.stop.requested or self.placement.ends_stretch()


class EpochEngine:
    """What the epoch loop asks of an engine, with what most engines answer. ``context``: what it uses of the
    server (``EngineContext``), handed to it when it is made."""

    context: EngineContext

    def run(self, position: Position) -> None:
        """Run the rest of ``position``'s epoch (a replay: the whole lineage; an additive model: its pass and
        solve), unless cut short by a fault or a probe (then the loop calls it again); ``position`` moves past
        every update logged."""
        raise NotImplementedError

    def epoch_done(self, position: Position) -> bool:
        """Whether ``position``'s epoch is over, so the loop evaluates it: its updates are all counted."""
        return position.batch >= self.context.per_epoch

    def epoch_ended(self, position: Position) -> None:
        """The epoch is evaluated and checkpointed as the job says: what the engine kept for a restart can go."""

    def describe_activity(self, activity: Activity) -> str:
        """A participant's activity in words (what a dead or silent worker was doing), for the scheduler."""
        return f"activity {activity.kind} at update {update_number(activity.update)}"  # an engine with no stretch

    def describe_gradient(self, task: GradTask) -> str:
        """A gradient task this engine handed out, in words (a dead, hung or failed one), for the scheduler."""
        return f"gradient task ({self.context.describe_rows(task.lo, task.hi, epoch=task.epoch)})"

    def discard(self, task: Task) -> None:
        """Delete the file a dead or superseded attempt of a task this engine handed out may have written: a
        streamed gradient's (the server's steps, a cluster's rounds; in the rounds, gradients go to the per-task
        buffers, which the next attempt overwrites)."""
        if isinstance(task, GradTask):
            discard([STREAMED_GRADIENT.path(self.context.exchange, task.ticket, task.task, task.attempt)])

    def close(self) -> None:
        """Let go of what the engine holds (spare gradient files), at the run's end however it ends."""


def ended(outcome: Outcome) -> None:
    """Raise for a stretch that a signal or a non-finite update ended."""
    if outcome == Outcome.STOPPED:
        raise Interrupted("stopped by a signal")
    if outcome == Outcome.NONFINITE:  # catch_up raised unless the stop landed before the update was logged
        raise MemtrainError("a non-finite update stopped the run", hint="see the event log")


class Rounds(EpochEngine):
    """Workers meeting at marks, each stepping a slice; or the server alone (train/loops/rounds.py)."""

    recycle = True  # a retired version's file becomes the next one's (not on a cluster: docs/cluster.md)
    private = True  # alone and synchronous, only a stretch's newest versions are published (train/loops/rounds.py)

    def __init__(self, context: EngineContext):
        self.context = context
        if context.timer is not UNTIMED:  # a measurement (train/timing.py)
            self.run = timed(context.timer, "rounds", self.run)  # type: ignore[method-assign]
        self.generation = 0  # a stretch's number: the marks of an older stretch never count for a newer one
        self.participants = 1

    def run(self, position: Position) -> None:
        """Run the rounds from ``position`` on, to the end of its epoch unless cut short (a fault, a probe)."""
        c = self.context
        alone = self.alone()
        board = c.memory_board if alone else c.board
        limit = c.placement.stretch_limit()
        first, version = position.batch, position.version
        stop = c.per_epoch if limit is None else min(c.per_epoch, first + limit)
        participants = 1 if alone else min(len(c.placement.transport.slots), c.train.tasks_per_update)
        self.participants = participants
        self.generation += 1
        board.set_ledger(Ledger(self.generation, position.update_index(c.per_epoch) - 1, version))
        c.logbook.begin_stretch(first, stop)
        private = self.private and alone and not c.train.staleness  # no other process maps the versions
        if not private:  # else the participant readies its own files (rounds.Participant.ring_file)
            ready_building(c.run_path, version + 1, c.size, os.getpid(),
                           rounds_keep(c.keep_versions, c.train.staleness), recycle=self.recycle)
        slices = len(step_slices(c.size, participants, BLOCK))
        state = position.schedule  # the rounds step a plan: Planned(k)'s state
        assert isinstance(state, PlannedState)
        bases = dict(state.bases) | {position.update_index(c.per_epoch): version}
        threads = self.server_threads() if alone else 1
        stretches = [Stretch(generation=self.generation, epoch=position.epoch, first=first, stop=stop,
                             version=version, slot=slot, participants=participants, slices=slices,
                             bases=tuple(sorted(bases.items())), threads=threads, private=private)
                     for slot in range(participants)]
        logged = len(c.logbook.timeline)
        try:
            outcome = self.participate(stretches, position, board)
        finally:  # a stop or a lost cluster mid-stretch: the position (and so a checkpoint) is where it stands
            c.logbook.catch_up(position, board.ledger(), final=True)
        c.chores.report(position)
        ended(outcome)
        done = position.update_index(c.per_epoch)
        c.placement.observe(c.logbook.timeline[logged:], done, c.plan.total_updates - done)

    def alone(self) -> bool:
        """Whether the server runs the stretch alone (its own board in memory), not worker processes."""
        return isinstance(self.context.placement.transport, InServer)

    def server_threads(self) -> int:
        """The threads the server computes an update's tasks on when it runs the stretch alone
        (train/loops/threads.py)."""
        return self.context.placement.server_threads()

    def participate(self, stretches: list[Stretch], position: Position, board: Board) -> Outcome:
        """Every participant runs its stretch; the server watches them (train/server/scheduler.py)."""
        c = self.context

        def chores() -> None:
            c.chores.stretch(position, board.ledger())

        return c.scheduler.run_stretch(c.placement.transport, board, stretches, chores, self.describe_activity)

    def describe_activity(self, activity: Activity) -> str:
        c = self.context
        update = c.plan.update(activity.update)
        if activity.kind == GRADIENT:
            rows = update.tasks[activity.item]
            return (f"gradient task {rows.task} ({c.describe_rows(rows.lo, rows.hi, epoch=update.epoch)}) of update "
                    f"{update_number(update.update)}")
        if activity.kind == STEP:
            lo, hi = step_slices(c.size, self.participants, BLOCK)[activity.item]
            return f"step slice {activity.item} (parameters {lo}-{hi}) of update {update_number(update.update)}"
        if activity.kind == PUBLISH:
            return f"the publication of update {update_number(update.update)}'s version"
        if activity.kind == READYING:
            return f"the readying of the file of the version after update {update_number(update.update)}"
        return f"a wait for its peers at update {update_number(update.update)}"

    def describe_gradient(self, task: GradTask) -> str:
        """A plan's task (a cluster's rounds hand them out, their tickets the plan's update numbers): its number
        in its update."""
        rows = self.context.describe_rows(task.lo, task.hi, epoch=task.epoch)
        return f"gradient task {task.task} ({rows}) of update {update_number(task.ticket)}"


class ClusterRounds(Rounds):
    """The rounds on a cluster: the server runs the stretch alone, its gradient tasks and step slices sent to
    the Dask workers (train/loops/sliced.py); versions are never recycled (readers on other machines). ``files``:
    the server's own round files."""

    recycle = False
    private = False  # its workers map every version

    def __init__(self, context: EngineContext, *, files: RoundFiles):
        super().__init__(context)
        self.files = files

    def alone(self) -> bool:
        return True

    def server_threads(self) -> int:
        return 1  # its tasks go to the cluster's workers

    def participate(self, stretches: list[Stretch], position: Position, board: Board) -> Outcome:
        """The stretch run by the server alone, its gradient tasks streamed to the cluster's workers."""
        from memtrain.cluster.broadcast import open_broadcast
        from memtrain.cluster.sharedfs import needs_sync, sync_for_readers

        c, transport = self.context, self.context.placement.transport
        sync = needs_sync(c.run_path)

        def tasks(tasks: list, chores: Callable[[], None] | None) -> list:
            return c.scheduler.run(transport, tasks, chores)

        def workers() -> int:
            return len(transport.slots)

        # the server's chores between two updates: the loop calls them straight (Chores.in_stretch)
        chores = partial(c.chores.in_stretch, position, c.memory_board.ledger, c.stretch_ends)
        outcome = NodeParticipant(  # a SlicedParticipant whose round members may be nodes (issue 42)
            self.files, stretches[0], workers=workers, run_tasks=tasks,
            publish_sync=sync_for_readers if sync else lambda path: None, recycle=False, chores=chores,
            slices=workers, broadcast=open_broadcast(transport, rule=c.scheduler.backup,  # the run's straggler rule
                                                     timeout=c.train.task_timeout, log=c.log,
                                                     attempts=c.train.max_attempts), timer=c.timer).run()
        if c.stop.requested:
            return Outcome.STOPPED
        return Outcome.NONFINITE if outcome == Outcome.NONFINITE else Outcome.DONE


class Desk(EpochEngine):
    """Async mode on worker processes: they claim tasks and step whole groups at the desk (train/loops/desk.py)."""

    def __init__(self, context: EngineContext):
        self.context = context
        self.generation = 0

    def run(self, position: Position) -> None:
        """The epoch's tasks not applied yet, on every worker at the desk, until done or a fault."""
        c = self.context
        transport, train, exchange = c.placement.transport, c.train, c.exchange
        ranges = task_stream(c.plan.updates(position.epoch))
        state = position.schedule  # the desk runs async mode: Arrival's state
        assert isinstance(state, ArrivalState)
        applied = set(state.applied)
        tasks = np.array([rows.task for rows in ranges if rows.task not in applied], dtype=np.int64)
        if not len(tasks):  # every task applied, yet the epoch's updates not all counted: never run in circles
            raise MemtrainError(f"epoch {position.epoch + 1}: every task is applied, but only {position.batch} of "
                                f"{c.per_epoch} updates are counted", hint="this is a bug in memtrain: please "
                                "report it with the run's events.log")
        # every slot has its place at the desk; the stretch goes to those not still ending the previous one
        participants = max(slot.index for slot in transport.slots) + 1
        free = c.scheduler.free_slots(transport)
        self.generation += 1
        create_desk(exchange, c.size, participants, train.async_group, tasks, position.version)
        log = DeskLog(exchange, train.async_group, tasks, ranges, c.per_epoch)
        stretches = [Stretch(generation=self.generation, epoch=position.epoch, first=position.batch,
                             stop=c.per_epoch, version=position.version, slot=slot.index, participants=participants,
                             slices=0, loop=Loop.DESK, group=train.async_group, max_staleness=train.max_staleness)
                     for slot in free]

        def chores() -> None:
            log.catch_up(position, c.logbook)
            c.chores.after_update(position)

        try:
            outcome = c.scheduler.run_stretch(transport, c.board, stretches, chores, self.describe_activity,
                                              slots=free, done_at_first_end=True)
        finally:  # a stop or a fault mid-stretch: the position (and so a checkpoint) is where it stands
            log.catch_up(position, c.logbook)
            if position.batch == c.per_epoch:  # the epoch is done, whatever ended the stretch
                position.schedule.epoch_done()
            newer = unpublish_after(c.run_path, position.version)  # renamed, never recorded: made again
            if newer:
                c.log(f"unpublished versions {newer[0]}-{newer[-1]}: not recorded before the stretch ended")
        c.chores.report(position)
        ended(outcome)

    def describe_activity(self, activity: Activity) -> str:
        """``update`` counts groups, ``item`` is a task's number in its epoch's task stream."""
        c = self.context
        epoch = activity.update // c.per_epoch
        if activity.kind == GRADIENT:
            rows = task_stream(c.plan.updates(epoch))[activity.item]
            return (f"gradient task {rows.task} ({c.describe_rows(rows.lo, rows.hi, epoch=epoch)}) of epoch "
                    f"{epoch + 1}")
        if activity.kind == STEP:
            return f"the step of update {update_number(activity.update)}"
        return f"a wait for a task or for its group's turn, at update {update_number(activity.update)}"



class ServerSteps(EpochEngine):
    """The server steps the whole vector, the gradients streamed to it (train/loops/overlap.py): the one loop, run
    with the agenda its ``schedule`` makes (an epoch's, or a replay's whole)."""

    def __init__(self, context: EngineContext, *, files: RoundFiles, schedule: Schedule):
        self.context, self.schedule = context, schedule
        self.overlap = Overlap(epochs=context.train.epochs, files=files, stream=self.stream(files),
                               logbook=context.logbook, per_epoch=context.per_epoch,
                               chores=context.chores.after_update)

    def stream(self, files: RoundFiles) -> TaskStream | ServerGradients:
        """Where the gradients are computed: worker processes, through the scheduler (which re-runs what a death
        took); or, with none, the server itself, each task the moment it is submitted (``ServerGradients``: no
        transport between the loop and the gradient, as the rounds run alone)."""
        c = self.context
        if not isinstance(c.placement.transport, InServer):
            return c.scheduler.stream(c.placement.transport)

        def failed(task: GradTask, exc: BaseException) -> Exception:
            return c.scheduler.failure(task, error_text(exc))

        return ServerGradients(files, stop=c.stop, failed=failed)

    def run(self, position: Position) -> None:
        try:
            self.overlap.run(position, self.schedule.agenda(position, self.context.plan.updates(position.epoch)))
        finally:
            self.context.logbook.write()

    def describe_gradient(self, task: GradTask) -> str:
        """A streamed task: its ticket is no update number in async mode or a replay, so the words say its rows and
        the version it reads."""
        rows = self.context.describe_rows(task.lo, task.hi, epoch=task.epoch)
        return f"gradient task ({rows}) at weight version {task.version}"

    def close(self) -> None:
        self.overlap.close()
