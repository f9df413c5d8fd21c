"""A tiny random Llama and a character-level tokenizer, written to a folder without downloading anything.

For trying an adapter end to end on a CPU in seconds (the examples' ``--model``); what it generates is
noise, so rewards stay near 0 while every step is selected, rolled out, rewarded and reported as in a
real run. For a model that learns, pass a Hugging Face model instead (e.g.
``HuggingFaceTB/SmolLM2-135M-Instruct``). The test suite's framework drivers use this same model.

Usage: python examples/tiny_model.py DIR  (needs transformers and tokenizers, which every trainer has)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

#: The vocabulary: three specials, then one token per character the examples' prompts and answers use.
SYMBOLS = ["<pad>", "<eos>", "<unk>", *"abcdefghijklmnopqrstuvwxyz0123456789 +-*/=?.:#<>|_\n"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tokenizer() -> Any:
    """A fast tokenizer with one token per character of `SYMBOLS` and a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({s: i for i, s in enumerate(SYMBOLS)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def write(path: Path, *, weights: bool = True) -> Path:
    """Writes the tokenizer and a one-layer Llama of width 16 with random weights (seed 0; without
    ``weights`` only its config, for trainers whose model workers are stand-ins) to ``path``; returns
    ``path``. Does nothing when it is there already."""
    from transformers import LlamaConfig

    path = Path(path)
    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    tokenizer().save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(SYMBOLS),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
    )
    if weights:
        import torch
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(path)
    else:
        config.save_pretrained(path)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.strip().splitlines()[-1])
    print(write(Path(sys.argv[1])))
