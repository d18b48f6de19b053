"""Methods run side by side -> figures that survive noise: interleaved runs, medians with their range, pairwise ratios.

Every comparison of ``memtrain bench`` reads its runs through here, the same way:

- ``interleaved``: method A, B, C, then A, B, C again, ``repeats`` times, so that a slow spell of a busy
  machine falls on every method, not on whichever happened to run during it;
- ``Spread``: the median of the repeats with their min-max range, always printed together (on a machine
  whose runs spread by 30%, one run proves nothing);
- ``pairwise``: a ratio per repeat, from the two runs made side by side in that repeat, then their Spread
  (never a ratio of two medians, which pairs runs made at different moments);
- ``per_update``: the seconds one update costs, from a run of E epochs and one of 2E: whatever a run pays
  once (interpreter, imports, spawned workers, placement, the last checkpoint) cancels in the difference;
- ``Target``: met when the median meets it (at least, or at most, a bound); the range is printed beside it.

Example::

    runs = interleaved(["memtrain", "loop"], 3, lambda method, repeat: time_one(method))
    ratio = pairwise(runs["loop"], runs["memtrain"])      # loop seconds / memtrain seconds, per repeat
    print(Target(name="memtrain / loop", at_least=0.5).verdict(ratio))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def interleaved(methods: Sequence[str], repeats: int, run: Callable[[str, int], T]) -> dict[str, list[T]]:
    """``run(method, repeat)`` in the order A B C, A B C, ... (``repeats`` rounds); each method's results in order."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats}")
    results: dict[str, list[T]] = {method: [] for method in methods}
    for repeat in range(repeats):
        for method in methods:
            results[method].append(run(method, repeat))
    return results


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the median of no values")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(frozen=True, kw_only=True)
class Spread:
    """The median of the repeats and their range. ``runs`` keeps every value, in repeat order."""

    median: float
    low: float
    high: float
    runs: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(median=median(values), low=min(values), high=max(values), runs=tuple(values))

    def text(self, digits: int = 2) -> str:
        """``1.23 (1.10-1.40)``; a single run shows no range."""
        value = f"{self.median:.{digits}f}"
        return value if len(self.runs) < 2 else f"{value} ({self.low:.{digits}f}-{self.high:.{digits}f})"

    def as_dict(self) -> dict[str, object]:
        return {"median": self.median, "low": self.low, "high": self.high, "runs": list(self.runs)}


def pairwise(numerators: Sequence[float | None], denominators: Sequence[float | None]) -> Spread | None:
    """Repeat k's ratio numerators[k] / denominators[k] (two runs made side by side), over the repeats; a
    repeat where either side has no figure (None: see ``per_update``) is left out; None if every one is."""
    if len(numerators) != len(denominators):
        raise ValueError(f"pairwise ratios need as many runs on each side: {len(numerators)} and {len(denominators)}")
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True) if a is not None and b is not None]
    return Spread.of(ratios) if ratios else None


def per_update(short_seconds: float, long_seconds: float, extra_updates: int) -> float | None:
    """Seconds per update from a run and a longer one that did ``extra_updates`` more updates (E and 2E epochs):
    what both pay once cancels. None when the difference is not positive (start-up noise larger than the
    extra work: give the runs more updates)."""
    difference = long_seconds - short_seconds
    return difference / extra_updates if difference > 0 and extra_updates > 0 else None


@dataclass(frozen=True, kw_only=True)
class Target:
    """A ratio a comparison should reach, ``at_least`` or ``at_most`` (a cost): met when the median does."""

    name: str
    at_least: float | None = None
    at_most: float | None = None

    def __post_init__(self) -> None:
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError(f"a target is at_least or at_most a bound: {self.name}")

    def met(self, ratio: Spread) -> bool:
        return ratio.median >= self.at_least if self.at_least is not None else ratio.median <= self.at_most

    def verdict(self, ratio: Spread) -> str:
        """``async / sync with a straggler: 1.46x (runs 1.30-1.60), target >= 1.5x by median: NOT met``."""
        runs = f" (runs {ratio.low:.2f}-{ratio.high:.2f})" if len(ratio.runs) > 1 else " (one run)"
        bound = f">= {self.at_least:g}x" if self.at_least is not None else f"<= {self.at_most:g}x"
        return (f"{self.name}: {ratio.median:.2f}x{runs}, target {bound} by median: "
                f"{'met' if self.met(ratio) else 'NOT met'}")
