"""The reduction on its own (memtrain/train/loops/reduce.py ``reduce_and_step``): the sum in task order, the mean, the
optimizer step and the block digests, against a float64 reference and a float32 one added in the same order,
and the same bits for any slicing of the vector into checksum blocks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memtrain.files import DIGEST_BYTES, block_digest
from memtrain.train.exchange.weights import block_count
from memtrain.train.loops.reduce import CHUNK, Scratch, reduce_and_step
from memtrain.train.optim import OptimizerConfig, apply_update, state_names
from memtrain.train.plan import step_slices


def inputs(seed: int, size: int, tasks: int, optimizer: OptimizerConfig) -> dict:
    rng = np.random.default_rng(seed)
    return {"grads": [rng.normal(size=size).astype(np.float32) for _ in range(tasks)],
            "weights": rng.normal(size=size).astype(np.float32),
            "state_in": {k: np.abs(rng.normal(size=size)).astype(np.float32) for k in state_names(optimizer)}}


def step(given_inputs: dict, *, rows: int, optimizer: OptimizerConfig, lr: float, slices: list[tuple[int, int]],
         trainable: int | None = None, scratch: Scratch | None = None) -> tuple[bool, np.ndarray, dict, np.ndarray]:
    size = given_inputs["weights"].size
    out = np.full(size, np.nan, dtype=np.float32)
    state_out = {k: np.full(size, np.nan, dtype=np.float32) for k in given_inputs["state_in"]}
    digests = np.zeros((block_count(size), DIGEST_BYTES), dtype=np.uint8)
    finite = True
    for lo, hi in slices:
        finite = reduce_and_step(grads=given_inputs["grads"], rows=rows, weights=given_inputs["weights"],
                                 state_in=given_inputs["state_in"], weights_out=out, state_out=state_out, lo=lo, hi=hi,
                                 optimizer=optimizer, step=3, lr=lr, digests=digests, trainable=trainable,
                                 scratch=scratch) and finite
    return finite, out, state_out, digests


@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 300), tasks=st.integers(1, 6), rows=st.integers(1, 10**6),
       lr=st.floats(1e-4, 1.0))
def test_the_mean_gradient_step_is_the_float32_sum_in_task_order_and_near_the_float64_one(
        seed: int, size: int, tasks: int, rows: int, lr: float) -> None:
    sgd = OptimizerConfig(name="sgd", lr=lr)
    data = inputs(seed, size, tasks, sgd)
    finite, out, _, _ = step(data, rows=rows, optimizer=sgd, lr=lr, slices=[(0, size)])
    assert finite
    total = data["grads"][0].copy()
    for grad in data["grads"][1:]:  # float32, added in the list's (task) order, as the reduction promises
        total = np.add(total, grad, dtype=np.float32)
    mean = np.divide(total, np.float32(rows), dtype=np.float32)
    expected = np.subtract(data["weights"], np.multiply(mean, np.float32(lr), dtype=np.float32), dtype=np.float32)
    assert out.tobytes() == expected.tobytes()
    reference = data["weights"].astype(np.float64) - lr * np.sum([g.astype(np.float64) for g in data["grads"]],
                                                                  axis=0) / rows
    np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-6)


def test_the_sum_follows_the_list_order_not_a_sorted_one() -> None:
    """float32 addition is not associative: (big + -big) + tiny differs from big + (-big + tiny). The reduction
    adds the gradients in the order given (the task order), so the two orders give their own bits."""
    sgd = OptimizerConfig(name="sgd", lr=1.0)
    big, tiny = np.float32(1e8), np.float32(1.0)
    weights = np.zeros(1, dtype=np.float32)
    results = []
    for grads in ([big, -big, tiny], [tiny, big, -big]):
        data = {"grads": [np.array([g], dtype=np.float32) for g in grads], "weights": weights, "state_in": {}}
        results.append(step(data, rows=1, optimizer=sgd, lr=1.0, slices=[(0, 1)])[1][0])
    assert results == [np.float32(-1.0), np.float32(0.0)]


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("participants", [2, 3])
def test_any_slicing_into_blocks_gives_the_bits_of_the_whole_step(name: str, participants: int) -> None:
    optimizer = OptimizerConfig(name=name, lr=0.01, momentum=0.9 if name == "sgd" else 0.0, weight_decay=0.01)
    size = 3 * CHUNK + 1234
    data = inputs(5, size, 3, optimizer)
    whole = step(data, rows=77, optimizer=optimizer, lr=0.01, slices=[(0, size)])
    sliced = step(data, rows=77, optimizer=optimizer, lr=0.01, slices=step_slices(size, participants, CHUNK),
                  scratch=Scratch())
    assert len(step_slices(size, participants, CHUNK)) == participants
    assert whole[0] and sliced[0]
    assert whole[1].tobytes() == sliced[1].tobytes()
    assert all(whole[2][k].tobytes() == sliced[2][k].tobytes() for k in whole[2])
    assert whole[3].tobytes() == sliced[3].tobytes()
    assert bytes(whole[3][1]) == block_digest(whole[1][CHUNK:2 * CHUNK]), "each block's digest, of its bytes"


def test_the_optimizer_step_is_apply_update_on_the_mean() -> None:
    adam = OptimizerConfig(name="adam", lr=0.01)
    size = 1000
    data = inputs(9, size, 2, adam)
    _, out, state_out, _ = step(data, rows=10, optimizer=adam, lr=0.01, slices=[(0, size)])
    mean = np.add(*data["grads"], dtype=np.float32) / np.float32(10)
    expected, expected_state = np.empty(size, np.float32), {k: np.empty(size, np.float32) for k in ("m", "v")}
    apply_update(adam, 3, 0.01, data["weights"], mean, data["state_in"], expected, expected_state)
    assert out.tobytes() == expected.tobytes()
    assert all(state_out[k].tobytes() == expected_state[k].tobytes() for k in ("m", "v"))


def test_buffers_past_trainable_get_the_mean_added_and_no_optimizer() -> None:
    adam = OptimizerConfig(name="adam", lr=0.5)
    data = inputs(3, 10, 2, adam)
    _, out, _, _ = step(data, rows=4, optimizer=adam, lr=0.5, slices=[(0, 10)], trainable=6)
    mean = np.add(*data["grads"], dtype=np.float32) / np.float32(4)
    assert out[6:].tobytes() == (data["weights"][6:] + mean[6:]).tobytes()


def test_a_non_finite_gradient_is_reported_and_a_slice_off_a_block_boundary_refused() -> None:
    sgd = OptimizerConfig(name="sgd", lr=0.1)
    data = inputs(1, 50, 2, sgd)
    data["grads"][1][7] = np.inf
    with warnings.catch_warnings():  # reported by the result, not by a RuntimeWarning on the user's console
        warnings.simplefilter("error")
        assert step(data, rows=2, optimizer=sgd, lr=0.1, slices=[(0, 50)])[0] is False
    with pytest.raises(ValueError, match="checksum block boundary"):
        step(inputs(1, 50, 1, sgd), rows=1, optimizer=sgd, lr=0.1, slices=[(3, 50)])
