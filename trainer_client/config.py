"""Settings of a GRPO run, and the one place their defaults, help texts and checks live.

Each field carries its help in ``field(metadata={"help": ...})``, with ``"flag"`` when its command-line
option is not ``--<field-name>`` and ``"choices"`` when it takes one of a few values. ``trainer-client
train`` builds its options from these fields (trainer_client/cli.py), so the command line and code that
builds the configs directly cannot disagree. ``__post_init__`` checks every value and says which option
to change (``--flag``, and the field when the flag is named otherwise). The module imports nothing heavy
(no torch), so the command line can check its options before loading a model.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

# How the service shares a step's rollout budget over its prompts (docs/api.md, "Select with a rollout
# budget"), and the rule of its bounds: the contract's.
from rlvr_selector_client.contract import DEFAULT_ROLLOUT_POLICY, ROLLOUT_POLICIES, rollout_problems

__all__ = [
    "GROUP_WEIGHTS",
    "LOSS_NORMS",
    "OLD_LOGPROBS",
    "PRECISIONS",
    "PROFILE_SAMPLES",
    "ROLLOUT_POLICIES",
    "GRPOConfig",
    "TrainConfig",
    "default_of",
    "option_name",
]

# "bf16": the transformer body runs under bfloat16 autocast; the output head, the softmax and the
# weights, gradients and AdamW state stay float32.
PRECISIONS = ("fp32", "bf16")
# Where the old log-probs of the PPO ratio come from when a batch gets more than one optimizer step.
OLD_LOGPROBS = ("sampler", "recompute")
# How groups of different sizes weigh in the loss (trainer_client.grpo, "Groups of different sizes").
GROUP_WEIGHTS = ("prompt", "rollout")
# What the summed per-token loss of a batch is divided by (trainer_client.grpo, "Aggregation").
LOSS_NORMS = ("token", "active_token", "sequence")
# The strategies the trainer runs itself (trainer_client.train.TRAINER_STRATEGIES): they screen prompts with
# fixed group sizes of their own and never ask the service for a selection.
_SELF_SCREENING = ("dynamic_sampling", "speed_rl")
#: --strategy's default: the decision table's choice for the run (trainer_client.cli.recommended_config).
RECOMMENDED = "recommended"
#: The samples per prompt a profile may take (--profile-samples): fewer than 2 cannot tell a prompt that
#: is sometimes solved from one that always or never is; more than 16 costs more than teams spend.
PROFILE_SAMPLES = (2, 16)


def option_name(cls: type, name: str) -> str:
    """How a message names field ``name`` of ``cls``: its command-line flag, with the field when the flag
    is named otherwise (``--micro-batch (micro_batch_size)``), or ``Cls.field`` for a field without one."""
    meta = _field(cls, name).metadata
    if meta.get("cli") is False:
        return f"{cls.__name__}.{name}"
    flag = meta.get("flag", "--" + name.replace("_", "-"))
    return flag if flag == "--" + name.replace("_", "-") else f"{flag} ({name})"


def _field(cls: type, name: str) -> Field[Any]:
    for item in fields(cls):
        if item.name == name:
            return item
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def default_of(cls: type, name: str) -> Any:
    """The default value of dataclass field ``name`` of ``cls`` (``KeyError`` when it has none)."""
    item = _field(cls, name)
    if item.default is not MISSING:
        return item.default
    if item.default_factory is not MISSING:
        return item.default_factory()
    raise KeyError(f"{cls.__name__}.{name} has no default")


def _raise_if(problems: list[str]) -> None:
    if problems:
        raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class GRPOConfig:
    """Optimization settings of the GRPO update (trainer_client.grpo); checked on construction.

    ``tis_cap``: truncated importance sampling of the trainer/sampler mismatch. Every token's policy
    gradient is weighted by ``min(pi_trainer(token) / pi_sampler(token), tis_cap)`` (detached), the
    ratio of the trainer's probability (before the update) to the probability the rollout engine
    sampled the token with. ``0`` turns the correction off; otherwise it must be >= 1.

    ``old_logprobs``: with ``epochs > 1`` or ``minibatches > 1`` the PPO ratio needs the log-probs
    of the policy that generated the batch. ``"sampler"`` takes the rollout engine's own (no extra
    forward pass; the ratio then also carries the mismatch, and the clip bounds it, so no separate
    truncated weight is applied); ``"recompute"`` runs the trainer once over the batch before the first
    update and applies the truncated weight. Without sampler log-probs (``--backend hf``) the
    trainer recomputes.

    ``precision``: float32 by default, because on a CPU the rollout engine (vLLM, ``--vllm-dtype auto``)
    runs float32 too and the two then agree to float rounding (docs/trainer.md); bf16 is faster on CPUs
    with AVX512-BF16 at a per-token log-prob gap of ~0.016 that ``tis_cap`` corrects.
    """

    lr: float = field(default=1e-5, metadata={"help": "AdamW learning rate"})
    warmup_steps: int = field(
        default=0,
        metadata={
            "help": "raise the learning rate linearly from lr/N to lr over the first N optimizer steps "
            "(0: the full rate from the first step)"
        },
    )
    clip_eps_low: float = field(
        default=0.2, metadata={"help": "lower clip of the ratio (1 - eps)", "flag": "--clip-eps"}
    )
    clip_eps_high: float = field(
        default=0.2,
        metadata={
            "help": "upper clip (1 + eps); a lone --clip-eps sets both sides",
            "flag": "--clip-eps-high",
        },
    )
    kl_coef: float = field(default=0.0, metadata={"help": "KL penalty to the initial policy (0: off)"})
    scale_by_std: bool = field(
        default=True,
        metadata={
            "help": "advantages r - mean(r), not divided by std (the loss is still divided by the batch's tokens)",
            "flag": "--no-std-scale",
        },
    )
    adv_eps: float = field(default=1e-4, metadata={"help": "added to the group's std", "cli": False})
    epochs: int = field(default=1, metadata={"help": "passes over each batch", "flag": "--grpo-epochs"})
    minibatches: int = field(default=1, metadata={"help": "optimizer steps per pass"})
    micro_batch_size: int = field(
        default=8, metadata={"help": "sequences per forward/backward (memory)", "flag": "--micro-batch"}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    share_prompt: bool = field(
        default=True,
        metadata={
            "help": "recompute the prompt for every completion of a group",
            "flag": "--no-share-prompt",
        },
    )
    precision: str = field(
        default="fp32",
        metadata={
            "help": "bf16: the transformer body under bfloat16 autocast (can be faster where the CPU has "
            "AVX512-BF16 and free cores: measure; a 135M-model update on a shared 2-core machine took 2x "
            "longer than fp32); the output head, softmax, weights and optimizer state stay float32",
            "choices": PRECISIONS,
        },
    )
    tis_cap: float = field(
        default=2.0,
        metadata={
            "help": "truncated importance sampling: weight each token's gradient by min(p_trainer / p_sampler, "
            "cap) to correct the rollout engine/trainer mismatch (0: off)"
        },
    )
    old_logprobs: str = field(
        default="sampler",
        metadata={
            "help": "with --grpo-epochs or --minibatches > 1: the PPO ratio's old log-probs from the rollout "
            "engine (no extra forward pass) or recomputed by the trainer",
            "choices": OLD_LOGPROBS,
        },
    )

    group_weight: str = field(
        default="prompt",
        metadata={
            "help": "how groups of different sizes (--rollout-budget) weigh in the loss: prompt: every group as "
            "one prompt (each completion weighted by the batch's mean group size / its group's size); rollout: "
            "every completion the same (a group of 16 weighs 8x a group of 2); equal sizes: the same loss",
            "choices": GROUP_WEIGHTS,
        },
    )

    loss_norm: str = field(
        default="token",
        metadata={
            "help": "what the batch's summed token loss is divided by: token: every completion token of the "
            "batch (DAPO); active_token: only the tokens of groups with a learning signal; sequence: each "
            "completion's mean over its tokens, averaged over the batch's completions (GRPO's paper)",
            "choices": LOSS_NORMS,
        },
    )

    def __post_init__(self) -> None:
        _raise_if(self.problems())

    def problems(self) -> list[str]:
        """What is wrong with the values, one message per field, each naming its option."""

        def name(field_name: str) -> str:
            return option_name(GRPOConfig, field_name)

        problems = []
        if not (self.lr > 0 and math.isfinite(self.lr)):
            problems.append(f"{name('lr')} must be a positive number (got {self.lr})")
        if self.warmup_steps < 0:
            problems.append(f"{name('warmup_steps')} must be >= 0 (got {self.warmup_steps})")
        if not (0 < self.clip_eps_low < 1):
            problems.append(f"{name('clip_eps_low')} must be in (0, 1) (got {self.clip_eps_low})")
        if not (self.clip_eps_high > 0):
            problems.append(f"{name('clip_eps_high')} must be > 0 (got {self.clip_eps_high})")
        if self.kl_coef < 0:
            problems.append(f"{name('kl_coef')} must be >= 0 (got {self.kl_coef})")
        if not (self.adv_eps > 0):
            problems.append(f"{name('adv_eps')} must be > 0 (got {self.adv_eps})")
        if self.epochs < 1:
            problems.append(f"{name('epochs')} must be >= 1 (got {self.epochs})")
        if self.minibatches < 1:
            problems.append(f"{name('minibatches')} must be >= 1 (got {self.minibatches})")
        if self.micro_batch_size < 1:
            problems.append(f"{name('micro_batch_size')} must be >= 1 (got {self.micro_batch_size})")
        if self.max_grad_norm <= 0:
            problems.append(f"{name('max_grad_norm')} must be > 0 (got {self.max_grad_norm})")
        if self.weight_decay < 0:
            problems.append(f"{name('weight_decay')} must be >= 0 (got {self.weight_decay})")
        if self.temperature <= 0:
            problems.append(
                f"GRPO needs sampled completions: {name('temperature')} must be > 0 (got {self.temperature})"
            )
        if self.precision not in PRECISIONS:
            problems.append(
                f"{name('precision')} must be one of {', '.join(PRECISIONS)} (got {self.precision!r})"
            )
        if not (self.tis_cap == 0 or (self.tis_cap >= 1 and math.isfinite(self.tis_cap))):
            problems.append(
                f"{name('tis_cap')} must be 0 (no correction) or a finite number >= 1 (got {self.tis_cap})"
            )
        if self.old_logprobs not in OLD_LOGPROBS:
            problems.append(
                f"{name('old_logprobs')} must be one of {', '.join(OLD_LOGPROBS)} (got {self.old_logprobs!r})"
            )
        if self.group_weight not in GROUP_WEIGHTS:
            problems.append(
                f"{name('group_weight')} must be one of {', '.join(GROUP_WEIGHTS)} (got {self.group_weight!r})"
            )
        if self.loss_norm not in LOSS_NORMS:
            problems.append(
                f"{name('loss_norm')} must be one of {', '.join(LOSS_NORMS)} (got {self.loss_norm!r})"
            )
        return problems

    def validate(self) -> GRPOConfig:
        """Check the values again (a frozen config cannot change after ``__post_init__``; kept so that
        callers can check configs they did not build)."""
        _raise_if(self.problems())
        return self


@dataclass
class TrainConfig:
    """Everything a run needs besides the objects it talks to; checked on construction, and against the
    dataset's size by ``validate(num_prompts)``."""

    dataset: str = field(metadata={"help": "dataset name in the service (created if missing)"})
    strategy: str = field(
        default=RECOMMENDED,
        metadata={
            "help": "a service strategy (uniform, insight, dps, mopps, expected_difficulty, inverse_evidence, "
            "history_resampling, learnability, filter, adarft, greso, sec, ...), dynamic_sampling / speed_rl "
            "(done by the trainer), or recommended: what docs/strategies.md's decision table says for the run's "
            "pool, epochs and pass rates (rlvr_selector_client.recommend; the trainer prints its choice)"
        },
    )
    steps: int = field(default=20, metadata={"help": "training steps"})
    batch_size: int = field(default=8, metadata={"help": "prompts per step (B)"})
    rollouts: int = field(
        default=8,
        metadata={
            "help": "completions per prompt (K); with --rollout-budget the dataset's nominal group size (the "
            "service's K), each prompt then getting its own count"
        },
    )
    rollout_budget: int | None = field(
        default=None,
        metadata={
            "help": "rollouts per step shared out over the step's B prompts by the service (per-prompt counts "
            "in [--rollouts-min, --rollouts-max] summing to this; default: K for every prompt)"
        },
    )
    rollouts_min: int = field(
        default=2, metadata={"help": "with --rollout-budget: the fewest rollouts a prompt gets"}
    )
    rollouts_max: int | None = field(
        default=None,
        metadata={
            "help": "with --rollout-budget: the most rollouts a prompt gets (default: the service's limit)"
        },
    )
    rollout_policy: str = field(
        default=DEFAULT_ROLLOUT_POLICY,
        metadata={
            "help": "with --rollout-budget: how the service shares it out (docs/methods.md §8)",
            "choices": ROLLOUT_POLICIES,
        },
    )
    seed: int = field(default=0, metadata={"help": "seeds selection, sampling and training"})
    max_new_tokens: int = field(default=64, metadata={"help": "completion length cap, tokens"})
    top_p: float = field(
        default=1.0,
        metadata={
            "help": "nucleus sampling mass; only 1 is accepted (the update's log-probs are those of the full "
            "temperature-scaled distribution)"
        },
    )
    strategy_params: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "strategy params as JSON, e.g. '{\"eta\": 2}'", "flag": "--params"},
    )
    select_filter: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "keep the prompts almost surely solved or hopeless out of every batch: the select's filter "
            "as JSON, '{}' for the service's defaults, e.g. '{\"recheck\": 0.02}' (docs/api.md, \"Select with "
            'a filter"; default: none; strategy filter takes these as --params)',
            "flag": "--filter",
        },
    )
    run_id: str | None = field(
        default=None, metadata={"help": "prefix of observe request ids (default: strategy-seed-random)"}
    )
    start_step: int | None = field(
        default=None,
        metadata={"help": "first step (default: 0 on a fresh dataset, else after its open step)"},
    )
    ds_oversample: int = field(
        default=3, metadata={"help": "dynamic_sampling / speed_rl: prompts drawn per round / B"}
    )
    ds_max_rounds: int = field(
        default=4, metadata={"help": "dynamic_sampling / speed_rl: rounds per step at most"}
    )
    profile_samples: int | None = field(
        default=None,
        metadata={
            "help": "before the first step, sample N rollouts (2..16) of every prompt with the starting policy "
            "and upload each prompt's pass rate with its N samples as the dataset's profile, counted as "
            "profiling rollouts (default: no profile)"
        },
    )
    eval_every: int = field(default=0, metadata={"help": "greedy evaluation every N steps (0: off)"})
    eval_size: int = field(default=64, metadata={"help": "prompts in the fixed evaluation subset"})
    eval_max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "completion length cap of the evaluation (default: max_new_tokens)", "cli": False},
    )
    grpo: GRPOConfig = field(
        default_factory=GRPOConfig, metadata={"help": "the update's settings", "cli": False}
    )

    def __post_init__(self) -> None:
        _raise_if(self.problems())

    def problems(self, num_prompts: int | None = None) -> list[str]:
        """What is wrong with the values (and the batch size against ``num_prompts`` when given)."""

        def name(field_name: str) -> str:
            return option_name(TrainConfig, field_name)

        problems = []
        if self.steps < 1:
            problems.append(f"{name('steps')} must be >= 1 (got {self.steps})")
        if self.batch_size < 1:
            problems.append(f"{name('batch_size')} must be >= 1 (got {self.batch_size})")
        if num_prompts is not None and self.batch_size > num_prompts:
            problems.append(
                f"{name('batch_size')} {self.batch_size} is larger than the dataset ({num_prompts} prompts)"
            )
        if self.rollouts < 2:
            problems.append(
                f"GRPO compares completions within a group: {name('rollouts')} must be >= 2 (got {self.rollouts})"
            )
        if self.max_new_tokens < 1:
            problems.append(f"{name('max_new_tokens')} must be >= 1 (got {self.max_new_tokens})")
        problems.extend(self._budget_problems())
        if self.top_p != 1.0:
            # The update's log-probs are those of the temperature-scaled softmax over the whole
            # vocabulary; a nucleus-truncated sampler draws from another distribution, and tokens
            # outside the trainer's nucleus would have no finite renormalized log-prob.
            problems.append(
                f"{name('top_p')} must be 1 (got {self.top_p}): GRPO's log-probs are those of the full "
                "temperature-scaled distribution; lower --temperature to sharpen sampling instead"
            )
        if not isinstance(self.strategy_params, dict):
            problems.append(f"{name('strategy_params')} must be a JSON object, e.g. '{{\"eta\": 2.0}}'")
        if self.select_filter is not None and not isinstance(self.select_filter, dict):
            problems.append(f"{name('select_filter')} must be a JSON object, e.g. '{{\"recheck\": 0.02}}'")
        for count in ("ds_oversample", "ds_max_rounds", "eval_size"):
            if getattr(self, count) < 1:
                problems.append(f"{name(count)} must be >= 1 (got {getattr(self, count)})")
        if self.profile_samples is not None:
            if not PROFILE_SAMPLES[0] <= self.profile_samples <= PROFILE_SAMPLES[1]:
                low, high = PROFILE_SAMPLES
                problems.append(
                    f"{name('profile_samples')} must be {low}..{high} (got {self.profile_samples})"
                )
            if self.strategy in _SELF_SCREENING:
                problems.append(
                    f"{name('profile_samples')} profiles the prompts for the service's beliefs; --strategy "
                    f"{self.strategy} runs in the trainer and never reads them: drop --profile-samples or "
                    "choose a service strategy"
                )
        if self.eval_every < 0:
            problems.append(f"{name('eval_every')} must be >= 0 (got {self.eval_every})")
        if self.eval_max_new_tokens is not None and self.eval_max_new_tokens < 1:
            problems.append(f"{name('eval_max_new_tokens')} must be >= 1 (got {self.eval_max_new_tokens})")
        if self.run_id is not None and not (1 <= len(self.run_id) <= 64):
            problems.append(f"{name('run_id')} must be 1..64 characters (request ids add the step and rank)")
        return problems

    def _budget_problems(self) -> list[str]:
        """What is wrong with the rollout budget's options (nothing without a budget, unless bounds or a
        policy are given alone, which would be ignored)."""

        def name(field_name: str) -> str:
            return option_name(TrainConfig, field_name)

        budget, low, high = self.rollout_budget, self.rollouts_min, self.rollouts_max
        if budget is None:
            lone = [
                name(f)
                for f in ("rollouts_min", "rollouts_max", "rollout_policy")
                if getattr(self, f) != default_of(TrainConfig, f)
            ]
            verb = "applies" if len(lone) == 1 else "apply"
            return [f"{', '.join(lone)} {verb} only with {name('rollout_budget')}"] if lone else []
        problems = []
        if self.strategy in _SELF_SCREENING:
            problems.append(
                f"{name('rollout_budget')} asks the service to share rollouts over the prompts it selects; "
                f"--strategy {self.strategy} runs in the trainer and screens its own prompts with fixed group "
                "sizes, so it cannot take a budget: drop --rollout-budget or choose a service strategy"
            )
        words = {
            "min": lambda: f"{name('rollouts_min')} must be >= 1 (got {low})",
            "order": lambda: f"{name('rollouts_max')} {high} is below {name('rollouts_min')} {low}",
            "below": lambda: (
                f"{name('rollout_budget')} {budget} cannot give each of the {self.batch_size} prompts "
                f"{name('rollouts_min')} {low}: raise it to at least {self.batch_size * max(low, 1)} or lower "
                f"{name('batch_size')} / {name('rollouts_min')}"
            ),
            "above": lambda: (
                f"{name('rollout_budget')} {budget} exceeds {self.batch_size} prompts x {name('rollouts_max')} "
                f"{high}: lower it to at most {self.batch_size * high} or raise {name('rollouts_max')}"
            ),
        }
        problems.extend(words[p]() for p in rollout_problems(budget, low, high, self.batch_size))
        if self.rollout_policy not in ROLLOUT_POLICIES:
            problems.append(
                f"{name('rollout_policy')} must be one of {', '.join(ROLLOUT_POLICIES)} "
                f"(got {self.rollout_policy!r})"
            )
        return problems

    def validate(self, num_prompts: int | None = None) -> TrainConfig:
        """Check the values again (fields may have been reassigned), with the batch size against the
        dataset's ``num_prompts`` when given."""
        _raise_if(self.problems(num_prompts))
        self.grpo.validate()
        return self
