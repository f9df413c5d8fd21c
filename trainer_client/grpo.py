"""GRPO: group-normalized advantages and the clipped policy-gradient loss, in PyTorch.

The variant implemented here (one prompt -> a group of K sampled completions):

- Advantage of completion i in its group: ``A_i = (r_i - mean(r)) / (std(r) + eps)`` with the
  sample standard deviation (Bessel-corrected, as common GRPO implementations do); ``scale_by_std
  = False`` keeps only the mean-centering (the Dr. GRPO choice). Groups whose rewards are all equal
  get ``A = 0``: they carry no learning signal, which is why the service's selection matters.
- Per token t of completion i: ``ratio = exp(logp - logp_old)``,
  ``loss_t = -min(ratio * A_i, clip(ratio, 1 - eps_low, 1 + eps_high) * A_i) + kl_coef * KL_t``
  with ``KL_t = exp(ref - logp) - (ref - logp) - 1`` (the non-negative "k3" estimator).
- Aggregation: a token-level mean, ``sum over every completion token of the batch / number of those
  tokens``, also when the batch is split into micro-batches for memory (each micro-batch's sum is
  divided by the whole batch's token count before ``backward``, so accumulation is exact).

How this departs from the paper (DeepSeekMath's GRPO):

- Token-level mean over the batch instead of a per-sequence mean averaged over sequences (DAPO's
  choice: long completions are not down-weighted per token). Tokens of zero-advantage groups stay in
  the denominator, so a batch with few informative groups moves the policy less.
- The KL penalty is off by default (``kl_coef = 0``, as DAPO and Dr. GRPO argue); when it is on,
  the reference model is a frozen copy of the initial policy and the KL is added to the per-token loss
  rather than folded into the reward.
- One optimizer step per batch by default (``epochs = minibatches = 1``): the old policy is the
  current one, the ratio is exactly 1 and the clip is inactive; the loss gradient is then the plain
  policy gradient ``-A * grad logp``. With ``epochs > 1`` or ``minibatches > 1`` the old log-probs are
  computed once before the first update and clipping acts as in PPO. ``eps_high`` may exceed
  ``eps_low`` (DAPO's "clip-higher").
- Log-probs are recomputed by the trainer's PyTorch model (not taken from the rollout engine, whose
  kernels differ numerically), from logits divided by the sampling temperature so that they are the
  log-probs of the distribution the completions were sampled from.
- Completions cut at ``max_new_tokens`` are trained on like finished ones (no overlong penalty).

Cost: a group's K completions share one prompt pass (``share_prompt``; the prompt's keys/values
keep their gradient), and ``precision="bf16"`` runs forward/backward under bfloat16 autocast with
float32 weights and optimizer state. On a 2-core CPU these cut an update of SmolLM2-135M on 8
completions of a 53-token prompt from ~50 s to ~9 s.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "GRPOConfig",
    "GRPOLearner",
    "Sample",
    "UpdateStats",
    "build_samples",
    "completion_logprobs",
    "group_advantages",
    "per_token_loss",
    "shared_prompt_logprobs",
]


# "bf16": forward/backward under bfloat16 autocast; weights, gradients and AdamW state stay float32.
_PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class GRPOConfig:
    """Optimization settings. ``validate()`` says which flag to change when a value makes no sense."""

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
        if self.temperature <= 0:
            problems.append(
                f"GRPO needs sampled completions: --temperature must be > 0 (got {self.temperature})"
            )
        if self.precision not in _PRECISIONS:
            problems.append(f"--precision must be one of {', '.join(_PRECISIONS)} (got {self.precision!r})")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def group_advantages(rewards: torch.Tensor, *, scale_by_std: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """Group-normalized advantages for a ``[groups, K]`` reward tensor (float64 math, same shape out).

    A group of identical rewards (or K = 1) gets zeros, never NaN.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, K], got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float64)
    # Exact zeros for tied groups: the mean of equal floats can differ from them in the last bit.
    tied = r.max(dim=1, keepdim=True).values == r.min(dim=1, keepdim=True).values
    centered = torch.where(tied, torch.zeros_like(r), r - r.mean(dim=1, keepdim=True))
    if not scale_by_std:
        return centered
    std = r.std(dim=1, keepdim=True, unbiased=True) if r.shape[1] > 1 else torch.ones_like(r[:, :1])
    return centered / (std + eps)


def per_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps_low: float,
    clip_eps_high: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate (+ optional KL) per token; all inputs are flat ``[tokens]`` tensors.

    Returns the per-token loss and detached per-token diagnostics (``clipped`` as 0/1, ``kl``).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    surrogate = torch.minimum(ratio * advantages, clipped_ratio * advantages)
    loss = -surrogate
    clipped = ((ratio < 1.0 - clip_eps_low) & (advantages < 0)) | (
        (ratio > 1.0 + clip_eps_high) & (advantages > 0)
    )
    kl = torch.zeros_like(logprobs)
    if ref_logprobs is not None and kl_coef > 0:
        log_ratio = ref_logprobs - logprobs
        kl = torch.exp(log_ratio) - log_ratio - 1.0
        loss = loss + kl_coef * kl
    return loss, {"clipped": clipped.detach().to(logprobs.dtype), "kl": kl.detach()}


def completion_logprobs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    pad_token_id: int = 0,
) -> torch.Tensor:
    """Log-probs of each completion token under ``model``, flattened in order: ``[sum of lengths]``.

    Sequences are right-padded (no position-id shift needed under a causal mask). Only the hidden
    states that predict completion tokens go through the output head, which keeps the vocabulary-wide
    logits small.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError("prompt_ids and completion_ids must have the same length")
    device = next(model.parameters()).device
    lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
    width = max(lengths)
    input_ids = torch.full((len(lengths), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(lengths), width), dtype=torch.long)
    predicts_completion = torch.zeros((len(lengths), width - 1), dtype=torch.bool)
    for row, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        tokens = list(prompt) + list(completion)
        input_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        attention[row, : len(tokens)] = 1
        # hidden state at position p predicts token p + 1
        predicts_completion[row, len(prompt) - 1 : len(tokens) - 1] = True
    input_ids, attention = input_ids.to(device), attention.to(device)
    predicts_completion = predicts_completion.to(device)

    hidden = model.base_model(input_ids=input_ids, attention_mask=attention).last_hidden_state
    selected = hidden[:, :-1][predicts_completion]  # [tokens, hidden], row-major = completion order
    targets = input_ids[:, 1:][predicts_completion]
    logits = model.get_output_embeddings()(selected)
    if logits.dtype in (torch.float16, torch.bfloat16):  # softmax statistics in at least float32
        logits = logits.float()
    logits = logits / temperature
    return logits.gather(1, targets[:, None]).squeeze(1) - torch.logsumexp(logits, dim=1)


def shared_prompt_logprobs(
    model: Any,
    prompt: Sequence[int],
    completions: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    pad_token_id: int = 0,
) -> torch.Tensor:
    """``completion_logprobs`` for completions of one prompt, running the prompt only once.

    The prompt's keys/values are computed once (with gradient) and repeated for every completion,
    so a group of K completions costs one prompt pass instead of K. Gradients still flow through
    the prompt's keys and values: the result and its gradient equal ``completion_logprobs`` on
    ``[prompt] * K`` up to float rounding.
    """
    if not completions or any(len(c) == 0 for c in completions):
        raise ValueError("every completion needs at least one token")
    device = next(model.parameters()).device
    base = model.base_model
    prefix = base(input_ids=torch.tensor([list(prompt)], device=device), use_cache=True)
    cache = prefix.past_key_values
    count, prompt_len = len(completions), len(prompt)
    cache.batch_repeat_interleave(count)
    lengths = torch.tensor([len(c) for c in completions])
    width = int(lengths.max())
    input_ids = torch.full((count, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((count, prompt_len + width), dtype=torch.long)
    attention[:, :prompt_len] = 1
    for row, completion in enumerate(completions):
        input_ids[row, : len(completion)] = torch.tensor(list(completion), dtype=torch.long)
        attention[row, prompt_len : prompt_len + len(completion)] = 1
    input_ids = input_ids.to(device)
    positions = torch.arange(prompt_len, prompt_len + width, device=device).expand(count, -1)
    hidden = base(
        input_ids=input_ids,
        attention_mask=attention.to(device),
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    # completion token j is predicted by the hidden state before it: the prompt's last one for j = 0
    predictors = torch.cat([prefix.last_hidden_state[:, -1:].expand(count, -1, -1), hidden[:, :-1]], dim=1)
    valid = (torch.arange(width)[None, :] < lengths[:, None]).to(device)
    logits = model.get_output_embeddings()(predictors[valid])
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logits = logits / temperature
    targets = input_ids[valid]
    return logits.gather(1, targets[:, None]).squeeze(1) - torch.logsumexp(logits, dim=1)


@dataclass(frozen=True)
class Sample:
    """One sampled completion with its group-normalized advantage."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float


@dataclass(frozen=True)
class UpdateStats:
    """What one ``GRPOLearner.update`` did. ``updated`` is False when no sample carried a gradient."""

    loss: float
    updated: bool
    optimizer_steps: int
    tokens: int
    active_tokens: int
    clip_frac: float
    kl: float
    grad_norm: float


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class GRPOLearner:
    """Owns the policy's optimizer (and the frozen reference model when ``kl_coef > 0``)."""

    def __init__(self, model: Any, config: GRPOConfig, *, pad_token_id: int = 0) -> None:
        self.model = model
        self.config = config.validate()
        self.pad_token_id = pad_token_id
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=config.lr, weight_decay=config.weight_decay
        )
        self.reference = None
        if config.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval()
            for parameter in self.reference.parameters():
                parameter.requires_grad_(False)

    def _logprobs(self, model: Any, samples: Sequence[Sample]) -> torch.Tensor:
        """Flat log-probs of ``samples``' completion tokens, in order. Consecutive samples with the
        same prompt (a group) share one prompt pass when ``share_prompt`` is on."""
        cfg = self.config
        device = next(model.parameters()).device
        dtype = _PRECISIONS[cfg.precision]
        autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with autocast:
            if not cfg.share_prompt:
                return completion_logprobs(
                    model,
                    [s.prompt_ids for s in samples],
                    [s.completion_ids for s in samples],
                    temperature=cfg.temperature,
                    pad_token_id=self.pad_token_id,
                )
            parts = []
            for prompt, run in itertools.groupby(samples, key=lambda s: s.prompt_ids):
                completions = [s.completion_ids for s in run]
                parts.append(
                    shared_prompt_logprobs(
                        model,
                        prompt,
                        completions,
                        temperature=cfg.temperature,
                        pad_token_id=self.pad_token_id,
                    )
                )
            return torch.cat(parts)

    def _frozen_logprobs(self, model: Any, samples: Sequence[Sample]) -> torch.Tensor:
        with torch.no_grad():
            parts = [self._logprobs(model, chunk) for chunk in _chunks(samples, self.config.micro_batch_size)]
        return torch.cat(parts) if parts else torch.zeros(0)

    def update(self, samples: Sequence[Sample]) -> UpdateStats:
        """Run ``epochs x minibatches`` optimizer steps on ``samples`` (one batch of groups)."""
        cfg = self.config
        samples = [s for s in samples if len(s.completion_ids) > 0]
        total_tokens = sum(len(s.completion_ids) for s in samples)
        use_kl = self.reference is not None
        active = [s for s in samples if use_kl or s.advantage != 0.0]
        active_tokens = sum(len(s.completion_ids) for s in active)
        if not active:
            return UpdateStats(0.0, False, 0, total_tokens, 0, 0.0, 0.0, 0.0)

        # Old log-probs are needed only when the policy moves between forward passes on the same data.
        needs_old = cfg.epochs > 1 or cfg.minibatches > 1
        old_logprobs: dict[int, torch.Tensor] = {}  # sample position -> its tokens' old log-probs
        if needs_old:
            positions = [i for i, s in enumerate(samples) if use_kl or s.advantage != 0.0]
            flat = self._frozen_logprobs(self.model, [samples[i] for i in positions])
            pieces = torch.split(flat, [len(samples[i].completion_ids) for i in positions])
            old_logprobs = dict(zip(positions, pieces, strict=True))

        self.model.train()
        minibatch_size = math.ceil(len(samples) / cfg.minibatches)
        losses, clip_sum, kl_sum, grad_norm, steps = [], 0.0, 0.0, 0.0, 0
        for _ in range(cfg.epochs):
            for minibatch in _chunks(range(len(samples)), minibatch_size):
                normalizer = sum(len(samples[i].completion_ids) for i in minibatch)
                trainable = [i for i in minibatch if use_kl or samples[i].advantage != 0.0]
                if not trainable:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                minibatch_loss = 0.0
                for micro_positions in _chunks(trainable, cfg.micro_batch_size):
                    micro = [samples[i] for i in micro_positions]
                    logprobs = self._logprobs(self.model, micro)
                    if needs_old:
                        old = torch.cat([old_logprobs[i] for i in micro_positions]).to(logprobs.device)
                    else:
                        old = logprobs.detach()
                    advantages = torch.cat(
                        [
                            torch.full((len(s.completion_ids),), s.advantage, dtype=logprobs.dtype)
                            for s in micro
                        ]
                    ).to(logprobs.device)
                    reference = self._frozen_logprobs(self.reference, micro) if use_kl else None
                    token_loss, diag = per_token_loss(
                        logprobs,
                        old,
                        advantages,
                        clip_eps_low=cfg.clip_eps_low,
                        clip_eps_high=cfg.clip_eps_high,
                        ref_logprobs=reference,
                        kl_coef=cfg.kl_coef,
                    )
                    loss = token_loss.sum() / normalizer
                    loss.backward()
                    minibatch_loss += float(loss.detach())
                    clip_sum += float(diag["clipped"].sum())
                    kl_sum += float(diag["kl"].sum())
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm))
                self.optimizer.step()
                steps += 1
                losses.append(minibatch_loss)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        passes = max(cfg.epochs, 1)
        return UpdateStats(
            loss=sum(losses) / len(losses) if losses else 0.0,
            updated=steps > 0,
            optimizer_steps=steps,
            tokens=total_tokens,
            active_tokens=active_tokens,
            clip_frac=clip_sum / (active_tokens * passes) if active_tokens else 0.0,
            kl=kl_sum / (active_tokens * passes) if active_tokens else 0.0,
            grad_norm=grad_norm,
        )


def build_samples(
    prompt_ids: Sequence[Sequence[int]],
    completions: Sequence[Sequence[Sequence[int]]],
    rewards: Sequence[Sequence[float]],
    *,
    scale_by_std: bool = True,
    eps: float = 1e-4,
) -> list[Sample]:
    """Turn groups (one prompt, its K completions and K rewards) into ``Sample``s with advantages."""
    samples: list[Sample] = []
    for prompt, group_completions, group_rewards in zip(prompt_ids, completions, rewards, strict=True):
        if len(group_completions) != len(group_rewards):
            raise ValueError("each group needs one reward per completion")
        advantages = group_advantages(
            torch.tensor([list(group_rewards)], dtype=torch.float64), scale_by_std=scale_by_std, eps=eps
        )[0]
        for completion, advantage in zip(group_completions, advantages.tolist(), strict=True):
            samples.append(Sample(tuple(prompt), tuple(completion), float(advantage)))
    return samples
