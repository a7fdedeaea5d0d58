"""A PNG of a run from its metrics.jsonl: training reward per step, validation accuracy per step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Figure without pyplot: the Agg canvas, no display, no global backend switch in the caller's process.
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from tandem.trainer.tracking import read_jsonl


def plot_run(
    metrics_jsonl: str | Path,
    out_png: str | Path,
    *,
    reward_key: str = "score/mean",
    acc_key: str = "val/acc",
    title: str | None = None,
) -> dict[str, list[tuple[int, float]]]:
    """Write `out_png` with two panels, reward per step and validation accuracy per validated step.
    Returns the plotted series, {"reward": [(step, value), ...], "accuracy": [...]}."""
    rows = read_jsonl(metrics_jsonl)
    series = {"reward": _series(rows, reward_key), "accuracy": _series(rows, acc_key)}
    figure = Figure(figsize=(10, 4), layout="constrained")
    reward_axes, accuracy_axes = figure.subplots(1, 2)
    _panel(reward_axes, series["reward"], reward_key, "training reward", marker=None)
    _panel(accuracy_axes, series["accuracy"], acc_key, "validation accuracy", marker="o")
    figure.suptitle(title if title is not None else Path(metrics_jsonl).parent.name)
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, format="png", dpi=100)
    return series


def _series(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) of the rows that logged `key`; null (a non-finite value) is left out."""
    return [(int(row["step"]), float(row[key])) for row in rows if row.get(key) is not None]


def _panel(axes: Axes, points: list[tuple[int, float]], key: str, name: str, marker: str | None) -> None:
    axes.set_title(name)
    axes.set_xlabel("step")
    axes.set_ylabel(key)
    axes.grid(alpha=0.3)
    if not points:
        axes.text(0.5, 0.5, f"no '{key}' in the metrics", ha="center", va="center", transform=axes.transAxes)
        return
    steps, values = zip(*points)
    axes.plot(steps, values, marker=marker)
