"""GRPO with SkyRL 0.3's PPO trainer, each step's prompts chosen by the selector service
(docs/integrations.md, "SkyRL 0.3").

Two things SkyRL needs from you, both here:

- the data: a parquet file of SkyRL's prompt rows (chat ``prompt``, ``env_class``, ``reward_spec``) with
  an integer ``prompt_id`` column, the service's prompt id ``0..N-1`` that stays with its prompt (SkyRL
  drops prompts longer than ``trainer.max_prompt_length``, so never the row position; `write_parquet`);
- the launch: SkyRL's own overrides (`overrides`: the data, the model, ``trainer.train_batch_size``
  prompts a step and ``generator.n_samples_per_prompt`` rollouts each, GRPO) run by SkyRL's ``main_base``
  with the selector's trainer (``rlvr_selector_client.integrations.skyrl.main``).

Run it beside a service (``selector-service serve`` prints its URL) on a GPU machine with SkyRL
(Python 3.12; SkyRL 0.3.0's trainer does not import on 3.11) and vLLM::

    pip install dist/rlvr_selector_client-*.whl     # in SkyRL's environment (skyrl[fsdp]==0.3.0)
    python examples/skyrl_grpo.py --url http://127.0.0.1:8000 --dataset arith-skyrl \\
        --model Qwen/Qwen2.5-0.5B-Instruct [any SkyRL override ...]

``--url`` and ``--dataset`` may come from ``SELECTOR_URL`` and ``SELECTOR_DATASET`` instead. The group
size is ``generator.n_samples_per_prompt`` (``--n``); the service dataset is created with it. The test
suite writes its data with `write_parquet` and builds SkyRL's config from `overrides`, then runs SkyRL's
own trainer (tests/integrations/frameworks/drive_skyrl.py; generation and the FSDP workers are faked
there).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def records(size: int) -> list[dict[str, Any]]:
    """A toy arithmetic set: ``what is i + 1?``, answer ``i + 1``, prompt id ``i``."""
    return [{"prompt_id": i, "question": f"what is {i} + 1?", "answer": str(i + 1)} for i in range(size)]


def write_parquet(rows: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """SkyRL's prompt rows for the records, in their order: skyrl-gym's ``gsm8k`` environment scores
    ``#### <answer>`` against ``reward_spec.ground_truth``, and ``prompt_id`` is kept for the selector."""
    import pandas as pd

    frame = [
        {
            "prompt": [{"role": "user", "content": row["question"]}],
            "env_class": "gsm8k",
            "reward_spec": {"method": "rule", "ground_truth": str(row["answer"])},
            "prompt_id": int(row["prompt_id"]),
        }
        for row in rows
    ]
    pd.DataFrame(frame).to_parquet(path)
    return Path(path)


def overrides(train: Path, model: str, *, batch: int, n: int) -> list[str]:
    """SkyRL's command-line overrides: the data (no validation set), the model, ``batch`` prompts a step
    (one service step) and ``n`` completions each, GRPO; the loader without worker processes (they would
    select steps ahead of the reports)."""
    return [
        f"data.train_data=['{train}']",
        "data.val_data=[]",
        "data.dataloader.num_workers=0",
        f"trainer.policy.model.path={model}",
        f"trainer.train_batch_size={batch}",
        f"trainer.policy_mini_batch_size={batch}",
        f"generator.n_samples_per_prompt={n}",
        "trainer.algorithm.advantage_estimator=grpo",
        "trainer.eval_before_train=false",
        "trainer.eval_interval=0",
    ]


def selector(url: str | None, dataset: str | None) -> Any:
    """The selector's options; a url or dataset left None is read from SELECTOR_URL / SELECTOR_DATASET."""
    from rlvr_selector_client.integrations import SelectorOptions

    return SelectorOptions(url=url, dataset=dataset or "")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--url", help="the selector service (default: $SELECTOR_URL)")
    parser.add_argument("--dataset", help="the service dataset's name (default: $SELECTOR_DATASET)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", type=Path, default=Path("runs/skyrl-grpo/train.parquet"))
    parser.add_argument("--size", type=int, default=256, help="prompts in the toy train set")
    parser.add_argument("--batch", type=int, default=32, help="prompts per step (trainer.train_batch_size)")
    parser.add_argument(
        "--n", type=int, default=8, help="completions per prompt (generator.n_samples_per_prompt)"
    )
    args, extra = parser.parse_known_args(argv)
    args.data.parent.mkdir(parents=True, exist_ok=True)
    train = write_parquet(records(args.size), args.data)
    from rlvr_selector_client.integrations import skyrl

    skyrl.main(
        [*overrides(train, args.model, batch=args.batch, n=args.n), *extra],
        selector=selector(args.url, args.dataset),
    )


if __name__ == "__main__":
    main()
