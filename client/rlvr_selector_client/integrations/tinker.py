"""Tinker cookbook adapter: the cookbook's RL loop (``tinker_cookbook.rl.train``) trains on the prompts the
selector service picks (tinker-cookbook 0.6).

The cookbook's loop asks its dataset for one batch per step, ``RLDataset.get_batch(index)``, and gets one
``EnvGroupBuilder`` per prompt; each builder makes the group's environments (``make_envs``), grades the
finished group (``compute_group_rewards``) and releases it (``cleanup``) (tinker_cookbook/rl/types.py,
``EnvGroupBuilder`` and ``RLDataset``; the calls are ``do_group_rollout`` in tinker_cookbook/rl/rollouts.py).
So which prompts a step trains on, and how many rollouts each gets, are the dataset's to decide:

`SelectorRLDataset`
    Each ``get_batch`` call is the next service step: it returns ``groups_per_batch`` builders at once,
    without any network call (``get_batch`` is synchronous and the cookbook calls it on its event loop,
    tinker_cookbook/rl/train.py ``do_sync_training`` and ``do_async_training``'s ``dataloader_loop``).
    The step is selected when the first of its groups starts (``make_envs``), with the async client, so
    the selection sees every reward reported until then; steps are always selected in order, each waiting
    for the one before, so a worker that starts a later step first cannot make the service close a step
    that was not selected yet.

`SelectorEnvGroupBuilder`
    One slot of a step. On ``make_envs`` it takes its prompt from the step's selection and asks the user's
    `PromptGroups` for that prompt's builder with the group size: the selection's rollout count when the
    options give a ``rollout_budget``, else ``group_size``. Once the cookbook has graded the group
    (``compute_group_rewards``) it reports one reward per trajectory (`trajectory_reward`) to ``/observe``
    under the step the prompt was selected at (its ``selected_step``), request id
    ``{run_id}-s{step}-p{prompt}``, and ``cleanup`` (which the cookbook awaits, shielded from cancellation,
    before it hands the group to training) waits for the service's answer. A group whose rollout or
    grading failed reports nothing.

Which reward: an episode's reward in the cookbook is the sum of its step rewards (``Env.step``) plus the
group reward (``EnvGroupBuilder.compute_group_rewards``); ``TrajectoryGroup.get_total_rewards``
(tinker_cookbook/rl/types.py line 429) is what its advantages are computed from. Without ``reward_key``
that total is reported. It can mix a verifiable reward with shaping: ``ProblemEnv.step``
(tinker_cookbook/rl/problem_env.py line 130) gives ``format_coef * (format - 1) + correct``, so with the
default ``format_coef`` 0.1 a right answer that misses the format earns 0.9, unsolved under the
dataset's default ``success_threshold`` 1.0. ``reward_key`` names a metric to report instead (for
``ProblemEnv``, ``"correct"``): the trajectory's value in the group metrics ``compute_group_rewards``
returns, else in the metrics of its last transition that has it. A trajectory without that metric stops
the run with a message naming ``reward_key`` and the metrics it has.

Asynchronous (off-policy) training (``Config.async_config``) needs nothing more: a group that finishes
after later steps were selected is reported with the step it was selected for (``selected_step``), so the
service applies it as late evidence within the dataset's ``max_lag`` and files it at the open step past
that, never refuses it. Create the dataset with ``max_lag`` at least ``max_steps_off_policy + 2`` (the
default here is 2: enough for synchronous training and ``max_steps_off_policy=0``).

Resuming: the cookbook restarts from its last checkpoint and rebuilds the dataset; a new
`SelectorRLDataset` starts at the service step after the last one any run reported to
(``ensure_dataset``), so the batches the cookbook trains again are new selections at new steps, and the
groups the interrupted run reported stay counted once (their rollouts were real). Nothing is resent.

`SelectorDatasetBuilder`
    The ``chz`` builder to put in ``train.Config.dataset_builder``, like the cookbook's own builders: its
    ``prompts`` field is a `PromptGroupsBuilder` (yours) and the others are the selector settings.

Usage::

    from rlvr_selector_client.integrations.tinker import PromptGroups, PromptGroupsBuilder, SelectorDatasetBuilder

    @chz.chz
    class MathGroups(PromptGroupsBuilder):            # prompt id -> that problem's group of envs
        async def __call__(self) -> PromptGroups: ...

    config = train.Config(dataset_builder=SelectorDatasetBuilder(
        prompts=MathGroups(), url="http://selector:8000", dataset="math-tinker",
        groups_per_batch=64, group_size=16, reward_key="correct"), ...)

examples/tinker_grpo.py is a complete script.

Group size: ``group_size`` (the name the cookbook's recipes give it) is the service dataset's
``rollouts_per_prompt``; an existing dataset created with another is refused at start, naming both (with
a rollout budget every group has its own size, and nothing is compared). Settings the builder leaves out
come from the ``SELECTOR_*`` environment variables (`SelectorOptions`).

Limits: rollouts run in the training process (a rollout executor, ``set_rollout_executor``, would pickle
the builders to other processes, which cannot share the step's selection; the builder refuses to be
pickled). The reward reported is the grader's, before the cookbook's ``termination`` policy clamps
limit-stopped trajectories (that clamp happens after ``compute_group_rewards``, outside the builder); a
group whose every trajectory hit such a limit is not graded by the cookbook (``do_group_rollout``), and
reports nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import chz
from tinker_cookbook.rl.types import (
    Env,
    EnvGroupBuilder,
    Metrics,
    RLDataset,
    RLDatasetBuilder,
    Trajectory,
)

from rlvr_selector_client.client import AsyncSelectorClient, Conflict, Selection
from rlvr_selector_client.contract import DEFAULT_ROLLOUT_POLICY
from rlvr_selector_client.integrations import (
    SelectorOptions,
    ensure_dataset,
    log_too_late,
    new_run_id,
    observe_exactly_once_async,
    one_group,
)

__all__ = [
    "PromptGroups",
    "PromptGroupsBuilder",
    "SelectorDatasetBuilder",
    "SelectorEnvGroupBuilder",
    "SelectorOptions",
    "SelectorRLDataset",
    "trajectory_reward",
]

logger = logging.getLogger(__name__)

#: The dataset's max_lag when the options name none: synchronous training reports every group before the
#: next step is selected; asynchronous training with max_steps_off_policy=0 at most two steps late.
DEFAULT_MAX_LAG = 2

#: What the cookbook's recipes call the rollouts per prompt (the dataset's ``rollouts_per_prompt``).
GROUP_OPTION = "group_size"


def trajectory_reward(
    trajectory: Trajectory, group_reward: float, group_metrics: Metrics, reward_key: str | None
) -> float:
    """The reward reported for one graded trajectory: without ``reward_key`` its total (step rewards plus
    the group reward, as ``TrajectoryGroup.get_total_rewards``); with one, that metric's value in the
    group metrics, else in the metrics of the last transition that has it. Raises ValueError, naming
    ``reward_key`` and the metrics there are, when the trajectory has no such metric."""
    if reward_key is None:
        return sum(float(t.reward) for t in trajectory.transitions) + float(group_reward)
    if reward_key in group_metrics:
        return float(group_metrics[reward_key])
    for transition in reversed(trajectory.transitions):
        if reward_key in transition.metrics:
            return float(transition.metrics[reward_key])
    names = sorted({*group_metrics, *(k for t in trajectory.transitions for k in t.metrics)})
    raise ValueError(
        f"reward_key={reward_key!r}: the graded trajectory has no metric {reward_key!r} (its metrics: "
        f"{names}); set reward_key to the metric that holds the verifiable reward (ProblemEnv's is "
        "'correct'), or leave it unset to report the total reward"
    )


class PromptGroups(ABC):
    """Your prompts as the cookbook's environment groups: prompt ``i`` (the service's prompt id,
    ``0 <= i < len(self)``) with ``group_size`` environments. Typically a ``ProblemGroupBuilder`` whose
    ``num_envs`` is ``group_size``."""

    @abstractmethod
    def __len__(self) -> int:
        """How many prompts (the service dataset's size)."""

    @abstractmethod
    def group(self, prompt_id: int, group_size: int) -> EnvGroupBuilder:
        """The builder of prompt ``prompt_id``'s group, whose ``make_envs`` makes ``group_size`` envs."""


@chz.chz
class PromptGroupsBuilder:
    """A ``chz`` builder of `PromptGroups` (as the cookbook's ``RLDatasetBuilder`` builds datasets)."""

    @abstractmethod
    async def __call__(self) -> PromptGroups:
        """Build the prompts (load data, make the renderer)."""


class _Step:
    """One service step: its number, its slots, and the selection made when the first slot needs it."""

    def __init__(self, dataset: SelectorRLDataset, step: int, index: int, previous: _Step | None) -> None:
        self.dataset = dataset
        self.step = step
        self.index = index
        self.previous = previous
        self.task: asyncio.Future[Selection] | None = None

    async def selection(self) -> Selection:
        if self.task is None:
            self.task = asyncio.ensure_future(self._select())
        # Shielded: a cancelled rollout (the cookbook cancels them when training ends) must not cancel
        # the selection its step's other groups wait on.
        return await asyncio.shield(self.task)

    async def _select(self) -> Selection:
        if self.previous is not None:
            # The service never goes back a step: select the steps before this one first.
            await self.previous.selection()
            self.previous = None
        return await self.dataset._select(self)


class SelectorRLDataset(RLDataset):
    """The cookbook's ``RLDataset`` whose batches the selector service picks (see the module docstring).

    ``groups``: the prompts as environment groups; ``options``: the service (``url`` is needed: the
    async client is opened on the cookbook's event loop); ``groups_per_batch``: prompts per step (the
    cookbook's ``batch_size``); ``group_size``: rollouts per prompt without a rollout budget (and the
    dataset's ``rollouts_per_prompt``); ``n_batches``: the length the cookbook sees, default
    ``len(groups) // groups_per_batch``; ``start_step``: the first service step (`open` finds it).
    Build it with `open` (or `SelectorDatasetBuilder`), which creates the service dataset if needed."""

    def __init__(
        self,
        groups: PromptGroups,
        options: SelectorOptions,
        *,
        groups_per_batch: int,
        group_size: int,
        start_step: int,
        n_batches: int | None = None,
    ) -> None:
        if groups_per_batch < 1 or group_size < 1:
            raise ValueError("groups_per_batch and group_size must be positive")
        if groups_per_batch > len(groups):
            raise ValueError(f"groups_per_batch={groups_per_batch} is more than the {len(groups)} prompts")
        if not options.url:
            raise ValueError(
                "SelectorOptions.url is needed: the dataset opens its async client on the event loop"
            )
        self.groups = groups
        self.options = options
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size
        self.n_batches = n_batches if n_batches is not None else max(1, len(groups) // groups_per_batch)
        self.next_step = start_step
        self.run_id = new_run_id(options.run_id, "tinker")
        #: A configuration error found while grading (a ``reward_key`` the trajectories lack): raised
        #: again by the next ``get_batch``, so the run stops even where the cookbook's rollout strategy
        #: catches errors of single groups.
        self.error: Exception | None = None
        self._last: _Step | None = None
        self._clients: dict[int, AsyncSelectorClient] = {}
        #: Selections made: (service step, cookbook batch index, prompt ids, rollout counts or None).
        self.selections: list[tuple[int, int, list[int], list[int] | None]] = []
        #: Groups the service acknowledged: (step, prompt id, rollouts, lag, duplicate).
        self.reported: list[tuple[int, int, int, int, bool]] = []
        #: Groups the service refused as too late (409): (step, prompt id).
        self.lost: list[tuple[int, int]] = []

    @classmethod
    async def open(
        cls,
        groups: PromptGroups,
        options: SelectorOptions,
        *,
        groups_per_batch: int,
        group_size: int,
        n_batches: int | None = None,
    ) -> SelectorRLDataset:
        """Create the service dataset when missing (``len(groups)`` prompts, ``group_size`` rollouts per
        prompt, ``options.max_lag`` or `DEFAULT_MAX_LAG`), check its size, and start at the step after
        the last one reported to. The blocking calls run in a thread, off the event loop."""
        max_lag = options.max_lag if options.max_lag is not None else DEFAULT_MAX_LAG
        client = options.connect(per_prompt_rollouts=True)
        try:
            start = await asyncio.to_thread(
                ensure_dataset,
                client,
                options,
                len(groups),
                group_size,
                max_lag=max_lag,
                what="the prompts",
                group_option=GROUP_OPTION,
            )
        finally:
            if options.client is None:
                client.close()
        return cls(
            groups,
            options,
            groups_per_batch=groups_per_batch,
            group_size=group_size,
            start_step=start,
            n_batches=n_batches,
        )

    def __len__(self) -> int:
        return self.n_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        """The next service step's ``groups_per_batch`` slots (selected when the first one starts)."""
        if self.error is not None:
            raise self.error
        step = _Step(self, self.next_step, index, self._last)
        self.next_step += 1
        self._last = step
        return [SelectorEnvGroupBuilder(step, slot) for slot in range(self.groups_per_batch)]

    # --- the service ------------------------------------------------------------------------------
    def _client(self) -> AsyncSelectorClient:
        # httpx's async client belongs to the event loop it was made on.
        loop = asyncio.get_running_loop()
        client = self._clients.get(id(loop))
        if client is None:
            o = self.options
            assert o.url is not None
            client = AsyncSelectorClient(o.url, token=o.token, timeout=o.timeout, retries=o.retries)
            self._clients[id(loop)] = client
        return client

    async def _select(self, step: _Step) -> Selection:
        o = self.options
        selection = await self._client().select(
            o.dataset,
            step.step,
            self.groups_per_batch,
            o.strategy,
            o.params or None,
            o.seed,
            rollouts=o.rollouts(),
            filter=o.filter,
        )
        self.selections.append((step.step, step.index, list(selection.prompt_ids), selection.rollouts))
        logger.info(
            "cookbook batch %d is service step %d: prompts %s", step.index, step.step, selection.prompt_ids
        )
        return selection

    async def _observe(self, step: int, prompt_id: int, rewards: list[float]) -> None:
        results, request_id = one_group(self.run_id, step, prompt_id, rewards)
        try:
            ack = await self._send(step, results, request_id)
        except Conflict as exc:
            log_too_late(prompt_id, step, exc.detail, "raise the dataset's max_lag")
            self.lost.append((step, prompt_id))
            return
        self.reported.append((step, prompt_id, len(rewards), ack.lag, ack.duplicate))

    async def _send(self, step: int, results: list[Any], request_id: str) -> Any:
        """The one place a report goes to the service (its request id makes a resend count once)."""
        return await observe_exactly_once_async(
            self._client(), self.options.dataset, step, results, request_id, selected_step=step
        )

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()


class SelectorEnvGroupBuilder(EnvGroupBuilder):
    """Slot ``slot`` of a selected step: the wrapped prompt's builder once the step is selected, and the
    report of its group once graded (see the module docstring)."""

    def __init__(self, step: _Step, slot: int) -> None:
        self._step = step
        self.slot = slot
        self.prompt_id: int | None = None
        self.group_size: int | None = None
        self.inner: EnvGroupBuilder | None = None
        self._report: asyncio.Future[None] | None = None

    @property
    def step(self) -> int:
        """The service step this group was selected at."""
        return self._step.step

    async def make_envs(self) -> Sequence[Env]:
        if self.inner is None:
            selection = await self._step.selection()
            dataset = self._step.dataset
            prompt_id = int(selection.prompt_ids[self.slot])
            size = dataset.group_size if selection.rollouts is None else int(selection.rollouts[self.slot])
            inner = dataset.groups.group(prompt_id, size)
            envs = await inner.make_envs()
            if len(envs) != size:
                raise ValueError(
                    f"PromptGroups.group({prompt_id}, group_size={size}) made {len(envs)} environments; "
                    "make exactly group_size (the rollout count the selector gave this prompt)"
                )
            self.prompt_id, self.group_size, self.inner = prompt_id, size, inner
            return envs
        # Retrying strategies (RetryOnFailure, MinViableGroup) make a fresh group to replace a failed
        # rollout: the same prompt's.
        return await self.inner.make_envs()

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        assert self.inner is not None and self.prompt_id is not None, "make_envs comes first"
        graded = await self.inner.compute_group_rewards(trajectory_group, env_group)
        dataset = self._step.dataset
        try:
            rewards = [
                trajectory_reward(trajectory, final, metrics, dataset.options.reward_key)
                for trajectory, (final, metrics) in zip(trajectory_group, graded, strict=True)
            ]
        except ValueError as exc:
            dataset.error = exc
            raise
        if rewards:
            # Sent now, awaited in cleanup: outside the cookbook's grader timeout, and shielded from a
            # cancelled rollout (do_group_rollout awaits cleanup before it returns the group).
            self._report = asyncio.ensure_future(dataset._observe(self.step, self.prompt_id, rewards))
        return graded

    async def cleanup(self) -> None:
        try:
            if self.inner is not None:
                await self.inner.cleanup()
        finally:
            if self._report is not None:
                report, self._report = self._report, None
                await report

    def logging_tags(self) -> list[str]:
        return self.inner.logging_tags() if self.inner is not None else []

    def __reduce__(self) -> Any:
        raise TypeError(
            "SelectorEnvGroupBuilder runs its rollout in the training process (its step's selection is "
            "shared there); run tinker_cookbook.rl.train without a rollout executor (set_rollout_executor)"
        )


@chz.chz
class SelectorDatasetBuilder(RLDatasetBuilder):
    """The cookbook's dataset builder for `SelectorRLDataset`: put it in ``train.Config.dataset_builder``.

    ``prompts`` builds your `PromptGroups`; ``groups_per_batch`` prompts per step (the cookbook's
    ``batch_size``), each rolled out ``group_size`` times, or by the service's count when
    ``rollout_budget`` is set (that many rollouts per step, each prompt between ``rollout_min`` and
    ``rollout_max``). ``reward_key`` names the metric reported instead of the total reward
    (`trajectory_reward`). A setting left None is read from its ``SELECTOR_*`` environment variable
    (``SELECTOR_URL``, ``SELECTOR_DATASET``, ``SELECTOR_STRATEGY``, ``SELECTOR_SEED``,
    ``SELECTOR_API_TOKEN``, ``SELECTOR_MAX_LAG``), then ``strategy`` defaults to insight and ``seed`` to
    0. ``max_lag`` (created datasets; default 2) should be at least ``AsyncConfig.max_steps_off_policy +
    2`` in asynchronous training. ``run_id`` names the run's reports (default: random)."""

    prompts: PromptGroupsBuilder
    groups_per_batch: int
    group_size: int
    url: str | None = None
    dataset: str | None = None
    strategy: str | None = None
    seed: int | None = None
    token: str | None = None
    reward_key: str | None = None
    n_batches: int | None = None
    rollout_budget: int | None = None
    rollout_min: int = 1
    rollout_max: int | None = None
    rollout_policy: str = DEFAULT_ROLLOUT_POLICY
    max_lag: int | None = None
    run_id: str | None = None
    create: bool = True

    def options(self) -> SelectorOptions:
        values: dict[str, Any] = {
            "url": self.url,
            "dataset": self.dataset,
            "strategy": self.strategy,
            "seed": self.seed,
            "token": self.token,
            "reward_key": self.reward_key,
            "rollout_budget": self.rollout_budget,
            "rollout_min": self.rollout_min,
            "rollout_max": self.rollout_max,
            "rollout_policy": self.rollout_policy,
            "max_lag": self.max_lag,
            "run_id": self.run_id,
            "create": self.create,
            "rollouts_per_prompt": self.group_size,
        }
        return SelectorOptions.resolve(
            {k: v for k, v in values.items() if v is not None}, os.environ, where="SelectorDatasetBuilder"
        )

    async def __call__(self) -> tuple[SelectorRLDataset, None]:
        groups = await self.prompts()
        dataset = await SelectorRLDataset.open(
            groups,
            self.options(),
            groups_per_batch=self.groups_per_batch,
            group_size=self.group_size,
            n_batches=self.n_batches,
        )
        return dataset, None
