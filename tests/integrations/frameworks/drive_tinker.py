"""Run examples/tinker_grpo.py (the Tinker example of docs/integrations.md) with the Tinker cookbook's RL
loop (``tinker_cookbook.rl.train.main``) on CPU against a real selector service, in the tinker venv.

The cookbook's own code runs everything on the client side: its ``chz`` config from the example's
command line, the dataset builder call, sync and asynchronous training loops, ``do_group_rollout`` with
its rollout strategy, the example's ``ProblemEnv`` groups graded through the cookbook's ``role_colon``
renderer, advantages, datum assembly, checkpoints (``checkpoints.jsonl``), resume and metrics logging.
Faked, because it is a remote GPU service: the Tinker service behind the SDK's client objects
(``tinker.ServiceClient`` and the training and sampling clients it makes): sampling answers from
`common.Policy` (right or wrong by prompt, the same in every run; every answer ends with EOS rather than
the renderer's stop sequence, so ProblemEnv takes the format penalty off each total reward), training
returns the sampled log-probs and a loss. The example's model name gets the tiny offline tokenizer
(``register_tokenizer``, the cookbook's own hook for custom tokenizers). The client's ``observe`` is
wrapped to record what was sent.

Runs, each ``tinker_grpo.main(argv)`` as a user launches it:

- ``sync``: 2 steps with a checkpoint after each, then a third whose training fails after its groups were
  rolled out and reported (the process "dies" there); the example again on the same log path, the
  service named by ``SELECTOR_URL`` / ``SELECTOR_DATASET`` / ``SELECTOR_SEED`` / ``SELECTOR_STRATEGY``
  instead of the command line, resumes from the checkpoint of batch 2 and trains batches 2 and 3.
  Reward: ``reward_key="correct"`` (the example's).
- ``budget``: 2 synchronous steps with a rollout budget and no ``reward_key``: each group has the size
  the service gave it, and the total reward is reported.
- ``async``: ``AsyncConfig(max_steps_off_policy=1)`` on a dataset with ``max_lag=2``; groups finish after
  the next step was selected, and one group of the first step only answers once the training client has
  made three updates, so it reports later than ``max_lag``.
- ``order``: a later batch's group starting first (directly on the dataset).
- ``mistakes``: a ``group_size`` other than the dataset's, a service URL with a path, a ``reward_key``
  the environment does not log; each must stop ``train.main`` with a message saying what to do.

Usage: python drive_tinker.py --url URL --dataset NAME --workdir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import uuid
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from examples import tinker_grpo
from tests.integrations.frameworks import common

MODEL = tinker_grpo.MODEL  # the example's default model, with the tiny offline tokenizer
SIZE = 12  # prompts
G = 3  # groups (prompts) per step
N = 4  # rollouts per prompt without a budget


class Crash(RuntimeError):
    """The fake training service failing in the middle of a run (the process dies there)."""


# ---------------------------------------------------------------------------------------------------
# The Tinker service, faked behind the SDK's client objects
# ---------------------------------------------------------------------------------------------------


class Service:
    """What the fake Tinker service holds: the policy's answers, the data it trained on, its weights
    version and a failure to inject."""

    def __init__(self) -> None:
        self.tok = common.tokenizer()
        self.policy = common.Policy(self.tok)
        self.trained: list[list[dict[str, Any]]] = []  # per optimiser update: [{prompt_id, advantage}]
        self.version = 0
        self.version_changed = asyncio.Condition()
        self.fail_at_update: int | None = None
        self.hold: dict[int, int] = {}  # prompt id -> answer once this many updates happened
        self.metadata: dict[str, str] = {}  # the training run's user metadata


SERVICE: Service | None = None


def _future(value: Any) -> Any:
    """An awaitable already done, with ``result()`` too (the SDK's APIFuture surface the cookbook uses)."""

    class Done:
        def __await__(self) -> Any:
            if False:
                yield
            return value

        def result(self, timeout: float | None = None) -> Any:
            return value

        async def result_async(self, timeout: float | None = None) -> Any:
            return value

    return Done()


class FakeSamplingClient:
    def __init__(self, version: int) -> None:
        self.version = version

    async def sample(self, prompt: Any, num_samples: int, sampling_params: Any, **kwargs: Any) -> Any:
        from tinker.types import SampledSequence, SampleResponse

        service = SERVICE
        assert service is not None
        tokens = prompt.to_ints()
        text = service.tok.decode(tokens)
        prompt_id = common.prompt_id_of(text)
        wait = service.hold.pop(prompt_id, None)
        if wait is not None:
            # Answer only once the trainer has moved on (weights versions, not time).
            async with service.version_changed:
                await service.version_changed.wait_for(lambda: service.version >= wait)
        out = []
        for _ in range(num_samples):
            ids = service.policy.respond_ids(tokens)
            out.append(
                SampledSequence(
                    stop_reason="stop",
                    sequence_id=uuid.uuid4().hex,
                    _tokens_list=ids,
                    _logprobs_list=[-0.5] * len(ids),
                )
            )
        return SampleResponse(sequences=out)

    def sample_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.sample(*args, **kwargs)

    def get_tokenizer(self) -> Any:
        assert SERVICE is not None
        return SERVICE.tok


class FakeTrainingClient:
    def __init__(self, version: int = 0) -> None:
        assert SERVICE is not None
        SERVICE.version = version
        self.pending: list[dict[str, Any]] = []

    def forward_backward(self, data: list[Any], loss_fn: str, loss_fn_config: Any = None) -> Any:
        from tinker.types import ForwardBackwardOutput, TensorData

        service = SERVICE
        assert service is not None
        outputs = []
        for datum in data:
            logprobs = datum.loss_fn_inputs["logprobs"].to_torch()
            advantages = datum.loss_fn_inputs["advantages"].to_torch()
            text = service.tok.decode(datum.model_input.to_ints())
            prompt_id = common.prompt_id_of(text)
            action = advantages[advantages != 0]
            self.pending.append(
                {
                    "prompt_id": prompt_id,
                    # What the fake policy's answer earns, read back from the trained tokens.
                    "reward": 1.0 if f"#### {common.answer_of(prompt_id)}" in text else 0.0,
                    "advantage": float(action[0]) if len(action) else 0.0,
                }
            )
            outputs.append({"logprobs": TensorData.from_torch(logprobs)})
        return _future(
            ForwardBackwardOutput(
                loss_fn_output_type="scalar", loss_fn_outputs=outputs, metrics={"loss:sum": 1.0}
            )
        )

    def optim_step(self, adam_params: Any) -> Any:
        from tinker.types import OptimStepResponse

        service = SERVICE
        assert service is not None
        if service.fail_at_update is not None and len(service.trained) == service.fail_at_update:
            raise Crash(f"the training service failed at update {len(service.trained)}")
        service.trained.append(self.pending)
        self.pending = []
        service.version += 1

        async def bump() -> None:
            async with service.version_changed:
                service.version_changed.notify_all()

        asyncio.get_running_loop().create_task(bump())
        return _future(OptimStepResponse(metrics={"optim/step": float(service.version)}))

    def save_state(self, name: str, ttl_seconds: int | None = None) -> Any:
        from tinker.types import SaveWeightsResponse

        assert SERVICE is not None
        return _future(SaveWeightsResponse(path=f"tinker://fake/state/{name}/v{SERVICE.version}"))

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None) -> Any:
        from tinker.types import SaveWeightsForSamplerResponse

        assert SERVICE is not None
        return _future(SaveWeightsForSamplerResponse(path=f"tinker://fake/sampler/{name}/v{SERVICE.version}"))

    def create_sampling_client(self, model_path: str, **kwargs: Any) -> Any:
        assert SERVICE is not None
        return _future(FakeSamplingClient(SERVICE.version))

    async def save_weights_and_get_sampling_client(self, *args: Any, **kwargs: Any) -> Any:
        assert SERVICE is not None
        return FakeSamplingClient(SERVICE.version)

    async def save_weights_and_get_sampling_client_async(self, *args: Any, **kwargs: Any) -> Any:
        return await self.save_weights_and_get_sampling_client()

    def get_tokenizer(self) -> Any:
        assert SERVICE is not None
        return SERVICE.tok


class FakeServiceClient:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> FakeServiceClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    async def create_lora_training_client(self, base_model: str, rank: int = 32, **kwargs: Any) -> Any:
        assert SERVICE is not None
        SERVICE.metadata = dict(kwargs.get("user_metadata") or {})
        return FakeTrainingClient()

    async def get_training_run_by_tinker_path(self, path: str) -> Any:
        """The run a checkpoint belongs to (the cookbook checks its renderer name on resume)."""
        from types import SimpleNamespace

        assert SERVICE is not None
        return SimpleNamespace(user_metadata=SERVICE.metadata)

    async def create_training_client_from_state_with_optimizer(self, path: str, **kwargs: Any) -> Any:
        return FakeTrainingClient(int(path.rsplit("/v", 1)[1]))

    async def create_training_client_from_state(self, path: str, **kwargs: Any) -> Any:
        return await self.create_training_client_from_state_with_optimizer(path)

    def create_sampling_client(self, *args: Any, **kwargs: Any) -> Any:
        return _future(FakeSamplingClient(0))

    def create_rest_client(self) -> Any:
        return self


# ---------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------


def run(argv: list[str]) -> dict[str, Any]:
    """The example's ``main(argv)``; what the fake service trained on and whether the run died."""
    service = SERVICE
    assert service is not None
    died = None
    try:
        tinker_grpo.main(argv)
    except Crash as exc:
        died = str(exc)
    return {"died": died, "updates": [list(u) for u in service.trained]}


def refusal(argv: list[str]) -> str:
    """The error that stops the example's run (``accepted`` when none does)."""
    try:
        tinker_grpo.main(argv)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import tinker
    from tinker_cookbook.tokenizer_utils import register_tokenizer

    from rlvr_selector_client.client import AsyncSelectorClient
    from rlvr_selector_client.integrations import tinker as adapter

    # The seam: the SDK's service client (everything the cookbook does with Tinker goes through it).
    tinker.ServiceClient = FakeServiceClient  # type: ignore[misc,assignment]
    register_tokenizer(MODEL, common.tokenizer)

    opened: list[Any] = []
    real_open = adapter.SelectorRLDataset.open.__func__  # type: ignore[attr-defined]

    async def recording_open(cls: Any, *a: Any, **k: Any) -> Any:
        dataset = await real_open(cls, *a, **k)
        opened.append(dataset)
        return dataset

    adapter.SelectorRLDataset.open = classmethod(recording_open)  # type: ignore[method-assign,assignment]

    observed: dict[str, list[dict[str, Any]]] = defaultdict(list)
    real_observe = AsyncSelectorClient.observe

    async def recording_observe(
        self: Any, dataset: str, step: int, results: Any, request_id: str, selected_step: Any = None
    ) -> Any:
        results = list(results)
        ack = await real_observe(self, dataset, step, results, request_id, selected_step=selected_step)
        observed[dataset].append(
            {
                "step": step,
                "selected_step": selected_step,
                "lag": ack.lag,
                "results": [[r.prompt_id, list(r.rewards or [])] for r in results],
            }
        )
        return ack

    AsyncSelectorClient.observe = recording_observe  # type: ignore[method-assign]

    def argv(name: str | None, log: str, steps: int, *extra: str) -> list[str]:
        """The example's command line at this scale (``name`` None: the service from the environment)."""
        selector = (
            [] if name is None else [f"dataset_builder.url={args.url}", f"dataset_builder.dataset={name}"]
        )
        return [
            *selector,
            f"dataset_builder.groups_per_batch={G}",
            f"dataset_builder.group_size={N}",
            f"dataset_builder.prompts.size={SIZE}",
            f"log_path={Path(args.workdir) / log}",
            f"max_steps={steps}",
            "max_tokens=32",
            "save_every=1",
            "num_groups_to_log=0",
            "rollout_json_export=False",
            *extra,
        ]

    def summary(dataset: Any) -> dict[str, Any]:
        return {
            "run_id": dataset.run_id,
            "options": {"strategy": dataset.options.strategy, "seed": dataset.options.seed},
            "selections": [list(s) for s in dataset.selections],
            "reported": [list(r) for r in dataset.reported],
            "lost": [list(x) for x in dataset.lost],
        }

    global SERVICE
    report: dict[str, Any] = {"tinker_cookbook": metadata.version("tinker-cookbook"), "group_size": N}

    # 1. Synchronous: two steps, a third that dies in training, and a resume (the service from the
    # environment this time).
    SERVICE = Service()
    SERVICE.fail_at_update = 2
    first = run(argv(args.dataset, "sync", 4, "dataset_builder.seed=3"))
    first.update(summary(opened[-1]))
    SERVICE.fail_at_update = None
    env = {
        "SELECTOR_URL": args.url,
        "SELECTOR_DATASET": args.dataset,
        "SELECTOR_SEED": "7",
        "SELECTOR_STRATEGY": "mopps",
    }
    os.environ.update(env)
    resumed = run(argv(None, "sync", 4))
    for variable in env:
        del os.environ[variable]
    resumed.update(summary(opened[-1]))
    report["sync"] = {"runs": [first, resumed], "earned": list(SERVICE.policy.record)}

    # 2. A rollout budget: 10 rollouts per step over the 3 prompts, 2 to 6 each; the total reward.
    SERVICE = Service()
    budget = run(
        argv(
            args.dataset + "-budget",
            "budget",
            2,
            "dataset_builder.rollout_budget=10",
            "dataset_builder.rollout_min=2",
            "dataset_builder.rollout_max=6",
            "dataset_builder.reward_key=None",
        )
    )
    budget.update(summary(opened[-1]))
    report["budget"] = {"runs": [budget], "earned": list(SERVICE.policy.record)}

    # 3. Asynchronous, one step off policy; a group of the first step answers after three updates.
    SERVICE = Service()
    max_lag = 2
    hold_first_step = True
    held: list[list[int]] = []
    real_select = adapter.SelectorRLDataset._select

    async def select_and_hold(self: Any, step: Any) -> Any:
        nonlocal hold_first_step
        selection = await real_select(self, step)
        if hold_first_step and SERVICE is not None:
            hold_first_step = False
            SERVICE.hold[selection.prompt_ids[0]] = 3
            held.append([step.step, selection.prompt_ids[0]])
        return selection

    adapter.SelectorRLDataset._select = select_and_hold  # type: ignore[method-assign]
    late = run(
        argv(
            args.dataset + "-async",
            "async",
            4,
            "async_config.max_steps_off_policy=1",
            f"async_config.groups_per_batch={G}",
            f"dataset_builder.max_lag={max_lag}",
        )
    )
    adapter.SelectorRLDataset._select = real_select  # type: ignore[method-assign]
    late.update(summary(opened[-1]))
    report["async"] = {
        "runs": [late],
        "earned": list(SERVICE.policy.record),
        "max_lag": max_lag,
        "held": held,
    }

    # 4. The order of selections when a later batch's group starts first (a rollout worker of the
    # asynchronous loop may take it before the earlier batch's): step s is still selected before s + 1.
    async def later_first() -> dict[str, Any]:
        groups = await tinker_grpo.ArithmeticBuilder(
            model_name_for_tokenizer=MODEL, renderer_name="role_colon", size=SIZE
        )()
        options = adapter.SelectorOptions(url=args.url, dataset=args.dataset + "-order", seed=5)
        dataset = await adapter.SelectorRLDataset.open(groups, options, groups_per_batch=G, group_size=N)
        earlier, later = dataset.get_batch(0), dataset.get_batch(1)
        envs = await later[0].make_envs()
        await dataset.aclose()
        return {
            "selections": [list(s) for s in dataset.selections],
            "later_prompt": later[0].prompt_id,
            "later_step": later[0].step,
            "earlier_started": earlier[0].inner is not None,
            "envs": len(envs),
        }

    report["order"] = asyncio.run(later_first())

    # 5. Mistakes: each stops the example's run with what to do.
    SERVICE = Service()
    report["mistakes"] = {
        "group_size": refusal(argv(args.dataset, "mistake-group", 1, f"dataset_builder.group_size={N + 2}")),
        "url_with_a_path": refusal(
            argv(args.dataset + "-new", "mistake-url", 1, f"dataset_builder.url={args.url}/api")
        ),
        "reward_key": refusal(
            argv(
                args.dataset + "-key",
                "mistake-key",
                2,
                "dataset_builder.reward_key=accuracy",
                "rollout_error_tolerance=True",
            )
        ),
    }
    report["observed"] = dict(observed)
    common.emit(report)


if __name__ == "__main__":
    main()
