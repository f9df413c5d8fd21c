"""Drive TRL's GRPOTrainer on CPU against a real selector service, in the TRL venv.

TRL's own code does everything between selection and the update: ``GRPOTrainer`` with its
``RepeatSampler``-shaped sampler slot (filled by `SelectorRepeatSampler`), generation with a tiny Llama
through transformers, TRL's reward call (through `ObservingReward`, which reports each generation's
groups), group advantages and the optimiser step. Nothing is faked: the model is random and tiny, and
the reward (a vowel in the completion) is what the service must end up holding.

Two optimisation steps per generation, two generations; then a second trainer on the same dataset,
which must continue after the first run's steps.

Usage: python drive_trl.py --url URL --dataset NAME --workdir DIR
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.integrations.frameworks import common
from tests.utils import tiny_llama_config

SIZE = 12
GENERATIONS = 2  # completions per prompt (num_generations)
STEPS_PER_GENERATION = 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()

    import datasets
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig

    from rlvr_selector_client.client import SelectorClient
    from rlvr_selector_client.integrations import trl as adapter

    observed: list[dict[str, Any]] = []

    class RecordingClient(SelectorClient):
        """The real client, remembering every report it sent (in `observed`)."""

        def observe(self, dataset: str, step: int, results: Any, request_id: str) -> Any:
            results = list(results)
            observed.append(
                {
                    "step": step,
                    "request_id": request_id,
                    "results": [[r.prompt_id, list(r.rewards or [])] for r in results],
                }
            )
            return super().observe(dataset, step, results, request_id)

    train = datasets.Dataset.from_list([{"prompt": common.question(i), "prompt_id": i} for i in range(SIZE)])
    rewarded: list[list[float]] = []

    def has_vowel(completions: list[str], prompt_id: list[int], **kwargs: Any) -> list[float]:
        rewards = [1.0 if any(c in "aeiou" for c in text) else 0.0 for text in completions]
        rewarded.extend([int(p), r] for p, r in zip(prompt_id, rewards, strict=True))
        return rewards

    tok = common.tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            **tiny_llama_config(len(tok), max_position_embeddings=128),
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=None,
        )
    )
    config = GRPOConfig(
        output_dir=str(Path(args.workdir) / "out"),
        per_device_train_batch_size=4,
        num_generations=GENERATIONS,
        steps_per_generation=STEPS_PER_GENERATION,
        max_completion_length=6,
        max_steps=2 * STEPS_PER_GENERATION,
        learning_rate=1e-2,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=0,
        disable_tqdm=True,
    )
    client = RecordingClient(args.url)
    trainer = adapter.SelectorGRPOTrainer(
        model=model,
        reward_funcs=has_vowel,
        args=config,
        train_dataset=train,
        processing_class=tok,
        selector=adapter.SelectorOptions(client=client, dataset=args.dataset, strategy="insight", seed=2),
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    changed = any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    sampler = trainer._selector_sampler
    again = adapter.SelectorGRPOTrainer(
        model=trainer.model,
        reward_funcs=has_vowel,
        args=config,
        train_dataset=train,
        processing_class=tok,
        selector=adapter.SelectorOptions(client=client, dataset=args.dataset, strategy="insight"),
    )
    common.emit(
        {
            "trl": metadata.version("trl"),
            "generation_prompts": config.generation_batch_size // GENERATIONS,
            "batches": {str(step): sorted(ids) for step, ids in sampler.history.items()},
            "observed": observed,
            "fed": rewarded,
            "parameters_changed": changed,
            "next_step_again": again._get_train_sampler().next_step,
            "open_step": client.get_dataset(args.dataset).open_step,
        }
    )


if __name__ == "__main__":
    main()
