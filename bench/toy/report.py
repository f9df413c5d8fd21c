"""What the toy world's runs add up to: per-seed metrics against uniform, their mean and spread over seeds,
learning curves, the table and the figure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.toy.strategies import BASELINE, base_name, variant_of
from bench.toy.world import RunResult


def first_reach(accuracy: np.ndarray, target: float) -> int | None:
    """Number of training steps after which `accuracy` first reaches `target` (None if never).

    A relative slack of 1e-12 absorbs last-bit rounding differences; it is far below any accuracy
    difference that matters."""
    hits = np.flatnonzero(accuracy >= target - 1e-12 * max(abs(target), 1.0))
    return int(hits[0]) if hits.size else None


def run_metrics(run: RunResult, target: float | None, budget: int | None) -> dict[str, Any]:
    """The per-(strategy, seed) numbers of the report. `target`: uniform's final accuracy and `budget`:
    uniform's total rollouts, both from the same seed (None: no uniform run to compare with)."""
    steps_to = first_reach(run.accuracy, target) if target is not None else None
    at_budget = None
    if budget is not None:
        # Accuracy after the last step that stayed within the budget (index 0: nothing spent yet).
        at_budget = float(run.accuracy[np.searchsorted(run.rollouts, budget, side="right") - 1])
    return {
        "effective_ratio": run.effective_ratio,
        "mixed_per_step": float(run.mixed.mean()),
        "mixed_per_rollout": run.mixed_per_rollout,
        "trained_effective_ratio": run.trained_effective_ratio,
        "final_accuracy": float(run.accuracy[-1]),
        "final_train_accuracy": float(run.train_accuracy[-1]),
        "accuracy_at_uniform_rollouts": at_budget,
        "steps_to_target": steps_to,
        "rollouts_to_target": int(run.rollouts[steps_to]) if steps_to is not None else None,
        "total_rollouts": int(run.rollouts[-1]),
        "state_accuracy": run.state_accuracy,
        "predicted_partial_share": float(run.predicted_partial[-1] / run.n_prompts),
        "coverage": run.coverage,
        "max_times_observed": int(run.times_observed.max()),
        "seconds": run.seconds,
    }


def _mean_std(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean, sample std (ddof=1; 0 for a single value) and standard error of the mean (std / sqrt(n))
    over the seeds that have a value."""
    present = np.array([v for v in values if v is not None], dtype=np.float64)
    if present.size == 0:
        return {"mean": None, "std": None, "se": None, "n": 0}
    std = float(present.std(ddof=1)) if present.size > 1 else 0.0
    return {
        "mean": float(present.mean()),
        "std": std,
        "se": std / np.sqrt(present.size),
        "n": int(present.size),
    }


def summarize(runs: dict[str, list[RunResult]]) -> dict[str, Any]:
    """Per strategy: per-seed metrics and their mean/std. Targets come from uniform's run of each seed."""
    baseline = {run.seed: run for run in runs.get(BASELINE, [])}
    summary: dict[str, Any] = {}
    for strategy, strategy_runs in runs.items():
        per_seed = []
        # A strategy with a rollout policy against the same strategy with K each (same budget), same seed.
        fixed_k = {run.seed: run for run in runs.get(base_name(strategy), [])}
        for run in strategy_runs:
            reference = baseline.get(run.seed)
            metrics = run_metrics(
                run,
                float(reference.accuracy[-1]) if reference else None,
                int(reference.rollouts[-1]) if reference else None,
            )
            # Speed-ups against uniform's whole run; None when the target was never (or trivially) met.
            steps_to, rollouts_to = metrics["steps_to_target"], metrics["rollouts_to_target"]
            metrics["step_speedup"] = (len(reference.accuracy) - 1) / steps_to if steps_to else None
            metrics["rollout_speedup"] = int(reference.rollouts[-1]) / rollouts_to if rollouts_to else None
            even = fixed_k.get(run.seed)
            metrics["mixed_vs_fixed_k"] = (
                float(run.mixed.sum() / even.mixed.sum()) if even is not None and even.mixed.sum() else None
            )
            per_seed.append({"seed": run.seed, **metrics})
        aggregated = {name: _mean_std([m[name] for m in per_seed]) for name in per_seed[0] if name != "seed"}
        hists = [run.count_hist for run in strategy_runs if run.count_hist is not None]
        if hists:  # groups per rollout count, summed over seeds (index = count)
            aggregated["count_hist"] = np.sum(hists, axis=0).tolist()
        aggregated["reached_target"] = sum(m["steps_to_target"] is not None for m in per_seed)
        aggregated["seeds"] = len(per_seed)
        summary[strategy] = {"aggregate": aggregated, "per_seed": per_seed}
    return summary


def curves(runs: dict[str, list[RunResult]]) -> dict[str, dict[str, list[float]]]:
    """Learning curves averaged over seeds: accuracy (mean, sample std) and cumulative rollouts per step
    (index 0 = before training), and the per-step share of mixed groups among the groups rolled out."""
    out = {}
    for strategy, strategy_runs in runs.items():
        accuracy = np.stack([run.accuracy for run in strategy_runs])
        rollouts = np.stack([run.rollouts for run in strategy_runs]).astype(np.float64)
        ratio = np.stack([run.mixed / np.maximum(run.groups, 1) for run in strategy_runs])
        out[strategy] = {
            "accuracy_mean": _rounded(accuracy.mean(axis=0)),
            "accuracy_std": _rounded(accuracy.std(axis=0, ddof=1 if len(strategy_runs) > 1 else 0)),
            "train_accuracy_mean": _rounded(
                np.stack([run.train_accuracy for run in strategy_runs]).mean(axis=0)
            ),
            "rollouts_mean": _rounded(rollouts.mean(axis=0), 1),
            "effective_ratio_mean": _rounded(ratio.mean(axis=0)),
            "predicted_partial_share_mean": _rounded(
                np.stack([run.predicted_partial / run.n_prompts for run in strategy_runs]).mean(axis=0)
            ),
        }
    return out


def _rounded(values: np.ndarray, digits: int = 5) -> list[float]:
    return [round(float(v), digits) for v in values]


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to `window` steps (shorter at the start), same length as `values`."""
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (cumulative[idx] - cumulative[lo]) / (idx - lo)


def plot_curves(
    curve_data: dict[str, dict[str, list[float]]], path: Path, title: str, window: int = 10
) -> None:
    """Three panels: accuracy vs step, accuracy vs rollouts, share of mixed groups vs step (smoothed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2), constrained_layout=True)
    colors = plt.get_cmap("tab20")
    for i, (strategy, data) in enumerate(curve_data.items()):
        color = "black" if strategy == BASELINE else colors(i % 20)
        variant = variant_of(strategy)
        style = "--" if strategy == BASELINE or variant.trainer else ":" if variant.policy else "-"
        mean = np.asarray(data["accuracy_mean"])
        std = np.asarray(data["accuracy_std"])
        steps = np.arange(len(mean))
        axes[0].plot(steps, mean, style, color=color, label=strategy, lw=1.6)
        axes[0].fill_between(steps, mean - std, mean + std, color=color, alpha=0.12, lw=0)
        axes[1].plot(
            np.asarray(data["rollouts_mean"]) / 1e3, mean, style, color=color, label=strategy, lw=1.6
        )
        ratio = _moving_average(np.asarray(data["effective_ratio_mean"]), window)
        axes[2].plot(np.arange(1, len(ratio) + 1), ratio, style, color=color, label=strategy, lw=1.6)
    axes[0].set(
        xlabel="training step", ylabel="held-out accuracy (mean true success rate)", title="accuracy vs step"
    )
    axes[1].set(xlabel="rollouts (thousands)", ylabel="held-out accuracy", title="accuracy vs rollouts")
    axes[2].set(
        xlabel="training step",
        ylabel=f"mixed groups / groups rolled out ({window}-step mean)",
        title="effective-sample ratio vs step",
        ylim=(0, 1.02),
    )
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(stat: dict[str, Any], scale: float = 1.0, digits: int = 3, spread: str = "std") -> str:
    if stat["mean"] is None:
        return "-"
    return f"{stat['mean'] / scale:.{digits}f} ± {stat[spread] / scale:.{digits}f}"


#: Table columns: header, aggregate metric, divisor, decimals.
_TABLE_COLUMNS = (
    ("effective ratio", "effective_ratio", 1.0, 3),
    ("mixed groups / step", "mixed_per_step", 1.0, 1),
    ("mixed vs K each", "mixed_vs_fixed_k", 1.0, 3),
    ("trained eff. ratio", "trained_effective_ratio", 1.0, 3),
    ("final accuracy", "final_accuracy", 1.0, 3),
    ("accuracy at uniform's rollouts", "accuracy_at_uniform_rollouts", 1.0, 3),
    ("steps to uniform's final", "steps_to_target", 1.0, 1),
    ("step speed-up", "step_speedup", 1.0, 2),
    ("rollouts to uniform's final (k)", "rollouts_to_target", 1e3, 1),
    ("rollout speed-up", "rollout_speedup", 1.0, 2),
    ("total rollouts (k)", "total_rollouts", 1e3, 1),
    ("HMM state accuracy", "state_accuracy", 1.0, 3),
    ("pool coverage", "coverage", 1.0, 2),
)


def format_table(summary: dict[str, Any], spread: str = "std") -> str:
    """The aggregate metrics (mean ± std over seeds, or ± the standard error with spread="se") as a
    Markdown table, readable in a terminal too. A metric averaged over fewer seeds than were run (target
    never reached) shows `(n/N seeds)`."""
    header = ["strategy", *[column[0] for column in _TABLE_COLUMNS]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for strategy, entry in summary.items():
        agg = entry["aggregate"]
        cells = [strategy]
        for _, name, scale, digits in _TABLE_COLUMNS:
            cell = _fmt(agg[name], scale, digits, spread)
            if agg[name]["n"] < agg["seeds"]:
                cell += f" ({agg[name]['n']}/{agg['seeds']} seeds)"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
