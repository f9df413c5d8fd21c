"""Run examples/trl_grpo.py (the TRL example of docs/integrations.md) in the TRL venv against a real
selector service, and the mistakes a user following the docs can make.

TRL's own code does everything between selection and the update: ``GRPOTrainer``'s data loader (with
accelerate's one-batch look-ahead), generation with the example's tiny random Llama
(examples/tiny_model.py) through transformers, TRL's reward calls (the example's ``format_reward`` and
``accuracy``), group advantages and the optimiser step. Nothing is faked; the client's ``select`` and
``observe`` and the example's reward functions are wrapped to record what they did.

1. The example, as a user runs it (``--url``, ``--dataset``), three optimisation steps of one
   generation each: TRL's default ``steps_per_generation``, the case where its loader fetches the next
   step's batch before the current one is rewarded.
2. The example again on the same dataset, with the service's address from ``SELECTOR_URL`` and
   ``SELECTOR_DATASET`` instead: it continues after the first run's steps.
3. Mistakes, each refused when the trainer is built: two reward functions and none named; a
   ``num_generations`` other than the dataset's ``rollouts_per_prompt``; a service URL with a path.

Usage: python drive_trl.py --url URL --dataset NAME --workdir DIR
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from examples import tiny_model, trl_grpo
from tests.integrations.frameworks import common

GENERATIONS = 2  # completions per prompt (num_generations)
BATCH = 4  # completions per device per step: 2 prompts a step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()

    import httpx

    from rlvr_selector_client.client import SelectorClient

    selected: list[dict[str, Any]] = []
    observed: list[dict[str, Any]] = []
    select, observe = SelectorClient.select, SelectorClient.observe

    def recording_select(self: Any, dataset: str, step: int, *a: Any, **kw: Any) -> Any:
        answer = select(self, dataset, step, *a, **kw)
        selected.append({"step": step, "prompt_ids": list(answer.prompt_ids)})
        return answer

    def recording_observe(
        self: Any, dataset: str, step: int, results: Any, request_id: str, **kw: Any
    ) -> Any:
        results = list(results)
        ack = observe(self, dataset, step, results, request_id, **kw)
        observed.append(
            {
                "step": step,
                "selected_step": kw.get("selected_step"),
                "request_id": request_id,
                "lag": ack.lag,
                "results": [[r.prompt_id, list(r.rewards or [])] for r in results],
            }
        )
        return ack

    SelectorClient.select = recording_select  # type: ignore[method-assign]
    SelectorClient.observe = recording_observe  # type: ignore[method-assign]

    rewards: dict[str, list[list[list[float]]]] = {"accuracy": [], "format_reward": []}

    def recording(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(completions: list[str], prompt_id: list[int], **kwargs: Any) -> list[float]:
            values = func(completions=completions, prompt_id=prompt_id, **kwargs)
            rewards[func.__name__].append([[int(p), v] for p, v in zip(prompt_id, values, strict=True)])
            return values

        return wrapper

    trl_grpo.accuracy = recording(trl_grpo.accuracy)
    trl_grpo.format_reward = recording(trl_grpo.format_reward)

    model = tiny_model.write(Path(args.workdir) / "tiny-model")
    example = [
        "--model",
        str(model),
        "--output-dir",
        str(Path(args.workdir) / "out"),
        "--batch-size",
        str(BATCH),
        "--num-generations",
        str(GENERATIONS),
        "--max-completion-length",
        "6",
    ]
    runs = []
    # 1. As the docs launch it.
    first = trl_grpo.main(["--url", args.url, "--dataset", args.dataset, "--max-steps", "3", *example])
    runs.append({"global_step": first.state.global_step, "selects": len(selected), "reports": len(observed)})
    # 2. Again, the service named by the environment.
    os.environ["SELECTOR_URL"], os.environ["SELECTOR_DATASET"] = args.url, args.dataset
    again = trl_grpo.main(["--max-steps", "2", *example])
    runs.append({"global_step": again.state.global_step, "selects": len(selected), "reports": len(observed)})
    del os.environ["SELECTOR_URL"], os.environ["SELECTOR_DATASET"]

    # 3. The mistakes.
    from rlvr_selector_client.integrations.trl import SelectorGRPOTrainer, SelectorOptions

    def refusal(build: Any) -> str:
        try:
            build()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "accepted"

    def build(*extra: str, url: str = args.url, dataset: str = args.dataset) -> Any:
        options = trl_grpo.parse([*example, "--max-steps", "1", *extra])
        return trl_grpo.trainer(options.model, trl_grpo.grpo_config(options), url, dataset)

    config = trl_grpo.grpo_config(trl_grpo.parse([*example, "--max-steps", "1"]))
    mistakes = {
        "no_observe_reward": refusal(
            lambda: SelectorGRPOTrainer(
                model=str(model),
                reward_funcs=[trl_grpo.format_reward, trl_grpo.accuracy],
                args=config,
                train_dataset=trl_grpo.arithmetic(64),
                selector=SelectorOptions(url=args.url, dataset=args.dataset),
            )
        ),
        "num_generations": refusal(lambda: build("--num-generations", "4")),
        "url_with_a_path": refusal(lambda: build(url=args.url + "/api", dataset=args.dataset + "-new")),
    }
    with httpx.Client(base_url=args.url, timeout=30) as http:
        history = http.get(f"/datasets/{args.dataset}/history").json()
    common.emit(
        {
            "trl": metadata.version("trl"),
            "prompts_per_step": BATCH // GENERATIONS,
            "group_size": GENERATIONS,
            "runs": runs,
            "selected": selected,
            "observed": observed,
            "rewards": rewards,
            "history": history,
            "mistakes": mistakes,
        }
    )


if __name__ == "__main__":
    main()
