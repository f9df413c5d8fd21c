"""Settings of a GRPO run, and the one place their defaults live.

``trainer-client train`` reads its option defaults from these dataclasses, so the command line and
code that builds the configs directly always agree. The module imports nothing heavy (no torch), so
the command line can validate its options before loading a model.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

__all__ = ["OLD_LOGPROBS", "PRECISIONS", "GRPOConfig", "TrainConfig", "default_of"]

# "bf16": the transformer body runs under bfloat16 autocast; the output head, the softmax and the
# weights, gradients and AdamW state stay float32.
PRECISIONS = ("fp32", "bf16")
# Where the old log-probs of the PPO ratio come from when a batch gets more than one optimizer step.
OLD_LOGPROBS = ("sampler", "recompute")


@dataclass(frozen=True)
class GRPOConfig:
    """Optimization settings. ``validate()`` says which flag to change when a value makes no sense.

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
    """

    lr: float = 1e-5
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    scale_by_std: bool = True
    adv_eps: float = 1e-4
    epochs: int = 1
    minibatches: int = 1
    micro_batch_size: int = 8
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    temperature: float = 1.0
    share_prompt: bool = True
    precision: str = "fp32"
    tis_cap: float = 2.0
    old_logprobs: str = "sampler"

    def validate(self) -> GRPOConfig:
        problems = []
        if not (self.lr > 0 and math.isfinite(self.lr)):
            problems.append(f"--lr must be a positive number (got {self.lr})")
        if not (0 < self.clip_eps_low < 1):
            problems.append(f"--clip-eps must be in (0, 1) (got {self.clip_eps_low})")
        if not (self.clip_eps_high > 0):
            problems.append(f"--clip-eps-high must be > 0 (got {self.clip_eps_high})")
        if self.kl_coef < 0:
            problems.append(f"--kl-coef must be >= 0 (got {self.kl_coef})")
        if self.epochs < 1 or self.minibatches < 1:
            problems.append("--grpo-epochs and --minibatches must be >= 1")
        if self.micro_batch_size < 1:
            problems.append(f"--micro-batch must be >= 1 (got {self.micro_batch_size})")
        if self.max_grad_norm <= 0:
            problems.append(f"--max-grad-norm must be > 0 (got {self.max_grad_norm})")
        if self.weight_decay < 0:
            problems.append(f"--weight-decay must be >= 0 (got {self.weight_decay})")
        if self.temperature <= 0:
            problems.append(
                f"GRPO needs sampled completions: --temperature must be > 0 (got {self.temperature})"
            )
        if self.precision not in PRECISIONS:
            problems.append(f"--precision must be one of {', '.join(PRECISIONS)} (got {self.precision!r})")
        if not (self.tis_cap == 0 or (self.tis_cap >= 1 and math.isfinite(self.tis_cap))):
            problems.append(
                f"--tis-cap must be 0 (no correction) or a finite number >= 1 (got {self.tis_cap})"
            )
        if self.old_logprobs not in OLD_LOGPROBS:
            problems.append(
                f"--old-logprobs must be one of {', '.join(OLD_LOGPROBS)} (got {self.old_logprobs!r})"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


@dataclass
class TrainConfig:
    """Everything a run needs besides the objects it talks to. ``validate`` explains bad values."""

    dataset: str
    strategy: str = "insight"
    steps: int = 20
    batch_size: int = 8
    rollouts: int = 8
    seed: int = 0
    max_new_tokens: int = 64
    top_p: float = 1.0
    strategy_params: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    start_step: int | None = None
    ds_oversample: int = 3
    ds_max_rounds: int = 4
    eval_every: int = 0
    eval_size: int = 64
    eval_max_new_tokens: int | None = None
    grpo: GRPOConfig = field(default_factory=GRPOConfig)

    def validate(self, num_prompts: int | None = None) -> TrainConfig:
        problems = []
        if self.steps < 1:
            problems.append(f"--steps must be >= 1 (got {self.steps})")
        if self.batch_size < 1:
            problems.append(f"--batch-size must be >= 1 (got {self.batch_size})")
        if num_prompts is not None and self.batch_size > num_prompts:
            problems.append(
                f"--batch-size {self.batch_size} is larger than the dataset ({num_prompts} prompts)"
            )
        if self.rollouts < 2:
            problems.append(
                f"GRPO compares completions within a group: --rollouts must be >= 2 (got {self.rollouts})"
            )
        if self.max_new_tokens < 1:
            problems.append(f"--max-new-tokens must be >= 1 (got {self.max_new_tokens})")
        if self.top_p != 1.0:
            # The update's log-probs are those of the temperature-scaled softmax over the whole
            # vocabulary; a nucleus-truncated sampler draws from another distribution, and tokens
            # outside the trainer's nucleus would have no finite renormalized log-prob.
            problems.append(
                f"--top-p must be 1 (got {self.top_p}): GRPO's log-probs are those of the full "
                "temperature-scaled distribution; lower --temperature to sharpen sampling instead"
            )
        if self.ds_oversample < 1 or self.ds_max_rounds < 1:
            problems.append("--ds-oversample and --ds-max-rounds must be >= 1")
        if self.eval_every < 0 or self.eval_size < 1:
            problems.append("--eval-every must be >= 0 and --eval-size >= 1")
        if self.run_id is not None and not (1 <= len(self.run_id) <= 64):
            problems.append("--run-id must be 1..64 characters (request ids add the step and rank)")
        if problems:
            raise ValueError("; ".join(problems))
        self.grpo.validate()
        return self


def default_of(cls: type, name: str) -> Any:
    """The default value of dataclass field ``name`` of ``cls`` (``KeyError`` when it has none)."""
    for item in fields(cls):
        if item.name == name:
            if item.default is not MISSING:
                return item.default
            if item.default_factory is not MISSING:
                return item.default_factory()
            break
    raise KeyError(f"{cls.__name__}.{name} has no default")
