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


# --- a state names its order; another loader's is refused (issue 41) ---


def position(state: dict) -> tuple[int, int]:
    return state["epoch"], state["batch"]


def test_a_state_records_the_order_it_belongs_to(dataset: Path) -> None:
    from memtrain.files import json_checksum

    state = batch_dataset(dataset).state_dict(consumed=4)
    assert state == {"epoch": 2, "batch": 4, "order": {
        "dataset": json_checksum(open_dataset(dataset).manifest), "split": "train", "rows": 900, "batch_size": 64,
        "seed": 4, "shuffle": "rows", "window": 96, "drop_last": False}}
    assert json.loads(json.dumps(state)) == state
    assert batch_dataset(dataset, shuffle=True).state_dict()["order"]["window"] is None  # "batches": no window


@pytest.mark.parametrize(("change", "named"), [
    ({"batch_size": 128}, ["batch_size"]), ({"seed": 5}, ["seed"]), ({"shuffle": "batches"}, ["shuffle", "window"]),
    ({"window": 192}, ["window"]), ({"drop_last": True}, ["drop_last"]), ({"split": "val"}, ["split", "rows"]),
    ({"batch_size": 32, "seed": 0}, ["batch_size", "seed"])])
def test_a_state_of_another_order_is_refused_naming_every_difference(dataset: Path, change: dict,
                                                                     named: list[str]) -> None:
    batch_size = change.pop("batch_size", 64)
    theirs = batch_dataset(dataset, batch_size, **change).state_dict()
    ours = batch_dataset(dataset)
    before = ours.state_dict(consumed=3)
    with pytest.raises(InputError, match="the state belongs to another loader") as refused:
        ours.load_state_dict({**theirs, "batch": 1})
    text = str(refused.value)
    for key in named:
        assert f"{key} {ours.order_record[key]!r}" in text and f"{key} {theirs['order'][key]!r}" in text, text
    assert [part.split()[0] for part in refused.value.expected.split(", ")] == named  # and nothing else
    assert "rank, world and the workers may differ" in text
    assert ours.state_dict(consumed=3) == before  # nothing changed


def test_a_state_of_another_dataset_is_refused(dataset: Path, tmp_path: Path) -> None:
    x, y = blobs(n=1000, features=6, classes=3, seed=1)
    other = write_dataset(tmp_path / "other", x, y, val_rows=100, shard_rows=300)  # the same shape, other rows
    from memtrain.torch import BatchDataset

    theirs = BatchDataset(open_dataset(other), 64, **JOB).state_dict(consumed=5)
    with pytest.raises(InputError, match="another loader.*expected dataset 'xxh3-128:"):
        batch_dataset(dataset).load_state_dict(theirs)


def test_what_does_not_decide_the_rows_may_differ_and_an_older_state_still_loads(dataset: Path) -> None:
    state = batch_dataset(dataset).state_dict(consumed=6)
    again = batch_dataset(dataset, epoch=0, rank=1, world=3)
    again.load_state_dict(state)
    assert position(again.state_dict()) == (2, 6)
    batches = batch_dataset(dataset, shuffle="batches")
    batches.load_state_dict(batch_dataset(dataset, shuffle="batches", window=4096).state_dict(consumed=2))
    assert position(batches.state_dict()) == (2, 2)  # the window does not decide "batches"' rows
    again.load_state_dict({"epoch": 1, "batch": 3})  # written before states named their order
    assert position(again.state_dict()) == (1, 3)


@pytest.mark.parametrize("state", [{"epoch": 1}, {"epoch": 1, "batch": 0, "rank": 0}, [1, 0],
                                   {"epoch": 1, "batch": 0, "order": "rows"},
                                   {"epoch": 1, "batch": 0, "order": {"batch_size": 64}}])
def test_a_malformed_state_is_refused(dataset: Path, state) -> None:
    with pytest.raises(InputError, match="BatchDataset state|order record is malformed"):
        batch_dataset(dataset).load_state_dict(state)


# --- the position with DataLoader workers (issue 44 #5) ---


def test_batch_loader_knows_the_position_with_workers_and_resumes_exactly(dataset: Path) -> None:
    from memtrain.torch import BatchLoader

    whole = global_batches(dataset)
    data = batch_dataset(dataset)
    loader = BatchLoader(data, num_workers=2, multiprocessing_context="fork")
    assert position(data.state_dict()) == (2, 0)
    taken = []
    for x, _ in loader:
        taken.append(x.numpy().copy())
        if len(taken) == 7:
            break
    state = data.state_dict()
    assert position(state) == (2, 7) and loader.state_dict() == state
    again = batch_dataset(dataset, epoch=0, world=1)
    resumed = BatchLoader(again, num_workers=2, multiprocessing_context="fork")
    resumed.load_state_dict(state)
    rest = [x.numpy().copy() for x, _ in resumed]
    np.testing.assert_array_equal(np.concatenate(taken + rest), np.concatenate(whole))
    assert position(again.state_dict()) == (3, 0)  # the epoch ran out: the next one
    assert position(data.state_dict()) == (2, 7)  # the first loader's position is its own
    data.set_epoch(3)
    assert position(loader.state_dict()) == (3, 0)


def test_batch_loader_counts_with_spawned_workers_too(dataset: Path) -> None:
    from memtrain.torch import BatchLoader

    data = batch_dataset(dataset)
    loader = BatchLoader(data, num_workers=2, multiprocessing_context="spawn")
    got = [x.numpy().copy() for x, _ in loader]
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(global_batches(dataset)))
    assert position(data.state_dict()) == (3, 0)


def test_a_plain_dataloader_with_workers_leaves_the_count_to_the_caller(dataset: Path) -> None:
    """Its workers make the batches where the BatchDataset cannot see: once this pass's batches have arrived,
    ``state_dict()`` without ``consumed`` is refused (it used to say the pass's start), with a count it is exact."""
    import torch

    data = batch_dataset(dataset)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="fork")
    assert position(data.state_dict()) == (2, 0)  # nothing made yet: the start
    for taken, _ in enumerate(loader, start=1):
        if taken == 7:
            break
    with pytest.raises(InputError, match="made in DataLoader workers.*consumed=n.*BatchLoader"):
        data.state_dict()
    assert position(data.state_dict(consumed=taken)) == (2, 7)
    assert len(list(loader)) == 15
    with pytest.raises(InputError, match="cannot count"):
        data.state_dict()  # after the epoch: not the stale {'epoch': 2, 'batch': 0} either
    assert position(data.state_dict(consumed=15)) == (3, 0)
    data.set_epoch(3)
    assert position(data.state_dict()) == (3, 0)  # a new position: nothing of it made yet
    for taken, _ in enumerate(data, start=1):  # counted in this process: 3 batches
        if taken == 3:
            break
    assert position(data.state_dict()) == (3, 3)
    next(iter(loader))  # then the same pass through workers: the count above no longer says anything
    with pytest.raises(InputError, match="cannot count"):
        data.state_dict()


def test_batch_loader_refuses_what_would_make_its_count_wrong(dataset: Path) -> None:
    from memtrain.torch import BatchLoader

    with pytest.raises(InputError, match="persistent_workers=False"):
        BatchLoader(batch_dataset(dataset), num_workers=2, persistent_workers=True)
    with pytest.raises(InputError, match="batch_size=None"):
        BatchLoader(batch_dataset(dataset), batch_size=64)
    with pytest.raises(InputError, match="loads a memtrain.torch.BatchDataset"):
        BatchLoader(open_dataset(dataset))
    loader = BatchLoader(batch_dataset(dataset), num_workers=0)  # in process: the dataset counts, once
    for taken, _ in enumerate(loader, start=1):
        if taken == 4:
            break
    assert position(loader.state_dict()) == (2, 4)


def test_a_position_asked_in_a_worker_is_refused_not_guessed(dataset: Path) -> None:
    """torchdata's StatefulDataLoader asks each worker's copy for its state; a worker makes every n-th batch and
    cannot know the position, so it says so (it used to give the pass's start: a resume replayed the pass)."""
    import torch

    from memtrain.torch import BatchDataset

    class AskInWorker(BatchDataset):
        def __iter__(self):
            try:
                yield self.state_dict()
            except InputError as refused:
                yield str(refused)

    data = AskInWorker(open_dataset(dataset), 64, **JOB)
    said = list(torch.utils.data.DataLoader(data, batch_size=None, num_workers=1, multiprocessing_context="fork"))
    assert len(said) == 1 and "kept in the process that iterates the DataLoader" in said[0], said
    assert "BatchLoader" in said[0]
