"""The training core's one timing hook: named sections that a measurement times, at no cost when none does.

A part that has a named section (``SECTIONS``) takes a ``timer`` when it is made and hands each of its sections
to ``timer.timed(name, function)`` once, there; it then calls what it got back. The default, ``UNTIMED``, gives
back the function itself, so an untimed run calls exactly what it called before: nothing is added to an
update's path. A measurement (the one-off scripts in benchmarks/) passes its own timer to ``train(...,
timer=...)``: ``Recording``, or any object with the same ``timed`` method. Nothing is patched: a renamed
section fails at the timer's table (``SECTIONS``), not silently in a script.

The timer reaches the parts that run in the server's process: the Trainer, its engines (``EngineContext``), the
rounds the server runs itself (``WorkerState``, ``RoundFiles``, ``Participant``, ``TaskGradient``) and a cluster
stretch's ``SlicedParticipant``. A worker process is never timed through it (a timer does not cross processes).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# Every named section, and what it times. A part times only names declared here (``timed_sections``).
SECTIONS = {
    "model": "the model's loss and gradient of a task's rows (gradient.TaskGradient)",
    "gradient task": "a gradient task in the server, the model's included (worker.WorkerState)",
    "rows": "a task's rows: read and normalized (mapped.RoundFiles.rows)",
    "step": "the step: gradients summed, mean, optimizer, block digests (rounds: reduce_and_step; on a cluster: "
            "sliced.SlicedParticipant.step, the slices' tasks out and back)",
    "ready": "a version's file readied, the retired one recycled (rounds.Participant.ready; the server alone readies "
             "its ring's files once per stretch instead)",
    "publish": "a version published: digest, record, rename (rounds.Participant.publish)",
    "round": "one round: the previous update's step and this update's gradients (rounds.Participant.round)",
    "tasks": "a cluster update's tasks: from sending them to every answer (sliced.SlicedParticipant)",
    "node_step": "a cluster update's step slices asked, each told how many of the update's gradients it reads "
                 "as a two-level round's partial (node_round.NodeParticipant.node_step)",
    "file_chores": "a cluster server's chores while its workers compute (sliced.SlicedParticipant.file_chores)",
    "stretch_chores": "the server's chores between updates: logs, progress (server.Trainer.stretch_chores)",
    "evaluate": "an evaluation of a version (server.Trainer.evaluate)",
    "end_epoch": "an epoch's end: evaluation, checkpoint, monitor (server.Trainer.end_epoch)",
    "rounds": "the rounds' engine running an epoch (engines.Rounds.run, ClusterRounds.run)",
    "cluster": "the Dask cluster's transport opened (pools.open_cluster); it returns the ClusterPool",
    "task out": "a task sent to a Dask worker (cluster.transport.ClusterPool.send)",
    "result in": "a Dask worker's answer taken in (cluster.transport.ClusterPool._completed)",
    "broadcast call": "a call to the scheduler's BroadcastPlugin: a post, a count (cluster.broadcast.Broadcast.call)",
}


class Timer(Protocol):
    def timed(self, name: str, function: F) -> F:
        """What the part calls instead of ``function``, section ``name``: ``function`` itself, or a wrapper that
        times each call."""


class Untimed:
    """No timing: every section is the function itself."""

    def timed(self, name: str, function: F) -> F:
        return function


UNTIMED = Untimed()


class Recording:
    """Each call of each section timed with ``clock`` (seconds), kept per name in ``times``: for example
    ``time.perf_counter`` (wall) or ``time.thread_time`` (this thread's CPU)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.times: dict[str, list[float]] = defaultdict(list)

    def timed(self, name: str, function: F) -> F:
        clock, kept = self.clock, self.times[name]

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                kept.append(clock() - started)

        return timed_call  # type: ignore[return-value]


def timed(timer: Timer, name: str, function: F) -> F:
    """Section ``name`` (one of ``SECTIONS``) of ``function``, as ``timer`` times it; untimed: ``function``."""
    if timer is UNTIMED:
        return function
    if name not in SECTIONS:
        raise ValueError(f"{name!r} is not a named section (memtrain/train/timing.py SECTIONS)")
    return timer.timed(name, function)


def timed_sections(owner: object, timer: Timer, names: tuple[str, ...]) -> None:
    """``owner``'s methods ``names`` (each a section of ``SECTIONS`` by the same name) handed to ``timer``, on
    ``owner`` alone. Untimed: nothing is done, ``owner`` calls its methods as it always did."""
    if timer is not UNTIMED:
        for name in names:
            setattr(owner, name, timed(timer, name, getattr(owner, name)))
