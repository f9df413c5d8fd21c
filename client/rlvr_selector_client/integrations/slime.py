"""slime recipe: prompts chosen by the selector service, every rolled-out group reported.

slime (THUDM's Megatron + SGLang RL framework; not on PyPI) has two plug-in points this uses, both
given as ``module.path`` strings on its command line:

``--data-source-path rlvr_selector_client.integrations.slime.SelectorDataSource``
    slime constructs the data source with its parsed ``args`` and asks it for prompt groups with
    ``get_samples(num_samples) -> list[list[Sample]]`` (one inner list of ``n_samples_per_prompt``
    copies per prompt), hands back aborted partial-rollout groups with ``add_samples(groups)``, and
    checkpoints it with ``save(rollout_id)`` / ``load(rollout_id)``. `SelectorDataSource` loads the
    prompts with slime's own ``RolloutDataSource`` (same ``--prompt-data``, ``--input-key``,
    ``--label-key``, ``--metadata-key`` handling), and each ``get_samples`` call is one service step:
    ``/select`` picks the prompts, and every sample carries ``metadata["selector_step"]`` and
    ``metadata["selector_prompt_id"]``.

``--rollout-all-samples-process-path rlvr_selector_client.integrations.slime.report_all_samples``
    slime calls ``f(args, all_samples, data_source)`` after each rollout with every generated group,
    including the groups dynamic sampling (``--dynamic-sampling-filter-path``) dropped, before the
    training batch is built. `report_all_samples` groups the rewards by (step, prompt) and reports each
    step with ``/observe`` (request id ``{run_id}-s{step}-`` and the report's prompts, `request_id`: a
    retried report counts once, and groups of one step finished in two rollouts are two reports).

Settings come from the environment (slime's ``args`` has no room for them), read by `SelectorOptions`
as in every adapter: ``SELECTOR_URL``, ``SELECTOR_DATASET``, ``SELECTOR_STRATEGY`` (default insight),
``SELECTOR_SEED``, ``SELECTOR_API_TOKEN``, ``SELECTOR_MAX_LAG`` (for slime's asynchronous training,
where rollout ``r + 1`` is generated while ``r`` trains; default 2). Every report names its
``selected_step``, so a group later than that is filed at the open step rather than refused. The
service dataset's ``rollouts_per_prompt`` must be ``--n-samples-per-prompt`` (refused otherwise). The prompt id of a row is ``metadata["prompt_id"]`` (write it with
``--metadata-key``), or else the row's position in the prompt file; ids must be ``0..N-1``.

Rewards: ``sample.reward`` when it is a number, else ``sample.reward[args.reward_key]``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr_selector_client.client import SelectorClient
from rlvr_selector_client.integrations import (
    SelectorOptions,
    StepSampler,
    check_permutation,
    ensure_dataset,
    group_results,
    new_run_id,
    observe_exactly_once,
    request_id,
)

__all__ = ["SelectorDataSource", "report_all_samples", "sample_reward"]

logger = logging.getLogger(__name__)

STEP_KEY = "selector_step"
PROMPT_KEY = "selector_prompt_id"
#: How many steps late a report is filed at its own step when SELECTOR_MAX_LAG is unset: slime's
#: asynchronous training generates rollout r + 1 while r trains, and aborted groups finish a rollout later.
DEFAULT_MAX_LAG = 2


def _inner_source(args: Any) -> Any:
    """slime's own data source, for its prompt loading; imported here so this module imports without slime."""
    from slime.rollout.data_source import RolloutDataSource  # type: ignore[import-not-found]

    return RolloutDataSource(args)


class SelectorDataSource(StepSampler):
    """slime data source whose ``get_samples`` asks the selector service (see the module docstring).

    Its checkpoint (``save`` / ``load``) is the sampler state of every adapter (`StepSampler`) plus
    slime's sample and group counters."""

    def __init__(self, args: Any, *, client: SelectorClient | None = None, inner: Any = None) -> None:
        self.args = args
        if not getattr(args, "rollout_global_dataset", True):
            raise ValueError(
                "SelectorDataSource needs --rollout-global-dataset (the prompts come from --prompt-data)"
            )
        self.inner = inner if inner is not None else _inner_source(args)
        self.prompts: list[Any] = list(self.inner.dataset.origin_samples)
        ids = [self._prompt_id(row, sample) for row, sample in enumerate(self.prompts)]
        self.row_of = check_permutation(ids, "slime prompt data (metadata prompt_id)")
        # The same SELECTOR_* variables, read the same way, as every adapter's options.
        self.options = SelectorOptions.resolve({}, os.environ, where="slime's selector")
        self.max_lag = DEFAULT_MAX_LAG if self.options.max_lag is None else self.options.max_lag
        if client is not None:
            self.options.client = client
        self.client = self.options.connect()
        self.client.check_server()
        self.next_step = self._ensure_dataset()
        self.run_id: str = new_run_id(None, "slime")
        self.buffer: list[list[Any]] = []
        self.sample_index = 0
        self.group_index = 0

    @staticmethod
    def _prompt_id(row: int, sample: Any) -> int:
        metadata = getattr(sample, "metadata", None) or {}
        value = metadata.get("prompt_id") if isinstance(metadata, Mapping) else None
        return row if value is None else value

    def _ensure_dataset(self) -> int:
        return ensure_dataset(
            self.client,
            self.options,
            len(self.prompts),
            int(self.args.n_samples_per_prompt),
            max_lag=self.max_lag,
            what="--prompt-data",
            group_option="--n-samples-per-prompt",
        )

    def __len__(self) -> int:
        return len(self.prompts)

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        """Groups handed back by ``add_samples`` first, then one selected step of ``num_samples`` prompts."""
        groups = self.buffer[:num_samples]
        del self.buffer[:num_samples]
        needed = num_samples - len(groups)
        if needed == 0:
            return groups
        step, selection = self.select(needed)
        n = int(self.args.n_samples_per_prompt)
        for prompt_id in selection.prompt_ids:
            group = []
            for _ in range(n):
                sample = copy.deepcopy(self.prompts[self.row_of[prompt_id]])
                metadata = dict(getattr(sample, "metadata", None) or {})
                metadata[STEP_KEY], metadata[PROMPT_KEY] = step, prompt_id
                sample.metadata = metadata
                sample.group_index = self.group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.group_index += 1
            groups.append(group)
        return groups

    def add_samples(self, samples: list[list[Any]]) -> None:
        """Aborted partial rollouts come back here; they keep their step and are handed out again."""
        for group in samples:
            if len(group) != int(self.args.n_samples_per_prompt):
                raise ValueError(f"a returned group has {len(group)} samples, not n_samples_per_prompt")
            self.buffer.append(group)

    def _state_path(self, root: str, rollout_id: int) -> Path:
        return Path(root) / "rollout" / f"selector_data_source_{rollout_id}.json"

    def save(self, rollout_id: int) -> None:
        root = getattr(self.args, "save", None)
        if not root:
            return
        path = self._state_path(root, rollout_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = self.state_dict() | {"sample_index": self.sample_index, "group_index": self.group_index}
        path.write_text(json.dumps(state))

    def load(self, rollout_id: int | None = None) -> None:
        root = getattr(self.args, "load", None)
        if not root or rollout_id is None:
            return
        path = self._state_path(root, rollout_id)
        if not path.exists():
            logger.info("no selector data source state at %s", path)
            return
        state = json.loads(path.read_text())
        self.load_state_dict(state)
        self.sample_index = int(state["sample_index"])
        self.group_index = int(state["group_index"])


def sample_reward(sample: Any, reward_key: str | None) -> float:
    reward = sample.reward
    if isinstance(reward, Mapping):
        if not reward_key or reward_key not in reward:
            raise KeyError(
                f"sample.reward is a dict {sorted(reward)}; set --reward-key to the verifiable reward"
            )
        reward = reward[reward_key]
    if reward is None:
        raise ValueError(f"sample {getattr(sample, 'index', '?')} has no reward")
    return float(reward)


def report_all_samples(args: Any, all_samples: Sequence[Sequence[Any]], data_source: Any) -> None:
    """slime's ``--rollout-all-samples-process-path`` hook: report every generated group, kept or filtered."""
    if not isinstance(data_source, SelectorDataSource):
        raise TypeError(
            "report_all_samples needs --data-source-path rlvr_selector_client.integrations.slime.SelectorDataSource"
        )
    by_step: dict[int, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for group in all_samples:
        for sample in group:
            metadata = getattr(sample, "metadata", None) or {}
            if STEP_KEY not in metadata:
                raise KeyError(
                    "a rolled-out sample has no selector step; it did not come from SelectorDataSource"
                )
            ids, rewards = by_step[int(metadata[STEP_KEY])]
            ids.append(int(metadata[PROMPT_KEY]))
            rewards.append(sample_reward(sample, getattr(args, "reward_key", None)))
    for step in sorted(by_step):
        ids, rewards = by_step[step]
        results = group_results(ids, rewards)
        observe_exactly_once(
            data_source.client,
            data_source.options.dataset,
            step,
            results,
            request_id(data_source.run_id, step, prompts=ids),
            selected_step=step,
        )
