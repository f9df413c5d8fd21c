"""Adapters that let trainers people already use ask the selector service which prompts to train on.

- `trainer_client.integrations.verl`: a curriculum sampler for verl's PPO/GRPO trainer (0.5 to 0.7).
- `trainer_client.integrations.trl`: a `RepeatSampler`-shaped sampler, a reward-function wrapper and a
  `GRPOTrainer` subclass for TRL.

Both speak to the service only through `trainer_client.client.SelectorClient`, and both follow the same
rules as our own loop: a service prompt id is a stable integer per prompt (a dataset column, never a
row position that filtering can shift), each training step selects once, and every group of rollouts
is reported to ``/observe`` with a request id that makes a retried report count once.

This package imports neither verl nor TRL; each submodule imports its library when it is imported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from trainer_client.client import DatasetInfo, Result

__all__ = ["check_permutation", "first_step", "group_results"]


def first_step(info: DatasetInfo) -> int:
    """The step an adapter starts at: the open step of a dataset nobody has reported to yet, else the
    step after it (that step may hold another run's results; continuing it would mix two runs)."""
    if not info.observations:
        return info.open_step or 0
    return (info.open_step or 0) + 1


def group_results(prompt_ids: Iterable[int], rewards: Iterable[float]) -> list[Result]:
    """One `Result` per distinct prompt id with that prompt's rewards in order of appearance.

    Raises ValueError when the two sequences differ in length or a reward is not a finite number,
    because the service would reject the whole report and the error is clearer here.
    """
    ids = [int(i) for i in prompt_ids]
    values = [float(r) for r in rewards]
    if len(ids) != len(values):
        raise ValueError(f"{len(ids)} prompt ids but {len(values)} rewards; report one reward per completion")
    grouped: dict[int, list[float]] = {}
    for prompt_id, reward in zip(ids, values, strict=True):
        if reward != reward or reward in (float("inf"), float("-inf")):
            raise ValueError(
                f"reward {reward} for prompt {prompt_id} is not finite; verifiers must return numbers"
            )
        grouped.setdefault(prompt_id, []).append(reward)
    return [Result(prompt_id=pid, rewards=group) for pid, group in grouped.items()]


def check_permutation(ids: Sequence[int], where: str) -> dict[int, int]:
    """Map prompt id -> row for a dataset whose id column must be a permutation of ``0..len-1``.

    The service's prompt ids are ``0..size-1``; a dataset whose ids skip values (rows filtered after
    the ids were assigned) or repeat would make the service pick prompts that do not exist.
    """
    rows: dict[int, int] = {}
    size = len(ids)
    for row, raw in enumerate(ids):
        if raw is None or isinstance(raw, bool) or int(raw) != raw:
            raise ValueError(f"{where}: row {row} has prompt id {raw!r}; every row needs an integer id")
        prompt_id = int(raw)
        if not 0 <= prompt_id < size:
            raise ValueError(
                f"{where}: row {row} has prompt id {prompt_id}, outside 0..{size - 1}; ids must be "
                "0..len(dataset)-1 (renumber them after filtering the dataset)"
            )
        if prompt_id in rows:
            raise ValueError(f"{where}: prompt id {prompt_id} appears in rows {rows[prompt_id]} and {row}")
        rows[prompt_id] = row
    return rows
