"""The transformers rollout engine on a tiny random model: per-prompt counts in one generate call, and
the same completions as an even count when every prompt asks for the same number."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.utils import tiny_llama_config  # noqa: E402
from trainer_client.rollout import HFRollout, per_prompt_counts  # noqa: E402


class _Tokenizer:
    def decode(self, tokens, skip_special_tokens=True) -> str:
        return " ".join(map(str, tokens))


def _engine() -> HFRollout:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **tiny_llama_config(40, num_hidden_layers=1, max_position_embeddings=64)
    )
    model = transformers.LlamaForCausalLM(config).eval()
    return HFRollout(model, pad_token_id=0, eos_token_id=1, tokenizer=_Tokenizer())


PROMPTS = [(5, 6, 7), (8, 9), (10, 11, 12, 13)]


def test_each_prompt_gets_its_own_count_in_one_generate_call() -> None:
    engine = _engine()
    calls = []
    real = engine.model.generate

    def counted(**kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return real(**kwargs)

    engine.model.generate = counted
    outputs = engine.generate(PROMPTS, n=[1, 3, 2], max_new_tokens=5, temperature=1.0)
    assert calls == [6]  # one call, one row per completion
    assert [len(out.completions) for out in outputs] == [1, 3, 2]
    assert [out.prompt_token_ids for out in outputs] == PROMPTS
    for out in outputs:
        for completion in out.completions:
            assert 1 <= len(completion.token_ids) <= 5 and completion.logprobs is None


def test_an_even_list_is_the_same_as_an_int() -> None:
    torch.manual_seed(3)
    by_int = _engine().generate(PROMPTS, n=2, max_new_tokens=4, temperature=1.0)
    torch.manual_seed(3)
    by_list = _engine().generate(PROMPTS, n=[2, 2, 2], max_new_tokens=4, temperature=1.0)
    assert by_int == by_list


def test_counts_are_checked() -> None:
    assert per_prompt_counts(3, 2) == [3, 3] and per_prompt_counts((1, 4), 2) == [1, 4]
    with pytest.raises(ValueError, match="2 counts for 3 prompts"):
        _engine().generate(PROMPTS, n=[1, 2], max_new_tokens=4, temperature=1.0)
    with pytest.raises(ValueError, match="must be >= 1"):
        _engine().generate(PROMPTS, n=[1, 0, 2], max_new_tokens=4, temperature=1.0)
    with pytest.raises(ValueError, match="greedy"):
        _engine().generate(PROMPTS, n=[1, 2, 1], max_new_tokens=4, temperature=0.0)
