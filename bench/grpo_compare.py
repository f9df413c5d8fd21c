"""Real GRPO runs compared: uniform vs INSIGHT vs DPS vs Dynamic Sampling on procedural arithmetic.

Starts one selector service on its embedded store (a fresh data directory), then runs
``trainer-client train`` once per strategy against it: SmolLM2-135M-Instruct, the same arithmetic
prompts (same ``--seed``), the same B, K, sampling and GRPO settings, each strategy on its own service
dataset (beliefs are per dataset, so runs never share evidence).

Rollout budget: uniform, INSIGHT and DPS spend exactly ``steps * B * K`` rollouts. Dynamic Sampling
over-samples ``--ds-oversample`` x B prompts per round and reports every rollout, so it runs
``ceil(steps / ds_oversample)`` steps: at least the same budget (one round per step), more when it
needs extra rounds to find B mixed groups; it is evaluated every ``ceil(eval_every / ds_oversample)``
steps so that its evaluations fall at comparable rollout counts. Curves are therefore compared against cumulative rollouts,
and the summary reads every strategy's greedy evaluation accuracy at the largest evaluation point
within the common budget ``steps * B * K``.

What is measured, per strategy: train-batch reward and solve rate per step (biased by selection: a
selector that picks half-solved prompts sees lower batch rewards by design), greedy accuracy on a fixed
evaluation subset every ``--eval-every`` steps (comparable across strategies), the effective-sample
ratio (share of groups whose rewards are not all equal, the only groups GRPO learns from), rollouts and
wall time.

Run: ``python bench/grpo_compare.py`` or ``--quick`` (a smoke test of the whole pipeline: 5 minutes on
a busy 2-core CPU). Cost of the defaults (B=4, K=8, 32 new tokens, 10 steps, vLLM CPU backend), from
probes on a 2-core CPU shared with other jobs: a B=8 step took about 60 s there (generation 21 s,
training 34 s) and model + engine start-up about 40 s per run, so the four runs take roughly 20-25
minutes, less on an idle machine. ``--backend hf`` generates more slowly.

Several seeds (``--seeds 0,1,2``) repeat every strategy with another set of arithmetic prompts, sampling
and evaluation subset; the summary then gives each strategy's mean and standard error over seeds, and the
per-seed differences to uniform (paired: same seed, same prompts, same evaluation subset). ``--parallel
N`` runs N trainer processes at once (on a GPU machine with spare cores; each gets
``cpu_count // N`` threads), and ``--deadline`` bounds the whole comparison: runs still going then are
stopped, their finished steps kept, and every run is compared at the largest rollout count that all of
them reached (the "common budget"), so a cut-short run never compares against a longer one.

Writes ``bench/out/grpo_compare/<strategy>-seed<k>.jsonl`` (+ ``.log``), ``grpo_compare.json``,
``grpo_compare.md`` (the tables) and ``grpo_compare.png`` there; ends stdout with one JSON line (the
summary).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OUT_DIR, ROOT, emit
from selector_service.launcher import ServiceProcess

DEFAULT_OUT = OUT_DIR / "grpo_compare"
STRATEGIES = ("uniform", "insight", "dps", "dynamic_sampling")
COLORS = {"uniform": "tab:gray", "insight": "tab:blue", "dps": "tab:green", "dynamic_sampling": "tab:red"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated, in run order")
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps of the service strategies")
    parser.add_argument("--batch-size", type=int, default=4, help="prompts per step (B)")
    parser.add_argument("--rollouts", type=int, default=8, help="completions per prompt (K)")
    parser.add_argument("--num-prompts", type=int, default=128, help="arithmetic prompts in each dataset")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="completion length cap, tokens")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.6,
        help="sampling temperature (0.6: the arithmetic tiers then have prompts always, never and sometimes "
        "solved; see trainer_client.tasks)",
    )
    parser.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate")
    parser.add_argument("--eval-every", type=int, default=5, help="greedy evaluation every N steps")
    parser.add_argument("--eval-size", type=int, default=64, help="prompts in the fixed evaluation subset")
    parser.add_argument(
        "--ds-oversample", type=int, default=3, help="Dynamic Sampling: prompts per round / B"
    )
    parser.add_argument(
        "--ds-max-rounds", type=int, default=3, help="Dynamic Sampling: rounds per step at most"
    )
    parser.add_argument("--backend", choices=["vllm", "hf"], default="vllm", help="rollout engine")
    parser.add_argument("--model", default="smollm2-135m", help="built-in model name or HF checkpoint dir")
    parser.add_argument(
        "--seeds", default="0", help="comma-separated seeds; every strategy runs once per seed (paired)"
    )
    parser.add_argument("--run-timeout", type=float, default=900.0, help="seconds one run may take")
    parser.add_argument(
        "--parallel", type=int, default=1, help="trainer processes at once (each gets cpu_count // N threads)"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds for the whole comparison; runs still going then are stopped and kept as far as they got",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 3 steps, B=4, K=4, 32 prompts, 16 tokens"
    )
    parser.add_argument(
        "--analyze-only",
        action="store_true",
        help="train nothing: redo the summary, tables and plot from the <strategy>-seed<k>.jsonl files in --out",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.batch_size, args.rollouts, args.num_prompts = 3, 4, 4, 32
        args.max_new_tokens, args.eval_every, args.eval_size = 16, 3, 16
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not args.strategies:
        parser.error("--strategies is empty")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not args.seeds:
        parser.error("--seeds is empty")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds repeats a seed")
    if args.parallel < 1:
        parser.error("--parallel must be >= 1")
    if args.deadline is not None and not args.deadline > 0:
        parser.error("--deadline must be > 0 seconds")
    return args


# --------------------------------------------------------------------------------------------------
# The runs
# --------------------------------------------------------------------------------------------------


def train_command(args: argparse.Namespace, url: str, strategy: str, seed: int, metrics: Path) -> list[str]:
    steps, eval_every = args.steps, args.eval_every
    if strategy == "dynamic_sampling":  # at least the same rollouts per step times ds_oversample
        steps = math.ceil(args.steps / args.ds_oversample)
        eval_every = math.ceil(args.eval_every / args.ds_oversample)
    options = {
        "--service-url": url,
        "--dataset": f"grpo-compare-{strategy}-seed{seed}",
        "--task": "arithmetic",
        "--num-prompts": args.num_prompts,
        "--strategy": strategy,
        "--steps": steps,
        "--batch-size": args.batch_size,
        "--rollouts": args.rollouts,
        "--max-new-tokens": args.max_new_tokens,
        "--temperature": args.temperature,
        "--lr": args.lr,
        "--eval-every": eval_every,
        "--eval-size": args.eval_size,
        "--ds-oversample": args.ds_oversample,
        "--ds-max-rounds": args.ds_max_rounds,
        "--backend": args.backend,
        "--model": args.model,
        "--seed": seed,
        "--metrics-out": metrics,
        "--plot-out": metrics.with_suffix(".png"),
    }
    flags = [str(x) for pair in options.items() for x in pair]
    return [sys.executable, "-m", "trainer_client.cli", "train", *flags, "--no-progress"]


class Runner:
    """Runs trainer processes, at most ``--parallel`` at once, each within ``--run-timeout`` and all of
    them within ``--deadline``; stopping a run keeps the steps it finished (one JSON line per step)."""

    def __init__(self, args: argparse.Namespace, url: str, command: Any = None) -> None:
        # ``command(args, url, name, seed, metrics)``: the trainer's command line of one run (default
        # `train_command`; bench/grpo_budget.py passes its own, whose names are arms, not strategies).
        self.args, self.url = args, url
        self.command = command or train_command
        self.started = time.perf_counter()
        self.lock = threading.Lock()
        threads = max(1, (os.cpu_count() or 1) // args.parallel)
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
            self.env.setdefault(name, str(threads))

    def timeout(self) -> float:
        if self.args.deadline is None:
            return self.args.run_timeout
        left = self.args.deadline - (time.perf_counter() - self.started)
        return max(0.0, min(self.args.run_timeout, left))

    def run(self, strategy: str, seed: int) -> dict[str, Any]:
        name = f"{strategy}-seed{seed}"
        metrics = self.args.out / f"{name}.jsonl"
        log_path = self.args.out / f"{name}.log"
        metrics.unlink(missing_ok=True)
        command = self.command(self.args, self.url, strategy, seed, metrics)
        started = time.perf_counter()
        timeout = self.timeout()
        returncode: int | None = None
        if timeout > 0:
            with log_path.open("w", encoding="utf-8") as log:
                log.write(" ".join(command) + "\n")
                log.flush()
                try:
                    proc = subprocess.run(
                        command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
                    )
                    returncode = proc.returncode
                except subprocess.TimeoutExpired:
                    pass
        wall_s = time.perf_counter() - started
        records = read_records(metrics)
        if returncode == 0:
            outcome = "ok"
        elif returncode is None:
            outcome = "stopped" if timeout > 0 else "not run"
        else:
            outcome = f"exit {returncode}"
        with self.lock:
            print(
                f"{strategy:<18} seed {seed:<3} {outcome:<8} {len(records):>4} steps  {wall_s:7.1f} s  log: {log_path}",
                flush=True,
            )
        return {"strategy": strategy, "seed": seed, "outcome": outcome, "wall_s": wall_s, "records": records}

    def run_all(self) -> list[dict[str, Any]]:
        # Seed-major order: with a deadline, every strategy of a seed finishes before the next seed starts.
        jobs = [(strategy, seed) for seed in self.args.seeds for strategy in self.args.strategies]
        with ThreadPoolExecutor(max_workers=self.args.parallel) as pool:
            return list(pool.map(lambda job: self.run(*job), jobs))


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------------
# Analysis
# --------------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _stderr(values: list[float]) -> float | None:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def eval_points(records: list[dict[str, Any]]) -> list[tuple[int, int, float]]:
    """(step index, cumulative rollouts, greedy accuracy), starting with the pre-training evaluation."""
    points: list[tuple[int, int, float]] = []
    for index, record in enumerate(records, start=1):
        if "eval_accuracy_initial" in record:
            points.append((0, 0, float(record["eval_accuracy_initial"])))
        if "eval_accuracy" in record:
            points.append((index, int(record["total_rollouts"]), float(record["eval_accuracy"])))
    return points


def common_budget(runs: list[dict[str, Any]], budget: int) -> int:
    """The largest rollout count at which every run that evaluated after training has an evaluation at or
    below it: min over those runs of their last evaluation within ``budget``. 0 when none has one."""
    reach = []
    for run in runs:
        within = [p[1] for p in eval_points(run["records"]) if 0 < p[1] <= budget]
        if within:
            reach.append(max(within))
    return min(reach) if reach else 0


def summarize(run: dict[str, Any], budget: int) -> dict[str, Any]:
    """One run's figures; ``eval_at_budget`` is its last evaluation at or below ``budget`` rollouts."""
    records = run["records"]
    points = eval_points(records)
    within = [p for p in points if p[1] <= budget]
    initial = points[0][2] if points and points[0][0] == 0 else None
    at_budget = within[-1][2] if within and within[-1][0] > 0 else None
    return {
        "strategy": run["strategy"],
        "seed": run["seed"],
        "outcome": run["outcome"],
        "steps": len(records),
        "rollouts": int(records[-1]["total_rollouts"]) if records else 0,
        "wall_s": round(run["wall_s"], 1),
        "mean_train_reward": _mean([float(r["mean_reward"]) for r in records]),
        "mean_effective_ratio": _mean([float(r["effective_ratio"]) for r in records]),
        "eval_initial": initial,
        "eval_at_budget": at_budget,
        "rollouts_at_budget_eval": within[-1][1] if within and within[-1][0] > 0 else None,
        "gain_at_budget": at_budget - initial if at_budget is not None and initial is not None else None,
        "eval_final": points[-1][2] if points else None,
        "mean_step_s": _mean([float(r.get("step_s", 0.0)) for r in records]),
    }


def aggregate(summaries: list[dict[str, Any]], strategies: list[str]) -> list[dict[str, Any]]:
    """Per strategy over seeds: mean and standard error, and the paired difference of the gain to
    uniform's at the same seed (same prompts, same evaluation subset)."""
    baseline = {s["seed"]: s["gain_at_budget"] for s in summaries if s["strategy"] == "uniform"}
    rows = []
    for strategy in strategies:
        mine = [s for s in summaries if s["strategy"] == strategy]
        row: dict[str, Any] = {"strategy": strategy, "seeds": len(mine)}
        for key in (
            "eval_initial",
            "eval_at_budget",
            "gain_at_budget",
            "mean_effective_ratio",
            "mean_train_reward",
        ):
            values = [float(s[key]) for s in mine if s[key] is not None]
            row[key], row[key + "_se"] = _mean(values), _stderr(values)
        row["rollouts"] = _mean([float(s["rollouts"]) for s in mine])
        diffs = [
            s["gain_at_budget"] - baseline[s["seed"]]
            for s in mine
            if s["gain_at_budget"] is not None and baseline.get(s["seed"]) is not None
        ]
        row["gain_vs_uniform"] = _mean(diffs) if strategy != "uniform" else None
        row["gain_vs_uniform_se"] = _stderr(diffs) if strategy != "uniform" else None
        row["gain_vs_uniform_wins"] = (
            f"{sum(d > 0 for d in diffs)}/{len(diffs)}" if strategy != "uniform" and diffs else None
        )
        rows.append(row)
    return rows


def _mean_curve(runs: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Mean evaluation accuracy over seeds against rollouts: each run's curve is interpolated linearly
    at every rollout count any of them evaluated at, up to where the shortest one ends (Dynamic
    Sampling's evaluations fall at different counts in every seed)."""
    import numpy as np

    curves = [eval_points(run["records"]) for run in runs]
    curves = [([p[1] for p in c], [p[2] for p in c]) for c in curves if c]
    if not curves:
        return [], []
    end = min(xs[-1] for xs, _ in curves)
    grid = sorted({x for xs, _ in curves for x in xs if x <= end})
    mean = np.mean([np.interp(grid, xs, ys) for xs, ys in curves], axis=0)
    return [float(x) for x in grid], [float(y) for y in mean]


def plot(runs: list[dict[str, Any]], budget: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    labelled: set[str] = set()
    for run in runs:
        records = run["records"]
        if not records:
            continue
        name, color = run["strategy"], COLORS.get(run["strategy"])
        label = None if name in labelled else name
        labelled.add(name)
        steps = list(range(1, len(records) + 1))
        rollouts = [int(r["total_rollouts"]) for r in records]
        style = {"color": color, "alpha": 0.35, "linewidth": 1}
        axes[0].plot(steps, [r["mean_reward"] for r in records], label=label, **style)
        axes[1].plot(rollouts, [r["mean_reward"] for r in records], label=label, **style)
        points = eval_points(records)
        if points:
            axes[2].plot([p[1] for p in points], [p[2] for p in points], **style)
        axes[3].plot(steps, [r["effective_ratio"] for r in records], label=label, **style)
    for name in dict.fromkeys(run["strategy"] for run in runs):
        xs, ys = _mean_curve([run for run in runs if run["strategy"] == name and run["records"]])
        if xs:
            axes[2].plot(xs, ys, marker="o", color=COLORS.get(name), linewidth=2, label=f"{name} (mean)")
    axes[0].set(title="train-batch reward vs step", xlabel="step", ylabel="mean reward")
    axes[1].set(title="train-batch reward vs rollouts", xlabel="cumulative rollouts", ylabel="mean reward")
    axes[2].set(
        title="greedy eval accuracy vs rollouts (thin: seeds)",
        xlabel="cumulative rollouts",
        ylabel="accuracy",
    )
    axes[3].set(title="effective-sample ratio", xlabel="step", ylabel="share of mixed groups")
    for axis in axes[1:3]:
        axis.axvline(budget, color="black", linestyle=":", linewidth=1)
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(value: Any, se: Any = None) -> str:
    if value is None:
        return "-"
    if not isinstance(value, float):
        return str(value)
    return f"{value:.3f}" if se is None else f"{value:.3f} ± {se:.3f}"


def markdown_tables(rows: list[dict[str, Any]], summaries: list[dict[str, Any]], budget: int) -> str:
    lines = [
        f"Greedy evaluation accuracy at {budget} rollouts per run (the common budget), mean ± standard error "
        "over seeds; gain = accuracy at the budget - accuracy before training; vs uniform = paired "
        "difference of the gains (same seed), with the seeds where the strategy gained more.",
        "",
        "| strategy | seeds | rollouts | effective-sample ratio | eval before | eval at budget | gain | gain vs uniform |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs = (
            "-"
            if r["gain_vs_uniform"] is None
            else f"{_fmt(r['gain_vs_uniform'], r['gain_vs_uniform_se'])} ({r['gain_vs_uniform_wins']})"
        )
        lines.append(
            f"| {r['strategy']} | {r['seeds']} | {_fmt(r['rollouts'])} | "
            f"{_fmt(r['mean_effective_ratio'], r['mean_effective_ratio_se'])} | "
            f"{_fmt(r['eval_initial'], r['eval_initial_se'])} | {_fmt(r['eval_at_budget'], r['eval_at_budget_se'])} | "
            f"{_fmt(r['gain_at_budget'], r['gain_at_budget_se'])} | {vs} |"
        )
    lines += [
        "",
        "| run | outcome | steps | rollouts | eval before | eval at budget | eval last | s/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s['strategy']} seed {s['seed']} | {s['outcome']} | {s['steps']} | {s['rollouts']} | "
            f"{_fmt(s['eval_initial'])} | {_fmt(s['eval_at_budget'])} | {_fmt(s['eval_final'])} | {_fmt(s['mean_step_s'])} |"
        )
    return "\n".join(lines) + "\n"


def run_comparison(args: argparse.Namespace, command: Any = None) -> list[dict[str, Any]] | None:
    """Every (strategy, seed) run against one service on a fresh embedded store; None if interrupted.
    ``command``: see `Runner`."""
    data_dir = Path(tempfile.mkdtemp(prefix="service-data-", dir=args.out))
    service = ServiceProcess(
        data_dir=data_dir,
        log_path=args.out / "service.log",
        env={"SELECTOR_API_TOKEN": None},  # the runs send no token
        cwd=ROOT,
    )
    try:
        service.start()
        print(f"selector service at {service.url} (embedded store in {data_dir})", flush=True)
        return Runner(args, service.url, command).run_all()
    except KeyboardInterrupt:
        print("interrupted: no summary", file=sys.stderr)
        return None
    finally:
        service.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return f"cpu: {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (ROOT / "trainer_client" / "cli.py").exists():
        print(
            "trainer_client/cli.py is missing: the GRPO loop is needed to run this benchmark", file=sys.stderr
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.analyze_only:
        runs = [
            {
                "strategy": strategy,
                "seed": seed,
                "outcome": "read",
                "wall_s": 0.0,
                "records": read_records(args.out / f"{strategy}-seed{seed}.jsonl"),
            }
            for seed in args.seeds
            for strategy in args.strategies
        ]
        missing = [f"{r['strategy']}-seed{r['seed']}" for r in runs if not r["records"]]
        if missing:
            print(f"no metrics in {args.out} for: {', '.join(missing)}", file=sys.stderr)
            return 2
    else:
        runs = run_comparison(args)
        if runs is None:
            return 130

    nominal = args.steps * args.batch_size * args.rollouts
    budget = common_budget(runs, nominal)
    summaries = [summarize(run, budget) for run in runs]
    rows = aggregate(summaries, args.strategies)
    png = args.out / "grpo_compare.png"
    if any(run["records"] for run in runs):
        plot(runs, budget, png)
    tables = markdown_tables(rows, summaries, budget)
    (args.out / "grpo_compare.md").write_text(tables, encoding="utf-8")
    result = {
        "benchmark": "grpo_compare",
        "device": "not recorded (--analyze-only)" if args.analyze_only else device_name(),
        "task": "arithmetic",
        "model": args.model,
        "backend": args.backend,
        "seeds": args.seeds,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "rollouts_per_prompt": args.rollouts,
        "num_prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "lr": args.lr,
        "rollout_budget": nominal,
        "common_budget": budget,
        "parallel": args.parallel,
        "total_wall_s": round(time.perf_counter() - started, 1),
        "strategies": rows,
        "runs": summaries,
        "plot": str(png) if png.exists() else None,
    }
    print(tables)
    emit(result, args.out / "grpo_compare.json")
    return 0 if summaries and all(s["outcome"] in ("ok", "read") for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
