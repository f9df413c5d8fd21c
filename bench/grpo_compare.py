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

Writes ``bench/out/grpo_compare/<strategy>.jsonl`` (+ ``.log``), ``grpo_compare.json`` and
``grpo_compare.png`` there; ends stdout with one JSON line (the summary).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
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
    parser.add_argument("--seed", type=int, default=0, help="same seed for every strategy")
    parser.add_argument("--run-timeout", type=float, default=900.0, help="seconds one strategy may take")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 3 steps, B=4, K=4, 32 prompts, 16 tokens"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.batch_size, args.rollouts, args.num_prompts = 3, 4, 4, 32
        args.max_new_tokens, args.eval_every, args.eval_size = 16, 3, 16
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not args.strategies:
        parser.error("--strategies is empty")
    return args


# --------------------------------------------------------------------------------------------------
# The runs
# --------------------------------------------------------------------------------------------------


def train_command(args: argparse.Namespace, url: str, strategy: str, metrics: Path) -> list[str]:
    steps, eval_every = args.steps, args.eval_every
    if strategy == "dynamic_sampling":  # at least the same rollouts per step times ds_oversample
        steps = math.ceil(args.steps / args.ds_oversample)
        eval_every = math.ceil(args.eval_every / args.ds_oversample)
    options = {
        "--service-url": url,
        "--dataset": f"grpo-compare-{strategy}-seed{args.seed}",
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
        "--seed": args.seed,
        "--metrics-out": metrics,
        "--plot-out": metrics.with_suffix(".png"),
    }
    flags = [str(x) for pair in options.items() for x in pair]
    return [sys.executable, "-m", "trainer_client.cli", "train", *flags, "--no-progress"]


def run_strategy(args: argparse.Namespace, url: str, strategy: str) -> dict[str, Any]:
    metrics = args.out / f"{strategy}.jsonl"
    log_path = args.out / f"{strategy}.log"
    metrics.unlink(missing_ok=True)
    command = train_command(args, url, strategy, metrics)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    with log_path.open("w", encoding="utf-8") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        try:
            proc = subprocess.run(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.run_timeout
            )
            returncode: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    wall_s = time.perf_counter() - started
    records = read_records(metrics)
    outcome = "ok" if returncode == 0 else ("timeout" if returncode is None else f"exit {returncode}")
    print(
        f"{strategy:<18} {outcome:<8} {len(records):>3} steps  {wall_s:7.1f} s  log: {log_path}", flush=True
    )
    return {"strategy": strategy, "outcome": outcome, "wall_s": wall_s, "records": records}


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------------
# Analysis
# --------------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def eval_points(records: list[dict[str, Any]]) -> list[tuple[int, int, float]]:
    """(step index, cumulative rollouts, greedy accuracy), starting with the pre-training evaluation."""
    points: list[tuple[int, int, float]] = []
    for index, record in enumerate(records, start=1):
        if "eval_accuracy_initial" in record:
            points.append((0, 0, float(record["eval_accuracy_initial"])))
        if "eval_accuracy" in record:
            points.append((index, int(record["total_rollouts"]), float(record["eval_accuracy"])))
    return points


def summarize(run: dict[str, Any], budget: int) -> dict[str, Any]:
    records = run["records"]
    points = eval_points(records)
    within = [p for p in points if p[1] <= budget]
    return {
        "strategy": run["strategy"],
        "outcome": run["outcome"],
        "steps": len(records),
        "rollouts": int(records[-1]["total_rollouts"]) if records else 0,
        "wall_s": round(run["wall_s"], 1),
        "mean_train_reward": _mean([float(r["mean_reward"]) for r in records]),
        "last_train_reward": float(records[-1]["mean_reward"]) if records else None,
        "mean_effective_ratio": _mean([float(r["effective_ratio"]) for r in records]),
        "eval_initial": points[0][2] if points and points[0][0] == 0 else None,
        "eval_final": points[-1][2] if points else None,
        "eval_at_budget": within[-1][2] if within else None,
        "rollouts_at_budget_eval": within[-1][1] if within else None,
        "mean_step_s": _mean([float(r.get("step_s", 0.0)) for r in records]),
    }


def plot(runs: list[dict[str, Any]], budget: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for run in runs:
        records = run["records"]
        if not records:
            continue
        name, color = run["strategy"], COLORS.get(run["strategy"])
        steps = list(range(1, len(records) + 1))
        rollouts = [int(r["total_rollouts"]) for r in records]
        axes[0].plot(steps, [r["mean_reward"] for r in records], marker=".", color=color, label=name)
        axes[1].plot(rollouts, [r["mean_reward"] for r in records], marker=".", color=color, label=name)
        points = eval_points(records)
        if points:
            axes[2].plot([p[1] for p in points], [p[2] for p in points], marker="o", color=color, label=name)
        axes[3].plot(steps, [r["effective_ratio"] for r in records], marker=".", color=color, label=name)
    axes[0].set(title="train-batch reward vs step", xlabel="step", ylabel="mean reward")
    axes[1].set(title="train-batch reward vs rollouts", xlabel="cumulative rollouts", ylabel="mean reward")
    axes[2].set(title="greedy eval accuracy vs rollouts", xlabel="cumulative rollouts", ylabel="accuracy")
    axes[3].set(title="effective-sample ratio", xlabel="step", ylabel="share of mixed groups")
    for axis in axes[1:3]:
        axis.axvline(budget, color="black", linestyle=":", linewidth=1)
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(summaries: list[dict[str, Any]]) -> None:
    def fmt(value: Any) -> str:
        return "-" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))

    columns = ("strategy", "outcome", "steps", "rollouts", "mean_train_reward", "mean_effective_ratio")
    columns += ("eval_initial", "eval_at_budget", "eval_final", "wall_s")
    print(" ".join(f"{c:>20}" for c in columns))
    for summary in summaries:
        print(" ".join(f"{fmt(summary[c]):>20}" for c in columns))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (ROOT / "trainer_client" / "cli.py").exists():
        print(
            "trainer_client/cli.py is missing: the GRPO loop is needed to run this benchmark", file=sys.stderr
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="service-data-", dir=args.out))
    service = ServiceProcess(
        data_dir=data_dir,
        log_path=args.out / "service.log",
        env={"SELECTOR_API_TOKEN": None},  # the runs send no token
        cwd=ROOT,
    )
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    try:
        service.start()
        print(f"selector service at {service.url} (embedded store in {data_dir})", flush=True)
        for strategy in args.strategies:
            runs.append(run_strategy(args, service.url, strategy))
    except KeyboardInterrupt:
        print("interrupted: summarizing the runs that finished", file=sys.stderr)
    finally:
        service.stop()
        shutil.rmtree(data_dir, ignore_errors=True)

    budget = args.steps * args.batch_size * args.rollouts
    summaries = [summarize(run, budget) for run in runs]
    png = args.out / "grpo_compare.png"
    if any(run["records"] for run in runs):
        plot(runs, budget, png)
    result = {
        "benchmark": "grpo_compare",
        "task": "arithmetic",
        "model": args.model,
        "backend": args.backend,
        "seed": args.seed,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "rollouts_per_prompt": args.rollouts,
        "num_prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "rollout_budget": budget,
        "total_wall_s": round(time.perf_counter() - started, 1),
        "strategies": summaries,
        "plot": str(png) if png.exists() else None,
    }
    print_table(summaries)
    emit(result, args.out / "grpo_compare.json")
    return 0 if summaries and all(s["outcome"] == "ok" for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
