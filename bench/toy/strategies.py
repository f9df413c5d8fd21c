"""The strategies of the toy world and one training run with each: selection exactly as the service does
it (selector_service.core), or the trainer-side procedures Dynamic Sampling and SPEED-RL around it."""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.toy.world import ROLLOUT_STREAM, RunResult, StepRecord, ToyRunConfig, ToyWorld, WorldConfig, check
from selector_service.core import (
    ROLLOUT_POLICIES,
    BeliefArrays,
    allocate_rollouts,
    apply_metadata,
    apply_results,
    close_open_step,
    outcomes_from_counts,
)
from selector_service.core.coldstart import prior_arrays
from selector_service.core.rng import stream
from selector_service.core.strategies import select, validate_params


@dataclasses.dataclass(frozen=True)
class Variant:
    """How a strategy of this benchmark runs: the core strategy that picks prompts, the metadata its
    dataset gets (docs/methods.md §6: "groups", "pass_rate", "both" or none), the trainer-side procedure
    around the selection ("dynamic_sampling", "speed_rl" or none) and the rollout policy that shares the
    step's budget of B x K rollouts out over the batch (docs/methods.md §8; none: K each)."""

    source: str
    metadata: str = ""
    trainer: str = ""
    policy: str = ""


#: Strategy name in this benchmark -> how it runs.
VARIANTS: dict[str, Variant] = {
    "uniform": Variant("uniform"),
    "uniform+pass_rate": Variant("uniform", "pass_rate"),  # uniform batches; the pass rates inform a budget
    "dynamic_sampling": Variant("uniform", trainer="dynamic_sampling"),
    "speed_rl": Variant("uniform", trainer="speed_rl"),
    "history_resampling": Variant("history_resampling"),
    "mopps": Variant("mopps"),
    "expected_difficulty": Variant("expected_difficulty"),
    "inverse_evidence": Variant("inverse_evidence"),
    "insight": Variant("insight"),
    "insight+groups": Variant("insight", "groups"),
    "insight+pass_rate": Variant("insight", "pass_rate"),
    "dps": Variant("dps"),
    "learnability": Variant("learnability"),
    "learnability+groups": Variant("learnability", "groups"),
    "greso": Variant("greso"),
    "sec": Variant("sec", "groups"),
    "adarft": Variant("adarft", "pass_rate"),
}
#: Strategy name -> the core registry's strategy that picks its prompts.
STRATEGY_SOURCES: dict[str, str] = {name: variant.source for name, variant in VARIANTS.items()}
STRATEGY_NAMES: tuple[str, ...] = tuple(VARIANTS)
#: `name@policy` runs the strategy `name` with a rollout budget shared out by `policy`.
POLICY_SEPARATOR = "@"
#: Not a policy but its ceiling: `posterior`'s allocation on beliefs that are the world's true success
#: rates (a Beta of weight ORACLE_WEIGHT at each prompt's true rate), which no trainer can know.
ORACLE = "oracle"
ORACLE_WEIGHT = 1e9


def variant_of(name: str) -> Variant:
    """The Variant of a strategy name: one of VARIANTS, or `name@policy` with `name` a service strategy
    (no trainer-side procedure) and `policy` one of the core's rollout policies. Raises ValueError."""
    base, sep, policy = name.partition(POLICY_SEPARATOR)
    if base not in VARIANTS:
        raise ValueError(f"unknown strategy {base!r}; choose from {', '.join(STRATEGY_NAMES)}")
    variant = VARIANTS[base]
    if not sep:
        return variant
    if policy not in ROLLOUT_POLICIES and policy != ORACLE:
        choices = ", ".join((*ROLLOUT_POLICIES, ORACLE))
        raise ValueError(f"unknown rollout policy {policy!r} in {name!r}; choose from {choices}")
    if variant.trainer:
        raise ValueError(
            f"{base} rolls out by its own procedure; a rollout policy applies to service strategies"
        )
    return dataclasses.replace(variant, policy=policy)


def base_name(name: str) -> str:
    """The strategy without its rollout policy: `insight@posterior` -> `insight`."""
    return name.partition(POLICY_SEPARATOR)[0]


#: What the default (small, well-observed) scenario runs.
DEFAULT_STRATEGIES: tuple[str, ...] = (
    "uniform",
    "dynamic_sampling",
    "history_resampling",
    "mopps",
    "expected_difficulty",
    "inverse_evidence",
    "insight",
    "dps",
)
#: What the large-N cold-start scenario runs (`--scenario large`).
LARGE_STRATEGIES: tuple[str, ...] = (
    "uniform",
    "insight",
    "insight+groups",
    "insight+pass_rate",
    "dps",
    "learnability+groups",
    "adarft",
    "sec",
    "greso",
    "dynamic_sampling",
    "speed_rl",
)
BASELINE = "uniform"


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """What one training step rolled out and what the update trained on."""

    rolled_out: np.ndarray  # ids of every group rolled out, in rollout order
    successes: np.ndarray  # successes of each of those groups
    is_mixed: np.ndarray  # which of them had mixed rewards
    trained: np.ndarray  # ids of the groups the update used
    trained_mixed: np.ndarray  # which of those had mixed rewards
    spent: int  # rollouts generated
    counts: np.ndarray | None = None  # rollouts of each group rolled out (None: K each)


def mixed(successes: np.ndarray, trials: float | np.ndarray) -> np.ndarray:
    return (successes > 0) & (successes < trials)


class Trainer:
    """One run's beliefs, fed exactly like the service feeds them, and the world it trains."""

    def __init__(self, world: ToyWorld, cfg: ToyRunConfig, strategy: str, seed: int) -> None:
        variant = variant_of(strategy)
        self.world, self.cfg, self.seed = world, cfg, seed
        self.policy = variant.policy
        self.source, self.params = variant.source, validate_params(variant.source, {})
        self.key = f"toy-world-{seed}"
        self.rng = np.random.default_rng([seed, ROLLOUT_STREAM, zlib.crc32(strategy.encode())])
        self.beliefs = BeliefArrays.new(
            world.n_prompts,
            cfg.alpha0,
            cfg.beta0,
            beta_decay=cfg.beta_decay,
            hmm_decay=cfg.hmm_decay,
            prior_strength=cfg.prior_strength,
            group_decay=cfg.group_decay,
        )
        self.generation_round = 0  # Dynamic Sampling's / SPEED-RL's position in their uniform stream
        if variant.metadata:  # what the dataset ships, uploaded before training (docs/methods.md §6)
            rate = world.reference_pass_rate if variant.metadata in ("pass_rate", "both") else None
            groups = world.pool.groups if variant.metadata in ("groups", "both") else None
            apply_metadata(self.beliefs, 0, rate, groups)

    def select(self, step: int, size: int) -> np.ndarray:
        ids, _ = select(
            self.beliefs,
            strategy=self.source,
            params=self.params,
            batch_size=size,
            step=step,
            seed=self.seed,
            key=self.key,
            dataset_k=self.cfg.rollouts_per_prompt,
        )
        return ids

    def next_round(self, size: int) -> np.ndarray:
        """The next draw of the trainer-side procedures: one uniform stream across steps, as a data
        loader would walk it."""
        ids = self.select(self.generation_round, size)
        self.generation_round += 1
        return ids

    def report(self, ids: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        """Report results like a trainer's /observe does."""
        states = outcomes_from_counts(successes, trials)
        apply_results(self.beliefs, ids, successes, trials, states)

    def observe(self, ids: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        """Roll out K samples per prompt (or counts[i] for prompt ids[i]) and report them."""
        k = self.cfg.rollouts_per_prompt if counts is None else counts
        successes = self.world.rollout(ids, k, self.rng)
        self.report(ids, successes, np.broadcast_to(np.asarray(k, dtype=np.float64), ids.shape))
        return successes

    def rollout_counts(self, ids: np.ndarray, step: int) -> np.ndarray:
        """Rollouts per prompt of the batch `ids` at `step` under the step's budget B x K, as the service
        answers a select with `rollouts` (DatasetState.rollout_counts): the core's allocation on each
        prompt's Beta belief now (its cold prior if never observed), ties from the stream (dataset, step,
        seed, "rollouts")."""
        cfg = self.cfg
        if self.policy == ORACLE:
            rate = np.clip(self.world.success_rates(ids), 1e-12, 1.0 - 1e-12)
            alpha, beta = ORACLE_WEIGHT * rate, ORACLE_WEIGHT * (1.0 - rate)
        else:
            alpha, beta, _ = prior_arrays(self.beliefs, ids)
        return allocate_rollouts(
            alpha,
            beta,
            ids,
            budget=len(ids) * cfg.rollouts_per_prompt,
            min_rollouts=cfg.rollouts_min,
            max_rollouts=cfg.rollouts_max,
            policy="posterior" if self.policy == ORACLE else self.policy,
            rng=stream(self.key, step, self.seed, "rollouts"),
        )

    def close(self) -> Any:
        return close_open_step(self.beliefs, key=self.key)


def selected_step(run: Trainer, step: int) -> StepOutcome:
    """A service strategy: select B prompts, roll out K each (or, with a rollout policy, the counts it
    gives under the budget B x K), train on all of them. A group of n is mixed when 0 < S < n (a group
    of one never is); it costs n rollouts."""
    rolled_out = run.select(step, run.cfg.batch_size)
    if not run.policy:
        successes = run.observe(rolled_out)
        is_mixed = mixed(successes, run.cfg.rollouts_per_prompt)
        spent = len(rolled_out) * run.cfg.rollouts_per_prompt
        return StepOutcome(rolled_out, successes, is_mixed, rolled_out, is_mixed, spent)
    counts = run.rollout_counts(rolled_out, step)
    successes = run.observe(rolled_out, counts)
    is_mixed = mixed(successes, counts)
    return StepOutcome(rolled_out, successes, is_mixed, rolled_out, is_mixed, int(counts.sum()), counts)


def dynamic_sampling_step(run: Trainer, step: int) -> StepOutcome:
    """DAPO: uniform rounds of ds_oversample * B prompts until B groups are mixed (at most ds_max_rounds);
    train on the first B mixed groups, in rollout order. Every rollout is reported and paid for."""
    cfg, k = run.cfg, run.cfg.rollouts_per_prompt
    id_parts, success_parts, n_mixed = [], [], 0
    for _ in range(cfg.ds_max_rounds):
        ids = run.next_round(cfg.batch_size * cfg.ds_oversample)
        id_parts.append(ids)
        success_parts.append(run.observe(ids))
        n_mixed += int(mixed(success_parts[-1], k).sum())
        if n_mixed >= cfg.batch_size:
            break
    rolled_out, successes = np.concatenate(id_parts), np.concatenate(success_parts)
    is_mixed = mixed(successes, k)
    keep = np.flatnonzero(is_mixed)[: cfg.batch_size]
    return StepOutcome(rolled_out, successes, is_mixed, rolled_out[keep], is_mixed[keep], len(rolled_out) * k)


def speed_rl_step(run: Trainer, step: int) -> StepOutcome:
    """docs/methods.md §7: screen with speed_init rollouts; prompts with 0 < S < speed_init get speed_cont more (one
    group); the batch fills first-in first-out. Every rollout is reported and paid for."""
    cfg, world = run.cfg, run.world
    n_init, n_cont = cfg.speed_init, cfg.speed_cont
    id_parts, success_parts, mixed_parts, kept_parts, spent, n_kept = [], [], [], [], 0, 0
    for _ in range(cfg.ds_max_rounds):
        ids = run.next_round(cfg.batch_size * cfg.ds_oversample)
        screen = world.rollout(ids, n_init, run.rng)
        go_on = mixed(screen, n_init)
        successes = screen.copy()
        successes[go_on] += world.rollout(ids[go_on], n_cont, run.rng)
        trials = np.where(go_on, float(n_init + n_cont), float(n_init))
        run.report(ids, successes, trials)
        spent += int(trials.sum())
        id_parts.append(ids)
        success_parts.append(successes)
        mixed_parts.append(mixed(successes, trials))
        kept_parts.append(ids[go_on])
        n_kept += int(go_on.sum())
        if n_kept >= cfg.batch_size:
            break
    trained = np.concatenate(kept_parts)[: cfg.batch_size]
    trained_mixed = np.ones(trained.size, dtype=bool)  # mixed in the screen already
    rolled_out, successes = np.concatenate(id_parts), np.concatenate(success_parts)
    return StepOutcome(rolled_out, successes, np.concatenate(mixed_parts), trained, trained_mixed, spent)


STEPS: dict[str, Callable[[Trainer, int], StepOutcome]] = {
    "": selected_step,
    "dynamic_sampling": dynamic_sampling_step,
    "speed_rl": speed_rl_step,
}


def run_strategy(
    world_config: WorldConfig,
    train_config: ToyRunConfig,
    strategy: str,
    seed: int,
    *,
    on_step: Callable[[], None] | None = None,
    trace: list[StepRecord] | None = None,
    world: ToyWorld | None = None,
) -> RunResult:
    """Train in a fresh copy of the seed's world with `strategy`; return its per-step series.

    `world` replaces the sampled world (tests build tiny exact worlds); it is not mutated. `trace`
    receives one StepRecord per step when given.
    """
    cfg, variant = train_config, variant_of(strategy)
    world = ToyWorld.sample(world_config, seed) if world is None else world.copy()
    draw = cfg.batch_size * cfg.ds_oversample if variant.trainer else cfg.batch_size
    check(
        draw <= world.n_prompts,
        f"{strategy} draws {draw} prompts per round but the world has only {world.n_prompts}",
    )
    run, step_fn = Trainer(world, cfg, strategy, seed), STEPS[variant.trainer]

    series = {name: np.zeros(cfg.steps, dtype=np.int64) for name in _STEP_SERIES}
    accuracy, train_accuracy = np.empty(cfg.steps + 1), np.empty(cfg.steps + 1)
    rollouts = np.zeros(cfg.steps + 1, dtype=np.int64)
    count_hist = np.zeros(cfg.rollouts_max + 1, dtype=np.int64)  # groups per rollout count (policies)
    accuracy[0], train_accuracy[0] = world.accuracy(), world.train_accuracy()
    started = time.perf_counter()
    for t in range(cfg.steps):
        outcome = step_fn(run, t)
        trained_mixed_ids = outcome.trained[outcome.trained_mixed]
        world.learn(trained_mixed_ids, len(outcome.trained))
        stats = run.close()
        series["groups"][t] = len(outcome.rolled_out)
        series["mixed"][t] = int(outcome.is_mixed.sum())
        series["trained"][t] = len(outcome.trained)
        series["trained_mixed"][t] = len(trained_mixed_ids)
        series["observed"][t] = stats.observed
        series["correct"][t] = stats.correct
        series["predicted_partial"][t] = stats.predicted_partial
        if outcome.counts is not None:
            np.add.at(count_hist, np.minimum(outcome.counts, cfg.rollouts_max), 1)
        rollouts[t + 1] = rollouts[t] + outcome.spent
        accuracy[t + 1], train_accuracy[t + 1] = world.accuracy(), world.train_accuracy()
        if trace is not None:
            trace.append(
                StepRecord(t, outcome.rolled_out, outcome.successes, outcome.trained, stats, outcome.counts)
            )
        if on_step is not None:
            on_step()
    return RunResult(
        strategy=strategy,
        seed=seed,
        n_prompts=world.n_prompts,
        accuracy=accuracy,
        train_accuracy=train_accuracy,
        rollouts=rollouts,
        times_observed=run.beliefs.n_obs.copy(),
        count_hist=count_hist if variant.policy else None,
        seconds=time.perf_counter() - started,
        **series,
    )


_STEP_SERIES = ("groups", "mixed", "trained", "trained_mixed", "observed", "correct", "predicted_partial")
