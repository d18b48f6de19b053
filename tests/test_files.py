"""Safe file primitives: .npy round trips and golden bytes, refusals of damaged or hostile files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from memtrain import files
from memtrain.errors import CorruptFileError, DiskFullError
from memtrain.files import (
    BLOCK_CHECKSUM_ALGO,
    CHECKSUM_BLOCK_BYTES,
    block_checksum,
    block_digest,
    checksum_file,
    npy_data_offset,
    open_npy,
    publish_array,
    read_jsonl,
    rename_new,
    verify_checksum,
    writing_npy,
)

DTYPES = st.sampled_from([np.float32, np.float64, np.int64, np.int32, np.uint8, np.float16, np.bool_])


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(array=hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)))
def test_publish_then_open_round_trips_and_numpy_reads_the_same(tmp_path: Path, array: np.ndarray) -> None:
    path = tmp_path / "a.npy"
    publish_array(path, array, durable=False)
    mapped = open_npy(path)
    assert mapped.dtype == array.dtype and mapped.shape == array.shape
    np.testing.assert_array_equal(mapped, array)
    np.testing.assert_array_equal(np.load(path, allow_pickle=False), array)
    assert not mapped.flags.writeable
    assert [p.name for p in tmp_path.iterdir()] == ["a.npy"], "a temporary file was left behind"


def test_golden_bytes_match_numpy_save(tmp_path: Path) -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    publish_array(tmp_path / "ours.npy", array, durable=True)
    np.save(tmp_path / "numpy.npy", array)
    assert (tmp_path / "ours.npy").read_bytes() == (tmp_path / "numpy.npy").read_bytes()
    assert checksum_file(tmp_path / "ours.npy") == "xxh3-128:" + __import__("xxhash").xxh3_128(
        (tmp_path / "numpy.npy").read_bytes()).hexdigest()


def test_writing_npy_publishes_only_on_success(tmp_path: Path) -> None:
    path = tmp_path / "g.npy"
    with pytest.raises(RuntimeError), writing_npy(path, (4,), np.float32, durable=False) as out:
        out[:] = 1
        raise RuntimeError("the producer failed")
    assert list(tmp_path.iterdir()) == []
    with writing_npy(path, (4,), np.float32, durable=False) as out:
        out[:] = 2
    np.testing.assert_array_equal(np.load(path), np.full(4, 2, np.float32))


def test_publishing_replaces_with_a_new_inode_so_readers_keep_their_bytes(tmp_path: Path) -> None:
    path = tmp_path / "w.npy"
    publish_array(path, np.zeros(1000, np.float32), durable=False)
    reader = open_npy(path)
    inode = os.stat(path).st_ino
    publish_array(path, np.ones(1000, np.float32), durable=False)
    assert os.stat(path).st_ino != inode
    assert float(reader.sum()) == 0.0  # the old mapping still reads the old version, never torn


@pytest.mark.parametrize(("damage", "message"), [
    (lambda raw: raw[:-3], "file is truncated"),
    (lambda raw: raw + b"\0", "file has trailing bytes"),
    (lambda raw: b"PK\3\4" + raw[4:], "not a .npy file"),
    (lambda raw: raw[:20], "unreadable .npy header"),
    (lambda raw: b"", "not a .npy file"),
])
def test_damaged_files_are_named_errors(tmp_path: Path, damage, message: str) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.arange(100, dtype=np.float64))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CorruptFileError, match=message) as info:
        open_npy(path)
    assert str(path) in str(info.value)


def test_a_huge_header_length_is_refused_before_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    path.write_bytes(b"\x93NUMPY\x02\x00" + ((4 << 30) - 1).to_bytes(4, "little") + b"{}")
    with pytest.raises(CorruptFileError, match="implausibly long"):
        open_npy(path)


def test_a_header_claiming_a_petabyte_is_refused_without_allocating(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.zeros(4, np.float32))
    raw = path.read_bytes()
    end = raw.index(b"\n") + 1
    header = raw[:end].replace(b"(4,)", b"(1000000000000000,)")
    path.write_bytes(header[:8] + (len(header) - 10).to_bytes(2, "little") + header[10:] + raw[end:])
    with pytest.raises(CorruptFileError, match="file is truncated"):
        open_npy(path)


def test_object_arrays_are_refused_and_never_unpickled(tmp_path: Path) -> None:
    sentinel = tmp_path / "ran"
    path = tmp_path / "evil.npy"
    np.save(path, np.array([_Payload(str(sentinel))], dtype=object), allow_pickle=True)
    with pytest.raises(CorruptFileError, match="holds Python objects"):
        open_npy(path)
    assert not sentinel.exists()


class _Payload:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_full_disk_is_a_clear_error_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MEMTRAIN_FAULT", "write:1")
    monkeypatch.setenv("MEMTRAIN_FAULT_ACTION", "raise")
    with pytest.raises(DiskFullError, match="no space left"):
        publish_array(tmp_path / "a.npy", np.zeros(10), durable=True)
    assert list(tmp_path.iterdir()) == []


def test_jsonl_reader_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(0, 5 * CHECKSUM_BLOCK_BYTES // 4), cut=st.integers(0, 5), seed=st.integers(0, 2**16),
       flip=st.integers(0, 2**31))
def test_block_checksum_is_one_value_however_the_blocks_are_shared(tmp_path: Path, size: int, cut: int, seed: int,
                                                                   flip: int) -> None:
    """Streamed, mapped, and assembled from two writers' digests (any block boundary): the same value.

    One changed byte anywhere, header or data, changes it.
    """
    array = np.random.default_rng(seed).standard_normal(size).astype(np.float32)
    path = tmp_path / "w.npy"
    np.save(path, array)
    raw = path.read_bytes()
    offset = npy_data_offset(raw)
    per_block = CHECKSUM_BLOCK_BYTES // 4
    blocks = [array[a:a + per_block] for a in range(0, size, per_block)]
    first, second = blocks[:cut], blocks[cut:]  # two slice owners, each hashing its own blocks
    assembled = block_checksum(raw[:offset], b"".join(map(block_digest, first)) + b"".join(map(block_digest, second)))
    streamed = checksum_file(path, algo=BLOCK_CHECKSUM_ALGO)
    assert streamed == checksum_file(path, algo=BLOCK_CHECKSUM_ALGO, mapped=True) == assembled
    verify_checksum(path, streamed)
    damaged = bytearray(raw)
    damaged[flip % len(raw)] ^= 0x01
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        verify_checksum(path, streamed)


@pytest.mark.parametrize("head", [b"", b"not a numpy file at all", b"\x93NUMPY\x09\x00\xff\xff" + b" " * 8,
                                  b"\x93NUMPY\x02\x00\xff\xff\xff\x7f" + b" " * 8])
def test_block_checksum_of_a_damaged_header_is_a_value_not_an_exception(tmp_path: Path, head: bytes) -> None:
    path = tmp_path / "bad.npy"
    path.write_bytes(head + b"\x00" * 1000)
    assert npy_data_offset(head) == 0
    assert checksum_file(path, algo=BLOCK_CHECKSUM_ALGO).startswith("xxh3-128-blocks:")


@pytest.mark.parametrize("one_call", [True, False], ids=["renameat2", "link-and-unlink"])
def test_rename_new_renames_and_never_replaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               one_call: bool) -> None:
    if not one_call:  # a kernel or filesystem without RENAME_NOREPLACE: the fallback must behave the same
        monkeypatch.setattr(files, "_renameat2", lambda: None)
    src, dst, taken = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    src.write_bytes(b"new")
    taken.write_bytes(b"published")
    inode = os.stat(src).st_ino
    with pytest.raises(FileExistsError):
        rename_new(src, taken)
    assert taken.read_bytes() == b"published" and src.read_bytes() == b"new"
    rename_new(src, dst)
    assert not src.exists() and dst.read_bytes() == b"new" and os.stat(dst).st_ino == inode
    assert os.stat(dst).st_nlink == 1
    with pytest.raises(FileNotFoundError):
        rename_new(tmp_path / "missing", tmp_path / "d")


@pytest.mark.parametrize("durable", [False, True])
def test_publish_new_keeps_the_first_of_several_writers(tmp_path: Path, durable: bool) -> None:
    """``publish_new``: the first writer's bytes stay at the name; a second is dropped (False), no temporary
    file is left by either."""
    path = tmp_path / "w-0123456789ab-00000004-all.json"
    assert files.publish_new(path, lambda handle: handle.write(b"first"), durable=durable)
    inode = os.stat(path).st_ino
    assert not files.publish_new(path, lambda handle: handle.write(b"second"), durable=durable)
    assert path.read_bytes() == b"first" and os.stat(path).st_ino == inode
    assert os.listdir(tmp_path) == [path.name]


def test_the_log_encoders_made_once_write_json_dumps_text() -> None:
    """files.JSON_LINE and files.CANONICAL_JSON are C encoders built once (json.dumps builds one per value): the text
    is json.dumps' with the same options, for nested values, NaN and infinities, float subclasses, non-ASCII, int keys
    and a bare string; a value JSON cannot hold is refused with json.dumps' TypeError."""
    import json

    values = [{"a": 1, "b": [1.5, None, True], "é": "ü\n", 3: "x"}, "é\t", 5, -0.0, None, [], {},
              {"f": np.float64(0.1), "n": float("nan"), "i": float("-inf"), "z": {"y": [[1, 2], {"k": 1e300}]}},
              {"version": 7, "tasks": [[0, 64], [64, 128]], "lr": 0.003, "checksum": "xxh3-128-blocks:00ff"}]
    for value in values:
        assert files.JSON_LINE(value) == json.dumps(value)
        if not (isinstance(value, dict) and 3 in value):  # mixed keys cannot be sorted, by either
            assert files.CANONICAL_JSON(value) == json.dumps(value, sort_keys=True, separators=(",", ":"))
    for bad in ({"a": object()}, {"a": np.int64(3)}):
        with pytest.raises(TypeError, match="is not JSON serializable"):
            files.JSON_LINE(bad)
