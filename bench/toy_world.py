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
import math
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from selector_service.core import (
    BeliefArrays,
    apply_metadata,
    apply_results,
    close_open_step,
    outcomes_from_counts,
)
from selector_service.core.strategies import select, validate_params


@dataclasses.dataclass(frozen=True)
class Variant:
    """How a strategy of this benchmark runs: the core strategy that picks prompts, the metadata its
    dataset gets (METHODS 6: "groups", "pass_rate", "both" or none) and the trainer-side procedure
    around the selection ("dynamic_sampling", "speed_rl" or none)."""

    source: str
    metadata: str = ""
    trainer: str = ""


#: Strategy name in this benchmark -> how it runs.
VARIANTS: dict[str, Variant] = {
    "uniform": Variant("uniform"),
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

# Independent random streams per seed: the world is shared by all strategies of a seed, the rollout noise
# is the strategy's own (stable across processes: crc32, not Python's salted hash).
_WORLD_STREAM = 0
_ROLLOUT_STREAM = 1


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """The latent world. Defaults are chosen to look like a mid-sized RLVR prompt set, not to favour
    any strategy: ~35% initial accuracy, ~41% of uniform groups mixed at K = 8, ~16% always solved,
    ~43% never solved at the start."""

    n_prompts: int = 2000
    n_skills: int = 8
    #: Prompt difficulty ~ Normal(mean, std), in logits. The wide spread gives the U-shaped pass-rate
    #: histogram of real prompt sets (many prompts at 0/K or K/K).
    difficulty_mean: float = 1.5
    difficulty_std: float = 4.0
    #: Initial skill levels ~ Normal(0, skill_std): some skills start easier than others.
    skill_std: float = 0.5
    #: Share of prompts that no policy can solve (success rate 0).
    unsolvable_fraction: float = 0.05
    #: Logits a skill gains in one step from a batch made only of mixed groups of that skill. With the
    #: other defaults uniform gains ~3 logits in 200 steps (accuracy ~0.35 -> ~0.6).
    learning_rate: float = 0.1
    #: Share of a mixed group's gain that every other skill receives too (shared general reasoning).
    transfer: float = 0.25
    #: A mixed group also raises its own prompt's logit by `memorization` times the gain it gives its
    #: skill: what the policy learns about that prompt alone, which does not carry to held-out prompts.
    #: 50 -> about 0.08 logits per training at B = 64: ten trainings move a prompt from 50% to ~68%.
    memorization: float = 50.0
    #: Held-out prompts (same distribution, never trained on) that accuracy is measured on.
    n_heldout: int = 2000
    #: Difficulty levels (0: continuous difficulty). With L > 0 each prompt gets a level 0..L-1 at
    #: random and its difficulty is the level's centre (the Normal(difficulty_mean, difficulty_std)
    #: quantile at (l + 0.5) / L) plus Normal(0, level_jitter): a MATH-style level that predicts the
    #: pass rate well but not exactly. The prompts' group (METHODS 6) is their level; without levels
    #: it is their skill.
    n_levels: int = 0
    level_jitter: float = 0.5
    #: The pass rate a dataset ships per prompt (METHODS 6): the initial policy's true rate plus
    #: Uniform(-noise, +noise), clipped to [0, 1] (a reference model's measurement).
    pass_rate_noise: float = 0.15

    def __post_init__(self) -> None:
        _check(self.n_prompts >= 2, "n_prompts must be >= 2")
        _check(self.n_skills >= 1, "n_skills must be >= 1")
        _check(math.isfinite(self.difficulty_mean), "difficulty_mean must be finite")
        _check(self.difficulty_std >= 0 and math.isfinite(self.difficulty_std), "difficulty_std must be >= 0")
        _check(self.skill_std >= 0 and math.isfinite(self.skill_std), "skill_std must be >= 0")
        _check(0.0 <= self.unsolvable_fraction <= 1.0, "unsolvable_fraction must lie in [0, 1]")
        _check(self.learning_rate >= 0 and math.isfinite(self.learning_rate), "learning_rate must be >= 0")
        _check(0.0 <= self.transfer <= 1.0, "transfer must lie in [0, 1]")
        _check(self.memorization >= 0 and math.isfinite(self.memorization), "memorization must be >= 0")
        _check(self.n_heldout >= 1, "n_heldout must be >= 1")
        _check(0 <= self.n_levels <= 65_536, "n_levels must lie in 0..65536")
        _check(self.level_jitter >= 0 and math.isfinite(self.level_jitter), "level_jitter must be >= 0")
        _check(0.0 <= self.pass_rate_noise <= 1.0, "pass_rate_noise must lie in [0, 1]")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training loop and the dataset settings the service would hold (METHODS sections 1-4)."""

    batch_size: int = 64
    rollouts_per_prompt: int = 8
    steps: int = 200
    alpha0: float = 1.0
    beta0: float = 1.0
    #: The service's dataset defaults (API.md): no Beta forgetting (INSIGHT), HMM decay 0.7 (DPS, math).
    beta_decay: float = 1.0
    hmm_decay: float = 0.7
    #: METHODS 6 dataset settings: weight of a prior pass rate, forgetting of group rates per step.
    prior_strength: float = 2.0
    group_decay: float = 0.9
    #: Dynamic Sampling and SPEED-RL: each generation round draws `ds_oversample * batch_size` uniform
    #: prompts, at most `ds_max_rounds` rounds per step.
    ds_oversample: int = 3
    ds_max_rounds: int = 10
    #: SPEED-RL (METHODS 7): screening rollouts, and more rollouts for prompts the screen found mixed.
    speed_init: int = 4
    speed_cont: int = 12

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, "batch_size must be >= 1")
        _check(self.rollouts_per_prompt >= 2, "rollouts_per_prompt must be >= 2 (GRPO needs a group)")
        _check(self.steps >= 1, "steps must be >= 1")
        _check(self.alpha0 > 0 and self.beta0 > 0, "alpha0 and beta0 must be > 0")
        _check(0.0 <= self.beta_decay <= 1.0, "beta_decay must lie in [0, 1]")
        _check(0.0 <= self.hmm_decay <= 1.0, "hmm_decay must lie in [0, 1]")
        _check(self.ds_oversample >= 1, "ds_oversample must be >= 1")
        _check(self.ds_max_rounds >= 1, "ds_max_rounds must be >= 1")
        _check(self.prior_strength >= 0, "prior_strength must be >= 0")
        _check(0.0 < self.group_decay <= 1.0, "group_decay must lie in (0, 1]")
        _check(self.speed_init >= 2 and self.speed_cont >= 0, "speed_init must be >= 2, speed_cont >= 0")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function without overflow warnings; exactly 0 / 1 far out in the tails."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """Prompts of the world: the skill each exercises, its difficulty (logits), whether it is solvable."""

    skill_of: np.ndarray  # i64[n]
    difficulty: np.ndarray  # f64[n]
    solvable: np.ndarray  # bool[n]
    level: np.ndarray | None = None  # i64[n], when the world has difficulty levels

    @property
    def groups(self) -> np.ndarray:
        """The METHODS 6 group of each prompt (int32): its difficulty level, else its skill."""
        return np.asarray(self.skill_of if self.level is None else self.level, dtype=np.int32)

    def __post_init__(self) -> None:
        n = np.shape(self.skill_of)[0] if np.ndim(self.skill_of) == 1 else -1
        _check(
            n >= 0 and np.shape(self.difficulty) == (n,) and np.shape(self.solvable) == (n,),
            "skill_of, difficulty and solvable must be 1-D arrays of the same length",
        )
        object.__setattr__(self, "skill_of", np.asarray(self.skill_of, dtype=np.int64))
        object.__setattr__(self, "difficulty", np.asarray(self.difficulty, dtype=np.float64))
        object.__setattr__(self, "solvable", np.asarray(self.solvable, dtype=bool))
        if self.level is not None:
            _check(np.shape(self.level) == (n,), "level must have one entry per prompt")
            object.__setattr__(self, "level", np.asarray(self.level, dtype=np.int64))

    @classmethod
    def sample(cls, config: WorldConfig, n: int, rng: np.random.Generator) -> PromptSet:
        skill_of = rng.integers(0, config.n_skills, size=n)
        difficulty = rng.normal(config.difficulty_mean, config.difficulty_std, size=n)
        solvable = rng.random(n) >= config.unsolvable_fraction
        level = None
        if config.n_levels:
            levels = config.n_levels
            spread = NormalDist(config.difficulty_mean, max(config.difficulty_std, 1e-12))
            centres = np.array([spread.inv_cdf((i + 0.5) / levels) for i in range(levels)])
            level = rng.integers(0, levels, size=n)
            difficulty = centres[level] + rng.normal(0.0, config.level_jitter, size=n)
        return cls(skill_of=skill_of, difficulty=difficulty, solvable=solvable, level=level)

    def __len__(self) -> int:
        return int(self.skill_of.shape[0])


class ToyWorld:
    """Latent skills and prompt difficulties; the policy's true success rates; GRPO's learning rule.

    Success logit of training prompt p: `skill[g(p)] + memorized[p] - difficulty[p]` (0 when p is
    unsolvable). `memorized` is what training on p taught about p alone; held-out prompts never have it.
    """

    def __init__(
        self,
        *,
        pool: PromptSet,
        skill: np.ndarray,
        learning_rate: float,
        transfer: float,
        memorization: float = 0.0,
        heldout: PromptSet | None = None,
        reference_pass_rate: np.ndarray | None = None,
    ) -> None:
        self.pool = pool
        #: Evaluation prompts, never trained on; by default the pool itself, read without memorization.
        self.heldout = pool if heldout is None else heldout
        self.skill = np.array(skill, dtype=np.float64)  # a copy: learning mutates it
        self.memorized = np.zeros(len(pool))
        _check(self.skill.ndim == 1 and self.skill.size >= 1, "skill must be a non-empty 1-D array")
        for prompts in (self.pool, self.heldout):
            _check(
                len(prompts) == 0
                or (prompts.skill_of.min() >= 0 and prompts.skill_of.max() < self.skill.size),
                f"skill_of must index skill (0..{self.skill.size - 1})",
            )
        _check(learning_rate >= 0 and 0.0 <= transfer <= 1.0, "need learning_rate >= 0, transfer in [0, 1]")
        _check(memorization >= 0, "memorization must be >= 0")
        self.learning_rate = float(learning_rate)
        self.transfer = float(transfer)
        self.memorization = float(memorization)
        #: The pass rate the dataset ships per prompt (METHODS 6); default: the initial rates, exactly.
        if reference_pass_rate is None:
            reference_pass_rate = self.success_rates()
        self.reference_pass_rate = np.asarray(reference_pass_rate, dtype=np.float64)
        _check(self.reference_pass_rate.shape == (len(pool),), "reference_pass_rate: one per prompt")

    @classmethod
    def sample(cls, config: WorldConfig, seed: int) -> ToyWorld:
        """Draw a world from `config`; the same (config, seed) gives the same world in every process."""
        rng = np.random.default_rng([seed, _WORLD_STREAM])
        pool = PromptSet.sample(config, config.n_prompts, rng)
        skill = rng.normal(0.0, config.skill_std, size=config.n_skills)
        heldout = PromptSet.sample(config, config.n_heldout, rng)
        world = cls(
            pool=pool,
            skill=skill,
            learning_rate=config.learning_rate,
            transfer=config.transfer,
            memorization=config.memorization,
            heldout=heldout,
        )
        if config.pass_rate_noise:
            noise = rng.uniform(-config.pass_rate_noise, config.pass_rate_noise, size=len(pool))
            world.reference_pass_rate = np.clip(world.reference_pass_rate + noise, 0.0, 1.0)
        return world

    def copy(self) -> ToyWorld:
        """An independent world in the same state (the prompt sets are shared: nothing mutates them)."""
        twin = ToyWorld(
            pool=self.pool,
            skill=self.skill,
            learning_rate=self.learning_rate,
            transfer=self.transfer,
            memorization=self.memorization,
            heldout=self.heldout,
            reference_pass_rate=self.reference_pass_rate,
        )
        twin.memorized[:] = self.memorized
        return twin

    @property
    def n_prompts(self) -> int:
        return len(self.pool)

    def success_rates(self, ids: np.ndarray | None = None) -> np.ndarray:
        """True per-rollout success probability of the current policy on training prompts (all, or `ids`)."""
        pool = self.pool
        if ids is None:
            logits = self.skill[pool.skill_of] + self.memorized - pool.difficulty
            return _sigmoid(logits) * pool.solvable
        logits = self.skill[pool.skill_of[ids]] + self.memorized[ids] - pool.difficulty[ids]
        return _sigmoid(logits) * pool.solvable[ids]

    def accuracy(self) -> float:
        """Expected pass@1 on the held-out prompts: what the policy learned that generalizes."""
        heldout = self.heldout
        return float((_sigmoid(self.skill[heldout.skill_of] - heldout.difficulty) * heldout.solvable).mean())

    def train_accuracy(self) -> float:
        """Expected pass@1 on the training pool, memorization included."""
        return float(self.success_rates().mean())

    def rollout(self, ids: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
        """Successes among `k` rollouts for each prompt in `ids` (float64, as the core expects)."""
        return rng.binomial(k, self.success_rates(ids)).astype(np.float64)

    def learn(self, mixed_ids: np.ndarray, trained_groups: int) -> np.ndarray:
        """Apply one GRPO step that trained on `trained_groups` groups, of which `mixed_ids` had mixed
        rewards (the only ones with a non-zero advantage). Returns the per-skill gain in logits."""
        if trained_groups <= 0 or len(mixed_ids) == 0:
            return np.zeros_like(self.skill)
        _check(len(mixed_ids) <= trained_groups, "more mixed groups than trained groups")
        per_group = self.learning_rate / trained_groups
        per_skill = np.bincount(self.pool.skill_of[mixed_ids], minlength=self.skill.size).astype(np.float64)
        gain = per_group * ((1.0 - self.transfer) * per_skill + self.transfer * per_skill.sum())
        self.skill += gain
        if self.memorization:
            np.add.at(self.memorized, mixed_ids, self.memorization * per_group)  # ids may repeat (DS)
        return gain


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """Everything one step did, for inspection and for tests of the accounting."""

    step: int
    rolled_out: np.ndarray  # ids of every group rolled out at this step, in rollout order
    successes: np.ndarray  # successes of each of those groups
    trained: np.ndarray  # ids of the groups the policy update used
    stats: Any  # the core's CloseStats for this step


@dataclasses.dataclass
class RunResult:
    """Per-step series of one (strategy, seed) run. Index 0 of `accuracy`/`rollouts` is before training."""

    strategy: str
    seed: int
    n_prompts: int
    accuracy: np.ndarray  # f64[steps + 1], held-out
    train_accuracy: np.ndarray  # f64[steps + 1], training pool (memorization included)
    rollouts: np.ndarray  # i64[steps + 1], cumulative
    groups: np.ndarray  # i64[steps], groups rolled out
    mixed: np.ndarray  # i64[steps], of which mixed
    trained: np.ndarray  # i64[steps], groups the update used
    trained_mixed: np.ndarray  # i64[steps], of which mixed
    observed: np.ndarray  # i64[steps], CloseStats.observed (distinct prompts)
    correct: np.ndarray  # i64[steps], CloseStats.correct
    predicted_partial: np.ndarray  # i64[steps], CloseStats.predicted_partial (after the step)
    times_observed: np.ndarray  # i32[N], results received per prompt over the run (BeliefArrays.n_obs)
    seconds: float

    @property
    def coverage(self) -> float:
        """Share of the pool rolled out at least once: how much a strategy concentrates on few prompts."""
        return float(np.count_nonzero(self.times_observed) / self.n_prompts)

    @property
    def effective_ratio(self) -> float:
        """Share of rolled-out groups with mixed outcomes (for Dynamic Sampling: over ALL its rollouts)."""
        return float(self.mixed.sum() / max(int(self.groups.sum()), 1))

    @property
    def trained_effective_ratio(self) -> float:
        """Share of the groups the update used that had mixed outcomes."""
        return float(self.trained_mixed.sum() / max(int(self.trained.sum()), 1))

    @property
    def state_accuracy(self) -> float:
        """How often the HMM's predicted state (argmax of the prior) matched the observed one."""
        return float(self.correct.sum() / max(int(self.observed.sum()), 1))


def run_strategy(
    world_config: WorldConfig,
    train_config: TrainConfig,
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
    if strategy not in VARIANTS:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGY_NAMES)}")
    variant = VARIANTS[strategy]
    cfg = train_config
    world = ToyWorld.sample(world_config, seed) if world is None else world.copy()
    n, k, batch = world.n_prompts, cfg.rollouts_per_prompt, cfg.batch_size
    draw = batch * cfg.ds_oversample if variant.trainer else batch
    _check(draw <= n, f"{strategy} draws {draw} prompts per round but the world has only {n}")

    source = variant.source
    params = validate_params(source, {})
    key = f"toy-world-{seed}"
    rng = np.random.default_rng([seed, _ROLLOUT_STREAM, zlib.crc32(strategy.encode())])
    beliefs = BeliefArrays.new(
        n, cfg.alpha0, cfg.beta0, prior_strength=cfg.prior_strength, group_decay=cfg.group_decay
    )
    if variant.metadata:  # what the dataset ships, uploaded before training (METHODS 6)
        use_rate = variant.metadata in ("pass_rate", "both")
        use_groups = variant.metadata in ("groups", "both")
        apply_metadata(
            beliefs,
            0,
            world.reference_pass_rate if use_rate else None,
            world.pool.groups if use_groups else None,
        )

    steps = cfg.steps
    series = {name: np.zeros(steps, dtype=np.int64) for name in _STEP_SERIES}
    accuracy = np.empty(steps + 1)
    rollouts = np.zeros(steps + 1, dtype=np.int64)
    train_accuracy = np.empty(steps + 1)
    accuracy[0], train_accuracy[0] = world.accuracy(), world.train_accuracy()
    generation_round = 0  # Dynamic Sampling's / SPEED-RL's position in their uniform stream, in rounds
    started = time.perf_counter()

    def select_batch(step: int, size: int) -> np.ndarray:
        ids, _ = select(
            beliefs,
            strategy=source,
            params=params,
            batch_size=size,
            step=step,
            seed=seed,
            key=key,
            dataset_k=k,
        )
        return ids

    def report(ids: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        """Report results like a trainer's /observe does."""
        states = outcomes_from_counts(successes, trials)
        apply_results(beliefs, ids, successes, trials, states, cfg.beta_decay, cfg.alpha0, cfg.beta0)

    def observe(ids: np.ndarray) -> np.ndarray:
        """Roll out K samples per prompt and report them."""
        successes = world.rollout(ids, k, rng)
        report(ids, successes, np.full(ids.shape, float(k)))
        return successes

    def mixed(successes: np.ndarray, trials: float = k) -> np.ndarray:
        return (successes > 0) & (successes < trials)

    for t in range(steps):
        if variant.trainer == "dynamic_sampling":
            # Generation rounds walk one uniform stream across steps, as a dataloader would.
            id_parts, success_parts, n_mixed = [], [], 0
            for _ in range(cfg.ds_max_rounds):
                ids = select_batch(generation_round, draw)
                generation_round += 1
                id_parts.append(ids)
                success_parts.append(observe(ids))
                n_mixed += int(mixed(success_parts[-1]).sum())
                if n_mixed >= batch:
                    break
            rolled_out, successes = np.concatenate(id_parts), np.concatenate(success_parts)
            is_mixed = mixed(successes)
            keep = np.flatnonzero(is_mixed)[:batch]  # the first B mixed groups, in rollout order
            trained, trained_mixed = rolled_out[keep], is_mixed[keep]
            spent = len(rolled_out) * k
        elif variant.trainer == "speed_rl":
            # METHODS 7: screen with speed_init rollouts; prompts with 0 < S < speed_init get speed_cont
            # more (one group); the batch fills first-in first-out. Every rollout is reported and paid.
            n_init, n_cont = cfg.speed_init, cfg.speed_cont
            id_parts, success_parts, mixed_parts, kept_parts, spent, n_kept = [], [], [], [], 0, 0
            for _ in range(cfg.ds_max_rounds):
                ids = select_batch(generation_round, draw)
                generation_round += 1
                screen = world.rollout(ids, n_init, rng)
                go_on = mixed(screen, n_init)
                successes = screen.copy()
                successes[go_on] += world.rollout(ids[go_on], n_cont, rng)
                trials = np.where(go_on, float(n_init + n_cont), float(n_init))
                report(ids, successes, trials)
                spent += int(trials.sum())
                id_parts.append(ids)
                success_parts.append(successes)
                mixed_parts.append(mixed(successes, trials))
                kept_parts.append(ids[go_on])
                n_kept += int(go_on.sum())
                if n_kept >= batch:
                    break
            rolled_out, successes = np.concatenate(id_parts), np.concatenate(success_parts)
            is_mixed = np.concatenate(mixed_parts)
            trained = np.concatenate(kept_parts)[:batch]
            trained_mixed = np.ones(trained.size, dtype=bool)  # mixed in the screen already
        else:
            rolled_out = select_batch(t, batch)
            successes = observe(rolled_out)
            is_mixed = mixed(successes)
            trained, trained_mixed = rolled_out, is_mixed
            spent = len(rolled_out) * k

        trained_mixed_ids = trained[trained_mixed]
        world.learn(trained_mixed_ids, len(trained))
        stats = close_open_step(beliefs, hmm_decay=cfg.hmm_decay, key=key)

        series["groups"][t] = len(rolled_out)
        series["mixed"][t] = int(is_mixed.sum())
        series["trained"][t] = len(trained)
        series["trained_mixed"][t] = len(trained_mixed_ids)
        series["observed"][t] = stats.observed
        series["correct"][t] = stats.correct
        series["predicted_partial"][t] = stats.predicted_partial
        rollouts[t + 1] = rollouts[t] + spent
        accuracy[t + 1], train_accuracy[t + 1] = world.accuracy(), world.train_accuracy()
        if trace is not None:
            trace.append(StepRecord(t, rolled_out, successes, trained, stats))
        if on_step is not None:
            on_step()

    return RunResult(
        strategy=strategy,
        seed=seed,
        n_prompts=n,
        accuracy=accuracy,
        train_accuracy=train_accuracy,
        rollouts=rollouts,
        times_observed=beliefs.n_obs.copy(),
        seconds=time.perf_counter() - started,
        **series,
    )


_STEP_SERIES = ("groups", "mixed", "trained", "trained_mixed", "observed", "correct", "predicted_partial")


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
    """Mean and sample std (ddof=1; 0 for a single value) over the seeds that have a value."""
    present = np.array([v for v in values if v is not None], dtype=np.float64)
    if present.size == 0:
        return {"mean": None, "std": None, "n": 0}
    std = float(present.std(ddof=1)) if present.size > 1 else 0.0
    return {"mean": float(present.mean()), "std": std, "n": int(present.size)}


def summarize(runs: dict[str, list[RunResult]]) -> dict[str, Any]:
    """Per strategy: per-seed metrics and their mean/std. Targets come from uniform's run of each seed."""
    baseline = {run.seed: run for run in runs.get(BASELINE, [])}
    summary: dict[str, Any] = {}
    for strategy, strategy_runs in runs.items():
        per_seed = []
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
            per_seed.append({"seed": run.seed, **metrics})
        aggregated = {name: _mean_std([m[name] for m in per_seed]) for name in per_seed[0] if name != "seed"}
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
        style = "--" if strategy == BASELINE or VARIANTS.get(strategy, Variant("")).trainer else "-"
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


def _fmt(stat: dict[str, Any], scale: float = 1.0, digits: int = 3) -> str:
    if stat["mean"] is None:
        return "-"
    return f"{stat['mean'] / scale:.{digits}f} ± {stat['std'] / scale:.{digits}f}"


#: Table columns: header, aggregate metric, divisor, decimals.
_TABLE_COLUMNS = (
    ("effective ratio", "effective_ratio", 1.0, 3),
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


def format_table(summary: dict[str, Any]) -> str:
    """The aggregate metrics (mean ± std over seeds) as a Markdown table, readable in a terminal too.
    A metric averaged over fewer seeds than were run (target never reached) shows `(n/N seeds)`."""
    header = ["strategy", *[column[0] for column in _TABLE_COLUMNS]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for strategy, entry in summary.items():
        agg = entry["aggregate"]
        cells = [strategy]
        for _, name, scale, digits in _TABLE_COLUMNS:
            cell = _fmt(agg[name], scale, digits)
            if agg[name]["n"] < agg["seeds"]:
                cell += f" ({agg[name]['n']}/{agg['seeds']} seeds)"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    world, train = WorldConfig(), TrainConfig()
    parser = argparse.ArgumentParser(
        description="Simulate GRPO learning dynamics in a toy world and compare prompt-selection strategies.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run = parser.add_argument_group("run")
    run.add_argument(
        "--scenario",
        choices=("default", "large"),
        default="default",
        help="default: a well-observed pool of 2000 prompts; large: the cold-start world of METHODS 6 "
        "(200k prompts in 10 difficulty levels with a noisy pass rate each, 120 steps, 5 seeds; "
        "writes toy_world_large.*). Options given explicitly still win",
    )
    run.add_argument("--seeds", type=int, default=10, help="number of seeds (0..seeds-1)")
    run.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help=f"comma-separated subset of {', '.join(STRATEGY_NAMES)}; uniform always runs (the target)",
    )
    run.add_argument("--quick", action="store_true", help="a small world for a run of a few seconds")
    run.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out", help="output folder"
    )
    run.add_argument("--no-plot", action="store_true", help="skip the PNG")
    run.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    w = parser.add_argument_group("world (logits unless stated)")
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

    t = parser.add_argument_group("training and dataset settings")
    t.add_argument("--batch-size", type=int, default=train.batch_size, help="prompts per step (B)")
    t.add_argument("--rollouts", type=int, default=train.rollouts_per_prompt, help="rollouts per prompt (K)")
    t.add_argument("--steps", type=int, default=train.steps, help="training steps")
    t.add_argument("--beta-decay", type=float, default=train.beta_decay, help="Beta forgetting factor lam")
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
    args = parser.parse_args(argv)
    if args.scenario == "large":
        large = {
            "n_prompts": 200_000,
            "levels": 10,
            "steps": 120,
            "seeds": 5,
            "strategies": ",".join(LARGE_STRATEGIES),
        }
        for name, value in large.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    if args.quick:
        # Only the defaults shrink: sizes given explicitly on the command line still win.
        quick = {"n_prompts": 1000, "batch_size": 32, "steps": 80, "seeds": 2}
        for name, value in quick.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse_args(argv)
    try:
        world_config = WorldConfig(
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
        train_config = TrainConfig(
            batch_size=args.batch_size,
            rollouts_per_prompt=args.rollouts,
            steps=args.steps,
            beta_decay=args.beta_decay,
            hmm_decay=args.hmm_decay,
            ds_oversample=args.ds_oversample,
            ds_max_rounds=args.ds_max_rounds,
            prior_strength=args.prior_strength,
            group_decay=args.group_decay,
        )
        _check(args.seeds >= 1, "--seeds must be >= 1")
        strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
        unknown = sorted(set(strategies) - set(STRATEGY_NAMES))
        _check(not unknown, f"unknown strategies {unknown}; choose from {', '.join(STRATEGY_NAMES)}")
        widest = train_config.batch_size * (
            train_config.ds_oversample if any(VARIANTS[s].trainer for s in strategies) else 1
        )
        _check(
            widest <= world_config.n_prompts,
            f"a round draws {widest} prompts but the pool has {world_config.n_prompts}: "
            "raise --n-prompts or lower --batch-size / --ds-oversample",
        )
    except ValueError as error:
        raise SystemExit(f"toy_world: {error}") from None
    strategies = [BASELINE, *[s for s in dict.fromkeys(strategies) if s != BASELINE]]
    seeds = list(range(args.seeds))

    from tqdm import tqdm

    started = time.perf_counter()
    runs: dict[str, list[RunResult]] = {s: [] for s in strategies}
    with tqdm(
        total=len(seeds) * len(strategies) * train_config.steps,
        desc="toy world",
        unit="step",
        file=sys.stderr,
        disable=args.no_progress,
    ) as bar:
        for seed in seeds:
            for strategy in strategies:
                bar.set_postfix_str(f"seed {seed} {strategy}")
                runs[strategy].append(
                    run_strategy(world_config, train_config, strategy, seed, on_step=lambda: bar.update(1))
                )
    seconds = time.perf_counter() - started

    summary = summarize(runs)
    curve_data = curves(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "toy_world" if args.scenario == "default" else f"toy_world_{args.scenario}"
    json_path, png_path = args.out / f"{stem}.json", args.out / f"{stem}.png"
    report = {
        "scenario": args.scenario,
        "world": dataclasses.asdict(world_config),
        "train": dataclasses.asdict(train_config),
        "seeds": seeds,
        "target": "uniform's final accuracy at the same seed",
        "seconds": round(seconds, 2),
        "summary": summary,
        "curves": curve_data,
    }
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    if not args.no_plot:
        levels = f"{world_config.n_levels} difficulty levels, " if world_config.n_levels else ""
        title = (
            f"toy world: N={world_config.n_prompts}, {world_config.n_skills} skills, {levels}"
            f"B={train_config.batch_size}, K={train_config.rollouts_per_prompt}, "
            f"memorization={world_config.memorization:g}, "
            f"beta_decay={train_config.beta_decay:g}, hmm_decay={train_config.hmm_decay:g}; "
            f"{len(seeds)} seeds (mean ± std over seeds)"
        )
        plot_curves(curve_data, png_path, title)

    print(format_table(summary))
    print(
        f"target: uniform's final accuracy per seed; {len(seeds)} seeds; {seconds:.1f} s; wrote {json_path}"
    )
    line = {
        "benchmark": "toy_world",
        "seeds": len(seeds),
        "steps": train_config.steps,
        "seconds": round(seconds, 2),
        "json": str(json_path),
        "png": None if args.no_plot else str(png_path),
        "strategies": {
            strategy: {
                "effective_ratio": entry["aggregate"]["effective_ratio"]["mean"],
                "final_accuracy": entry["aggregate"]["final_accuracy"]["mean"],
                "accuracy_at_uniform_rollouts": entry["aggregate"]["accuracy_at_uniform_rollouts"]["mean"],
                "steps_to_uniform_final": entry["aggregate"]["steps_to_target"]["mean"],
                "rollouts_to_uniform_final": entry["aggregate"]["rollouts_to_target"]["mean"],
                "reached": entry["aggregate"]["reached_target"],
                "state_accuracy": entry["aggregate"]["state_accuracy"]["mean"],
            }
            for strategy, entry in summary.items()
        },
    }
    print(json.dumps(line))
    return report


if __name__ == "__main__":
    main()
