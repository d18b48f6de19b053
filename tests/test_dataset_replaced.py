"""An open Dataset never mixes two datasets (issue 30, defect 8): after `prepare --overwrite` replaced the
directory, a shard not mapped yet is refused with "the dataset changed since it was opened" instead of being
read from the new dataset (docs/faults.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memtrain.dataset import open_dataset
from memtrain.errors import MemtrainError


def test_a_replaced_dataset_is_refused_not_mixed(cli: Callable[..., Any], tmp_path: Path) -> None:
    out = tmp_path / "ds"
    prepare = ("prepare", "--synthetic", "400x4", "--classes", "3", "--plain", "--shard-mb", "0.002")
    assert cli(*prepare, "--seed", "1", out).code == 0
    dataset = open_dataset(out)
    train = dataset.split("train")
    first = train.read(0, 10)[0].copy()  # shard 0 is mapped now; the others are not
    assert cli(*prepare, "--seed", "2", "--overwrite", out).code == 0
    assert np.array_equal(train.read(0, 10)[0], first)  # a mapped shard keeps the old dataset's bytes
    with pytest.raises(MemtrainError, match="the dataset changed since it was opened"):
        train.read(train.rows - 10, train.rows)  # the last shard: not mapped before the replacement
    assert open_dataset(out).split("train").read(train.rows - 10, train.rows)[0].shape == (10, 4)
