"""GRPO with slime, each rollout's prompts chosen by the selector service (docs/integrations.md, "slime").

slime is not on PyPI; it takes the selector's two hooks as module paths on its command line
(`hook_arguments`), and the settings from the environment (`environment`). What it needs from you: a
JSONL prompt file whose rows carry the service's prompt id in their metadata (``metadata.prompt_id``,
``0..N-1``; `write_prompts`), read with ``--input-key prompt --label-key label --metadata-key metadata``.
The group size is ``--n-samples-per-prompt``; the service dataset is created with it.

    pip install dist/rlvr_selector_client-*.whl              # in slime's environment
    python examples/slime_grpo.py --url http://127.0.0.1:8000 --dataset arith-slime --prompts data.jsonl
    # prints the environment and the arguments to add to slime's train.py command line

The test suite writes its prompt file with `write_prompts` and drives the two hooks with it
(tests/integrations/test_slime_contract.py).
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def records(size: int) -> list[dict[str, Any]]:
    """A toy arithmetic set: ``what is i + 1?``, answer ``i + 1``, prompt id ``i``."""
    return [{"prompt_id": i, "question": f"what is {i} + 1?", "answer": str(i + 1)} for i in range(size)]


def write_prompts(rows: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """slime's prompt file, in the given order: ``prompt``, ``label`` and ``metadata.prompt_id``."""
    with Path(path).open("w") as out:
        for row in rows:
            line = {
                "prompt": row["question"],
                "label": row["answer"],
                "metadata": {"prompt_id": row["prompt_id"]},
            }
            out.write(json.dumps(line) + "\n")
    return Path(path)


def environment(url: str, dataset: str, max_lag: int = 2) -> dict[str, str]:
    """The selector's settings for slime (its ``args`` has no room for them)."""
    return {"SELECTOR_URL": url, "SELECTOR_DATASET": dataset, "SELECTOR_MAX_LAG": str(max_lag)}


def hook_arguments(prompts: Path) -> list[str]:
    """The arguments to add to slime's ``train.py``: the prompt file and the selector's two hooks."""
    return [
        "--rollout-global-dataset",
        "--prompt-data",
        str(prompts),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--metadata-key",
        "metadata",
        "--data-source-path",
        "rlvr_selector_client.integrations.slime.SelectorDataSource",
        "--rollout-all-samples-process-path",
        "rlvr_selector_client.integrations.slime.report_all_samples",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--prompts", type=Path, default=Path("runs/slime-grpo/prompts.jsonl"))
    parser.add_argument("--size", type=int, default=256, help="prompts in the toy prompt file")
    args = parser.parse_args(argv)
    args.prompts.parent.mkdir(parents=True, exist_ok=True)
    write_prompts(records(args.size), args.prompts)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in environment(args.url, args.dataset).items())
    print(f"{env} python train.py ... {shlex.join(hook_arguments(args.prompts))}")


if __name__ == "__main__":
    main()
