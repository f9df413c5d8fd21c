"""GRPO with AReaL 1.0's asynchronous trainer, each step's prompts chosen by the selector service
(docs/integrations.md, "AReaL").

AReaL's own GSM8K script with three changes: the train set gets an integer ``prompt_id`` column (the
service's prompt id, ``0..N-1``; `with_prompt_ids`), the trainer is `SelectorPPOTrainer` with
``selector=SelectorOptions(...)``, and the workflow is wrapped so that each finished group is reported
(`workflow`). The group size is ``gconfig.n_samples``; the service dataset is created with it and with
``max_lag = rollout.max_head_offpolicyness + 2``.

Run it beside a service (``selector-service serve`` prints its URL), as AReaL runs its examples::

    pip install dist/rlvr_selector_client-*.whl              # in AReaL's environment
    SELECTOR_URL=http://127.0.0.1:8000 SELECTOR_DATASET=gsm8k-areal \\
        python -m areal.launcher.local examples/areal_grpo.py --config <AReaL's gsm8k_grpo.yaml> ...

The test suite builds its train set with `with_prompt_ids` and its workflow with `workflow`, then runs
AReaL's rollout engine, staleness control and advantages on them
(tests/integrations/frameworks/drive_areal.py; the SGLang server is faked there).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any


def with_prompt_ids(dataset: Any) -> Any:
    """The dataset with ``prompt_id`` = its row number, set once before any filtering of it."""
    return dataset.map(lambda _, row: {"prompt_id": row}, with_indices=True)


def workflow(trainer: Any, config: Any, tokenizer: Any = None) -> Any:
    """AReaL's RLVR workflow with its GSM8K reward, wrapped to report each finished group."""
    from areal.reward.gsm8k import gsm8k_reward_fn
    from areal.workflow.rlvr import RLVRWorkflow

    return trainer.selector_workflow(
        RLVRWorkflow(
            reward_fn=gsm8k_reward_fn, gconfig=config.gconfig, tokenizer=tokenizer or trainer.tokenizer
        )
    )


def main(argv: Sequence[str]) -> None:
    from areal.api.cli_args import GRPOConfig, load_expr_config
    from areal.dataset import get_custom_dataset
    from areal.utils.hf_utils import load_hf_tokenizer

    from rlvr_selector_client.integrations.areal import SelectorOptions, SelectorPPOTrainer

    config, _ = load_expr_config(list(argv), GRPOConfig)
    tokenizer = load_hf_tokenizer(config.tokenizer_path)
    train = get_custom_dataset(split="train", dataset_config=config.train_dataset, tokenizer=tokenizer)
    valid = None
    if config.valid_dataset is not None:
        valid = get_custom_dataset(split="test", dataset_config=config.valid_dataset, tokenizer=tokenizer)
    # SelectorOptions(): the service from SELECTOR_URL and SELECTOR_DATASET (or pass url=, dataset=).
    with SelectorPPOTrainer(
        config, train_dataset=with_prompt_ids(train), valid_dataset=valid, selector=SelectorOptions()
    ) as trainer:
        trainer.train(workflow(trainer, config))


if __name__ == "__main__":
    main(sys.argv[1:])
