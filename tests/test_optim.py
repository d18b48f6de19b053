"""Optimizers: chunking gives bitwise identical steps, formulas match float64 references, schedules, training."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrain.errors import InputError
from memtrain.models import build_model
from memtrain.models.params import ParamLayout
from memtrain.models.protocol import DataSpec
from memtrain.train.optim import OptimizerConfig, apply_update, learning_rate, state_names

CONFIGS = [
    OptimizerConfig(name="sgd", lr=0.1),
    OptimizerConfig(name="sgd", lr=0.1, weight_decay=0.01),
    OptimizerConfig(name="sgd", lr=0.1, momentum=0.9),
    OptimizerConfig(name="sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05),
    OptimizerConfig(name="adam", lr=0.01),
    OptimizerConfig(name="adam", lr=0.01, weight_decay=0.1, beta1=0.5, beta2=0.9, eps=1e-6),
    OptimizerConfig(name="adamw", lr=0.01),
    OptimizerConfig(name="adamw", lr=0.01, weight_decay=0.1),
]


class Run:
    """Weights and double-buffered optimizer state, stepped the way the reduce step does it."""

    def __init__(self, config: OptimizerConfig, weights: np.ndarray):
        self.config = config
        self.weights = weights.copy()
        self.state = {name: np.zeros_like(weights) for name in state_names(config)}
        self.step_count = 0

    def step(self, grad: np.ndarray, lr: float, bounds: list[int] | None = None) -> None:
        """One update applied chunk by chunk over ``bounds`` (the whole vector when None)."""
        self.step_count += 1
        bounds = bounds or [0, len(grad)]
        weights_out = np.full_like(self.weights, np.nan)
        state_out = {k: np.full_like(v, np.nan) for k, v in self.state.items()}
        for a, b in zip(bounds, bounds[1:], strict=False):
            apply_update(self.config, self.step_count, lr, self.weights[a:b], grad[a:b],
                         {k: v[a:b] for k, v in self.state.items()}, weights_out[a:b],
                         {k: v[a:b] for k, v in state_out.items()})
        self.weights, self.state = weights_out, state_out


def read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


@settings(max_examples=60, deadline=None)
@given(config=st.sampled_from(CONFIGS), size=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_any_chunking_gives_bitwise_identical_steps(config, size, seed, data):
    cuts = data.draw(st.lists(st.integers(1, max(size - 1, 1)), max_size=6, unique=True))
    bounds = sorted({0, size, *(c for c in cuts if c < size)})
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal(size).astype(np.float32)
    whole, chunked = Run(config, weights), Run(config, weights)
    for update in range(4):
        grad = rng.standard_normal(size).astype(np.float32) * np.float32(10.0 ** rng.integers(-4, 3))
        lr = learning_rate(config, update, 4)
        whole.step(read_only(grad), lr)
        chunked.step(read_only(grad), lr, bounds)
    assert whole.weights.tobytes() == chunked.weights.tobytes()
    assert all(whole.state[k].tobytes() == chunked.state[k].tobytes() for k in whole.state)


@pytest.mark.parametrize("config", CONFIGS)
def test_engine_sized_chunks_match_the_whole_vector(config):
    """Large vectors split at the reduce step's 64 Ki-element chunks and at an odd offset."""
    rng = np.random.default_rng(3)
    size = 200_003
    weights = rng.standard_normal(size).astype(np.float32)
    runs = [Run(config, weights) for _ in range(3)]
    splits = [None, [*range(0, size, 1 << 16), size], [0, 77_777, size]]
    for update in range(3):
        grad = rng.standard_normal(size).astype(np.float32)
        for run, bounds in zip(runs, splits, strict=True):
            run.step(grad, learning_rate(config, update, 3), bounds)
    assert runs[0].weights.tobytes() == runs[1].weights.tobytes() == runs[2].weights.tobytes()


@pytest.mark.parametrize("config", CONFIGS)
def test_inputs_are_never_written(config):
    rng = np.random.default_rng(0)
    weights, grad = rng.standard_normal(50).astype(np.float32), rng.standard_normal(50).astype(np.float32)
    state = {name: read_only(np.abs(rng.standard_normal(50)).astype(np.float32)) for name in state_names(config)}
    weights_out = np.empty_like(weights)
    state_out = {name: np.empty_like(weights) for name in state}
    apply_update(config, 3, config.lr, read_only(weights), read_only(grad), state, weights_out, state_out)
    assert weights_out.dtype == np.float32 and all(v.dtype == np.float32 for v in state_out.values())
    # re-running a step from the same inputs (a retried task) gives the same bytes
    again = np.empty_like(weights)
    apply_update(config, 3, config.lr, weights, grad, state, again, {name: np.empty_like(weights) for name in state})
    assert again.tobytes() == weights_out.tobytes()


def reference_step(config: OptimizerConfig, step: int, lr: float, w: np.ndarray, g: np.ndarray,
                   state: dict[str, np.ndarray]) -> np.ndarray:
    """The update rules as PyTorch documents them (SGD with dampening 0, Adam, AdamW), in float64."""
    wd = config.weight_decay
    if config.name == "adamw":
        w = w * (1 - lr * wd)
    elif wd:
        g = g + wd * w
    if config.name == "sgd":
        if config.momentum:
            state["m"] = config.momentum * state["m"] + g if step > 1 else g
            g = g + config.momentum * state["m"] if config.nesterov else state["m"]
        return w - lr * g
    state["m"] = config.beta1 * state["m"] + (1 - config.beta1) * g
    state["v"] = config.beta2 * state["v"] + (1 - config.beta2) * g * g
    m_hat = state["m"] / (1 - config.beta1**step)
    v_hat = state["v"] / (1 - config.beta2**step)
    return w - lr * m_hat / (np.sqrt(v_hat) + config.eps)


@pytest.mark.parametrize("config", CONFIGS)
def test_matches_float64_reference_formulas(config):
    rng = np.random.default_rng(1)
    weights = rng.standard_normal(1000).astype(np.float32)
    run = Run(config, weights)
    w64, state64 = weights.astype(np.float64), {"m": np.zeros(1000), "v": np.zeros(1000)}
    for update in range(10):
        grad = rng.standard_normal(1000).astype(np.float32)
        lr = learning_rate(config, update, 10)
        run.step(grad, lr)
        w64 = reference_step(config, update + 1, lr, w64, grad.astype(np.float64), state64)
    # sqrt(v) / sqrt(bc2) is sqrt(v_hat): same formula, float32 rounding only.
    np.testing.assert_allclose(run.weights, w64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run.state.get("m", state64["m"]), state64["m"], rtol=1e-5, atol=1e-6)


def test_reference_comparison_can_fail():
    """The tolerance above is tight enough to tell Adam from AdamW at a small weight decay."""
    rng = np.random.default_rng(2)
    weights, grads = rng.standard_normal(100).astype(np.float32), rng.standard_normal((10, 100)).astype(np.float32)
    adam, adamw = OptimizerConfig("adam", 0.01, weight_decay=0.01), OptimizerConfig("adamw", 0.01, weight_decay=0.01)
    run = Run(adam, weights)
    w64, state64 = weights.astype(np.float64), {"m": np.zeros(100), "v": np.zeros(100)}
    for step, grad in enumerate(grads, start=1):
        run.step(grad, 0.01)
        w64 = reference_step(adamw, step, 0.01, w64, grad.astype(np.float64), state64)
    assert np.max(np.abs(run.weights - w64)) > 1e-5


def test_first_adam_step_moves_each_weight_by_lr():
    run = Run(OptimizerConfig("adam", lr=0.5, eps=1e-12), np.zeros(3, np.float32))
    run.step(np.array([3.0, -1e-3, 50.0], np.float32), 0.5)
    np.testing.assert_allclose(run.weights, [-0.5, 0.5, -0.5], rtol=1e-6)


def test_state_names():
    assert state_names(OptimizerConfig("sgd")) == ()
    assert state_names(OptimizerConfig("sgd", momentum=0.9)) == ("m",)
    assert state_names(OptimizerConfig("adam")) == ("m", "v")
    assert state_names(OptimizerConfig("adamw")) == ("m", "v")


# schedules ---------------------------------------------------------------------------------------------


def test_constant_schedule_with_warmup():
    config = OptimizerConfig(lr=0.1, warmup_updates=4)
    rates = [learning_rate(config, u, 100) for u in range(6)]
    assert rates == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])


def test_cosine_endpoints_and_midpoint():
    config = OptimizerConfig(lr=1.0, schedule="cosine", min_lr=0.1, warmup_updates=10)
    assert learning_rate(config, 9, 110) == pytest.approx(1.0)  # end of warmup
    assert learning_rate(config, 10, 110) == pytest.approx(1.0)
    assert learning_rate(config, 60, 110) == pytest.approx(0.55)
    assert learning_rate(config, 109, 110) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 0.99)) / 2)
    assert learning_rate(config, 110, 110) == pytest.approx(0.1)
    assert learning_rate(config, 500, 110) == pytest.approx(0.1)  # past the end: stays at the floor
    rates = [learning_rate(config, u, 110) for u in range(10, 111)]
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))


def test_step_schedule_counts_after_warmup():
    config = OptimizerConfig(lr=1.0, schedule="step", step_every=3, step_gamma=0.5, warmup_updates=2)
    rates = [learning_rate(config, u, 100) for u in range(10)]
    assert rates == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25])


# validation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"name": "rmsprop"}, "bad value for train.optimizer (expected 'sgd' or 'adam' or 'adamw', found 'rmsprop')"),
    ({"lr": 0.0}, "bad value for train.lr (expected a number > 0, found 0.0)"),
    ({"lr": float("nan")}, "bad value for train.lr (expected a number > 0, found nan)"),
    ({"momentum": 1.0}, "bad value for train.momentum (expected a number in [0, 1), found 1.0)"),
    ({"beta2": -0.1}, "bad value for train.beta2 (expected a number in [0, 1), found -0.1)"),
    ({"eps": 0}, "bad value for train.eps (expected a number > 0, found 0)"),
    ({"weight_decay": -1}, "bad value for train.weight_decay (expected a number >= 0, found -1)"),
    ({"schedule": "linear"},
     "bad value for train.schedule (expected 'constant' or 'cosine' or 'step', found 'linear')"),
    ({"warmup_updates": -1},
     "bad value for train.warmup_updates (expected an integer from 0 to 1000000000000, found -1)"),
    ({"step_every": 0}, "bad value for train.step_every (expected an integer from 1 to 1000000000000, found 0)"),
    ({"step_gamma": 2.0}, "bad value for train.step_gamma (expected a number in (0, 1], found 2.0)"),
    ({"lr": 0.01, "min_lr": 0.1}, "bad value for train.min_lr (expected a number in [0, lr=0.01], found 0.1)"),
    ({"name": "sgd", "nesterov": True}, "train.nesterov needs optimizer 'sgd' with momentum > 0 (expected "
                                        "train.momentum > 0 and train.optimizer = 'sgd', found optimizer 'sgd', "
                                        "momentum 0.0)"),
    ({"nesterov": 1}, "wrong type for train.nesterov (expected true or false, found 1)"),
])
def test_bad_options_name_the_key(options, message):
    with pytest.raises(InputError) as info:
        OptimizerConfig(**options)
    assert str(info.value) == message and info.value.exit_code == 2


# training ----------------------------------------------------------------------------------------------


def train_full_batch(kind, options, spec, x, y, config, updates) -> float:
    """Full-batch training with the summed gradient / rows and ``apply_update``; returns train accuracy."""
    model = build_model(kind, options, spec)
    layout = ParamLayout.from_shapes(model.parameter_shapes())
    run = Run(config, layout.flatten(model.init(np.random.default_rng(0))))
    grad = np.empty(layout.size, np.float32)
    for update in range(updates):
        model.loss_and_grad(layout.views(run.weights), x, y, layout.views(grad))
        grad /= np.float32(len(x))
        run.step(grad, learning_rate(config, update, updates))
    return float(np.mean(model.predict(layout.views(run.weights), x) == y))


def test_softmax_learns_separable_blobs():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 400)
    x = (rng.standard_normal((400, 8)) + 4 * np.eye(4, 8)[y]).astype(np.float32)
    config = OptimizerConfig("sgd", lr=0.5, momentum=0.9, nesterov=True)
    spec = DataSpec(n_features=8, task="classification", n_classes=4)
    assert train_full_batch("softmax", {}, spec, x, y, config, 200) > 0.97


def test_mlp_learns_xor():
    """Not linearly separable: a linear model stays near chance, the MLP gets it."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (400, 2)).astype(np.float32)
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).astype(np.int64)
    spec = DataSpec(n_features=2, task="classification", n_classes=2)
    config = OptimizerConfig("adam", lr=0.03, schedule="cosine", warmup_updates=10)
    assert train_full_batch("mlp", {"hidden": [32]}, spec, x, y, config, 300) > 0.95
    assert train_full_batch("softmax", {}, spec, x, y, config, 300) < 0.75


def test_an_unknown_optimizer_name_is_refused_never_run_as_another() -> None:
    """The optimizer table (optim.OPTIMIZERS) is the only way from a name to a step: a name that is not in it is
    a clear error, at the job's edge and at the step (were a config to get past the edge), never Adam."""
    with pytest.raises(InputError, match="bad value for train.optimizer") as refused:
        OptimizerConfig(name="lion")
    assert "'sgd' or 'adam' or 'adamw'" in str(refused.value)
    config = OptimizerConfig(name="adam")
    object.__setattr__(config, "name", "lion")  # past the edge's check, as a hand-built record could be
    weights, grad = np.ones(4, np.float32), np.ones(4, np.float32)
    state = {k: np.zeros(4, np.float32) for k in ("m", "v")}
    out, state_out = np.zeros(4, np.float32), {k: np.zeros(4, np.float32) for k in ("m", "v")}
    with pytest.raises(InputError, match="bad value for train.optimizer"):
        apply_update(config, 1, 0.1, weights, grad, state, out, state_out)
    with pytest.raises(InputError, match="bad value for train.optimizer"):
        state_names(config)
    assert not out.any(), "nothing was stepped"
