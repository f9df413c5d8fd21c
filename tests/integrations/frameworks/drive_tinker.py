"""Drive the Tinker cookbook's RL loop (``tinker_cookbook.rl.train.main``) on CPU against a real selector
service, in the tinker venv.

The cookbook's own code runs everything on the client side: its config, dataset builder call, sync and
asynchronous training loops, ``do_group_rollout`` with its rollout strategy, ``ProblemEnv`` /
``ProblemGroupBuilder`` environments graded by the cookbook's ``role_colon`` renderer, advantages,
datum assembly, checkpoints (``checkpoints.jsonl``), resume and metrics logging. Faked, because it is a
remote GPU service: the Tinker service behind the SDK's client objects (``tinker.ServiceClient`` and the
training and sampling clients it makes): sampling answers from `common.Policy` (right or wrong by prompt,
the same in every run), training returns the sampled log-probs and a loss.

Three runs, reported together:

- ``sync``: 2 steps with a checkpoint after each, then a third whose training fails after its groups were
  rolled out and reported (the process "dies" there); a new ``main`` on the same log path resumes from
  the checkpoint of batch 2 and trains batches 2 and 3.
- ``budget``: 2 synchronous steps with a rollout budget: each group has the size the service gave it.
- ``async``: ``AsyncConfig(max_steps_off_policy=1)`` on a dataset with ``max_lag=2``; groups finish after
  the next step was selected, and one group of the first step only answers once the training client has
  made three updates, so it reports later than ``max_lag``.

Usage: python drive_tinker.py --url URL --dataset NAME --workdir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import uuid
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.integrations.frameworks import common

MODEL = "selector-test/tiny"
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
        return FakeTrainingClient()

    async def create_training_client_from_state_with_optimizer(self, path: str, **kwargs: Any) -> Any:
        return FakeTrainingClient(int(path.rsplit("/v", 1)[1]))

    async def create_training_client_from_state(self, path: str, **kwargs: Any) -> Any:
        return await self.create_training_client_from_state_with_optimizer(path)

    def create_sampling_client(self, *args: Any, **kwargs: Any) -> Any:
        return _future(FakeSamplingClient(0))

    def create_rest_client(self) -> Any:
        return self


# ---------------------------------------------------------------------------------------------------
# The user's side: prompts as the cookbook's ProblemEnv groups
# ---------------------------------------------------------------------------------------------------


def build_prompts(scored: list[list[float]]) -> Any:
    import chz
    from tinker_cookbook import renderers
    from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    from rlvr_selector_client.integrations.tinker import PromptGroups, PromptGroupsBuilder

    class QuestionEnv(ProblemEnv):
        def __init__(self, prompt_id: int, renderer: Any) -> None:
            super().__init__(renderer, format_coef=0.0)
            self.prompt_id = prompt_id

        def get_question(self) -> str:
            return common.question(self.prompt_id)

        def check_answer(self, sample_str: str) -> bool:
            right = f"#### {common.answer_of(self.prompt_id)}" in sample_str
            scored.append([self.prompt_id, 1.0 if right else 0.0])
            return right

        def check_format(self, sample_str: str) -> bool:
            return True

        def get_reference_answer(self) -> str:
            return str(common.answer_of(self.prompt_id))

    class Questions(PromptGroups):
        def __init__(self, renderer: Any) -> None:
            self.renderer = renderer

        def __len__(self) -> int:
            return SIZE

        def group(self, prompt_id: int, group_size: int) -> Any:
            return ProblemGroupBuilder(
                env_thunk=partial(QuestionEnv, prompt_id, self.renderer),
                num_envs=group_size,
                dataset_name="questions",
            )

    @chz.chz
    class QuestionsBuilder(PromptGroupsBuilder):
        model_name_for_tokenizer: str
        renderer_name: str = "role_colon"

        async def __call__(self) -> PromptGroups:
            tok = get_tokenizer(self.model_name_for_tokenizer)
            return Questions(renderers.get_renderer(self.renderer_name, tokenizer=tok))

    return QuestionsBuilder(model_name_for_tokenizer=MODEL)


# ---------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------


def run(config: Any) -> dict[str, Any]:
    """``train.main(config)``; what the fake service trained on and whether the run died."""
    from tinker_cookbook.rl import train

    service = SERVICE
    assert service is not None
    died = None
    try:
        asyncio.run(train.main(config))
    except Crash as exc:
        died = str(exc)
    return {"died": died, "updates": [list(u) for u in service.trained]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import tinker
    from tinker_cookbook.rl import train
    from tinker_cookbook.tokenizer_utils import register_tokenizer

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

    def config(name: str, log: str, scored: list[list[float]], steps: int, **extra: Any) -> Any:
        builder_extra = extra.pop("builder", {})
        return train.Config(
            learning_rate=1e-5,
            dataset_builder=adapter.SelectorDatasetBuilder(
                prompts=build_prompts(scored),
                url=args.url,
                dataset=name,
                groups_per_batch=G,
                group_size=N,
                seed=3,
                **builder_extra,
            ),
            model_name=MODEL,
            recipe_name="selector_test",
            max_tokens=32,
            log_path=str(Path(args.workdir) / log),
            eval_every=0,
            save_every=1,
            num_groups_to_log=0,
            rollout_json_export=False,
            max_steps=steps,
            **extra,
        )

    def summary(dataset: Any) -> dict[str, Any]:
        return {
            "run_id": dataset.run_id,
            "selections": [list(s) for s in dataset.selections],
            "reported": [list(r) for r in dataset.reported],
            "lost": [list(x) for x in dataset.lost],
        }

    global SERVICE
    report: dict[str, Any] = {"tinker_cookbook": metadata.version("tinker-cookbook")}

    # 1. Synchronous: two steps, a third that dies in training, and a resume.
    SERVICE = Service()
    SERVICE.fail_at_update = 2
    scored: list[list[float]] = []
    first = run(config(args.dataset, "sync", scored, steps=4))
    first.update(summary(opened[-1]))
    SERVICE.fail_at_update = None
    resumed = run(config(args.dataset, "sync", scored, steps=4))
    resumed.update(summary(opened[-1]))
    report["sync"] = {"runs": [first, resumed], "scored": list(scored)}

    # 2. A rollout budget: 10 rollouts per step over the 3 prompts, 2 to 6 each.
    SERVICE = Service()
    scored = []
    budget = run(
        config(
            args.dataset + "-budget",
            "budget",
            scored,
            steps=2,
            builder={"rollout_budget": 10, "rollout_min": 2, "rollout_max": 6},
        )
    )
    budget.update(summary(opened[-1]))
    report["budget"] = {"runs": [budget], "scored": list(scored)}

    # 3. Asynchronous, one step off policy; a group of the first step answers after three updates.
    SERVICE = Service()
    scored = []
    max_lag = 2
    cfg = config(
        args.dataset + "-async",
        "async",
        scored,
        steps=4,
        async_config=train.AsyncConfig(max_steps_off_policy=1, groups_per_batch=G),
        builder={"max_lag": max_lag},
    )
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
    late = run(cfg)
    late.update(summary(opened[-1]))
    report["async"] = {"runs": [late], "scored": list(scored), "max_lag": max_lag, "held": held}

    # 4. The order of selections when a later batch's group starts first (a rollout worker of the
    # asynchronous loop may take it before the earlier batch's): step s is still selected before s + 1.
    async def later_first() -> dict[str, Any]:
        groups = await build_prompts([])()
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
    common.emit(report)


if __name__ == "__main__":
    main()
