"""verl 0.9's v1 trainer (``trainer.use_v1=True``, verl's default) with prompts chosen by the selector
service, in each of its modes: ``sync``, ``colocate_async`` and ``separate_async``
(``trainer.v1.trainer_mode``).

What the v1 trainer offers, read off the verl 0.9.1 wheel (``verl/trainer/ppo/v1/``):

- ``trainer_base.py`` ``PPOTrainer._init_dataloader`` (line 743-750) builds the prompt loader as
  ``StatefulDataLoader(..., batch_size=gen_batch_size, sampler=create_rl_sampler(self.config.data,
  self.train_dataset))``; lines 727-739 force ``data.gen_batch_size=1`` in the asynchronous modes and
  with ``algorithm.filter_groups`` (refills are counted in prompts). ``_fetch_one_gen_batch`` /
  ``_next_train_batch`` (lines 1466-1494) pull the prompts from it: one training batch per step
  (``prepare_step``), warm-up batches in the asynchronous modes (``_add_async_warmup_batches``) and
  exact refills for groups the replay buffer evicts (``_add_prompts_to_generate``, the buffer's
  ``refill_fn``). So `SelectorCurriculumSampler` stands in for ``create_rl_sampler`` and selects
  before rollout: one service step per ``data.train_batch_size`` prompts pulled, selected when its
  first prompt is pulled, however many prompts a fetch takes.
- ``agent_loop_tq.py`` ``AgentLoopWorkerTQ._run_prompt`` (line 115) reads each prompt's rollout count
  from its ``__rollout_n__`` field (default ``actor_rollout_ref.rollout.n``): with a rollout budget each
  prompt carries the count the service gave it. Every field of a prompt is also stored with each of its
  trajectories (``_agent_loop_postprocess``, ``field.update(kwargs)``, line 195) and, in the
  asynchronous modes, with the prompt itself for checkpoint recovery (``_submit_batch_to_rollout``,
  line 1506); so each prompt is tagged with its service step and prompt id (`STEP_FIELD`,
  `PROMPT_FIELD`) and those tags survive a resume.
- ``replay_buffer.py`` ``ReplayBuffer``: rollouts live in TransferQueue; each prompt's group has a
  status tag (pending, running, finished, failure) that ``_sync_metadata_from_transfer_queue``
  (line 201) reads at every poll, before any eviction (DAPO's ``filter_groups``, staleness under the
  ``drop`` strategy, failed groups) or sampling. The reporting buffer (`ReportingBuffer`) reports
  every group the first time a poll sees it finished, with its rewards (``rm_scores`` summed over
  tokens, before any KL penalty; the last output of each session), so groups that are then filtered or
  evicted as stale are reported too. ``trainer.v1.sampler.custom_sampler`` plugs in a buffer that picks
  among groups already rolled out: that is not selection before rollout, and it is refused here.
- GRPO on v1 (``utils.py`` ``compute_advantage_for_multi_trajectories``, line 587, then
  ``core_algos.compute_grpo_outcome_advantage``) groups trajectories by each prompt's ``uid``, so
  groups of their own sizes get their own means and deviations.

Reports: each group is one ``/observe`` with request id ``{run_id}-s{step}-p{prompt}`` and its
``selected_step``, so a group that finishes more than the dataset's ``max_lag`` steps after its
selection (one response spanning several updates; a group still generating at a checkpoint, re-issued
by the resumed process) is filed at the service's open step instead of refused; a resent report (a
resumed run polling groups its TransferQueue checkpoint restored) is a duplicate. A group the service
refuses nonetheless is logged and counted in ``ReportingBuffer.lost``; one whose request id was already applied with other rewards (a group that
was running at the checkpoint, reported by the crashed run and rolled out again after the resume)
keeps its first report and is counted in ``superseded``: nothing is counted twice.

Service steps in the asynchronous modes: a step per trainer update (``data.train_batch_size`` prompts
pulled), selected while the previous steps' groups are still generating. Their reports are late by
how many steps were selected after theirs (docs/methods.md, 3.1); `default_max_lag` derives the
dataset's ``max_lag`` from the replay buffer's ``max_off_policy_threshold`` and the warm-up.

Launch: ``python -m rlvr_selector_client.integrations.verl_main`` (the same entry point as the legacy
trainer; ``trainer.use_v1=False`` picks the legacy route) with ``trainer.v1.trainer_mode=...``.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Any

from rlvr_selector_client.client import Conflict
from rlvr_selector_client.integrations import log_too_late, observe_exactly_once, one_group
from rlvr_selector_client.integrations.verl import SelectorCurriculumSampler, replace_name

__all__ = [
    "PROMPT_FIELD",
    "STEP_FIELD",
    "ReportingBuffer",
    "check_v1_config",
    "default_max_lag",
    "install",
    "selector_sampler",
    "selector_trainer_class",
]

logger = logging.getLogger(__name__)

#: Per-prompt fields the trainer adds to each prompt; verl stores them with every trajectory.
STEP_FIELD = "selector_step"
PROMPT_FIELD = "selector_prompt_id"
ROLLOUT_N_FIELD = "__rollout_n__"  # read by verl's AgentLoopWorkerTQ._run_prompt (agent_loop_tq.py:115)
TRAIN_PARTITION = "train"

#: Advantage estimators a rollout budget can be used with: GRPO (``core_algos.compute_grpo_outcome_advantage``)
#: and RLOO (``compute_rloo_outcome_advantage``) group trajectories by prompt uid and take each group's
#: own size. The others assume ``actor_rollout_ref.rollout.n`` rollouts per prompt or no groups at all,
#: and are refused with a budget (`check_v1_config`).
GROUPED_ESTIMATORS = ("grpo", "rloo")


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    node = config
    for part in dotted.split("."):
        if node is None:
            return default
        getter = getattr(node, "get", None)
        node = getter(part, None) if getter is not None else getattr(node, part, None)
    return default if node is None else node


def default_max_lag(config: Any) -> int:
    """How many steps late a report is filed at its own step, for a dataset created by the adapter.

    A group is reported when a poll of the replay buffer first sees it finished; its lag is the number
    of service steps selected after its own by then, i.e. the prompts pulled meanwhile divided by
    ``data.train_batch_size``:

    - ``sync`` without ``filter_groups``: 0 (each step is rolled out and reported before the next is
      selected). With ``filter_groups``: refills pull the next steps' prompts while a step's groups
      are still generating, at most ``max_inflight_gen_batches`` batches in flight: that + 1.
    - asynchronous modes: ``num_warmup_batches`` batches are selected ahead at the start, and each
      update pulls a batch (``prepare_step``) plus one prompt per group the buffer evicts (stale under
      ``drop``, filtered, failed: ``replay_buffer.py`` 576-584), so an update can pull more than one
      step. A group that finishes within ``max_off_policy_threshold`` updates (one step each) is within
      ``ceil(num_warmup_batches) + max_off_policy_threshold + 1``, one more with ``filter_groups``. A
      null threshold (no staleness control) counts as verl's default, 8.

    In the asynchronous modes only ``wait`` bounds how late a group finishes (sampling blocks while a
    group in flight has spanned ``max_off_policy_threshold`` updates, ``replay_buffer.py`` 548-554):
    ``drop``, verl's default, evicts only groups that have finished (``_stale_terminal_keys``,
    520-529), so a group with one long response spans any number of updates, and a resumed process
    re-issues the groups that were in flight at its checkpoint under their original step. Such reports
    carry their ``selected_step`` and are filed at the service's open step (docs/api.md section 4), not
    refused; ``max_lag`` only decides which late reports keep their own step.
    ``+data.sampler.selector.max_lag`` overrides it.
    """
    mode = _get(config, "trainer.v1.trainer_mode", "sync")
    filtering = bool(_get(config, "algorithm.filter_groups.enable", False))
    if mode == "sync":
        if not filtering:
            return 0
        return int(_get(config, "algorithm.filter_groups.max_inflight_gen_batches", 1)) + 1
    threshold = _get(config, "trainer.v1.sampler.max_off_policy_threshold", None)
    threshold = 8 if threshold is None else int(threshold)
    warmup = math.ceil(float(_get(config, f"trainer.v1.{mode}.num_warmup_batches", 1) or 0))
    return warmup + threshold + 1 + (1 if filtering else 0)


def check_v1_config(config: Any) -> None:
    """Refuse v1 settings the selector cannot honour, with the fix (before Ray starts)."""
    if _get(config, "data.sampler.class_path"):
        raise ValueError(
            "data.sampler.class_path is the verl 0.5-0.7 route; with this entry point leave it out and keep "
            "the +data.sampler.selector.* keys"
        )
    custom = _get(config, "trainer.v1.sampler.custom_sampler")
    if custom is not None and _get(custom, "path") and _get(custom, "name"):
        raise ValueError(
            "trainer.v1.sampler.custom_sampler replaces verl's replay buffer, which picks among groups already "
            "rolled out; the selector chooses the prompts before rollout and reports from verl's own buffer. "
            "Leave trainer.v1.sampler.custom_sampler unset"
        )
    if _get(config, "data.dataloader_num_workers", 0):
        raise ValueError(
            "data.dataloader_num_workers must be 0 with the selector: loader workers prefetch prompts of "
            "steps that are not selected yet"
        )
    selector = _get(config, "data.sampler.selector")
    budget = _get(selector, "rollout_budget") if selector is not None else None
    if budget is None:
        return
    estimator = str(_get(config, "algorithm.adv_estimator", "grpo"))
    if estimator not in GROUPED_ESTIMATORS:
        raise ValueError(
            f"data.sampler.selector.rollout_budget gives prompts their own rollout counts, but "
            f"algorithm.adv_estimator={estimator} assumes actor_rollout_ref.rollout.n rollouts per prompt "
            f"(or no groups); use one of {', '.join(GROUPED_ESTIMATORS)} or leave rollout_budget unset"
        )
    low = int(_get(selector, "rollout_min", 1))
    if low < 2:
        raise ValueError(
            f"data.sampler.selector.rollout_min={low}: a group of one rollout has no spread, and verl's GRPO "
            "then uses its raw reward as the advantage (mean 0, std 1); set rollout_min >= 2"
        )


def selector_sampler(data_config: Any, dataset: Any) -> SelectorCurriculumSampler:
    """Stands in for verl's ``create_rl_sampler`` inside the v1 trainer (``trainer_base.py`` line 749):
    one service step per ``data.train_batch_size`` prompts, whatever ``data.gen_batch_size`` verl set.

    ``_init_dataloader`` calls it with ``self.config.data``; the whole config (for the mode, the buffer's
    threshold, the filter and the group size ``actor_rollout_ref.rollout.n``) is read from the trainer
    being built (`_building`)."""
    config = _building.get("config")
    step_size = int(_get(data_config, "train_batch_size"))
    group_size = _get(config, "actor_rollout_ref.rollout.n") if config is not None else None
    return SelectorCurriculumSampler(
        dataset,
        data_config,
        step_size=step_size,
        report_groups=True,
        max_lag=default_max_lag(config) if config is not None else 0,
        group_size=None if group_size is None else int(group_size),
    )


#: The config of the trainer whose loader is being built: verl hands ``create_rl_sampler`` only
#: ``config.data``, and the default ``max_lag`` depends on the mode and the replay buffer's settings.
_building: dict[str, Any] = {}


class ReportingBuffer:
    """Mixed into verl's replay buffer (``ReplayBuffer`` in sync mode, ``ReplayBufferAsync`` otherwise):
    every poll reports the groups it sees finished (or failed with some sessions done) for the first
    time, before verl evicts, filters or samples any of them."""

    selector_sampler: SelectorCurriculumSampler | None = None

    def _sync_metadata_from_transfer_queue(self) -> None:
        super()._sync_metadata_from_transfer_queue()  # type: ignore[misc]
        if self.selector_sampler is not None:
            self.report_new_groups()

    # --- what the buffer has seen -------------------------------------------------------------------
    def _selector_state(self) -> dict[str, Any]:
        state = self.__dict__.get("_selector")
        if state is None:
            state = {"reported": set(), "lost": [], "superseded": [], "acks": []}
            self.__dict__["_selector"] = state
        return state

    @property
    def lost(self) -> list[tuple[int, int]]:
        """(step, prompt id) of groups the service refused as too late."""
        return self._selector_state()["lost"]

    @property
    def superseded(self) -> list[tuple[int, int]]:
        """(step, prompt id) of groups whose first report (an earlier attempt) was kept."""
        return self._selector_state()["superseded"]

    @property
    def reports(self) -> list[dict[str, Any]]:
        """Every report sent: the group's uid, step, prompt id, rewards, and the answer's duplicate and
        lag (or ``refused``)."""
        return self._selector_state()["acks"]

    def report_new_groups(self) -> None:
        import transfer_queue as tq

        state = self._selector_state()
        reported: set[str] = state["reported"]
        partition = TRAIN_PARTITION
        prompts = self.prompt_global_steps[partition]  # type: ignore[attr-defined]
        reported &= set(prompts)  # uids no longer in TransferQueue were trained on or evicted
        terminal = self.finished_keys[partition] | self.failure_keys[partition]  # type: ignore[attr-defined]
        new = terminal - reported
        if not new:
            return
        keys = [key for key in self.partitions[partition] if key.split("_", 1)[0] in new]  # type: ignore[attr-defined]
        groups: dict[str, dict[int, tuple[int, float]]] = defaultdict(dict)
        tags: dict[str, tuple[int, int]] = {}
        if keys:
            data = tq.kv_batch_get(
                keys=keys, partition_id=partition, select_fields=["rm_scores", STEP_FIELD, PROMPT_FIELD]
            )
            scores = list(data["rm_scores"])
            steps = data[STEP_FIELD].tolist()
            prompt_ids = data[PROMPT_FIELD].tolist()
            for key, score, step, prompt_id in zip(keys, scores, steps, prompt_ids, strict=True):
                uid, session, index = key.rsplit("_", 2)
                # A multi-output agent loop's reward is its session's last output's (agent_loop_tq.py:172).
                previous = groups[uid].get(int(session))
                if previous is None or previous[0] < int(index):
                    groups[uid][int(session)] = (int(index), float(score.sum().item()))
                tags[uid] = (int(step), int(prompt_id))
        for uid in sorted(new):
            reported.add(uid)
            if uid not in tags:
                logger.warning("prompt group %s ended without any finished rollout: nothing to report", uid)
                continue
            step, prompt_id = tags[uid]
            rewards = [reward for _, (_, reward) in sorted(groups[uid].items())]
            self._report(uid, step, prompt_id, rewards)

    def _report(self, uid: str, step: int, prompt_id: int, rewards: list[float]) -> None:
        sampler = self.selector_sampler
        assert sampler is not None
        state = self._selector_state()
        results, request_id = one_group(sampler.run_id, step, prompt_id, rewards)
        entry: dict[str, Any] = {"uid": uid, "step": step, "prompt_id": prompt_id, "rewards": rewards}
        try:
            # selected_step: a group that finishes more than max_lag steps after its selection (a response
            # spanning several updates, a group re-issued by a resumed run) is filed at the open step.
            ack = observe_exactly_once(
                sampler.client, sampler.options.dataset, step, results, request_id, selected_step=step
            )
        except Conflict as exc:
            entry["refused"] = str(exc)
            if "different body" in str(exc):
                logger.info(
                    "prompt %d of step %d was reported before (an earlier attempt of this run); its first "
                    "report is kept",
                    prompt_id,
                    step,
                )
                state["superseded"].append((step, prompt_id))
            else:
                log_too_late(
                    prompt_id,
                    step,
                    str(exc),
                    "raise the dataset's max_lag (+data.sampler.selector.max_lag, for a new dataset) or lower "
                    "trainer.v1.sampler.max_off_policy_threshold",
                )
                state["lost"].append((step, prompt_id))
        else:
            entry.update(duplicate=ack.duplicate, lag=ack.lag)
        state["acks"].append(entry)


def _reporting_class(buffer_class: type) -> type:
    if issubclass(buffer_class, ReportingBuffer):
        return buffer_class
    return type(f"Selector{buffer_class.__name__}", (ReportingBuffer, buffer_class), {})


class SelectorV1Trainer:
    """Mixed into each v1 trainer class (`selector_trainer_class`): builds the selector's sampler and
    reporting buffer, and tags every prompt with its service step, prompt id and rollout count."""

    def _build_replay_buffer(self) -> Any:
        buffer = super()._build_replay_buffer()  # type: ignore[misc]
        # verl picks the buffer class itself (trainer_base.py:139-185; sync or async, DAPO kwargs only
        # for its own classes); the reporting mixin goes on top of the class it chose.
        buffer.__class__ = _reporting_class(type(buffer))
        return buffer

    def _init_dataloader(self) -> None:
        _building["config"] = self.config  # type: ignore[attr-defined]
        try:
            super()._init_dataloader()  # type: ignore[misc]
        finally:
            _building.pop("config", None)
        sampler = self.train_dataloader.sampler  # type: ignore[attr-defined]
        if not isinstance(sampler, SelectorCurriculumSampler):
            raise TypeError(
                f"the v1 prompt loader's sampler is {type(sampler).__name__}, not the selector's; run the "
                "trainer through rlvr_selector_client.integrations.verl_main (or call verl_v1.install() first)"
            )
        self.replay_buffer.selector_sampler = sampler  # type: ignore[attr-defined]

    def _fetch_one_gen_batch(self) -> Any:
        import torch

        batch = super()._fetch_one_gen_batch()  # type: ignore[misc]
        sampler: SelectorCurriculumSampler = self.train_dataloader.sampler  # type: ignore[attr-defined]
        issued = sampler.take_issued(len(batch))
        indexes = [_row_index(info) for info in batch["extra_info"]]
        if indexes != [item.prompt_id for item in issued]:
            raise RuntimeError(
                f"the loader's rows (extra_info.index {indexes}) are not the ones the sampler handed out "
                f"({[item.prompt_id for item in issued]})"
            )
        batch[STEP_FIELD] = torch.tensor([item.step for item in issued], dtype=torch.int64)
        batch[PROMPT_FIELD] = torch.tensor([item.prompt_id for item in issued], dtype=torch.int64)
        counts = [item.rollouts for item in issued]
        if any(count is not None for count in counts):
            default = int(self.config.actor_rollout_ref.rollout.n)  # type: ignore[attr-defined]
            batch[ROLLOUT_N_FIELD] = torch.tensor(
                [default if c is None else c for c in counts], dtype=torch.int64
            )
        return batch

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().fit(*args, **kwargs)  # type: ignore[misc]
        finally:
            # Groups that finished after the last step's sample are reported too (asynchronous modes
            # end with warm-up batches generated ahead of training).
            try:
                self.replay_buffer._sync_metadata_from_transfer_queue()  # type: ignore[attr-defined]
            except Exception:  # pragma: no cover - TransferQueue already closed
                logger.exception("could not report the groups that finished after the last step")


def _row_index(info: Any) -> int:
    info = getattr(info, "data", info)
    if not isinstance(info, dict) or info.get("index") is None:
        raise ValueError("a prompt lacks extra_info.index; verl would report it as prompt 0")
    return int(info["index"])


_TRAINER_CLASSES: dict[type, type] = {}


def selector_trainer_class(base: type) -> type:
    """The selector's version of a v1 trainer class (``PPOTrainerSync``, ``PPOTrainerColocateAsync``,
    ``PPOTrainerSeparateAsync`` or a registered custom one)."""
    if issubclass(base, SelectorV1Trainer):
        return base
    found = _TRAINER_CLASSES.get(base)
    if found is None:
        found = type(f"Selector{base.__name__}", (SelectorV1Trainer, base), {})
        _TRAINER_CLASSES[base] = found
    return found


def install() -> None:
    """Point the v1 trainer at the selector (in this process): its prompt loader's sampler, and the
    trainer class `verl.trainer.main_ppo.TaskRunnerV1` looks up. Idempotent."""
    import verl.trainer.ppo.v1 as v1
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    replace_name(trainer_base, "create_rl_sampler", selector_sampler)
    original = getattr(v1.get_trainer_cls, "_verl_original", v1.get_trainer_cls)

    def get_trainer_cls(name: str) -> type:
        return selector_trainer_class(original(name))

    get_trainer_cls._verl_original = original  # type: ignore[attr-defined]
    v1.get_trainer_cls = get_trainer_cls
