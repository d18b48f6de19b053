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

The rows of a task are the plan's (``Plan.updates``, ``plan.task_stream``; ``Plan.rows`` turns a task into rows of the
train split, in the epoch's order: ``train.shuffle``): the one place they are decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memtrain.train.lineage import Step
from memtrain.train.plan import gradient_base, live_bases, startable_updates


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    """Async mode (``train.mode = "async"``): arrival order, ``group`` gradients per update, a staleness bound."""

    group: int = 1
    max_staleness: int = 4

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


@dataclass(frozen=True, slots=True)
class Recorded:
    """A replay: the lineage's steps, in order (``memtrain train --replay``)."""

    steps: Sequence[Step]

    def ready(self, index: int, version: int) -> bool:
        """Whether step ``index``'s gradients can all be computed once ``version`` is published."""
        return max(g.at for g in self.steps[index].gradients) <= version

    def reads_from(self) -> list[int]:
        """Per step, the oldest version that step or any later one reads (what must stay on disk)."""
        oldest = [min(g.at for g in step.gradients) for step in self.steps]
        for i in range(len(oldest) - 2, -1, -1):
            oldest[i] = min(oldest[i], oldest[i + 1])
        return oldest
