"""``train.workers`` and a measurement at start -> where the rounds run: in the server, or on worker processes.

- ``train.workers = 0``: the server runs every round itself (train/loops/rounds.py, one participant).
- ``train.workers = N``: N worker processes run them; the server only watches.
- ``train.workers = "auto"`` (the default): the server runs the first updates itself and times them.
  If the compute that workers could take off its hands is below what a round between processes costs
  (MIN_GAIN_S), or saves less over the rest of the job than starting them costs (``start_cost`` each:
  SPAWN_COST_S plus what building the model cost the server, a torch module's import included), it
  keeps the rounds: no worker is ever started. Otherwise it starts one worker per core
  (at most one per task of an update) and goes on training while they start; once they are ready they
  run a few updates, and the faster of the two, as measured, runs the rest of the job.
- ``"auto"`` with a model the server only outlines (``outlined``: a torch module, train/server/outline.py): the server
  never computes; the rounds it would have run itself run on ONE worker process (the outline's child, kept),
  a one-participant stretch that runs the whole round alone, and are timed there. The same rule then decides
  whether starting the other workers (``count - 1`` of them) may pay; if so they start while the one worker
  trains (``WorkerPool.grow``), the two are timed against each other, and the slower loses: the other workers
  are stopped again (``WorkerPool.shrink``) when one worker was faster.

When the server runs the rounds itself it may compute an update's tasks on a few threads (train/loops/threads.py),
``train.server_threads``: a number N, at most N threads (and one per task); ``"auto"`` (the default), one per
core (and task), timed against one thread over the server's first updates: PROBE_UPDATES on one thread, as
many on the threads, and the faster by THREADS_MARGIN keeps them. Threads need a model that may be called
from several threads at once (a class attribute ``thread_safe = True``: the numpy models) and BLAS on one
thread (``train.blas_threads = 1``); otherwise the server computes on one thread. With ``train.workers =
"auto"`` the threads are timed first, and workers are compared with the faster of the two.

The overlapping modes (train/loops/overlap.py) decide once, at start (``stream_workers``): the server times a
gradient task itself and keeps the gradients when workers could not save more than a streamed update
costs. Either way the results are bitwise identical: the same files, the same tasks, the same arithmetic, the
same order of additions (the participants' count never enters a sum). The choice and its figures go to
the event log.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from memtrain.train.messages import Transport
from memtrain.train.server.exchange import InServer, WorkerPool

# Updates timed in each place before choosing (the first update of each stretch is not timed: it pays
# for the stretch's start).
PROBE_UPDATES = 6

# The measured calibration beside it (``_after_server_probe``): workers are not tried either when what they could
# save is no more than what an update already spends outside its compute where the rounds run now (wall less
# compute, medians of the probe: the step, publication, records and every wake-up at this machine's current
# load). A round between processes pays that again in its meetings, and more under load: a torch module of
# 2,442 parameters (issue 43, 2 tasks of 128 rows, load average 16-21) took 1.6 ms per update in the server
# alone (1.1 ms computing), 1.8 ms on one worker and 14-24 ms on two, where the rule without this saw a
# 0.5 ms saving. (A test that must see workers tried on a busy machine sets OVERHEAD_RATIO to 0.)
OVERHEAD_RATIO = 1.0
# Compute per update that workers must be able to take off the server before they are even tried (and
# spawned: ~0.3 s of start-up each). Between processes an update costs at least two futex wake-ups
# (~10-50 us each on an idle core) and the marks' system calls on top of what the server pays; this
# floor is an estimate, kept low on purpose: above it, the two are timed against each other.
MIN_GAIN_S = 0.15e-3

# Starting a worker (an interpreter, numpy, memtrain, the dataset's maps) costs about this much CPU,
# taken from the server on a machine without a spare core, before its model: building that costs a worker
# what it cost the server (``worker_start_cost``; a torch module: importing torch, seconds). The saving over
# the rest of the job must be larger than both before workers are tried.
SPAWN_COST_S = 0.5
# What streaming an update to workers costs the server beyond the round (an estimate, measured at 1e5
# parameters on a 2-core machine: a message out and back per task, the server's bookkeeping and step).
STREAM_COST_S = 1e-3
# The threads must take at most this fraction of one thread's time per update to be kept: a tie (a model too
# small for its tasks to overlap) keeps the one thread, which costs no handoff and no second core.
THREADS_MARGIN = 0.95


class ServerThreads:
    """How many threads the server computes an update's tasks on (train/loops/threads.py): fixed, or timed.

    ``count``: the threads allowed (``thread_candidates``); ``timed``: "auto", measured against one thread."""

    def __init__(self, *, count: int, timed: bool, why: str, log: Callable[[str], None]):
        self.count, self.log = count, log
        self.chosen: int | None = count if not timed or count < 2 else None
        self.one: list[float] = []  # walls per update on one thread
        self.many: list[float] = []  # ... on ``count`` threads
        # said when the server first runs a stretch itself (never, with workers from the start)
        self.note: str | None = None if self.chosen is None else \
            f"rounds in the server: an update's tasks on {'one thread' if count < 2 else f'{count} threads'} ({why})"

    @property
    def decided(self) -> bool:
        return self.chosen is not None

    def current(self) -> int:
        """The threads of the next stretch the server runs: the chosen count, or the probe's."""
        if self.note is not None:
            self.log(self.note)
            self.note = None
        if self.chosen is not None:
            return self.chosen
        return 1 if len(self.one) < PROBE_UPDATES else self.count

    def walls(self) -> list[float]:
        """The walls measured with the chosen count."""
        return self.many if self.chosen is not None and self.chosen > 1 else self.one

    def observe(self, walls: list[float], update: int) -> None:
        (self.one if self.current() == 1 else self.many).extend(walls)
        if len(self.many) < PROBE_UPDATES:
            return
        one, many = _median(self.one), _median(self.many)
        figures = f"{many * 1e3:.2f} ms per update on {self.count} threads, {one * 1e3:.2f} ms on one"
        if many < one * THREADS_MARGIN:
            self.chosen = self.count
            self.log(f"rounds in the server: an update's tasks on {self.count} threads from update {update}: "
                     f"{figures}")
        else:
            self.chosen = 1
            self.log(f"rounds in the server: an update's tasks on one thread from update {update}: {figures} "
                     f"(the threads must save {(1 - THREADS_MARGIN) * 100:.0f}%)")


def thread_candidates(*, setting: int | str, tasks: int, cores: int, blas_threads: int, model: object
                      ) -> tuple[int, str]:
    """The most threads the server may compute an update's tasks on, and why (``train.server_threads``)."""
    count = min(cores, tasks) if setting == "auto" else min(int(setting), tasks)
    if count < 2:
        if setting == "auto":
            return 1, f"train.server_threads = \"auto\": {cores} core(s), {tasks} task(s) per update"
        return 1, f"train.server_threads = {setting}" + (f", {tasks} task(s) per update" if setting != 1 else "")
    if not getattr(model, "thread_safe", False):
        return 1, f"the model ({type(model).__name__}) does not say thread_safe = True"
    if blas_threads != 1:
        return 1, f"train.blas_threads = {blas_threads}: BLAS threads already share the cores"
    return count, "train.server_threads = \"auto\"" if setting == "auto" else f"train.server_threads = {setting}"


class Phase(enum.Enum):
    SERVER_PROBE = "timing the rounds in the server"
    STARTING = "the server trains while workers start"
    WORKERS_PROBE = "timing the rounds on workers"
    SERVER = "in the server"
    WORKERS = "on workers"


def worker_start_cost(build_seconds: float) -> float:
    """CPU seconds one worker costs to start: a process (SPAWN_COST_S) and its model, which it builds as the
    server did in ``build_seconds`` (train/context.py measures it)."""
    return SPAWN_COST_S + build_seconds


class Placement:
    def __init__(self, *, workers: int | str, tasks: int, cores: int, in_server: InServer,
                 start_pool: Callable[[int], WorkerPool], log: Callable[[str], None], threads: ServerThreads,
                 start_cost: float = SPAWN_COST_S, outlined: bool = False):
        self.in_server, self.start_pool, self.log, self.threads = in_server, start_pool, log, threads
        self.start_cost = start_cost
        self.pool: WorkerPool | None = None
        self.count = min(cores, tasks) if workers == "auto" else int(workers)
        # "auto" with an outlined model: one worker runs the rounds the server would have run (``alone``)
        self.outlined = outlined and workers == "auto" and self.count >= 2
        self.alone = "on 1 worker" if self.outlined else "in the server"
        self.server_walls: list[float] = []
        self.server_computes: list[float] = []
        self.worker_walls: list[float] = []
        if workers == 0:
            self.phase = Phase.SERVER
            log("rounds: in the server (train.workers = 0)")
        elif workers != "auto":
            self.phase = Phase.WORKERS
            self.pool = start_pool(self.count)
            log(f"rounds: on {self.count} worker processes (train.workers = {self.count})")
        elif self.count < 2:
            self.phase = Phase.SERVER
            log(f"rounds: in the server (train.workers = \"auto\": {cores} core(s), {tasks} task(s) per update: "
                f"nothing to share)")
        else:
            self.phase = Phase.SERVER_PROBE
            if self.outlined:
                self.pool = start_pool(1)
                log("rounds: timed on 1 worker process (train.workers = \"auto\"; the model is only outlined in "
                    "the server, which computes nothing)")

    @property
    def transport(self) -> Transport:
        if self.phase in (Phase.WORKERS, Phase.WORKERS_PROBE) or self.outlined:
            return self.pool
        return self.in_server

    @property
    def decided(self) -> bool:
        return self.phase in (Phase.SERVER, Phase.WORKERS)

    def server_threads(self) -> int:
        """The threads the server computes an update's tasks on in its next stretch (train/loops/threads.py)."""
        return self.threads.current()

    def stretch_limit(self) -> int | None:
        """How many updates the next stretch may run (None: to the end of its epoch)."""
        if self.phase == Phase.SERVER and not self.threads.decided:
            return PROBE_UPDATES + 1
        if self.phase == Phase.SERVER_PROBE:
            return PROBE_UPDATES + 1
        if self.phase == Phase.WORKERS_PROBE:
            return PROBE_UPDATES + 1
        if self.phase == Phase.STARTING and self.outlined:  # a worker's stretch ends only at its limit: then the
            return PROBE_UPDATES + 1  # placement looks whether the other workers are ready
        return None

    def ends_stretch(self) -> bool:
        """Between two updates the server runs itself: True ends its stretch (the workers are ready)."""
        return self.phase == Phase.STARTING and self.pool.ready()

    def observe(self, timeline: list[tuple[int, float, float]], update: int, remaining: int) -> None:
        """The (update, publication time, compute seconds) of the last stretch's updates; ``update`` is the
        next update to run, ``remaining`` how many the job has left."""
        walls = [b[1] - a[1] for a, b in zip(timeline, timeline[1:], strict=False) if b[0] == a[0] + 1]
        if self.phase in (Phase.SERVER, Phase.SERVER_PROBE) and not self.threads.decided:
            if self.phase == Phase.SERVER_PROBE and self.threads.current() == 1:  # the threads' task seconds
                self.server_computes += [c for _, _, c in timeline[1:]]  # overlap and contend: not the compute
            self.threads.observe(walls, update)
            if self.phase == Phase.SERVER:
                return
            if self.threads.decided:  # workers are compared with the faster of one thread and the threads
                self.server_walls = list(self.threads.walls())
                self._after_server_probe(update, remaining)
        elif self.phase == Phase.SERVER_PROBE:
            self.server_walls += walls
            self.server_computes += [c for _, _, c in timeline[1:]]
            if len(self.server_walls) >= PROBE_UPDATES:
                self._after_server_probe(update, remaining)
        elif self.phase == Phase.STARTING and self.pool.ready():
            self.phase = Phase.WORKERS_PROBE
        elif self.phase == Phase.WORKERS_PROBE:
            self.worker_walls += walls
            if len(self.worker_walls) >= PROBE_UPDATES:
                self._after_workers_probe(update)

    def _after_server_probe(self, update: int, remaining: int) -> None:
        wall, compute = _median(self.server_walls), _median(self.server_computes)
        gain = compute * (1 - 1 / self.count)
        starting = self.count - 1 if self.outlined else self.count  # one worker runs already
        figures = f"an update takes {wall * 1e3:.2f} ms {self.alone}, {compute * 1e3:.2f} ms of it computing"
        if gain < MIN_GAIN_S:
            self.phase = Phase.SERVER
            self.log(f"rounds: {self.alone} from update {update}: {figures}; {self.count} workers could save at "
                     f"most {gain * 1e3:.2f} ms of it, less than a round between processes costs "
                     f"({MIN_GAIN_S * 1e3:.2f} ms)")
            return
        if gain * remaining < self.start_cost * starting:
            self.phase = Phase.SERVER
            self.log(f"rounds: {self.alone} from update {update}: {figures}; {self.count} workers could save at "
                     f"most {gain * remaining:.3g} s over the {remaining} updates left, less than starting "
                     f"{'the other ' + str(starting) if self.outlined else 'them'} costs "
                     f"({start_cost_text(self.start_cost, starting)})")
            return
        overhead = (wall - compute) * OVERHEAD_RATIO
        if gain <= overhead:
            self.phase = Phase.SERVER
            self.log(f"rounds: {self.alone} from update {update}: {figures}; {self.count} workers could save at "
                     f"most {gain * 1e3:.2f} ms of it, no more than the {overhead * 1e3:.2f} ms an update spends "
                     f"outside its compute here, which a round between processes pays again in its meetings")
            return
        if self.outlined:
            self.log(f"rounds: {figures}; starting {starting} more worker(s) to compare {self.count} with 1")
            self.pool.grow(self.count)
        else:
            self.log(f"rounds: {figures}; starting {self.count} workers to compare")
            self.pool = self.start_pool(self.count)
        self.phase = Phase.STARTING

    def _after_workers_probe(self, update: int) -> None:
        server, workers = _median(self.server_walls), _median(self.worker_walls)
        figures = f"{workers * 1e3:.2f} ms per update on {self.count} workers, {server * 1e3:.2f} ms {self.alone}"
        if workers < server:
            self.phase = Phase.WORKERS
            self.log(f"rounds: on {self.count} workers from update {update}: {figures}")
            return
        self.phase = Phase.SERVER
        if self.outlined:
            self.log(f"rounds: on 1 worker from update {update}: {figures}; the other worker(s) stopped")
            self.pool.shrink(1)
            return
        self.log(f"rounds: in the server from update {update}: {figures}; workers stopped")
        self.pool.close()
        self.pool = None

    def close(self, timeout: float = 5.0) -> None:
        if self.pool is not None:
            self.pool.close(timeout)


def start_cost_text(start_cost: float, count: int) -> str:
    """What ``count`` workers cost to start, with its parts when building the model counts (a torch module)."""
    text = f"{start_cost * count:.1f} s"
    if start_cost - SPAWN_COST_S >= 0.05:
        text += (f", each {SPAWN_COST_S:.1f} s for a process and {start_cost - SPAWN_COST_S:.1f} s to build the "
                 f"model, as it took here")
    return text


def stream_workers(*, workers: int | str, count: int, task_seconds: Callable[[], float], tasks: int,
                   remaining: int, start_cost: float = SPAWN_COST_S) -> tuple[int, str]:
    """How many workers the overlapping modes stream their gradients to (0: the server computes them), and why.

    ``task_seconds`` times one gradient task in the server (called only for ``"auto"``); ``start_cost``: one
    worker's (``worker_start_cost``)."""
    if workers != "auto":
        return int(workers), f"train.workers = {workers}"
    if count < 2:
        return 0, f"train.workers = \"auto\": {count} core(s) or task(s): nothing to share"
    compute = task_seconds() * tasks
    gain = compute * (1 - 1 / count)
    figures = f"train.workers = \"auto\": an update computes for {compute * 1e3:.2f} ms in the server"
    if gain < STREAM_COST_S:
        return 0, (f"{figures}; {count} workers could save at most {gain * 1e3:.2f} ms of it, less than streaming "
                   f"it costs ({STREAM_COST_S * 1e3:.2f} ms)")
    if gain * remaining < start_cost * count:
        return 0, (f"{figures}; {count} workers could save at most {gain * remaining:.3g} s over the {remaining} "
                   f"updates left, less than starting them costs ({start_cost_text(start_cost, count)})")
    return count, figures


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
