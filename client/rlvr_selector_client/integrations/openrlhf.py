"""OpenRLHF adapter: ``train_ppo_ray`` with prompts chosen by the selector service (OpenRLHF 0.11).

OpenRLHF has no sampler plugin. Its prompt loader is built inside the ``PPOTrainer`` Ray actor
(``prepare_datasets``: ``PromptDataset`` and a shuffling ``StatefulDataLoader``), its rollout is pulled
by ``SamplesGenerator`` from that loader, and its user hooks run elsewhere: ``--reward.remote_url`` (an
HTTP reward server, or a ``.py`` file with ``reward_func(queries, prompts, labels)``) and
``--train.agent_func_path`` run inside the vLLM engine actors, one sample at a time, without the step,
the group or the prompt's row. They can compute rewards but cannot choose prompts, so a reward hook
alone cannot do selection before rollout. The data file cannot either (it is read once).

So this module is a thin entry point around OpenRLHF's own ``openrlhf.cli.train_ppo_ray`` (its own
argument parser, checks and ``train()``), with one substitution: the trainer actor is
`SelectorPPOTrainer`, OpenRLHF's ``PPOTrainer`` whose

- prompt loader is OpenRLHF's ``PromptDataset`` over the same rows, loaded by OpenRLHF's
  ``strategy.setup_dataloader`` with `SelectorPromptSampler`: each step (``--rollout.batch_size``
  prompts) is chosen by ``/select`` when its first prompt is needed;
- sample generator is `SelectorSamplesGenerator`: every response passes through it before dynamic
  filtering (``--algo.dynamic_filtering_enable``) can drop its group, and once the
  ``--rollout.n_samples_per_prompt`` responses of a prompt are in, their rewards go to ``/observe``
  for the step that prompt was selected at, with request id ``{run_id}-s{step}-p{prompt}``. Filtered
  groups are reported too; the replacement prompts dynamic filtering pulls are the next step's
  selection, so with filtering on, groups can be reported after later steps were selected: the
  service dataset is created with ``max_lag`` (default 2 with filtering, 0 without).

Rewards are the ones OpenRLHF's rollout computed (``scores``, falling back to ``reward``; set
``--selector.reward_key reward`` for the other), so the run needs ``--reward.remote_url`` or
``--train.agent_func_path``; with a reward *model* the reward is computed after rollout, and the
adapter refuses to start. Evaluation rollouts are not reported. ``--train.async_enable`` (its
generator actor builds its own loader) is refused.

Resuming: the sampler's position and next step are part of ``prompts_dataloader.state_dict()``, which
OpenRLHF saves in every checkpoint and loads on ``--ckpt.load_enable``; a resumed run continues at the
step after the last selected one.

The train data needs an integer column (``--selector.id_column``, default ``prompt_id``) holding a
permutation of ``0..N-1`` over the rows OpenRLHF loads (after ``--data.max_samples``): the service's
prompt id.

Launch: OpenRLHF's usual arguments, plus ``--selector.*``::

    python -m rlvr_selector_client.integrations.openrlhf \\
        --selector.url http://selector:8000 --selector.dataset gsm8k-openrlhf --selector.strategy insight \\
        --actor.model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --data.prompt_dataset data/gsm8k.jsonl \\
        --data.input_key question --data.label_key answer --data.apply_chat_template \\
        --reward.remote_url reward_gsm8k.py --algo.advantage.estimator group_norm \\
        --rollout.batch_size 128 --rollout.n_samples_per_prompt 8 --vllm.num_engines 4 ...

Every ``--selector.KEY`` is a `SelectorOptions` field (``params`` as JSON); ``SELECTOR_URL``,
``SELECTOR_DATASET``, ``SELECTOR_STRATEGY``, ``SELECTOR_SEED`` and ``SELECTOR_API_TOKEN`` fill what the
command line leaves out. The options reach the trainer actor through Ray's runtime environment
(``SELECTOR_OPTIONS``), so they hold on a multi-node cluster too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import runpy
import sys
from collections import defaultdict, deque
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from typing import Any

from torch.utils.data import Sampler

from rlvr_selector_client.client import Conflict, SelectorClient
from rlvr_selector_client.integrations import (
    SelectedStep,
    SelectorOptions,
    StepIterator,
    StepSampler,
    check_permutation,
    ensure_dataset,
    framework_version,
    log_too_late,
    new_run_id,
    observe_exactly_once,
    one_group,
)

__all__ = [  # and SelectorPPOTrainer / SelectorSamplesGenerator, built on first access
    "OPTIONS_ENV",
    "GroupReporter",
    "SelectorPromptSampler",
    "install",
    "main",
    "options_from_env",
]

logger = logging.getLogger(__name__)

OPTIONS_ENV = "SELECTOR_OPTIONS"
SUPPORTED_OPENRLHF = ">=0.11"


def options_from_env(environ: Mapping[str, str]) -> SelectorOptions:
    """The options `main` put in ``SELECTOR_OPTIONS`` (JSON), else the ``SELECTOR_*`` variables."""
    raw = environ.get(OPTIONS_ENV)
    if raw:
        return SelectorOptions.resolve(json.loads(raw), environ, where="--selector")
    return SelectorOptions.resolve({}, environ, where="--selector")


def _options_json(options: SelectorOptions) -> str:
    values = {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name != "client"}
    return json.dumps(values)


# --------------------------------------------------------------------------------------------------
# Selection before rollout
# --------------------------------------------------------------------------------------------------


class SelectorPromptSampler(StepSampler, Sampler[int]):
    """Rows of OpenRLHF's ``PromptDataset``, one service step of ``batch_size`` prompts at a time.

    ``prompts`` are the dataset's prompt texts (what the rollout echoes back) and ``prompt_ids`` the
    service id of each row. Every row handed to the loader is remembered as in flight under its text
    until `claim` takes it, so a group's rewards find the step and id its prompt was selected with.
    """

    def __init__(
        self,
        prompts: Sequence[str],
        prompt_ids: Sequence[int],
        batch_size: int,
        *,
        client: SelectorClient,
        options: SelectorOptions,
        start_step: int,
        run_id: str,
    ) -> None:
        if len(prompts) != len(prompt_ids):
            raise ValueError(f"{len(prompts)} prompts but {len(prompt_ids)} prompt ids")
        self.row_of = check_permutation(prompt_ids, f"train data column {options.id_column!r}")
        self.id_of_row = [int(i) for i in prompt_ids]
        self.prompts = list(prompts)
        if not 1 <= batch_size <= len(self.prompts):
            raise ValueError(
                f"--rollout.batch_size {batch_size} does not fit the {len(self.prompts)} prompts of the dataset"
            )
        self.batch_size = batch_size
        self.client = client
        self.options = options
        self.next_step = start_step
        self.run_id: str = run_id
        self.in_flight: dict[str, deque[tuple[int, int]]] = defaultdict(deque)

    def __len__(self) -> int:
        return self.steps_per_epoch() * self.batch_size

    def steps_per_epoch(self) -> int:
        return len(self.prompts) // self.batch_size

    def __iter__(self) -> Iterator[int]:
        return StepIterator(self, self.steps_per_epoch())

    def select_step(self) -> SelectedStep:
        step, selection = self.select(self.batch_size)
        return SelectedStep(step, [self.row_of[pid] for pid in selection.prompt_ids])

    def handed_out(self, step: int, item: int, count: int | None) -> None:
        self.in_flight[self.prompts[item]].append((step, self.id_of_row[item]))

    def claim(self, prompt: str) -> tuple[int, int]:
        """(step, prompt id) of the oldest in-flight row with this prompt text."""
        queue = self.in_flight.get(prompt)
        if not queue:
            raise RuntimeError(
                "a rollout came back for a prompt the selector never handed out; is the trainer's prompt "
                f"loader the selector's? prompt starts {prompt[:80]!r}"
            )
        found = queue.popleft()
        if not queue:
            del self.in_flight[prompt]
        return found


# --------------------------------------------------------------------------------------------------
# Reporting after rollout
# --------------------------------------------------------------------------------------------------


def _scalar(value: Any) -> float:
    if hasattr(value, "flatten"):
        flat = value.flatten().tolist()
        if len(flat) != 1:
            raise ValueError(f"a sample's reward has {len(flat)} values; expected one")
        return float(flat[0])
    if isinstance(value, list | tuple):
        if len(value) != 1:
            raise ValueError(f"a sample's reward has {len(value)} values; expected one")
        return float(value[0])
    return float(value)


class GroupReporter:
    """Collects each rollout response's reward under its prompt and reports full groups.

    ``reward_key`` is the response field reported (``scores`` falls back to ``reward`` when absent).
    """

    def __init__(
        self,
        sampler: SelectorPromptSampler,
        *,
        client: SelectorClient,
        dataset: str,
        group_size: int,
        reward_key: str = "scores",
    ) -> None:
        if group_size < 1:
            raise ValueError("group_size must be >= 1")
        if reward_key not in ("scores", "reward"):
            raise ValueError(f"reward_key {reward_key!r}: OpenRLHF's rollout gives 'scores' and 'reward'")
        self.sampler = sampler
        self.client = client
        self.dataset = dataset
        self.group_size = group_size
        self.reward_key = reward_key
        self.partial: dict[str, list[float]] = {}
        self.reported: list[tuple[int, int, int]] = []  # (step, prompt id, lag)
        self.lost: list[tuple[int, int]] = []

    def add(self, response: Mapping[str, Any]) -> None:
        value = response.get(self.reward_key)
        if value is None and self.reward_key == "scores":
            value = response.get("reward")
        if value is None:
            raise RuntimeError(
                "OpenRLHF's rollout returned no reward for a sample: the selector reports the rewards computed "
                "during rollout, so launch with --reward.remote_url (an HTTP reward server or a reward_func "
                ".py file) or --train.agent_func_path, and check that reward call succeeds"
            )
        prompt = response["prompt"]
        values = self.partial.setdefault(prompt, [])
        values.append(_scalar(value))
        if len(values) < self.group_size:
            return
        del self.partial[prompt]
        step, prompt_id = self.sampler.claim(prompt)
        self._report(step, prompt_id, values)

    def _report(self, step: int, prompt_id: int, values: list[float]) -> None:
        results, request_id = one_group(self.sampler.run_id, step, prompt_id, values)
        try:
            # selected_step: a group reported more than max_lag steps after its selection (dynamic
            # filtering pulls the next steps' prompts while a step's groups run) is filed at the open step.
            ack = observe_exactly_once(
                self.client, self.dataset, step, results, request_id, selected_step=step
            )
        except Conflict as exc:
            log_too_late(prompt_id, step, exc.detail, "create the dataset with a larger --selector.max_lag")
            self.lost.append((step, prompt_id))
            return
        self.reported.append((step, prompt_id, ack.lag))


# --------------------------------------------------------------------------------------------------
# The trainer actor (built lazily: it subclasses OpenRLHF's, and Ray imports it by reference)
# --------------------------------------------------------------------------------------------------

_CLASSES: dict[str, type] = {}


def _plain_class(actor_class: Any) -> type:
    """The Python class under a ``@ray.remote`` actor class."""
    found = getattr(actor_class, "__ray_actor_class__", None)
    if found is not None:
        return found
    metadata_ = getattr(actor_class, "__ray_metadata__", None)
    return metadata_.modified_class if metadata_ is not None else actor_class


def check_args(args: Any) -> None:
    """Refuse OpenRLHF settings the selector cannot honour."""
    if getattr(args.train, "async_enable", False):
        raise ValueError(
            "--train.async_enable: OpenRLHF's asynchronous trainer builds its prompt loader in a separate "
            "generator actor the selector does not replace; run the synchronous trainer"
        )
    if not (getattr(args.reward, "remote_url", None) or getattr(args.train, "agent_func_path", None)):
        raise ValueError(
            "the selector reports the rewards OpenRLHF computes during rollout: set --reward.remote_url (an "
            "HTTP reward server or a reward_func .py file) or --train.agent_func_path; a reward model scores "
            "only after rollout"
        )


def _build_classes() -> dict[str, type]:
    if _CLASSES:
        return _CLASSES
    import openrlhf.trainer.ppo_trainer as ppo
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    base = _plain_class(getattr(ppo.PPOTrainer, "_selector_base", ppo.PPOTrainer))

    class SelectorSamplesGenerator(SamplesGenerator):  # type: ignore[misc,valid-type]
        """OpenRLHF's ``SamplesGenerator`` that hands every training response to a `GroupReporter`
        before dynamic filtering can drop it (evaluation responses are not reported)."""

        def __init__(self, *args: Any, reporter: GroupReporter, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.reporter = reporter
            self._evaluating = False

        def generate_eval_samples(self, **generate_kwargs: Any) -> Any:
            self._evaluating = True
            try:
                return super().generate_eval_samples(**generate_kwargs)
            finally:
                self._evaluating = False

        def _process_response_into_experience(self, response: Any, **generate_kwargs: Any) -> Any:
            if not self._evaluating:
                self.reporter.add(response)
            return super()._process_response_into_experience(response, **generate_kwargs)

    class SelectorPPOTrainer(base):  # type: ignore[misc,valid-type]
        """OpenRLHF's synchronous ``PPOTrainer`` with the selector's prompt loader and reporting."""

        def __init__(self, pretrain: str, strategy: Any, *args: Any, **kwargs: Any) -> None:
            check_args(strategy.args)
            super().__init__(pretrain, strategy, *args, **kwargs)
            a = strategy.args
            options = options_from_env(os.environ)
            self.selector_options = options
            client = options.connect()
            client.check_server()
            self.selector_client = client

            # The rows OpenRLHF trained on, loaded again with its own functions to read the id column.
            train_data = blending_datasets(
                a.data.prompt_dataset,
                a.data.prompt_probs,
                strategy,
                a.train.seed,
                max_count=a.data.max_samples,
                dataset_split=a.data.prompt_split,
            )
            train_data = train_data.select(range(min(a.data.max_samples, len(train_data))))
            if options.id_column not in train_data.column_names:
                raise ValueError(
                    f"the train data has no {options.id_column!r} column; add an integer column holding "
                    "0..N-1 (the service's prompt id) or name yours with --selector.id_column"
                )
            ids = list(train_data[options.id_column])
            dataset = PromptDataset(
                train_data, self.tokenizer, strategy, input_template=a.data.input_template
            )
            if dataset.prompts != self.prompts_dataloader.dataset.prompts:
                raise RuntimeError(
                    "the prompts reloaded for the selector differ from the trainer's; OpenRLHF's "
                    "prepare_datasets changed how it loads data"
                )
            group_size = int(a.rollout.n_samples_per_prompt)
            filtering = bool(getattr(a.algo, "dynamic_filtering_enable", False))
            max_lag = options.max_lag if options.max_lag is not None else (2 if filtering else 0)
            start = ensure_dataset(
                client,
                options,
                len(dataset),
                group_size,
                max_lag=max_lag,
                group_option="--rollout.n_samples_per_prompt",
            )
            self.selector_sampler = SelectorPromptSampler(
                dataset.prompts,
                ids,
                int(a.rollout.batch_size),
                client=client,
                options=options,
                start_step=start,
                run_id=new_run_id(options.run_id, "openrlhf"),
            )
            self.selector_reporter = GroupReporter(
                self.selector_sampler,
                client=client,
                dataset=options.dataset,
                group_size=group_size,
                reward_key=options.reward_key or "scores",
            )
            if getattr(a.data, "dataloader_num_workers", 0):
                logger.info(
                    "the selector's prompt loader runs without worker processes (they would prefetch)"
                )
            # OpenRLHF's own loader call, with the selector's sampler and no workers.
            self.prompts_dataloader = strategy.setup_dataloader(
                dataset, 1, True, True, dataset.collate_fn, sampler=self.selector_sampler, num_workers=0
            )
            self.samples_generator = SelectorSamplesGenerator(
                strategy=strategy,
                prompts_dataloader=self.prompts_dataloader,
                eval_dataloader=self.eval_dataloader,
                tokenizer=self.tokenizer,
                vllm_engines=self.vllm_engines,
                reporter=self.selector_reporter,
            )

        def selector_report(self) -> dict[str, Any]:
            """What was reported and lost (for logs and tests)."""
            return {
                "reported": list(self.selector_reporter.reported),
                "lost": list(self.selector_reporter.lost),
                "pending": sorted(self.selector_reporter.partial),
                "next_step": self.selector_sampler.next_step,
                "run_id": self.selector_sampler.run_id,
            }

    for cls in (SelectorSamplesGenerator, SelectorPPOTrainer):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
        _CLASSES[cls.__name__] = cls
    return _CLASSES


def __getattr__(name: str) -> Any:
    if name in ("SelectorPPOTrainer", "SelectorSamplesGenerator"):
        return _build_classes()[name]
    raise AttributeError(name)


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(SelectorOptions)}


def _convert(key: str, raw: str) -> Any:
    kind = str(_FIELD_TYPES[key])
    if key == "params":
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ValueError(f"--selector.params must be a JSON object, got {raw!r}")
        return value
    if kind.startswith("bool"):
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--selector.{key} takes true or false, got {raw!r}")
        return raw.lower() in ("true", "1")
    if kind.startswith("int"):
        return int(raw)
    if kind.startswith("float"):
        return float(raw)
    return raw


def split_selector_args(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``--selector.KEY VALUE`` / ``--selector.KEY=VALUE`` pairs as options, and the rest for OpenRLHF."""
    values: dict[str, Any] = {}
    rest: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if not item.startswith("--selector."):
            rest.append(item)
            i += 1
            continue
        key, has_value, raw = item[len("--selector.") :].partition("=")
        if not has_value:
            if i + 1 >= len(items):
                raise ValueError(f"{item} needs a value")
            raw = items[i + 1]
            i += 1
        i += 1
        if key not in _FIELD_TYPES or key == "client":
            known = sorted(k for k in _FIELD_TYPES if k != "client")
            raise ValueError(f"unknown option --selector.{key}; known: {', '.join(known)}")
        values[key] = _convert(key, raw)
    return values, rest


def install(options: SelectorOptions) -> type:
    """Make OpenRLHF's ``train()`` (in this process) build `SelectorPPOTrainer` with these options.

    Sets ``SELECTOR_OPTIONS`` here and, when this process starts Ray, in the job's runtime
    environment, so the trainer actor reads the same options wherever it runs. Returns the actor class.
    """
    import openrlhf.trainer.ppo_trainer as ppo
    import ray

    encoded = _options_json(options)
    os.environ[OPTIONS_ENV] = encoded
    classes = _build_classes()
    if not hasattr(ppo.PPOTrainer, "_selector_base"):
        actor = ray.remote(classes["SelectorPPOTrainer"])
        actor._selector_base = ppo.PPOTrainer  # type: ignore[attr-defined]
        ppo.PPOTrainer = actor
    if not ray.is_initialized():
        # OpenRLHF's train() skips its own ray.init when Ray is up: the same variables it sets, plus ours.
        ray.init(
            runtime_env={
                "env_vars": {
                    "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
                    "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
                    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get(
                        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"
                    ),
                    OPTIONS_ENV: encoded,
                }
            }
        )
    return ppo.PPOTrainer


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m rlvr_selector_client.integrations.openrlhf [--selector.KEY VALUE ...] <train_ppo_ray args>``"""
    version = framework_version("openrlhf")
    if version is None:
        raise SystemExit("OpenRLHF is not installed in this environment (pip install openrlhf)")
    if version < (0, 11):
        raise SystemExit(
            f"OpenRLHF {metadata.version('openrlhf')} is too old: the selector supports {SUPPORTED_OPENRLHF}"
        )
    try:
        values, rest = split_selector_args(sys.argv[1:] if argv is None else argv)
        options = SelectorOptions.resolve(values, os.environ, where="--selector")
    except ValueError as exc:
        raise SystemExit(f"selector options: {exc}") from None
    if "--train.async_enable" in rest:
        raise SystemExit(
            "--train.async_enable is not supported with the selector: OpenRLHF's asynchronous trainer builds its "
            "prompt loader in a generator actor this entry point does not replace"
        )
    install(options)
    sys.argv = ["openrlhf.cli.train_ppo_ray", *rest]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    # Run the imported module's main, so the classes Ray pickles belong to an importable module.
    from rlvr_selector_client.integrations.openrlhf import main as _main

    _main()
