"""Parameter counts -> time per gradient task of each way to bind a torch module to mapped files (a table).

``python -m benchmarks.torch_binding [--sizes 1e5,1e6] [--rows 256] [--repeats 15]``

The benchmark MLP (features -> hidden -> classes, torch.nn.Linear + ReLU) computes the summed
cross-entropy gradient of ``rows`` rows, as a worker does: weights read from a read-only map of a
``.npy`` file, the gradient written into a mapped buffer, one thread. The variants (models/torch_bind.py)
run interleaved, each ``calls`` times per round; the table gives the best and the median round (wall
clock) and the lowest CPU time of a round (process time: what a call cost, not counting the time other
processes took the core -- the steadier figure on a shared machine). The last row is the same
computation on the module's own private parameters: the floor, no binding.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from memtrain.benchmarks.synthetic import CLASSES, FEATURES, mlp_shape
from memtrain.files import publish_array
from memtrain.models.torch_bind import BINDINGS, CHOSEN
from memtrain.models.torch_module import module_slots, pin_process
from memtrain.train.loops.maps import MapCache
from memtrain.train.worker.worker import keep_freed_memory


def torch_mlp(features: int, hidden: int, classes: int):  # noqa: ANN201 - a torch.nn.Module
    from torch import nn

    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def bench_size(params: int, rows: int, repeats: int, calls: int,
               scratch: Path) -> dict[str, tuple[float, float, float]]:
    import torch
    import torch.nn.functional as F

    shape = mlp_shape(params)
    torch.manual_seed(0)
    module = torch_mlp(shape.features, shape.hidden, shape.classes)
    slots = module_slots(module)
    flat = np.concatenate([t.detach().numpy().ravel() for _, t in slots.trained])
    publish_array(scratch / "w.npy", flat, durable=False)
    publish_array(scratch / "g.npy", np.zeros_like(flat), durable=False)
    maps = MapCache()
    weights = maps.get(scratch / "w.npy", flat.shape, np.float32)
    grad = maps.get(scratch / "g.npy", flat.shape, np.float32, "r+")
    views = _views(slots, weights), _views(slots, grad)
    generator = np.random.default_rng(0)
    x = torch.from_numpy(generator.standard_normal((rows, shape.features), dtype=np.float32))
    y = torch.from_numpy(generator.integers(0, shape.classes, rows))

    def loss_of(forward):  # noqa: ANN001, ANN202
        return F.cross_entropy(forward(x), y, reduction="sum")

    private = torch_mlp(shape.features, shape.hidden, shape.classes)  # the data variants unbind ``module``

    def floor() -> None:
        for param in private.parameters():
            param.grad = None
        loss_of(private).backward()

    runs = {name: (lambda b=binding: b.gradient(slots, views[0], views[1], loss_of, rows))
            for name, binding in BINDINGS.items()}
    runs["private parameters (floor)"] = floor
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started, used = time.perf_counter(), time.process_time()
            for _ in range(calls):
                run()
            times[name].append((time.perf_counter() - started) / calls)
            cpu[name].append((time.process_time() - used) / calls)
    return {name: (min(t), sorted(t)[len(t) // 2], min(cpu[name])) for name, t in times.items()}


def _views(slots, flat: np.ndarray) -> dict[str, np.ndarray]:  # noqa: ANN001 - torch_bind.Slots
    out, offset = {}, 0
    for name, tensor in slots.trained:
        out[name] = flat[offset:offset + tensor.numel()].reshape(tuple(tensor.shape))
        offset += tensor.numel()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.torch_binding", description=__doc__)
    parser.add_argument("--sizes", default="1e5,1e6")
    parser.add_argument("--rows", type=int, default=256, help="rows per task (default %(default)s: 512 / 2 workers)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)
    keep_freed_memory()  # as a worker does: no page faults for each task's fresh gradient
    pin_process(1)
    print(f"MLP {FEATURES}-H-{CLASSES}, {args.rows} rows per task, 1 thread; ms per task: best / median wall, "
          f"best CPU (process time), of {args.repeats} rounds of {args.calls}; the worker uses {CHOSEN!r}")
    with tempfile.TemporaryDirectory(prefix="memtrain-bind-") as scratch:
        for size in (int(float(s)) for s in args.sizes.split(",")):
            for name, (best, middle, cpu) in bench_size(size, args.rows, args.repeats, args.calls,
                                                        Path(scratch)).items():
                label = BINDINGS[name].name if name in BINDINGS else name
                print(f"{mlp_shape(size).params:>12,}  {label:<42} {best * 1e3:8.2f} {middle * 1e3:8.2f} "
                      f"{cpu * 1e3:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
