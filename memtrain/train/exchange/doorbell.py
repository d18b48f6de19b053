"""A word in a shared file map -> a way for processes to sleep until another one says something changed.

The participants of a round wait for each other's marks (train/exchange/marks.py). Spinning on the marks is
fast on an idle machine and ruinous on a busy one: the spinner burns the core its peer needs to finish.
So a waiter spins only briefly, then sleeps in the kernel on a futex (Linux), and whoever writes a mark
rings the doorbell: it bumps the word and wakes every sleeper. A waiter that reads the word before it
looks at the marks can never miss a ring: if the word moved, its sleep returns at once.

There is no lock: a process killed at any point leaves nothing held. Where futexes are not available
(not Linux, or an unknown architecture) ``sleep`` falls back to a short nap.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import time

FUTEX_WAIT, FUTEX_WAKE = 0, 1
SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98, "ppc64le": 221, "s390x": 238}.get(platform.machine())
NAP_SECONDS = 0.0002  # the fallback's sleep


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall():  # noqa: ANN202 - libc's syscall(2), or None
    if not sys.platform.startswith("linux") or SYS_FUTEX is None:
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long
    return call


class Doorbell:
    """A 32-bit word at ``offset`` (a multiple of 4) of the open file ``fd``, mapped shared."""

    def __init__(self, fd: int, offset: int):
        page = offset - offset % mmap.ALLOCATIONGRANULARITY
        self._map = mmap.mmap(fd, offset - page + 4, offset=page)
        self._word = ctypes.c_uint32.from_buffer(self._map, offset - page)
        self._syscall = _syscall()

    @property
    def value(self) -> int:
        return self._word.value

    def ring(self) -> None:
        """Say that something changed: wake every sleeper (cheap when nobody sleeps)."""
        self._word.value = (self._word.value + 1) & 0xFFFFFFFF  # racing ringers still move it off what sleepers saw
        if self._syscall is not None:
            self._syscall(ctypes.c_long(SYS_FUTEX), ctypes.c_void_p(ctypes.addressof(self._word)),
                          ctypes.c_int(FUTEX_WAKE), ctypes.c_int(0x7FFFFFFF), None, None, ctypes.c_int(0))

    def sleep(self, seen: int, seconds: float) -> None:
        """Sleep until the word is no longer ``seen`` (a ring), at most ``seconds``; may return early."""
        if self._syscall is None:
            time.sleep(min(seconds, NAP_SECONDS))
            return
        timeout = _Timespec(int(seconds), int(seconds % 1 * 1e9))
        self._syscall(ctypes.c_long(SYS_FUTEX), ctypes.c_void_p(ctypes.addressof(self._word)),
                      ctypes.c_int(FUTEX_WAIT), ctypes.c_uint32(seen), ctypes.byref(timeout), None, ctypes.c_int(0))

    def close(self) -> None:
        del self._word
        self._map.close()


def available() -> bool:
    return _syscall() is not None and os.name == "posix"
