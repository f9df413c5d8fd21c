"""GRPO: group-normalized advantages and the clipped policy-gradient loss, in PyTorch.

The variant implemented here (one prompt -> a group of K sampled completions) is GRPO with DAPO's
aggregation and clip-higher, plus a truncated importance-sampling correction of the gap between the
rollout engine and the trainer:

- Advantage of completion i in its group: ``A_i = (r_i - mean(r)) / (std(r) + eps)`` with the
  sample standard deviation (Bessel-corrected, as common GRPO implementations do); ``scale_by_std
  = False`` keeps only the mean-centering (Dr. GRPO's advantage; the loss normalizer below stays the
  batch's token count, not Dr. GRPO's constant). Groups whose rewards are all equal get ``A = 0``:
  they carry no learning signal, which is why the service's selection matters.
- Per token t of completion i: ``ratio = exp(logp - logp_old)``,
  ``loss_t = -w_t * min(ratio * A_i, clip(ratio, 1 - eps_low, 1 + eps_high) * A_i) + kl_coef * KL_t``
  with ``KL_t = exp(ref - logp) - (ref - logp) - 1`` (the non-negative "k3" estimator) and
  ``w_t = min(exp(logp_old - logp_sampler), tis_cap)`` (detached), the truncated importance weight
  of Yao et al. (2025, "Your efficient RL framework secretly brings you off-policy RL training"): the
  completions were drawn by the rollout engine, whose probabilities differ from the trainer's
  (other kernels, other precision), so the gradient is reweighted from the sampler's distribution
  to the trainer's, with the weight capped to bound its variance. ``tis_cap = 0`` sets ``w = 1``.
- Aggregation (``loss_norm``): by default (``"token"``) a token-level mean, ``sum over every completion
  token of the batch / number of those tokens``, also when the batch is split into micro-batches for
  memory (each micro-batch's sum is divided by the whole batch's count before ``backward``, so
  accumulation is exact). ``"active_token"`` divides by the tokens of the samples with a non-zero
  advantage only, so a batch with few informative groups moves the policy as far as a batch of them;
  ``"sequence"`` (the GRPO paper's) averages each completion over its own tokens, then the completions
  over the batch.

Groups of different sizes (a rollout budget gives prompt i its own n_i): each group's advantages are
normalized over its own n_i rewards (mean and sample std of that group only); a group of one has no
spread and gets ``A = 0`` (no gradient; its tokens stay in the denominator like a tied group's). How
much a group counts is ``group_weight``:

- ``"prompt"`` (the default): every group weighs as one prompt. Each sample's tokens are weighted by
  ``w_g = nbar / n_g`` (``nbar``: the batch's mean group size), so a group's total weight is ``nbar``
  times its mean completion length whatever its size, and the loss is the weighted token mean
  ``sum_t w_t * loss_t / sum_t w_t``. Reason: the budget gives a prompt more rollouts to estimate its
  advantages and gradient better (lower variance, the objective of Knapsack RL's and VIP's
  allocations), not to make it count more; with per-rollout weights the allocator would also reweight
  the training objective toward the prompts it gave the most (the hard, uncertain ones), a second
  effect nobody asked for.
- ``"rollout"``: every completion weighs the same (the plain token mean): a group of 16 weighs 8x a
  group of 2.

With equal sizes every ``w`` is 1 and both are the token mean below, unchanged.

How this departs from the paper (DeepSeekMath's GRPO):

- By default a token-level mean over the batch instead of a per-sequence mean averaged over sequences
  (DAPO's choice: long completions are not down-weighted per token). Tokens of zero-advantage groups
  stay in the denominator, so a batch with few informative groups moves the policy less
  (``loss_norm = "active_token"`` drops them from it).
- The KL penalty is off by default (``kl_coef = 0``, as DAPO and Dr. GRPO argue); when it is on,
  the reference model is a frozen copy of the initial policy, its log-probs are computed once per
  update, and the KL is added to the per-token loss rather than folded into the reward.
- One optimizer step per batch by default (``epochs = minibatches = 1``): the old policy is the
  current one, the ratio is exactly 1 and the clip is inactive; the gradient is then the truncated
  importance-weighted policy gradient ``-w * A * grad logp``. With ``epochs > 1`` or ``minibatches > 1``
  the old log-probs are the rollout engine's (``old_logprobs = "sampler"``: no extra forward pass, the
  ratio itself corrects the mismatch and the clip bounds it, so ``w = 1``) or the trainer's, computed
  once before the first update (``"recompute"``, with ``w`` as above). ``eps_high`` may exceed
  ``eps_low`` (DAPO's "clip-higher").
- Log-probs are those of the temperature-scaled softmax over the whole vocabulary (top-p sampling is
  refused by the loop for that reason), computed by the trainer's PyTorch model with the output head
  and softmax in float32 (outside any autocast) and the model's own logit transform (Gemma2 soft-
  capping, Granite's ``logits_scaling``, Cohere's ``logit_scale``); architectures whose output head
  has not been checked are refused (``check_output_head``).
- Completions cut at ``max_new_tokens`` are trained on like finished ones (no overlong penalty).

Diagnostics of every update (``UpdateStats``): the trainer/sampler log-prob mismatch per token (mean
and max of ``|logp_trainer - logp_sampler|``, and a k3 estimate of KL(sampler || trainer)), measured
on the tokens the update runs through before its first optimizer step; the truncated weights' mean
and the share that hit the cap; the clip fraction; the KL to the reference; the pre-clip gradient
norm; the policy's mean per-token entropy.

Cost: a group's K completions share one prompt pass (``share_prompt``; the prompt's keys/values
keep their gradient), and ``precision="bf16"`` runs the transformer body under bfloat16 autocast with
float32 weights and optimizer state. On a 2-core CPU these cut an update of SmolLM2-135M on 8
completions of a 53-token prompt from ~50 s to ~9 s.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainer_client.config import GRPOConfig

__all__ = [
    "CHECKED_ARCHITECTURES",
    "GRPOConfig",
    "GRPOLearner",
    "Sample",
    "UnsupportedModel",
    "UpdateStats",
    "build_samples",
    "check_output_head",
    "completion_logprobs",
    "group_advantages",
    "output_logits",
    "per_token_loss",
    "shared_prompt_logprobs",
]


_AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16}

# Hugging Face ``model_type``s whose causal-LM forward was read (transformers 5.x) and found to be
# ``logits = transform(lm_head(last hidden state))`` with ``transform`` one of those `output_logits`
# applies (or none). Any other architecture may post-process its logits in a way the trainer would
# silently miss (a multiplier, vocabulary unpadding, ...), so it is refused.
CHECKED_ARCHITECTURES = frozenset(
    {
        "cohere", "cohere2", "gemma", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "granite", "granitemoe",
        "llama", "mistral", "mixtral", "olmo", "olmo2", "phi", "phi3", "qwen2", "qwen2_moe", "qwen3",
        "qwen3_moe", "smollm3", "stablelm", "starcoder2",
    }
)  # fmt: skip


class UnsupportedModel(ValueError):
    """The model's log-probs cannot be computed faithfully by the trainer; the message says why."""


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
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate (+ optional KL) per token; all inputs are flat ``[tokens]`` tensors.

    ``is_weights`` (detached, e.g. truncated importance weights) multiply the surrogate, not the KL.
    Returns the per-token loss and detached per-token diagnostics (``clipped`` as 0/1, ``kl``).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    surrogate = torch.minimum(ratio * advantages, clipped_ratio * advantages)
    if is_weights is not None:
        surrogate = surrogate * is_weights.detach()
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


# --------------------------------------------------------------------------------------------------
# Log-probs
# --------------------------------------------------------------------------------------------------
def _logit_transform(config: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What the model's own forward does to ``lm_head``'s output, or None for nothing."""
    model_type = getattr(config, "model_type", None)
    if model_type in ("gemma2", "gemma3_text"):
        cap = getattr(config, "final_logit_softcapping", None)
        if cap:
            return lambda logits: torch.tanh(logits / cap) * cap
    elif model_type in ("granite", "granitemoe"):
        scaling = config.logits_scaling
        return lambda logits: logits / scaling
    elif model_type in ("cohere", "cohere2"):
        scale = config.logit_scale
        return lambda logits: logits * scale
    return None


def output_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The model's logits for ``[..., hidden]`` states, in float32 (float64 for a float64 model).

    The output head runs outside any autocast region with float32 weights and inputs, so a bf16
    body does not round the logits to bf16; then the model's own logit transform is applied.
    """
    head = model.get_output_embeddings()
    weight = head.weight
    dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        if isinstance(head, torch.nn.Linear):
            bias = head.bias.to(dtype) if head.bias is not None else None
            logits = torch.nn.functional.linear(hidden.to(dtype), weight.to(dtype), bias)
        else:  # pragma: no cover - every checked architecture has a Linear head
            logits = head(hidden.to(weight.dtype)).to(dtype)
        transform = _logit_transform(model.config)
        if transform is not None:
            logits = transform(logits)
    return logits


def _token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, *, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` under ``softmax(logits / temperature)`` and, optionally, the (detached)
    entropy of each row's distribution."""
    logits = logits / temperature
    normalizer = torch.logsumexp(logits, dim=1)
    logprobs = logits.gather(1, targets[:, None]).squeeze(1) - normalizer
    if not entropy:
        return logprobs, None
    with torch.no_grad():
        probs = torch.softmax(logits.detach(), dim=1)
        row_entropy = normalizer.detach() - (probs * logits.detach()).sum(dim=1)
    return logprobs, row_entropy


def _completion_states(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    pad_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states that predict completion tokens (``[tokens, hidden]``) and those tokens."""
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
    return selected, input_ids[:, 1:][predicts_completion]


def _shared_prompt_states(
    model: Any, prompt: Sequence[int], completions: Sequence[Sequence[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_completion_states` for completions of one prompt, running the prompt once."""
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
    return predictors[valid], input_ids[valid]


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
    states that predict completion tokens go through the output head (`output_logits`), which keeps
    the vocabulary-wide logits small.
    """
    states, targets = _completion_states(model, prompt_ids, completion_ids, pad_token_id)
    return _token_logprobs(output_logits(model, states), targets, temperature)[0]


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
    states, targets = _shared_prompt_states(model, prompt, completions, pad_token_id)
    return _token_logprobs(output_logits(model, states), targets, temperature)[0]


def check_output_head(model: Any, *, atol: float | None = None) -> None:
    """Refuse a model whose log-probs `completion_logprobs` would get wrong.

    Two checks: the architecture must be one whose output head was read (``CHECKED_ARCHITECTURES``),
    and on a short token sequence the trainer's log-probs must equal ``log_softmax`` of the model's
    own ``forward`` logits (catching a transform the architecture's code applies that the trainer does
    not). Raises `UnsupportedModel` with what to do.
    """
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in CHECKED_ARCHITECTURES:
        raise UnsupportedModel(
            f"architecture {model_type!r} is not supported by the GRPO trainer: its output head has not "
            "been checked for logit transforms (soft-capping, scaling, multipliers) that the trainer's "
            f"log-probs must reproduce; supported: {', '.join(sorted(CHECKED_ARCHITECTURES))}"
        )
    head = model.get_output_embeddings()
    if head is None:
        raise UnsupportedModel(f"{type(model).__name__} has no output embeddings (not a causal LM head)")
    vocab = int(head.weight.shape[0])
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (1, 12), generator=generator).tolist()[0]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ours = completion_logprobs(model, [tokens[:4]], [tokens[4:]])
            logits = model(input_ids=torch.tensor([tokens], device=device)).logits[0, 3:-1]
            theirs = torch.log_softmax(logits.to(ours.dtype), dim=-1).gather(
                1, torch.tensor(tokens[4:], device=device)[:, None]
            )[:, 0]
    finally:
        model.train(was_training)
    if atol is None:  # the model's own head rounds to its dtype; ours runs in float32
        atol = {torch.float64: 1e-8, torch.float32: 1e-4}.get(head.weight.dtype, 5e-2)
    gap = float((ours - theirs).abs().max())
    if not gap <= atol:
        raise UnsupportedModel(
            f"{type(model).__name__}: the trainer's log-probs differ from the model's own forward by "
            f"{gap:.3g} nats (tolerance {atol:g}); its logits are post-processed in a way the trainer "
            "does not reproduce"
        )


# --------------------------------------------------------------------------------------------------
# The learner
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One sampled completion with its group-normalized advantage.

    ``weight``: how much each of its tokens counts in the batch's token mean (``build_samples`` sets it
    from its group's size, see "Groups of different sizes"; 1 when every group has the same size).
    ``sampler_logprobs``: the rollout engine's log-prob of each completion token (what it sampled
    from), or None when the engine does not report them.
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float
    sampler_logprobs: tuple[float, ...] | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"a sample's weight must be a positive number (got {self.weight})")
        if self.sampler_logprobs is not None and len(self.sampler_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"sampler_logprobs has {len(self.sampler_logprobs)} entries for "
                f"{len(self.completion_ids)} completion tokens"
            )


@dataclass(frozen=True)
class UpdateStats:
    """What one ``GRPOLearner.update`` did. ``updated`` is False when no sample carried a gradient.

    Per-token means over the tokens the update ran through; None where a quantity was not measured
    (no update, no sampler log-probs, no KL penalty):

    - ``mismatch_mean`` / ``mismatch_max``: ``|logp_trainer - logp_sampler|`` before the first step;
      ``mismatch_kl``: k3 estimate of KL(sampler || trainer) on the sampled tokens.
    - ``tis_weight_mean`` / ``tis_capped_frac``: the truncated importance weights, and the share of
      tokens whose ratio exceeded the cap.
    - ``clip_frac``: share of token passes whose ratio was clipped; ``kl``: k3 KL to the reference;
      ``grad_norm``: mean pre-clip gradient norm over optimizer steps; ``entropy``: mean entropy (nats)
      of the trainer's sampling distribution at the completion tokens.
    """

    updated: bool
    optimizer_steps: int
    tokens: int
    active_tokens: int
    clip_frac: float | None = None
    kl: float | None = None
    grad_norm: float | None = None
    entropy: float | None = None
    mismatch_mean: float | None = None
    mismatch_max: float | None = None
    mismatch_kl: float | None = None
    tis_weight_mean: float | None = None
    tis_capped_frac: float | None = None


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class _Sums:
    """Running sums of per-token diagnostics."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.maxima: dict[str, float] = {}

    def add(self, name: str, values: torch.Tensor) -> None:
        if values.numel() == 0:
            return
        values = values.detach().double()
        self.values[name] = self.values.get(name, 0.0) + float(values.sum())
        self.counts[name] = self.counts.get(name, 0) + values.numel()
        self.maxima[name] = max(self.maxima.get(name, -math.inf), float(values.max()))

    def mean(self, name: str) -> float | None:
        return self.values[name] / self.counts[name] if self.counts.get(name) else None

    def max(self, name: str) -> float | None:
        return self.maxima.get(name)


class GRPOLearner:
    """Owns the policy's optimizer (and the frozen reference model when ``kl_coef > 0``).

    The policy's output head is checked first (`check_output_head`): an architecture whose log-probs
    the trainer cannot reproduce raises `UnsupportedModel`.
    """

    def __init__(self, model: Any, config: GRPOConfig, *, pad_token_id: int = 0) -> None:
        self.model = model
        self.config = config.validate()
        self.pad_token_id = pad_token_id
        check_output_head(model)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=config.lr, weight_decay=config.weight_decay
        )
        warmup = config.warmup_steps
        self.scheduler = (
            torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda done: min(1.0, (done + 1) / warmup))
            if warmup > 0
            else None
        )
        self.reference = None
        if config.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval()
            for parameter in self.reference.parameters():
                parameter.requires_grad_(False)

    def _logprobs(
        self, model: Any, samples: Sequence[Sample], *, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Flat log-probs of ``samples``' completion tokens, in order (and their entropies when asked).
        Consecutive samples with the same prompt (a group) share one prompt pass when ``share_prompt``
        is on. The body runs under the configured autocast; the head and softmax do not."""
        cfg = self.config
        device = next(model.parameters()).device
        dtype = _AUTOCAST_DTYPES[cfg.precision]
        autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with autocast:
            if not cfg.share_prompt:
                states, targets = _completion_states(
                    model,
                    [s.prompt_ids for s in samples],
                    [s.completion_ids for s in samples],
                    self.pad_token_id,
                )
            else:
                parts = [
                    _shared_prompt_states(model, prompt, [s.completion_ids for s in run], self.pad_token_id)
                    for prompt, run in itertools.groupby(samples, key=lambda s: s.prompt_ids)
                ]
                states = torch.cat([p[0] for p in parts])
                targets = torch.cat([p[1] for p in parts])
        return _token_logprobs(output_logits(model, states), targets, cfg.temperature, entropy=entropy)

    def _frozen_logprobs(self, model: Any, samples: Sequence[Sample]) -> list[torch.Tensor]:
        """Per-sample log-probs without gradient, computed micro-batch by micro-batch."""
        pieces: list[torch.Tensor] = []
        with torch.no_grad():
            for chunk in _chunks(samples, self.config.micro_batch_size):
                flat = self._logprobs(model, chunk)[0]
                pieces.extend(torch.split(flat, [len(s.completion_ids) for s in chunk]))
        return pieces

    def _normalizer(self, minibatch: Sequence[Sample], trainable: Sequence[Sample]) -> float:
        """What a minibatch's summed (weighted) token loss is divided by (``loss_norm``): its weighted
        token count, that of the samples with a gradient only, or its weighted sample count (each
        sample's tokens then weigh ``weight / length``)."""
        norm = self.config.loss_norm
        if norm == "sequence":
            return sum(s.weight for s in minibatch)
        counted = trainable if norm == "active_token" else minibatch
        return sum(s.weight * len(s.completion_ids) for s in counted)

    @staticmethod
    def _add_mismatch(sums: _Sums, trainer: torch.Tensor, sampler: torch.Tensor) -> None:
        gap = trainer.detach().double() - sampler.double()  # k3 ~ gap**2 / 2: float32 would round it below 0
        sums.add("mismatch", gap.abs())
        sums.add("mismatch_kl", torch.exp(gap) - gap - 1.0)  # k3 estimate of KL(sampler || trainer)

    def update(self, samples: Sequence[Sample]) -> UpdateStats:
        """Run ``epochs x minibatches`` optimizer steps on ``samples`` (one batch of groups)."""
        cfg = self.config
        samples = [s for s in samples if len(s.completion_ids) > 0]
        total_tokens = sum(len(s.completion_ids) for s in samples)
        use_kl = self.reference is not None
        positions = [i for i, s in enumerate(samples) if use_kl or s.advantage != 0.0]
        active_tokens = sum(len(samples[i].completion_ids) for i in positions)
        if not positions:
            return UpdateStats(False, 0, total_tokens, 0)
        device = next(self.model.parameters()).device

        def tensor(values: Sequence[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float64, device=device)

        with_sampler = all(samples[i].sampler_logprobs is not None for i in positions)
        sampler = {i: tensor(samples[i].sampler_logprobs) for i in positions} if with_sampler else {}
        # Old log-probs are needed only when the policy moves between forward passes on the same data.
        needs_old = cfg.epochs > 1 or cfg.minibatches > 1
        old_is_sampler = needs_old and with_sampler and cfg.old_logprobs == "sampler"
        old: dict[int, torch.Tensor] = {}
        sums = _Sums()
        if old_is_sampler:
            old = sampler
        elif needs_old:
            pieces = self._frozen_logprobs(self.model, [samples[i] for i in positions])
            old = dict(zip(positions, pieces, strict=True))
            if with_sampler:  # the trainer's log-probs of the generating policy, for every token
                self._add_mismatch(sums, torch.cat(pieces), torch.cat([sampler[i] for i in positions]))
        # The reference policy never changes: its log-probs once per update, not per pass.
        reference: dict[int, torch.Tensor] = {}
        if use_kl:
            pieces = self._frozen_logprobs(self.reference, [samples[i] for i in positions])
            reference = dict(zip(positions, pieces, strict=True))
        truncate = with_sampler and cfg.tis_cap > 0 and not old_is_sampler
        # Recomputed old log-probs measured the mismatch above; otherwise the first forward pass does.
        measure_in_loop = with_sampler and not (needs_old and not old_is_sampler)

        self.model.train()
        minibatch_size = math.ceil(len(samples) / cfg.minibatches)
        grad_norms: list[float] = []
        steps = 0
        for epoch in range(cfg.epochs):
            for minibatch in _chunks(range(len(samples)), minibatch_size):
                trainable = [i for i in minibatch if use_kl or samples[i].advantage != 0.0]
                if not trainable:
                    continue
                normalizer = self._normalizer(
                    [samples[i] for i in minibatch], [samples[i] for i in trainable]
                )
                self.optimizer.zero_grad(set_to_none=True)
                for micro_positions in _chunks(trainable, cfg.micro_batch_size):
                    micro = [samples[i] for i in micro_positions]
                    logprobs, entropy = self._logprobs(self.model, micro, entropy=epoch == 0)
                    current = logprobs.detach()
                    old_t = (
                        torch.cat([old[i] for i in micro_positions]).to(logprobs) if needs_old else current
                    )
                    behaviour = (
                        torch.cat([sampler[i] for i in micro_positions]).to(logprobs) if sampler else None
                    )
                    weights = None
                    if truncate:
                        ratio = torch.exp(old_t - behaviour)
                        weights = ratio.clamp(max=cfg.tis_cap)
                        sums.add("tis_weight", weights)
                        sums.add("tis_capped", (ratio > cfg.tis_cap).to(ratio))
                    if measure_in_loop and steps == 0:  # still the policy that generated the batch
                        self._add_mismatch(sums, current, behaviour)
                    if entropy is not None:
                        sums.add("entropy", entropy)
                    advantages = torch.cat(
                        [
                            torch.full((len(s.completion_ids),), s.advantage, dtype=logprobs.dtype)
                            for s in micro
                        ]
                    ).to(logprobs.device)
                    token_weights = None
                    per_sequence = cfg.loss_norm == "sequence"
                    if per_sequence or any(s.weight != 1.0 for s in micro):
                        token_weights = torch.cat(
                            [
                                torch.full(
                                    (len(s.completion_ids),),
                                    s.weight / len(s.completion_ids) if per_sequence else s.weight,
                                    dtype=logprobs.dtype,
                                )
                                for s in micro
                            ]
                        ).to(logprobs.device)
                    ref_t = (
                        torch.cat([reference[i] for i in micro_positions]).to(logprobs) if use_kl else None
                    )
                    token_loss, diag = per_token_loss(
                        logprobs,
                        old_t,
                        advantages,
                        clip_eps_low=cfg.clip_eps_low,
                        clip_eps_high=cfg.clip_eps_high,
                        ref_logprobs=ref_t,
                        kl_coef=cfg.kl_coef,
                        is_weights=weights,
                    )
                    if token_weights is not None:
                        token_loss = token_loss * token_weights
                    (token_loss.sum() / normalizer).backward()
                    sums.add("clipped", diag["clipped"])
                    if use_kl:
                        sums.add("kl", diag["kl"])
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                grad_norms.append(float(norm))
                self.optimizer.step()
                if self.scheduler is not None:
                    self.scheduler.step()
                steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return UpdateStats(
            updated=steps > 0,
            optimizer_steps=steps,
            tokens=total_tokens,
            active_tokens=active_tokens,
            clip_frac=sums.mean("clipped"),
            kl=sums.mean("kl"),
            grad_norm=sum(grad_norms) / len(grad_norms) if grad_norms else None,
            entropy=sums.mean("entropy"),
            mismatch_mean=sums.mean("mismatch"),
            mismatch_max=sums.max("mismatch"),
            mismatch_kl=sums.mean("mismatch_kl"),
            tis_weight_mean=sums.mean("tis_weight"),
            tis_capped_frac=sums.mean("tis_capped"),
        )


def build_samples(
    prompt_ids: Sequence[Sequence[int]],
    completions: Sequence[Sequence[Sequence[int]]],
    rewards: Sequence[Sequence[float]],
    *,
    sampler_logprobs: Sequence[Sequence[Sequence[float] | None]] | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-4,
    group_weight: str = "prompt",
) -> list[Sample]:
    """Turn groups (one prompt, its n completions and n rewards; n may differ from group to group)
    into ``Sample``s with advantages normalized over each group's own rewards.

    ``sampler_logprobs``, when given, has the shape of ``completions``: the rollout engine's log-prob
    of every completion token (None for a completion without them). ``group_weight`` (``"prompt"`` or
    ``"rollout"``) sets each sample's weight from its group's size: see "Groups of different sizes" in
    the module's docstring. Every weight is 1 when all groups have the same size.
    """
    if group_weight not in ("prompt", "rollout"):
        raise ValueError(f"group_weight must be 'prompt' or 'rollout' (got {group_weight!r})")
    if sampler_logprobs is None:
        sampler_logprobs = [[None] * len(group) for group in completions]
    sizes = [len(group) for group in completions]
    mean_size = sum(sizes) / len(sizes) if sizes else 0.0
    samples: list[Sample] = []
    for prompt, group_completions, group_rewards, group_logprobs in zip(
        prompt_ids, completions, rewards, sampler_logprobs, strict=True
    ):
        if len(group_completions) != len(group_rewards) or len(group_completions) != len(group_logprobs):
            raise ValueError("each group needs one reward per completion (and one log-prob list when given)")
        if not group_completions:
            raise ValueError("every group needs at least one completion")
        advantages = group_advantages(
            torch.tensor([list(group_rewards)], dtype=torch.float64), scale_by_std=scale_by_std, eps=eps
        )[0]
        size = len(group_completions)
        weight = 1.0 if group_weight == "rollout" or size == mean_size else mean_size / size
        for completion, advantage, logprobs in zip(
            group_completions, advantages.tolist(), group_logprobs, strict=True
        ):
            samples.append(
                Sample(
                    tuple(prompt),
                    tuple(completion),
                    float(advantage),
                    None if logprobs is None else tuple(float(x) for x in logprobs),
                    weight,
                )
            )
    return samples
