"""The run's engine, chosen once at start (``choose``) from one table (``ENGINES``), so the Trainer names no mode.

A run has one of these engines, each a row of ``ENGINES``: where its work runs, how the epoch loop runs it and how
its engine (train/server/engines.py) is made once the server's side exists, with one signature:

    rounds   synchronous, or fixed staleness in the rounds: ``Rounds`` (worker processes, or the server alone)
    cluster  the rounds on a cluster (synchronous only): ``ClusterRounds``
    stream   fixed staleness streamed: the server steps the whole vector, ``ServerSteps`` with ``Planned(k)``
    async    async mode: the ``Desk`` on worker processes; in the server, ``ServerSteps`` with ``Arrival``
    replay   a lineage run again (``memtrain train --replay``): ``Replay``, the lineage's ``Recorded`` steps
    solve    an additive model: ``OnePass``, its statistics and its solve (on a cluster too)

The start-up (``_train``, train/server/server.py) makes the ``Choice`` as soon as it knows the model, before it
writes anything: a job no engine runs (an overlapping mode or a replay on a cluster, an additive model with an
overlapping mode) is refused there, by ``engine_of``; the run directory, the start-up note (``Entry.advice``) and
the Trainer read the ``Choice``'s facts (updates per epoch, buffers, which placement, the words of its log line,
whether the run is one whole piece, whether it is a solve) and the Trainer calls ``make`` once. None of them asks
which (tests/test_layering.py checks the start-up functions and the Trainer)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memtrain.config import Job
from memtrain.errors import InputError
from memtrain.train.context import ModelContext
from memtrain.train.loops.additive import pass_source
from memtrain.train.loops.mapped import RoundFiles
from memtrain.train.plan import gradient_banks, in_rounds
from memtrain.train.records.lineage import Lineage
from memtrain.train.records.run_dir import RunDir
from memtrain.train.records.state import job_updates_per_epoch
from memtrain.train.schedule import Arrival, Planned
from memtrain.train.server.advice import few_updates_note, one_pass_note
from memtrain.train.server.engines import ClusterRounds, Desk, EngineContext, EpochEngine, Rounds, ServerSteps
from memtrain.train.server.exchange import WorkerPool
from memtrain.train.server.onepass import OnePass
from memtrain.train.server.replay import Replay


@dataclass(frozen=True, kw_only=True)
class Given:
    """What the makers draw from besides the engine's context: the job, the server's model context, the
    lineage a replay runs again and the run directory (a solve appends its record to the run's lineage)."""

    job: Job
    model: ModelContext
    lineage: Lineage | None
    run: RunDir


# One maker signature: the engine's context, the server's round files (made when first asked) and the ``Given``.
Maker = Callable[[EngineContext, Callable[[], RoundFiles], Given], EpochEngine]


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A row of ``ENGINES``. ``placement``: where the work runs (train/server/placement.py and pools.py):
    "rounds" (worker processes or the server, measured at start), "stream" (gradients streamed to workers or
    the server), "desk" (streamed, the workers stepping whole groups at the desk when there are any).
    ``whole``: one piece (the epoch loop runs it once, then evaluates; no epoch's progress line); ``one_pass``:
    a solve (no running loss, no epochs to count: ``TrainSummary.one_pass``); ``advice(job, train_rows)``: the
    note shown at start, or None (train/server/advice.py)."""

    placement: str
    make: Maker
    whole: bool = False
    one_pass: bool = False
    advice: Callable[[Job, int], str | None] = lambda job, train_rows: few_updates_note(job, train_rows, False)


def _async(context: EngineContext, files: Callable[[], RoundFiles], given: Given) -> EpochEngine:
    if isinstance(context.placement.transport, WorkerPool):
        return Desk(context)
    train = context.train
    return ServerSteps(context, files=files(), schedule=Arrival(group=train.async_group,
                                                               max_staleness=train.max_staleness,
                                                               per_epoch=context.per_epoch))


def _solve(context: EngineContext, files: Callable[[], RoundFiles], given: Given) -> EpochEngine:
    model = given.job.model
    return OnePass(context, model=given.model, kind=model.kind, record=given.run.lineage,
                   source=pass_source(given.model.manifest, model.kind, model.options, given.job.data.normalize))


ENGINES: dict[str, Entry] = {
    "rounds": Entry(placement="rounds", make=lambda context, files, given: Rounds(context)),
    "cluster": Entry(placement="cluster", make=lambda context, files, given: ClusterRounds(context, files=files())),
    "stream": Entry(placement="stream", make=lambda context, files, given: ServerSteps(
        context, files=files(), schedule=Planned(staleness=context.train.staleness))),
    "async": Entry(placement="desk", make=_async),
    "replay": Entry(placement="stream", whole=True, make=lambda context, files, given: Replay(
        context, files=files(), lineage=given.lineage)),
    "solve": Entry(placement="rounds", whole=True, one_pass=True, make=_solve,
                   advice=lambda job, train_rows: one_pass_note(job)),
}


@dataclass(frozen=True, kw_only=True)
class Choice:
    """The run's engine as chosen at start: its name (``engine``, an ``ENGINES`` key) and what the Trainer reads
    of it.

    ``placement``: ``Entry.placement``, or "cluster" for any run on one; ``words``: the mode in the placement's
    log line; ``tasks``: the gradients an update computes side by side (async: a group), which the placement
    weighs; ``per_epoch``: updates per epoch (async: groups; a solve: 1); ``banks``: the rounds' gradient
    buffers per task (none for a solve); ``notes``: logged when the engine is made; ``job``, ``model`` (the
    server's model context) and ``lineage`` (a replay's): what the engine is made from (``Given``)."""

    engine: str
    placement: str
    words: str
    tasks: int
    per_epoch: int
    banks: int
    notes: tuple[str, ...]
    job: Job
    model: ModelContext
    lineage: Lineage | None

    @property
    def whole(self) -> bool:
        return ENGINES[self.engine].whole

    @property
    def one_pass(self) -> bool:
        return ENGINES[self.engine].one_pass

    def advice(self, train_rows: int) -> str | None:
        """The engine's note for this job at start (its settings that do not apply, too few updates), or None."""
        return ENGINES[self.engine].advice(self.job, train_rows)

    def make(self, context: EngineContext, files: Callable[[], RoundFiles], run: RunDir) -> EpochEngine:
        """The engine, handed ``context`` (and the server's round files, made when first asked; ``run``: the run
        directory)."""
        return ENGINES[self.engine].make(context, files, Given(job=self.job, model=self.model, lineage=self.lineage,
                                                              run=run))


def engine_of(job: Job, *, additive: bool, replaying: bool) -> str:
    """The ``ENGINES`` key of a run's engine: a solve, a cluster's rounds, a replay, the rounds, async or
    streamed. Raises InputError for a job no engine runs: an overlapping mode or a replay on a cluster, an
    additive model (a solve) with an overlapping mode."""
    if job.run.cluster and (overlapping(job) or replaying):
        raise InputError("fixed staleness, async mode and replay run on one machine only, so far",
                         expected="run.cluster unset (no --cluster)", found=f"run.cluster = {job.run.cluster!r}",
                         hint="on a cluster, train synchronously (train.mode = 'sync', train.staleness = 0)")
    if additive and overlapping(job):
        raise InputError(f"a {job.model.kind} model is solved in one pass of statistics: it has no updates to "
                         "overlap", expected="train.mode = 'sync' and train.staleness = 0", found=describe_mode(job))
    if additive:
        return "solve"
    if job.run.cluster:
        return "cluster"
    if replaying:
        return "replay"
    if in_rounds(job.train, replaying=False):
        return "rounds"
    return "async" if job.train.mode == "async" else "stream"


def overlapping(job: Job) -> bool:
    """Whether the job trains in an overlapping mode (train/loops/overlap.py): fixed staleness or async."""
    return job.train.mode == "async" or job.train.staleness > 0


def describe_mode(job: Job) -> str:
    if job.train.mode == "async":
        return f"async mode (max_staleness {job.train.max_staleness}, async_group {job.train.async_group})"
    return f"fixed staleness {job.train.staleness}"


def choose(job: Job, model: ModelContext, train_rows: int, *, lineage: Lineage | None) -> Choice:
    """The run's ``Choice``: ``lineage`` a run to replay (None: the job's own epochs). Raises InputError for a
    job no engine runs (``engine_of``)."""
    train = job.train
    engine = engine_of(job, additive=model.additive, replaying=lineage is not None)
    notes = ((f"fixed staleness {train.staleness}: in the {train.staleness_in} "
              f"(train.staleness_in = {train.staleness_in!r})",) if train.staleness else ())
    return Choice(engine=engine, placement="cluster" if job.run.cluster else ENGINES[engine].placement,
                  words="replay" if engine == "replay" else describe_mode(job),
                  tasks=train.async_group if train.mode == "async" else train.tasks_per_update,
                  per_epoch=1 if model.additive else job_updates_per_epoch(job, train_rows),
                  banks=0 if model.additive else gradient_banks(train.staleness), notes=notes,
                  job=job, model=model, lineage=lineage)
