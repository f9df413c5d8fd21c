"""GRPO with OpenRLHF 0.11, each step's prompts chosen by the selector service (docs/integrations.md,
"OpenRLHF").

What OpenRLHF needs from you, here: a JSONL train file whose rows carry an integer ``prompt_id`` column
(``0..N-1``, the service's prompt id; `write_jsonl`), a reward function file for ``--reward.remote_url``
(examples/openrlhf_reward.py: the selector reports the rewards OpenRLHF computes during rollout), and
the launch arguments: OpenRLHF's own ``train_ppo_ray`` arguments plus ``--selector.*`` (`arguments`),
given to ``python -m rlvr_selector_client.integrations.openrlhf``. The group size is
``--rollout.n_samples_per_prompt``; the service dataset is created with it.

Run it beside a service (``selector-service serve`` prints its URL) on a GPU machine with OpenRLHF and vLLM::

    pip install dist/rlvr_selector_client-*.whl              # in OpenRLHF's environment
    python examples/openrlhf_grpo.py --url http://127.0.0.1:8000 --dataset arith-openrlhf \\
        --model Qwen/Qwen2.5-0.5B-Instruct [any train_ppo_ray argument ...]

The test suite writes its data with `write_jsonl`, uses this reward file and launches OpenRLHF with these
arguments (tests/integrations/frameworks/drive_openrlhf.py; vLLM and the DeepSpeed actors are faked there).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REWARD_FILE = Path(__file__).with_name("openrlhf_reward.py")


def records(size: int) -> list[dict[str, Any]]:
    """A toy arithmetic set: ``what is i + 1?``, answer ``i + 1``, prompt id ``i``."""
    return [{"prompt_id": i, "question": f"what is {i} + 1?", "answer": str(i + 1)} for i in range(size)]


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """One JSON object per line, in the given order (OpenRLHF reads ``question``, ``answer`` and keeps
    ``prompt_id`` for the selector)."""
    with Path(path).open("w") as out:
        for row in rows:
            out.write(json.dumps(dict(row)) + "\n")
    return Path(path)


def arguments(
    url: str | None,
    dataset: str | None,
    model: str,
    data: Path,
    *,
    batch: int,
    n: int,
    strategy: str = "insight",
) -> list[str]:
    """The command line: the selector's options (``url`` and ``dataset`` left out come from
    SELECTOR_URL / SELECTOR_DATASET), then OpenRLHF's: data, the reward file, GRPO's group
    normalisation, ``batch`` prompts a step and ``n`` completions each."""
    selector = {"url": url, "dataset": dataset, "strategy": strategy}
    return [
        *(f"--selector.{key}={value}" for key, value in selector.items() if value is not None),
        "--actor.model_name_or_path",
        model,
        "--data.prompt_dataset",
        str(data),
        "--data.input_key",
        "question",
        "--data.label_key",
        "answer",
        "--data.apply_chat_template",
        "--reward.remote_url",
        str(REWARD_FILE),
        "--algo.advantage.estimator",
        "group_norm",
        "--rollout.batch_size",
        str(batch),
        "--rollout.n_samples_per_prompt",
        str(n),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--url", help="the selector service (default: $SELECTOR_URL)")
    parser.add_argument("--dataset", help="the service dataset's name (default: $SELECTOR_DATASET)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", type=Path, default=Path("runs/openrlhf-grpo/train.jsonl"))
    parser.add_argument("--size", type=int, default=256, help="prompts in the toy train set")
    parser.add_argument("--batch", type=int, default=32, help="prompts per step (--rollout.batch_size)")
    parser.add_argument("--n", type=int, default=8, help="completions per prompt")
    args, extra = parser.parse_known_args(argv)
    args.data.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(records(args.size), args.data)
    from rlvr_selector_client.integrations import openrlhf

    openrlhf.main(
        [*arguments(args.url, args.dataset, args.model, args.data, batch=args.batch, n=args.n), *extra]
    )


if __name__ == "__main__":
    main()
