"""What a comparison of the learning benchmark says: per-strategy results over seeds, paired with
uniform's by seed, rollouts to uniform's final accuracy, the table and the plot.

Definitions (docs/strategies.md, "Results: a real learner on the CPU"):

- *final* accuracy of a run: the mean of its last ``FINAL_POINTS`` evaluations (the last tenth of its
  rollouts at the default evaluation spacing), which is steadier than the very last point;
- *rollouts to uniform's final*: the rollouts at which a run's held-out sampled accuracy first reaches
  the final accuracy of uniform's run of the same seed (linear between evaluations); ``None`` if never;
- ``ratio_vs_uniform`` of a strategy: per seed, uniform's rollouts to its own final divided by the
  strategy's rollouts to it (0 when the strategy never gets there), then the mean over seeds;
- *share of the oracle's gain*: (strategy's final - uniform's final) / (oracle's final - uniform's final),
  from the means over seeds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.learner.run import rollouts_to_reach

FINAL_POINTS = 3
METRICS = ("heldout_sampled", "heldout_greedy", "pool_sampled")


def mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    if len(values) == 1:
        return values[0], None
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def final(run: dict[str, Any], key: str = "heldout_sampled") -> float:
    points = run["evals"][-FINAL_POINTS:]
    return statistics.fmean(p[key] for p in points)


def mixed_share(run: dict[str, Any]) -> float:
    """Mixed groups among every group the run generated."""
    groups = sum(len_groups(r) for r in run["records"])
    mixed = sum(r["effective_ratio"] * len_groups(r) for r in run["records"])
    return mixed / groups if groups else 0.0


def len_groups(record: dict[str, Any]) -> float:
    return record["rollouts"] / record.get("group_size_mean", 1.0)


def summarize(runs: list[dict[str, Any]], strategies: Sequence[str]) -> dict[str, Any]:
    """Per-strategy results and the paired comparison with uniform (needs uniform among the runs for
    the paired figures; the rest is reported without it)."""
    by = {(r["strategy"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    out: dict[str, Any] = {}
    ratio: dict[str, float | None] = {}
    for strategy in strategies:
        mine = [by[strategy, s] for s in seeds if (strategy, s) in by]
        if not mine:
            continue
        row: dict[str, Any] = {"seeds": [r["seed"] for r in mine]}
        for key in METRICS:
            row[f"final_{key}"], row[f"final_{key}_se"] = mean_se([final(r, key) for r in mine])
        row["initial_heldout_sampled"] = mean_se([r["evals"][0]["heldout_sampled"] for r in mine])[0]
        row["mixed_share"], row["mixed_share_se"] = mean_se([mixed_share(r) for r in mine])
        row["distinct_prompts"] = mean_se([r.get("distinct_prompts") for r in mine])[0]
        row["most_visits"] = mean_se([r.get("most_visits") for r in mine])[0]
        row["rollouts"] = mean_se([r["evals"][-1]["rollouts"] for r in mine])[0]
        row["steps"] = mean_se([len(r["records"]) for r in mine])[0]
        row["seconds"] = mean_se([r["seconds"] for r in mine])[0]
        paired = [(by["uniform", r["seed"]], r) for r in mine if ("uniform", r["seed"]) in by]
        if paired:
            diffs = {key: [final(r, key) - final(u, key) for u, r in paired] for key in METRICS}
            for key in METRICS:
                row[f"vs_uniform_{key}"], row[f"vs_uniform_{key}_se"] = mean_se(diffs[key])
            row["wins"] = f"{sum(d > 0 for d in diffs['heldout_sampled'])}/{len(paired)}"
            to_target, ratios = [], []
            for u, r in paired:
                target = final(u)
                u_at = rollouts_to_reach(u["evals"], target)
                r_at = rollouts_to_reach(r["evals"], target)
                to_target.append(r_at)
                if r_at is None:
                    ratios.append(0.0)
                elif u_at == 0.0 and r_at == 0.0:  # the target was met before the first step
                    ratios.append(1.0)
                else:
                    ratios.append(u_at / max(r_at, 1.0))
            row["rollouts_to_uniform_final"] = to_target
            row["rollouts_to_uniform_final_mean"] = mean_se([t for t in to_target if t is not None])[0]
            row["reached"] = f"{sum(t is not None for t in to_target)}/{len(paired)}"
            row["ratio_vs_uniform"], row["ratio_vs_uniform_se"] = mean_se(ratios)
            ratio[strategy] = row["ratio_vs_uniform"]
        out[strategy] = row
    oracle, uniform = out.get("oracle"), out.get("uniform")
    if oracle and uniform:
        gain = oracle["final_heldout_sampled"] - uniform["final_heldout_sampled"]
        for row in out.values():
            row["share_of_oracle_gain"] = (
                (row["final_heldout_sampled"] - uniform["final_heldout_sampled"]) / gain if gain > 0 else None
            )
    return {"strategies": out, "ratio_vs_uniform": ratio, "seeds": seeds}


def _f(value: Any, se: Any = None, digits: int = 3) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return f"{text} ± {se:.{digits}f}" if se is not None else text


def markdown(summary: dict[str, Any], regime: Any) -> str:
    lines = [
        f"Regime `{regime.name}`: {regime.about}. Seeds {summary['seeds']}; every run spends "
        f"{regime.rollout_budget:,} rollouts (B = {regime.batch_size}, K = {regime.rollouts}).",
        "",
        "| strategy | mixed groups | held-out sampled, final | vs uniform (paired) | wins | held-out greedy | "
        "pool sampled | rollouts to uniform's final | ratio vs uniform | share of oracle's gain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in summary["strategies"].items():
        lines.append(
            f"| {name} | {_f(row['mixed_share'], row['mixed_share_se'], 2)} "
            f"| {_f(row['final_heldout_sampled'], row['final_heldout_sampled_se'])} "
            f"| {_f(row.get('vs_uniform_heldout_sampled'), row.get('vs_uniform_heldout_sampled_se'))} "
            f"| {row.get('wins', '-')} "
            f"| {_f(row['final_heldout_greedy'], row['final_heldout_greedy_se'])} "
            f"| {_f(row['final_pool_sampled'], row['final_pool_sampled_se'])} "
            f"| {_f(row.get('rollouts_to_uniform_final_mean'), None, 0)} ({row.get('reached', '-')}) "
            f"| {_f(row.get('ratio_vs_uniform'), row.get('ratio_vs_uniform_se'), 2)} "
            f"| {_f(row.get('share_of_oracle_gain'), None, 2)} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], strategies: Sequence[str], path: Path, title: str) -> None:
    """Held-out sampled and greedy accuracy and the pool's accuracy against rollouts (mean over seeds,
    a band of one standard error), and the share of mixed groups per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.6))
    panels = (("heldout_sampled", "held-out accuracy, sampled (exact)"), ("heldout_greedy", "held-out accuracy, greedy"),
              ("pool_sampled", "pool accuracy, sampled (500 prompts)"))  # fmt: skip
    colours = plt.get_cmap("tab10")
    for index, strategy in enumerate(strategies):
        mine = [r for r in runs if r["strategy"] == strategy]
        if not mine:
            continue
        colour = colours(index % 10)
        length = min(len(r["evals"]) for r in mine)
        x = np.mean([[p["rollouts"] for p in r["evals"][:length]] for r in mine], axis=0)
        for axis, (key, label) in zip(axes[:3], panels, strict=True):
            y = np.array([[p[key] for p in r["evals"][:length]] for r in mine])
            centre = y.mean(axis=0)
            axis.plot(x, centre, color=colour, label=strategy, lw=1.6 if strategy != "oracle" else 2.2,
                      ls="--" if strategy == "oracle" else "-")  # fmt: skip
            if len(mine) > 1:
                se = y.std(axis=0, ddof=1) / np.sqrt(len(mine))
                axis.fill_between(x, centre - se, centre + se, color=colour, alpha=0.15)
            axis.set_title(label, fontsize=10)
            axis.set_xlabel("rollouts")
        steps = min(len(r["records"]) for r in mine)
        xs = np.mean([[rec["total_rollouts"] for rec in r["records"][:steps]] for r in mine], axis=0)
        ys = np.mean([[rec["effective_ratio"] for rec in r["records"][:steps]] for r in mine], axis=0)
        window = max(1, steps // 30)
        smooth = np.convolve(ys, np.ones(window) / window, mode="valid")
        axes[3].plot(xs[window - 1 :], smooth, color=colour, label=strategy)
    axes[3].set_title("mixed groups per step (moving mean)", fontsize=10)
    axes[3].set_xlabel("rollouts")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
