"""OUT + a resume key -> the hidden work area of one prepare, and the final rename of its dataset into OUT.

``.OUT.prepare-<key>/`` (a sibling of OUT, so renames stay on one filesystem) holds the shuffle spool,
``spool.json`` (the spool's commit marker), ``done.jsonl`` (one record per finished shard pair, with its
checksums) and ``dataset/``, which becomes OUT by one rename once its manifest is written. The key hashes
the options and the source's identity (path, size, mtime), so only a rerun with the same ones resumes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from memtrain.dataset import shard_file
from memtrain.errors import CorruptFileError, InputError
from memtrain.faults import fault_point
from memtrain.files import (
    append_jsonl,
    fsync_dir,
    open_own,
    read_sealed_json,
    read_sealed_jsonl,
    seal,
    verify_checksum,
    write_sealed_json,
)
from memtrain.layout import (
    MANIFEST,
    PREPARE_DATASET_DIR,
    PREPARE_DONE_LOG,
    PREPARE_LOCK,
    PREPARE_REPLACED_DIR,
    PREPARE_SPOOL_DIR,
    PREPARE_SPOOL_INFO,
    SPLITS,
    TMP_MARK,
    is_shard_name,
    prepare_work_dir,
    prepare_work_dirs,
    tmp_target,
)
from memtrain.records import PREPARE_DONE, make


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an existing output unless --overwrite, and refuse to replace anything but a dataset that holds
    nothing memtrain did not write (replacing it deletes every file in it)."""
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise InputError("the output path exists", path=out, hint="pass --overwrite to replace it (the old "
                         "dataset is replaced only once the new one is complete)")
    if not out.is_dir() or out.is_symlink() or not ((out / MANIFEST).exists() or not any(out.iterdir())):
        raise InputError("refusing to replace something that is not a memtrain dataset", path=out,
                         expected="a dataset directory (with manifest.json) or an empty directory")
    foreign = foreign_entries(out)
    if foreign:
        raise InputError("refusing to replace a dataset that holds files memtrain did not write", path=out,
                         found=", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""),
                         hint="move them out of the dataset directory, then run the same command again")


def foreign_entries(out: Path) -> list[str]:
    """Entries of a dataset directory that are not memtrain's names: manifest.json, the split folders and
    the shards in them (and temporary names of those)."""
    foreign = []
    for name in sorted(os.listdir(out)):
        path = out / name
        if name == MANIFEST and path.is_file() and not path.is_symlink():
            continue
        if name in SPLITS and path.is_dir() and not path.is_symlink():
            foreign += [f"{name}/{entry}" for entry in sorted(os.listdir(path))
                        if not is_shard_name(tmp_target(entry) or entry) or (path / entry).is_dir()]
            continue
        foreign.append(name)
    return foreign


class WorkArea:
    """The work directory of one (OUT, key); ``claim()`` locks it against a second prepare."""

    def __init__(self, out: Path, key: str):
        self.out = out
        self.root = prepare_work_dir(out, key)
        self.spool = self.root / PREPARE_SPOOL_DIR
        self.dataset = self.root / PREPARE_DATASET_DIR
        self._lock: int | None = None
        self._done_log = threading.Lock()  # each split's publisher thread appends to done.jsonl

    def claim(self) -> None:
        if self.root.is_symlink():
            raise InputError("the work area of this prepare is a symbolic link; memtrain does not write through "
                             "links it did not make", path=self.root, hint="remove the link and run again")
        self.root.mkdir(parents=True, exist_ok=True)
        fd = open_own(self.root / PREPARE_LOCK, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise InputError("another memtrain prepare is writing this output", path=self.out) from exc
        self._lock = fd

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def sweep_others(self) -> list[Path]:
        """Remove unfinished work areas of OUT made with other arguments (they can never resume now): only
        directories with a work area's name, its lock file in them, and that lock free."""
        removed = []
        for other in prepare_work_dirs(self.out):
            if other != self.root and not other.is_symlink() and (other / PREPARE_LOCK).is_file() and _unlocked(other):
                shutil.rmtree(other, ignore_errors=True)
                removed.append(other)
        return removed

    def load_spool(self) -> dict[str, Any] | None:
        path = self.root / PREPARE_SPOOL_INFO
        if not path.exists():
            return None
        try:
            return read_sealed_json(path, what="spool marker")
        except CorruptFileError:  # damaged: never trusted, the spool is written again
            return None

    def reset(self) -> None:
        """Start from nothing: no spool, no finished shards."""
        for name in (PREPARE_SPOOL_INFO, PREPARE_DONE_LOG):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.root / name)
        for folder in (self.spool, self.dataset):
            shutil.rmtree(folder, ignore_errors=True)
        self.spool.mkdir(parents=True)
        self.dataset.mkdir(parents=True)

    def commit_spool(self, info: dict[str, Any]) -> None:
        fsync_dir(self.spool)
        write_sealed_json(self.root / PREPARE_SPOOL_INFO, info, durable=True)

    def finished_shards(self) -> dict[str, dict[int, dict[str, Any]]]:
        """Shards recorded as finished whose files still match their checksums, by split and index.

        Temporary files of the interrupted run are removed first (we hold the lock: nobody else writes here).
        """
        for leftover in self.dataset.rglob(f"*{TMP_MARK}*"):
            leftover.unlink(missing_ok=True)
        finished: dict[str, dict[int, dict[str, Any]]] = {}
        for record in read_sealed_jsonl(self.root / PREPARE_DONE_LOG, what="finished-shard record")[0]:
            entry = record["entry"]
            try:
                verify_checksum(shard_file(self.dataset, entry["x"], where="x"), entry["x_checksum"])
                verify_checksum(shard_file(self.dataset, entry["y"], where="y"), entry["y_checksum"])
            except (CorruptFileError, KeyError, TypeError):
                continue
            finished.setdefault(record["split"], {})[int(record["index"])] = entry
        return finished

    def record_shard(self, split: str, index: int, entry: dict[str, Any]) -> None:
        """Log one finished shard pair. The splits' writers publish from their own threads; one at a time, so
        the log's lines never interleave and a kill at the n-th logged pair leaves exactly n lines."""
        with self._done_log:
            append_jsonl(self.root / PREPARE_DONE_LOG, seal(make(PREPARE_DONE, split=split, index=index,
                                                                 entry=entry)))
            fault_point("prepare_after_shard")

    def publish(self, overwrite: bool) -> None:
        """Rename the finished dataset into OUT; an old dataset is moved aside first and removed after."""
        check_out(self.out, overwrite)
        old = self.root / PREPARE_REPLACED_DIR
        if self.out.exists():
            os.replace(self.out, old)
        os.replace(self.dataset, self.out)
        fsync_dir(self.out.parent)
        shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.release()


def _unlocked(folder: Path) -> bool:
    try:
        fd = os.open(folder / PREPARE_LOCK, os.O_RDWR)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
