"""What a task knows about its prompts, for the selector service's cold start (docs/methods.md §6).

`task_metadata(task)` reads, per prompt id:

- a group: a ``group`` field of the record (``--task jsonl``): an integer 0..65535, or a string (a
  category such as MATH's ``"type": "Algebra"``), numbered 0, 1, 2, ... in sorted order of the strings;
  else the problem's own ``group`` (arithmetic and Countdown tiers, reasoning-gym curriculum levels,
  MATH's "Level N");
- a pass rate: a ``pass_rate`` field of the record (``--task jsonl``), a reference model's measured
  success rate in [0, 1]; ``null`` or absent = unknown.

`read_task_rates(path, count, ...)` reads them from a file of their own instead (``trainer-client train
--pass-rates FILE``), in any format `rlvr_selector_client.rates` reads (a JSON array of rates, a column of
a JSONL or parquet file, Skywork-OR1's or Polaris's annotations, a NeMo-Gym reward profile), each rate
with the samples behind it when the file says, and exactly `count` prompts.

`upload_task_metadata(client, dataset, task_metadata(task))` uploads them with `SelectorClient.upload_metadata` when
the task has any. A bad value raises ValueError naming the prompt (and the file and line).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr_selector_client.client import MetadataAck, SelectorClient
from rlvr_selector_client.contract import MAX_GROUPS

__all__ = ["TaskMetadata", "read_task_rates", "task_metadata", "upload_task_metadata"]

#: The largest group id the service accepts (the contract's).
MAX_GROUP = MAX_GROUPS - 1


@dataclass(frozen=True)
class TaskMetadata:
    """Per prompt id: pass rates (None = unknown) and groups (-1 = none), each None when the task has
    none at all; `group_names`: group id -> the string it was numbered from (string groups only);
    `pass_samples`: the samples behind each rate (None = unknown: the dataset's prior_strength weighs
    it), None when no rate has a count; `profiled`: those samples were rolled out for this run (they count
    as its profiling rollouts), not shipped with the data."""

    pass_rate: list[float | None] | None
    group: list[int] | None
    group_names: dict[int, str] = field(default_factory=dict)
    pass_samples: list[int | None] | None = None
    profiled: bool = False

    @property
    def empty(self) -> bool:
        return self.pass_rate is None and self.group is None


def _where(index: int, meta: dict[str, Any]) -> str:
    if "source" in meta and "line" in meta:
        return f"{meta['source']}:{meta['line']}"
    return f"prompt {index}"


def _pass_rate(index: int, meta: dict[str, Any]) -> float | None:
    value = meta.get("pass_rate")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{_where(index, meta)}: pass_rate {value!r} must be a number in [0, 1] or null")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{_where(index, meta)}: pass_rate {value!r} must lie in [0, 1]")
    return float(value)


def _raw_group(problem: Any) -> Any:
    meta = problem.meta
    if meta.get("group") is not None:  # a JSONL record's own field says what the user meant
        return meta["group"]
    group = getattr(problem, "group", None)  # the task's (tiers, reasoning-gym levels, MATH levels)
    return group if group is not None else meta.get("tier")


def task_metadata(task: Any) -> TaskMetadata:
    """The pass rates and groups of `task.problems` (see the module docstring)."""
    problems: Sequence[Any] = task.problems
    rates = [_pass_rate(i, p.meta) for i, p in enumerate(problems)]
    raw = [_raw_group(p) for p in problems]
    names = sorted({g for g in raw if isinstance(g, str)})
    if names and any(g is not None and not isinstance(g, str) for g in raw):
        raise ValueError("group fields mix strings and numbers: use one kind for every record")
    numbering = {name: i for i, name in enumerate(names)}
    groups: list[int] = []
    for i, (g, p) in enumerate(zip(raw, problems, strict=True)):
        if g is None:
            groups.append(-1)
        elif isinstance(g, str):
            groups.append(numbering[g])
        elif isinstance(g, bool) or not isinstance(g, int) or not 0 <= g <= MAX_GROUP:
            raise ValueError(
                f"{_where(i, p.meta)}: group {g!r} must be an integer in 0..{MAX_GROUP} or a string"
            )
        else:
            groups.append(int(g))
    if len(numbering) > MAX_GROUP + 1:
        raise ValueError(f"{len(numbering)} distinct groups; the service accepts at most {MAX_GROUP + 1}")
    return TaskMetadata(
        pass_rate=rates if any(r is not None for r in rates) else None,
        group=groups if any(g >= 0 for g in groups) else None,
        group_names={i: name for name, i in numbering.items()},
    )


def read_task_rates(
    path: str | Path, count: int, *, format: str = "auto", profiled: bool = False
) -> tuple[list[float | None], list[int | None] | None]:
    """Per prompt id, the pass rates in `path` and the samples behind them (None when the file gives
    none), read by `rlvr_selector_client.rates.read_rates`; the file must cover exactly `count` prompts.
    `profiled` needs a count beside every rate. A bad file raises ValueError naming the file and entry."""
    from rlvr_selector_client.rates import read_rates

    try:
        rates = read_rates(path, format=format, size=count)
    except ValueError as exc:
        raise ValueError(f"--pass-rates: {exc}") from None
    if profiled and not rates.counted:
        raise ValueError(
            f"--pass-rates-profiled counts the samples behind each rate, and {rates.source} gives none for "
            "some: give them (a pass_samples column) or drop --pass-rates-profiled"
        )
    counts = rates.pass_samples if any(n is not None for n in rates.pass_samples) else None
    return rates.pass_rate, counts


def upload_task_metadata(client: SelectorClient, dataset: str, metadata: TaskMetadata) -> MetadataAck | None:
    """Uploads a task's pass rates and groups (`task_metadata`) to `dataset`; None when it has neither."""
    if metadata.empty:
        return None
    return client.upload_metadata(
        dataset,
        pass_rate=metadata.pass_rate,
        group=metadata.group,
        pass_samples=metadata.pass_samples if metadata.pass_rate is not None else None,
        profile=metadata.profiled and metadata.pass_samples is not None and metadata.pass_rate is not None,
    )
