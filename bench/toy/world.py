"""The toy world: latent skills, prompt difficulties, the policy's true success rates and GRPO's learning
rule, and the series one training run records (bench/toy_world.py describes the model)."""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist
from typing import Any

import numpy as np

from selector_service.core import K_MAX

# Independent random streams per seed: the world is shared by all strategies of a seed, the rollout noise
# is the strategy's own (stable across processes: crc32, not Python's salted hash).
WORLD_STREAM = 0
ROLLOUT_STREAM = 1


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
    #: pass rate well but not exactly. The prompts' group (docs/methods.md §6) is their level; without levels
    #: it is their skill.
    n_levels: int = 0
    level_jitter: float = 0.5
    #: The pass rate a dataset ships per prompt (docs/methods.md §6): the initial policy's true rate plus
    #: Uniform(-noise, +noise), clipped to [0, 1] (a reference model's measurement).
    pass_rate_noise: float = 0.15

    def __post_init__(self) -> None:
        check(self.n_prompts >= 2, "n_prompts must be >= 2")
        check(self.n_skills >= 1, "n_skills must be >= 1")
        check(math.isfinite(self.difficulty_mean), "difficulty_mean must be finite")
        check(self.difficulty_std >= 0 and math.isfinite(self.difficulty_std), "difficulty_std must be >= 0")
        check(self.skill_std >= 0 and math.isfinite(self.skill_std), "skill_std must be >= 0")
        check(0.0 <= self.unsolvable_fraction <= 1.0, "unsolvable_fraction must lie in [0, 1]")
        check(self.learning_rate >= 0 and math.isfinite(self.learning_rate), "learning_rate must be >= 0")
        check(0.0 <= self.transfer <= 1.0, "transfer must lie in [0, 1]")
        check(self.memorization >= 0 and math.isfinite(self.memorization), "memorization must be >= 0")
        check(self.n_heldout >= 1, "n_heldout must be >= 1")
        check(0 <= self.n_levels <= 65_536, "n_levels must lie in 0..65536")
        check(self.level_jitter >= 0 and math.isfinite(self.level_jitter), "level_jitter must be >= 0")
        check(0.0 <= self.pass_rate_noise <= 1.0, "pass_rate_noise must lie in [0, 1]")


@dataclasses.dataclass(frozen=True)
class ToyRunConfig:
    """The training loop and the dataset settings the service would hold (docs/methods.md §1-4)."""

    batch_size: int = 64
    rollouts_per_prompt: int = 8
    steps: int = 200
    alpha0: float = 1.0
    beta0: float = 1.0
    #: The service's dataset defaults (docs/api.md): no Beta forgetting (INSIGHT), HMM decay 0.7 (DPS, math).
    beta_decay: float = 1.0
    hmm_decay: float = 0.7
    #: docs/methods.md §6 dataset settings: weight of a prior pass rate, forgetting of group rates per step.
    prior_strength: float = 2.0
    group_decay: float = 0.9
    #: Dynamic Sampling and SPEED-RL: each generation round draws `ds_oversample * batch_size` uniform
    #: prompts, at most `ds_max_rounds` rounds per step.
    ds_oversample: int = 3
    ds_max_rounds: int = 10
    #: SPEED-RL (docs/methods.md §7): screening rollouts, and more rollouts for prompts the screen found mixed.
    speed_init: int = 4
    speed_cont: int = 12
    #: A strategy run with a rollout policy (`name@policy`, docs/methods.md §8) shares each step's budget of
    #: batch_size x rollouts_per_prompt rollouts out over its batch, each prompt between these bounds.
    rollouts_min: int = 2
    rollouts_max: int = 64

    def __post_init__(self) -> None:
        check(self.batch_size >= 1, "batch_size must be >= 1")
        check(self.rollouts_per_prompt >= 2, "rollouts_per_prompt must be >= 2 (GRPO needs a group)")
        check(self.steps >= 1, "steps must be >= 1")
        check(self.alpha0 > 0 and self.beta0 > 0, "alpha0 and beta0 must be > 0")
        check(0.0 <= self.beta_decay <= 1.0, "beta_decay must lie in [0, 1]")
        check(0.0 <= self.hmm_decay <= 1.0, "hmm_decay must lie in [0, 1]")
        check(self.ds_oversample >= 1, "ds_oversample must be >= 1")
        check(self.ds_max_rounds >= 1, "ds_max_rounds must be >= 1")
        check(self.prior_strength >= 0, "prior_strength must be >= 0")
        check(0.0 < self.group_decay <= 1.0, "group_decay must lie in (0, 1]")
        check(self.speed_init >= 2 and self.speed_cont >= 0, "speed_init must be >= 2, speed_cont >= 0")
        check(
            1 <= self.rollouts_min <= self.rollouts_per_prompt <= self.rollouts_max <= K_MAX,
            f"need 1 <= rollouts_min <= rollouts_per_prompt <= rollouts_max <= {K_MAX}",
        )


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def sigmoid(x: np.ndarray) -> np.ndarray:
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
        """The docs/methods.md §6 group of each prompt (int32): its difficulty level, else its skill."""
        return np.asarray(self.skill_of if self.level is None else self.level, dtype=np.int32)

    def __post_init__(self) -> None:
        n = np.shape(self.skill_of)[0] if np.ndim(self.skill_of) == 1 else -1
        check(
            n >= 0 and np.shape(self.difficulty) == (n,) and np.shape(self.solvable) == (n,),
            "skill_of, difficulty and solvable must be 1-D arrays of the same length",
        )
        object.__setattr__(self, "skill_of", np.asarray(self.skill_of, dtype=np.int64))
        object.__setattr__(self, "difficulty", np.asarray(self.difficulty, dtype=np.float64))
        object.__setattr__(self, "solvable", np.asarray(self.solvable, dtype=bool))
        if self.level is not None:
            check(np.shape(self.level) == (n,), "level must have one entry per prompt")
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
        check(self.skill.ndim == 1 and self.skill.size >= 1, "skill must be a non-empty 1-D array")
        for prompts in (self.pool, self.heldout):
            check(
                len(prompts) == 0
                or (prompts.skill_of.min() >= 0 and prompts.skill_of.max() < self.skill.size),
                f"skill_of must index skill (0..{self.skill.size - 1})",
            )
        check(learning_rate >= 0 and 0.0 <= transfer <= 1.0, "need learning_rate >= 0, transfer in [0, 1]")
        check(memorization >= 0, "memorization must be >= 0")
        self.learning_rate = float(learning_rate)
        self.transfer = float(transfer)
        self.memorization = float(memorization)
        #: The pass rate the dataset ships per prompt (docs/methods.md §6); default: the initial rates, exactly.
        if reference_pass_rate is None:
            reference_pass_rate = self.success_rates()
        self.reference_pass_rate = np.asarray(reference_pass_rate, dtype=np.float64)
        check(self.reference_pass_rate.shape == (len(pool),), "reference_pass_rate: one per prompt")

    @classmethod
    def sample(cls, config: WorldConfig, seed: int) -> ToyWorld:
        """Draw a world from `config`; the same (config, seed) gives the same world in every process."""
        rng = np.random.default_rng([seed, WORLD_STREAM])
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
            return sigmoid(logits) * pool.solvable
        logits = self.skill[pool.skill_of[ids]] + self.memorized[ids] - pool.difficulty[ids]
        return sigmoid(logits) * pool.solvable[ids]

    def accuracy(self) -> float:
        """Expected pass@1 on the held-out prompts: what the policy learned that generalizes."""
        heldout = self.heldout
        return float((sigmoid(self.skill[heldout.skill_of] - heldout.difficulty) * heldout.solvable).mean())

    def train_accuracy(self) -> float:
        """Expected pass@1 on the training pool, memorization included."""
        return float(self.success_rates().mean())

    def rollout(self, ids: np.ndarray, k: int | np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Successes among `k` rollouts for each prompt in `ids` (`k` one count for all, or one per
        prompt; float64, as the core expects)."""
        return rng.binomial(k, self.success_rates(ids)).astype(np.float64)

    def learn(self, mixed_ids: np.ndarray, trained_groups: int) -> np.ndarray:
        """Apply one GRPO step that trained on `trained_groups` groups, of which `mixed_ids` had mixed
        rewards (the only ones with a non-zero advantage). Returns the per-skill gain in logits."""
        if trained_groups <= 0 or len(mixed_ids) == 0:
            return np.zeros_like(self.skill)
        check(len(mixed_ids) <= trained_groups, "more mixed groups than trained groups")
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
    counts: np.ndarray | None = None  # rollouts of each group rolled out (None: K each)


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
    #: With a rollout policy: groups rolled out with n rollouts, n = 0..rollouts_max, over the run.
    count_hist: np.ndarray | None = None

    @property
    def coverage(self) -> float:
        """Share of the pool rolled out at least once: how much a strategy concentrates on few prompts."""
        return float(np.count_nonzero(self.times_observed) / self.n_prompts)

    @property
    def mixed_per_rollout(self) -> float:
        """Mixed groups per rollout spent: how much learning signal a rollout buys."""
        return float(self.mixed.sum() / max(int(self.rollouts[-1]), 1))

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
