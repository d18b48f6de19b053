"""The loader's arguments and position: every integer checked with a bound before anything happens (numpy integers
taken, bools and floats refused, through one check); a state names the order it belongs to and is refused by a
loader of another; with DataLoader workers the position is counted where the batches reach your loop."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

from memtrain.dataset import open_dataset
from memtrain.errors import InputError

pytestmark = pytest.mark.timeout(120)
JOB = {"seed": 4, "epoch": 2, "window": 96}  # 900 train rows: 15 batches of 64
HUGE = 2**80


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1000, features=6, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, val_rows=100, shard_rows=300)


def batch_dataset(dataset: Path, batch_size: int = 64, **kw):
    from memtrain.torch import BatchDataset

    return BatchDataset(open_dataset(dataset), batch_size, **JOB | kw)


def global_batches(dataset: Path, batch_size: int = 64) -> list[np.ndarray]:
    return [x.copy() for x, _ in open_dataset(dataset).batches(batch_size, **JOB)]


# --- integers: bounded, numpy's taken, bools and floats refused (issue 41 #9, #12) ---


TOP = r"2\*\*63 - 1"


@pytest.mark.parametrize(("name", "bound"), [("batch_size", f"from 1 to {TOP}"), ("seed", f"from 0 to {TOP}"),
                                             ("epoch", f"from 0 to {TOP}"), ("window", f"from 1 to {TOP}"),
                                             ("world", f"from 1 to {TOP}"), ("start", "from 0 to 15"),
                                             ("rank", "from 0 to 0")])
def test_a_huge_integer_argument_is_refused_by_name_before_anything_happens(dataset: Path, name: str,
                                                                             bound: str) -> None:
    ds = open_dataset(dataset)
    arguments = JOB | {name: HUGE}
    batch_size = arguments.pop("batch_size", 64)
    with pytest.raises(InputError, match=f"{name} must be an integer {bound}") as refused:
        next(ds.batches(batch_size, **arguments))
    assert str(HUGE) in str(refused.value)
    with pytest.raises(InputError, match=f"{name} must be an integer {bound}"):
        batch_dataset(dataset, **({"batch_size": HUGE} if name == "batch_size" else {name: HUGE}))


def test_a_batch_size_past_the_rows_is_one_batch_also_through_dataloader_workers(dataset: Path) -> None:
    """The workers' ring slots are as large as the largest batch, not as ``batch_size``: 2**40 rows asked, 900 made."""
    import torch

    whole = np.concatenate(global_batches(dataset))
    data = batch_dataset(dataset, 2**40)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = [x.numpy().copy() for x, _ in loader]
    assert [len(x) for x in got] == [900]
    np.testing.assert_array_equal(np.sort(got[0], axis=0), np.sort(whole, axis=0))


def test_numpy_integers_are_taken_everywhere_and_bools_and_floats_nowhere(dataset: Path) -> None:
    data = batch_dataset(dataset)
    assert data.state_dict(consumed=np.int64(3)) == data.state_dict(consumed=3)
    assert data.state_dict(consumed=np.uint8(3))["batch"] == 3
    for bad in (True, np.bool_(True), 3.0, np.float64(3.0), "3", -1, 16):
        with pytest.raises(InputError, match="consumed must be an integer from 0 to 15"):
            data.state_dict(consumed=bad)
    data.load_state_dict({"epoch": np.int64(5), "batch": np.int32(4)})
    state = data.state_dict()
    assert (state["epoch"], state["batch"]) == (5, 4)
    assert type(state["epoch"]) is int and type(state["batch"]) is int
    json.dumps(state)  # plain numbers: a state can be written as JSON
    for bad in ({"epoch": True, "batch": 0}, {"epoch": 1.0, "batch": 0}, {"epoch": 1, "batch": np.float32(2)}):
        with pytest.raises(InputError, match="must be an integer"):
            data.load_state_dict(bad)
    assert data.state_dict()["batch"] == 4  # a refused state changes nothing
    again = batch_dataset(dataset, np.int64(64), seed=np.int64(4), epoch=np.int64(2), window=np.int64(96),
                          rank=np.int64(0), world=np.int64(1))
    assert json.dumps(again.state_dict()) == json.dumps(batch_dataset(dataset).state_dict())
