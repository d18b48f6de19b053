"""Gradient buffers of one update -> the next weight version: sum in task order, mean, optimizer step.

Run by each participant of a round on its slice [lo, hi) of the parameters (train/loops/rounds.py); slices are
disjoint, so the slice owners share the reduction without talking to each other. Everything here is
elementwise, so the result does not depend on how the parameters are sliced: bitwise identical weights
with any worker count, and when the server runs the whole step itself.

Buffers (the layout's elements from ``trainable`` on: running statistics, frozen parameters) are not
stepped: their mean "gradient" is the row-weighted mean change the tasks reported, added as it is.
"""

from __future__ import annotations

import numpy as np

from memtrain.faults import fault_point
from memtrain.files import block_digest
from memtrain.train.exchange.weights import BLOCK, finite
from memtrain.train.optim import OptimizerConfig, apply_update

# Elements per pass: one checksum block, 64 Ki float32 = 256 KiB per stream, so the gradient rows, the
# accumulator, the weights and the optimizer state of one chunk stay in L2 while they are added,
# stepped, written and hashed.
CHUNK = BLOCK


class Scratch:
    """The step's working memory, kept between updates: a chunk of the mean gradient, a chunk of zeros
    (the finiteness check), and the optimizer's temporaries (train/optim.py). Allocated once, so a step
    neither allocates nor zeroes anything."""

    def __init__(self, length: int = CHUNK) -> None:
        self.mean = np.empty(length, dtype=np.float32)
        self.zeros = np.zeros(length, dtype=np.float32)
        self.optimizer = np.empty(length, dtype=np.float32)


def reduce_and_step(*, grads: list[np.ndarray], rows: int, weights: np.ndarray, state_in: dict[str, np.ndarray],
                    weights_out: np.ndarray, state_out: dict[str, np.ndarray], lo: int, hi: int,
                    optimizer: OptimizerConfig, step: int, lr: float, digests: np.ndarray,
                    trainable: int | None = None, scratch: Scratch | None = None) -> bool:
    """Fused, chunked: mean gradient of ``grads`` (added in list order) -> optimizer -> ``weights_out``.

    Every argument is named (keyword-only): the step's inputs ``weights`` and ``state_in`` (version
    ``step`` - 1), its outputs ``weights_out`` and ``state_out`` (version ``step``), the slice ``[lo, hi)``
    stepped, ``rows`` the update's row count (the mean's divisor), ``lr`` its learning rate.

    Each chunk is one checksum block (``lo`` is a multiple of CHUNK); its digest goes to row ``a // CHUNK``
    of ``digests``, hashed while the chunk is still in cache. Finiteness is checked on the new weights
    only: a NaN or Inf anywhere in the mean gradient reaches them through every optimizer here (lr > 0),
    so one check per chunk catches both (``weights.finite``, the one check of what is published: a dot
    product with zeros). Elements from ``trainable`` on are buffers:
    the mean is added to them, the optimizer and its state leave them alone. ``scratch``: buffers kept
    by the caller between steps (made here when None).
    """
    if lo % CHUNK:
        raise ValueError(f"a step slice must start on a checksum block boundary, not at {lo}")
    scratch = scratch or Scratch(min(CHUNK, max(hi - lo, 1)))
    buffer, zeros = scratch.mean, scratch.zeros
    divisor = np.float32(rows)
    trainable = hi if trainable is None else trainable
    with np.errstate(invalid="ignore"):  # a NaN or Inf is what the check looks for: reported by the caller, not warned
        for a in range(lo, hi, CHUNK):
            b = min(a + CHUNK, hi)
            mean = buffer[: b - a]
            if len(grads) == 1:
                np.copyto(mean, grads[0][a:b])
            else:
                np.add(grads[0][a:b], grads[1][a:b], out=mean)  # the same sum, in the same order, one pass less
            for grad in grads[2:]:
                np.add(mean, grad[a:b], out=mean)
            np.divide(mean, divisor, out=mean)
            t = min(max(trainable, a), b)  # [a, t) is stepped, [t, b) holds buffers
            if t > a:
                apply_update(optimizer, step, lr, weights[a:t], mean[: t - a], {k: v[a:t] for k, v in state_in.items()},
                             weights_out[a:t], {k: v[a:t] for k, v in state_out.items()},
                             scratch=scratch.optimizer[: t - a])
            if t < b:
                np.add(weights[t:b], mean[t - a:], out=weights_out[t:b])
            if not finite(weights_out[a:b], zeros):
                return False
            digests[a // CHUNK] = np.frombuffer(block_digest(weights_out[a:b]), dtype=np.uint8)
            fault_point("mid_step")
    return True
