"""TRL adapter: GRPO with prompts chosen by the selector service.

Three pieces, usable together (`SelectorGRPOTrainer`) or on their own in a custom trainer:

`SelectorRepeatSampler`
    Same shape as TRL's ``RepeatSampler``: per generation step it yields ``batch_size`` distinct prompts,
    each repeated ``mini_repeat_count`` (= ``num_generations``) times, and the whole chunk repeated
    ``repeat_count`` (= ``num_iterations * steps_per_generation``) times. The chunk is ``/select`` for
    the next service step instead of a slice of a random permutation. Every rank runs its own sampler
    and asks the same step with the same seed, so every rank gets the same batch (the service answers
    identically as long as no observation of that step arrives in between; `ObservingReward` waits
    for all ranks before any rank can select again).

`ObservingReward`
    Wraps the verifiable reward function (any TRL reward callable). It returns the wrapped function's
    rewards unchanged and reports them to ``/observe``: the rewards of all ranks are gathered, grouped
    by the dataset's prompt-id column, and sent once by the main process, then every rank waits for
    that report to be acknowledged. Evaluation batches (model in eval mode) are not reported.

    Which step a report is filed under: the most recent step this process's sampler selected.
    Accelerate's dataloader fetches one batch ahead, so with ``num_iterations * steps_per_generation ==
    1`` the next step is already selected when a generation's rewards come in; filing the report under
    the step it was selected at would then be refused (that step is closed). Beta-belief strategies
    (INSIGHT, MoPPS, ...) are unaffected, since their beliefs change when evidence arrives; DPS sees
    the prompt's state one step later than it was measured. With ``repeat_count >= 2`` reports are
    filed under their own step.

`SelectorGRPOTrainer`
    ``GRPOTrainer`` with the two wired in: ``_get_train_sampler`` returns a `SelectorRepeatSampler`,
    the reward function at ``observe_reward`` (index or name) is wrapped, the service dataset is
    created with ``size = len(train_dataset)`` and ``rollouts_per_prompt = num_generations`` if it does
    not exist, and the first step continues after any earlier run on that dataset.

The train dataset needs an integer column (default ``prompt_id``) holding a permutation of
``0..len-1``; it is the service's prompt id and reaches the reward function as a keyword argument
(``remove_unused_columns`` must stay False, GRPOConfig's default). Iterable (streaming) datasets are
not supported: a sampler cannot be attached to them.

Tested against the real TRL classes (trl 1.16, installed alongside this project's pins):
``tests/integrations/test_integrations.py`` compares the sampler's shape with ``trl.trainer.utils.RepeatSampler``
and runs ``SelectorGRPOTrainer`` for real training steps on a tiny model against a real service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list, gather_object
from torch.utils.data import Sampler
from trl import GRPOTrainer

from rlvr_selector_client.client import SelectorClient
from rlvr_selector_client.integrations import (
    SelectedStep,
    SelectorOptions,
    StepIterator,
    StepSampler,
    check_permutation,
    ensure_dataset,
    group_results,
    new_run_id,
    observe_exactly_once,
    request_id,
)

__all__ = ["ObservingReward", "SelectorGRPOTrainer", "SelectorOptions", "SelectorRepeatSampler"]

# Selected steps remembered for checking that reported prompts are the ones that were selected.
_HISTORY = 8


class SelectorRepeatSampler(StepSampler, Sampler[int]):
    """``RepeatSampler``'s index pattern with each chunk chosen by ``/select`` (see the module docstring).

    ``row_of`` maps a service prompt id to its dataset row (identity when omitted).
    """

    def __init__(
        self,
        data_source: Sized,
        mini_repeat_count: int,
        batch_size: int = 1,
        repeat_count: int = 1,
        *,
        client: SelectorClient,
        dataset: str,
        strategy: str,
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
        start_step: int = 0,
        row_of: Mapping[int, int] | None = None,
    ) -> None:
        if min(mini_repeat_count, batch_size, repeat_count) < 1:
            raise ValueError("mini_repeat_count, batch_size and repeat_count must be positive")
        self.num_samples = len(data_source)
        if batch_size > self.num_samples:
            raise ValueError(f"batch_size {batch_size} exceeds the {self.num_samples} prompts of the dataset")
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.client = client
        self.options = SelectorOptions(
            dataset=dataset, client=client, strategy=strategy, params=dict(params or {}), seed=seed
        )
        self.next_step = start_step
        self.latest_step: int | None = None
        self.history: dict[int, list[int]] = {}
        self.row_of = row_of

    def __len__(self) -> int:
        return (
            (self.num_samples // self.batch_size)
            * self.batch_size
            * self.mini_repeat_count
            * self.repeat_count
        )

    def select_next(self) -> list[int]:
        """Ask the service for the next step's prompts; record them; return their dataset rows."""
        step, selection = self.select(self.batch_size)
        ids = list(selection.prompt_ids)
        self.history[step] = ids
        for old in [s for s in self.history if s <= step - _HISTORY]:
            del self.history[old]
        self.latest_step = step
        return ids if self.row_of is None else [self.row_of[pid] for pid in ids]

    def select_step(self) -> SelectedStep:
        """The next step in ``RepeatSampler``'s pattern: each row ``mini_repeat_count`` times, the
        chunk ``repeat_count`` times."""
        step = self.next_step
        rows = self.select_next()
        pattern = [
            row for _ in range(self.repeat_count) for row in rows for _ in range(self.mini_repeat_count)
        ]
        return SelectedStep(step, pattern)

    def __iter__(self) -> Iterator[int]:
        return StepIterator(self, self.num_samples // self.batch_size)


class ObservingReward:
    """A TRL reward function that also reports its rewards to ``/observe`` (see the module docstring).

    ``sampler`` is the `SelectorRepeatSampler` feeding the trainer; ``is_training`` tells training
    batches from evaluation batches (default: always training).
    """

    def __init__(
        self,
        reward_func: Callable[..., Sequence[float | None]],
        *,
        client: SelectorClient,
        dataset: str,
        sampler: SelectorRepeatSampler | None = None,
        id_column: str = "prompt_id",
        run_id: str | None = None,
        is_training: Callable[[], bool] | None = None,
    ) -> None:
        if isinstance(reward_func, torch.nn.Module | str):
            raise TypeError(
                "ObservingReward wraps a verifiable reward *function*; a reward model is not a verifier"
            )
        self.reward_func = reward_func
        self.client = client
        self.dataset = dataset
        self.sampler = sampler
        self.id_column = id_column
        self.run_id = new_run_id(run_id, "trl")
        self.is_training = is_training or (lambda: True)
        self.reports = 0
        # TRL logs each reward under its function's name: keep the wrapped function's.
        self.__name__ = getattr(reward_func, "__name__", type(reward_func).__name__)

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        rewards = list(self.reward_func(prompts=prompts, completions=completions, **kwargs))
        if not self.is_training():
            return rewards
        if self.id_column not in kwargs:
            raise KeyError(
                f"the reward function got no {self.id_column!r} column; add the service prompt id to the train "
                f"dataset (e.g. dataset.map(lambda _, i: {{{self.id_column!r}: i}}, with_indices=True)) and keep "
                "remove_unused_columns=False"
            )
        if self.sampler is None:
            raise RuntimeError(
                "ObservingReward has no sampler: pass the SelectorRepeatSampler feeding the trainer"
            )
        local = [
            (int(pid), float(r))
            for pid, r in zip(kwargs[self.id_column], rewards, strict=True)
            if r is not None
        ]
        pairs = gather_object(local)
        state = PartialState()
        if state.is_main_process:
            self._report(pairs)
        state.wait_for_everyone()
        return rewards

    def _report(self, pairs: list[tuple[int, float]]) -> None:
        sampler = self.sampler
        assert sampler is not None
        if sampler.latest_step is None:
            raise RuntimeError("rewards arrived before the sampler selected any step")
        results = group_results((p for p, _ in pairs), (r for _, r in pairs))
        reported = {r.prompt_id for r in results}
        if not any(reported <= set(ids) for ids in sampler.history.values()):
            raise RuntimeError(
                f"the rewarded prompts {sorted(reported)[:8]} are not one batch the service selected; is "
                f"{self.id_column!r} the service prompt id and is this trainer's sampler a SelectorRepeatSampler?"
            )
        step = sampler.latest_step
        observe_exactly_once(
            self.client, self.dataset, step, results, request_id(self.run_id, step, sequence=self.reports)
        )
        self.reports += 1


class SelectorGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose training prompts are chosen by the selector service.

    ``observe_reward`` names the reward function whose values are reported (its index in
    ``reward_funcs`` or its ``__name__``); it must be a verifiable-reward callable, not a reward model.
    Every other argument is ``GRPOTrainer``'s.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any,
        args: Any = None,
        train_dataset: Any = None,
        *,
        selector: SelectorOptions,
        observe_reward: int | str = 0,
        **kwargs: Any,
    ) -> None:
        if train_dataset is None or not hasattr(train_dataset, "__getitem__"):
            raise TypeError(
                "SelectorGRPOTrainer needs a map-style train_dataset (a sampler cannot drive a stream)"
            )
        self.selector = selector
        self.selector_client = selector.connect()
        column = _column(train_dataset, selector.id_column)
        self._row_of = check_permutation(column, f"train_dataset[{selector.id_column!r}]")
        funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
        position = _reward_position(funcs, observe_reward)
        self.observing_reward = ObservingReward(
            funcs[position],
            client=self.selector_client,
            dataset=selector.dataset,
            id_column=selector.id_column,
            run_id=selector.run_id,
            is_training=lambda: bool(self.model.training),
        )
        funcs[position] = self.observing_reward
        super().__init__(model, funcs, args, train_dataset, **kwargs)
        if self.args.remove_unused_columns:
            raise ValueError(
                f"remove_unused_columns=True would drop the {selector.id_column!r} column the reward report needs"
            )
        self._selector_sampler: SelectorRepeatSampler | None = None

    def _ensure_dataset(self) -> int:
        """Create the service dataset if needed; the step this run starts at."""
        return ensure_dataset(
            self.selector_client,
            self.selector,
            len(self.train_dataset),
            self.num_generations,
            max_lag=self.selector.max_lag or 0,
            what="train_dataset",
        )

    def _get_train_sampler(self, dataset: Any = None) -> Sampler[int]:
        if self._selector_sampler is not None:
            return self._selector_sampler
        options = self.selector
        # The main process decides where the run starts; all ranks must agree on it.
        start = [self._ensure_dataset() if PartialState().is_main_process else None]
        start = broadcast_object_list(start)
        sampler = SelectorRepeatSampler(
            data_source=dataset if dataset is not None else self.train_dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            client=self.selector_client,
            dataset=options.dataset,
            strategy=options.strategy,
            params=options.params,
            seed=options.seed,
            start_step=int(start[0]),
            row_of=self._row_of,
        )
        self.observing_reward.sampler = sampler
        self._selector_sampler = sampler
        return sampler


def _column(dataset: Any, name: str) -> list[Any]:
    names = getattr(dataset, "column_names", None)
    if names is not None:
        if name not in names:
            raise ValueError(
                f"train_dataset has no {name!r} column; add the service prompt ids, e.g. "
                f"dataset.map(lambda _, i: {{{name!r}: i}}, with_indices=True)"
            )
        return list(dataset[name])
    try:
        return [dataset[row][name] for row in range(len(dataset))]
    except (KeyError, TypeError):
        raise ValueError(f"every train_dataset row must be a mapping with an integer {name!r}") from None


def _reward_position(funcs: list[Any], observe_reward: int | str) -> int:
    if isinstance(observe_reward, int):
        if not 0 <= observe_reward < len(funcs):
            raise ValueError(f"observe_reward={observe_reward} but there are {len(funcs)} reward functions")
        return observe_reward
    names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
    if observe_reward not in names:
        raise ValueError(f"observe_reward={observe_reward!r} is none of the reward functions {names}")
    return names.index(observe_reward)
