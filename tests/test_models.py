"""Models: gradients vs finite differences, additivity over rows, additive models vs direct solutions, options."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrain.errors import InputError
from memtrain.models import MODEL_KINDS, build_model
from memtrain.models.mlp import MLP
from memtrain.models.params import ParamLayout
from memtrain.models.protocol import AdditiveModel, DataSpec, GradientModel

CLS3 = DataSpec(n_features=5, task="classification", n_classes=3)
CLS2 = DataSpec(n_features=5, task="classification", n_classes=2)
REG1 = DataSpec(n_features=5, task="regression")
REG2 = DataSpec(n_features=5, task="regression", n_targets=2, target_shape=(2,))
USER_MODEL = "user_model_example:HuberRegression"

GRADIENT_CASES = [
    ("linear", {}, REG1),
    ("linear", {}, REG2),
    ("logistic", {}, CLS2),
    ("softmax", {}, CLS3),
    ("mlp", {"hidden": [7]}, CLS3),
    ("mlp", {"hidden": [7, 4], "activation": "tanh"}, CLS3),
    ("mlp", {"hidden": [6, 3], "activation": "relu"}, REG2),
    ("mlp", {"hidden": [6], "activation": "tanh"}, REG1),
    (USER_MODEL, {"delta": 0.5}, REG1),
]


@pytest.fixture(autouse=True)
def _user_model_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def make_data(spec: DataSpec, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, spec.n_features)).astype(np.float32)
    if spec.task == "classification":
        return x, rng.integers(0, spec.n_classes, n).astype(np.int64)
    return x, rng.standard_normal((n, *spec.target_shape)).astype(np.float32)


def random_params(model, seed: int) -> dict[str, np.ndarray]:
    """Random (not init) parameters, so zero-initialized models are checked away from zero too."""
    rng = np.random.default_rng(seed)
    return {name: (0.5 * rng.standard_normal(shape)).astype(np.float32)
            for name, shape in model.parameter_shapes().items()}


def analytic_grad(model, params, x, y) -> tuple[float, np.ndarray]:
    layout = ParamLayout.from_shapes(model.parameter_shapes())
    flat = np.full(layout.size, np.nan, dtype=np.float32)  # garbage: loss_and_grad must overwrite
    loss = model.loss_and_grad(params, x, y, layout.views(flat))
    return loss, flat


def numeric_grad(model, params, x, y, h: float = 1e-6) -> np.ndarray:
    """Central differences of ``model.loss`` run with float64 parameters, so the arithmetic is float64."""
    layout = ParamLayout.from_shapes(model.parameter_shapes())
    flat = layout.flatten(params).astype(np.float64)
    grad = np.empty_like(flat)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        up = model.loss(layout.views(flat), x, y)
        flat[i] = old - h
        down = model.loss(layout.views(flat), x, y)
        flat[i] = old
        grad[i] = (up - down) / (2 * h)
    return grad


def relative_error(grad: np.ndarray, reference: np.ndarray) -> float:
    return float(np.max(np.abs(grad - reference)) / max(np.max(np.abs(reference)), 1e-12))


GRAD_TOLERANCE = 1e-4


@pytest.mark.parametrize(("kind", "options", "spec"), GRADIENT_CASES)
def test_gradient_matches_finite_differences(kind, options, spec):
    model = build_model(kind, options, spec)
    params = random_params(model, 1)
    x, y = make_data(spec, 12, 2)
    loss, grad = analytic_grad(model, params, x, y)
    numeric = numeric_grad(model, params, x, y)
    assert grad.dtype == np.float32
    assert relative_error(grad, numeric) < GRAD_TOLERANCE
    assert loss == pytest.approx(model.loss(params, x, y), rel=1e-6)
    wrong = grad.copy()
    wrong[np.argmax(np.abs(wrong))] *= 1.01  # a 1% error in one element must be caught
    assert relative_error(wrong, numeric) > GRAD_TOLERANCE


class ForgetsActivationSlope(MLP):
    """A deliberately wrong MLP: backpropagates through relu as if it were the identity."""

    def _activation_grad(self, da, a):
        pass


def test_gradient_check_catches_a_backprop_bug():
    model = ForgetsActivationSlope(CLS3, hidden=(7,))
    params = random_params(model, 1)
    x, y = make_data(CLS3, 12, 2)
    _, grad = analytic_grad(model, params, x, y)
    assert relative_error(grad, numeric_grad(model, params, x, y)) > 100 * GRAD_TOLERANCE


@settings(max_examples=25, deadline=None)
@given(case=st.sampled_from(GRADIENT_CASES), n_a=st.integers(1, 40), n_b=st.integers(1, 40),
       seed=st.integers(0, 2**32 - 1))
def test_summed_gradient_is_additive_over_rows(case, n_a, n_b, seed):
    kind, options, spec = case
    model = build_model(kind, options, spec)
    params = random_params(model, seed)
    x, y = make_data(spec, n_a + n_b, seed)
    loss_all, grad_all = analytic_grad(model, params, x, y)
    loss_a, grad_a = analytic_grad(model, params, x[:n_a], y[:n_a])
    loss_b, grad_b = analytic_grad(model, params, x[n_a:], y[n_a:])
    assert loss_all == pytest.approx(loss_a + loss_b, rel=1e-5)
    scale = np.max(np.abs(grad_all)) + 1e-6
    np.testing.assert_allclose(grad_a + grad_b, grad_all, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize(("kind", "options", "spec"), GRADIENT_CASES)
def test_gradient_is_deterministic_and_leaves_params_alone(kind, options, spec):
    model = build_model(kind, options, spec)
    params = random_params(model, 3)
    before = {k: v.copy() for k, v in params.items()}
    x, y = make_data(spec, 256, 4)
    loss1, grad1 = analytic_grad(model, params, x, y)
    loss2, grad2 = analytic_grad(model, params, x, y)
    assert loss1 == loss2 and grad1.tobytes() == grad2.tobytes()
    assert all(np.array_equal(before[k], params[k]) for k in params)


@pytest.mark.parametrize(("kind", "options", "spec"), GRADIENT_CASES)
def test_no_rows_give_zero_loss_and_gradient(kind, options, spec):
    model = build_model(kind, options, spec)
    x, y = make_data(spec, 0, 0)
    loss, grad = analytic_grad(model, random_params(model, 0), x, y)
    assert loss == 0 and not grad.any()


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_init_is_seeded_float32_and_shaped(kind):
    spec = REG2 if kind == "linear" else CLS2 if kind == "logistic" else CLS3
    model = build_model(kind, {"factory": "torch_nets:mlp"} if kind == "torch" else {}, spec)
    a, b = model.init(np.random.default_rng(7)), model.init(np.random.default_rng(7))
    assert list(a) == list(model.parameter_shapes())
    for name, shape in model.parameter_shapes().items():
        assert a[name].shape == shape and a[name].dtype == np.float32
        assert a[name].tobytes() == b[name].tobytes()
    assert isinstance(model, AdditiveModel if model.additive else GradientModel)


def test_mlp_init_scales():
    model = build_model("mlp", {"hidden": [400]}, DataSpec(n_features=300, task="classification", n_classes=200))
    params = model.init(np.random.default_rng(0))
    assert np.std(params["W1"]) == pytest.approx(math.sqrt(2 / 300), rel=0.02)  # He
    assert np.std(params["W2"]) == pytest.approx(math.sqrt(2 / 600), rel=0.02)  # Glorot (linear output)
    assert not params["b1"].any()


@pytest.mark.parametrize(("kind", "options", "spec", "shape"), [
    ("linear", {}, REG1, (9,)),
    ("linear", {}, REG2, (9, 2)),
    ("mlp", {}, REG2, (9, 2)),
    ("softmax", {}, CLS3, (9,)),
    ("logistic", {}, CLS2, (9,)),
    ("mlp", {}, CLS3, (9,)),
])
def test_predict_shapes_and_probabilities(kind, options, spec, shape):
    model = build_model(kind, options, spec)
    params = random_params(model, 5)
    x, _ = make_data(spec, 9, 6)
    prediction = model.predict(params, x)
    assert prediction.shape == shape
    if model.classifier:
        proba = model.predict_proba(params, x)
        assert proba.shape == (9, spec.n_classes)
        np.testing.assert_allclose(proba.sum(axis=1), 1, rtol=1e-5)
        assert np.array_equal(np.argmax(proba, axis=1), prediction)


def test_regression_mlp_has_no_probabilities():
    model = build_model("mlp", {}, REG1)
    assert not model.classifier
    with pytest.raises(InputError, match="only for classification"):
        model.predict_proba(random_params(model, 0), make_data(REG1, 3, 0)[0])


def test_logistic_equals_two_class_softmax():
    """softmax with scores [0, z] is sigmoid(z): same loss, predictions and (mirrored) gradient."""
    logistic = build_model("logistic", {}, CLS2)
    softmax = build_model("softmax", {}, CLS2)
    p = random_params(logistic, 8)
    q = {"W": np.stack([np.zeros(5, np.float32), p["w"]], axis=1), "b": np.concatenate([[0], p["b"]]).astype("f4")}
    x, y = make_data(CLS2, 50, 9)
    loss_l, grad_l = analytic_grad(logistic, p, x, y)
    loss_s, grad_s = analytic_grad(softmax, q, x, y)
    assert loss_l == pytest.approx(loss_s, rel=1e-5)
    assert np.array_equal(logistic.predict(p, x), softmax.predict(q, x))
    g = ParamLayout.from_shapes(softmax.parameter_shapes()).views(grad_s)
    np.testing.assert_allclose(g["W"][:, 1], grad_l[:5], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g["W"][:, 0], -grad_l[:5], rtol=1e-4, atol=1e-5)


def test_softmax_loss_is_stable_for_huge_scores():
    model = build_model("softmax", {}, CLS3)
    params = {"W": np.full((5, 3), 1e4, np.float32) * [1, 0, -1], "b": np.zeros(3, np.float32)}
    x, y = make_data(CLS3, 20, 1)
    loss, grad = analytic_grad(model, params, x, y)
    assert math.isfinite(loss) and np.isfinite(grad).all()
    assert math.isfinite(build_model("logistic", {}, CLS2).loss({"w": params["W"][:, 0], "b": np.zeros(1, "f4")},
                                                                  x, y % 2))


# additive models --------------------------------------------------------------------------------------


def fit_additive(model, x, y, splits=(0.3, 0.7)) -> dict[str, np.ndarray]:
    """Statistics of a few row ranges summed in order, then solve -- what the server does."""
    layout = ParamLayout(ParamLayout.from_shapes(model.statistic_shapes()).entries, np.dtype(np.float64))
    total = np.zeros(layout.size)
    bounds = [0, *(int(f * len(x)) for f in splits), len(x)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        part = np.zeros(layout.size)  # memtrain zeroes a partial; add_statistics adds into it
        model.add_statistics(x[lo:hi], y[lo:hi], layout.views(part))
        total += part
    return model.solve(layout.views(total))


def regression_data(n=300, d=6, k=1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = x @ rng.standard_normal((d, k)) + 3.0 + 0.1 * rng.standard_normal((n, k))
    return x, y.astype(np.float32)


def assert_close(found, expected, rtol=1e-6):
    np.testing.assert_allclose(found, expected, rtol=rtol, atol=rtol * np.max(np.abs(expected)))


def test_least_squares_matches_numpy_lstsq():
    x, y = regression_data(k=2)
    model = build_model("ridge", {}, DataSpec(n_features=6, task="regression", n_targets=2, target_shape=(2,)))
    params = fit_additive(model, x, y)
    augmented = np.hstack([x.astype(np.float64), np.ones((len(x), 1))])
    direct = np.linalg.lstsq(augmented, y.astype(np.float64), rcond=None)[0]
    assert_close(params["W"], direct[:-1])
    assert_close(params["b"], direct[-1])
    assert model.predict(params, x).shape == (300, 2)


def test_ridge_matches_centered_direct_solve():
    """An unpenalized intercept is the same as centering x and y: an independent derivation."""
    x, y = regression_data(seed=1)
    alpha = 25.0
    params = fit_additive(build_model("ridge", {"alpha": alpha}, DataSpec(n_features=6, task="regression")), x, y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    xc, yc = x64 - x64.mean(axis=0), y64 - y64.mean(axis=0)
    w = np.linalg.solve(xc.T @ xc + alpha * np.eye(6), xc.T @ yc)
    assert_close(params["W"], w)
    assert_close(params["b"], y64.mean(axis=0) - x64.mean(axis=0) @ w)


def test_least_squares_survives_constant_and_duplicate_features():
    x, y = regression_data(seed=2)
    x[:, 0] = 0.0  # a constant feature after normalization
    x[:, 1] = x[:, 2]  # collinear
    params = fit_additive(build_model("ridge", {}, DataSpec(n_features=6, task="regression")), x, y)
    augmented = np.hstack([x.astype(np.float64), np.ones((len(x), 1))])
    direct = np.linalg.lstsq(augmented, y.astype(np.float64), rcond=None)[0]
    assert np.isfinite(params["W"]).all()
    assert_close(x @ params["W"] + params["b"], augmented @ direct, rtol=1e-5)


def test_ridge_classifier_uses_one_hot_targets():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, 400)
    x = (rng.standard_normal((400, 4)) + 3 * np.eye(3, 4)[y]).astype(np.float32)
    model = build_model("ridge", {"alpha": 1.0}, DataSpec(n_features=4, task="classification", n_classes=3))
    params = fit_additive(model, x, y)
    x64, onehot = x.astype(np.float64), np.eye(3)[y]
    xc = x64 - x64.mean(axis=0)
    w = np.linalg.solve(xc.T @ xc + np.eye(4), xc.T @ (onehot - onehot.mean(axis=0)))
    assert_close(params["W"], w)
    direct = np.argmax(x64 @ w + onehot.mean(axis=0) - x64.mean(axis=0) @ w, axis=1)
    assert np.array_equal(model.predict(params, x), direct)
    assert np.mean(direct == y) > 0.9


def class_data(n=600, d=5, c=3, seed=4):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    scale = 1.0 + y[:, None] * np.linspace(0.2, 1.0, d)
    x = (rng.standard_normal((n, d)) * scale + 1.5 * np.eye(c, d)[y]).astype(np.float32)
    return x, y


def direct_naive_bayes(x, y, c, var_smoothing=1e-9):
    x64 = x.astype(np.float64)
    mean = np.stack([x64[y == k].mean(axis=0) for k in range(c)])
    var = np.stack([x64[y == k].var(axis=0) for k in range(c)]) + var_smoothing * x64.var(axis=0).max()
    log_prior = np.log(np.bincount(y, minlength=c) / len(y))
    jll = log_prior - 0.5 * np.sum(np.log(2 * np.pi * var), axis=1)
    jll = jll - 0.5 * np.sum((x64[:, None, :] - mean) ** 2 / var, axis=2)
    return log_prior, mean, var, jll


@pytest.mark.parametrize("var_smoothing", [1e-9, 0.5])
def test_naive_bayes_matches_direct_numpy(var_smoothing):
    x, y = class_data()
    model = build_model("naive_bayes", {"var_smoothing": var_smoothing}, DataSpec(n_features=5, task="classification",
                                                                                  n_classes=3))
    params = fit_additive(model, x, y)
    log_prior, mean, var, jll = direct_naive_bayes(x, y, 3, var_smoothing)
    assert_close(params["log_prior"], log_prior)
    assert_close(params["mean"], mean, rtol=1e-5)
    assert_close(params["var"], var, rtol=1e-5)
    assert np.array_equal(model.predict(params, x), np.argmax(jll, axis=1))
    log_posterior = jll - np.log(np.sum(np.exp(jll), axis=1, keepdims=True))
    assert model.loss(params, x, y) == pytest.approx(-log_posterior[np.arange(len(y)), y].sum(), rel=1e-5)
    assert_close(model.predict_proba(params, x), np.exp(log_posterior), rtol=1e-4)


def test_naive_bayes_matches_sklearn():
    from sklearn import naive_bayes  # in the test extra: this reference always runs (it was skipped without it)
    x, y = class_data(seed=5)
    model = build_model("naive_bayes", {}, DataSpec(n_features=5, task="classification", n_classes=3))
    params = fit_additive(model, x, y)
    reference = naive_bayes.GaussianNB().fit(x, y)
    assert np.array_equal(model.predict(params, x), reference.predict(x))
    assert_close(params["var"], reference.var_, rtol=1e-5)
    np.testing.assert_allclose(model.predict_proba(params, x), reference.predict_proba(x), atol=1e-5)


def test_naive_bayes_class_without_rows_is_never_predicted():
    x, y = class_data(c=3)
    model = build_model("naive_bayes", {}, DataSpec(n_features=5, task="classification", n_classes=4))
    params = fit_additive(model, x, y)
    assert all(np.isfinite(v).all() for v in params.values())
    assert 3 not in model.predict(params, x)


@settings(max_examples=20, deadline=None)
@given(kind=st.sampled_from(["ridge", "naive_bayes"]), n_a=st.integers(1, 30), n_b=st.integers(1, 30),
       seed=st.integers(0, 2**32 - 1))
def test_statistics_are_additive_over_rows(kind, n_a, n_b, seed):
    model = build_model(kind, {}, CLS3)
    layout = ParamLayout(ParamLayout.from_shapes(model.statistic_shapes()).entries, np.dtype(np.float64))
    x, y = make_data(CLS3, n_a + n_b, seed)
    whole, a, b, chunked = (np.zeros(layout.size) for _ in range(4))
    model.add_statistics(x, y, layout.views(whole))
    model.add_statistics(x[:n_a], y[:n_a], layout.views(a))
    model.add_statistics(x[n_a:], y[n_a:], layout.views(b))
    np.testing.assert_allclose(a + b, whole, rtol=1e-12, atol=1e-9)
    # the contract (docs/models.md): add_statistics ADDS into out, as memtrain calls it once per chunk of a task
    model.add_statistics(x[:n_a], y[:n_a], layout.views(chunked))
    model.add_statistics(x[n_a:], y[n_a:], layout.views(chunked))
    assert np.array_equal(chunked, a + b)


# building models and validating options --------------------------------------------------------------


def error_text(kind, options, spec) -> str:
    with pytest.raises(InputError) as info:
        build_model(kind, options, spec)
    assert info.value.exit_code == 2
    return str(info.value)


@pytest.mark.parametrize(("kind", "options", "spec", "message"), [
    ("mlp", {"hiden": [3]}, CLS3, "model 'mlp' has no option 'hiden' (options: activation, hidden). "
                                  "did you mean `hidden`?"),
    ("softmax", {"alpha": 1}, CLS3, "model 'softmax' has no option 'alpha' (options: none)"),
    ("mlp", {"activation": "sigmoid"}, CLS3,
     "bad value for model.activation (expected 'relu' or 'tanh', found 'sigmoid')"),
    ("mlp", {"hidden": []}, CLS3,
     "bad value for model.hidden (expected a non-empty list of positive integers, found [])"),
    ("mlp", {"hidden": [8, 0]}, CLS3,
     "bad value for model.hidden (expected a non-empty list of positive integers, found [8, 0])"),
    ("mlp", {"hidden": 64}, CLS3,
     "bad value for model.hidden (expected a non-empty list of positive integers, found 64)"),
    ("ridge", {"alpha": -1.0}, REG1, "bad value for model.alpha (expected a number >= 0, found -1.0)"),
    ("naive_bayes", {"var_smoothing": "x"}, CLS3,
     "bad value for model.var_smoothing (expected a number >= 0, found 'x')"),
    ("logistic", {}, CLS3, "model 'logistic' needs exactly 2 classes (expected 2 classes, found 3 classes). "
                           "use model kind 'softmax' for more classes"),
    ("softmax", {}, REG1, "model 'softmax' needs classification data (expected task 'classification', "
                          "found task 'regression'). use 'linear', 'ridge' or 'mlp' for regression"),
    ("linear", {}, CLS3, "model 'linear' needs regression data (expected task 'regression', "
                         "found task 'classification'). use 'logistic', 'softmax' or 'mlp' for classification"),
    ("naive_bayes", {}, REG1, "model 'naive_bayes' needs classification data (expected task 'classification', "
                              "found task 'regression'). use 'ridge' or 'linear' for regression"),
    ("forest", {}, CLS3, "unknown model kind 'forest' (expected one of linear, logistic, softmax, mlp, ridge, "
                         "naive_bayes, torch, or 'package.module:ClassName', found 'forest')"),
    ("user_model_example:Nope", {}, REG1,
     "module 'user_model_example' has no class 'Nope' (expected a class Nope, found nothing)"),
    ("user_model_example:dataclass", {}, REG1,
     "module 'user_model_example' has no class 'dataclass' (expected a class dataclass, found function)"),
    ("user_model_example:InputError", {}, REG1, "model 'user_model_example:InputError' does not implement the "
                                                "model protocol (expected a class attribute additive = True or False, "
                                            "found None)"),
    (USER_MODEL, {"delta": 1, "beta": 2}, REG1,
     "model 'user_model_example:HuberRegression' has no option 'beta' (options: delta)"),
])
def test_option_errors_name_the_option(kind, options, spec, message):
    assert error_text(kind, options, spec) == message


def test_missing_module_error_says_what_to_check():
    text = error_text("no_such_pkg.models:Net", {}, REG1)
    assert text.startswith("cannot import module 'no_such_pkg.models' of model 'no_such_pkg.models:Net'")
    assert text.endswith("check the name and that the module is on PYTHONPATH")


def test_user_class_missing_methods_is_rejected(monkeypatch):
    import user_model_example

    @dataclasses.dataclass(frozen=True)
    class Half:
        spec: DataSpec
        additive = False

        def parameter_shapes(self):
            return {}

    monkeypatch.setattr(user_model_example, "Half", Half, raising=False)
    assert error_text("user_model_example:Half", {}, REG1) == (
        "model 'user_model_example:Half' does not implement the model protocol "
        "(expected methods parameter_shapes, init, loss, predict, loss_and_grad, found missing init, loss, "
        "predict, loss_and_grad)")


def test_missing_required_option_is_named(monkeypatch):
    import user_model_example

    @dataclasses.dataclass(frozen=True)
    class NeedsDepth(user_model_example.HuberRegression):
        depth: int = dataclasses.field(kw_only=True)

    monkeypatch.setattr(user_model_example, "NeedsDepth", NeedsDepth, raising=False)
    assert error_text("user_model_example:NeedsDepth", {}, REG1) == (
        "model 'user_model_example:NeedsDepth' needs option 'depth' (expected a value for depth, found nothing)")


def test_user_model_by_import_path_trains_like_a_builtin():
    model = build_model(USER_MODEL, {"delta": 2}, REG1)
    assert model.delta == 2 and isinstance(model, GradientModel)
    x, y = regression_data(n=200, d=5, seed=6)
    layout = ParamLayout.from_shapes(model.parameter_shapes())
    weights = layout.flatten(model.init(np.random.default_rng(0)))
    grad = np.empty_like(weights)
    for _ in range(200):
        model.loss_and_grad(layout.views(weights), x, y, layout.views(grad))
        weights -= 0.5 * grad / len(x)
    assert np.mean(np.abs(model.predict(layout.views(weights), x) - y[:, 0])) < 0.2


def test_toml_lists_become_tuples():
    model = build_model("mlp", {"hidden": [8, 4]}, CLS3)
    assert model.hidden == (8, 4)
    assert list(model.parameter_shapes()) == ["W1", "b1", "W2", "b2", "W3", "b3"]
    assert hash(model)


def test_docs_example_is_the_tested_file():
    """docs/models.md shows tests/user_model_example.py verbatim."""
    page = Path(__file__).parent.parent / "docs" / "models.md"
    blocks = page.read_text().split("```python\n")[1:]
    shown = [block.split("```")[0] for block in blocks if "class HuberRegression" in block]
    assert shown == [(Path(__file__).parent / "user_model_example.py").read_text()]
