"""Golden final weights of every mode and placement: the training core's results, pinned bit for bit.

These checksums were RECORDED FROM THE OLD CODE (commit 30339bc, before the training core was reorganised
into schedules and engines: issue 26), not derived from first principles: they are goldens of that code,
and a refactoring of memtrain/train/ that is meant to change no result must keep every one of them. A
change that is meant to change results (a new reduction order, a new optimizer formula) changes them on
purpose and says so in its commit.

Each run is a tiny job (a few hundred rows, two epochs) through the CLI, in this process: synchronous with
1, 2 and 4 workers and in the server; fixed staleness in the rounds and streamed; async mode at the desk
(one worker: its arrival order is the plan's, so the run is reproducible) and streamed to the server; the
replays of both async runs; the cluster on ``local:2``; the additive models (ridge, naive Bayes); a torch
module with dropout and batch norm (seeded randomness, buffers) synchronous and async. The ``*-server-threads``
runs (the server alone computing each update's tasks on 2 threads, train/loops/threads.py) pin the server alone's
goldens: the threads change no bit.

The old code had one data order: each epoch the same contiguous batches, visited in a seeded order, which is
``train.shuffle = "batches"`` since row-level shuffling (issue 27) made ``"rows"`` the default. Those runs pin
``shuffle = "batches"`` (``JOB`` puts it in), so their goldens are still the old code's, bit for bit. The
``rows-*`` runs train with ``train.shuffle = "rows"`` (windows of 64 rows, so the block order and the windows
both matter): their goldens were RECORDED FROM THE CODE THAT ADDED ROW SHUFFLING (branch ``shuffle``), and
pin that every placement gives the same bits with shuffled rows too: 1, 2 and 4 workers, the server alone,
streamed fixed staleness, async at the desk and in the server and a replay, the cluster.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import threadpoolctl
from tiny_data import blobs, write_dataset

from memtrain.cli import main
from memtrain.layout import weight_versions, weights_path

pytestmark = pytest.mark.timeout(300)

JOB = """
[data]
path = "{data}"

[model]
{model}

[train]
epochs = 2
batch_size = 60
tasks_per_update = 3
optimizer = "adam"
lr = 0.01
seed = 11
workers = {workers}
task_timeout = 60
{train}

[run]
dir = "run"
keep_versions = 2
"""
MLP = 'kind = "mlp"\nhidden = [8]'
TORCH = 'kind = "torch"\nfactory = "torch_nets:bn_dropout"\nhidden = 8'
STALE = "staleness = 2"
STALE_STREAM = 'staleness = 2\nstaleness_in = "stream"'
ASYNC = 'mode = "async"\nmax_staleness = 3\nasync_group = 2'
ROWS = 'shuffle = "rows"\nshuffle_window = 64'
THREADS = "server_threads = 2"  # the server's task threads (train/loops/threads.py): the goldens of the server alone
BATCHES = 'shuffle = "batches"'  # the old code's order: JOB pins it wherever a run's keys name no shuffle

# name: (model, workers, [train] keys, extra CLI arguments) -> the sha256 of the final weight file's bytes
RUNS = {
    "sync-1": (MLP, 1, "", ()),
    "sync-2": (MLP, 2, "", ()),
    "sync-4": (MLP, 4, "", ()),
    "sync-server": (MLP, 0, "", ()),
    "sync-server-threads": (MLP, 0, THREADS, ()),
    "staleness-rounds": (MLP, 2, STALE, ()),
    "staleness-stream": (MLP, 2, STALE_STREAM, ()),
    "staleness-stream-server": (MLP, 0, STALE_STREAM, ()),
    "async-desk": (MLP, 1, ASYNC, ()),
    "async-server": (MLP, 0, ASYNC, ()),
    "cluster-local-2": (MLP, 2, "", ("--cluster", "local:2")),
    "ridge": ('kind = "ridge"', 2, "", ()),
    "naive-bayes": ('kind = "naive_bayes"', 2, "", ()),
    "torch-sync": (TORCH, 2, "", ()),
    "torch-async-server": (TORCH, 0, ASYNC, ()),
    "rows-sync-1": (MLP, 1, ROWS, ()),
    "rows-sync-2": (MLP, 2, ROWS, ()),
    "rows-sync-4": (MLP, 4, ROWS, ()),
    "rows-sync-server": (MLP, 0, ROWS, ()),
    "rows-sync-server-threads": (MLP, 0, f"{ROWS}\n{THREADS}", ()),
    "rows-staleness-stream": (MLP, 2, f"{ROWS}\n{STALE_STREAM}", ()),
    "rows-async-desk": (MLP, 1, f"{ROWS}\n{ASYNC}", ()),
    "rows-async-server": (MLP, 0, f"{ROWS}\n{ASYNC}", ()),
    "rows-cluster-local-2": (MLP, 2, ROWS, ("--cluster", "local:2")),
}
GOLDEN = {  # recorded from 30339bc (the old code); see the module docstring
    "sync-1": "5368574a68cf5ab261a0e5f65fd34db52a1afd0fb01fd6e08f969ad9e7fbf982",
    "sync-2": "5368574a68cf5ab261a0e5f65fd34db52a1afd0fb01fd6e08f969ad9e7fbf982",
    "sync-4": "5368574a68cf5ab261a0e5f65fd34db52a1afd0fb01fd6e08f969ad9e7fbf982",
    "sync-server": "5368574a68cf5ab261a0e5f65fd34db52a1afd0fb01fd6e08f969ad9e7fbf982",
    "sync-server-threads": "5368574a68cf5ab261a0e5f65fd34db52a1afd0fb01fd6e08f969ad9e7fbf982",
    "staleness-rounds": "191ccaa4140fb3b1704296c63e4b2729a367337a2029288abeb72f4f0d4e8c6e",
    "staleness-stream": "191ccaa4140fb3b1704296c63e4b2729a367337a2029288abeb72f4f0d4e8c6e",
    "staleness-stream-server": "191ccaa4140fb3b1704296c63e4b2729a367337a2029288abeb72f4f0d4e8c6e",
    "async-desk": "cfefc6e9c619e045983a57343441ff2b88558c4088ac63f296a26ab65db04db2",
    "async-server": "d1c2b8d08a5d1603b372a057f3d223097a48a25632b5da0f9160a98249d571af",
    "cluster-local-2": "5368574a68cf5ab261a0e5f65fd34db52a1afd0fb01fd6e08f969ad9e7fbf982",
    "ridge": "0b24e6ded5ee229027900a7993beaa6bb9e57469b554f94ba382c69c97bc2277",
    "naive-bayes": "e8bd750156775d0a15350884fac7a1d8873b473030c25969db7881394e0bf170",
    "torch-sync": "f8d431dfce60433c1eea3c9bf5c9f3631ac751f70b093295c4fccb4ae8640538",
    "torch-async-server": "bc514957f687606d66ff53e126ff79232e2ac6118a722936d8b0c71890682534",
    "replay-async-desk": "cfefc6e9c619e045983a57343441ff2b88558c4088ac63f296a26ab65db04db2",
    "replay-async-server": "d1c2b8d08a5d1603b372a057f3d223097a48a25632b5da0f9160a98249d571af",
    # train.shuffle = "rows": recorded from the code that added it (see the module docstring)
    "rows-sync-1": "86b7fdcddaf60296bf9c29a8d69db66c1c58dc19830408189ded7365ebfb2465",
    "rows-sync-2": "86b7fdcddaf60296bf9c29a8d69db66c1c58dc19830408189ded7365ebfb2465",
    "rows-sync-4": "86b7fdcddaf60296bf9c29a8d69db66c1c58dc19830408189ded7365ebfb2465",
    "rows-sync-server": "86b7fdcddaf60296bf9c29a8d69db66c1c58dc19830408189ded7365ebfb2465",
    "rows-sync-server-threads": "86b7fdcddaf60296bf9c29a8d69db66c1c58dc19830408189ded7365ebfb2465",
    "rows-staleness-stream": "71998ae69b177f5987beda3a5ab644e51fd9f9f1b29ea366b2c62ad07eace813",
    "rows-async-desk": "a11b603aa28e3c06ce66ef5967ac9a28d710707691b382c30f034f3ed0088b68",
    "rows-async-server": "fedf9325db936be353ca5f7b5bb2b28383c3f74354bd06f28e2b5c45bea117dc",
    "rows-cluster-local-2": "86b7fdcddaf60296bf9c29a8d69db66c1c58dc19830408189ded7365ebfb2465",
    "replay-rows-async-server": "fedf9325db936be353ca5f7b5bb2b28383c3f74354bd06f28e2b5c45bea117dc",
}
# the sha256 of each run's lineage.jsonl, recorded from 30339bc too: the on-disk record of every update
# (rows, versions read, learning rates, checksums; the additive models' one line) is byte for byte the old one
LINEAGE = {
    "sync-1": "336433027da5b83a29007850ae55cf8a902fff38d07fa550eb85bb39d99060ce",
    "sync-2": "336433027da5b83a29007850ae55cf8a902fff38d07fa550eb85bb39d99060ce",
    "sync-4": "336433027da5b83a29007850ae55cf8a902fff38d07fa550eb85bb39d99060ce",
    "sync-server": "336433027da5b83a29007850ae55cf8a902fff38d07fa550eb85bb39d99060ce",
    "sync-server-threads": "336433027da5b83a29007850ae55cf8a902fff38d07fa550eb85bb39d99060ce",
    "staleness-rounds": "06ac95b3a2ced051aed88a6ebedca0c552b87bdefd63eb519362fef148606ed1",
    "staleness-stream": "06ac95b3a2ced051aed88a6ebedca0c552b87bdefd63eb519362fef148606ed1",
    "staleness-stream-server": "06ac95b3a2ced051aed88a6ebedca0c552b87bdefd63eb519362fef148606ed1",
    "async-desk": "943ddbb00e1fc86042577c82efa8fc68db23bcab882f75dc3109178340812dd9",
    "async-server": "25af92c2f8f1f6238fb38a8c686541639b7d97143352ea64f173847298130f90",
    "cluster-local-2": "336433027da5b83a29007850ae55cf8a902fff38d07fa550eb85bb39d99060ce",
    "ridge": "f1eeafe363b6e717f9193ce028e5b486590d7d6cdd60b33c8859fa1b0ca7e2db",
    "naive-bayes": "f2c3f14ad8e448aca8c57bceedd8fe8495a8f55af4da0750cdde22f66ad7de0b",
    "torch-sync": "98768aabe795f8da7bb38af70f8e3c8a47ad129327a225ebc0becd4ff72e25c5",
    "torch-async-server": "683a5a9af6bf72545d441ccd158c29de9ae77a4aeb4289ec7a1fed807259b64d",
    # train.shuffle = "rows" (its records name positions of each epoch's row order: docs/formats.md)
    "rows-sync-1": "c5697a9974615f3b11052d7f1c3de686167823d4c3ccb10f1f990e1d6f1bb67f",
    "rows-sync-2": "c5697a9974615f3b11052d7f1c3de686167823d4c3ccb10f1f990e1d6f1bb67f",
    "rows-sync-4": "c5697a9974615f3b11052d7f1c3de686167823d4c3ccb10f1f990e1d6f1bb67f",
    "rows-sync-server": "c5697a9974615f3b11052d7f1c3de686167823d4c3ccb10f1f990e1d6f1bb67f",
    "rows-sync-server-threads": "c5697a9974615f3b11052d7f1c3de686167823d4c3ccb10f1f990e1d6f1bb67f",
    "rows-staleness-stream": "27a1ed114607525ef096459579dd5c70267eca18f339ff3884b6e2b69cd888bf",
    "rows-async-desk": "e56e860e49de91753bc76ac46ac45d344a242e371e83f70b4416bac2b7390c58",
    "rows-async-server": "9486d4e350fe60b46af8b4fc9982af4082524ad7feb0ef81846f43c1d98273fd",
    "rows-cluster-local-2": "c5697a9974615f3b11052d7f1c3de686167823d4c3ccb10f1f990e1d6f1bb67f",
}
# The numpy models' bits depend on the matrix-product kernel OpenBLAS picks for the processor: its AVX-512
# kernel ("SkylakeX") rounds a product's partial sums differently from its AVX2 one ("Haswell"), so one job
# gives other bits on another kernel (every placement still agrees with every other on each kernel). GOLDEN
# and LINEAGE above are the "Haswell" kernel's (where they were recorded). The "SkylakeX" ones were RECORDED
# FROM ff71786 on an AMD EPYC with AVX-512 (that commit keeps every "Haswell" golden, checked there with
# OPENBLAS_CORETYPE=Haswell): only the runs that differ are listed; ridge, naive Bayes and torch (whose
# products are torch's own) are the same on both. A kernel with no table fails: record it from a commit
# that keeps the known kernels' goldens.
KERNELS = {
    "Haswell": ({}, {}),
    "SkylakeX": ({
        "sync-1": "de9dcf27292f57e9b5016824d645904020fc96345be45ba692a92de899617616",
        "sync-2": "de9dcf27292f57e9b5016824d645904020fc96345be45ba692a92de899617616",
        "sync-4": "de9dcf27292f57e9b5016824d645904020fc96345be45ba692a92de899617616",
        "sync-server": "de9dcf27292f57e9b5016824d645904020fc96345be45ba692a92de899617616",
        "sync-server-threads": "de9dcf27292f57e9b5016824d645904020fc96345be45ba692a92de899617616",
        "staleness-rounds": "b9f5f06e19e583fc591c4cb4b596c0ee4654fb3a62ca029af737f3643c7e59cd",
        "staleness-stream": "b9f5f06e19e583fc591c4cb4b596c0ee4654fb3a62ca029af737f3643c7e59cd",
        "staleness-stream-server": "b9f5f06e19e583fc591c4cb4b596c0ee4654fb3a62ca029af737f3643c7e59cd",
        "async-desk": "afa092d9ad665cc48aa477f9931288d7b1bfa4751f59c7b3c9b5216a832b17c5",
        "async-server": "6d29ed533d0d561f6d87dedb97911665aa84c04fcab41a61d87334c881859c5a",
        "cluster-local-2": "de9dcf27292f57e9b5016824d645904020fc96345be45ba692a92de899617616",
        "rows-sync-1": "52d669c220870c4398aa807552b78adb276bf2d2e6edaafae4ea3ee91e958c43",
        "rows-sync-2": "52d669c220870c4398aa807552b78adb276bf2d2e6edaafae4ea3ee91e958c43",
        "rows-sync-4": "52d669c220870c4398aa807552b78adb276bf2d2e6edaafae4ea3ee91e958c43",
        "rows-sync-server": "52d669c220870c4398aa807552b78adb276bf2d2e6edaafae4ea3ee91e958c43",
        "rows-sync-server-threads": "52d669c220870c4398aa807552b78adb276bf2d2e6edaafae4ea3ee91e958c43",
        "rows-staleness-stream": "78c60e400f446748a0632767bd896ac30774dd08dd94aa94956dd6f455703e23",
        "rows-async-desk": "d7f56c8edb5930992d0fb2bee8132a905251c74d42287de92ea8a67398c7e1db",
        "rows-async-server": "73cafd758b74fa48f7250c49c4f7b10ec32fecdbebf852c6093d3d14fc623bdd",
        "rows-cluster-local-2": "52d669c220870c4398aa807552b78adb276bf2d2e6edaafae4ea3ee91e958c43",
        "replay-async-desk": "afa092d9ad665cc48aa477f9931288d7b1bfa4751f59c7b3c9b5216a832b17c5",
        "replay-async-server": "6d29ed533d0d561f6d87dedb97911665aa84c04fcab41a61d87334c881859c5a",
        "replay-rows-async-server": "73cafd758b74fa48f7250c49c4f7b10ec32fecdbebf852c6093d3d14fc623bdd",
    }, {
        "sync-1": "09d1fa037ba19b81ac1857715054d92571851467c8a9361f0c6a2364d8a84551",
        "sync-2": "09d1fa037ba19b81ac1857715054d92571851467c8a9361f0c6a2364d8a84551",
        "sync-4": "09d1fa037ba19b81ac1857715054d92571851467c8a9361f0c6a2364d8a84551",
        "sync-server": "09d1fa037ba19b81ac1857715054d92571851467c8a9361f0c6a2364d8a84551",
        "sync-server-threads": "09d1fa037ba19b81ac1857715054d92571851467c8a9361f0c6a2364d8a84551",
        "staleness-rounds": "1e16421311108e7a92a50f944c9a19d40e2f957203b552c28ecb910d22416dc8",
        "staleness-stream": "1e16421311108e7a92a50f944c9a19d40e2f957203b552c28ecb910d22416dc8",
        "staleness-stream-server": "1e16421311108e7a92a50f944c9a19d40e2f957203b552c28ecb910d22416dc8",
        "async-desk": "4a1ea4de9de10227b1a00f311b31ce9a34fd1e71678b8d80317d638af3ff8ab3",
        "async-server": "6bb7ce74f51cf5c0beaa0db6d423cf682153c3eee33bca0b4f38010457b97109",
        "cluster-local-2": "09d1fa037ba19b81ac1857715054d92571851467c8a9361f0c6a2364d8a84551",
        "rows-sync-1": "5725a31e95a867e21721f6096264d99223581931336129f00871676e122fc261",
        "rows-sync-2": "5725a31e95a867e21721f6096264d99223581931336129f00871676e122fc261",
        "rows-sync-4": "5725a31e95a867e21721f6096264d99223581931336129f00871676e122fc261",
        "rows-sync-server": "5725a31e95a867e21721f6096264d99223581931336129f00871676e122fc261",
        "rows-sync-server-threads": "5725a31e95a867e21721f6096264d99223581931336129f00871676e122fc261",
        "rows-staleness-stream": "36ac89ea3a69df138aa05702f1bd5998d8d9c4c5223ee28463bd0e26420665d2",
        "rows-async-desk": "e60daf6b9ce7b9000043bb192c0355dac9ee3beac8d1070c47d76261ad7f4ef4",
        "rows-async-server": "ff387d6219157f29ba99d69858e32727d5359db59d9b2c868b5bf4a232d87cb8",
        "rows-cluster-local-2": "5725a31e95a867e21721f6096264d99223581931336129f00871676e122fc261",
    }),
}


def blas_kernel() -> str:
    """The kernel numpy's OpenBLAS uses here (threadpoolctl reads it from the loaded library)."""
    kernels = {info.get("architecture") for info in threadpoolctl.threadpool_info()
               if info.get("internal_api") == "openblas" and "numpy" in info.get("filepath", "")}
    if len(kernels) != 1:
        pytest.fail(f"expected one OpenBLAS kernel loaded by numpy, found {sorted(map(str, kernels))}")
    return kernels.pop()


def goldens() -> tuple[dict[str, str], dict[str, str]]:
    """GOLDEN and LINEAGE for this machine's BLAS kernel."""
    kernel = blas_kernel()
    if kernel not in KERNELS:
        pytest.fail(f"no goldens are recorded for OpenBLAS's {kernel!r} kernel (known: {sorted(KERNELS)}); "
                    "record them from a commit that keeps the known kernels' goldens")
    weights, lineage = KERNELS[kernel]
    return {**GOLDEN, **weights}, {**LINEAGE, **lineage}


# what events.log says of where each run computed and stepped: the golden is of the placement named
PLACED = {
    "sync-1": "rounds: on 1 worker processes", "sync-2": "rounds: on 2 worker processes",
    "sync-4": "rounds: on 4 worker processes", "sync-server": "rounds: in the server",
    "sync-server-threads": "an update's tasks on 2 threads",
    "staleness-rounds": "fixed staleness 2: in the rounds",
    "staleness-stream": "fixed staleness 2: gradients on 2 worker processes, the steps in the server",
    "staleness-stream-server": "fixed staleness 2: gradients in the server",
    "async-desk": "gradients and steps on 1 worker processes, at the desk",
    "async-server": "async_group 2): gradients in the server",
    "cluster-local-2": "the gradients streamed to 2 Dask workers",
    "ridge": "", "naive-bayes": "", "torch-sync": "rounds: on 2 worker processes",
    "torch-async-server": "async_group 2): gradients in the server",
    "replay-async-desk": "replay: gradients on 2 worker processes, the steps in the server",
    "replay-async-server": "replay: gradients in the server",
    "rows-sync-1": "rounds: on 1 worker processes", "rows-sync-2": "rounds: on 2 worker processes",
    "rows-sync-4": "rounds: on 4 worker processes", "rows-sync-server": "rounds: in the server",
    "rows-sync-server-threads": "an update's tasks on 2 threads",
    "rows-staleness-stream": "fixed staleness 2: gradients on 2 worker processes, the steps in the server",
    "rows-async-desk": "gradients and steps on 1 worker processes, at the desk",
    "rows-async-server": "async_group 2): gradients in the server",
    "rows-cluster-local-2": "the gradients streamed to 2 Dask workers",
    "replay-rows-async-server": "replay: gradients on 2 worker processes, the steps in the server",
}
# name of the replay: (the run it replays, --workers of the replay)
REPLAYS = {"replay-async-desk": ("async-desk", 2), "replay-async-server": ("async-server", 0),
           "replay-rows-async-server": ("rows-async-server", 2)}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=400, features=6, classes=3, seed=2)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=100)


@pytest.fixture(scope="module")
def runs(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every run of RUNS, made once for the module (the replays need theirs)."""
    made = {}
    for name, (model, workers, train, args) in RUNS.items():
        folder = tmp_path_factory.mktemp(name)
        job = folder / "job.toml"
        train = train if "shuffle" in train else f"{BATCHES}\n{train}"
        job.write_text(JOB.format(data=data, model=model, workers=workers, train=train))
        assert main(["train", str(job), "--quiet", *args]) == 0, name
        made[name] = folder / "run"
    return made


def digest(run: Path) -> str:
    final = np.load(weights_path(run, weight_versions(run)[-1]), allow_pickle=False)
    return hashlib.sha256(final.tobytes()).hexdigest()


@pytest.mark.parametrize("name", list(RUNS))
def test_final_weights_are_the_golden_ones(runs: dict[str, Path], name: str) -> None:
    assert PLACED[name] in (runs[name] / "events.log").read_text()
    golden, lineage = goldens()
    assert digest(runs[name]) == golden[name]
    assert hashlib.sha256((runs[name] / "lineage.jsonl").read_bytes()).hexdigest() == lineage[name]


@pytest.mark.parametrize("name", list(REPLAYS))
def test_replays_give_the_golden_weights(runs: dict[str, Path], tmp_path: Path, name: str) -> None:
    source, workers = REPLAYS[name]
    assert main(["train", "--replay", str(runs[source]), "--run-dir", str(tmp_path / "replay"),
                 "--workers", str(workers), "--quiet"]) == 0
    assert PLACED[name] in (tmp_path / "replay" / "events.log").read_text()
    golden, _ = goldens()
    assert digest(tmp_path / "replay") == golden[name] == golden[source]
