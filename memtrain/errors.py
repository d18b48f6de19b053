"""One error family: every failure names the file, the place in it, what was expected and what was found."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class MemtrainError(Exception):
    """A failure the user should read, not a traceback. Exit code 1 (a failure while running).

    Example: ``MemtrainError("checksum mismatch", path="d/train/x-00000.npy",
    expected="xxh3-128:ab..", found="xxh3-128:cd..", hint="re-run memtrain prepare")``
    """

    message: str
    path: str | os.PathLike[str] | None = None
    where: str | None = None
    expected: object = None
    found: object = None
    hint: str | None = None

    exit_code = 1

    def __str__(self) -> str:
        place = ""
        if self.path is not None:
            place = os.fspath(self.path) + (f":{self.where}" if self.where else "") + ": "
        elif self.where:
            place = f"{self.where}: "
        text = place + self.message
        parts = [f"{label} {value}" for label, value in (("expected", self.expected), ("found", self.found))
                 if value is not None]
        if parts:
            text += f" ({', '.join(parts)})"
        if self.hint:
            text += f". {self.hint}"
        return text


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A hint naming the closest of ``choices`` to a misspelt ``word``, or None when none is close.

    >>> did_you_mean("epocs", ["epochs", "seed"])
    'did you mean `epochs`?'
    """
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.7)
    return f"did you mean `{close[0]}`?" if close else None


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``plural(1, "shard")`` -> ``"1 shard"``; ``plural(3, "shard")`` -> ``"3 shards"`` (thousands separated)."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


class InputError(MemtrainError):
    """Bad input or configuration from the user: exit code 2."""

    exit_code = 2


class CorruptFileError(MemtrainError):
    """A file on disk does not match what was recorded for it (size, header, checksum)."""


class DiskFullError(MemtrainError):
    """Not enough space to write a file; nothing partial was published."""


class WorkerFailure(MemtrainError):
    """A task failed in a worker (an exception, or it killed its worker too many times)."""


class Interrupted(MemtrainError):
    """SIGINT/SIGTERM: the run stopped cleanly. exit_code is 128 + the signal number."""

    exit_code = 130
