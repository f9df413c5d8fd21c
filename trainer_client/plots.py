"""Learning curves from metrics JSONL files (one or several runs, e.g. one per strategy).

Four panels: mean reward vs step, mean reward vs cumulative rollouts (what a run costs), effective
ratio (share of groups with a GRPO signal) vs step, and the loss (or the greedy evaluation accuracy
when the runs recorded one) vs step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["load_metrics", "plot_runs"]


def load_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The step records of a metrics file (blank lines skipped)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def plot_runs(
    runs: Sequence[tuple[str, Sequence[dict[str, Any]]]], out: str | Path, *, title: str = ""
) -> Path:
    """Write a PNG with the curves of ``runs`` (``(label, records)`` pairs) to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    has_eval = any("eval_accuracy" in r for _, records in runs for r in records)
    figure, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (reward_ax, cost_ax), (effective_ax, last_ax) = axes
    for label, records in runs:
        if not records:
            continue
        steps = [r["step"] for r in records]
        rewards = [r["mean_reward"] for r in records]
        reward_ax.plot(steps, rewards, marker=".", label=label)
        cost_ax.plot([r["total_rollouts"] for r in records], rewards, marker=".", label=label)
        effective_ax.plot(steps, [r["effective_ratio"] for r in records], marker=".", label=label)
        if has_eval:
            points = [(r["step"], r["eval_accuracy"]) for r in records if "eval_accuracy" in r]
            if "eval_accuracy_initial" in records[0]:
                points.insert(0, (records[0]["step"] - 1, records[0]["eval_accuracy_initial"]))
            last_ax.plot(*zip(*points, strict=True), marker="o", label=label)
        else:
            last_ax.plot(steps, [r["loss"] for r in records], marker=".", label=label)
    reward_ax.set(xlabel="step", ylabel="mean reward (rollouts of the step)", title="reward vs step")
    cost_ax.set(xlabel="rollouts generated (cumulative)", ylabel="mean reward", title="reward vs cost")
    effective_ax.set(
        xlabel="step",
        ylabel="share of groups with reward spread",
        title="effective ratio",
        ylim=(-0.02, 1.02),
    )
    if has_eval:
        last_ax.set(
            xlabel="step (-1: before training)",
            ylabel="greedy accuracy",
            title="evaluation (fixed prompt subset)",
        )
    else:
        last_ax.set(xlabel="step", ylabel="GRPO loss", title="loss")
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
