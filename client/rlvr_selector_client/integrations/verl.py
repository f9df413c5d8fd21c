"""verl adapter: a curriculum sampler whose batches come from the selector service.

verl 0.5 - 0.7: the PPO/GRPO trainer (``verl.trainer.ppo.ray_trainer.RayPPOTrainer``) builds its train
sampler from ``data.sampler.class_path`` / ``class_name`` and calls ``sampler.update(batch=...)`` after
every training step (the last one included) when the sampler is an ``AbstractCurriculumSampler``.
verl 0.8 removed that interface; there `rlvr_selector_client.integrations.verl_main` runs verl's legacy
trainer with this sampler and a trainer that calls ``update`` itself, or (verl 0.9's default) the v1
trainer with this sampler in its prompt loader and a replay buffer that reports each group
(`rlvr_selector_client.integrations.verl_v1`; the sampler then tags each row it hands out with its step). Built any other way on
verl >= 0.8, the sampler refuses to start rather than silently never reporting.

How it plugs in (verl 0.5 - 0.7 config)::

    data.dataloader_num_workers=0                 # verl requires it for curriculum samplers
    data.sampler.class_path=pkg://rlvr_selector_client.integrations.verl
    data.sampler.class_name=SelectorCurriculumSampler
    +data.sampler.selector.url=http://selector:8000
    +data.sampler.selector.dataset=gsm8k-run-7
    +data.sampler.selector.strategy=insight       # any strategy of the service
    +data.sampler.selector.rollouts_per_prompt=8  # = actor_rollout_ref.rollout.n

Every key may instead come from the environment: ``SELECTOR_URL``, ``SELECTOR_DATASET``,
``SELECTOR_STRATEGY``, ``SELECTOR_SEED``, ``SELECTOR_API_TOKEN`` (the config wins).

What it does: each dataloader batch (``data.gen_batch_size`` or ``data.train_batch_size`` prompts) is
one service step: the sampler asks ``/select`` for that step and yields the rows of the chosen prompts.
``update(batch)`` groups the step's sequence scores (``token_level_scores`` summed over tokens, i.e.
before any KL penalty) by prompt and reports them to ``/observe`` with request id
``{run_id}-s{step}``. Prompt ids are ``extra_info.index`` of each row (`batch_prompt_ids`), never the
row position nor the ``index`` column (verl's ``_get_gen_batch`` moves it out of the training batch),
and the sampler refuses to run when a row lacks it: verl's dataset silently defaults a missing index
to 0, which would report every group as prompt 0. The ids must be exactly ``0..len(dataset)-1``.

Not supported, and refused with a message: group filtering that hands ``update`` fewer groups than
were selected (the DAPO recipe's ``algorithm.filter_groups``), since the dropped groups are evidence
the service must see.

Tests: ``tests/integrations/test_frameworks.py`` runs verl's own ``RayPPOTrainer.fit()`` (0.6.1 async rollout,
0.7.1 default GRPO, 0.9.1 through ``verl_main``) in a venv per verl version, generation faked.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sized
from importlib import metadata
from typing import Any, NamedTuple

from torch.utils.data import Sampler

from rlvr_selector_client.client import SelectorClient
from rlvr_selector_client.integrations import (
    SelectedStep,
    SelectorOptions,
    StepIterator,
    StepSampler,
    check_group_sizes,
    check_permutation,
    first_step,
    framework_version,
    group_results,
    new_run_id,
    observe_exactly_once,
    open_dataset,
    request_id,
)

try:  # verl 0.5 - 0.7
    from verl.experimental.dataset.sampler import AbstractCurriculumSampler as _SamplerBase
except ImportError:  # verl absent or >= 0.8: the same methods on torch's Sampler
    _SamplerBase = Sampler  # type: ignore[assignment,misc]

__all__ = [
    "SUPPORTED_VERL",
    "SelectorCurriculumSampler",
    "batch_prompt_ids",
    "replace_name",
    "resolve_options",
]

logger = logging.getLogger(__name__)

SUPPORTED_VERL = ">=0.5"
SAMPLER_SECTION = "data.sampler.selector"
DEFAULT_REWARD_KEY = "token_level_scores"
GROUP_OPTION = "actor_rollout_ref.rollout.n"


def resolve_options(section: Mapping[str, Any] | None, environ: Mapping[str, str]) -> SelectorOptions:
    """`SelectorOptions` from ``data.sampler.selector`` (OmegaConf or plain) and the environment."""
    return SelectorOptions.resolve(_plain(section) if section is not None else {}, environ, SAMPLER_SECTION)


def replace_name(module: Any, name: str, value: Any) -> None:
    """Sets ``module.name`` to ``value`` for the entry point (verl >= 0.8), refusing when the installed verl
    has no such name: a hook verl renamed would otherwise be left alone silently, and verl would select
    and train without the selector."""
    if not hasattr(module, name):
        raise RuntimeError(
            f"the installed verl has no {module.__name__}.{name}, which the selector's entry point replaces; "
            "it supports verl 0.8 - 0.9's layout (tested with 0.9.1)"
        )
    setattr(module, name, value)


def _plain(value: Any) -> Any:
    """OmegaConf containers (or any mappings/sequences) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def _config_get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    return getter(key, default) if getter is not None else getattr(config, key, default)


def _check_verl_version(trainer_reports: bool) -> None:
    version = framework_version("verl")
    if version is None:
        return  # used outside verl (custom loops): nothing to check
    if version < (0, 5):
        raise RuntimeError(f"verl {version[0]}.{version[1]} is too old: the selector supports verl >= 0.5")
    if version >= (0, 8) and not trainer_reports:
        raise RuntimeError(
            f"verl {metadata.version('verl')} removed AbstractCurriculumSampler: its trainer never calls "
            "sampler.update(), so no rollout would reach the selector service. Launch with "
            "`python -m rlvr_selector_client.integrations.verl_main` (same overrides as verl.trainer.main_ppo), "
            "whose trainer reports every step"
        )


def _row_prompt_ids(data_source: Sized) -> list[int]:
    """``extra_info.index`` of every row, read from verl's dataframe when there is one."""
    frame = getattr(data_source, "dataframe", None)
    if frame is not None and "extra_info" in getattr(frame, "column_names", ()):
        infos = list(frame["extra_info"])
    else:
        infos = [data_source[row].get("extra_info") for row in range(len(data_source))]  # type: ignore[index]
    ids = []
    for row, info in enumerate(infos):
        if not isinstance(info, Mapping) or info.get("index") is None:
            raise ValueError(
                f"row {row} of the train dataset has no extra_info.index; verl would silently use 0 for it. "
                "Write a unique integer extra_info.index (0..N-1) into every row when preparing the parquet"
            )
        ids.append(info["index"])
    return ids


def batch_prompt_ids(batch: Any) -> list[int]:
    """The service prompt id of every row of a verl ``DataProto`` after rollout.

    ``extra_info.index`` is read, not the ``index`` column: verl's ``_get_gen_batch`` moves ``index``
    into the generation batch, and with a rule reward (no reward model) nothing copies it back, while
    ``extra_info`` stays in the training batch (it is one of the reward keys).
    """
    non_tensor = batch.non_tensor_batch
    infos = non_tensor.get("extra_info")
    if infos is None:
        if "index" in non_tensor:
            return [int(i) for i in non_tensor["index"]]
        raise KeyError(
            "the batch has neither 'extra_info' nor 'index'; verl's RLHFDataset keeps extra_info (with the "
            "prompt's index) in every row"
        )
    ids = []
    for row, info in enumerate(infos):
        if not isinstance(info, Mapping) or info.get("index") is None:
            raise ValueError(f"row {row} of this batch lacks extra_info.index; verl reported it as prompt 0")
        ids.append(int(info["index"]))
    return ids


class Issued(NamedTuple):
    """A row the sampler handed out: the service step it was selected at, its prompt id, and its
    rollout count (None: the trainer's own group size)."""

    step: int
    prompt_id: int
    rollouts: int | None


class SelectorCurriculumSampler(StepSampler, _SamplerBase):  # type: ignore[misc,valid-type]
    """verl curriculum sampler backed by the selector service (see the module docstring).

    Each row handed out is also queued (`take_issued`) with its step, prompt id and rollout count, for
    trainers that tag every prompt with them (verl v1).

    ``client`` is a seam for callers that already hold a `SelectorClient`; verl passes only
    ``data_source`` and ``data_config``.
    """

    def __init__(
        self,
        data_source: Sized,
        data_config: Any,
        *,
        client: SelectorClient | None = None,
        trainer_reports: bool = False,
        step_size: int | None = None,
        report_groups: bool = False,
        max_lag: int = 0,
        group_size: int | None = None,
    ) -> None:
        """``trainer_reports``: the trainer calls `update` itself (verl >= 0.8, `verl_main`).
        ``report_groups``: the trainer reports each group as it finishes instead of calling `update`
        (verl's v1 trainer, `verl_v1`), and each step is ``step_size`` prompts however many the loader
        fetches at a time; ``max_lag`` is then how many steps late those reports may come.
        ``group_size``: ``actor_rollout_ref.rollout.n`` where the caller has the whole config (verl_main's
        routes; verl 0.5-0.7 hands the sampler ``config.data`` only, and `update` checks the first
        step's groups instead)."""
        _check_verl_version(trainer_reports or report_groups)
        self.report_groups = report_groups
        sampler_config = _config_get(data_config, "sampler")
        self.options = resolve_options(_config_get(sampler_config, "selector"), os.environ)
        workers = _config_get(data_config, "dataloader_num_workers", 0)
        if workers:
            raise ValueError(
                f"data.dataloader_num_workers={workers}: worker processes prefetch indices before the previous "
                "step is reported, so set data.dataloader_num_workers=0 with this sampler"
            )
        batch_size = (
            step_size
            or _config_get(data_config, "gen_batch_size")
            or _config_get(data_config, "train_batch_size")
        )
        if not batch_size or int(batch_size) < 1:
            raise ValueError("data.train_batch_size (or data.gen_batch_size) must be a positive integer")
        self.batch_size = int(batch_size)
        self.num_rows = len(data_source)
        if self.batch_size > self.num_rows:
            raise ValueError(
                f"batch size {self.batch_size} exceeds the {self.num_rows} prompts of the dataset"
            )
        self._row_of = check_permutation(_row_prompt_ids(data_source), "verl train dataset extra_info.index")
        self.prompt_of = {row: pid for pid, row in self._row_of.items()}
        if not report_groups:
            self.options.refuse_rollout_budget(
                "verl's trainer here rolls out actor_rollout_ref.rollout.n completions of every prompt; "
                "per-prompt counts need verl 0.9's v1 trainer (trainer.use_v1=True)"
            )
        self.issued: deque[Issued] = deque()

        self.client = client or self.options.connect(per_prompt_rollouts=report_groups)
        self.client.check_server()
        self.run_id: str = new_run_id(self.options.run_id, "verl")
        budget = self.options.rollout_budget is not None
        info = open_dataset(
            self.client,
            self.options,
            self.num_rows,
            None if budget else group_size,
            max_lag=self.options.max_lag if self.options.max_lag is not None else max_lag,
            group_option=GROUP_OPTION if group_size is not None else f"{SAMPLER_SECTION}.rollouts_per_prompt",
        )
        self.next_step = first_step(info)
        #: Every group's size, for `update` to check (None with a rollout budget: groups have their own).
        self.group_size: int | None = None if budget else info.rollouts_per_prompt
        self.open_step: int | None = None
        self.open_ids: list[int] = []

    # --- torch Sampler -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return (self.num_rows // self.batch_size) * self.batch_size

    def __iter__(self) -> Iterator[int]:
        return StepIterator(self, self.num_rows // self.batch_size)

    def take_issued(self, count: int) -> list[Issued]:
        """The step, prompt id and rollout count of the next ``count`` rows handed out, in order."""
        if count > len(self.issued):
            raise RuntimeError(
                f"{count} rows fetched but the sampler handed out {len(self.issued)}: the loader must use "
                "this sampler with data.dataloader_num_workers=0"
            )
        return [self.issued.popleft() for _ in range(count)]

    def handed_out(self, step: int, item: int, count: int | None) -> None:
        if self.report_groups:
            self.issued.append(Issued(step, self.prompt_of[item], count))

    def select_step(self) -> SelectedStep:
        if self.open_step is not None and not self.report_groups:
            logger.warning(
                "step %d was selected but never reported (update() was not called); the service closes it "
                "without observations",
                self.open_step,
            )
        budget = self.options.rollouts() if self.report_groups else None
        step, selection = self.select(self.batch_size, rollouts=budget)
        if budget is not None and (
            selection.rollouts is None or len(selection.rollouts) != len(selection.prompt_ids)
        ):
            raise RuntimeError(
                f"the selector answered step {step} without a rollout count per prompt; it does not "
                "implement the rollout budget (docs/api.md): upgrade it or leave rollout_budget unset"
            )
        if not self.report_groups:
            self.open_step, self.open_ids = step, list(selection.prompt_ids)
        counts = None if budget is None else [int(n) for n in selection.rollouts or []]
        return SelectedStep(step, [self._row_of[pid] for pid in selection.prompt_ids], counts)

    # --- verl curriculum hook ------------------------------------------------------------------------
    def update(self, batch: Any) -> None:
        """Report the finished step's groups to ``/observe`` (verl calls this after each step)."""
        if self.open_step is None:
            raise RuntimeError(
                "update() was called without a selected step: the sampler selected nothing yet"
            )
        ids = batch_prompt_ids(batch)
        key = self.options.reward_key or DEFAULT_REWARD_KEY
        # TensorDict refuses `key in td`; membership has to go through keys().
        if key not in batch.batch.keys():  # noqa: SIM118
            raise KeyError(f"the batch has no {key!r} tensor; set data.sampler.selector.reward_key")
        scores = batch.batch[key].sum(dim=-1).tolist()
        results = group_results(ids, scores)
        if self.group_size is not None:
            check_group_sizes(
                results,
                self.group_size,
                f"set {GROUP_OPTION}={self.group_size}, or use a new dataset name with "
                f"+{SAMPLER_SECTION}.rollouts_per_prompt equal to {GROUP_OPTION} (nothing of this step was reported)",
            )
        reported = {r.prompt_id for r in results}
        if reported != set(self.open_ids):
            missing = sorted(set(self.open_ids) - reported)[:8]
            extra = sorted(reported - set(self.open_ids))[:8]
            raise RuntimeError(
                f"step {self.open_step}: the batch holds other prompts than the ones selected (missing {missing}, "
                f"unexpected {extra}). Group filtering (algorithm.filter_groups) and other samplers are not "
                "supported: every selected group must be reported"
            )
        step = self.open_step
        observe_exactly_once(
            self.client,
            self.options.dataset,
            step,
            results,
            request_id(self.run_id, step),
            selected_step=step,
        )
        self.open_step, self.open_ids = None, []
