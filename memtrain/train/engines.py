"""The engines: who steps. Each runs the rest of an epoch from a position, the same way for the epoch loop.

``Trainer.choose`` (train/server.py) picks one engine per run, once, the reasons logged; the epoch loop
(``Trainer.fit``) then calls ``engine.run(position)`` until the epoch's updates are all counted, and
``engine.close()`` at the end. No engine asks which mode it is in: what it computes is its schedule's
(train/schedule.py), decided when it was built.

- ``Rounds``: the workers (or the server alone) meet at marks, each stepping a slice (train/rounds.py):
  synchronous training and fixed staleness in the rounds. ``ClusterRounds``: the same stretch on a cluster,
  run by the server alone, its gradient tasks (and step slices) sent to the Dask workers (train/sliced.py).
- ``Desk``: async mode on worker processes; they claim tasks and step whole groups at the desk (train/desk.py).
- ``ServerSteps``: the server steps the whole vector, the gradients streamed to it (train/overlap.py): fixed
  staleness streamed, async mode in the server, and a replay, each the one loop ``Overlap.run`` asking its
  schedule's agenda (``Planned``, ``Arrival``, ``Recorded``).

An engine uses the server's services through the ``Trainer`` it was built for (its scheduler, placement,
logbook, the looks between updates); it keeps only what is its own (the stretch's generation, the round's
participants, the overlap loop).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import numpy as np

from memtrain.errors import Interrupted, MemtrainError
from memtrain.train.counters import update_number
from memtrain.train.desk import DeskLog, create_desk
from memtrain.train.exchange import InServer
from memtrain.train.marks import GRADIENT, PUBLISH, READYING, STEP, Activity, Board, Ledger
from memtrain.train.messages import Engine, Outcome, Stretch
from memtrain.train.overlap import Overlap
from memtrain.train.plan import step_slices, task_stream
from memtrain.train.schedule import Agenda, Arrival, Planned, Recorded
from memtrain.train.sliced import SlicedParticipant
from memtrain.train.state import Position
from memtrain.train.weights import BLOCK, ready_building, rounds_keep, unpublish_after

if TYPE_CHECKING:
    from memtrain.train.scheduler import Scheduler
    from memtrain.train.server import Trainer


class EpochEngine(Protocol):
    """What the epoch loop asks of an engine."""

    def run(self, position: Position) -> None:
        """Run the rest of ``position``'s epoch (a replay: the whole lineage), unless cut short by a fault or
        a probe (then the loop calls it again); ``position`` moves past every update logged."""

    def describe_activity(self, activity: Activity) -> str:
        """A participant's activity in words (what a dead or silent worker was doing), for the scheduler."""

    def close(self) -> None:
        """Let go of what the engine holds (spare gradient files), at the run's end however it ends."""


def ended(outcome: Outcome) -> None:
    """Raise for a stretch that a signal or a non-finite update ended."""
    if outcome == Outcome.STOPPED:
        raise Interrupted("stopped by a signal")
    if outcome == Outcome.NONFINITE:  # catch_up raised unless the stop landed before the update was logged
        raise MemtrainError("a non-finite update stopped the run", hint="see the event log")


class Rounds:
    """Workers meeting at marks, each stepping a slice; or the server alone (train/rounds.py)."""

    recycle = True  # a retired version's file becomes the next one's (not on a cluster: docs/cluster.md)

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.generation = 0  # a stretch's number: the marks of an older stretch never count for a newer one
        self.participants = 1

    def run(self, position: Position) -> None:
        """Run the rounds from ``position`` on, to the end of its epoch unless cut short (a fault, a probe)."""
        t = self.trainer
        alone = self.alone()
        board = t.memory_board if alone else t.board
        limit = t.placement.stretch_limit()
        first, version = position.batch, position.version
        stop = t.per_epoch if limit is None else min(t.per_epoch, first + limit)
        participants = 1 if alone else min(len(t.placement.transport.slots), t.job.train.tasks_per_update)
        self.participants = participants
        self.generation += 1
        board.set_ledger(Ledger(self.generation, position.update_index(t.per_epoch) - 1, version))
        t.logbook.records["status"][first:stop] = 0
        ready_building(t.run_dir.path, version + 1, t.context.layout.size, os.getpid(),
                       rounds_keep(t.job.run.keep_versions, t.job.train.staleness), recycle=self.recycle)
        slices = len(step_slices(t.context.layout.size, participants, BLOCK))
        bases = dict(position.bases) | {position.update_index(t.per_epoch): version}
        threads = self.server_threads() if alone else 1
        stretches = [Stretch(generation=self.generation, epoch=position.epoch, first=first, stop=stop,
                             version=version, slot=slot, participants=participants, slices=slices,
                             bases=tuple(sorted(bases.items())), threads=threads)
                     for slot in range(participants)]
        logged = len(t.logbook.timeline)
        try:
            outcome = self.participate(stretches, position, board)
        finally:  # a stop or a lost cluster mid-stretch: the position (and so a checkpoint) is where it stands
            t.logbook.catch_up(position, board.ledger(), final=True)
        t.report(position)
        ended(outcome)
        done = position.update_index(t.per_epoch)
        t.placement.observe(t.logbook.timeline[logged:], done, t.plan.total_updates - done)

    def alone(self) -> bool:
        """Whether the server runs the stretch alone (its own board in memory), not worker processes."""
        return isinstance(self.trainer.placement.transport, InServer)

    def server_threads(self) -> int:
        """The threads the server computes an update's tasks on when it runs the stretch alone (train/threads.py)."""
        return self.trainer.placement.server_threads()

    def participate(self, stretches: list[Stretch], position: Position, board: Board) -> Outcome:
        """Every participant runs its stretch; the server watches them (train/scheduler.py)."""
        t = self.trainer
        return t.scheduler.run_stretch(t.placement.transport, board, stretches, lambda: t.look(position, board))

    def describe_activity(self, activity: Activity) -> str:
        t = self.trainer
        update = t.plan.update(activity.update)
        if activity.kind == GRADIENT:
            rows = update.tasks[activity.item]
            return (f"gradient task {rows.task} ({t.describe_rows(rows.lo, rows.hi, epoch=update.epoch)}) of update "
                    f"{update_number(update.update)}")
        if activity.kind == STEP:
            lo, hi = step_slices(t.context.layout.size, self.participants, BLOCK)[activity.item]
            return f"step slice {activity.item} (parameters {lo}-{hi}) of update {update_number(update.update)}"
        if activity.kind == PUBLISH:
            return f"the publication of update {update_number(update.update)}'s version"
        if activity.kind == READYING:
            return f"the readying of the file of the version after update {update_number(update.update)}"
        return f"a wait for its peers at update {update_number(update.update)}"

    def close(self) -> None:
        pass


class ClusterRounds(Rounds):
    """The rounds on a cluster: the server runs the stretch alone, its gradient tasks and step slices sent to
    the Dask workers (train/sliced.py); versions are never recycled (readers on other machines)."""

    recycle = False

    def __init__(self, trainer: Trainer):
        super().__init__(trainer)
        # the Trainer's, under the Trainer's names: ``stream`` below is the body Trainer.stream had
        self.placement, self.run_dir, self.in_server = trainer.placement, trainer.run_dir, trainer.in_server
        self.stop, self.heartbeat = trainer.stop, trainer.heartbeat

    def alone(self) -> bool:
        return True

    def server_threads(self) -> int:
        return 1  # its tasks go to the cluster's workers

    @property
    def scheduler(self) -> Scheduler:  # built after the engine (Trainer.run)
        return self.trainer.scheduler

    def participate(self, stretches: list[Stretch], position: Position, board: Board) -> Outcome:
        return self.stream(stretches[0], position)

    def stream(self, stretch: Stretch, position: Position) -> Outcome:
        """A stretch run by the server alone, its gradient tasks streamed to the cluster's workers."""
        from memtrain.cluster.broadcast import open_broadcast
        from memtrain.cluster.sharedfs import needs_sync, sync_for_readers

        transport = self.placement.transport
        sync = needs_sync(self.run_dir.path)
        participant = SlicedParticipant(
            self.in_server.state.rounds(), stretch, workers=lambda: len(transport.slots),
            run_tasks=lambda tasks, meanwhile: self.scheduler.run(transport, tasks, meanwhile),
            publish_sync=sync_for_readers if sync else lambda path: None, recycle=False,
            heartbeat=lambda: self.heartbeat(position), slices=lambda: len(transport.slots),
            broadcast=open_broadcast(transport, rule=self.scheduler.backup,  # the run's straggler rule
                                     timeout=self.trainer.job.train.task_timeout, log=self.trainer.log))
        outcome = participant.run()
        if self.stop.requested:
            return Outcome.STOPPED
        return Outcome.NONFINITE if outcome == Outcome.NONFINITE else Outcome.DONE


class Desk:
    """Async mode on worker processes: they claim tasks and step whole groups at the desk (train/desk.py)."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.generation = 0

    def run(self, position: Position) -> None:
        """The epoch's tasks not applied yet, on every worker at the desk, until done or a fault."""
        t = self.trainer
        transport, train, exchange = t.placement.transport, t.job.train, t.run_dir.exchange
        ranges = task_stream(t.plan.updates(position.epoch))
        applied = set(position.applied)
        tasks = np.array([rows.task for rows in ranges if rows.task not in applied], dtype=np.int64)
        if not len(tasks):  # every task applied, yet the epoch's updates not all counted: never run in circles
            raise MemtrainError(f"epoch {position.epoch + 1}: every task is applied, but only {position.batch} of "
                                f"{t.per_epoch} updates are counted", hint="this is a bug in memtrain: please "
                                "report it with the run's events.log")
        participants = len(transport.slots)
        self.generation += 1
        create_desk(exchange, t.context.layout.size, participants, train.async_group, tasks, position.version)
        log = DeskLog(exchange, train.async_group, tasks, ranges, t.per_epoch)
        stretches = [Stretch(generation=self.generation, epoch=position.epoch, first=position.batch,
                             stop=t.per_epoch, version=position.version, slot=slot, participants=participants,
                             slices=0, engine=Engine.DESK, group=train.async_group, max_staleness=train.max_staleness)
                     for slot in range(participants)]

        def look() -> None:
            log.catch_up(position, t.logbook)
            if t.look_due():
                t.report(position)

        try:
            outcome = t.scheduler.run_stretch(transport, t.board, stretches, look)
        finally:  # a stop or a fault mid-stretch: the position (and so a checkpoint) is where it stands
            log.catch_up(position, t.logbook)
            if position.batch == t.per_epoch:  # the epoch is done, whatever ended the stretch
                position.applied = []
            newer = unpublish_after(t.run_dir.path, position.version)  # renamed, never recorded: made again
            if newer:
                t.log(f"unpublished versions {newer[0]}-{newer[-1]}: not recorded before the stretch ended")
        t.report(position)
        ended(outcome)

    def describe_activity(self, activity: Activity) -> str:
        """``update`` counts groups, ``item`` is a task's number in its epoch's task stream."""
        t = self.trainer
        epoch = activity.update // t.per_epoch
        if activity.kind == GRADIENT:
            rows = task_stream(t.plan.updates(epoch))[activity.item]
            return (f"gradient task {rows.task} ({t.describe_rows(rows.lo, rows.hi, epoch=epoch)}) of epoch "
                    f"{epoch + 1}")
        if activity.kind == STEP:
            return f"the step of update {update_number(activity.update)}"
        return f"a wait for a task or for its group's turn, at update {update_number(activity.update)}"

    def close(self) -> None:
        pass


class ServerSteps:
    """The server steps the whole vector, the gradients streamed to it (train/overlap.py): the one loop, run
    with the agenda ``agenda(position)`` makes (an epoch's, or a replay's whole)."""

    def __init__(self, trainer: Trainer, agenda: Callable[[Position], Agenda]):
        self.trainer, self.agenda = trainer, agenda

    @cached_property
    def overlap(self) -> Overlap:  # made at the first run: the scheduler is built after the engine
        t = self.trainer
        return Overlap(job=t.job, files=t.in_server.state.rounds(), stream=t.scheduler.stream(t.placement.transport),
                       logbook=t.logbook, per_epoch=t.per_epoch, look=t.overlap_look)

    def run(self, position: Position) -> None:
        try:
            self.overlap.run(position, self.agenda(position))
        finally:
            self.trainer.logbook.write()

    def describe_activity(self, activity: Activity) -> str:  # never asked: this engine runs no stretch
        return f"activity {activity.kind} at update {update_number(activity.update)}"

    def close(self) -> None:
        if "overlap" in self.__dict__:
            self.overlap.close()


def server_agenda(trainer: Trainer) -> Callable[[Position], Agenda]:
    """The schedule the server steps: a replay's record, async's arrival order, or the plan's fixed staleness."""
    train, plan, per_epoch, lineage = trainer.job.train, trainer.plan, trainer.per_epoch, trainer.lineage
    if lineage is not None:
        recorded = Recorded(lineage.steps)
        return lambda position: recorded.agenda(position, lineage=lineage.path)
    if train.mode == "async":
        arrival, tickets = Arrival(group=train.async_group, max_staleness=train.max_staleness), itertools.count(1)
        return lambda position: arrival.agenda(task_stream(plan.updates(position.epoch)), position,
                                               per_epoch=per_epoch, tickets=tickets)
    planned = Planned(staleness=train.staleness)
    return lambda position: planned.agenda(plan.updates(position.epoch), position)
