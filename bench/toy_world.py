"""A seeded toy world of GRPO learning dynamics: does prompt selection help, and at what rollout cost?

The world (every knob is a field of `WorldConfig`, with its default and the reason for it):

- N prompts, each tied to one of G latent skills. Prompt p's true success rate is
  `sigmoid(skill[g(p)] + memorized[p] - difficulty[p])`, difficulties drawn from a wide normal so that
  at the start some prompts are practically always solved, many never, and about 40% give mixed groups
  of K = 8 (the 30-50% the DPS paper reports for uniform batches). A small share of prompts is
  unsolvable (rate 0: wrong reference answers, impossible instances), as in real prompt sets.
- A training step rolls out K samples per selected prompt (Bernoulli draws at the true rate). GRPO's
  advantage is zero for a group whose K rewards are all equal, so only mixed groups teach: each mixed
  group raises its own skill by `learning_rate / trained_groups` logits and every other skill by
  `transfer` times that. Dividing by the number of trained groups mirrors a loss averaged over the batch:
  groups without signal still dilute the step (uniform), a batch of only mixed groups learns at full rate
  (Dynamic Sampling). A mixed group also teaches its own prompt something that does not generalize
  (`memorization`): a prompt trained on again and again drifts toward solved, as it does in real runs.
- Accuracy is the mean true success rate on held-out prompts from the same distribution (never trained
  on, so memorization does not count): expected pass@1, free of evaluation noise. The training pool's
  accuracy (memorization included) is reported too.

Strategies, each run on the same world per seed (different rollout noise):

- `uniform`, `history_resampling`, `mopps`, `expected_difficulty`, `inverse_evidence`, `insight`, `dps`:
  `selector_service.core.strategies.select` with the registry's default parameters, exactly as the
  service calls it (same key, step and seed semantics).
- `dynamic_sampling` (DAPO): draw uniform batches of `ds_oversample * B` prompts, roll out all of them,
  keep the mixed groups, repeat until B are kept (at most `ds_max_rounds` rounds; a step that still has
  fewer trains on what it has), train on the first B. EVERY rollout counts as cost and is observed.

- `name@policy` (e.g. `insight@posterior`): the strategy `name` picks the batch, then the step's budget of
  B x K rollouts is shared out by the service's rollout allocation (`selector_service.core.allocate_rollouts`
  with each prompt's Beta belief and the stream (dataset, step, seed, "rollouts"), exactly as
  DatasetState.rollout_counts answers a select with `rollouts`; docs/methods.md §8), each count in
  [`rollouts_min`, `rollouts_max`] (default 2 and 64). Prompt i rolls out n_i samples; its group is mixed
  (teaches) when 0 < S < n_i, a group of one never is, and it costs n_i rollouts; every mixed group teaches
  the same amount whatever its size (a larger group is only likelier to be mixed). `name@uniform` is the
  even split (K each when the budget is B x K); `name@oracle` is a ceiling, not a policy: `posterior`'s
  allocation on the world's true success rates.

Beliefs are fed exactly like the service feeds them: `apply_results` for each observed group when it is
observed (with the dataset's `beta_decay`), `close_step` once the step ends (with `hmm_decay`). Every
strategy keeps all belief families, so DPS's state-prediction accuracy (`CloseStats.correct / observed`)
is measured for every strategy, though only `dps` acts on it.

What the toy world leaves out: forgetting, overfitting that hurts held-out accuracy, reward noise
beyond Bernoulli sampling, the size of a group's advantage (every mixed group teaches the same amount),
the compute of the selection itself, and the wall-clock cost of rollouts beyond counting them.

Run: `python bench/toy_world.py` (defaults: 10 seeds x 8 strategies x 200 steps, under 10 s on one core
once the core's numba cache is warm) or `--quick` (about a second).
Writes bench/out/toy_world.json and bench/out/toy_world.png, prints a table, ends stdout with one JSON
line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OUT_DIR, emit
from bench.toy.report import curves, first_reach, format_table, plot_curves, run_metrics, summarize
from bench.toy.strategies import (
    BASELINE,
    DEFAULT_STRATEGIES,
    LARGE_STRATEGIES,
    STRATEGY_NAMES,
    run_strategy,
    variant_of,
)
from bench.toy.world import PromptSet, RunResult, StepRecord, ToyRunConfig, ToyWorld, WorldConfig

__all__ = [  # what tests and notebooks use from this script
    "PromptSet",
    "RunResult",
    "StepRecord",
    "ToyRunConfig",
    "ToyWorld",
    "WorldConfig",
    "first_reach",
    "format_table",
    "main",
    "run_metrics",
    "run_strategy",
    "summarize",
]

#: --scenario large: the cold-start world of docs/methods.md §6; --quick: a small world. Only defaults change.
LARGE = {
    "n_prompts": 200_000,
    "levels": 10,
    "steps": 120,
    "seeds": 5,
    "strategies": ",".join(LARGE_STRATEGIES),
}
POLICIES = ("uniform", "knapsack", "variance", "posterior", "oracle")
#: --scenario budget: fixed K against each rollout policy at the same budget (B x K per step, counts in
#: [rollouts_min, rollouts_max]), for uniform's and INSIGHT's batches; budget-large: the same in the large
#: world, INSIGHT with the levels as groups, and uniform batches with the pass rates uploaded (per-prompt
#: priors for the allocation; uniform selection ignores them).
BUDGET = {
    "strategies": ",".join(
        f"{s}{p}" for s in ("uniform", "insight") for p in ("", *(f"@{q}" for q in POLICIES))
    )
}
BUDGET_LARGE = {
    **LARGE,
    "seeds": 10,
    "strategies": ",".join(
        [
            "uniform",
            *(f"uniform@{q}" for q in POLICIES),
            "insight+groups",
            *(f"insight+groups@{q}" for q in POLICIES),
            "uniform+pass_rate",
            *(f"uniform+pass_rate@{q}" for q in POLICIES if q != "uniform"),
        ]
    ),
}
SCENARIOS = {"default": {}, "large": LARGE, "budget": BUDGET, "budget-large": BUDGET_LARGE}
QUICK = {"n_prompts": 1000, "batch_size": 32, "steps": 80, "seeds": 2}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    world, train, strategies = configs(args)
    seeds = list(range(args.seeds))
    started = time.perf_counter()
    runs = run_all(world, train, strategies, seeds, progress=not args.no_progress)
    seconds = time.perf_counter() - started

    summary, curve_data = summarize(runs), curves(runs)
    stem = "toy_world" if args.scenario == "default" else f"toy_world_{args.scenario}"
    json_path, png_path = args.out / f"{stem}.json", args.out / f"{stem}.png"
    report = {
        "scenario": args.scenario,
        "world": dataclasses.asdict(world),
        "train": dataclasses.asdict(train),
        "seeds": seeds,
        "target": "uniform's final accuracy at the same seed",
        "seconds": round(seconds, 2),
        "summary": summary,
        "curves": curve_data,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    if not args.no_plot:
        plot_curves(curve_data, png_path, figure_title(world, train, len(seeds)))

    spread = "se" if args.scenario.startswith("budget") else "std"
    print(format_table(summary, spread))
    print(
        f"mean ± {'standard error' if spread == 'se' else 'std'} over seeds; target: uniform's final accuracy "
        f"per seed; {len(seeds)} seeds; {seconds:.1f} s; wrote {json_path}"
    )
    emit(result_line(summary, train, seeds, seconds, json_path, None if args.no_plot else png_path), None)
    return report


def run_all(
    world: WorldConfig, train: ToyRunConfig, strategies: list[str], seeds: list[int], progress: bool
) -> dict[str, list[RunResult]]:
    """Every strategy on every seed's world, with a progress bar over all their steps."""
    from tqdm import tqdm

    runs: dict[str, list[RunResult]] = {s: [] for s in strategies}
    total = len(seeds) * len(strategies) * train.steps
    with tqdm(total=total, desc="toy world", unit="step", file=sys.stderr, disable=not progress) as bar:
        for seed in seeds:
            for strategy in strategies:
                bar.set_postfix_str(f"seed {seed} {strategy}")
                runs[strategy].append(
                    run_strategy(world, train, strategy, seed, on_step=lambda: bar.update(1))
                )
    return runs


def result_line(
    summary: dict[str, Any],
    train: ToyRunConfig,
    seeds: list[int],
    seconds: float,
    json_path: Path,
    png: Path | None,
) -> dict[str, Any]:
    """The JSON last line: per strategy, the mean over seeds of the headline metrics."""
    headline = {
        "effective_ratio": "effective_ratio",
        "final_accuracy": "final_accuracy",
        "accuracy_at_uniform_rollouts": "accuracy_at_uniform_rollouts",
        "steps_to_uniform_final": "steps_to_target",
        "rollouts_to_uniform_final": "rollouts_to_target",
        "mixed_per_step": "mixed_per_step",
        "mixed_per_rollout": "mixed_per_rollout",
        "mixed_vs_fixed_k": "mixed_vs_fixed_k",
    }
    strategies = {}
    for strategy, entry in summary.items():
        aggregate = entry["aggregate"]
        row = {key: aggregate[name]["mean"] for key, name in headline.items() if name in aggregate}
        row["reached"] = aggregate["reached_target"]
        row["state_accuracy"] = aggregate["state_accuracy"]["mean"]
        strategies[strategy] = row
    return {
        "benchmark": "toy_world",
        "seeds": len(seeds),
        "steps": train.steps,
        "seconds": round(seconds, 2),
        "json": str(json_path),
        "png": None if png is None else str(png),
        "strategies": strategies,
    }


def figure_title(world: WorldConfig, train: ToyRunConfig, n_seeds: int) -> str:
    levels = f"{world.n_levels} difficulty levels, " if world.n_levels else ""
    return (
        f"toy world: N={world.n_prompts}, {world.n_skills} skills, {levels}"
        f"B={train.batch_size}, K={train.rollouts_per_prompt}, "
        f"memorization={world.memorization:g}, "
        f"beta_decay={train.beta_decay:g}, hmm_decay={train.hmm_decay:g}; "
        f"{n_seeds} seeds (mean ± std over seeds)"
    )


# ---- options -------------------------------------------------------------------------------------------
def configs(args: argparse.Namespace) -> tuple[WorldConfig, ToyRunConfig, list[str]]:
    """The world, the runs' settings and the strategies (uniform first: it is the target); a bad value
    exits with a message that names it."""
    try:
        world = WorldConfig(
            n_prompts=args.n_prompts,
            n_skills=args.skills,
            difficulty_mean=args.difficulty_mean,
            difficulty_std=args.difficulty_std,
            skill_std=args.skill_std,
            unsolvable_fraction=args.unsolvable,
            learning_rate=args.learning_rate,
            transfer=args.transfer,
            memorization=args.memorization,
            n_heldout=args.heldout,
            n_levels=args.levels,
            level_jitter=args.level_jitter,
            pass_rate_noise=args.pass_rate_noise,
        )
        train = ToyRunConfig(
            batch_size=args.batch_size,
            rollouts_per_prompt=args.rollouts,
            steps=args.steps,
            beta_decay=args.beta_decay,
            hmm_decay=args.hmm_decay,
            alpha0=args.alpha0,
            beta0=args.beta0,
            ds_oversample=args.ds_oversample,
            ds_max_rounds=args.ds_max_rounds,
            prior_strength=args.prior_strength,
            group_decay=args.group_decay,
            rollouts_min=args.rollouts_min,
            rollouts_max=args.rollouts_max,
        )
        if args.seeds < 1:
            raise ValueError("--seeds must be >= 1")
        strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
        variants = [variant_of(name) for name in strategies]  # ValueError names an unknown one
        widest = train.batch_size * (train.ds_oversample if any(v.trainer for v in variants) else 1)
        if widest > world.n_prompts:
            raise ValueError(
                f"a round draws {widest} prompts but the pool has {world.n_prompts}: "
                "raise --n-prompts or lower --batch-size / --ds-oversample"
            )
    except ValueError as error:
        raise SystemExit(f"toy_world: {error}") from None
    return world, train, [BASELINE, *[s for s in dict.fromkeys(strategies) if s != BASELINE]]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Simulate GRPO learning dynamics in a toy world and compare prompt-selection strategies.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run = parser.add_argument_group("run")
    run.add_argument(
        "--scenario",
        choices=tuple(SCENARIOS),
        default="default",
        help="default: a well-observed pool of 2000 prompts; large: the cold-start world of docs/methods.md §6 "
        "(200k prompts in 10 difficulty levels with a noisy pass rate each, 120 steps, 5 seeds; "
        "writes toy_world_large.*); budget: fixed K against each rollout policy (name@policy) at the same "
        "budget, uniform's and INSIGHT's batches; budget-large: the same in the large world (INSIGHT with "
        "groups, uniform with pass rates, 10 seeds). Writes toy_world_<scenario>.*. Options given explicitly still win",
    )
    run.add_argument("--seeds", type=int, default=10, help="number of seeds (0..seeds-1)")
    run.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help=f"comma-separated subset of {', '.join(STRATEGY_NAMES)}, each optionally with a rollout policy "
        f"(name@policy, policy one of {', '.join(POLICIES)}: the step's B x K rollouts shared out by the "
        "service's allocation; oracle is a ceiling, posterior's allocation on the true success rates); "
        "uniform always runs (the target)",
    )
    run.add_argument("--quick", action="store_true", help="a small world for a run of a few seconds")
    run.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    run.add_argument("--no-plot", action="store_true", help="skip the PNG")
    run.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    world_options(parser.add_argument_group("world (logits unless stated)"), WorldConfig())
    training_options(parser.add_argument_group("training and dataset settings"), ToyRunConfig())
    args = parser.parse_args(argv)
    for shrink, values in ((True, SCENARIOS[args.scenario]), (args.quick, QUICK)):
        if shrink:  # options given explicitly on the command line still win
            for name, value in values.items():
                if getattr(args, name) == parser.get_default(name):
                    setattr(args, name, value)
    return args


def world_options(w: Any, world: WorldConfig) -> None:
    w.add_argument("--n-prompts", type=int, default=world.n_prompts, help="prompts in the pool")
    w.add_argument("--skills", type=int, default=world.n_skills, help="latent skills")
    w.add_argument("--difficulty-mean", type=float, default=world.difficulty_mean)
    w.add_argument("--difficulty-std", type=float, default=world.difficulty_std)
    w.add_argument("--skill-std", type=float, default=world.skill_std, help="spread of initial skill levels")
    w.add_argument(
        "--unsolvable", type=float, default=world.unsolvable_fraction, help="share of unsolvable prompts"
    )
    w.add_argument(
        "--learning-rate",
        type=float,
        default=world.learning_rate,
        help="skill gain per step from a batch of only mixed groups of that skill",
    )
    w.add_argument(
        "--transfer", type=float, default=world.transfer, help="share of a gain other skills receive"
    )
    w.add_argument(
        "--memorization",
        type=float,
        default=world.memorization,
        help="a mixed group's gain on its own prompt, in units of its gain on the skill",
    )
    w.add_argument(
        "--heldout", type=int, default=world.n_heldout, help="held-out prompts accuracy is measured on"
    )
    w.add_argument(
        "--levels", type=int, default=world.n_levels, help="difficulty levels, the prompts' groups (0: none)"
    )
    w.add_argument(
        "--level-jitter", type=float, default=world.level_jitter, help="spread of difficulty within a level"
    )
    w.add_argument(
        "--pass-rate-noise",
        type=float,
        default=world.pass_rate_noise,
        help="half-width of the uniform noise on the pass rate the dataset ships (probability)",
    )


def training_options(t: Any, train: ToyRunConfig) -> None:
    t.add_argument("--batch-size", type=int, default=train.batch_size, help="prompts per step (B)")
    t.add_argument("--rollouts", type=int, default=train.rollouts_per_prompt, help="rollouts per prompt (K)")
    t.add_argument("--steps", type=int, default=train.steps, help="training steps")
    t.add_argument("--beta-decay", type=float, default=train.beta_decay, help="Beta forgetting factor lam")
    t.add_argument("--alpha0", type=float, default=train.alpha0, help="the dataset's Beta prior alpha0")
    t.add_argument("--beta0", type=float, default=train.beta0, help="the dataset's Beta prior beta0")
    t.add_argument("--hmm-decay", type=float, default=train.hmm_decay, help="DPS HMM decay lam")
    t.add_argument(
        "--ds-oversample", type=int, default=train.ds_oversample, help="Dynamic Sampling draw, in B"
    )
    t.add_argument(
        "--ds-max-rounds", type=int, default=train.ds_max_rounds, help="Dynamic Sampling rounds cap"
    )
    t.add_argument(
        "--prior-strength", type=float, default=train.prior_strength, help="weight of a prior pass rate"
    )
    t.add_argument("--group-decay", type=float, default=train.group_decay, help="group-rate decay per step")
    t.add_argument(
        "--rollouts-min",
        type=int,
        default=train.rollouts_min,
        help="with a rollout policy: fewest per prompt",
    )
    t.add_argument(
        "--rollouts-max", type=int, default=train.rollouts_max, help="with a rollout policy: most per prompt"
    )


if __name__ == "__main__":
    main()
