"""GRPO with the Tinker cookbook's RL loop (tinker-cookbook 0.6), each step's prompts chosen by the selector
service (docs/integrations.md, "Tinker cookbook 0.6").

A complete script in the cookbook's own recipe style (a ``chz`` blueprint of ``rl.train.Config``, any
field settable as ``key=value`` on the command line): an arithmetic problem set as the cookbook's
``ProblemEnv`` groups (the service's prompt id of a problem is its index, ``0..size-1``),
`SelectorDatasetBuilder` as ``dataset_builder``, and the cookbook's ``rl.train.main``. The selector
observes each answer's correctness (``reward_key="correct"``, ProblemEnv's metric), not the total reward
the cookbook trains on, which also holds ProblemEnv's format penalty. The service dataset is created on
first use with ``size`` prompts and ``group_size`` rollouts each; a second run on the same dataset
continues after the first one's steps, and a run started again on the same ``log_path`` resumes from the
cookbook's checkpoint.

Run it beside a service (``selector-service serve`` prints its URL), with a Tinker API key::

    pip install dist/rlvr_selector_client-*.whl tinker-cookbook==0.6.1     # where the RL loop runs
    export TINKER_API_KEY=...
    python examples/tinker_grpo.py dataset_builder.url=http://127.0.0.1:8000 \\
        dataset_builder.dataset=arith-tinker log_path=runs/arith-tinker

``dataset_builder.url`` and ``dataset_builder.dataset`` may come from ``SELECTOR_URL`` and
``SELECTOR_DATASET`` instead; ``model_name=...`` picks another Tinker model (its recommended renderer
follows). The test suite runs this file with the cookbook's own loop, only the Tinker service faked
behind the SDK's client and the model's tokenizer replaced by a tiny offline one
(tests/integrations/frameworks/drive_tinker.py).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Sequence
from functools import partial

import chz
from chz.blueprint import Reference
from tinker_cookbook import cli_utils, model_info, renderers
from tinker_cookbook.rl import train
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

from rlvr_selector_client.integrations.tinker import PromptGroups, PromptGroupsBuilder, SelectorDatasetBuilder

MODEL = "meta-llama/Llama-3.2-1B"


class ArithmeticEnv(ProblemEnv):
    """Problem ``i``: ``what is i + 1?``, right when the answer's last number is ``i + 1``."""

    def __init__(self, prompt_id: int, renderer: renderers.Renderer) -> None:
        super().__init__(renderer)  # format_coef 0.1: a missed format costs 0.1 of the total reward
        self.prompt_id = prompt_id

    def get_question(self) -> str:
        return f"what is {self.prompt_id} + 1?"

    def check_answer(self, sample_str: str) -> bool:
        numbers = re.findall(r"\d+", sample_str)
        return bool(numbers) and numbers[-1] == self.get_reference_answer()

    def check_format(self, sample_str: str) -> bool:
        return bool(re.search(r"\d", sample_str))

    def get_reference_answer(self) -> str:
        return str(self.prompt_id + 1)


class Arithmetic(PromptGroups):
    """Prompt id ``i`` -> a group of ``group_size`` environments of problem ``i``."""

    def __init__(self, size: int, renderer: renderers.Renderer) -> None:
        self.size = size
        self.renderer = renderer

    def __len__(self) -> int:
        return self.size

    def group(self, prompt_id: int, group_size: int) -> ProblemGroupBuilder:
        return ProblemGroupBuilder(
            env_thunk=partial(ArithmeticEnv, prompt_id, self.renderer),
            num_envs=group_size,
            dataset_name="arithmetic",
        )


@chz.chz
class ArithmeticBuilder(PromptGroupsBuilder):
    model_name_for_tokenizer: str
    renderer_name: str
    size: int = 256

    async def __call__(self) -> PromptGroups:
        tokenizer = get_tokenizer(self.model_name_for_tokenizer)
        return Arithmetic(self.size, renderers.get_renderer(self.renderer_name, tokenizer=tokenizer))


def blueprint(model_name: str = MODEL) -> chz.Blueprint[train.Config]:
    """The cookbook's RL config with the selector's dataset builder; the prompts follow the model's
    tokenizer and renderer."""
    return chz.Blueprint(train.Config).apply(
        {
            "model_name": model_name,
            "renderer_name": model_info.get_recommended_renderer_name(model_name),
            "recipe_name": "selector_arithmetic",
            "log_path": "runs/tinker-grpo",
            "learning_rate": 4e-5,
            "max_tokens": 64,
            "eval_every": 0,
            "dataset_builder": SelectorDatasetBuilder,
            "dataset_builder.prompts": ArithmeticBuilder,
            "dataset_builder.prompts.model_name_for_tokenizer": Reference("model_name"),
            "dataset_builder.prompts.renderer_name": Reference("renderer_name"),
            "dataset_builder.groups_per_batch": 32,
            "dataset_builder.group_size": 8,
            "dataset_builder.reward_key": "correct",
        }
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    config = blueprint(cli_utils.model_name_from_argv(args, default=MODEL)).make_from_argv(args)
    asyncio.run(train.main(config))


if __name__ == "__main__":
    main()
