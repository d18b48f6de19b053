"""Two partial (count, mean, M2) summaries -> the summary of their union (Chan, Golub and LeVeque).

The one merge used wherever memtrain streams statistics (prepare's per-feature stats, inspect's
per-parameter stats). Works on floats and on numpy arrays alike. M2 is the sum of squared deviations
from the mean; merging partial M2s stays accurate where a running sum of squares loses every digit.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

Value = TypeVar("Value", float, np.ndarray)


def merge_moments(count: int, mean: Value, m2: Value, other_count: int, other_mean: Value,
                  other_m2: Value) -> tuple[int, Value, Value]:
    """(count, mean, M2) of the union of two disjoint sets of values.

    >>> merge_moments(2, 1.0, 2.0, 2, 3.0, 2.0)   # {0, 2} and {2, 4}
    (4, 2.0, 8.0)
    """
    total = count + other_count
    if total == 0:
        return 0, mean, m2
    delta = other_mean - mean
    return total, mean + delta * (other_count / total), m2 + other_m2 + delta * delta * (count * other_count / total)
