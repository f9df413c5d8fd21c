"""SkyRL adapter: SkyRL's PPO/GRPO trainer (``skyrl.train.trainer.RayPPOTrainer``, SkyRL 0.3) trains on the
prompts the selector service picks and reports every group it rolls out.

The seams, in the installed wheel (skyrl 0.3.0):

- Selection: ``RayPPOTrainer._build_train_dataloader_and_compute_training_steps`` (skyrl/train/trainer.py,
  line 214) is the hook SkyRL documents for a custom train dataloader; the trainer iterates
  ``self.train_dataloader`` once per step (line 329) and checkpoints its ``state_dict`` with every
  checkpoint (``data.pt``, line 1651; restored at line 1774). `SelectorRayPPOTrainer` builds there a
  ``StatefulDataLoader`` whose sampler (`SelectorSampler`) asks ``/select`` for one service step per
  dataloader batch (``trainer.train_batch_size`` prompts) when the batch is needed, not before.
- Observation: ``RayPPOTrainer.generate`` (line 970) is what the training loop awaits for every
  dataloader batch's rollouts (line 360), before dynamic sampling may drop groups and before the rewards
  are turned into per-token rewards; evaluation calls the generator directly (lines 247-259), not this
  method. `SelectorRayPPOTrainer.generate` reports each rollout's reward grouped by prompt, one
  ``/observe`` per step with request id ``{run_id}-s{step}`` and that step as its ``selected_step``, on
  the trainer's event loop (async client).
  SkyRL's callbacks (skyrl/train/utils/callbacks.py, ``on_step_end``) are not used: the batch they get has
  had its ``rewards`` and ``uids`` removed (trainer.py lines 434-436), and groups that dynamic sampling
  filtered out never reach it.

Each prompt of a step is one row of the train ``PromptDataset``, identified by its integer ``prompt_id``
column (a permutation of ``0..len-1``; SkyRL drops prompts longer than ``max_prompt_length`` before
training, so never the row position). The row's ``uid`` (SkyRL uses the row index, skyrl/train/dataset/
dataset.py line 92) becomes ``s{step}-p{prompt_id}``: GRPO still groups by it, and the reports know
which step and prompt each rollout belongs to.

Which reward: a SkyRL trajectory has one reward, its environment's (skyrl-gym's ``step`` returns one
``reward`` per turn; the generator puts it on the turn's last token), and GRPO scores a trajectory by the
sum of its token-level rewards (``compute_grpo_outcome_advantage``,
skyrl/backends/skyrl_train/utils/ppo_utils.py line 1310). That sum is reported (a response-level reward
as it is; with step-wise trajectories, the reward of the episode's last turn). There is nothing to
choose between, so a ``reward_key`` in the options is refused rather than ignored.

Group size: ``generator.n_samples_per_prompt`` is the service dataset's ``rollouts_per_prompt``; an
existing dataset created with another is refused at start, naming both. Settings left out of the options
come from the ``SELECTOR_*`` environment variables (`SelectorOptions`).

Rollout counts: SkyRL rolls out every prompt ``generator.n_samples_per_prompt`` times
(``prepare_generator_input``, skyrl/train/generators/utils.py lines 498-507) and its mini-batch
boundaries assume it, so per-prompt counts are not supported: a ``rollout_budget`` is refused.

Resuming (``trainer.resume_mode``): the dataloader state restores the sampler, which continues at the
step after the checkpoint's or the service's latest, whichever is later (a checkpoint taken in the
middle of a step resumes at the next step); the run id is kept, and a step is never selected twice.

Usage (in your own entry point, like SkyRL's examples; examples/skyrl_grpo.py is a complete one)::

    from rlvr_selector_client.integrations.skyrl import SelectorOptions, SelectorPPOExp

    SelectorPPOExp(cfg, selector=SelectorOptions(url="http://selector:8000", dataset="gsm8k-skyrl")).run()

or SkyRL's own launcher: ``python -m skyrl.train.entrypoints.main_base
trainer.override_entrypoint=rlvr_selector_client.integrations.skyrl ...`` with ``SELECTOR_URL`` and
``SELECTOR_DATASET`` in the environment.

Not covered: SkyRL's fully asynchronous trainer (skyrl/train/fully_async_trainer.py), which builds its own
dataloader and generation loop. SkyRL 0.3.0 needs Python 3.12 to import its trainer (skyrl/tinker/types.py
line 132 declares a ``typing.TypedDict`` inside a pydantic model, which pydantic refuses on 3.11).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.trainer import RayPPOTrainer
from torch.utils.data import Sampler

from rlvr_selector_client.client import AsyncSelectorClient, Conflict, SelectorClient
from rlvr_selector_client.integrations import (
    SelectedStep,
    SelectorOptions,
    StepIterator,
    StepSampler,
    check_permutation,
    ensure_dataset,
    group_results,
    new_run_id,
    observe_exactly_once_async,
    request_id,
)

__all__ = [
    "GROUP_OPTION",
    "SelectorOptions",
    "SelectorPPOExp",
    "SelectorPromptDataset",
    "SelectorRayPPOTrainer",
    "SelectorSampler",
    "main",
]

logger = logging.getLogger(__name__)

#: SkyRL's setting for the rollouts per prompt (the dataset's ``rollouts_per_prompt``).
GROUP_OPTION = "generator.n_samples_per_prompt"


def selector_uid(step: int, prompt_id: int) -> str:
    """The ``uid`` of a selected row: GRPO groups by it; `parse_uid` reads it back."""
    return f"s{step}-p{prompt_id}"


def parse_uid(uid: str) -> tuple[int, int]:
    """(step, prompt id) of a `selector_uid`."""
    if not uid.startswith("s") or "-p" not in uid:
        raise ValueError(
            f"rollout uid {uid!r} was not made by the selector's train dataloader; build the trainer as "
            "SelectorRayPPOTrainer (its dataloader names each row s<step>-p<prompt id>)"
        )
    step, prompt = uid[1:].split("-p", 1)
    return int(step), int(prompt)


class SelectorSampler(StepSampler, Sampler[int]):
    """One service step per dataloader batch of ``batch_size`` prompts; yields codes
    ``step * size + row`` that `SelectorPromptDataset` decodes."""

    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        client: SelectorClient,
        options: SelectorOptions,
        start_step: int,
        row_of: Mapping[int, int],
        run_id: str | None = None,
    ) -> None:
        if not 1 <= batch_size <= size:
            raise ValueError(f"train_batch_size {batch_size} does not fit the {size} prompts of the dataset")
        self.size = size
        self.batch_size = batch_size
        self.client = client
        self.options = options
        self.next_step = start_step
        self.row_of = dict(row_of)
        self.run_id = run_id

    def __len__(self) -> int:
        return self.steps_per_epoch() * self.batch_size

    def steps_per_epoch(self) -> int:
        return self.size // self.batch_size

    def __iter__(self) -> Iterator[int]:
        return StepIterator(self, self.steps_per_epoch())

    def select_step(self) -> SelectedStep:
        step, selection = self.select(self.batch_size)
        return SelectedStep(step, [step * self.size + self.row_of[int(pid)] for pid in selection.prompt_ids])


class SelectorPromptDataset:
    """SkyRL's ``PromptDataset`` read through the sampler's codes: row ``code % len`` with the uid
    `selector_uid` (step, prompt id)."""

    def __init__(self, dataset: Any, prompt_ids: Sequence[int]) -> None:
        self.dataset = dataset
        self.prompt_ids = [int(p) for p in prompt_ids]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, code: int) -> tuple[Any, Any, Any, str]:
        step, row = divmod(int(code), len(self.dataset))
        messages, env_class, extra, _ = self.dataset[row]
        return messages, env_class, extra, selector_uid(step, self.prompt_ids[row])

    def collate_fn(self, items: list[Any]) -> Any:
        return self.dataset.collate_fn(items)


class SelectorRayPPOTrainer(RayPPOTrainer):  # type: ignore[misc]
    """``RayPPOTrainer`` with the selector's train dataloader and a report of every step's rollouts (see
    the module docstring). Pass ``selector=SelectorOptions(...)``; the train dataset needs the integer
    ``options.id_column`` (default ``prompt_id``)."""

    def __init__(self, *args: Any, selector: SelectorOptions, **kwargs: Any) -> None:
        if selector.reward_key is not None:
            raise ValueError(
                f"reward_key={selector.reward_key!r}: a SkyRL trajectory has one reward, its environment's, "
                "and the selector reports it (summed over tokens, as GRPO scores it); leave reward_key unset "
                "and make the environment's reward the verifiable one"
            )
        self.selector = selector
        self.selector_client = selector.connect()
        self._async_clients: dict[int, AsyncSelectorClient] = {}
        #: Reports the service answered: (step, prompt ids, rollouts, duplicate).
        self.selector_reported: list[tuple[int, list[int], int, bool]] = []
        #: Steps the service refused as too late (409).
        self.selector_lost: list[int] = []
        super().__init__(*args, **kwargs)

    # --- selection ---------------------------------------------------------------------------------
    def _build_train_dataloader_and_compute_training_steps(self) -> None:
        if self.train_dataset is None:  # the Tinker backend feeds data itself
            super()._build_train_dataloader_and_compute_training_steps()
            return
        from torchdata.stateful_dataloader import StatefulDataLoader

        cfg, options, data = self.cfg, self.selector, self.train_dataset
        column = options.id_column
        frame = data.dataframe
        if column not in frame.column_names:
            raise ValueError(
                f"the train dataset has no {column!r} column; give every prompt its service prompt id "
                f"(0..len-1) in that column, or name the column with SelectorOptions(id_column=...)"
            )
        ids = list(frame[column])
        row_of = check_permutation(ids, f"train dataset column {column!r}")
        n = int(cfg.generator.n_samples_per_prompt)
        lag = options.max_lag if options.max_lag is not None else 0
        start = ensure_dataset(
            self.selector_client, options, len(data), n, max_lag=lag, group_option=GROUP_OPTION
        )
        if cfg.data.dataloader.num_workers:
            logger.info(
                "the selector's train dataloader runs without worker processes (data.dataloader.num_workers=%s "
                "would prefetch, and so select, steps before the earlier ones are reported)",
                cfg.data.dataloader.num_workers,
            )
        sampler = SelectorSampler(
            len(data),
            int(cfg.trainer.train_batch_size),
            client=self.selector_client,
            options=options,
            start_step=start,
            row_of=row_of,
            run_id=new_run_id(options.run_id, "skyrl"),
        )
        self.selector_sampler = sampler
        wrapped = SelectorPromptDataset(data, ids)
        self.train_dataloader = StatefulDataLoader(
            wrapped,  # type: ignore[arg-type]
            batch_size=sampler.batch_size,
            sampler=sampler,
            drop_last=True,
            num_workers=0,
            collate_fn=wrapped.collate_fn,
        )
        self.total_training_steps = len(self.train_dataloader) * cfg.trainer.epochs
        if cfg.trainer.max_training_steps is not None:
            self.total_training_steps = min(self.total_training_steps, cfg.trainer.max_training_steps)

    # --- observation -------------------------------------------------------------------------------
    async def generate(self, input_batch: Any) -> Any:
        output = await super().generate(input_batch)
        metadata = input_batch.get("batch_metadata")
        if metadata is None or getattr(metadata, "training_phase", "train") == "train":
            await self._report(input_batch, output)
        return output

    async def _report(self, input_batch: Any, output: Any) -> None:
        trajectories = output.get("trajectory_ids") or input_batch.get("trajectory_ids")
        if not trajectories:
            raise ValueError(
                "the generator returned no trajectory ids: cannot tell which prompt each reward is for"
            )
        rewards = list(output["rewards"])
        last = output.get("is_last_step")
        by_step: dict[int, tuple[list[int], list[float]]] = {}
        for i, (trajectory, reward) in enumerate(zip(trajectories, rewards, strict=True)):
            if last is not None and not last[i]:
                continue  # step-wise trajectories: the episode's reward is on its last turn
            step, prompt_id = parse_uid(trajectory.instance_id)
            value = sum(float(r) for r in reward) if isinstance(reward, list | tuple) else float(reward)
            ids, values = by_step.setdefault(step, ([], []))
            ids.append(prompt_id)
            values.append(value)
        run_id = self.selector_sampler.run_id
        assert run_id is not None
        for step, (ids, values) in sorted(by_step.items()):
            results = group_results(ids, values)
            try:
                ack = await self._send(step, results, request_id(run_id, step))
            except Conflict as exc:
                logger.error(
                    "the selector refused the rewards of step %d (%s); raise the dataset's max_lag",
                    step,
                    exc.detail,
                )
                self.selector_lost.append(step)
                continue
            self.selector_reported.append((step, sorted({int(p) for p in ids}), len(values), ack.duplicate))

    async def _send(self, step: int, results: list[Any], rid: str) -> Any:
        """The one place a report goes to the service (its request id makes a resend count once)."""
        return await observe_exactly_once_async(
            self._async_client(), self.selector.dataset, step, results, rid, selected_step=step
        )

    def _async_client(self) -> AsyncSelectorClient:
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(id(loop))
        if client is None:
            o, sync = self.selector, self.selector_client
            client = AsyncSelectorClient(
                o.url or sync.base_url, token=o.token, timeout=o.timeout, retries=o.retries
            )
            self._async_clients[id(loop)] = client
        return client


class SelectorPPOExp(BasePPOExp):  # type: ignore[misc]
    """SkyRL's ``BasePPOExp`` whose trainer is `SelectorRayPPOTrainer` (``selector``: the options; default
    from the ``SELECTOR_*`` environment variables)."""

    def __init__(self, cfg: Any, selector: SelectorOptions | None = None) -> None:
        self.selector = selector or SelectorOptions.resolve({}, os.environ, where="the environment")
        super().__init__(cfg)

    def get_trainer(
        self,
        cfg: Any,
        tracker: Any,
        tokenizer: Any,
        train_dataset: Any,
        eval_dataset: Any,
        inference_engine_client: Any,
        generator: Any,
        colocate_pg: Any,
    ) -> SelectorRayPPOTrainer:
        return SelectorRayPPOTrainer(
            cfg=cfg,
            tracker=tracker,
            tokenizer=tokenizer,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            inference_engine_client=inference_engine_client,
            generator=generator,
            colocate_pg=colocate_pg,
            selector=self.selector,
        )


def _run(cfg: Any, selector: SelectorOptions) -> None:
    SelectorPPOExp(cfg, selector).run()


def main(argv: Sequence[str] | None = None, selector: SelectorOptions | None = None) -> None:
    """SkyRL's ``main_base`` with `SelectorPPOExp`: what ``trainer.override_entrypoint`` runs. ``argv``:
    SkyRL's command-line overrides (default ``sys.argv[1:]``); ``selector``: the options (default: from
    the ``SELECTOR_*`` environment variables)."""
    import ray
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.utils import validate_cfg
    from skyrl.train.utils.utils import initialize_ray

    if selector is None:
        selector = SelectorOptions.resolve({}, os.environ, where="the environment")
    cfg = SkyRLTrainConfig.from_cli_overrides(list(sys.argv[1:] if argv is None else argv))
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(ray.remote(num_cpus=1)(_run).remote(cfg, selector))


if __name__ == "__main__":
    main()
