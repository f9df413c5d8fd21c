"""TRL adapter: GRPO with prompts chosen by the selector service (TRL 1.16).

`SelectorGRPOTrainer`
    ``trl.GRPOTrainer`` whose generations are selected by ``/select`` and whose rewards go to
    ``/observe``. Use it instead of ``GRPOTrainer``; every argument is the same, plus
    ``selector=SelectorOptions(...)`` and, with several reward functions, ``observe_reward``.

    When a step is selected: at generation, not when the data loader fetches. TRL's data loader runs
    ahead of training: accelerate's ``DataLoaderShard.__iter__`` fetches the next batch before it
    yields the current one (accelerate 1.16, ``data_loader.py`` lines 573-587), and transformers'
    ``Trainer._run_epoch`` fetches the ``gradient_accumulation_steps`` batches of an optimizer step
    before training on the first (transformers 5.19, ``trainer.py`` lines 1859 and 2264-2274). A
    sampler that selected when its batch was fetched would select step t+1 before step t's rewards
    exist, and the run would end with a selected step it never trains on. So the train sampler is
    TRL's own ``RepeatSampler`` over *slots* (``shuffle=False``: rows ``0..B-1`` of each chunk stand for
    the step's B prompts, in TRL's index pattern), and ``_generate_and_score_completions`` (called once
    per generation, ``grpo_trainer.py`` line 1541) selects the next service step and puts the selected
    prompts' rows in the slots before TRL generates. The rewards of that generation are reported in
    ``_calculate_rewards`` (line 1579, which returns every process's rewards gathered) for that same
    step, before the next generation selects: each step is selected, rolled out and reported in order,
    never late, and only a step that is generated is ever selected. A resumed run
    (``resume_from_checkpoint``) fast-forwards the loader over slots, selecting nothing, and continues
    at the step after the last one the service saw.

    Which reward is reported: TRL computes one column per reward function. With one function, that
    one. With several, ``observe_reward`` names the verifiable one (its ``__name__`` or its index in
    ``reward_funcs``); without it the trainer refuses to start, naming the functions (TRL's weighted
    sum mixes format or length bonuses into a success count). The value reported is that function's raw
    reward (``reward_weights`` do not apply), one per completion; None (not applicable) is left out.

    The service dataset is created, when missing, with ``size = len(train_dataset)`` and
    ``rollouts_per_prompt = num_generations``; an existing one must match both (refused otherwise, with
    what to change). On several processes the main process selects and reports; the others receive the
    selection (``broadcast_object_list``) and wait for the report.

`SelectorRepeatSampler` and `ObservingReward`
    For custom loops that draw batches themselves: the sampler yields ``RepeatSampler``'s index pattern
    with each chunk chosen by ``/select`` when the chunk's first index is drawn, and the reward wrapper
    reports a batch's rewards for the oldest selected step not yet reported that holds its prompts (so a
    loop that draws ahead still files each report under the step that chose it, late by the steps drawn
    meanwhile; create the dataset with that ``max_lag``).

The train dataset needs an integer column (default ``prompt_id``) holding a permutation of
``0..len-1``: it is the service's prompt id (``remove_unused_columns`` must stay False, GRPOConfig's
default). Iterable (streaming) datasets are not supported: a sampler cannot be attached to them.

Tested against the real TRL classes (trl 1.16): ``tests/integrations/test_integrations.py`` runs
``SelectorGRPOTrainer`` for real training steps on a tiny model against a real service, and
``tests/integrations/test_frameworks.py`` runs ``examples/trl_grpo.py`` in a venv of TRL and its
dependencies with the client's wheel installed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list, gather_object
from torch.utils.data import Sampler
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

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

# The GRPOTrainer methods the trainer extends (TRL 1.16, trl/trainer/grpo_trainer.py).
_HOOKS = ("_get_train_sampler", "_generate_and_score_completions", "_calculate_rewards")


class SelectedSteps:
    """Selected steps not reported yet, oldest first: a report is filed under the oldest one that holds
    all its prompts (`claim`)."""

    def __init__(self) -> None:
        self.waiting: dict[int, frozenset[int]] = {}

    def add(self, step: int, prompt_ids: Sequence[int]) -> None:
        self.waiting[step] = frozenset(int(p) for p in prompt_ids)
        for old in [s for s in self.waiting if s <= step - _HISTORY]:
            del self.waiting[old]

    def claim(self, reported: set[int], id_column: str) -> int:
        for step, ids in self.waiting.items():
            if reported <= ids:
                del self.waiting[step]
                return step
        raise RuntimeError(
            f"the rewarded prompts {sorted(reported)[:8]} are not one batch the service selected (or that batch "
            f"was reported already); is {id_column!r} the service prompt id and are the batches the "
            "selector's?"
        )


class SelectorRepeatSampler(StepSampler, Sampler[int]):
    """``RepeatSampler``'s index pattern with each chunk chosen by ``/select`` when its first index is
    drawn, for custom loops (see the module docstring; `SelectorGRPOTrainer` selects at generation).

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
        self.unreported = SelectedSteps()
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
        self.unreported.add(step, ids)
        self.latest_step = step
        return ids if self.row_of is None else [self.row_of[pid] for pid in ids]

    def claim(self, reported: set[int], id_column: str = "prompt_id") -> int:
        """The step a report of these prompts is filed under: the oldest selected step not reported yet
        that holds them all."""
        return self.unreported.claim(reported, id_column)

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
    """A TRL reward function that also reports its rewards to ``/observe``, for custom loops fed by a
    `SelectorRepeatSampler` (see the module docstring).

    ``sampler`` is that sampler; ``is_training`` tells training batches from evaluation batches
    (default: always training). The rewards of all ranks are gathered, grouped by the dataset's
    prompt-id column, and sent once by the main process under the step that selected them
    (`SelectorRepeatSampler.claim`); every rank then waits for that report.
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
            raise KeyError(_missing_column(self.id_column))
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
        results = group_results((p for p, _ in pairs), (r for _, r in pairs))
        step = sampler.claim({r.prompt_id for r in results}, self.id_column)
        if results:
            observe_exactly_once(
                self.client, self.dataset, step, results, request_id(self.run_id, step), selected_step=step
            )
        self.reports += 1


class SelectorGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose training prompts are chosen by the selector service (see the module
    docstring).

    ``observe_reward`` names the reward function whose values are reported: its ``__name__`` or its
    index in ``reward_funcs``; needed with several reward functions (``selector.reward_key`` is read
    when it is not given). Every other argument is ``GRPOTrainer``'s.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any,
        args: Any = None,
        train_dataset: Any = None,
        *,
        selector: SelectorOptions,
        observe_reward: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        missing = [name for name in _HOOKS if not callable(getattr(GRPOTrainer, name, None))]
        if missing:
            raise RuntimeError(
                f"the installed TRL's GRPOTrainer has no {', '.join(missing)}, which the selector's trainer "
                "extends; it supports TRL 1.16"
            )
        if train_dataset is None or not hasattr(train_dataset, "__getitem__"):
            raise TypeError(
                "SelectorGRPOTrainer needs a map-style train_dataset (a sampler cannot drive a stream)"
            )
        self.selector = selector
        self.selector_client = selector.connect()
        column = _column(train_dataset, selector.id_column)
        self._row_of = check_permutation(column, f"train_dataset[{selector.id_column!r}]")
        funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
        chosen = observe_reward if observe_reward is not None else selector.reward_key
        self.observed_reward = _reward_position(funcs, chosen)
        if isinstance(funcs[self.observed_reward], torch.nn.Module | str):
            raise TypeError(
                f"observe_reward={chosen!r} names a reward model; the selector observes a verifiable reward: "
                "name a reward function"
            )
        self.selector_run_id = new_run_id(selector.run_id, "trl")
        self.selector_reports = 0
        self._selector_next: int | None = None
        self._selector_step: tuple[int, list[int]] | None = None
        super().__init__(model, funcs, args, train_dataset, **kwargs)
        if self.args.remove_unused_columns:
            raise ValueError(
                f"remove_unused_columns=True would drop the {selector.id_column!r} column the reward report needs"
            )
        self.selector_group_size = self.args.generation_batch_size // self.num_generations
        # The main process opens the service dataset (refusing a mismatch before anything trains) and
        # decides the first step; every process starts there.
        start = [self._open_selector_dataset() if self.accelerator.is_main_process else None]
        self._selector_next = int(broadcast_object_list(start)[0])

    # --- selection at generation ---------------------------------------------------------------------
    def _get_train_sampler(self, dataset: Any = None) -> Sampler[int]:
        """TRL's ``RepeatSampler`` over slots (no shuffling): each chunk's rows ``0..B-1`` stand for the
        B prompts its generation selects."""
        return RepeatSampler(
            data_source=dataset if dataset is not None else self.train_dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.selector_group_size,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=False,
        )

    def _open_selector_dataset(self) -> int:
        return ensure_dataset(
            self.selector_client,
            self.selector,
            len(self.train_dataset),
            self.num_generations,
            max_lag=self.selector.max_lag or 0,
            what="train_dataset",
            group_option="num_generations",
        )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if self.model.training:
            inputs = self._selected_rows(inputs)
        return super()._generate_and_score_completions(inputs)

    def _selected_rows(self, slots: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Select the next service step and fill the generation's slots with its prompts' rows."""
        if self._selector_next is None:
            raise RuntimeError("the train sampler was not built by SelectorGRPOTrainer._get_train_sampler")
        chosen: list[Any] = [None]
        if self.accelerator.is_main_process:
            o = self.selector
            step = self._selector_next
            selection = self.selector_client.select(
                o.dataset,
                step,
                self.selector_group_size,
                str(o.strategy),
                o.params or None,
                int(o.seed or 0),
                filter=o.filter,
            )
            chosen = [(step, [int(p) for p in selection.prompt_ids])]
        step, ids = broadcast_object_list(chosen)[0]
        self._selector_next = step + 1
        self._selector_step = (step, ids)
        column = self.selector.id_column
        rows = []
        for slot in slots:
            position = self._row_of[int(slot[column])] % self.selector_group_size
            rows.append(self._row_of[ids[position]])
        return [self.train_dataset[row] for row in rows]

    # --- reporting ------------------------------------------------------------------------------------
    def _calculate_rewards(
        self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
    ) -> Any:
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training:
            column = self.selector.id_column
            if column not in inputs[0]:
                raise KeyError(_missing_column(column))
            ids = gather_object([int(x[column]) for x in inputs])
            if self.accelerator.is_main_process:
                self._report(ids, rewards_per_func[:, self.observed_reward].tolist())
            self.accelerator.wait_for_everyone()
        return rewards_per_func

    def _report(self, ids: list[int], rewards: list[float]) -> None:
        if self._selector_step is None:
            raise RuntimeError("rewards arrived for a generation the selector did not select")
        step, selected = self._selector_step
        self._selector_step = None
        kept = [(p, r) for p, r in zip(ids, rewards, strict=True) if not math.isnan(r)]
        results = group_results((p for p, _ in kept), (r for _, r in kept))
        strays = {r.prompt_id for r in results} - set(selected)
        if strays:
            raise RuntimeError(
                f"step {step}: rewards for prompts {sorted(strays)[:8]} the service did not select; is "
                f"{self.selector.id_column!r} the service prompt id?"
            )
        if results:
            observe_exactly_once(
                self.selector_client,
                self.selector.dataset,
                step,
                results,
                request_id(self.selector_run_id, step),
                selected_step=step,
            )
        self.selector_reports += 1


def _missing_column(name: str) -> str:
    return (
        f"the reward function got no {name!r} column; add the service prompt id to the train dataset "
        f"(e.g. dataset.map(lambda _, i: {{{name!r}: i}}, with_indices=True)) and keep "
        "remove_unused_columns=False"
    )


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


def _reward_name(func: Any) -> str:
    if isinstance(func, str):
        return func
    return str(getattr(func, "__name__", type(func).__name__))


def _reward_position(funcs: list[Any], observe_reward: int | str | None) -> int:
    names = [_reward_name(f) for f in funcs]
    if observe_reward is None:
        if len(funcs) == 1:
            return 0
        raise ValueError(
            f"{len(funcs)} reward functions {names}: say which one the selector observes with "
            "SelectorGRPOTrainer(..., observe_reward=<its name or index>), the verifiable reward whose value "
            "says whether a completion solved the prompt (e.g. observe_reward="
            f"{names[-1]!r}); TRL's weighted sum would count format or length bonuses as successes"
        )
    if isinstance(observe_reward, int) and not isinstance(observe_reward, bool):
        if not 0 <= observe_reward < len(funcs):
            raise ValueError(f"observe_reward={observe_reward} but there are {len(funcs)} reward functions")
        return observe_reward
    if observe_reward not in names:
        raise ValueError(f"observe_reward={observe_reward!r} is none of the reward functions {names}")
    if names.count(str(observe_reward)) > 1:
        raise ValueError(f"observe_reward={observe_reward!r} names several reward functions; give its index")
    return names.index(str(observe_reward))
