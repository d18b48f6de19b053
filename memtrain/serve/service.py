"""A jobs folder + Settings -> the service: complete job files in, ``memtrain train`` children, records out.

The loop fits on one screen: take events, rescan when due, settle arrivals (bad files to failed/),
reap finished children, launch while slots are free (jobs left in running/ first, then queued ones in
order of arrival), write status.json. SIGTERM/SIGINT stop it: each child gets one SIGTERM (it
checkpoints and exits 143), its job file stays in running/, and the next start resumes it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchdog.observers.api import BaseObserver

from memtrain.errors import InputError, MemtrainError
from memtrain.faults import fault_point
from memtrain.files import write_json
from memtrain.layout import spool_job_file, spool_job_name
from memtrain.serve import runner
from memtrain.serve.admit import Admission, admit, read_job_file
from memtrain.serve.arrivals import Arrivals, Rejected, start_observer
from memtrain.serve.spool import (
    Spool,
    archive,
    claim,
    lock_spool,
    open_spool,
    read_state,
    sweep_claim_records,
    write_state,
)
from memtrain.serve.status import offline_snapshot, snapshot
from memtrain.stopping import on_stop_signals

TICK = 0.1  # seconds per loop turn: the latency a job waits at most; an idle turn costs a few syscalls
STATUS_EVERY = 1.0  # seconds between status.json rewrites while nothing changes (progress still moves)
STOP_TIMEOUT = 60.0  # seconds a child gets to checkpoint after SIGTERM before it is SIGKILLed
# A job whose service died this many times while it ran (not clean stops: those are counted apart)
# is failed rather than started again: it may be what kills the machine.
MAX_CRASHES = 3


@dataclass(frozen=True)
class Settings:
    folder: Path
    max_concurrent: int = 1
    polling: bool = False
    root: Path | None = None
    settle: float = 1.0  # seconds a file found without events must stay unchanged
    grace: float = 30.0  # seconds an unparseable or unclosed file may stay before it is failed
    rescan: float = 10.0  # seconds between full scans (events can be lost: inotify overflow, NFS)
    once: bool = False  # exit when nothing is queued, waiting or running


@dataclass
class Waiting:
    """A job in running/ that is not running: left by a stopped service, or its run dir is locked."""

    name: str
    claimed: Path
    admission: Admission
    state: dict[str, Any]
    reason: str = "resuming"


class Service:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.spool: Spool = open_spool(settings.folder)
        self.inbox: queue.SimpleQueue[tuple[str, Path]] = queue.SimpleQueue()
        self.arrivals = Arrivals(self.spool.folder, settle=settings.settle, grace=settings.grace)
        self.valid: dict[Path, Admission] = {}
        self.waiting: dict[str, Waiting] = {}
        self.children: dict[str, runner.Child] = {}
        self.signal: int | None = None
        self.stopping = False
        self.observer_kind = "polling" if settings.polling else "inotify"
        self.status_written = 0.0

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit 143/130) or, with ``once``, until idle (exit 0)."""
        lock = lock_spool(self.spool)
        try:
            with self._signals():
                self.recover()
                self.arrivals.scan()  # files already there arrive first, oldest first
                observer = self.watch()
                self.arrivals.scan()  # ... and so do files that came while the observer started
                try:
                    self.loop()
                finally:
                    observer.stop()
                    self.stop_children()
                    observer.join(timeout=5.0)
                    write_json(self.spool.status_file, offline_snapshot(self.spool), durable=False)
        finally:
            lock.close()
        return 0 if self.signal is None else 128 + self.signal

    def watch(self) -> BaseObserver:
        observer, self.arrivals.sees_closes = start_observer(
            self.spool.folder, self.inbox, polling=self.settings.polling,
            interval=min(1.0, self.settings.rescan), warn=say)
        self.observer_kind = "inotify" if self.arrivals.sees_closes else "polling"
        say(f"watching {self.spool.folder} ({self.observer_kind}), at most {self.settings.max_concurrent} "
            "job(s) at once")
        return observer

    def loop(self) -> None:
        next_scan = time.monotonic() + self.settings.rescan
        while self.signal is None:
            now = time.monotonic()
            self.take_events()
            if now >= next_scan:
                self.arrivals.scan()
                next_scan = now + self.settings.rescan
            self.settle(now)
            self.reap()
            self.launch()
            self.write_status()
            if self.settings.once and self.idle():
                return
            time.sleep(TICK)

    def take_events(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                kind, path = self.inbox.get_nowait()
                self.arrivals.note(path, kind)

    def settle(self, now: float) -> None:
        """Complete files are validated now (bad ones fail at once, even while every slot is busy)."""
        for item in self.arrivals.poll(now):
            if isinstance(item, Rejected):
                self.fail_unclaimed(item.path, str(item.error))
                continue
            try:
                self.valid[item.path] = admit(item.content, item.path, base=self.spool.folder,
                                              root=self.settings.root, spool=self.spool.folder)
            except InputError as exc:
                self.fail_unclaimed(item.path, str(exc))

    def launch(self) -> None:
        for waiting in list(self.waiting.values()):
            if len(self.children) >= self.settings.max_concurrent:
                return
            self.start(waiting.name, waiting.claimed, waiting.admission, waiting.state)
        for path in self.arrivals.settled():
            if len(self.children) >= self.settings.max_concurrent:
                return
            if path in self.valid:
                self.claim_and_start(path, self.valid[path])

    def claim_and_start(self, path: Path, admission: Admission) -> None:
        claimed = claim(self.spool, path)
        if claimed is None:
            if not path.exists():
                self.forget(path)
            return  # else a job of the same name is in running/: this one waits its turn
        self.forget(path)
        fault_point("serve_after_claim")
        try:
            content = read_job_file(claimed)
            if content != admission.content:  # rewritten between validation and claim: validate again
                admission = admit(content, path, base=self.spool.folder, root=self.settings.root,
                                  spool=self.spool.folder)
        except (InputError, FileNotFoundError) as exc:
            self.fail(admission.name, claimed, str(exc), {"submitted": str(path)})
            return
        state = {"name": admission.name, "submitted": str(path), "claimed_at": time.time(), "starts": 0,
                 "crashes": 0, "run_dir": str(admission.job.run.dir), "log": str(self.spool.log(admission.name)),
                 "epochs": admission.job.train.epochs, "run_dir_was_free": _free(admission.job.run.dir)}
        write_state(self.spool, admission.name, state)
        say(f"claimed {path.name} -> {claimed.parent.name}/ (run dir {admission.job.run.dir})")
        self.start(admission.name, claimed, admission, state)

    def start(self, name: str, claimed: Path, admission: Admission, state: dict[str, Any]) -> None:
        owner = runner.run_lock_owner(admission.job.run.dir)
        if owner is not None:
            reason = f"waiting: its run directory is locked by pid {owner} (an earlier train still running)"
            self.waiting[name] = Waiting(name, claimed, admission, state, reason)
            return
        # Ours to resume: a run this job created (its job.json says so), or a run directory that was free
        # when the job was claimed and that an earlier start of it may have begun (before job.json).
        resume = runner.wants_resume(admission) or bool(state.get("starts") and state.get("run_dir_was_free"))
        # Counted before the launch: a service that dies right after it then resumes this run on restart.
        state.update(starts=state.get("starts", 0) + 1, clean_stop=False, started_at=state.get("started_at")
                     or time.time())
        write_state(self.spool, name, state)
        try:
            child = runner.launch(admission, claimed, folder=self.spool.folder, log=self.spool.log(name),
                                  resume=resume)
        except MemtrainError as exc:  # e.g. its log is a symbolic link, which memtrain never writes through
            self.fail(name, claimed, str(exc), state)
            return
        state["pid"] = child.proc.pid
        write_state(self.spool, name, state)
        fault_point("serve_after_launch")
        child.state = state
        self.children[name] = child
        self.waiting.pop(name, None)
        self.status_written = 0.0  # rewrite status.json on this turn
        say(f"{'resumed' if resume else 'started'} {name} (pid {child.proc.pid}, log {child.log})")

    def reap(self) -> None:
        for name, child in list(self.children.items()):
            code = child.proc.poll()
            if code is not None:
                del self.children[name]
                self.finished(child, code)

    def finished(self, child: runner.Child, code: int) -> None:
        self.status_written = 0.0
        run_dir = child.admission.job.run.dir
        record = {**_times(child.state), "submitted": child.state.get("submitted"), "run_dir": str(run_dir),
                  "log": str(child.log), "starts": child.state.get("starts"), "exit_code": code}
        if code == 0:
            record["final"] = runner.final_record(run_dir)
            archive(self.spool, child.claimed, "done", record)
            say(f"done {child.name} in {record['seconds']:.1f} s")
        elif self.stopping and code in runner.STOPPED_CODES:
            child.state["clean_stop"] = True
            write_state(self.spool, child.name, child.state)
            say(f"stopped {child.name}: it stays in running/ and resumes on the next start")
        else:
            message = runner.failure_message(child, code)
            if code in runner.STOPPED_CODES:
                message += (". It was stopped by a signal that did not come from the service; to run it on from"
                            " its last checkpoint, move its job file back into the folder")
            self.fail(child.name, child.claimed, message, record)

    def recover(self) -> None:
        """Jobs left in running/ by an earlier service: resume them, or fail them with the reason."""
        sweep_claim_records(self.spool)
        for claimed in self.spool.claimed():
            name = spool_job_name(claimed.name) or claimed.name
            state = read_state(self.spool, name)
            if state.get("starts", 0) and not state.get("clean_stop"):
                state["crashes"] = state.get("crashes", 0) + 1
            state["clean_stop"] = False
            original = Path(state.get("submitted") or self.spool.folder / spool_job_file(name))
            try:
                if state.get("crashes", 0) >= MAX_CRASHES:
                    raise InputError(f"the service died {state['crashes']} times while this job ran; not starting "
                                     "it again", hint="move its job file back into the folder to resume it")
                admission = admit(read_job_file(claimed), original, base=self.spool.folder,
                                  root=self.settings.root, spool=self.spool.folder)
            except (InputError, FileNotFoundError) as exc:
                self.fail(name, claimed, str(exc), {**_times(state), "submitted": str(original)})
                continue
            state.setdefault("claimed_at", claimed.stat().st_mtime)
            state.update(run_dir=str(admission.job.run.dir), epochs=admission.job.train.epochs)
            self.waiting[name] = Waiting(name, claimed, admission, state)
            say(f"found {name} in running/ (left by an earlier service): it will resume")

    def fail_unclaimed(self, path: Path, message: str) -> None:
        self.forget(path)
        if path.exists() or path.is_symlink():
            self.fail(spool_job_name(path.name) or path.name, path, message, {"submitted": str(path)})

    def fail(self, name: str, path: Path, message: str, record: dict[str, Any]) -> None:
        target = archive(self.spool, path, "failed", {**record, "finished_at": time.time(), "error": message})
        self.waiting.pop(name, None)
        self.status_written = 0.0
        say(f"failed {name}: {message} (-> {target.parent.name}/)")

    def forget(self, path: Path) -> None:
        self.arrivals.forget(path)
        self.valid.pop(path, None)

    def idle(self) -> bool:
        return not (self.children or self.waiting or self.arrivals.candidates)

    def stop_children(self) -> None:
        """One SIGTERM each (train checkpoints and exits 143), a bounded wait, then SIGKILL."""
        self.stopping = True
        for child in self.children.values():
            runner.stop(child)
        deadline = time.monotonic() + STOP_TIMEOUT
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(TICK)
        for child in self.children.values():
            say(f"{child.name} did not stop within {STOP_TIMEOUT:g} s; killing it (it resumes from its last "
                "checkpoint)")
            child.proc.kill()
            child.proc.wait()
        self.children.clear()

    def write_status(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self.status_written < STATUS_EVERY:
            return
        service = {"pid": os.getpid(), "observer": self.observer_kind,
                   "max_concurrent": self.settings.max_concurrent, "root": _text(self.settings.root)}
        write_json(self.spool.status_file, snapshot(self.spool, service=service, queued=self._queued(),
                                                    running=self._running()), durable=False)
        self.status_written = time.monotonic()

    def _queued(self) -> list[dict[str, Any]]:
        items = sorted(self.arrivals.candidates.values(), key=lambda c: c.seq)
        return [{"name": spool_job_name(c.path.name), "file": str(c.path),
                 "state": "queued" if c.path in self.valid else "arriving"} for c in items]

    def _running(self) -> list[dict[str, Any]]:
        items = [{"name": c.name, "state": "running", "pid": c.proc.pid, "run_dir": str(c.admission.job.run.dir),
                  "log": str(c.log), "started_at": c.state.get("started_at"), "epochs": c.admission.job.train.epochs,
                  "progress": runner.progress(c.admission.job.run.dir)} for c in self.children.values()]
        items += [{"name": w.name, "state": "waiting", "reason": w.reason, "run_dir": str(w.admission.job.run.dir),
                   "epochs": w.admission.job.train.epochs, "progress": runner.progress(w.admission.job.run.dir)}
                  for w in self.waiting.values()]
        return items

    def _signals(self) -> contextlib.AbstractContextManager[None]:
        """SIGTERM/SIGINT only set a flag: the loop stops at its next turn and stops the children."""
        return on_stop_signals(lambda signum: setattr(self, "signal", self.signal or signum))


def _times(state: dict[str, Any]) -> dict[str, Any]:
    claimed, now = state.get("claimed_at"), time.time()
    return {"claimed_at": claimed, "started_at": state.get("started_at"), "finished_at": now,
            "seconds": now - claimed if claimed else None}


def _free(run_dir: Path) -> bool:
    return not run_dir.exists() or (run_dir.is_dir() and not any(run_dir.iterdir()))


def _text(value: Path | None) -> str | None:
    return None if value is None else str(value)


def say(text: str) -> None:
    """One timestamped line on stderr: the service's own log."""
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} memtrain serve: {text}", file=sys.stderr, flush=True)
