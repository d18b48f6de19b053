"""The cluster's synchronous round by broadcast: one record out and one count back per wait, whatever N.

Per update the server makes two waits (docs/cluster.md, "The broadcast round"): every gradient written
before any slice is stepped, every slice stepped before the version is published. Sent as one actor call
per worker, each wait costs the server's CPU 2 x N calls and answers. Here it costs two messages:

- the server **posts** one record per wait to the scheduler (``BroadcastPlugin``, a scheduler plugin): the update's
  number and version (``gradient_record``: each worker derives the update's tasks from the plan, which it
  has), or the step's template (version, update, learning rate, rows);
- each worker of the round runs a long loop in its actor (``follow``: the actor's one thread, so no other
  call of ours runs on that worker meanwhile) that waits for the next record, does its part -- the tasks
  ``tasks[rank::size]``, the slice ``step_slices(size, members, BLOCK)[rank]`` -- and answers the BroadcastPlugin with
  a few numbers (task, loss, seconds for each of its tasks) or its slice's block digests;
- the server **awaits** one count: the BroadcastPlugin answers when every member answered (the numbers concatenated,
  the digests joined, in rank order: the server's bytes do not depend on N), when a member left the
  scheduler (its ``remove_worker`` hook), when a member's task failed, when the last answers are late by
  the straggler rule (``BackupRule``, per task: ``due_at``), or at ``train.task_timeout``.

A round has fixed members and ranks. Any end but "every answer in" ends the round; the server then completes
that update through the per-task path (``Scheduler.run``: retries, backups, kills) and opens a new round
with the workers present at the next update. A worker that joins is seen by the BroadcastPlugin (``add_worker``) and
takes part from the next round. The coordination's cost per worker moves to the scheduler (a message in,
one out, per worker per wait): it does not vanish (docs/cluster.md, "The model").

A round whose members are all nodes (memtrain/cluster/nodes.py: one Dask worker per node) takes the scheduler
out of the waves too (``WaveFiles``): records and answers are small JSON files of the exchange area on the
shared filesystem, the server settles each wave by the same rules on its side, and the scheduler keeps the
round's membership and liveness. Nobody waits by asking the scheduler: the member that completes a wave (it finds
every answer file there after writing its own) writes them all into one file, which the server reads whatever the
members (``WaveFiles.merge``), and says so in one event, and the plugin publishes a member that left
or a worker that joined as it happens, both on the topic the server subscribes to (``TOPIC``: Dask's pub/sub,
over the connection its client holds); the server sleeps until told, looking at the answer files and asking the
scheduler only as a bounded fallback (``LOOK_SECONDS``, ``STATUS_SECONDS``). A lost server is pushed to the
members' workers (``RoundEnds``). A few messages per update, whatever the nodes and however long a wave takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
import statistics
import threading
import time
import traceback
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from memtrain.errors import InputError
from memtrain.files import open_regular, publish_new, write_json
from memtrain.train.exchange.area import WAVE, discard
from memtrain.train.exchange.weights import BLOCK
from memtrain.train.messages import BackupRule, GradTask, Outcome, Result, SetAside, StepTask
from memtrain.train.plan import member_slice
from memtrain.train.timing import timed

if TYPE_CHECKING:  # the pool's actors call ``follow`` here: the transport imports this module, not back
    from memtrain.cluster.transport import ClusterPool, ClusterSlot

NEXT_SECONDS = 30.0  # a worker's wait for a record is re-asked after this (so a lost server is noticed)
AWAIT_SECONDS = 5.0  # the server's wait for a count is re-asked after this (so a lost scheduler is noticed)
CALL_SECONDS = 30.0  # a post or an end the scheduler does not answer within this: the scheduler is lost
TOPIC = "memtrain-round"  # a round of nodes: the events the server is told by (a wave done, a member left, a join)
LOOK_SECONDS = 0.25  # ... and, when not told, it looks at the answer files this often (a lost event: it cannot hang)
STATUS_SECONDS = 5.0  # ... and asks the scheduler how the round stands this often (a lost event, a lost scheduler)
ALIVE_SECONDS = NEXT_SECONDS  # a node waiting for a record asks if the round is on this often (a lost push)
ENDED_OP = "memtrain-round-ended"  # the scheduler's push to a round's members' workers: its server is gone
FILE_POLL = (0.0002, 0.002)  # a round of nodes: first and longest sleep between polls for a wave file
POLL_SHARE = 0.02  # ... or, longer, this share of the time waited so far (at most 2% more wait, far fewer polls)
LOOK_SHARE = 0.1  # the server's fallback looks: every LOOK_SECONDS (STATUS_SECONDS), or this share of the wave's time


@dataclass
class Wave:
    """One wait of a round on the BroadcastPlugin: the record, when it was posted, the answers by rank."""

    record: bytes
    posted: float
    parts: int  # the pieces of work the wave deals out, piece j to rank j % N (tasks, or the step's slices)
    shares: list[int] | None = None  # or each rank's share, in pieces, when not dealt so (a round of nodes)
    answers: dict[int, tuple[float, list[float], bytes, str]] = field(default_factory=dict)


@dataclass
class RoundState:
    members: list[str]
    client: str
    waves: dict[int, Wave] = field(default_factory=dict)
    ended: bool = False
    left: str = ""  # a member that left the scheduler
    joined: bool = False  # a worker joined the scheduler since the round began
    posted: asyncio.Event = field(default_factory=asyncio.Event)  # set at a post or the end: wakes the members
    answered: asyncio.Event = field(default_factory=asyncio.Event)  # set at an answer or a leave: wakes the server

    def wake(self, *, members: bool = True) -> None:
        """Wake the server's wait, and the members' unless ``members`` is False (an answer: only the server
        cares; waking every member at each answer would cost the scheduler N x N wake-ups per wave)."""
        self.answered.set()
        self.answered = asyncio.Event()
        if members:
            self.posted.set()
            self.posted = asyncio.Event()


class BroadcastPlugin(SchedulerPlugin):
    """The scheduler plugin: rounds' records, answers and counts (handlers ``memtrain_*``)."""

    name = "memtrain-broadcast"
    idempotent = True  # a second run on the same scheduler keeps the BroadcastPlugin (and the first run's rounds)

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.rounds: dict[str, RoundState] = {}
        self.calls: Counter[str] = Counter()  # messages handled, by handler (what a round costs the scheduler)
        scheduler.handlers.update({"memtrain_begin": self.begin, "memtrain_post": self.post,
                                   "memtrain_next": self.next, "memtrain_answer": self.answer_and_next,
                                   "memtrain_await": self.await_count, "memtrain_end": self.end,
                                   "memtrain_status": self.status})

    def begin(self, ident: str = "", members: list[str] | None = None, client: str = "") -> None:
        self.calls["memtrain_begin"] += 1
        self.rounds = {key: state for key, state in self.rounds.items() if not state.ended}
        state = self.rounds[ident] = RoundState(members=list(members or []), client=client)
        gone = [worker for worker in state.members if worker not in self.scheduler.workers]
        state.left = gone[0] if gone else ""  # left before the round began: its first wave ends it

    def post(self, ident: str = "", wave: int = 0, record: bytes = b"", parts: int = 0,
             shares: list[int] | None = None) -> None:
        self.calls["memtrain_post"] += 1
        state = self.rounds[ident]
        state.waves = {w: v for w, v in state.waves.items() if w >= wave - 1}
        state.waves[wave] = Wave(record=record, posted=time.monotonic(), parts=parts, shares=shares)
        state.wake()

    def status(self, ident: str = "") -> dict[str, Any]:
        """How the round stands for a round of nodes, whose waves go through files (``WaveFiles``): ended, the
        member that left ("" none), whether a worker joined. One message, whatever the number of members."""
        self.calls["memtrain_status"] += 1
        state = self.rounds.get(ident)
        if state is None:
            return {"ended": True, "left": "", "joined": False}
        return {"ended": state.ended, "left": state.left, "joined": state.joined}

    async def next(self, ident: str = "", wave: int = 0, seconds: float = NEXT_SECONDS) -> bytes | None:
        """Wave ``wave``'s record; None once the round ended; b"" after ``seconds`` without either (ask again)."""
        self.calls["memtrain_next"] += 1
        deadline = time.monotonic() + seconds
        while True:
            state = self.rounds.get(ident)
            if state is None or state.ended:
                return None
            if wave in state.waves:
                return state.waves[wave].record
            if not await wait(state.posted, deadline):
                return b""

    async def answer_and_next(self, ident: str = "", wave: int = 0, rank: int = 0,
                              numbers: list[float] | None = None, blob: bytes = b"", error: str = "",
                              seconds: float = NEXT_SECONDS) -> bytes | None:
        """A member's answer to wave ``wave``, then (in the same message, to halve the scheduler's) ``next``
        for wave ``wave`` + 1."""
        self.calls["memtrain_answer"] += 1
        state = self.rounds.get(ident)
        if state is not None and not state.ended and wave in state.waves:  # else a late answer: nobody waits
            state.waves[wave].answers[rank] = (time.monotonic(), list(numbers or []), blob, error)
            state.wake(members=False)
        return await self.next(ident, wave + 1, seconds)

    async def await_count(self, ident: str = "", wave: int = 0, seconds: float = AWAIT_SECONDS,
                          timeout: float = 0.0, ratio: float = 0.0, backup_seconds: float = 0.0) -> dict[str, Any]:
        """How wave ``wave`` stands once it settled (or after ``seconds``: status "waiting"): the status, the
        answers' numbers concatenated and their blobs joined in rank order, the ranks that answered."""
        self.calls["memtrain_await"] += 1
        deadline = time.monotonic() + seconds
        while True:
            state = self.rounds.get(ident)
            status = "ended" if state is None or state.ended else settled(state, wave, timeout, ratio, backup_seconds)
            if status:
                return summary(state, wave, status, ratio)
            assert state is not None
            until = min(deadline, due_at(state, wave, ratio, backup_seconds, timeout))
            if not await wait(state.answered, until) and time.monotonic() >= deadline:
                return summary(state, wave, "waiting")

    def end(self, ident: str = "") -> None:
        self.calls["memtrain_end"] += 1
        state = self.rounds.get(ident)
        if state is not None:
            state.ended = True
            state.wake()

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        for ident, state in self.rounds.items():
            if worker in state.members and not state.left:
                state.left = worker
                state.wake()
                self.tell(ident, "left", worker=worker)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        for ident, state in self.rounds.items():
            if not state.ended:
                state.joined = True
                self.tell(ident, "joined", worker=worker)

    def remove_client(self, scheduler: Any, client: str) -> None:
        for ident, state in self.rounds.items():  # the server is gone: its workers' loops end
            if state.client == client and not state.ended:
                state.ended = True
                state.wake()
                # a round of nodes' members wait on files, not on this plugin: told (``RoundEnds``), not asking;
                # only workers that have its handler (a message without one would close the worker's stream)
                if RoundEnds.name in getattr(scheduler, "worker_plugins", {}):
                    scheduler.send_all({}, {member: [{"op": ENDED_OP, "ident": ident}] for member in state.members})

    def tell(self, ident: str, kind: str, **fields: Any) -> None:
        """Publish how a round changed to the server (``TOPIC``: its client subscribed, ``Broadcast.told``)."""
        self.scheduler.log_event(TOPIC, {"ident": ident, "kind": kind, **fields})

    def log_event(self, topic: str, msg: Any) -> None:
        """Count the round's events (a member's "done", the plugin's own "left" and "joined"): messages too."""
        if topic == TOPIC and isinstance(msg, dict):
            self.calls[f"memtrain_{msg.get('kind', '')}"] += 1


class RoundEnds(WorkerPlugin):
    """On every Dask worker of the run: the handler of the scheduler's push that a round's server is gone
    (``ENDED_OP``, sent by ``BroadcastPlugin.remove_client``), so that a member waiting for a record of a round
    of nodes stops without asking (``ENDED``). Installed before the worker handles the scheduler's stream (a
    worker plugin is set up before it), so that no push can reach a worker without it."""

    name = "memtrain-round-ends"
    idempotent = True

    def setup(self, worker: Any) -> None:
        worker.stream_handlers[ENDED_OP] = round_ended


ENDED: set[str] = set()  # on a worker: the rounds whose server the scheduler said is gone


def round_ended(ident: str = "", **_: Any) -> None:
    ENDED.add(ident)


async def wait(event: asyncio.Event, until: float) -> bool:
    """Wait for ``event`` until the monotonic time ``until``; False if it was not set by then."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, until - time.monotonic()))
        return True
    return False


def settled(state: RoundState, wave: int, timeout: float, ratio: float, backup_seconds: float) -> str:
    """The wave's status once it settled, "" while it has not."""
    current = state.waves[wave]
    answers = current.answers
    if any(error for _, _, _, error in answers.values()):
        return "failed"
    if len(answers) == len(state.members):
        return "done"
    if state.left:
        return "left"
    now = time.monotonic()
    if timeout and now - current.posted >= timeout:
        return "timeout"
    return "late" if now >= due_at(state, wave, ratio, backup_seconds, 0.0) else ""


def due_at(state: RoundState, wave: int, ratio: float, backup_seconds: float, timeout: float) -> float:
    """When a missing answer of the wave is late, or the wave times out; inf if neither can be yet.

    The straggler rule (``BackupRule``) per piece of work: a member dealt ``k`` pieces is late once the wave
    has run ``ratio`` x ``k`` x the median time per piece of the answers in (members dealt none left out),
    and at least ``backup_seconds``: with more tasks than workers, a member doing two is not a straggler
    for taking twice as long as one doing one. A round of nodes gives each node's share itself
    (``Wave.shares``: its tasks per process, rounded up), so a node is one unit of the rule."""
    current, members = state.waves[wave], len(state.members)
    shares = current.shares or [len(range(rank, current.parts, members)) for rank in range(members)]
    per_piece = [(at - current.posted) / shares[rank] for rank, (at, *_) in current.answers.items()
                 if rank < members and shares[rank]]
    missing = [shares[rank] for rank in range(members) if rank not in current.answers]
    late = float("inf")
    if ratio and per_piece and missing:
        rule, median = BackupRule(ratio=ratio, seconds=backup_seconds), statistics.median(per_piece)
        late = current.posted + min(rule.due(median * share) for share in missing)
    return min(late, current.posted + timeout if timeout else float("inf"))


def laggards(state: RoundState, current: Wave, ratio: float) -> list[tuple[int, float, float]]:
    """The answered members whose seconds per piece of the wave (from the post to the answer, over the share;
    members dealt none left out) are over ``ratio`` times the median of the others': (rank, their seconds,
    that median), for the set-aside rule (``SetAside``). Usually none: the answer stays as small whatever N."""
    members = len(state.members)
    shares = current.shares or [len(range(rank, current.parts, members)) for rank in range(members)]
    seconds = {rank: (at - current.posted) / shares[rank] for rank, (at, *_) in current.answers.items()
               if rank < members and shares[rank]}
    found = []
    for rank, own in seconds.items():
        others = [value for other, value in seconds.items() if other != rank]
        if ratio and others and own > ratio * statistics.median(others):
            found.append((rank, own, statistics.median(others)))
    return found


def summary(state: RoundState | None, wave: int, status: str, ratio: float = 0.0) -> dict[str, Any]:
    current = state.waves.get(wave) if state is not None else None
    ranks = sorted(current.answers) if current is not None else []
    answers = [current.answers[rank] for rank in ranks] if current is not None else []
    errors = [error for _, _, _, error in answers if error]
    return {"status": status, "ranks": ranks if status != "done" else [],
            "laggards": laggards(state, current, ratio) if state is not None and current and status == "done" else [],
            "numbers": [n for _, numbers, _, _ in answers for n in numbers],
            "blob": b"".join(blob for _, _, blob, _ in answers), "error": errors[0] if errors else "",
            "joined": bool(state is not None and state.joined),
            "waited": time.monotonic() - current.posted if current is not None else 0.0}


# --- the worker's side ---


def follow(actor: Any, ident: str, rank: int, members: int, files: bool = False) -> int:
    """A worker's loop for one round (run as an actor call: the actor's one thread): each record's part done
    and answered, until the round ends. Returns how many waves it answered. ``files``: a round of nodes,
    whose records and answers are files of the exchange area (``follow_files``)."""
    from distributed.utils import sync

    worker = actor.worker

    def call(handler: str, **arguments: Any) -> Any:
        return sync(worker.loop, getattr(worker.scheduler, handler), ident=ident, **arguments)

    def ended() -> bool:  # a failed ask is no answer: the round's end file, or a push, still ends the loop
        try:
            return bool(call("memtrain_status")["ended"])
        except Exception:  # noqa: BLE001 - whatever the comm raised, asked again in ALIVE_SECONDS
            return False

    from memtrain.cluster.nodes import every

    if files:
        return follow_files(actor, WaveFiles(Path(actor.state.exchange), ident), rank, members, ended,
                            lambda wave: worker.log_event(TOPIC, {"ident": ident, "kind": "done", "wave": wave}))
    wave = 0
    record = call("memtrain_next", wave=wave, seconds=NEXT_SECONDS)
    while True:
        if record is None:
            return wave
        if not record:  # nothing yet: ask again
            record = call("memtrain_next", wave=wave, seconds=NEXT_SECONDS)
            continue
        kind, body = pickle.loads(record)  # a record the run's server posted (like Dask's own messages)
        over = every(0.5, lambda after=wave + 1: call("memtrain_next", wave=after, seconds=0.0) is None)
        numbers, blob, error = member_part(actor, kind, body, rank, members, over)
        record = call("memtrain_answer", wave=wave, rank=rank, numbers=numbers, blob=blob, error=error,
                      seconds=NEXT_SECONDS)
        wave += 1


def follow_files(actor: Any, files: WaveFiles, rank: int, members: int, ended: Callable[[], bool],
                 done: Callable[[int], None]) -> int:
    """``follow`` for a round of nodes: each wave's record read from its file, the answer written as a file;
    the member whose answer completes the wave (every member's answer file there once its own is written) tells
    the server (``done``: one event, published to the server's client: it sleeps until then). The round's end
    is its end file; a lost server is pushed (``RoundEnds``), and the scheduler asked only as a fallback
    (``ended``: at most every ``ALIVE_SECONDS`` while waiting for a record), never once per wave."""
    from memtrain.cluster.nodes import every

    alive = every(ALIVE_SECONDS, ended)

    def over() -> bool:  # the round's end file, or its server's loss pushed to this worker: no message
        return files.ended() or files.ident in ENDED

    wave, merged = 0, False
    while True:
        record = files.next(wave, lambda: over() or alive())
        if record is None:
            return wave
        started = time.monotonic()
        kind, body = record
        numbers, blob, error = member_part(actor, kind, body, rank, members, over)
        files.answer(wave, rank, numbers, blob, error, time.monotonic() - started)
        complete = files.complete(wave, members)
        ours = complete and files.merge(wave, members)  # the server reads one file, whatever the members
        if error or complete:
            done(wave)
        # after the answer (the part is not slower for them): its answer to the wave before, and the one file of
        # answers to it if this member wrote it (the server read every answer to it before posting this one), and
        # its partials of the update before (nodes.node_part)
        if wave:
            discard([files.answer_path(wave - 1, rank), *([files.answers_path(wave - 1)] if merged else [])])
        merged = ours
        if kind == "nodes":
            actor.state.remove_dropped()
        wave += 1


def member_part(actor: Any, kind: str, body: Any, rank: int, members: int, ended: Callable[[], bool]
                ) -> tuple[list[float], bytes, str]:
    """Member ``rank``'s part of a wave of ``kind`` (a node record's: memtrain/cluster/nodes.py ``node_part``,
    ``ended`` its look at whether the round ended; else ``part``), or what it raised as the answer's error: every
    member answers every wave it reads. A part that raises must not end the member's loop unanswered -- with
    nothing else to end the wave (``train.backup_ratio = 0``) the server would wait for that answer until
    ``train.task_timeout`` and kill the member as silent -- so the wave ends "failed" at once, the server
    completes the update per task and its events.log quotes the error."""
    try:
        if kind == "nodes":  # a two-level round's node record
            from memtrain.cluster.nodes import node_part

            return node_part(actor, gradient_tasks(actor.state.plan, body[0]), body, rank, ended)
        if kind == "node-step":  # its step: the template and each rank's slice (``plan.node_step_deal``)
            template, deal = body
            lo, hi = deal[rank]
            return step_part(actor, template, rank, lo, hi) if hi > lo else ([], b"", "")
        return part(actor, kind, body, rank, members)
    except Exception as exc:  # noqa: BLE001 - any bug of a part: answered, never a silent end of the loop
        where = "".join(traceback.format_exception(exc, limit=-4)[1:-1]).rstrip()
        return [], b"", f"member {rank}'s part of a {kind!r} wave raised {type(exc).__name__}: {exc}\n{where}"


@dataclass(frozen=True)
class WaveFiles:
    """A round of nodes' waves as small JSON files of the exchange area (on the shared filesystem): the server
    writes each wave's record, each member its answer, the server the round's end mark. The scheduler carries
    no message per member per wave: it keeps the round's membership and liveness (``BroadcastPlugin.status``).
    JSON, never a pickle: a file is never unpickled."""

    exchange: Path
    ident: str

    def record(self, wave: int) -> Path:
        return WAVE.path(self.exchange, self.ident, wave)

    def answer_path(self, wave: int, rank: int) -> Path:
        return WAVE.path(self.exchange, self.ident, wave, rank)

    def end_path(self) -> Path:
        return WAVE.path(self.exchange, self.ident)

    def post(self, wave: int, kind: str, body: Any) -> None:
        """Publish wave ``wave``'s record; the previous wave's (every member answered it) is removed."""
        write_json(self.record(wave), encode_record(kind, body), durable=False)
        if wave:
            discard([self.record(wave - 1)])

    def next(self, wave: int, stop: Callable[[], bool]) -> tuple[str, Any] | None:
        """Wave ``wave``'s record once it is published (polled, with backoff); None once ``stop()``."""
        pause, started = FILE_POLL[0], time.monotonic()
        while True:
            found = read_wave_file(self.record(wave))
            if found is not None:
                return decode_record(found)
            if stop():
                return None
            time.sleep(pause)
            pause = look_pause(pause, started)

    def answers_path(self, wave: int) -> Path:
        """Every member's answer to wave ``wave`` in one file (``merge``)."""
        return WAVE.path(self.exchange, self.ident, wave, "all")

    def answer(self, wave: int, rank: int, numbers: list[float], blob: bytes, error: str, seconds: float) -> None:
        """A member's answer; ``seconds``: from reading the record to the answer (the straggler rule's time, as
        the server looks at the answers only when told or as a fallback)."""
        write_json(self.answer_path(wave, rank), {"numbers": numbers, "blob": blob.hex(), "error": error,
                                                  "seconds": seconds}, durable=False)

    def complete(self, wave: int, members: int) -> bool:
        """Whether every member's answer to wave ``wave`` is there: the last rank first, up to the first missing
        (the chain's nodes answer about in rank order, so a member that is not the last stops at one lookup)."""
        return all(self.answer_path(wave, rank).exists() for rank in reversed(range(members)))

    def merge(self, wave: int, members: int) -> bool:
        """Write every member's answer to wave ``wave`` into one file, so that the server reads one file per wave
        whatever the members (``collect``). Done by the member that saw the wave complete; two that both saw it
        write the same answers, and the name is never replaced (``rename_new``): the second's is dropped. Whether
        this member's was published (it then removes it, as its own answer, when it answers the next wave)."""
        answers = [read_wave_file(self.answer_path(wave, rank)) for rank in range(members)]
        if any(answer is None for answer in answers):  # not complete after all: the server reads them one by one
            return False
        text = json.dumps({"answers": answers}).encode()
        return publish_new(self.answers_path(wave), lambda handle: handle.write(text), durable=False)

    def collect(self, state: RoundState, wave: int) -> int:
        """The answers to wave ``wave`` published since the last look, into ``state``; how many. From the one file
        of every answer when a member wrote it (``merge``), else one file per member. Their files stay until the
        wave settled (``settle``): the member that completes a wave sees every answer (``complete``)."""
        current, found = state.waves[wave], 0
        missing = [rank for rank in range(len(state.members)) if rank not in current.answers]
        merged = read_wave_file(self.answers_path(wave)) if missing else None
        every = merged.get("answers") if isinstance(merged, dict) else None
        if not isinstance(every, list) or len(every) != len(state.members):
            every = None
        for rank in missing:
            answer = every[rank] if every is not None else read_wave_file(self.answer_path(wave, rank))
            if answer is None:
                continue
            seconds = answer.get("seconds")
            at = current.posted + float(seconds) if seconds is not None else time.monotonic()
            current.answers[rank] = (min(at, time.monotonic()), [float(n) for n in answer["numbers"]],
                                     bytes.fromhex(answer["blob"]), str(answer["error"]))
            found += 1
        return found

    def settle(self, wave: int, members: int) -> None:
        """Remove wave ``wave``'s answer files once it settled other than done (a late member's: the round's
        ``leftovers``). A wave every member answered is not settled here: each member removes its own answer
        when it answers the next wave (``follow_files``), so the server's work per wave does not grow with the
        members."""
        discard([self.answers_path(wave), *(self.answer_path(wave, rank) for rank in range(members))])

    def end(self) -> None:
        write_json(self.end_path(), {}, durable=False)

    def ended(self) -> bool:
        return self.end_path().exists()

    def leftovers(self, waves: int, members: int) -> list[Path]:
        """The files a round of ``waves`` waves may still hold once it ended (a late member's answer included;
        the answers to the wave before the last of the members that did not answer the last)."""
        last = [self.record(waves - 1), *(path for wave in range(max(0, waves - 2), waves)
                                          for path in (self.answers_path(wave),
                                                       *(self.answer_path(wave, r) for r in range(members))))
                ] if waves else []
        return [*last, self.end_path()]


def look_pause(pause: float, started: float) -> float:
    """The next sleep between polls for a wave file: doubling from ``FILE_POLL[0]`` up to ``FILE_POLL[1]``, or up
    to ``POLL_SHARE`` of the time waited since ``started`` when that is longer: a long wait (a wave of seconds
    at 1e7 parameters) costs tens of polls per second, not hundreds, and at most 2% more time."""
    return min(pause * 2, max(FILE_POLL[1], POLL_SHARE * (time.monotonic() - started)))


def read_wave_file(path: Path) -> Any:
    """A wave file's JSON, or None while it is not published (it appears whole: written, then renamed)."""
    try:
        with open_regular(path, what="a round's wave file") as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return None


def encode_record(kind: str, body: Any) -> dict[str, Any]:
    """A wave's (kind, body) as JSON: a step's template as its fields, a gradient or node record as it is."""
    if kind == "node-step":
        template, deal = body
        return {"kind": kind, "body": {"step": asdict(template), "deal": [list(pair) for pair in deal]}}
    return {"kind": kind, "body": asdict(body) if kind == "step" else body}


def decode_record(found: dict[str, Any]) -> tuple[str, Any]:
    kind, body = found["kind"], found["body"]
    if kind == "step":
        return kind, step_task(body)
    if kind == "node-step":
        return kind, (step_task(body["step"]), tuple(tuple(pair) for pair in body["deal"]))
    if kind == "nodes":
        record, counts, seconds, attempts = body
        return kind, (gradient_fields(record), tuple(counts), seconds, attempts)
    return kind, gradient_fields(body)


def step_task(fields: dict[str, Any]) -> StepTask:
    return StepTask(**{**fields, "retried": tuple(tuple(pair) for pair in fields["retried"])})


def gradient_fields(record: list[Any]) -> tuple[Any, ...]:
    """A ``gradient_record`` read from JSON: its spares' names a tuple again."""
    return tuple(tuple(item) if isinstance(item, list) else item for item in record)


def part(actor: Any, kind: str, body: Any, rank: int, members: int) -> tuple[list[float], bytes, str]:
    """This worker's part of a wave: (numbers, blob, error). Gradients: task, loss, seconds for each task of
    ``tasks[rank::members]``; the step: the digests of slice ``rank`` (b"" for none), numbers [1] if it came
    out non-finite."""
    if kind == "grads":
        tasks = gradient_tasks(actor.state.plan, body)
        if isinstance(tasks, str):
            return [], b"", tasks
        numbers: list[float] = []
        for task in tasks[rank::members]:
            result = actor.run(task)
            if result.outcome != Outcome.DONE:
                return numbers, b"", result.error or f"task {task.task}: {result.outcome.name}"
            numbers += [task.task, result.loss, result.seconds]
        return numbers, b"", ""
    own = member_slice(actor.state.context.layout.size, members, rank, BLOCK)
    if own is None:
        return [], b"", ""
    return step_part(actor, body, rank, *own)


def step_part(actor: Any, template: StepTask, rank: int, lo: int, hi: int) -> tuple[list[float], bytes, str]:
    """Slice [lo, hi) of a step wave's ``template``, as member ``rank``'s part: (numbers, blob, error)."""
    result = actor.run(replace(template, task=rank, lo=lo, hi=hi))
    if result.outcome == Outcome.NONFINITE:
        return [1.0], b"", ""
    if result.outcome != Outcome.DONE:
        return [], b"", result.error or f"step slice {rank}: {result.outcome.name}"
    return [], result.digests, ""


def gradient_record(tasks: list[GradTask]) -> tuple[Any, ...]:
    """An update's gradient tasks as the record the server posts: the update's number, version, epoch, task
    count and rows (the workers derive the tasks from the plan, and check it agrees), and the spares' names
    (none when no task has one)."""
    first = tasks[0]
    spares = tuple(task.spare for task in tasks) if any(task.spare for task in tasks) else ()
    return first.ticket, first.version, first.epoch, len(tasks), sum(t.hi - t.lo for t in tasks), spares


def gradient_tasks(plan: Any, record: tuple[Any, ...]) -> list[GradTask] | str:
    """The gradient tasks of a ``gradient_record``, from the worker's plan (``train/plan.Plan``); a text saying
    how they disagree if the plan's update is not the record's."""
    number, version, epoch, count, rows, spares = record
    update = plan.update(number)
    if (update.epoch, len(update.tasks), update.rows) != (epoch, count, rows):
        return (f"update {number}: the worker's plan has epoch {update.epoch}, {len(update.tasks)} tasks, "
                f"{update.rows} rows; the server's has epoch {epoch}, {count} tasks, {rows} rows")
    return [GradTask(task=r.task, attempt=0, ticket=number, version=version, epoch=epoch, lo=r.lo, hi=r.hi,
                     spare=spares[r.task] if spares else "") for r in update.tasks]


# --- the server's side ---


@dataclass
class Answer:
    """How a wave ended: ``done`` (every member answered), else the round is over; ``numbers`` and ``blob`` of
    the answers in, ``ranks`` that answered (when not done), ``waited`` seconds since the post."""

    status: str
    numbers: list[float]
    blob: bytes
    ranks: list[int]
    error: str
    joined: bool
    waited: float
    laggards: list[tuple[int, float, float]] = field(default_factory=list)  # (rank, seconds, the others' median)


@dataclass
class Broadcast:
    """The server's side of the rounds on ``pool``'s workers. ``open`` a round (its members: the slots whose
    last round's loop returned), ``ask`` a record of it, ``close`` it; ``rule``: the straggler rule (None: a
    late answer is awaited until ``timeout``)."""

    pool: ClusterPool
    rule: BackupRule | None
    timeout: float
    log: Callable[[str], None]
    aside: SetAside  # stragglers left out of the next rounds for a while: the pool's, shared with its per-task path
    attempts: int = 3  # train.max_attempts: a node's tries of a task whose process dies or hangs (nodes.TaskLimit)
    ident: str = ""  # the open round's; "": none open
    members: list[ClusterSlot] = field(default_factory=list)
    wave: int = 0
    loops: dict[str, Any] = field(default_factory=dict)  # slot token -> the actor call of its last loop
    leftovers: list[Path] = field(default_factory=list)  # files a late loop may still write: deleted once ended
    # files the members remove themselves while the round is on (a round of nodes: the partials of the update
    # stepped last, each removed by the node that published it when its next part starts): deleted once ended.
    # Named only then: their names grow with the nodes and segments (0.8 ms per update at 8 nodes of 1e7)
    kept: Callable[[], list[Path]] = list
    exchange: Path | None = None  # where a round of nodes' wave files go (set by a NodeParticipant); None: none
    processes: list[int] = field(default_factory=list)  # the open round's members' process counts, all nodes
    files: WaveFiles | None = None  # the open round's wave files when every member is a node
    state: RoundState | None = None  # and how its waves stand (the server's copy: no scheduler keeps them)
    checked: float = 0.0  # when the scheduler was last asked how the round of nodes stands
    looked: float = 0.0  # when the answer files were last looked at without being told
    news: deque[dict[str, Any]] = field(default_factory=deque)  # the events told (``TOPIC``), not yet taken
    bell: threading.Event = field(default_factory=threading.Event)  # set when told: the server's wait ends
    quiet: dict[str, float] = field(default_factory=dict)  # slot token -> when its loop was first seen ended

    def __post_init__(self) -> None:
        self.call = timed(self.pool.timer, "broadcast call", self.call)  # type: ignore[method-assign]

    @property
    def active(self) -> bool:
        return bool(self.ident)

    @property
    def size(self) -> int:
        return len(self.members)

    def open(self) -> bool:
        """A new round with the workers whose last loop returned; False (no round) if there are none."""
        self.refresh()
        self.sweep()
        members = [slot for slot in self.pool.slots if slot.token not in self.loops]
        if not members:
            return False
        members = self.aside.usable(members)  # a straggler set aside sits the round out (unless all are)
        self.ident, self.members, self.wave = uuid.uuid4().hex[:12], members, 0
        addresses = [slot.process.address for slot in members]
        self.processes = self.node_counts(addresses)
        self.files = WaveFiles(self.exchange, self.ident) if self.processes and self.exchange else None
        self.state = RoundState(members=addresses, client="") if self.files else None
        self.news.clear()
        self.quiet.clear()
        self.call("memtrain_begin", members=addresses, client=self.pool.client.id)
        self.checked = self.looked = time.monotonic()
        for rank, slot in enumerate(members):
            try:
                self.loops[slot.token] = slot.actor.follow(self.ident, rank, len(members), self.files is not None)
            except Exception:  # noqa: BLE001 - its worker is gone: the round's first wave sees it left
                continue
        return True

    def node_counts(self, addresses: list[str]) -> list[int]:
        """The members' process counts as nodes (``MEMTRAIN_NODE_PROCESSES``, asked once per round through the
        workers' event loops); [] unless every member is a node (or no ``exchange`` for their wave files)."""
        if self.exchange is None:
            return []
        from memtrain.cluster.nodes import reported_processes

        try:
            found = self.pool.client.run(reported_processes, workers=addresses, on_error="return")
        except Exception:  # noqa: BLE001 - a member gone meanwhile: not a node round (its first wave ends it)
            return []
        counts = [found.get(address) for address in addresses]
        bad = [(address, c) for address, c in zip(addresses, counts, strict=True) if isinstance(c, str)]
        if bad:
            raise InputError(f"Dask worker {bad[0][0]}: {bad[0][1]}")
        return counts if all(isinstance(c, int) and c > 0 for c in counts) else []

    def ask(self, kind: str, body: Any, parts: int | list[int], chores: Callable[[], None]) -> Answer:
        """Post wave ``kind`` (its ``body``, dealing ``parts`` pieces of work round-robin, or each rank its
        share when ``parts`` is a list), do the server's ``chores``, await its count."""
        wave = self.wave
        self.wave += 1
        shares = None if isinstance(parts, int) else list(parts)
        count = len(shares) if shares is not None else int(parts)
        if self.files is not None:
            return self.ask_files(wave, kind, body, count, shares, chores)
        self.call("memtrain_post", wave=wave, record=pickle.dumps((kind, body), protocol=5), parts=count,
                  shares=shares)
        chores()
        rule = self.rule
        while True:
            found = self.call("memtrain_await", wave=wave, seconds=AWAIT_SECONDS, timeout=self.timeout,
                              ratio=rule.ratio if rule else 0.0, backup_seconds=rule.seconds if rule else 0.0,
                              bound=AWAIT_SECONDS + CALL_SECONDS)
            if found["status"] != "waiting":
                answer = Answer(status=found["status"], numbers=list(found["numbers"]), blob=found["blob"],
                                ranks=list(found["ranks"]), error=found["error"], joined=found["joined"],
                                waited=found["waited"], laggards=[tuple(row) for row in found["laggards"]])
                if answer.status == "done":
                    self.judge(answer, step=kind == "step")
                return answer

    def judge(self, answer: Answer, *, step: bool) -> None:
        """After a wave every member answered: a member that ran over the straggler rule's ratio times the
        median of the others (per piece) is set aside (``SetAside``) and the round closed, so that the next
        update's round goes on without it; after an update's step, a round that leaves out a worker whose
        time aside is over is closed, so that the next one takes it back (a probe: if it still lags, it is
        set aside again). The rounds' and the per-task path's answers give the same bits whoever computes
        them; ``train.backup_ratio = 0`` (no rule) sets no one aside."""
        rule = self.rule
        if rule is None or not rule.ratio:
            return
        late = {rank: (seconds, median) for rank, seconds, median in answer.laggards}
        newly = self.aside.judge_round(self.members, late, rule, self.log)
        members = {slot.token for slot in self.members}
        back = step and any(slot.token not in members and slot.token not in self.loops and self.aside.usable_now(slot)
                            for slot in self.pool.slots)
        if (newly and len(newly) < len(self.members)) or back:
            self.close()

    def ask_files(self, wave: int, kind: str, body: Any, parts: int, shares: list[int] | None,
                  chores: Callable[[], None]) -> Answer:
        """``ask`` for a round of nodes: the record written as a file; then the server sleeps until told (``told``:
        the member that completed the wave, a member that left, a worker that joined), with bounded fallbacks: it
        looks at the answer files every ``LOOK_SECONDS`` (or ``LOOK_SHARE`` of the wave's time, when longer) and
        asks the scheduler how the round stands every ``STATUS_SECONDS`` (a lost event cannot hang the round; a
        lost scheduler is seen). Messages per wave that grow neither with the members nor with the wave's time.
        The wave settles by the plugin's rules (``settled``, ``due_at``), on the server."""
        files, state = self.files, self.state
        assert files is not None and state is not None
        files.post(wave, kind, body)
        state.waves = {w: v for w, v in state.waves.items() if w >= wave - 1}
        state.waves[wave] = Wave(record=b"", posted=time.monotonic(), parts=parts, shares=shares)
        chores()
        ratio, backup = (self.rule.ratio, self.rule.seconds) if self.rule else (0.0, 0.0)
        while True:
            if self.pool.client.status != "running":
                raise self.pool._lost(f"client {self.pool.client.status}")
            now = time.monotonic()
            if self.take_news(state, wave) or now >= self.due(self.looked, LOOK_SECONDS, state, wave):
                files.collect(state, wave)
                self.loops_ended(state, wave)
                self.looked = now
            if now >= self.due(self.checked, STATUS_SECONDS, state, wave):
                self.round_status(state)
            status = "ended" if state.ended else settled(state, wave, self.timeout, ratio, backup)
            if status:
                if status != "done":  # a wave every member answered: each removes its own answer with its next
                    files.settle(wave, len(state.members))
                found = summary(state, wave, status)
                return Answer(status=status, numbers=found["numbers"], blob=found["blob"],
                              ranks=found["ranks"], error=found["error"], joined=found["joined"],
                              waited=found["waited"])
            due = min(self.due(self.looked, LOOK_SECONDS, state, wave),
                      self.due(self.checked, STATUS_SECONDS, state, wave),
                      due_at(state, wave, ratio, backup, self.timeout))
            self.bell.wait(max(0.0, due - time.monotonic()))
            self.bell.clear()

    def loops_ended(self, state: RoundState, wave: int) -> None:
        """A member whose loop of the round ended (returned, or raised) without answering wave ``wave``, and still
        had not one look later, answers it with that error: the wave fails then rather than waiting for an answer
        that cannot come (its worker lives on, so no member left the scheduler), and its tasks run per task. The
        look's grace leaves a member that died to the scheduler's word (a member left: the round's fault path)."""
        current, now = state.waves[wave], time.monotonic()
        for rank, slot in enumerate(self.members):
            call = self.loops.get(slot.token)
            if rank in current.answers or call is None or not call.done():
                continue
            if now - self.quiet.setdefault(slot.token, now) < LOOK_SECONDS:
                continue
            try:
                why = f"returned after {call.result(timeout=CALL_SECONDS)} wave(s)"
            except Exception as exc:  # noqa: BLE001 - whatever ended the member's loop, it is the wave's error
                why = f"{type(exc).__name__}: {exc}"
            current.answers[rank] = (time.monotonic(), [], b"", f"worker {slot.index} (Dask worker "
                                     f"{slot.process.address}): its loop of the round ended ({why})")

    def due(self, last: float, seconds: float, state: RoundState, wave: int) -> float:
        """When a fallback falls due: ``seconds`` after ``last``, or ``LOOK_SHARE`` of the wave's time so far when
        longer (a long wave: a few looks, not one per ``seconds``)."""
        return last + max(seconds, LOOK_SHARE * (time.monotonic() - state.waves[wave].posted))

    def told(self, event: tuple[float, Any]) -> None:
        """The handler of ``TOPIC``'s events (on the client's event loop): kept for the server's thread, woken."""
        message = event[1]
        if isinstance(message, dict) and message.get("ident") == self.ident:
            self.news.append(message)
            self.bell.set()

    def take_news(self, state: RoundState, wave: int) -> bool:
        """Apply the events told since the last look to ``state``; whether one concerns wave ``wave`` (it was
        said done, or a member left or a worker joined: the answers in are looked at before it settles, as the
        fallback path through a member's loss keeps the furthest partial of a node that answered)."""
        told = False
        while self.news:
            message = self.news.popleft()
            kind = message.get("kind")
            if kind == "left":
                state.left = state.left or str(message.get("worker", ""))
            elif kind == "joined":
                state.joined = True
            told = told or kind != "done" or message.get("wave") == wave
        return told

    def round_status(self, state: RoundState) -> None:
        """Ask the scheduler how the open round of nodes stands: a member left, a worker joined, it ended."""
        found = self.call("memtrain_status")
        self.checked = time.monotonic()
        state.ended = state.ended or bool(found["ended"])
        state.left = state.left or str(found["left"])
        state.joined = state.joined or bool(found["joined"])

    def kill_silent(self, answered: list[int]) -> None:
        """The members that did not answer within ``timeout``: killed as hung, as the per-task path kills a
        worker silent on a task (``ClusterPool.kill``: left out of the run, its death reported)."""
        for rank, slot in enumerate(self.members):
            if rank not in answered:
                self.log(f"worker {slot.index} (pid {slot.pid}) silent for {self.timeout:g} s in the "
                         "broadcast round; killing it")
                self.pool.kill(slot)

    def close(self, leftovers: tuple[Path, ...] | list[Path] = ()) -> None:
        """End the round: its loops return once their current part is done. ``leftovers``: files they may
        still write, deleted once they did."""
        self.leftovers += [*leftovers, *self.kept()]
        self.kept = list
        if self.files is not None:  # a round of nodes: its members see the end mark
            self.files.end()
            self.leftovers += self.files.leftovers(self.wave, len(self.members))
            self.files, self.state, self.processes = None, None, []
        if self.ident:
            ident, self.ident, self.members = self.ident, "", []
            self.call("memtrain_end", ident=ident)
        self.sweep()
        # the per-task path sends to the first idle slots: those whose loop still runs (a straggler's: a call
        # to it would wait behind the loop) last
        self.pool.slots.sort(key=lambda slot: slot.token in self.loops)

    def finish(self, seconds: float) -> None:
        """End the last round and wait (at most ``seconds``) for its loops, so that the actors take other calls."""
        self.close()
        deadline = time.monotonic() + seconds
        for call in list(self.loops.values()):
            with contextlib.suppress(Exception):
                call.result(timeout=max(0.1, deadline - time.monotonic()))
        self.sweep()

    def sweep(self) -> None:
        """Forget the loops that returned (or whose worker is gone); once none is left, delete the leftovers."""
        present = {slot.token for slot in self.pool.slots}
        self.loops = {token: call for token, call in self.loops.items() if token in present and not call.done()}
        if not self.loops:
            discard(self.leftovers)
            self.leftovers = []

    def call(self, handler: str, bound: float = CALL_SECONDS, ident: str = "", **arguments: Any) -> Any:
        client = self.pool.client
        if client.status != "running":
            raise self.pool._lost(f"client {client.status}")
        try:
            return client.sync(getattr(client.scheduler, handler), ident=ident or self.ident, **arguments,
                               callback_timeout=bound)
        except Exception as exc:  # noqa: BLE001 - whatever the comm raised, the scheduler did not answer
            raise self.pool._lost(f"{type(exc).__name__}: {exc}") from None

    def refresh(self) -> None:
        """Workers that joined get slots (and those that left lose theirs) before the next round."""
        self.pool._watched = 0.0
        self.pool._watch()


_REGISTERED: set[str] = set()  # Dask clients whose scheduler has the BroadcastPlugin
_REFUSED: set[str] = set()  # and those whose scheduler could not load it (said once)


def open_broadcast(pool: Any, *, rule: BackupRule | None, timeout: float, log: Callable[[str], None],
                   attempts: int = 3) -> Broadcast | None:
    """The broadcast rounds on ``pool`` (a ClusterPool), the BroadcastPlugin registered on its scheduler once per
    client; None (the per-task path throughout) for another transport or a scheduler that cannot load it."""
    client = getattr(pool, "client", None)  # a ClusterPool's Dask client; another transport has none
    if client is None:
        return None
    if client.id in _REFUSED:
        return None
    if client.id not in _REGISTERED:
        try:
            client.register_plugin(BroadcastPlugin(), name=BroadcastPlugin.name)
        except Exception as exc:  # noqa: BLE001 - e.g. memtrain not importable on the scheduler
            log(f"the Dask scheduler did not take memtrain's broadcast plugin ({type(exc).__name__}: {exc}): "
                "each task and each step slice of every update is sent to a worker in a call of its own instead "
                "(docs/cluster.md, \"The broadcast round\")")
            _REFUSED.add(client.id)
            return None
        _REGISTERED.add(client.id)
        with contextlib.suppress(Exception):  # without it, a member notices a lost server by its fallback ask
            client.register_plugin(RoundEnds(), name=RoundEnds.name)
    broadcast = Broadcast(pool=pool, rule=rule, timeout=timeout, log=log, attempts=attempts, aside=pool.aside)
    client.subscribe_topic(TOPIC, broadcast.told)  # this run's rounds are told here (one subscription per client)
    return broadcast


def gradient_results(tasks: list[GradTask], numbers: list[float]) -> dict[int, Result]:
    """The results the answers' numbers (task, loss, seconds per task) carry, by task."""
    rows = {task.task: task.hi - task.lo for task in tasks}
    found = {}
    for i in range(0, len(numbers) - 2, 3):
        task = int(numbers[i])
        found[task] = Result(task=task, attempt=0, outcome=Outcome.DONE, loss=numbers[i + 1], rows=rows[task],
                             seconds=numbers[i + 2])
    return found


def step_results(ranges: list[tuple[int, int]], answer: Answer) -> list[Result]:
    """The step's results, one per slice, from a wave every member answered (digests joined in rank order)."""
    if answer.numbers:  # a slice came out non-finite
        return [Result(task=0, attempt=0, outcome=Outcome.NONFINITE)]
    results, at = [], 0
    for j, (lo, hi) in enumerate(ranges):
        length = -(-(hi - lo) // BLOCK) * 16
        results.append(Result(task=j, attempt=0, outcome=Outcome.DONE, rows=hi - lo,
                              digests=answer.blob[at:at + length]))
        at += length
    return results

