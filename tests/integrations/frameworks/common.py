"""Pieces every framework driver shares: a tiny local model folder, toy arithmetic prompts, a fake LLM
policy whose answers are recorded, and the JSON report the pytest side checks.

Drivers run inside a framework's venv (tests/integrations/frameworks/venvs.py) with the repository root on
PYTHONPATH; this module needs only the standard library, torch and transformers/tokenizers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from examples import tiny_model

SYMBOLS = tiny_model.SYMBOLS
CHAT_TEMPLATE = tiny_model.CHAT_TEMPLATE


def question(prompt_id: int) -> str:
    return f"what is {prompt_id} + 1?"


def answer_of(prompt_id: int) -> int:
    return prompt_id + 1


def prompt_id_of(text: str) -> int:
    """The prompt id a (decoded) prompt asks about: the number in ``what is N + 1?``."""
    start = text.rindex("what is ") + len("what is ")
    return int(text[start:].split(" ", 1)[0])


def solves(prompt_id: int, sample: int) -> bool:
    """Whether the fake policy answers sample ``sample`` of prompt ``prompt_id`` correctly: a mix of
    always-solved, never-solved and partly solved prompts, the same in every run."""
    kind = prompt_id % 3
    if kind == 0:
        return True
    if kind == 1:
        return False
    return sample % 2 == 0


def tokenizer() -> Any:
    return tiny_model.tokenizer()


def model_dir(root: Path) -> Path:
    """A folder holding a tiny Llama config and the tokenizer (examples/tiny_model.py, without weights: the
    frameworks' model workers are stand-ins), as a model path for the frameworks."""
    return tiny_model.write(root / "tiny-model", weights=False)


class Policy:
    """The fake generation: answers each sample from `solves` and records what reward it should earn.

    ``record`` holds ``[prompt_id, expected_reward]`` per generated sample, in generation order.
    """

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.counts: dict[int, int] = {}
        self.record: list[list[float]] = []

    def answer(self, prompt_id: int) -> str:
        sample = self.counts.get(prompt_id, 0)
        self.counts[prompt_id] = sample + 1
        right = solves(prompt_id, sample)
        self.record.append([prompt_id, 1.0 if right else 0.0])
        value = answer_of(prompt_id) if right else answer_of(prompt_id) + 7
        return f"it is {value}. #### {value}"

    def respond_ids(self, prompt_ids: list[int]) -> list[int]:
        text = self.tok.decode(prompt_ids, skip_special_tokens=False)
        return [*self.tok.encode(self.answer(prompt_id_of(text)), add_special_tokens=False), 1]


def emit(report: dict[str, Any]) -> None:
    """The driver's result, as the last line of stdout, with where the client package was imported from
    (the venv's install, not the repository)."""
    client = sys.modules.get("rlvr_selector_client")
    report["client_module"] = getattr(client, "__file__", None)
    sys.stdout.flush()
    print("DRIVER-REPORT " + json.dumps(report), flush=True)
