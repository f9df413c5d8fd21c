"""GRPO with TRL 1.16, each step's prompts chosen by the selector service (docs/integrations.md, "TRL").

A complete script: an arithmetic train set with the integer ``prompt_id`` column the service needs, two
reward functions of which the selector observes the verifiable one (``observe_reward="accuracy"``), and
`SelectorGRPOTrainer` in place of ``GRPOTrainer``. The service dataset is created on first use with the
train set's size and ``num_generations`` rollouts per prompt; a second run on the same dataset continues
after the first one's steps.

Run it beside a service (``selector-service serve`` prints its URL)::

    pip install dist/rlvr_selector_client-*.whl trl          # in the trainer's environment
    python examples/tiny_model.py /tmp/tiny-model             # a tiny random model, offline
    python examples/trl_grpo.py --url http://127.0.0.1:8000 --dataset arith-trl --model /tmp/tiny-model

``--url`` and ``--dataset`` may come from ``SELECTOR_URL`` and ``SELECTOR_DATASET`` instead. With the
tiny model the completions are noise (accuracy stays near 0) but every step is selected, rolled out,
rewarded and reported as in a real run; ``--model HuggingFaceTB/SmolLM2-135M-Instruct`` learns.
The test suite runs this file in a venv of TRL 1.16 (tests/integrations/test_frameworks.py).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

import torch
from datasets import Dataset
from trl import GRPOConfig

from rlvr_selector_client.integrations.trl import SelectorGRPOTrainer, SelectorOptions


def arithmetic(size: int) -> Dataset:
    """``size`` questions; ``prompt_id`` is the service's id of each row, an integer 0..size-1."""
    return Dataset.from_list(
        [{"prompt": f"what is {i} + 1?", "answer": str(i + 1), "prompt_id": i} for i in range(size)]
    )


def accuracy(completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    """The verifiable reward: 1.0 when the last number in the completion is the answer."""
    rewards = []
    for text, expected in zip(completions, answer, strict=True):
        numbers = re.findall(r"\d+", text)
        rewards.append(1.0 if numbers and numbers[-1] == expected else 0.0)
    return rewards


def format_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """A shaping bonus (a number in the completion): TRL adds it to the advantages; the selector does
    not count it as solving the prompt."""
    return [1.0 if re.search(r"\d", text) else 0.0 for text in completions]


def trainer(model: str, config: GRPOConfig, url: str | None, dataset: str | None) -> SelectorGRPOTrainer:
    """GRPOTrainer's arguments, plus the selector's options and the reward it observes. A url or dataset
    left None is read from SELECTOR_URL / SELECTOR_DATASET."""
    return SelectorGRPOTrainer(
        model=model,
        reward_funcs=[format_reward, accuracy],
        observe_reward="accuracy",
        args=config,
        train_dataset=arithmetic(64),
        selector=SelectorOptions(url=url, dataset=dataset or ""),
    )


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--url", help="the selector service (default: $SELECTOR_URL)")
    parser.add_argument("--dataset", help="the service dataset's name (default: $SELECTOR_DATASET)")
    parser.add_argument("--model", required=True, help="a model folder or Hugging Face id")
    parser.add_argument("--output-dir", default="runs/trl-grpo")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8, help="completions per device per step")
    parser.add_argument("--num-generations", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-completion-length", type=int, default=16)
    return parser.parse_args(argv)


def grpo_config(args: argparse.Namespace) -> GRPOConfig:
    return GRPOConfig(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_steps=args.max_steps,
        learning_rate=1e-5,
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
    )


def main(argv: Sequence[str] | None = None) -> SelectorGRPOTrainer:
    args = parse(argv)
    grpo = trainer(args.model, grpo_config(args), args.url, args.dataset)
    grpo.train()
    return grpo


if __name__ == "__main__":
    main()
