"""A view dict -> JSON on stdout (``--json``), with NaN and Inf written as null so that any JSON parser reads it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np


def plain(value: Any) -> Any:
    """Recursively: non-finite floats -> None, numpy scalars -> Python numbers, paths -> strings."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def print_json(view: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(plain(view), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()
