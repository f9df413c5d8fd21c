"""GRPO with verl, each step's prompts chosen by the selector service (docs/integrations.md, "verl").

Two things verl needs from you, both here:

- the data: a parquet file of verl's rows whose ``extra_info.index`` is the service's prompt id, an
  integer ``0..N-1`` that stays with its prompt (`write_parquet`; verl would silently use 0 for a row
  without it, so the sampler refuses such rows);
- the launch line: verl's own overrides plus the selector's keys under ``+data.sampler.selector``
  (`selector_overrides`) and the route for the installed verl (`route_overrides`): verl 0.5 - 0.7 runs
  ``python -m verl.trainer.main_ppo`` with the selector's curriculum sampler, verl 0.8 and later run
  ``python -m rlvr_selector_client.integrations.verl_main``, verl's own trainer with the sampler in it.

Run it beside a service (``selector-service serve`` prints its URL) on a GPU machine with verl and vLLM::

    pip install dist/rlvr_selector_client-*.whl              # in verl's environment
    python examples/verl_grpo.py --url http://127.0.0.1:8000 --dataset arith-verl \\
        --model Qwen/Qwen2.5-0.5B-Instruct [any verl override ...]

The group size is ``actor_rollout_ref.rollout.n`` (``--n``); the service dataset is created with it. The
test suite writes its data with `write_parquet` and launches verl's trainer with these overrides
(tests/integrations/frameworks/drive_verl.py; generation and the FSDP workers are faked there).
"""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any


def records(size: int) -> list[dict[str, Any]]:
    """A toy arithmetic set: ``what is i + 1?``, answer ``i + 1``, prompt id ``i``."""
    return [{"prompt_id": i, "question": f"what is {i} + 1?", "answer": str(i + 1)} for i in range(size)]


def write_parquet(rows: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """verl's rows for GSM8K-style records (``prompt_id``, ``question``, ``answer``), in their order:
    ``data_source`` ``openai/gsm8k`` makes verl's rule reward score ``#### <answer>``, and
    ``extra_info.index`` carries the prompt id."""
    import pandas as pd

    frame = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": row["question"]}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(row["answer"])},
            "extra_info": {"split": "train", "index": int(row["prompt_id"])},
        }
        for row in rows
    ]
    pd.DataFrame(frame).to_parquet(path)
    return path


def verl_version() -> tuple[int, int]:
    major, minor, *_ = (int(part) for part in metadata.version("verl").split(".")[:2])
    return major, minor


def selector_overrides(url: str | None, dataset: str | None, n: int, strategy: str = "insight") -> list[str]:
    """The selector's keys (``url`` and ``dataset`` left out come from SELECTOR_URL / SELECTOR_DATASET).
    ``rollouts_per_prompt`` is ``actor_rollout_ref.rollout.n``: verl 0.5 - 0.7 hands the sampler the
    data config only, so it cannot read the group size itself."""
    keys = {"url": url, "dataset": dataset, "strategy": strategy, "rollouts_per_prompt": n}
    return [f"+data.sampler.selector.{key}={value}" for key, value in keys.items() if value is not None]


def route_overrides(version: tuple[int, int]) -> list[str]:
    """verl 0.5 - 0.7: the curriculum sampler hook; later verl: nothing (the entry point replaces verl's
    sampler). Both need the loader without worker processes (they would select ahead)."""
    if version < (0, 8):
        return [
            "data.sampler.class_path=pkg://rlvr_selector_client.integrations.verl",
            "data.sampler.class_name=SelectorCurriculumSampler",
            "data.dataloader_num_workers=0",
        ]
    return ["data.dataloader_num_workers=0"]


def overrides(args: argparse.Namespace, train: Path, extra: Sequence[str]) -> list[str]:
    return [
        *route_overrides(verl_version()),
        *selector_overrides(args.url, args.dataset, args.n, args.strategy),
        f"data.train_files={train}",
        f"data.val_files={train}",
        f"data.train_batch_size={args.batch}",
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.model.path={args.model}",
        f"actor_rollout_ref.rollout.n={args.n}",
        "trainer.logger=[console]",
        *extra,
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--url", help="the selector service (default: $SELECTOR_URL)")
    parser.add_argument("--dataset", help="the service dataset's name (default: $SELECTOR_DATASET)")
    parser.add_argument("--strategy", default="insight")
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", type=Path, default=Path("runs/verl-grpo/train.parquet"))
    parser.add_argument("--size", type=int, default=256, help="prompts in the toy train set")
    parser.add_argument("--batch", type=int, default=32, help="prompts per step (data.train_batch_size)")
    parser.add_argument(
        "--n", type=int, default=8, help="completions per prompt (actor_rollout_ref.rollout.n)"
    )
    args, extra = parser.parse_known_args(argv)
    args.data.parent.mkdir(parents=True, exist_ok=True)
    launch = overrides(args, write_parquet(records(args.size), args.data), extra)
    if verl_version() >= (0, 8):
        from rlvr_selector_client.integrations import verl_main

        verl_main.main(launch)
    else:
        sys.argv = ["verl.trainer.main_ppo", *launch]
        runpy.run_module("verl.trainer.main_ppo", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
