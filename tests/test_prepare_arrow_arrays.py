"""arrow_arrays reads Arrow columns from their buffers: the same values and nulls as pyarrow's to_numpy."""

from __future__ import annotations

import numpy as np
import pytest

from memtrain.prepare import arrow_arrays

pa = pytest.importorskip("pyarrow")


def test_values_and_nulls_of_slices_and_chunks_match_to_numpy():
    rng = np.random.default_rng(0)
    numbers = rng.normal(size=300)
    valid = rng.random(300) > 0.3
    array = pa.array(numbers, mask=~valid)
    # offsets that are not whole bytes of the validity bitmap, and a column of several chunks
    for column in (array, array.slice(3, 250), array.slice(13, 0), pa.chunked_array([array.slice(5, 40),
                                                                                  array.slice(77, 101)])):
        expected = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
        gone = arrow_arrays.nulls(column)
        assert gone.dtype == bool and gone.shape == expected.shape
        np.testing.assert_array_equal(gone, np.isnan(expected))
        np.testing.assert_array_equal(arrow_arrays.values(column, np.float64)[~gone], expected[~gone])
    whole = pa.array(numbers)
    assert not arrow_arrays.nulls(whole).any()
    view = arrow_arrays.values(whole.slice(7, 9), np.float64)
    np.testing.assert_array_equal(view, numbers[7:16])
    assert np.shares_memory(view, numbers)  # a view of Arrow's buffer (here numpy's own), no copy


def test_integers_strings_and_a_wrong_width():
    indices = pa.array(["b", "a", "b", "c"]).dictionary_encode().indices
    np.testing.assert_array_equal(arrow_arrays.values(indices, np.int32), [0, 1, 0, 2])
    words = pa.chunked_array([pa.array(["x", None]), pa.array(["yz"])])
    assert arrow_arrays.strings(words).tolist() == ["x", "", "yz"]
    with pytest.raises(TypeError, match="int32"):
        arrow_arrays.values(indices, np.float64)
