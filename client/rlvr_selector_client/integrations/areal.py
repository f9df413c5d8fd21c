"""AReaL adapter: fully asynchronous RL with prompts chosen by the selector service (AReaL 1.0).

AReaL's rollout runs ahead of training: its dispatcher keeps pulling prompts from the train data loader
and submits episodes while earlier ones are still generating, bounded by
``rollout.max_head_offpolicyness`` (how many weight versions a rollout may lag). So step s+1 (and s+2)
is selected before the rewards of step s are in, and each group's rewards arrive whenever its episode
finishes. Three pieces handle that:

`SelectorSampler`
    The train data loader's sampler. Each data-loader batch is one service step: the first time a
    batch's index is needed the sampler calls ``/select`` for the next step (with the global batch size;
    rank r of W takes every W-th prompt) and yields the chosen rows. It yields *codes*
    ``step * len(dataset) + row`` that `SelectorDataset` decodes, so every item carries the step it was
    selected at, however late its episode finishes. It checkpoints its position with the data loader
    (``StatefulDataLoader.state_dict``), so a resumed run neither repeats nor skips a selected step.

`SelectorDataset`
    Wraps the train dataset: item ``code`` is row ``code % len`` with ``selector_step`` and
    ``selector_prompt_id`` added.

`SelectorWorkflow`
    Wraps any AReaL ``RolloutWorkflow`` (e.g. ``RLVRWorkflow``). It runs the wrapped workflow on the row
    without the ``selector_*`` fields, and collects the ``rewards`` of each finished sample under its
    (step, prompt); when the group's ``group_size`` samples (``gconfig.n_samples``; AReaL runs the
    workflow once per sample) have finished, it reports them to ``/observe`` for the step the group was
    selected at, with request id ``{run_id}-s{step}-p{prompt}``: exactly once, whenever it finishes. A
    sample whose workflow returns None (rejected) counts as finished without a reward.

Results arrive late: `SelectorPPOTrainer` creates the service dataset with ``max_lag =
rollout.max_head_offpolicyness + 2`` (the versions a rollout may lag, plus the step the loader selects
ahead and the one being trained), and every report carries its ``selected_step``, so a group that
finishes later still (an episode that spans several weight updates: AReaL bounds when an episode
starts, not when it ends) is filed at the service's open step instead of refused. A report the service
refuses nonetheless (409) is logged and counted in ``lost`` instead of failing the episode. A resumed
run re-issues nothing: AReaL's checkpoint holds the data loader's state and no rollout
(areal/utils/recover.py, ``RecoverInfo``), so episodes in flight at a crash die unfinished and are never
reported, and the sampler resumes at the service's open step.

`SelectorPPOTrainer`
    ``areal.PPOTrainer`` whose train data loader is built from the three pieces above (the validation
    loader is AReaL's). Pass ``selector=SelectorOptions(...)``, and wrap the workflow you give
    ``train()`` in `SelectorWorkflow` (``trainer.selector_workflow(workflow)`` does it with the right
    client, dataset and group size).

Usage (an AReaL GSM8K GRPO script)::

    from rlvr_selector_client.integrations.areal import SelectorOptions, SelectorPPOTrainer

    with SelectorPPOTrainer(config, train_dataset=train, valid_dataset=valid,
                            selector=SelectorOptions(url="http://selector:8000", dataset="gsm8k-areal")) as trainer:
        workflow = trainer.selector_workflow(RLVRWorkflow(reward_fn=gsm8k_reward_fn, gconfig=config.gconfig,
                                                           tokenizer=trainer.tokenizer))
        trainer.train(workflow)

The train dataset needs an integer column (default ``prompt_id``) holding a permutation of
``0..len-1``: it is the service's prompt id.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence, Sized
from typing import Any

from torch.utils.data import Dataset, Sampler

from rlvr_selector_client.client import AsyncSelectorClient, Conflict, SelectorClient
from rlvr_selector_client.integrations import (
    DEFAULT_STRATEGY,
    SelectedStep,
    SelectorOptions,
    StepIterator,
    StepSampler,
    check_permutation,
    ensure_dataset,
    log_too_late,
    new_run_id,
    observe_exactly_once_async,
    one_group,
)

try:
    from areal.api.workflow_api import RolloutWorkflow as _WorkflowBase
except ImportError:  # AReaL absent: the same methods on a plain class, for custom loops
    _WorkflowBase = object  # type: ignore[assignment,misc]

__all__ = [  # and SelectorPPOTrainer, built on first access (it subclasses AReaL's)
    "SelectorDataset",
    "SelectorOptions",
    "SelectorSampler",
    "SelectorWorkflow",
    "selector_dataloader",
]

logger = logging.getLogger(__name__)

STEP_KEY = "selector_step"
PROMPT_KEY = "selector_prompt_id"


class SelectorSampler(StepSampler, Sampler[int]):
    """The train data loader's sampler: one service step per data-loader batch (see the module docstring).

    ``batch_size`` is this rank's data-loader batch size; the step selects ``batch_size * world_size``
    prompts and rank ``rank`` takes every ``world_size``-th of them. ``row_of`` maps a prompt id to its
    dataset row (identity when omitted).
    """

    def __init__(
        self,
        data_source: Sized,
        batch_size: int,
        *,
        client: SelectorClient,
        dataset: str,
        strategy: str = DEFAULT_STRATEGY,
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
        start_step: int = 0,
        rank: int = 0,
        world_size: int = 1,
        row_of: Mapping[int, int] | None = None,
    ) -> None:
        self.size = len(data_source)
        if batch_size < 1 or batch_size * world_size > self.size:
            raise ValueError(
                f"batch size {batch_size} x {world_size} ranks does not fit the {self.size} prompts of the dataset"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        self.batch_size = batch_size
        self.client = client
        self.options = SelectorOptions(
            dataset=dataset, client=client, strategy=strategy, params=dict(params or {}), seed=seed
        )
        self.next_step = start_step
        self.rank = rank
        self.world_size = world_size
        self.row_of = row_of
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return self.steps_per_epoch() * self.batch_size

    def steps_per_epoch(self) -> int:
        return self.size // (self.batch_size * self.world_size)

    def __iter__(self) -> Iterator[int]:
        return StepIterator(self, self.steps_per_epoch())

    def select_step(self) -> SelectedStep:
        """Select the next step; the codes of this rank's share of it."""
        with self.lock:
            step, selection = self.select(self.batch_size * self.world_size)
        mine = selection.prompt_ids[self.rank :: self.world_size]
        rows = mine if self.row_of is None else [self.row_of[pid] for pid in mine]
        return SelectedStep(step, [step * self.size + row for row in rows])


class SelectorDataset(Dataset):
    """Decodes the sampler's codes: row ``code % len`` plus ``selector_step`` and ``selector_prompt_id``."""

    def __init__(self, dataset: Any, id_column: str = "prompt_id") -> None:
        self.dataset = dataset
        self.id_column = id_column

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, code: int) -> dict[str, Any]:
        step, row = divmod(int(code), len(self.dataset))
        item = dict(self.dataset[row])
        item[STEP_KEY] = step
        item[PROMPT_KEY] = int(item[self.id_column])
        return item


def selector_dataloader(
    dataset: Any,
    batch_size: int,
    *,
    client: SelectorClient,
    options: SelectorOptions,
    start_step: int,
    rank: int = 0,
    world_size: int = 1,
    num_workers: int = 0,
    collate_fn: Any = None,
) -> Any:
    """A ``StatefulDataLoader`` over `SelectorDataset` with a `SelectorSampler` (what AReaL's
    ``create_dataloader`` builds with a DistributedSampler)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    if num_workers:
        raise ValueError(
            f"num_workers={num_workers}: worker processes would select steps in copies of the sampler; "
            "use num_workers=0 with the selector"
        )
    ids = [dataset[row][options.id_column] for row in range(len(dataset))]
    row_of = check_permutation(ids, f"train dataset column {options.id_column!r}")
    sampler = SelectorSampler(
        dataset,
        batch_size,
        client=client,
        dataset=options.dataset,
        strategy=options.strategy,
        params=options.params,
        seed=options.seed,
        start_step=start_step,
        rank=rank,
        world_size=world_size,
        row_of=row_of,
    )
    return StatefulDataLoader(
        SelectorDataset(dataset, options.id_column),
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=0,
        collate_fn=collate_fn or (lambda items: items),
    )


class SelectorWorkflow(_WorkflowBase):  # type: ignore[misc,valid-type]
    """Runs a wrapped AReaL workflow and reports each finished group (see the module docstring)."""

    def __init__(
        self,
        workflow: Any,
        *,
        url: str,
        dataset: str,
        group_size: int,
        run_id: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int = 5,
    ) -> None:
        if group_size < 1:
            raise ValueError("group_size must be >= 1")
        self.workflow = workflow
        self.url = url
        self.dataset = dataset
        self.group_size = group_size
        self.run_id = new_run_id(run_id, "areal")
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.pending: dict[tuple[int, int], list[Any]] = {}
        self.lock = threading.Lock()
        self.reported: list[tuple[int, int, int]] = []  # (step, prompt id, lag)
        self.lost: list[tuple[int, int]] = []
        self.samples_started = 0
        self.samples_finished = 0
        self._clients: dict[int, AsyncSelectorClient] = {}

    def _client(self) -> AsyncSelectorClient:
        # httpx's async client belongs to the event loop it was created on; AReaL's rollout runs on its own.
        loop = asyncio.get_running_loop()
        client = self._clients.get(id(loop))
        if client is None:
            client = AsyncSelectorClient(
                self.url, token=self.token, timeout=self.timeout, retries=self.retries
            )
            self._clients[id(loop)] = client
        return client

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> Any:
        if STEP_KEY not in data:
            raise KeyError(
                f"the row has no {STEP_KEY!r}: the train data loader must be the selector's (SelectorPPOTrainer "
                "or selector_dataloader)"
            )
        step, prompt_id = int(data[STEP_KEY]), int(data[PROMPT_KEY])
        row = {k: v for k, v in data.items() if k not in (STEP_KEY, PROMPT_KEY)}
        rewards: list[float] = []
        self.samples_started += 1
        try:
            trajectory = await self.workflow.arun_episode(engine, row)
            rewards = _rewards_of(trajectory)
        finally:
            await self._finish_sample(step, prompt_id, rewards)
        return trajectory

    @property
    def in_flight(self) -> int:
        """Samples started and not finished yet, plus groups finished and not yet reported."""
        with self.lock:
            return self.samples_started - self.samples_finished

    async def _finish_sample(self, step: int, prompt_id: int, rewards: Sequence[float]) -> None:
        try:
            with self.lock:
                group = self.pending.setdefault((step, prompt_id), [0, []])
                group[0] += 1
                group[1].extend(rewards)
                if group[0] < self.group_size:
                    return
                del self.pending[(step, prompt_id)]
                values = list(group[1])
            if values:  # a group whose samples were all rejected has nothing to report
                await self._report(step, prompt_id, values)
        finally:
            with self.lock:
                self.samples_finished += 1

    async def _report(self, step: int, prompt_id: int, values: list[float]) -> None:
        results, request_id = one_group(self.run_id, step, prompt_id, values)
        try:
            ack = await observe_exactly_once_async(
                self._client(), self.dataset, step, results, request_id, selected_step=step
            )
        except Conflict as exc:
            log_too_late(
                prompt_id,
                step,
                exc.detail,
                "raise the dataset's max_lag above rollout.max_head_offpolicyness + 1",
            )
            self.lost.append((step, prompt_id))
            return
        self.reported.append((step, prompt_id, ack.lag))

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()


def _rewards_of(trajectory: Any) -> list[float]:
    """The rewards of one finished sample: the ``rewards`` entry of AReaL's trajectory dict."""
    if trajectory is None:
        return []
    if not isinstance(trajectory, Mapping) or "rewards" not in trajectory:
        raise TypeError(
            "SelectorWorkflow reports the 'rewards' tensor of the wrapped workflow's trajectory dict; "
            f"got {type(trajectory).__name__}"
        )
    value = trajectory["rewards"]
    values = value.flatten().tolist() if hasattr(value, "flatten") else list(value)
    return [float(v) for v in values]


def _trainer_class() -> type:
    from areal import PPOTrainer
    from areal.api.cli_args import TrainDatasetConfig

    class SelectorPPOTrainer(PPOTrainer):  # type: ignore[misc,valid-type]
        """``areal.PPOTrainer`` with the selector's train data loader (see the module docstring)."""

        def __init__(self, config: Any, *args: Any, selector: SelectorOptions, **kwargs: Any) -> None:
            self.selector = selector
            if not selector.url:
                raise ValueError("SelectorOptions.url is needed: the rollout workflow opens its own clients")
            self.selector_client = selector.connect()
            self.selector_client.check_server()
            rollout = getattr(config, "rollout", None)
            staleness = int(getattr(rollout, "max_head_offpolicyness", 0) or 0)
            self.selector_max_lag = selector.max_lag if selector.max_lag is not None else staleness + 2
            super().__init__(config, *args, **kwargs)

        def _create_dataloader(self, dataset: Any, dataset_config: Any, rank: int, world_size: int) -> Any:
            if not isinstance(dataset_config, TrainDatasetConfig):
                return super()._create_dataloader(dataset, dataset_config, rank, world_size)
            group_size = int(self.config.gconfig.n_samples)
            start = ensure_dataset(
                self.selector_client,
                self.selector,
                len(dataset),
                group_size,
                max_lag=self.selector_max_lag,
                group_option="gconfig.n_samples",
            )
            return selector_dataloader(
                dataset,
                dataset_config.batch_size // world_size,
                client=self.selector_client,
                options=self.selector,
                start_step=start,
                rank=rank,
                world_size=world_size,
                num_workers=dataset_config.num_workers,
            )

        def selector_workflow(self, workflow: Any) -> SelectorWorkflow:
            return SelectorWorkflow(
                workflow,
                url=self.selector.url,
                dataset=self.selector.dataset,
                group_size=int(self.config.gconfig.n_samples),
                run_id=self.selector.run_id,
                token=self.selector.token,
            )

    return SelectorPPOTrainer


def __getattr__(name: str) -> Any:
    # The trainer subclasses AReaL's, so it exists only where AReaL imports.
    if name == "SelectorPPOTrainer":
        return _trainer_class()
    raise AttributeError(name)
