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


def _ratios(
    paired: Sequence[tuple[dict[str, Any], dict[str, Any]]],
) -> tuple[list[float | None], list[float]]:
    """For each (reference, run) pair of one seed: the run's rollouts to the reference's final held-out
    accuracy, and the reference's own rollouts to it divided by the run's (0 when never reached)."""
    to_target: list[float | None] = []
    ratios: list[float] = []
    for ref, run in paired:
        target = final(ref)
        ref_at = rollouts_to_reach(ref["evals"], target)
        run_at = rollouts_to_reach(run["evals"], target)
        to_target.append(run_at)
        if run_at is None or ref_at is None:
            ratios.append(0.0)
        elif ref_at == 0.0 and run_at == 0.0:  # the target was met before the first step
            ratios.append(1.0)
        else:
            ratios.append(ref_at / max(run_at, 1.0))
    return to_target, ratios


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
        row["profiling_rollouts"] = mean_se([r.get("profiling_rollouts", 0) for r in mine])[0]
        against_filter = [(by["filter", r["seed"]], r) for r in mine if ("filter", r["seed"]) in by]
        if against_filter:
            row["ratio_vs_filter"], row["ratio_vs_filter_se"] = mean_se(_ratios(against_filter)[1])
            diffs_f = [final(r) - final(f) for f, r in against_filter]
            row["vs_filter_heldout_sampled"], row["vs_filter_heldout_sampled_se"] = mean_se(diffs_f)
        paired = [(by["uniform", r["seed"]], r) for r in mine if ("uniform", r["seed"]) in by]
        if paired:
            diffs = {key: [final(r, key) - final(u, key) for u, r in paired] for key in METRICS}
            for key in METRICS:
                row[f"vs_uniform_{key}"], row[f"vs_uniform_{key}_se"] = mean_se(diffs[key])
            row["wins"] = f"{sum(d > 0 for d in diffs['heldout_sampled'])}/{len(paired)}"
            to_target, ratios = _ratios(paired)
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
    return {
        "strategies": out,
        "ratio_vs_uniform": ratio,
        "ratio_vs_filter": {k: v["ratio_vs_filter"] for k, v in out.items() if "ratio_vs_filter" in v},
        "profiling_rollouts": {k: v["profiling_rollouts"] for k, v in out.items()},
        "dynamics": dynamics(runs),
        "seeds": seeds,
    }


CLASSES = ("unsolved", "mixed", "solved")


def group_class(successes: int, size: int) -> int:
    return 0 if successes == 0 else 2 if successes == size else 1


def transitions(runs: Sequence[dict[str, Any]]) -> list[list[float]] | None:
    """Class transitions between consecutive visits of a prompt (rows: from unsolved, mixed, solved; each
    row the shares of the next visit's class), pooled over `runs`' groups; None without visits."""
    import numpy as np

    counts = np.zeros((3, 3))
    for run in runs:
        last: dict[int, int] = {}
        for prompt, wins, size in run.get("visits") or ():
            now = group_class(wins, size)
            if prompt in last:
                counts[last[prompt], now] += 1
            last[prompt] = now
    if not counts.sum():
        return None
    rows = counts.sum(axis=1, keepdims=True)
    return (counts / np.where(rows > 0, rows, 1)).round(4).tolist()


def epoch_pass_rate(run: dict[str, Any], *, first: bool) -> float:
    """The pool's mean pass rate in the run's first (last) pool's worth of groups, successes over
    rollouts, as the trace's per-epoch training accuracy is measured (under uniform, a pool's worth of
    groups is one visit of every prompt); the pool probe's sampled accuracy for a run without visits."""
    visits, size = run.get("visits"), len(run.get("pool_p0") or ())
    if not visits or not size:
        return run["evals"][0]["pool_sampled"] if first else final(run, "pool_sampled")
    part = visits[:size] if first else visits[-size:]
    return sum(v[1] for v in part) / sum(v[2] for v in part)


def dynamics(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """How the pass rates move under uniform selection (its runs), beside the One-Shot-RLVR trace's
    (bench.learner.regimes.TRACE_*): class transitions between consecutive visits, the pool's mean pass
    rate in its first and its last epoch (`epoch_pass_rate`), and uniform's held-out gain."""
    from bench.learner.regimes import TRACE_POOL_PASS_RATE, TRACE_TRANSITIONS

    mine = [r for r in runs if r["strategy"] == "uniform"]
    if not mine:
        return None
    rows = transitions(mine)
    gap = None
    if rows is not None:
        gap = max(abs(a - b) for row, ref in zip(rows, TRACE_TRANSITIONS, strict=True)
                  for a, b in zip(row, ref, strict=True))  # fmt: skip
    gain, gain_se = mean_se([final(r) - r["evals"][0]["heldout_sampled"] for r in mine])
    return {
        "transitions": rows,
        "trace_transitions": [list(r) for r in TRACE_TRANSITIONS],
        "largest_gap_to_trace": gap,
        "pool_pass_rate_first": mean_se([epoch_pass_rate(r, first=True) for r in mine])[0],
        "pool_pass_rate_last": mean_se([epoch_pass_rate(r, first=False) for r in mine])[0],
        "trace_pool_pass_rate": list(TRACE_POOL_PASS_RATE),
        "uniform_heldout_gain": gain,
        "uniform_heldout_gain_se": gain_se,
    }


def _f(value: Any, se: Any = None, digits: int = 3) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return f"{text} ± {se:.{digits}f}" if se is not None else text


def markdown(summary: dict[str, Any], regime: Any) -> str:
    lines = [
        f"Regime `{regime.name}`: {regime.about}. Seeds {summary['seeds']}; every run spends "
        f"{regime.rollout_budget:,} rollouts (B = {regime.batch_size}, K = {regime.rollouts}), its profile "
        "included.",
        "",
        "| strategy | profiling rollouts | mixed groups | held-out sampled, final | vs uniform (paired) | wins "
        "| vs filter (paired) | held-out greedy | pool sampled | rollouts to uniform's final | ratio vs uniform "
        "| ratio vs filter | share of oracle's gain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in summary["strategies"].items():
        lines.append(
            f"| {name} | {_f(row.get('profiling_rollouts'), None, 0)} "
            f"| {_f(row['mixed_share'], row['mixed_share_se'], 2)} "
            f"| {_f(row['final_heldout_sampled'], row['final_heldout_sampled_se'])} "
            f"| {_f(row.get('vs_uniform_heldout_sampled'), row.get('vs_uniform_heldout_sampled_se'))} "
            f"| {row.get('wins', '-')} "
            f"| {_f(row.get('vs_filter_heldout_sampled'), row.get('vs_filter_heldout_sampled_se'))} "
            f"| {_f(row['final_heldout_greedy'], row['final_heldout_greedy_se'])} "
            f"| {_f(row['final_pool_sampled'], row['final_pool_sampled_se'])} "
            f"| {_f(row.get('rollouts_to_uniform_final_mean'), None, 0)} ({row.get('reached', '-')}) "
            f"| {_f(row.get('ratio_vs_uniform'), row.get('ratio_vs_uniform_se'), 2)} "
            f"| {_f(row.get('ratio_vs_filter'), row.get('ratio_vs_filter_se'), 2)} "
            f"| {_f(row.get('share_of_oracle_gain'), None, 2)} |"
        )
    moves = summary.get("dynamics")
    if moves and moves.get("transitions"):
        lines += ["", "How pass rates move under uniform (class of a prompt's group at one visit -> the next; "
                  "the One-Shot-RLVR trace's in brackets):", "", "| from | unsolved | mixed | solved |",
                  "|---|---|---|---|"]  # fmt: skip
        for name, row, ref in zip(CLASSES, moves["transitions"], moves["trace_transitions"], strict=True):
            lines.append(
                f"| {name} | "
                + " | ".join(f"{a:.2f} ({b:.2f})" for a, b in zip(row, ref, strict=True))
                + " |"
            )
        lines += ["", f"Pool pass rate {moves['pool_pass_rate_first']:.3f} -> {moves['pool_pass_rate_last']:.3f} "
                  f"(trace {moves['trace_pool_pass_rate'][0]:.3f} -> {moves['trace_pool_pass_rate'][1]:.3f}); "
                  f"uniform's held-out gain {_f(moves['uniform_heldout_gain'], moves['uniform_heldout_gain_se'])}."]  # fmt: skip
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
        xs = np.mean([[rec["total_rollouts"] + rec.get("profile_rollouts", 0) for rec in r["records"][:steps]]
                      for r in mine], axis=0)  # fmt: skip
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
