"""GRPO numerics against slow, obviously-correct loop versions, and the learner on a tiny model.

The tiny model is a randomly initialised 2-layer Llama built from a config (nothing downloaded), in
float64 so that comparisons can be tight. The learner's update is checked through the gradient it
produces (captured by tensor hooks on the parameters during its own backward), compared with the
gradient of the loss written out by hand: unlike the surrogate's value, which with ratio 1 is
``-sum(A * length) / tokens`` whatever the model, the gradient depends on the model.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from tests.utils import tiny_llama_config
from trainer_client.grpo import (
    GRPOConfig,
    GRPOLearner,
    Sample,
    UnsupportedModel,
    build_samples,
    check_output_head,
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
        **tiny_llama_config(40, num_hidden_layers=2, num_key_value_heads=1, max_position_embeddings=64),
        tie_word_embeddings=True,
    )
    return transformers.LlamaForCausalLM(config).double().eval()


def captured_gradients(learner: GRPOLearner, samples: list[Sample]) -> tuple[list[torch.Tensor], object]:
    """The gradient the learner's own backward passes produce in ``update`` (summed over its
    micro-batches), captured with tensor hooks; the gradient clip is made inactive."""
    grads = [torch.zeros_like(p) for p in learner.model.parameters()]
    handles = []
    for index, parameter in enumerate(learner.model.parameters()):

        def hook(grad, index=index):
            grads[index] += grad.detach()

        handles.append(parameter.register_hook(hook))
    try:
        stats = learner.update(samples)
    finally:
        for handle in handles:
            handle.remove()
    return grads, stats


def hand_gradients(model, samples: list[Sample], weights: list[float] | None = None) -> list[torch.Tensor]:
    """Gradient of ``-sum_t w_t * A * logp_t / tokens`` (the on-policy GRPO loss, optionally
    importance-weighted per token), from ``completion_logprobs`` one sequence at a time."""
    model.zero_grad(set_to_none=True)
    tokens = sum(len(s.completion_ids) for s in samples)
    position = 0
    total = 0.0
    for s in samples:
        logprobs = completion_logprobs(model, [s.prompt_ids], [s.completion_ids])
        w = torch.ones_like(logprobs)
        if weights is not None:
            w = torch.tensor(weights[position : position + len(s.completion_ids)], dtype=logprobs.dtype)
        position += len(s.completion_ids)
        total = total - (w * s.advantage * logprobs).sum() / tokens
    total.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


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


def test_update_gradient_is_the_token_mean_policy_gradient() -> None:
    samples = random_samples(random.Random(3))
    learner = GRPOLearner(tiny_model(), GRPOConfig(lr=1e-3, micro_batch_size=2, max_grad_norm=1e9))
    want = flat(hand_gradients(tiny_model(), samples))
    got, stats = captured_gradients(learner, samples)
    assert stats.updated and stats.optimizer_steps == 1
    assert stats.tokens == sum(len(s.completion_ids) for s in samples)
    assert torch.allclose(flat(got), want, rtol=1e-5, atol=1e-9), float((flat(got) - want).abs().max())
    assert stats.grad_norm == pytest.approx(float(want.norm()), rel=1e-6)
    # the gradient is the model's: another model gives another one
    assert not torch.allclose(flat(hand_gradients(tiny_model(seed=1), samples)), want, rtol=0.1)


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
    assert not stats.updated and stats.optimizer_steps == 0 and stats.grad_norm is None
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model), strict=True))


def test_warmup_raises_the_rate_per_optimizer_step() -> None:
    """The rate climbs lr/N, 2 lr/N, ..., lr over the first N optimizer steps and stays there; a batch
    without signal takes no step and does not advance it."""
    signal = build_samples([(1, 2)], [[(3, 4), (5,)]], [[1.0, 0.0]])
    tied = build_samples([(1, 2)], [[(7, 8), (9, 10)]], [[0.0, 0.0]])
    learner = GRPOLearner(tiny_model(), GRPOConfig(lr=0.3, warmup_steps=3))
    rates = [learner.optimizer.param_groups[0]["lr"]]
    for batch in (signal, tied, signal, signal, signal):
        learner.update(batch)
        rates.append(learner.optimizer.param_groups[0]["lr"])
    assert rates == pytest.approx([0.1, 0.2, 0.2, 0.3, 0.3, 0.3])
    plain = GRPOLearner(tiny_model(), GRPOConfig(lr=0.3))
    plain.update(signal)
    assert plain.scheduler is None and plain.optimizer.param_groups[0]["lr"] == 0.3


def test_zero_advantage_tokens_count_in_the_denominator() -> None:
    """A batch diluted with tied groups takes a proportionally smaller step (token-level mean)."""
    informative = build_samples([(1, 2)], [[(3, 4), (5,)]], [[1.0, 0.0]])  # 3 tokens
    tied = build_samples([(1, 2)], [[(7, 8), (9, 10)]], [[0.0, 0.0]])  # 4 tokens, no signal
    gradients = [
        flat(captured_gradients(GRPOLearner(tiny_model(), GRPOConfig(lr=1e-3, max_grad_norm=1e9)), b)[0])
        for b in (informative, informative + tied)
    ]
    assert float(gradients[0].abs().max()) > 0
    assert torch.allclose(gradients[1], gradients[0] * 3 / 7, rtol=1e-5, atol=1e-9)


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
    with pytest.raises(ValueError, match="--warmup-steps"):
        GRPOConfig(warmup_steps=-1)


def test_bf16_autocast_gradient_stays_close_to_fp32() -> None:
    """bf16 autocast changes rounding, not the math: the same gradient direction as float32 (an
    unrelated model's gradient is nowhere near), and the weights stay float32."""
    samples = random_samples(random.Random(7))
    config = GRPOConfig(lr=1e-3, max_grad_norm=1e9)
    fp32 = flat(captured_gradients(GRPOLearner(tiny_model().float(), config), samples)[0])
    model = tiny_model().float()
    bf16, stats = captured_gradients(
        GRPOLearner(model, dataclasses.replace(config, precision="bf16")), samples
    )
    other = flat(captured_gradients(GRPOLearner(tiny_model(seed=5).float(), config), samples)[0])
    cosine = torch.nn.functional.cosine_similarity
    assert stats.updated
    assert float(cosine(flat(bf16), fp32, dim=0)) > 0.99
    assert float(flat(bf16).norm() / fp32.norm()) == pytest.approx(1.0, abs=0.05)
    assert float(cosine(other, fp32, dim=0)) < 0.9  # the comparison can fail
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_output_head_runs_in_float32_outside_autocast() -> None:
    """Under bf16 autocast only the transformer body is rounded: the head and the softmax are float32,
    so the log-probs equal a float32 head applied to the autocast body's hidden states."""
    model = tiny_model().float()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20)  # logits of a few units, as in a real model
    prompts, completions = [[3, 4, 5, 6]], [[7, 8, 9, 10, 11, 12]]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = completion_logprobs(model, prompts, completions)
        hidden = model.base_model(input_ids=torch.tensor([prompts[0] + completions[0]])).last_hidden_state
    assert got.dtype == torch.float32
    logits = hidden[0, 3:-1].float() @ model.get_output_embeddings().weight.detach().float().T
    want = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completions[0])[:, None])[:, 0]
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    rounded = torch.log_softmax(logits.bfloat16().float(), dim=-1).gather(
        1, torch.tensor(completions[0])[:, None]
    )
    assert float((rounded[:, 0] - want).abs().max()) > 1e-3  # a bf16 head would be visibly off


def test_build_samples_rejects_mismatched_groups() -> None:
    with pytest.raises(ValueError, match="one reward per completion"):
        build_samples([(1,)], [[(2,), (3,)]], [[1.0]])
    with pytest.raises(ValueError, match="sampler_logprobs has 1 entries for 2"):
        build_samples([(1,)], [[(2, 3), (4,)]], [[1.0, 0.0]], sampler_logprobs=[[(-0.1,), (-0.2,)]])


# --------------------------------------------------------------------------------------------------
# The rollout engine's log-probs: mismatch, truncated importance sampling, old log-probs
# --------------------------------------------------------------------------------------------------
def with_sampler_logprobs(samples: list[Sample], model, offsets: torch.Tensor) -> list[Sample]:
    """``samples`` whose engine log-probs are the model's own minus ``offsets`` (flat, per token): the
    trainer/sampler ratio of every token is then exactly ``exp(offset)``."""
    out, position = [], 0
    for s in samples:
        with torch.no_grad():
            own = completion_logprobs(model, [s.prompt_ids], [s.completion_ids])
        shift = offsets[position : position + len(own)]
        position += len(own)
        out.append(dataclasses.replace(s, sampler_logprobs=tuple((own - shift).tolist())))
    return out


def test_update_measures_the_trainer_sampler_mismatch() -> None:
    samples = random_samples(random.Random(8))
    active = [s for s in samples if s.advantage != 0.0]
    tokens = sum(len(s.completion_ids) for s in active)
    offsets = torch.randn(tokens, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.3
    offsets = torch.cat([offsets, torch.zeros(sum(len(s.completion_ids) for s in samples) - tokens)])
    ordered = active + [s for s in samples if s.advantage == 0.0]
    stats = GRPOLearner(tiny_model(), GRPOConfig(lr=1e-3)).update(
        with_sampler_logprobs(ordered, tiny_model(), offsets)
    )
    gap = offsets[:tokens]  # tied groups are not run through the model
    assert stats.mismatch_mean == pytest.approx(float(gap.abs().mean()), abs=1e-6)
    assert stats.mismatch_max == pytest.approx(float(gap.abs().max()), abs=1e-6)
    assert stats.mismatch_kl == pytest.approx(float((gap.exp() - gap - 1).mean()), abs=1e-6)
    assert stats.entropy is not None and 0 < stats.entropy < math.log(40)
    none = GRPOLearner(tiny_model(), GRPOConfig(lr=1e-3)).update(samples)  # no engine log-probs
    assert none.mismatch_mean is None and none.tis_weight_mean is None


def test_truncated_importance_weights_scale_each_token_gradient() -> None:
    """The gradient is that of ``-sum(min(pi_trainer / pi_sampler, cap) * A * logp) / tokens``."""
    samples = [s for s in random_samples(random.Random(9)) if s.advantage != 0.0]
    tokens = sum(len(s.completion_ids) for s in samples)
    offsets = torch.linspace(-1.5, 1.5, tokens, dtype=torch.float64)  # ratios e^-1.5 .. e^1.5
    engine = with_sampler_logprobs(samples, tiny_model(), offsets)
    cap = 2.0
    weights = offsets.exp().clamp(max=cap).tolist()
    want = flat(hand_gradients(tiny_model(), samples, weights))
    config = GRPOConfig(lr=1e-3, max_grad_norm=1e9, tis_cap=cap)
    got, stats = captured_gradients(GRPOLearner(tiny_model(), config), engine)
    assert torch.allclose(flat(got), want, rtol=1e-4, atol=1e-9)
    assert stats.tis_capped_frac == pytest.approx(float((offsets.exp() > cap).double().mean()), abs=1e-9)
    assert stats.tis_weight_mean == pytest.approx(sum(weights) / tokens, rel=1e-6)
    # tis_cap = 0 switches the correction off: the plain policy gradient
    off = flat(
        captured_gradients(GRPOLearner(tiny_model(), dataclasses.replace(config, tis_cap=0)), engine)[0]
    )
    assert torch.allclose(off, flat(hand_gradients(tiny_model(), samples)), rtol=1e-4, atol=1e-9)
    assert not torch.allclose(off, want, rtol=1e-2)


def _count_calls(module) -> list[int]:
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_reference_logprobs_are_computed_once_per_update() -> None:
    samples = random_samples(random.Random(10))
    counts = []
    for epochs, minibatches in ((1, 1), (3, 2)):
        config = GRPOConfig(lr=1e-3, kl_coef=0.1, epochs=epochs, minibatches=minibatches, micro_batch_size=64)
        learner = GRPOLearner(tiny_model(), config)
        calls = _count_calls(learner.reference.base_model)
        assert learner.update(samples).optimizer_steps == epochs * minibatches
        counts.append(calls[0])
    assert counts[0] > 0 and counts[1] == counts[0]


def test_old_logprobs_come_from_the_engine_without_an_extra_pass() -> None:
    samples = [s for s in random_samples(random.Random(11)) if s.advantage != 0.0]
    engine = with_sampler_logprobs(
        samples, tiny_model(), torch.zeros(sum(len(s.completion_ids) for s in samples))
    )
    passes = {}
    for source in ("sampler", "recompute"):
        for epochs in (1, 2):
            config = GRPOConfig(
                lr=1e-3, epochs=epochs, micro_batch_size=64, old_logprobs=source, share_prompt=False
            )
            learner = GRPOLearner(tiny_model(), config)
            calls = _count_calls(learner.model.base_model)
            learner.update(engine)
            passes[source, epochs] = calls[0]
    assert passes["sampler", 2] == 2 * passes["sampler", 1]  # one forward per epoch, nothing else
    assert passes["recompute", 2] == 3 * passes["recompute", 1]  # plus one to recompute old log-probs


def test_engine_old_logprobs_enter_the_ratio_and_its_clip() -> None:
    """With the engine's log-probs as the old policy, the first pass's ratio is trainer / sampler: an
    engine that put 0.5 nats more on every token makes every ratio exp(-0.5), clipped where A < 0."""
    samples = [s for s in random_samples(random.Random(12)) if s.advantage != 0.0]
    tokens = sum(len(s.completion_ids) for s in samples)
    engine = with_sampler_logprobs(samples, tiny_model(), torch.full((tokens,), -0.5, dtype=torch.float64))
    negative = sum(len(s.completion_ids) for s in samples if s.advantage < 0)
    config = GRPOConfig(lr=1e-12, epochs=2, old_logprobs="sampler")  # the policy barely moves
    stats = GRPOLearner(tiny_model(), config).update(engine)
    assert stats.clip_frac == pytest.approx(negative / tokens, abs=1e-9)
    assert stats.tis_weight_mean is None  # the ratio carries the correction; no separate weight
    assert stats.mismatch_mean == pytest.approx(0.5, abs=1e-6)


# --------------------------------------------------------------------------------------------------
# Output heads: the model's own logit transform, or a refusal
# --------------------------------------------------------------------------------------------------
def _tiny(config_name: str, model_name: str, **extra):
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True, **extra,
    )  # fmt: skip
    model = getattr(transformers, model_name)(config).double().eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(30)  # logits of a few units, where transforms matter
    return model


@pytest.mark.parametrize(
    ("config_name", "model_name", "extra"),
    [
        ("Gemma2Config", "Gemma2ForCausalLM", {"final_logit_softcapping": 1.0, "head_dim": 8}),
        ("GraniteConfig", "GraniteForCausalLM", {"logits_scaling": 8.0}),
        ("CohereConfig", "CohereForCausalLM", {"logit_scale": 0.25}),
    ],
)
def test_logprobs_apply_the_models_own_logit_transform(config_name, model_name, extra) -> None:
    model = _tiny(config_name, model_name, **extra)
    prompt, completion = [3, 4, 5], [6, 7, 8, 9, 10]
    got = completion_logprobs(model, [prompt], [completion], temperature=0.7)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, 2:-1] / 0.7
        head_only = model.get_output_embeddings()(model.base_model(input_ids=ids).last_hidden_state)[0, 2:-1]
    targets = torch.tensor(completion)[:, None]
    want = torch.log_softmax(logits, dim=-1).gather(1, targets)[:, 0]
    plain = torch.log_softmax(head_only / 0.7, dim=-1).gather(1, targets)[:, 0]  # the transform must matter
    assert float((plain - want).abs().max()) > 1e-2
    assert torch.allclose(got, want, atol=1e-10, rtol=0)
    check_output_head(model)  # accepted


def test_unchecked_architectures_are_refused() -> None:
    bloom = transformers.BloomForCausalLM(
        transformers.BloomConfig(vocab_size=40, hidden_size=16, n_layer=1, n_head=2, eos_token_id=0)
    )
    with pytest.raises(UnsupportedModel, match="'bloom' is not supported"):
        GRPOLearner(bloom, GRPOConfig())

    class ScaledLlama(transformers.LlamaForCausalLM):  # a head transform the trainer does not know
        def forward(self, *args, **kwargs):
            output = super().forward(*args, **kwargs)
            output.logits = output.logits * 3.0
            return output

    torch.manual_seed(0)
    scaled = ScaledLlama(tiny_model().config).double()
    with pytest.raises(UnsupportedModel, match="differ from the model's own forward"):
        GRPOLearner(scaled, GRPOConfig())
    GRPOLearner(tiny_model(), GRPOConfig())  # the plain architecture passes


def test_mismatch_kl_of_a_float32_trainer_is_not_rounded_below_zero() -> None:
    """k3 ~ gap**2 / 2 is ~1e-11 for gaps of 1e-5: in float32 it would come out negative."""
    samples = [s for s in random_samples(random.Random(13)) if s.advantage != 0.0]
    tokens = sum(len(s.completion_ids) for s in samples)
    offsets = torch.full((tokens,), 1e-5, dtype=torch.float64)
    stats = GRPOLearner(tiny_model().float(), GRPOConfig(lr=1e-3)).update(
        with_sampler_logprobs(samples, tiny_model().float(), offsets)
    )
    assert stats.mismatch_mean == pytest.approx(1e-5, rel=0.2)
    assert 0 < stats.mismatch_kl < 1e-9


# --------------------------------------------------------------------------------------------------
# Groups of different sizes (a rollout budget gives each prompt its own n)
# --------------------------------------------------------------------------------------------------
def mixed_size_groups(rng: random.Random, sizes: list[int]):
    """Prompts, completions and rewards of groups with the given sizes (the first two of size >= 2 mixed)."""
    prompts = [tuple(rng.randrange(1, 40) for _ in range(rng.randint(2, 6))) for _ in sizes]
    completions = [
        [tuple(rng.randrange(1, 40) for _ in range(rng.randint(1, 7))) for _ in range(n)] for n in sizes
    ]
    rewards = [[float(rng.random() < 0.5) for _ in range(n)] for n in sizes]
    for group in [g for g in rewards if len(g) >= 2][:2]:
        group[0], group[1] = 1.0, 0.0
    return prompts, completions, rewards


def hand_weighted_gradients(model, groups, scale_by_std: bool, group_weight: str) -> list[torch.Tensor]:
    """The loss written out slowly from the docstring: per group, advantages from its own rewards
    (``loop_advantages``); each token weighted by nbar / n_g ("prompt") or 1 ("rollout"); the sum of
    ``-w * A * logp`` over every token divided by the sum of the tokens' weights."""
    prompts, completions, rewards = groups
    sizes = [len(g) for g in completions]
    nbar = sum(sizes) / len(sizes)
    advantages = loop_advantages(rewards, scale_by_std, 1e-4)
    model.zero_grad(set_to_none=True)
    terms, denominator = [], 0.0
    for prompt, group, advs in zip(prompts, completions, advantages, strict=True):
        w = nbar / len(group) if group_weight == "prompt" else 1.0
        for completion, a in zip(group, advs, strict=True):
            logprobs = completion_logprobs(model, [prompt], [completion])
            for t in range(len(completion)):
                terms.append(-w * a * logprobs[t])
                denominator += w
    (sum(terms) / denominator).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("scale_by_std", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_mixed_size_groups_are_normalized_by_their_own_rewards(seed: int, scale_by_std: bool) -> None:
    rng = random.Random(seed)
    sizes = [1, 2, 3, 5, 8, rng.randint(2, 16)]
    rng.shuffle(sizes)
    prompts, completions, rewards = mixed_size_groups(rng, sizes)
    rewards = [[r if rng.random() < 0.7 else rng.random() for r in g] for g in rewards]  # some non-binary
    samples = build_samples(prompts, completions, rewards, scale_by_std=scale_by_std)
    want = loop_advantages(rewards, scale_by_std, 1e-4)
    got, start = [], 0
    for n in sizes:
        got.append([s.advantage for s in samples[start : start + n]])
        start += n
    for g, w, n in zip(got, want, sizes, strict=True):
        assert g == pytest.approx(w, rel=1e-12, abs=1e-12)
        if n == 1:
            assert g == [0.0]  # a group of one has no spread: no advantage, never NaN
    nbar = sum(sizes) / len(sizes)
    weights = [s.weight for s in samples]
    assert weights == pytest.approx([nbar / n for n in sizes for _ in range(n)], rel=1e-15)
    assert all(s.weight == 1.0 for s in build_samples(prompts, completions, rewards, group_weight="rollout"))
    # every group carries the same total weight nbar under "prompt"
    start = 0
    for n in sizes:
        assert sum(weights[start : start + n]) == pytest.approx(nbar)
        start += n


def test_equal_sizes_keep_unit_weights() -> None:
    rng = random.Random(0)
    prompts, completions, rewards = mixed_size_groups(rng, [4, 4, 4])
    assert all(s.weight == 1.0 for s in build_samples(prompts, completions, rewards))


@pytest.mark.parametrize("group_weight", ["prompt", "rollout"])
@pytest.mark.parametrize(("micro", "share_prompt"), [(64, False), (2, True)])
def test_update_gradient_with_mixed_size_groups_matches_the_slow_loss(
    group_weight, micro, share_prompt
) -> None:
    groups = mixed_size_groups(random.Random(11), [2, 5, 1, 3])
    samples = build_samples(*groups, group_weight=group_weight)
    config = GRPOConfig(lr=1e-3, micro_batch_size=micro, share_prompt=share_prompt, max_grad_norm=1e9)
    got, stats = captured_gradients(GRPOLearner(tiny_model(), config), samples)
    want = flat(hand_weighted_gradients(tiny_model(), groups, True, group_weight))
    assert stats.updated
    assert torch.allclose(flat(got), want, rtol=1e-5, atol=1e-9), float((flat(got) - want).abs().max())
    # the two weightings are different losses on mixed sizes (the test can tell them apart)
    other = "rollout" if group_weight == "prompt" else "prompt"
    assert not torch.allclose(
        flat(hand_weighted_gradients(tiny_model(), groups, True, other)), want, rtol=1e-3
    )


def test_a_group_weighs_as_one_prompt_whatever_its_size() -> None:
    """Under "prompt" weights, a group of 2 repeated into a group of 4 (same completions, same centred
    advantages) moves the policy exactly as the group of 2 did; under "rollout" it counts twice."""
    rng = random.Random(5)
    prompts, completions, rewards = mixed_size_groups(rng, [2, 2])
    doubled = (prompts, [completions[0] * 2, completions[1]], [rewards[0] * 2, rewards[1]])
    gradients = {}
    for name, groups in (("plain", (prompts, completions, rewards)), ("doubled", doubled)):
        for weight in ("prompt", "rollout"):
            samples = build_samples(*groups, scale_by_std=False, group_weight=weight)
            config = GRPOConfig(lr=1e-3, max_grad_norm=1e9, scale_by_std=False)
            gradients[name, weight] = flat(captured_gradients(GRPOLearner(tiny_model(), config), samples)[0])
    assert torch.allclose(gradients["doubled", "prompt"], gradients["plain", "prompt"], rtol=1e-9, atol=1e-12)
    assert not torch.allclose(gradients["doubled", "rollout"], gradients["plain", "rollout"], rtol=1e-3)


def test_groups_of_one_never_update() -> None:
    samples = build_samples([(1, 2), (3, 4)], [[(5, 6)], [(7,)]], [[1.0], [0.0]])
    assert [s.advantage for s in samples] == [0.0, 0.0]
    stats = GRPOLearner(tiny_model(), GRPOConfig(lr=1e-1)).update(samples)
    assert not stats.updated and stats.optimizer_steps == 0


def hand_normalized_gradients(model, groups, loss_norm: str, group_weight: str) -> list[torch.Tensor]:
    """The loss of each ``loss_norm`` written out slowly from the docstring, one token at a time:
    ``-sum w * A * logp`` over every token, divided by the weighted count of every token ("token"), of
    the tokens of samples with a non-zero advantage ("active_token"), or, with each token weighted
    by 1 / its completion's length, by the weighted count of completions ("sequence")."""
    prompts, completions, rewards = groups
    sizes = [len(g) for g in completions]
    nbar = sum(sizes) / len(sizes)
    advantages = loop_advantages(rewards, True, 1e-4)
    model.zero_grad(set_to_none=True)
    terms, denominator = [], 0.0
    for prompt, group, advs in zip(prompts, completions, advantages, strict=True):
        w = nbar / len(group) if group_weight == "prompt" and len(set(sizes)) > 1 else 1.0
        for completion, a in zip(group, advs, strict=True):
            logprobs = completion_logprobs(model, [prompt], [completion])
            per_token = 1.0 / len(completion) if loss_norm == "sequence" else 1.0
            for t in range(len(completion)):
                terms.append(-w * per_token * a * logprobs[t])
            if loss_norm == "sequence":
                denominator += w
            elif loss_norm == "token" or a != 0.0:
                denominator += w * len(completion)
    (sum(terms) / denominator).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("loss_norm", ["token", "active_token", "sequence"])
@pytest.mark.parametrize(
    ("sizes", "group_weight"), [([4, 4, 4], "prompt"), ([2, 5, 3], "prompt"), ([2, 5, 3], "rollout")]
)
def test_each_loss_normalization_is_its_slow_loss(loss_norm, sizes, group_weight) -> None:
    rng = random.Random(23)
    groups = mixed_size_groups(rng, sizes)
    groups[2][1] = [1.0] * sizes[1]  # a tied group: no gradient, counted by "token" and "sequence" only
    samples = build_samples(*groups, group_weight=group_weight)
    config = GRPOConfig(lr=1e-3, micro_batch_size=3, max_grad_norm=1e9, loss_norm=loss_norm)
    got, stats = captured_gradients(GRPOLearner(tiny_model(), config), samples)
    want = flat(hand_normalized_gradients(tiny_model(), groups, loss_norm, group_weight))
    assert stats.updated
    assert torch.allclose(flat(got), want, rtol=1e-5, atol=1e-8), float((flat(got) - want).abs().max())
    for other in {"token", "active_token", "sequence"} - {loss_norm}:  # the three are different losses
        assert not torch.allclose(
            flat(hand_normalized_gradients(tiny_model(), groups, other, group_weight)), want, rtol=1e-3
        )


def test_bad_loss_norms_are_refused() -> None:
    with pytest.raises(ValueError, match="--loss-norm must be one of token, active_token, sequence"):
        GRPOConfig(loss_norm="batch")


def test_bad_group_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="--group-weight must be one of prompt, rollout"):
        GRPOConfig(group_weight="token")
    with pytest.raises(ValueError, match="group_weight must be 'prompt' or 'rollout'"):
        build_samples([(1,)], [[(2,), (3,)]], [[1.0, 0.0]], group_weight="token")
    with pytest.raises(ValueError, match="at least one completion"):
        build_samples([(1,)], [[]], [[]])
    with pytest.raises(ValueError, match="weight must be a positive number"):
        Sample((1,), (2,), 0.5, weight=0.0)
