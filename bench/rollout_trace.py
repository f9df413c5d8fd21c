"""Replay a real GRPO run's per-epoch outcomes offline: how many mixed groups does each rollout policy buy?

    python bench/rollout_trace.py PATH [--k 4] [--min 2] [--seeds 10] [--no-filter-arms]

PATH is a JSON object {prompt id: [accuracy at epoch 0, epoch 1, ...]} with accuracies in multiples of
1/R (R rollouts per prompt per epoch, `--trace-rollouts`, default 8). The trace this benchmark was built
for is `data/acc_step_500.json` of the public repository ypwang61/One-Shot-RLVR (Apache-2.0): the training
accuracy of each of the 1,209 DeepScaleR prompts of its "DSR-sub" set at every epoch of a 500-step GRPO
run of Qwen2.5-Math-1.5B, 8 rollouts per prompt per epoch (44 to 57 epochs per prompt). This repository
does not ship it: download that file and pass its path.

The replay, per seed and per policy, epoch after epoch (the first `--epochs` epochs, by default as many
as the shortest prompt has):

1. BEFORE seeing the epoch, the strategy picks B prompts (`--batch-size`, default every prompt, as the
   real run trained every prompt once per epoch; with a smaller B the core's `--strategy` picks them) and
   a count n_i per prompt: K each (fixed K), or the service's allocation (selector_service.core
   `allocate_rollouts`, exactly as DatasetState.rollout_counts calls it: each prompt's Beta belief, ties
   from the seeded stream) of the budget B x K with counts in [min, min(max, R)].
2. It sees a group of n_i outcomes drawn without replacement from that epoch's R real outcomes of the
   prompt (S_i of them successes: a hypergeometric draw), and reports the group to its beliefs like the
   service's /observe (`apply_results` with the group's own size, then the step's close).

A group is mixed (GRPO's advantage is non-zero) when it holds a success and a failure: 0 < s < n; a
group of one never is. Reported per policy, mean ± standard error over seeds: mixed groups per epoch,
mixed groups per rollout, the effective-sample ratio (mixed groups / groups), and mixed groups against
fixed K and against the knapsack policy, paired by seed (every row draws from one stream per seed). The `oracle` row is a ceiling, not a policy: the same greedy allocation on each prompt's exact
probability of a mixed group of n from THIS epoch's outcomes, which no strategy can know in advance.

`selector-service replay` (docs/replay.md) asks the selection question of any run's log through the
service; this script keeps the rollout-count question. They share the reader (the trace is read as the
command reads an accuracy file) and the mixed-group test, and a smaller batch is picked with the stream
key the command gives the strategy's arm, so with `--k` equal to the trace's rollouts and `--seeds 1` the
fixed-K row is the command's arm `--strategy`, mixed groups identical at every epoch.

Beside the rollout-count rows, two rows ask what a pass-rate filter buys with its profile paid for: the
command's arms `filter` (the static offline filter: epoch 0 is the profile, then uniform picks among the
prompts whose epoch-0 accuracy is strictly between 0 and 1) and `filter_reprofile` (the service's strategy
`filter` at its defaults, epoch 0 uploaded as the profile, beliefs moved by the run's outcomes), run
through the real service exactly as the command runs them (selector_service/replay/arms.py BASELINES, on
an embedded service, as bench/filter_trace.py does; a few seconds, `--no-filter-arms` skips them). They
pick B prompts at each of epochs 1..E-1 and see each pick's whole epoch group (R real outcomes); the
profile is epoch 0, N x R rollouts (1,209 x 8 = 9,672 on the One-Shot-RLVR trace), counted. A filter
needs B below the pool to choose anything, so their B is `--batch-size` when given, else 128 (as in
bench/filter_trace.py; the output says which). Every row reports `effective_per_rollout`: mixed groups
over (the rollouts of the epochs it replayed + its profiling rollouts), which is mixed groups per rollout
for the rollout-count rows (no profile). The command's own figure (docs/replay.md) charges the profile as
a share of a run's budget instead; at B = N the two agree.

Writes bench/out/rollout_trace.json and bench/out/rollout_trace.png; ends stdout with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OUT_DIR, emit
from rlvr_selector_client.client import SelectorClient
from selector_service.core import (
    BeliefArrays,
    allocate_gains,
    allocate_rollouts,
    apply_results,
    close_open_step,
    outcomes_from_counts,
)
from selector_service.core.coldstart import prior_arrays
from selector_service.core.rng import stream
from selector_service.core.strategies import select, validate_params
from selector_service.replay.arms import build_arm
from selector_service.replay.logs import LogError, read_log
from selector_service.replay.protocol import ArmResult, Epoch, EpochTable, is_mixed
from selector_service.replay.protocol import replay as replay_arm
from selector_service.replay.service import dataset_name, embedded_service

SOURCE = (
    "data/acc_step_500.json of github.com/ypwang61/One-Shot-RLVR (Apache-2.0): per-epoch training accuracy "
    "of 1,209 DeepScaleR prompts in a GRPO run of Qwen2.5-Math-1.5B, 8 rollouts per prompt per epoch"
)
FIXED = "fixed"
POLICIES = ("uniform", "knapsack", "variance", "posterior")
ORACLE = "oracle"
ROWS = (FIXED, *POLICIES, ORACLE)
#: The replay's arms with the profile counted (module docstring), and their B when --batch-size is not given.
FILTER_ROWS = ("filter", "filter_reprofile")
FILTER_BATCH = 128


@dataclass(frozen=True)
class Trace:
    """Successes S[i, e] of prompt i at epoch e among `rollouts` outcomes; ids are the trace's keys."""

    keys: list[str]
    successes: np.ndarray  # i64[N, E]
    rollouts: int

    @property
    def n_prompts(self) -> int:
        return self.successes.shape[0]

    @property
    def n_epochs(self) -> int:
        return self.successes.shape[1]


def load_trace(path: Path, rollouts: int = 8, epochs: int | None = None) -> Trace:
    """Read a trace file (module docstring) with the product's reader (`selector-service replay`'s: its
    epochs are those every prompt has, the shortest list) and keep the first `epochs` when given. Raises
    SystemExit with a message that says what is wrong."""
    if not path.is_file():
        raise SystemExit(f"rollout_trace: no trace at {path}. The trace is {SOURCE}; pass its path.")
    try:
        log = read_log(path, fmt="accuracy", trials=rollouts)
    except LogError as error:
        raise SystemExit(f"rollout_trace: {error}") from None
    # Every prompt is in every epoch of an accuracy file: one column per epoch, rows in prompt-id order.
    successes = log.successes.reshape(-1, log.n_prompts).T  # groups are sorted by step, then prompt
    shortest = successes.shape[1]
    if epochs is not None:
        if not 1 <= epochs <= shortest:
            raise SystemExit(
                f"rollout_trace: --epochs must lie in 1..{shortest} (the shortest prompt's epochs)"
            )
        successes = successes[:, :epochs]
    return Trace([str(k) for k in log.keys.tolist()], np.ascontiguousarray(successes), rollouts)


def epoch_table(trace: Trace) -> EpochTable:
    """The trace as the replay's epochs (one per trace column, every prompt observed with R outcomes): the
    epochs the other rows replay, `--epochs` included."""
    ids, trials = np.arange(trace.n_prompts, dtype=np.int64), np.full(trace.n_prompts, trace.rollouts)
    epochs = [Epoch(ids, trace.successes[:, e].copy(), trials, e, e) for e in range(trace.n_epochs)]
    return EpochTable(trace.n_prompts, epochs, trace.n_prompts)


def filter_runs(table: EpochTable, batch_size: int, seeds: int) -> dict[str, list[dict[str, Any]]]:
    """The `FILTER_ROWS` arms of the replay (arms.py), seeds 0..seeds-1, on an embedded service, B =
    `batch_size`; each run as `replay` returns it, over the epochs the arm picked in (1.. after its
    profile), with `profile`: the profiling rollouts the service counted."""
    out: dict[str, list[dict[str, Any]]] = {}
    with embedded_service() as url, SelectorClient(url, timeout=120.0) as client:
        for name in FILTER_ROWS:
            for seed in range(seeds):
                (result,) = replay_arm(table, [build_arm(name, client, seed)], batch_size)
                if result.skipped is not None:
                    raise SystemExit(f"rollout_trace: arm {name}: {result.skipped}")
                out.setdefault(name, []).append(_as_run(result))
    return out


def _as_run(result: ArmResult) -> dict[str, Any]:
    picked = slice(1 if result.profile else 0, None)
    return {
        "mixed": result.mixed[picked],
        "spent": result.rollouts[picked],
        "groups": int(result.groups[picked].sum()),
        "profile": result.profile_rollouts,
    }


def mixed_probability_without_replacement(successes: np.ndarray, total: int, n: np.ndarray) -> np.ndarray:
    """P(0 < s < n) for s, the successes of n draws without replacement from `total` outcomes of which
    `successes` succeed: 1 - [C(S, n) + C(total - S, n)] / C(total, n)."""
    comb = np.vectorize(math.comb, otypes=[np.float64])
    return 1.0 - (comb(successes, n) + comb(total - successes, n)) / comb(total, n)


def oracle_counts(successes: np.ndarray, total: int, budget: int, lo: int, hi: int, ids, rng) -> np.ndarray:
    """The ceiling: greedy allocation (core `allocate_gains`) on the exact probability that a group of n
    from this epoch's outcomes is mixed (concave in n: its gains never rise; a running minimum guards it)."""
    levels = np.arange(lo, hi + 1)
    value = mixed_probability_without_replacement(successes[:, None], total, levels[None, :])
    gains = np.minimum.accumulate(np.diff(value, axis=1), axis=1)
    return allocate_gains(gains, budget=budget, min_rollouts=lo, tie_keys=rng.bits_at(ids), ids=ids)


@dataclass(frozen=True)
class Setting:
    k: int  # rollouts per prompt of fixed K; the budget is B x k
    lo: int
    hi: int
    batch_size: int
    strategy: str
    beta_decay: float
    hmm_decay: float


def replay(trace: Trace, row: str, setting: Setting, seed: int) -> dict[str, Any]:
    """One (row, seed) replay (module docstring); per-epoch series and the counts' histogram."""
    n, total = trace.n_prompts, trace.rollouts
    key = f"trace-{seed}"  # the allocation's ties
    # A smaller batch is picked with the stream key `selector-service replay` gives the strategy's arm
    # (its dataset's name): with --k equal to the trace's rollouts, the fixed-K row is that arm.
    arm_key = dataset_name(setting.strategy)
    beliefs = BeliefArrays.new(n, 1.0, 1.0, beta_decay=setting.beta_decay, hmm_decay=setting.hmm_decay)
    draws = np.random.default_rng([seed, 7])  # the same stream for every row: paired draws
    params = validate_params(setting.strategy, {})
    budget = setting.batch_size * setting.k
    mixed = np.zeros(trace.n_epochs, dtype=np.int64)
    spent = np.zeros(trace.n_epochs, dtype=np.int64)
    hist = np.zeros(setting.hi + 1, dtype=np.int64)
    for epoch in range(trace.n_epochs):
        if setting.batch_size == n:
            ids = np.arange(n, dtype=np.int64)
        else:
            ids, _ = select(
                beliefs,
                strategy=setting.strategy,
                params=params,
                batch_size=setting.batch_size,
                step=epoch,
                seed=seed,
                key=arm_key,
                dataset_k=total,
            )
        succ = trace.successes[ids, epoch]
        ties = stream(key, epoch, seed, "rollouts")
        if row == FIXED:
            counts = np.full(ids.size, setting.k, dtype=np.int64)
        elif row == ORACLE:
            counts = oracle_counts(succ, total, budget, setting.lo, setting.hi, ids, ties)
        else:
            alpha, beta, _ = prior_arrays(beliefs, ids)
            counts = allocate_rollouts(
                alpha,
                beta,
                ids,
                budget=budget,
                min_rollouts=setting.lo,
                max_rollouts=setting.hi,
                policy=row,
                rng=ties,
            )
        seen = draws.hypergeometric(succ, total - succ, counts).astype(np.float64)
        trials = counts.astype(np.float64)
        apply_results(beliefs, ids, seen, trials, outcomes_from_counts(seen, trials))
        close_open_step(beliefs, key=arm_key)
        mixed[epoch] = int(is_mixed(seen, trials).sum())
        spent[epoch] = int(counts.sum())
        np.add.at(hist, counts, 1)
    return {"mixed": mixed, "spent": spent, "groups": setting.batch_size * trace.n_epochs, "hist": hist}


def _mean_se(values: Sequence[float]) -> dict[str, float]:
    x = np.asarray(values, dtype=np.float64)
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
    return {"mean": float(x.mean()), "se": se}


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per row: mean ± standard error over seeds, effective groups per rollout with the profile counted
    (mixed / (rollouts + profiling rollouts)), and, for the rollout-count rows, mixed groups against fixed
    K and against Knapsack RL's policy, paired by seed."""
    fixed, knapsack = runs[FIXED], runs["knapsack"]
    out: dict[str, Any] = {}
    for row, seeds in runs.items():
        per_seed = []
        for i, run in enumerate(seeds):
            m, spent, profile = int(run["mixed"].sum()), int(run["spent"].sum()), run.get("profile", 0)
            s = {
                "mixed_per_epoch": m / run["mixed"].size,
                "mixed_per_rollout": m / spent,
                "effective_per_rollout": m / (spent + profile),
                "effective_ratio": m / run["groups"],
                "rollouts": spent,
                "profiling_rollouts": profile,
            }
            if row in ROWS:
                s["mixed_vs_fixed"] = m / max(int(fixed[i]["mixed"].sum()), 1)
                s["mixed_vs_knapsack"] = m / max(int(knapsack[i]["mixed"].sum()), 1)
            per_seed.append(s)
        out[row] = {name: _mean_se([s[name] for s in per_seed]) for name in per_seed[0]}
        if "hist" in seeds[0]:
            out[row]["count_hist"] = np.sum([r["hist"] for r in seeds], axis=0).tolist()
        out[row]["mixed_curve"] = np.mean([r["mixed"] for r in seeds], axis=0).round(3).tolist()
    return out


def format_table(summary: dict[str, Any]) -> str:
    lines = [
        "| policy | mixed groups / epoch | mixed groups / rollout | effective / rollout, profile counted "
        "| effective-sample ratio | mixed vs fixed K | mixed vs knapsack |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(s: dict[str, Any], name: str, digits: int) -> str:
        return f"{s[name]['mean']:.{digits}f} ± {s[name]['se']:.{digits}f}" if name in s else "-"

    for row, s in summary.items():
        cells = [
            cell(s, "mixed_per_epoch", 1),
            cell(s, "mixed_per_rollout", 4),
            cell(s, "effective_per_rollout", 4),
            cell(s, "effective_ratio", 3),
            cell(s, "mixed_vs_fixed", 3),
            cell(s, "mixed_vs_knapsack", 4),
        ]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path, title: str) -> None:
    """Per setting: mixed groups per epoch of each row (mean over seeds), and the counts' histogram."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(results)
    fig, axes = plt.subplots(len(settings), 2, figsize=(13, 4.2 * len(settings)), squeeze=False)
    colors = {FIXED: "black", "uniform": "grey", "knapsack": "tab:blue", "variance": "tab:green"}
    colors |= {"posterior": "tab:red", ORACLE: "tab:purple"}
    for (curve_ax, hist_ax), name in zip(axes, settings, strict=True):
        summary = results[name]["summary"]
        for row, s in summary.items():
            if row not in colors:  # the filter rows: another batch, whole groups
                continue
            style = "--" if row in (FIXED, ORACLE) else "-"
            curve_ax.plot(s["mixed_curve"], style, color=colors[row], label=row, lw=1.5)
            hist = np.asarray(s["count_hist"], dtype=np.float64)
            counts = np.arange(hist.size)
            if row not in (FIXED, "uniform"):
                hist_ax.plot(counts, hist / hist.sum(), "o-", color=colors[row], label=row, ms=3, lw=1)
        curve_ax.set(
            xlabel="epoch", ylabel="mixed groups (mean over seeds)", title=f"{name}: mixed groups per epoch"
        )
        hist_ax.set(xlabel="rollouts given to a prompt", ylabel="share of groups", title=f"{name}: counts")
        for ax in (curve_ax, hist_ax):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    trace = load_trace(args.path, args.trace_rollouts, args.epochs)
    batch = trace.n_prompts if args.batch_size is None else args.batch_size
    if not 1 <= batch <= trace.n_prompts:
        raise SystemExit(f"rollout_trace: --batch-size must lie in 1..{trace.n_prompts}")
    hi = min(args.max, trace.rollouts)
    started = time.perf_counter()
    filter_batch = min(args.batch_size or FILTER_BATCH, trace.n_prompts)
    filter_note = None
    filtered: dict[str, list[dict[str, Any]]] = {}
    if not args.no_filter_arms and trace.n_epochs >= 2:
        filtered = filter_runs(epoch_table(trace), filter_batch, args.seeds)
        rule = "--batch-size" if args.batch_size else "no --batch-size: bench/filter_trace.py's"
        filter_note = (
            f"rows {', '.join(FILTER_ROWS)}: B = {filter_batch} ({rule}), each pick's {trace.rollouts} real "
            f"outcomes, epochs 1..{trace.n_epochs - 1} after the epoch-0 profile "
            f"({trace.n_prompts} x {trace.rollouts} = {trace.n_prompts * trace.rollouts} rollouts, counted)"
        )
    results: dict[str, Any] = {}
    for k in args.k:
        if not 1 <= args.min <= k <= hi:
            raise SystemExit(f"rollout_trace: need 1 <= --min <= K <= min(--max, {trace.rollouts}); K = {k}")
        setting = Setting(k, args.min, hi, batch, args.strategy, args.beta_decay, args.hmm_decay)
        runs = {row: [replay(trace, row, setting, seed) for seed in range(args.seeds)] for row in ROWS}
        summary = summarize(runs | filtered)
        name = f"K={k}"
        results[name] = {"setting": setting.__dict__, "summary": summary}
        print(f"\n{name}: budget {batch} x {k} per epoch, counts in [{args.min}, {hi}], {args.seeds} seeds")
        if filter_note:
            print(filter_note)
        print(format_table(summary))
    seconds = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out / "rollout_trace.json", args.out / "rollout_trace.png"
    report = {
        "benchmark": "rollout_trace",
        "trace": str(args.path),
        "source": SOURCE,
        "prompts": trace.n_prompts,
        "epochs": trace.n_epochs,
        "trace_rollouts": trace.rollouts,
        "seeds": args.seeds,
        "seconds": round(seconds, 2),
        "filter_batch_size": filter_batch if filtered else None,
        "filter_note": filter_note,
        "results": results,
    }
    json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if not args.no_plot:
        title = (
            f"trace replay: {trace.n_prompts} prompts, {trace.n_epochs} epochs, groups drawn from each epoch's "
            f"{trace.rollouts} real outcomes; B = {batch}, {args.seeds} seeds"
        )
        plot(results, png_path, title)
    print(f"\n{seconds:.1f} s; wrote {json_path}")
    metrics = (
        "mixed_per_rollout",
        "effective_per_rollout",
        "effective_ratio",
        "mixed_vs_fixed",
        "mixed_vs_knapsack",
    )
    headline = {
        name: {row: {m: s[m]["mean"] for m in metrics if m in s} for row, s in r["summary"].items()}
        for name, r in results.items()
    }
    line = {
        "benchmark": "rollout_trace",
        "prompts": trace.n_prompts,
        "epochs": trace.n_epochs,
        "seeds": args.seeds,
        "seconds": round(seconds, 2),
        "filter_batch_size": filter_batch if filtered else None,
        "json": str(json_path),
        "png": None if args.no_plot else str(png_path),
        "results": headline,
    }
    emit(line, None)
    return report


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("path", type=Path, help=f"the trace JSON ({SOURCE})")
    parser.add_argument(
        "--k", type=lambda s: [int(x) for x in s.split(",")], default=[4], help="fixed K (comma list)"
    )
    parser.add_argument("--min", type=int, default=2, help="fewest rollouts a policy gives a prompt")
    parser.add_argument("--max", type=int, default=8, help="most (at most the trace's rollouts per epoch)")
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..seeds-1 (draws and ties)")
    parser.add_argument("--epochs", type=int, help="epochs replayed (default: the shortest prompt's)")
    parser.add_argument("--batch-size", type=int, help="prompts per epoch (default: all)")
    parser.add_argument("--strategy", default="uniform", help="core strategy that picks a smaller batch")
    parser.add_argument(
        "--beta-decay", type=float, default=1.0, help="Beta forgetting factor (service default 1)"
    )
    parser.add_argument("--hmm-decay", type=float, default=0.7, help="DPS HMM decay")
    parser.add_argument(
        "--trace-rollouts", type=int, default=8, help="outcomes per prompt per epoch in the trace"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--no-filter-arms", action="store_true", help="skip the filter rows (they start a service)"
    )
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    return args


if __name__ == "__main__":
    main()
