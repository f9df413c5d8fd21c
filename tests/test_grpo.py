"""GRPO numerics against slow, obviously-correct loop versions, and the learner on a tiny model.

The tiny model is a randomly initialised 2-layer Llama built from a config (nothing downloaded), in
float64 so that comparisons can be tight.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from trainer_client.grpo import (
    GRPOConfig,
    GRPOLearner,
    Sample,
    build_samples,
    completion_logprobs,
    group_advantages,
    per_token_loss,
    shared_prompt_logprobs,
)

transformers = pytest.importorskip("transformers")


# --------------------------------------------------------------------------------------------------
# Loop references, written straight from the formulas in trainer_client/grpo.py's docstring
# --------------------------------------------------------------------------------------------------
def loop_advantages(rewards: list[list[float]], scale_by_std: bool, eps: float) -> list[list[float]]:
    out = []
    for group in rewards:
        k = len(group)
        mean = sum(group) / k
        if max(group) == min(group):
            out.append([0.0] * k)
            continue
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (k - 1))
        out.append([(r - mean) / (std + eps) if scale_by_std else r - mean for r in group])
    return out


def loop_loss(logp, old, adv, lo, hi, ref=None, kl_coef=0.0) -> tuple[float, int]:
    """Token-mean loss and the number of clipped tokens, one token at a time."""
    total, clipped = 0.0, 0
    for i in range(len(logp)):
        ratio = math.exp(logp[i] - old[i])
        clipped_ratio = min(max(ratio, 1 - lo), 1 + hi)
        term = -min(ratio * adv[i], clipped_ratio * adv[i])
        if (ratio < 1 - lo and adv[i] < 0) or (ratio > 1 + hi and adv[i] > 0):
            clipped += 1
        if ref is not None:
            d = ref[i] - logp[i]
            term += kl_coef * (math.exp(d) - d - 1)
        total += term
    return total / len(logp), clipped


def tiny_model(seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return transformers.LlamaForCausalLM(config).double().eval()


def random_samples(rng: random.Random, groups: int = 3, k: int = 4) -> list[Sample]:
    prompts = [tuple(rng.randrange(1, 40) for _ in range(rng.randint(2, 6))) for _ in range(groups)]
    completions = [
        [tuple(rng.randrange(1, 40) for _ in range(rng.randint(1, 7))) for _ in range(k)] for _ in prompts
    ]
    rewards = [[float(rng.random() < 0.5) for _ in range(k)] for _ in prompts]
    rewards[0] = [1.0, 0.0] + [rng.random() for _ in range(k - 2)]  # at least one mixed group
    return build_samples(prompts, completions, rewards)


# --------------------------------------------------------------------------------------------------
# Advantages and loss
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale_by_std", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_group_advantages_match_loop(seed: int, scale_by_std: bool) -> None:
    rng = random.Random(seed)
    k = rng.choice([2, 3, 8])
    rewards = [[rng.choice([0.0, 0.1, 1.0]) for _ in range(k)] for _ in range(6)]
    rewards.append([0.1] * k)  # tied at a value whose float mean is inexact
    rewards.append([1.0] * k)
    got = group_advantages(torch.tensor(rewards, dtype=torch.float64), scale_by_std=scale_by_std, eps=1e-4)
    want = loop_advantages(rewards, scale_by_std, 1e-4)
    assert got.shape == (len(rewards), k)
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert torch.all(got[-2:] == 0)  # exactly zero: such groups are skipped by the learner


def test_group_advantages_edge_cases() -> None:
    assert torch.equal(group_advantages(torch.tensor([[1.0]])), torch.zeros(1, 1, dtype=torch.float64))
    adv = group_advantages(torch.tensor([[1.0, 0.0]]), eps=0.0)
    assert adv[0].tolist() == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)])
    with pytest.raises(ValueError, match="groups, K"):
        group_advantages(torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
@pytest.mark.parametrize("seed", range(4))
def test_per_token_loss_matches_loop(seed: int, kl_coef: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = 40
    logp = -torch.rand(n, generator=gen, dtype=torch.float64) * 3
    old = logp + (torch.rand(n, generator=gen, dtype=torch.float64) - 0.5)  # ratios in ~[0.6, 1.65]
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(n, generator=gen, dtype=torch.float64)
    loss, diag = per_token_loss(
        logp, old, adv, clip_eps_low=0.2, clip_eps_high=0.28, ref_logprobs=ref, kl_coef=kl_coef
    )
    want, clipped = loop_loss(
        logp.tolist(), old.tolist(), adv.tolist(), 0.2, 0.28, ref.tolist() if kl_coef else None, kl_coef
    )
    assert float(loss.mean()) == pytest.approx(want, rel=1e-12)
    assert int(diag["clipped"].sum()) == clipped
    assert clipped > 0  # the case is non-trivial


def test_clipped_tokens_get_no_gradient() -> None:
    logp = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([-1.0, 1.0, 0.0], dtype=torch.float64)  # ratios e, 1/e, 1
    adv = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    loss, diag = per_token_loss(logp, old, adv, clip_eps_low=0.2, clip_eps_high=0.2)
    loss.sum().backward()
    assert diag["clipped"].tolist() == [1.0, 1.0, 0.0]
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, -1.0])


# --------------------------------------------------------------------------------------------------
# Log-probs
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_logprobs_match_full_forward(temperature: float) -> None:
    model = tiny_model()
    rng = random.Random(1)
    prompts = [[rng.randrange(1, 40) for _ in range(rng.randint(1, 6))] for _ in range(5)]
    completions = [[rng.randrange(1, 40) for _ in range(rng.randint(1, 6))] for _ in range(5)]
    got = completion_logprobs(model, prompts, completions, temperature=temperature)
    want = []
    with torch.no_grad():
        for prompt, completion in zip(prompts, completions, strict=True):
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0] / temperature
            logprobs = torch.log_softmax(logits, dim=-1)
            for j, token in enumerate(completion):
                want.append(float(logprobs[len(prompt) + j - 1, token]))
    assert got.shape == (sum(len(c) for c in completions),)
    assert got.tolist() == pytest.approx(want, abs=1e-10)


def test_shared_prompt_logprobs_and_gradients_match_separate_sequences() -> None:
    rng = random.Random(2)
    prompt = [rng.randrange(1, 40) for _ in range(5)]
    completions = [[rng.randrange(1, 40) for _ in range(n)] for n in (3, 1, 6, 4)]
    weights = torch.randn(
        sum(len(c) for c in completions), generator=torch.Generator().manual_seed(0)
    ).double()
    results = []
    for shared in (True, False):
        model = tiny_model()
        if shared:
            logprobs = shared_prompt_logprobs(model, prompt, completions, temperature=0.8)
        else:
            logprobs = completion_logprobs(model, [prompt] * len(completions), completions, temperature=0.8)
        (logprobs * weights).sum().backward()
        results.append((logprobs.detach(), [p.grad.clone() for p in model.parameters()]))
    (shared_lp, shared_grads), (plain_lp, plain_grads) = results
    assert torch.allclose(shared_lp, plain_lp, atol=1e-10)
    # LlamaRMSNorm computes in float32 even in a float64 model, and the shared prompt's gradient is
    # summed in another order: ~1e-7 relative. Dropping the prompt's gradient would be off by O(1).
    for a, b in zip(shared_grads, plain_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert any(float(g.abs().sum()) > 0 for g in shared_grads)


# --------------------------------------------------------------------------------------------------
# The learner
# --------------------------------------------------------------------------------------------------
def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_update_loss_is_token_mean_over_the_whole_batch() -> None:
    samples = random_samples(random.Random(3))
    learner = GRPOLearner(tiny_model(), GRPOConfig(lr=1e-3, micro_batch_size=2))
    stats = learner.update(samples)
    tokens = sum(len(s.completion_ids) for s in samples)
    # ratio == 1 on the single on-policy step: loss = -sum(A over tokens) / tokens
    want = -sum(s.advantage * len(s.completion_ids) for s in samples) / tokens
    assert stats.updated and stats.optimizer_steps == 1
    assert stats.tokens == tokens
    assert stats.loss == pytest.approx(want, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize(
    ("micro", "share_prompt", "atol"), [(1, False, 1e-10), (3, False, 1e-10), (3, True, 1e-5)]
)
def test_micro_batching_and_prompt_sharing_do_not_change_the_update(micro, share_prompt, atol) -> None:
    """Same AdamW step whatever the micro-batching. Prompt sharing sums the prompt's gradient in
    another order through LlamaRMSNorm's float32 cast, so it matches to ~1e-7 relative, not 1e-16;
    AdamW's first step is about lr * sign(grad), hence the tolerance relative to lr = 1e-3."""
    samples = random_samples(random.Random(4), groups=4)
    results = []
    for micro_batch, share in ((64, False), (micro, share_prompt)):
        config = GRPOConfig(lr=1e-3, micro_batch_size=micro_batch, share_prompt=share)
        learner = GRPOLearner(tiny_model(), config)
        learner.update(samples)
        results.append(_params(learner.model))
    initial = _params(tiny_model())
    for a, b in zip(results[0], results[1], strict=True):
        assert torch.allclose(a, b, rtol=0, atol=atol)
    assert max(float((a - s).abs().max()) for a, s in zip(results[0], initial, strict=True)) > 5e-4


def test_update_moves_probability_toward_rewarded_completions() -> None:
    prompt = (5, 6, 7)
    good, bad = (11, 12, 13), (21, 22, 23)
    samples = build_samples([prompt], [[good, bad, good, bad]], [[1.0, 0.0, 1.0, 0.0]])
    model = tiny_model()
    before = completion_logprobs(model, [prompt, prompt], [good, bad]).detach()
    learner = GRPOLearner(model, GRPOConfig(lr=5e-3))
    for _ in range(3):
        assert learner.update(samples).updated
    after = completion_logprobs(model, [prompt, prompt], [good, bad]).detach()
    assert after[:3].sum() > before[:3].sum() + 0.1
    assert after[3:].sum() < before[3:].sum() - 0.1


def test_groups_without_reward_spread_do_not_update() -> None:
    samples = build_samples([(1, 2)], [[(3, 4), (5,), (6, 7, 8)]], [[1.0, 1.0, 1.0]])
    model = tiny_model()
    before = _params(model)
    stats = GRPOLearner(model, GRPOConfig(lr=1e-1)).update(samples)
    assert not stats.updated and stats.optimizer_steps == 0 and stats.loss == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model), strict=True))


def test_zero_advantage_tokens_count_in_the_denominator() -> None:
    """A batch diluted with tied groups takes a proportionally smaller step (token-level mean)."""
    informative = build_samples([(1, 2)], [[(3, 4), (5,)]], [[1.0, 0.0]])  # 3 tokens
    tied = build_samples([(1, 2)], [[(7, 8), (9, 10)]], [[0.0, 0.0]])  # 4 tokens, no signal
    losses = [
        GRPOLearner(tiny_model(), GRPOConfig(lr=1e-3)).update(b).loss
        for b in (informative, informative + tied)
    ]
    assert losses[0] != 0.0
    assert losses[1] == pytest.approx(losses[0] * 3 / 7, rel=1e-10)


def test_several_epochs_use_fixed_old_logprobs_and_clip() -> None:
    samples = random_samples(random.Random(5))
    learner = GRPOLearner(
        tiny_model(), GRPOConfig(lr=0.05, epochs=3, minibatches=2, clip_eps_low=0.05, clip_eps_high=0.05)
    )
    stats = learner.update(samples)
    assert stats.optimizer_steps == 6
    assert stats.clip_frac > 0  # later passes leave the trust region and get clipped


def test_kl_penalty_reference_is_the_initial_policy() -> None:
    samples = random_samples(random.Random(6))
    learner = GRPOLearner(tiny_model(), GRPOConfig(lr=0.05, kl_coef=0.1))
    first = learner.update(samples)
    second = learner.update(samples)
    assert first.kl == pytest.approx(0.0, abs=1e-12)  # policy == reference before any step
    assert second.kl > 0
    for p in learner.reference.parameters():
        assert not p.requires_grad


def test_config_validation_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--lr"):
        GRPOConfig(lr=0.0).validate()
    with pytest.raises(ValueError, match="--temperature"):
        GRPOConfig(temperature=0.0).validate()
    with pytest.raises(ValueError, match="--clip-eps"):
        GRPOConfig(clip_eps_low=1.5).validate()
    with pytest.raises(ValueError, match="--precision"):
        GRPOConfig(precision="fp8").validate()


def test_bf16_autocast_update_stays_close_to_fp32() -> None:
    """bf16 autocast changes rounding, not the math: same loss to bf16 precision, float32 weights."""
    samples = random_samples(random.Random(7))
    model = tiny_model().float()
    fp32 = GRPOLearner(tiny_model().float(), GRPOConfig(lr=1e-3)).update(samples)
    bf16 = GRPOLearner(model, GRPOConfig(lr=1e-3, precision="bf16")).update(samples)
    assert bf16.updated
    assert bf16.loss == pytest.approx(fp32.loss, abs=2e-2)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_build_samples_rejects_mismatched_groups() -> None:
    with pytest.raises(ValueError, match="one reward per completion"):
        build_samples([(1,)], [[(2,), (3,)]], [[1.0]])
