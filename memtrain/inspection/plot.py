"""A run's ``metrics.jsonl`` -> a PNG (or SVG/PDF) of training and validation loss per update, and the metric
the run is monitored on (``train.monitor``; for a loss, the validation accuracy when there is one). A
reinforcement-learning run's: the return curve per environment step (the version's episodes, the mean of the
last 100, the greedy evaluation) and the learner's losses (``plot_rl``).

matplotlib is an optional extra (``pip install 'memtrain[plot]'``); it is imported only here, and only
its object API is used (``Figure``, no pyplot), so no global backend state is touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memtrain.errors import InputError, MemtrainError
from memtrain.files import publish, read_jsonl
from memtrain.inspection.tensor_view import SCHEMA
from memtrain.layout import RUN_METRICS
from memtrain.train.records.record import recorded_job

FORMATS = (".png", ".svg", ".pdf")


def load_figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MemtrainError("--plot needs matplotlib, which is not installed",
                            hint="install it with: pip install 'memtrain[plot]'") from exc
    return Figure


def plot_run(run: Path, out: Path) -> dict[str, Any]:
    """Draw the loss curves of ``run`` into ``out``, and its monitored metric; returns what was drawn."""
    if out.suffix.lower() not in FORMATS:
        raise InputError("unknown plot format", path=out, expected=", ".join(FORMATS), found=out.suffix or "none")
    figure_class = load_figure_class()
    records = read_jsonl(run / RUN_METRICS)
    from memtrain.rl.kind import is_rl_run

    if is_rl_run(run):
        return plot_rl(run, out, figure_class, [r for r in records if r.get("kind") == "version"])
    updates = [r for r in records if r.get("kind") == "update" and not r.get("skipped")]
    epochs = [r for r in records if r.get("kind") == "epoch"]
    if not updates and not epochs:
        raise InputError("nothing to plot yet: metrics.jsonl has no update or epoch records", path=run / RUN_METRICS)
    metric = second_metric(run, epochs)
    figure = figure_class(figsize=(8, 7 if metric else 4.5), layout="constrained")
    axes = figure.subplots(2 if metric else 1, 1, sharex=True, squeeze=False)[:, 0]
    draw_loss(axes[0], updates, epochs)
    if metric:
        axes[1].plot(*series(epochs, metric), marker="o", color="C2", label=metric.replace("val_", "validation "))
        axes[1].set_ylabel(metric.removeprefix("val_"))
        axes[1].legend()
    axes[-1].set_xlabel("updates")
    figure.suptitle(run.name)
    publish(out, lambda handle: figure.savefig(handle, format=out.suffix[1:].lower(), dpi=100), durable=False)
    return {"schema": SCHEMA, "kind": "plot", "path": str(run), "out": str(out),
            "updates": len(updates), "epochs": len(epochs), "metric": metric}


LOSSES = ("loss", "val_loss")  # drawn in the first panel


def second_metric(run: Path, epochs: list[dict[str, Any]]) -> str | None:
    """The epoch metric of the second panel: the run's ``train.monitor`` (``val_r2`` for a regression monitored on
    it), or, when that is a loss, the validation accuracy; None when the epochs have no value of it."""
    try:
        monitor = recorded_job(run).get("train", {}).get("monitor", "val_loss")
    except MemtrainError:  # a run without its record (or a damaged one): the loss is still worth drawing
        monitor = "val_loss"
    metric = "val_accuracy" if monitor in LOSSES else monitor
    return metric if any(isinstance(r.get(metric), int | float) for r in epochs) else None


def draw_loss(axis: Any, updates: list[dict[str, Any]], epochs: list[dict[str, Any]]) -> None:
    if updates:
        # update records carry the 0-based index of the update; epoch records the number done.
        xs, ys = series(updates, "loss")
        axis.plot([x + 1 for x in xs], ys, color="C0", alpha=0.35, linewidth=1, label="train loss (per update)")
    if any(r.get("loss") is not None for r in epochs):
        axis.plot(*series(epochs, "loss"), marker="o", color="C0", label="train loss (epoch mean)")
    if any(r.get("val_loss") is not None for r in epochs):
        axis.plot(*series(epochs, "val_loss"), marker="o", color="C1", label="validation loss")
    values = [y for r in updates + epochs for key in ("loss", "val_loss") if isinstance(y := r.get(key), float)]
    if values and min(values) > 0:
        axis.set_yscale("log")
    axis.set_ylabel("loss")
    axis.legend()


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pairs = [(r.get("update"), r.get(key)) for r in records]
    pairs = [(x, y) for x, y in pairs if isinstance(x, int) and isinstance(y, int | float)]
    return [x for x, _ in pairs], [float(y) for _, y in pairs]


RL_CURVES = (("return_mean", "return of the version's episodes", "C0", 0.35, None),
             ("return_last100_mean", "mean return of the last 100 episodes", "C0", 1.0, None),
             ("eval_return_mean", "greedy evaluation", "C1", 1.0, "o"))


def plot_rl(run: Path, out: Path, figure_class: Any, versions: list[dict[str, Any]]) -> dict[str, Any]:
    """A reinforcement-learning run: its returns, and the learner's value and policy losses, per env step."""
    if not versions:
        raise InputError("nothing to plot yet: metrics.jsonl has no version line", path=run / RUN_METRICS)
    figure = figure_class(figsize=(8, 7), layout="constrained")
    returns, losses = figure.subplots(2, 1, sharex=True, squeeze=False)[:, 0]
    for key, label, color, alpha, marker in RL_CURVES:
        if any(isinstance(r.get(key), int | float) for r in versions):
            returns.plot(*rl_series(versions, key), color=color, alpha=alpha, marker=marker, label=label)
    returns.set_ylabel("return")
    returns.legend()
    for key, color in (("value_loss", "C2"), ("policy_loss", "C3")):
        if any(isinstance(r.get(key), int | float) for r in versions):
            losses.plot(*rl_series(versions, key), color=color, label=key.replace("_", " "))
    losses.set_ylabel("loss")
    losses.legend()
    losses.set_xlabel("environment steps")
    figure.suptitle(run.name)
    publish(out, lambda handle: figure.savefig(handle, format=out.suffix[1:].lower(), dpi=100), durable=False)
    return {"schema": SCHEMA, "kind": "plot", "path": str(run), "out": str(out), "versions": len(versions),
            "curves": [key for key, *_ in RL_CURVES if any(isinstance(r.get(key), int | float) for r in versions)]}


def rl_series(versions: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(env steps, value) of the version lines that have a number for ``key``."""
    pairs = [(r.get("env_steps_total"), r.get(key)) for r in versions]
    pairs = [(x, y) for x, y in pairs if isinstance(x, int) and isinstance(y, int | float)]
    return [x for x, _ in pairs], [float(y) for _, y in pairs]
