"""The small records that cross between the server and its workers: file names and integers, never arrays.

Every record is keyword-only and typed. A test (tests/test_train.py) pickles each of them and checks that it stays a few
hundred bytes whatever the model and data.

Counters have one name each, everywhere in ``memtrain/train/``:
- ``version``: a weight version (``weights/vNNNNNNNN.npy``); a published update makes version + 1;
- ``update``: an update's number in the whole run (epoch * updates per epoch + batch);
- ``batch``: an update's number within its epoch;
- ``task``: a task's number within its update (the reduction adds gradients in this order);
- ``generation``: a stretch's number (the marks of an older stretch never count for a newer one);
- ``attempt``: how many times a piece of work was started before (a retry after a death).
"""

from __future__ import annotations

import enum
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

from memtrain.models.target_scale import TargetScale
from memtrain.train.optim import OptimizerConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundSetup:
    """What every participant needs to follow the plan on its own (train/plan.py)."""

    batch_size: int | None
    tasks_per_update: int
    seed: int
    epochs: int
    shuffle: str  # train.shuffle and train.shuffle_window: the rows of each task (Plan.rows)
    shuffle_window: int
    keep_versions: int  # run.keep_versions: the newest versions kept on disk (weights.versions_to_keep)
    on_nonfinite: str  # "stop" | "skip"
    staleness: int = 0  # fixed staleness k (train/plan.py gradient_base); 0: synchronous
    slots: int  # participants a stretch may have at most (the board has room for them)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSetup:
    """Sent once, when a worker process starts (and used as is by the server when it runs rounds itself)."""

    server_pid: int
    run_dir: str
    exchange_dir: str
    dataset: str
    normalize: bool
    model_kind: str
    model_options: tuple[tuple[str, object], ...]
    blas_threads: int
    optimizer: OptimizerConfig  # the job's, as validated (config.py)
    rounds: RoundSetup
    target_scale: TargetScale | None = None  # data.scale_target: the server's, computed once (models/target_scale.py)


class Loop(enum.Enum):
    """Which loop a worker runs a stretch with (train/worker/worker.py): the participants meeting at marks, each
    stepping a slice (train/loops/rounds.py), or each claiming tasks at the desk and stepping whole groups
    (train/loops/desk.py). The engines on the server's side, which send these stretches, are
    train/server/engines.py's."""

    ROUNDS = "rounds"
    DESK = "desk"


@dataclass(frozen=True, slots=True, kw_only=True)
class Stretch:
    """Run the rounds of batches [first, stop) of ``epoch``, starting at weight ``version``, as ``slot``.

    Every participant gets the same stretch but its own ``slot``. The plan says the rest: which tasks
    each update has (task t goes to slot ``t % participants``), which parameter slice each slot steps
    (slice j to slot j, ``slices`` of them), and slot 0 publishes. The participants meet at marks
    (train/exchange/marks.py), not at the server. A stretch ends with the step of its last update.
    """

    generation: int
    epoch: int
    first: int
    stop: int
    version: int
    slot: int
    participants: int
    slices: int
    bases: tuple[tuple[int, int], ...] = ()  # fixed staleness: (updates done, the version then) still read
    loop: Loop = Loop.ROUNDS
    # at the desk (train/loops/desk.py): gradients per group, and the staleness allowed
    group: int = 1
    max_staleness: int = 0
    # the server alone (train/loops/threads.py): the threads its update's tasks are computed on; a worker's is 1
    threads: int = 1
    # the server alone, no other process mapping its versions: each version is stepped into one of a ring of
    # private files and only the stretch's newest are published at its end (train/loops/rounds.py)
    private: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalTask:
    """Loss sum and correct count of validation rows [lo, hi) at weight ``version``."""

    task: int
    attempt: int
    version: int
    lo: int
    hi: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StatsTask:
    """Sufficient statistics of train rows [lo, hi) (additive models), read ``chunk_rows`` at a time, to the run's
    ``statistics/`` + ``partial_name(task, attempt)`` (train/loops/additive.py)."""

    task: int
    attempt: int
    lo: int
    hi: int
    chunk_rows: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GradTask:
    """The gradient of the train rows of positions [lo, hi) of epoch ``epoch``'s row sequence (``Plan.rows``)
    at published weight ``version``, into ``streamed_gradient_name(ticket, task, attempt)`` (train/loops/stream.py:
    the round when the participants cannot meet at marks, e.g. on a cluster). ``ticket``: the number the agenda
    that handed it out gave it, which names its file and finds it again: the plan's update number (fixed
    staleness, a cluster's rounds), async's ticket or a replay's step index (schedule.Start)."""

    task: int
    attempt: int
    ticket: int
    version: int
    epoch: int
    lo: int
    hi: int
    spare: str = ""  # a stepped gradient file's new name, to rewrite instead of creating a file ("": none)
    in_place: bool = False  # compute into a map of the spare (one machine only: train/loops/overlap.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTask:
    """Step parameter slice [lo, hi) of update ``update`` from weight ``version`` to ``version`` + 1 (a cluster
    run, train/loops/sliced.py): the mean of the update's ``tasks`` gradient files -- task t's is
    ``streamed_gradient_name(update, t, attempt)``, attempt 0 unless ``retried`` names another, added in task
    order -- over ``rows`` rows, the optimizer at learning rate ``lr``; written into the next version's file and
    the optimizer state's new files at the slice's place. ``task`` is the slice's number. About a hundred bytes
    whatever the number of tasks (no file names; only retried tasks listed), so the records of an update's N
    slices grow as N, not N squared. ``chained``: in a two-level round (train/loops/node_round.py) the sum of the
    first ``chained`` tasks is read from their chain's partial instead, the files of the others added onto it."""

    task: int
    attempt: int
    update: int
    version: int
    lo: int
    hi: int
    rows: int
    lr: float
    tasks: int  # the update's gradient tasks
    retried: tuple[tuple[int, int], ...] = ()  # (task, attempt taken) for each task whose taken attempt is not 0
    chained: int = 0  # the sum of the first ``chained`` tasks is read from their partial (loops/node_sum.py)

    @property
    def attempts(self) -> tuple[int, ...]:
        """The attempt whose gradient file is taken, per task of the update, in task order."""
        taken = dict(self.retried)
        return tuple(taken.get(task, 0) for task in range(self.tasks))


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectTask:
    """A reinforcement-learning collection task (memtrain/rl/server.py): step environment slot ``task`` with the
    policy of weight ``version`` for the job's steps, from the slot's episode state at the start of the version
    (``episode``, ``step`` and the digest ``state_key`` identify it; ``state_file``: the state's .npy, from which a
    worker without the live environment re-simulates it), and publish the shard whole
    (``trajectory_name(version, task)``). ``update`` is ``version``: what ``task_key`` tells tasks apart by."""

    task: int  # the environment slot
    attempt: int
    update: int
    version: int
    episode: int
    step: int
    state_key: str
    state_file: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RLWorkerSetup:
    """Sent once to a worker of a reinforcement-learning run (memtrain/rl/worker.py answers its CollectTasks):
    the run's directory and job file (``job.json``, from which it makes the environment and the policy)."""

    server_pid: int
    run_dir: str
    blas_threads: int = 1
    model_kind: str = "rl"  # (train/worker/launch.py's script_not_rerun asks every setup for it)


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    """Tell a worker to exit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ready:
    """A worker's first message: it has opened the dataset and built the model, and waits for work."""

    pid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StartFailed:
    """A worker's only message when it could not start (the dataset would not open, the model would not
    build): its error, which the server quotes once when it stops the run (train/server/exchange.py)."""

    error: str


Task = EvalTask | StatsTask | GradTask | StepTask | CollectTask
Message = Stretch | EvalTask | StatsTask | GradTask | StepTask | CollectTask | Stop


class Outcome(enum.Enum):
    """How a piece of work ended: a task or a participant's stretch (its answer), or a whole stretch as the
    server saw it (train/server/scheduler.py ``run_stretch``)."""

    DONE = "done"
    NONFINITE = "nonfinite"  # a stretch stopped at a non-finite update (train.on_nonfinite = "stop")
    CANCELLED = "cancelled"  # a stretch the server called off (a fault elsewhere, a stop signal)
    FAILED = "failed"  # the work raised; ``error`` has the text
    FAULT = "fault"  # the server's view: a participant died or was killed; the next stretch restarts from the ledger
    STOPPED = "stopped"  # the server's view: a stop signal


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """The answer to an EvalTask, a StatsTask, a GradTask, a StepTask or a CollectTask (``seconds``: a gradient's
    compute time; a StepTask whose slice came out non-finite answers ``Outcome.NONFINITE``)."""

    task: int
    attempt: int
    outcome: Outcome
    loss: float = 0.0
    rows: int = 0
    correct: int = 0
    seconds: float = 0.0
    error: str | None = None
    digests: bytes = b""  # a StepTask's: the 16-byte digest of each checksum block of its slice, in order


@dataclass(frozen=True, slots=True, kw_only=True)
class StretchEnd:
    """The answer to a Stretch: how it ended. What it computed is in the round's records (train/exchange/marks.py)."""

    generation: int
    slot: int
    outcome: Outcome
    error: str | None = None


# --- what the scheduler sees of a transport (train/server/exchange.py's WorkerPool and InServer, cluster/transport.py's
# ClusterPool): its slots, the events it reports, and the straggler rule a cluster's tasks follow ---


@dataclass
class Slot:
    index: int
    process: Any  # None for the server's own slot
    inbox: Connection | None = None  # the server's end of the pipe the worker reads
    outbox: Connection | None = None  # the server's end of the pipe the worker answers on
    ready: bool = False  # the worker has started and said so
    error: str = ""  # what the worker said when it could not start (StartFailed)
    current: Message | None = None
    since: float = 0.0

    @property
    def idle(self) -> bool:
        return self.current is None

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else os.getpid()


@dataclass(frozen=True)
class Event:
    """An answer from a slot, or the death of its process (``answer`` None, ``exitcode`` set; ``started``
    False when it died before it said Ready: it never ran ``message``, and its pool counts the death)."""

    slot: Slot
    answer: Result | StretchEnd | None
    message: Message | None  # what the slot was working on
    exitcode: int | None = None
    started: bool = True


class Transport(Protocol):
    """Slots to send tasks to and the events they answer with. ``aside``: the transport's stragglers
    (``SetAside``), kept by the transport so that everything sending on it (the scheduler's calls, a cluster's
    broadcast rounds) sees the same ones."""

    slots: list[Slot]
    aside: SetAside

    def send(self, slot: Slot, message: Message) -> None: ...

    def wait(self, timeout: float) -> list[Event]: ...

    def kill(self, slot: Slot) -> None: ...

    def close(self, timeout: float = 5.0) -> None: ...


@dataclass(frozen=True, kw_only=True)
class BackupRule:
    """When ``Scheduler.run`` starts a backup copy of a task (docs/cluster.md, "Stragglers"): the task has run
    more than ``ratio`` times the median time of the tasks of the same call that have finished, and at least
    ``seconds``; nothing is left to send, and a worker is idle. One backup per task."""

    ratio: float  # train.backup_ratio
    seconds: float  # train.backup_seconds

    def due(self, median: float) -> float:
        """How long a task may run, its finished peers' median time being ``median``, before it gets a backup."""
        return max(self.ratio * median, self.seconds)


SET_ASIDE_MEDIANS = 50  # a straggler is set aside for this many median task times (at least train.backup_seconds),
SET_ASIDE_DOUBLINGS = 5  # doubled each time its probe lags again, at most this many times (32 x)


@dataclass
class SetAside:
    """The workers whose last task (or round's share) ran over ``BackupRule.ratio`` times the median of its
    finished peers: stragglers. A straggler's tasks go to the other workers until ``until`` (a monotonic time,
    by slot index); then it gets work again, a probe, and is back in good standing if that keeps up with its
    peers, else set aside again, for twice as long each time in a row (at most 32 x). A worker that stalls
    (stopped, descheduled, a slower machine) thus costs later updates nothing instead of a wait for it: an
    update's tasks queue on the healthy workers. Which worker computes a task never changes a bit (tasks are
    pure). ``noted``: the slots whose setting aside the event log has said (once until they keep up again).

    Only a probe clears a straggler's record: work it answers in time while its time aside is not over (a wave
    of a round it was still in, a task sent before) does not, so a worker stopped most of the time, which now and
    then answers a small share in time, is set aside for twice as long at each lag rather than for the first
    time again (measured: a Dask worker stopped 80% of the time was set aside 30 times a run, 0.5 s each, and
    taken back within milliseconds; issue 43). When every slot is aside, those whose time aside ends first get
    the work, not all of them (with two workers, a healthy one set aside by a false alarm let the straggler
    back in with it)."""

    until: dict[int, float] = field(default_factory=dict)
    noted: set[int] = field(default_factory=set)
    strikes: dict[int, int] = field(default_factory=dict)  # by slot index: set-asides in a row (the time aside doubles)

    def usable_now(self, slot: Any) -> bool:
        """Whether ``slot`` is in good standing or its time aside is over."""
        return self.until.get(slot.index, 0.0) <= time.monotonic()

    def usable(self, slots: list[Any]) -> list[Any]:
        """The slots that may be given work now: all but those set aside; when every one is, those whose time
        aside ends first."""
        usable = [slot for slot in slots if self.usable_now(slot)]
        if usable or not slots:
            return usable
        first = min(self.until.get(slot.index, 0.0) for slot in slots)
        return [slot for slot in slots if self.until.get(slot.index, 0.0) == first]

    def judge(self, slot: Any, seconds: float, peers: list[float], rule: BackupRule,
              log: Callable[[str], None]) -> None:
        """After ``slot`` answered work that took ``seconds``, its finished peers' having taken ``peers``: set
        it aside when that is over ``rule.ratio`` times their median, for ``SET_ASIDE_MEDIANS`` times that
        median and at least ``rule.seconds``; else it is in good standing. Nothing to compare: nothing done."""
        if peers and rule.ratio:
            self.verdict(slot, seconds, statistics.median(peers), rule, log)

    def keeps_up(self, slot: Any, log: Callable[[str], None]) -> None:
        """``slot``'s work kept up with its peers': in good standing (said once if it was set aside) -- unless its
        time aside is not over: that was not a probe, and its record stands."""
        if not self.usable_now(slot):
            return
        self.strikes.pop(slot.index, None)
        if slot.index in self.noted:
            self.noted.discard(slot.index)
            log(f"worker {slot.index} keeps up with its peers again: it gets work as the others do")

    def judge_round(self, members: list[Any], late: dict[int, tuple[float, float]], rule: BackupRule,
                    log: Callable[[str], None]) -> set[int]:
        """A broadcast round's ``verdict`` on each of its ``members`` (by rank: ``late`` holds the ranks that ran
        over the rule, with their seconds and their peers' median); the slot indexes newly set aside. Nothing
        late and nobody aside or noted: nothing to do (the common update)."""
        if not late and not self.until and not self.strikes and not self.noted:
            return set()
        before = {slot.index for slot in members if not self.usable_now(slot)}
        for rank, slot in enumerate(members):
            if rank in late:
                self.verdict(slot, *late[rank], rule, log)
            else:
                self.keeps_up(slot, log)
        return {slot.index for slot in members if not self.usable_now(slot)} - before

    def verdict(self, slot: Any, seconds: float, median: float, rule: BackupRule, log: Callable[[str], None]) -> None:
        """``judge`` with the peers' median known (a broadcast round's, computed on the scheduler)."""
        if seconds <= rule.ratio * median:
            self.keeps_up(slot, log)
            return
        strikes = self.strikes[slot.index] = self.strikes.get(slot.index, 0) + 1
        aside = max(SET_ASIDE_MEDIANS * median, rule.seconds) * 2 ** min(strikes - 1, SET_ASIDE_DOUBLINGS)
        self.until[slot.index] = time.monotonic() + aside
        if slot.index not in self.noted:
            self.noted.add(slot.index)
            log(f"worker {slot.index} took {seconds:.3f} s, over {rule.ratio:g} x the median {median:.3f} s of "
                f"its finished peers: set aside, its work goes to the others for {aside:.2f} s (then tried again; "
                "twice as long each time it lags again, until it keeps up)")


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskLimit:
    """How long a node's process may be silent on a task (``train.task_timeout``) and how many times a task may
    lose its process (``train.max_attempts``), from the node record; ``node``: the node's name in the errors."""

    seconds: float
    attempts: int
    node: str
