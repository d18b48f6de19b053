"""Weights + optimizer state + metadata -> ``checkpoints/cNNNNNNNN/``, committed by renaming a finished dir.

A checkpoint directory whose name matches ``cNNNNNNNN`` is complete: its files are fsynced, ``meta.json``
(with every file's checksum, and sealed with the checksum of its own content) is written last, and only
then is the temporary directory renamed into place. ``newest_checkpoint`` re-hashes what it returns and
falls back to an older checkpoint if a file or the metadata itself is bad.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import CorruptFileError, InputError, MemtrainError
from memtrain.faults import fault_point
from memtrain.files import (
    checksum_file,
    fsync_dir,
    is_no_space,
    no_space_error,
    open_new,
    open_npy,
    open_own,
    open_regular,
    read_json,
    unseal,
    verify_checksum,
    write_sealed_json,
)
from memtrain.layout import (
    CHECKPOINT_META,
    CHECKPOINT_WEIGHTS,
    CHECKPOINTS_DIR,
    RUN_PARAMS,
    checkpoint_path,
    checkpoint_updates,
    existing_hint,
    is_checkpoint_name,
    optimizer_state_name,
    tmp_sibling,
    tmp_target,
)
from memtrain.models.params import ParamLayout

FORMAT = "memtrain.checkpoint"
FORMAT_VERSION = 2  # 2: meta.json is sealed (its own checksum); 1 had none and is not read
POSITION_KEYS = ("epoch", "batch", "version", "epoch_loss", "epoch_rows", "skipped", "best")


def write_checkpoint(run_dir: Path, update: int, meta: dict[str, Any], weights: Path,
                     state: dict[str, Path], keep: int, protect: int | None = None,
                     older: dict[str, Path] | None = None) -> Path:
    """Copy weights and optimizer state into a new checkpoint and commit it; prune to the newest ``keep``
    (never the checkpoint of update ``protect``: the best epoch's, with ``run.keep_best``). ``older``: more
    weight versions by their checkpoint names (a fixed-staleness run stopped mid-epoch)."""
    final = checkpoint_path(run_dir, update)
    final.parent.mkdir(exist_ok=True)
    tmp = tmp_sibling(final)
    tmp.mkdir()
    try:
        sources = checkpoint_sources(weights, state, older)
        files = {name: _copy_durable(src, tmp / name) for name, src in sources.items()}
        _commit(tmp, final, meta, files)
    except BaseException as exc:
        _abandon(tmp, final, exc)
        raise
    prune_checkpoints(run_dir, keep, protect)
    return final


def checkpoint_sources(weights: Path, state: dict[str, Path], older: dict[str, Path] | None = None) -> dict[str, Path]:
    """A checkpoint's files by their names in it, each with the file it is a copy of."""
    return {CHECKPOINT_WEIGHTS: weights} | {optimizer_state_name(k): v for k, v in state.items()} | (older or {})


def _commit(tmp: Path, final: Path, meta: dict[str, Any], files: dict[str, Any]) -> None:
    """Seal ``meta`` with the (synced) files' records into ``tmp`` and rename it to ``final``."""
    fault_point("ckpt_after_data")
    # durable: meta.json fsynced, then its directory -- which also makes the data files' names durable
    write_sealed_json(tmp / CHECKPOINT_META, {"format": FORMAT, "version": FORMAT_VERSION, **meta, "files": files,
                                              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, durable=True)
    fault_point("ckpt_before_commit")
    if final.exists():  # a re-written checkpoint of the same update (after a resume)
        _remove_committed(final)
    os.rename(tmp, final)
    fsync_dir(final.parent)


def _abandon(tmp: Path, final: Path, exc: BaseException) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    _no_space(exc, final)


def _no_space(exc: BaseException, final: Path) -> None:
    if isinstance(exc, OSError) and is_no_space(exc):
        raise no_space_error(final) from exc


def _copy_durable(src: Path, dst: Path) -> dict[str, Any]:
    fault_point("write")
    _copy(src, dst)
    return _sync(dst)


def _copy(src: Path, dst: Path) -> None:
    with open_regular(src) as reader, open_new(dst) as writer:  # a FIFO at src must not block the checkpoint
        _send(reader.fileno(), writer.fileno())


def _send(src: int, dst: int) -> int:
    """Copy the file open at ``src`` into ``dst`` (both from their start) by ``sendfile``: no buffer in Python
    (half the CPU of ``shutil.copyfileobj`` for the first job's 19 KB files); by ``pread``/``pwrite`` where
    ``sendfile`` cannot write to a file (not Linux). Returns the bytes copied."""
    size, done = os.fstat(src).st_size, 0
    try:
        while done < size:
            sent = os.sendfile(dst, src, done, size - done)
            if sent == 0:  # src shrank under us: what was read is what the copy holds
                return done
            done += sent
        return done
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK, errno.EOPNOTSUPP):
            raise
    done = 0
    while chunk := os.pread(src, 8 << 20, done):
        view = memoryview(chunk)
        while view:
            view = view[os.pwrite(dst, view, done + len(chunk) - len(view)):]
        done += len(chunk)
    return done


def _sync(path: Path) -> dict[str, Any]:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())
    return {"checksum": checksum_file(path), "bytes": path.stat().st_size}


class StagedBest:
    """The best epoch's checkpoint when that epoch has no scheduled one (``run.keep_best``), kept cheaply.

    A checkpoint costs its fsyncs and checksums: writing one at every epoch that improved made the README's
    first job (30 epochs, a checkpoint every 5) three times slower. So at such an epoch the checkpoint's files
    are only copied (the page cache, no sync) into a hidden directory, replacing the previous best's; when
    the run stops (its last epoch, an early stop, a stop request) the copy is committed once, as a checkpoint
    whose metadata says ``best_only``. A crash loses the copy (a resume removes it, as any unfinished
    checkpoint): the best epoch's checkpoint is then missing, and loading the run says so.

    The weight version is copied, not linked, although a published version is never rewritten: a version
    with a second name is deleted rather than recycled when it retires (``files.open_reused``), and the fresh
    file and map that then replace the recycled one cost more than the copy (docs/performance.md).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.folder: Path | None = None  # the hidden directory, made once and rewritten (an rmdir here cost 2 ms)
        self.staged: tuple[int, dict[str, Any]] | None = None  # (update, metadata) of the copy in it

    def stage(self, update: int, meta: dict[str, Any], sources: dict[str, Path]) -> None:
        self.staged = None
        if self.folder is None:
            final = checkpoint_path(self.run_dir, update)
            final.parent.mkdir(exist_ok=True)
            self.folder = tmp_sibling(final)
            self.folder.mkdir()
        try:
            for name in set(os.listdir(self.folder)) - set(sources):  # a staleness run's older versions vary
                os.unlink(self.folder / name)
            for name, src in sources.items():
                _rewrite(src, self.folder / name)
        except BaseException as exc:
            self.drop()
            _no_space(exc, checkpoint_path(self.run_dir, update))
            raise
        self.staged = (update, meta)

    def forget(self) -> None:
        """The copy is no longer the best epoch's (a later epoch has a scheduled checkpoint): it is never
        committed, and its directory is kept for the next copy (``drop`` removes it when the run stops)."""
        self.staged = None

    def drop(self) -> None:
        """Forget the copy (the run stops and it is not the best epoch's, or the run failed)."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder, self.staged = None, None

    def commit(self, best: int | None, keep: int) -> Path | None:
        """Commit the copy if it is still the best epoch's (update ``best``), then prune as a checkpoint does."""
        if self.staged is None or self.staged[0] != best or self.folder is None:
            self.drop()
            return None
        (update, meta), tmp = self.staged, self.folder
        self.folder, self.staged = None, None
        final = checkpoint_path(self.run_dir, update)
        try:
            files = {}
            for name in sorted(os.listdir(tmp)):
                fault_point("write")
                files[name] = _sync(tmp / name)
            _commit(tmp, final, meta, files)
        except BaseException as exc:
            _abandon(tmp, final, exc)
            raise
        prune_checkpoints(self.run_dir, keep, best)
        return final


# a staged copy's files are rewritten in place, never through a link (files.open_own), and not truncated first:
# ext4 flushes a file that was truncated and rewritten when it is closed (auto_da_alloc), 3 ms a copy here
REWRITE = os.O_WRONLY | os.O_CREAT


def _rewrite(src: Path, dst: Path) -> None:
    """Copy ``src`` over ``dst``'s bytes in place (``REWRITE``), cutting what is left of a longer old copy."""
    with open_regular(src) as reader:  # a FIFO at src must not block the checkpoint
        fd = open_own(dst, REWRITE)
        try:
            done = _send(reader.fileno(), fd)
            if os.fstat(fd).st_size > done:
                os.ftruncate(fd, done)
        finally:
            os.close(fd)


def prune_checkpoints(run_dir: Path, keep: int, protect: int | None = None,
                      best_only: Callable[[Path], bool] | None = None) -> None:
    """Keep the newest ``keep`` checkpoints and ``protect`` (the best epoch's); a checkpoint written only
    because its epoch was the best (``best_only`` in its metadata) goes once it is not the best any more, and
    never counts among the ``keep``. ``best_only``: how a checkpoint says so (a reinforcement-learning run's
    own metadata, memtrain/rl/server.py; by default a training checkpoint's)."""
    updates = checkpoint_updates(run_dir)
    best_only = best_only or _best_only
    # only a run that keeps its best epoch (protect) writes best-only checkpoints: without one, reading and
    # verifying every checkpoint's metadata at every epoch's end cost 14 ms an epoch for nothing
    superseded = [u for u in updates if u != protect and best_only(checkpoint_path(run_dir, u))] \
        if protect is not None else []
    regular = [u for u in updates if u not in superseded]
    for update in superseded + (regular[:-keep] if keep > 0 else []):
        if update != protect:
            _remove_committed(checkpoint_path(run_dir, update))


def _best_only(path: Path) -> bool:
    try:
        return read_meta(path).get("best_only") is True
    except MemtrainError:  # a damaged checkpoint is pruned (or kept) as any other
        return False


def _remove_committed(path: Path) -> None:
    """Rename a committed checkpoint out of sight first, so no reader ever sees a half-deleted one."""
    doomed = tmp_sibling(path)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def read_meta(path: Path) -> dict[str, Any]:
    """A checkpoint's metadata, trusted only once its seal matches and every field a resume uses is there."""
    file = path / CHECKPOINT_META
    meta = read_json(file, what="checkpoint metadata")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CorruptFileError("not a memtrain checkpoint", path=file, where="format",
                               expected=FORMAT, found=meta.get("format") if isinstance(meta, dict) else None)
    if meta.get("version") != FORMAT_VERSION:
        raise CorruptFileError("unsupported checkpoint format version", path=file,
                               expected=FORMAT_VERSION, found=meta.get("version"))
    meta = unseal(meta, path=file, what="checkpoint metadata")
    files = meta.get("files")
    if not isinstance(files, dict) or CHECKPOINT_WEIGHTS not in files:
        raise CorruptFileError("checkpoint metadata lists no weights file", path=file, where="files")
    bad = [name for name, record in files.items() if not _file_name(name) or not isinstance(record, dict)
           or not isinstance(record.get("checksum"), str)]
    if bad:  # a name that is not one of a checkpoint's own files could point anywhere
        raise CorruptFileError("checkpoint metadata names a file that is not a checkpoint's own", path=file,
                               where="files", expected=f"{CHECKPOINT_WEIGHTS}, opt-<state>.npy or weights-v<N>.npy",
                               found=bad[0])
    return meta


def _check_fields(meta: dict[str, Any], file: Path) -> None:
    """Every field a resume or a load reads, with its type: a missing one is a damaged checkpoint, not a KeyError."""
    position = meta.get("position")
    problems = _position_problems(position) if isinstance(position, dict) else ["position"]
    problems += [key for key in ("layout", "data", "model", "optimizer") if not isinstance(meta.get(key), dict)]
    if problems:
        raise CorruptFileError("checkpoint metadata lacks or mangles a field", path=file, where=", ".join(problems),
                               expected="every position field of its type, in range (counts 0 to 10^12, bases "
                                        "[updates, version] pairs by increasing updates, applied tasks each once)")


# No run counts 10^12 epochs, updates, versions or rows; a larger count in a checkpoint is damage, not a run.
MAX_COUNT = 10**12


def _position_problems(position: dict[str, Any]) -> list[str]:
    """The fields of a checkpoint's ``position`` that are missing, of the wrong type or out of range."""
    problems = [f"position.{key}" for key in POSITION_KEYS if key not in position]
    problems += [f"position.{key}" for key in ("epoch", "batch", "version", "epoch_rows", "skipped")
                 if key in position and not _count(position[key])]
    loss = position.get("epoch_loss", 0.0)
    if isinstance(loss, bool) or not isinstance(loss, int | float) or not math.isfinite(loss):
        problems.append("position.epoch_loss")
    if position.get("best") is not None and not isinstance(position["best"], dict):
        problems.append("position.best")
    # the schedule's state under its name, or (earlier releases) at the top level
    where, bases = _own(position, "planned", "bases")
    if not _bases_ok(bases, position.get("version")):
        problems.append(where)
    where, applied = _own(position, "arrival", "applied")
    if not (isinstance(applied, list) and all(map(_count, applied)) and len(set(applied)) == len(applied)):
        problems.append(where)
    return problems


def _own(position: dict[str, Any], schedule: str, key: str) -> tuple[str, Any]:
    """A schedule's state field in a checkpoint's position, and where it is: ``position.<schedule>.<key>``, or
    ``position.<key>`` in a checkpoint of an earlier release (absent: an empty list)."""
    if schedule in position:
        own = position[schedule]
        return f"position.{schedule}.{key}", own.get(key) if isinstance(own, dict) else None
    return f"position.{key}", position.get(key, [])


def _bases_ok(bases: Any, version: Any) -> bool:
    """Fixed staleness's ``[updates done, version then]`` pairs: counts, by strictly increasing updates (no
    duplicates), none of a version newer than the checkpoint's."""
    if not isinstance(bases, list) or not all(isinstance(pair, list) and len(pair) == 2 and all(map(_count, pair))
                                              for pair in bases):
        return False
    newest = version if _count(version) else MAX_COUNT
    updates = [n for n, _ in bases]
    return all(v <= newest for _, v in bases) and updates == sorted(set(updates))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _file_name(name: str) -> bool:
    """A checkpoint's files are its own plain names, never a path out of it."""
    return name == CHECKPOINT_WEIGHTS or (name.startswith(("opt-", "weights-v")) and name.endswith(".npy")
                                           and "/" not in name and not name.startswith("."))


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Re-hash every file of a checkpoint; returns its metadata or raises naming the bad file or field."""
    meta = read_meta(path)
    _check_fields(meta, path / CHECKPOINT_META)
    for name, record in meta["files"].items():
        verify_checksum(path / name, record["checksum"])
    return meta


def done_epochs(run_dir: Path) -> int | None:
    """The epochs of the newest checkpoint whose metadata is intact (its files are not re-hashed), or None."""
    for update in reversed(checkpoint_updates(run_dir)):
        try:
            meta = read_meta(checkpoint_path(run_dir, update))
            _check_fields(meta, checkpoint_path(run_dir, update) / CHECKPOINT_META)
            return int(meta["position"]["epoch"])
        except MemtrainError:
            continue
    return None


def newest_checkpoint(run_dir: Path, warn: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint whose files all match their checksums; bad ones are reported and skipped."""
    for update in reversed(checkpoint_updates(run_dir)):
        path = checkpoint_path(run_dir, update)
        try:
            return path, verify_checkpoint(path)
        except MemtrainError as exc:
            warn(f"skipping checkpoint {path.name}: {exc}")
    return None


def load_checkpoint(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``({name: read-only memmapped array}, metadata)`` of a checkpoint dir (or of a run's newest one).

    >>> params, meta = load_checkpoint("runs/digits-mlp")       # doctest: +SKIP
    >>> params["W1"].shape, meta["epoch"]
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such checkpoint or run directory", path=path, hint=existing_hint(path))
    if (path / CHECKPOINTS_DIR).is_dir() or (path / RUN_PARAMS).exists():
        found = newest_checkpoint(path, warn=lambda _: None)
        if found is None:
            raise InputError("the run has no complete checkpoint", path=path)
        path = found[0]
    meta = read_meta(path)
    _check_fields(meta, path / CHECKPOINT_META)
    layout = ParamLayout.from_json(meta["layout"], path=path / CHECKPOINT_META)
    flat = open_npy(path / CHECKPOINT_WEIGHTS, shape=(layout.size,), dtype=layout.dtype)
    return layout.views(flat), meta


WHICH = ("best", "last")  # a run's checkpoints by name: the best epoch's (train.monitor), the newest


def pick_checkpoint(run_dir: Path, newest: Path, which: str | None = None,
                    note: Callable[[str], None] | None = None) -> Path:
    """The checkpoint of a run that ``which`` names, given its newest complete one.

    ``"last"``: ``newest``. ``"best"``: the best epoch's (by ``train.monitor``), as ``newest`` records it;
    an error if the run records none or it was not kept. None (the default of ``load_model`` and ``inspect
    --export``): the best epoch's if the run has it, else ``newest`` -- and then ``note`` is told why, so that
    "the best" never silently hands back another epoch.
    """
    if which is not None and which not in WHICH:
        raise InputError("bad value for which", expected=" or ".join(map(repr, WHICH)), found=repr(which))
    if which == "last":
        return newest
    best = read_meta(newest).get("best") or {}
    if not isinstance(best.get("update"), int):
        if which is None:
            return newest  # no validation split (or no epoch): the run has no "best", only its newest
        raise InputError("the run records no best epoch (no validation split, or no epoch done?)", path=run_dir,
                         hint='use which="last" for the newest checkpoint')
    path = checkpoint_path(run_dir, best["update"])
    if path.is_dir():
        return path
    reason = (f"the checkpoint of the best epoch ({best.get('epoch')}) was pruned (run.keep_best = false) or lost "
              "in a crash")
    if which is None:
        if note is not None:
            note(f"{reason}: using the newest checkpoint, {newest.name} "
                 f"(epoch {read_meta(newest).get('epoch')}), instead")
        return newest
    raise InputError(reason, path=path, hint=f"{existing_hint(path)}; run.keep_best = true keeps it")


def discard_incomplete(run_dir: Path) -> None:
    """Remove temporary checkpoint directories left by a crash (the run lock is held: no one owns them).

    Only names that ``tmp_sibling`` makes of a checkpoint's name: ``checkpoints/.hidden/`` is not ours."""
    folder = run_dir / CHECKPOINTS_DIR
    if folder.is_dir():
        for entry in os.listdir(folder):
            if is_checkpoint_name(tmp_target(entry) or "") and not (folder / entry).is_symlink():
                with contextlib.suppress(OSError):
                    shutil.rmtree(folder / entry)
