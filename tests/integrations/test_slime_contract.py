"""The slime recipe against the contract of slime's two hooks, with a real selector service.

slime is not on PyPI and needs Megatron and SGLang, so its code cannot run here. What the recipe relies
on is small and is re-created below from slime's source (``slime/rollout/data_source.py`` and the end
of ``generate_rollout`` in ``slime/rollout/sglang_rollout.py``):

- the data source class named by ``--data-source-path`` is built as ``cls(args)``; slime calls
  ``get_samples(n)`` for ``n`` prompt groups (``list[list[Sample]]``, ``n_samples_per_prompt`` each,
  ``Sample.index``/``group_index`` set), ``add_samples(groups)`` for aborted groups, and
  ``save(rollout_id)`` / ``load(rollout_id)`` with ``args.save`` / ``args.load``;
- prompts come from ``RolloutDataSource(args).dataset.origin_samples`` (slime's own loader);
- after a rollout, slime sorts the groups, applies ``--rollout-sample-filter-path``, then calls
  ``f(args, all_samples, data_source)`` for ``--rollout-all-samples-process-path``, where
  ``all_samples`` holds every generated group, those dynamic sampling filtered out included.

`StandInSample` has slime's ``Sample`` fields that the recipe touches; `rollout` replays slime's order.
"""

from __future__ import annotations

import json
import sys
import types
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from examples import slime_grpo
from rlvr_selector_client.client import SelectorClient


@dataclass
class StandInSample:
    """The fields of slime's ``slime.utils.types.Sample`` the recipe reads or writes."""

    group_index: int | None = None
    index: int | None = None
    prompt: str = ""
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class StandInRolloutDataSource:
    """slime's ``RolloutDataSource(args)``: only the prompt list the recipe reads."""

    def __init__(self, args: Any) -> None:
        rows = args.prompt_rows
        self.dataset = types.SimpleNamespace(
            origin_samples=[
                StandInSample(prompt=r["prompt"], label=r["label"], metadata=dict(r["metadata"]))
                for r in rows
            ]
        )


@pytest.fixture
def slime_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """``slime.rollout.data_source`` as the recipe imports it."""
    package = types.ModuleType("slime")
    rollout = types.ModuleType("slime.rollout")
    data_source = types.ModuleType("slime.rollout.data_source")
    data_source.RolloutDataSource = StandInRolloutDataSource  # type: ignore[attr-defined]
    for name, module in {
        "slime": package,
        "slime.rollout": rollout,
        "slime.rollout.data_source": data_source,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)


def args_for(tmp_path: Path, n: int, size: int, **extra: Any) -> Any:
    """slime's args for the example's prompt file (examples/slime_grpo.py), its rows read back as slime's
    loader reads them (``--input-key prompt --label-key label --metadata-key metadata``)."""
    order = list(range(size))[::-1]  # file order differs from prompt ids
    by_id = {row["prompt_id"]: row for row in slime_grpo.records(size)}
    path = slime_grpo.write_prompts([by_id[pid] for pid in order], tmp_path / f"prompts-{size}.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    values = {
        "n_samples_per_prompt": n,
        "rollout_global_dataset": True,
        "prompt_rows": rows,
        "save": str(tmp_path / "ckpt"),
        "load": None,
        "reward_key": None,
    }
    values.update(extra)
    return types.SimpleNamespace(**values)


def reward_of(prompt_id: int, k: int) -> float:
    return float((prompt_id + k) % 3 == 0)


def rollout(
    args: Any, source: Any, batch: int, fed: list[tuple[int, float]], abort: int = 0
) -> list[list[Any]]:
    """One slime rollout: get groups, generate (rewards), hand back `abort` groups as aborted, drop the
    groups whose rewards are all equal (DAPO dynamic sampling), then the all-samples hook."""
    from rlvr_selector_client.integrations import slime as recipe

    groups = source.get_samples(batch)
    aborted, finished = groups[:abort], groups[abort:]
    for group in finished:
        for k, sample in enumerate(group):
            sample.reward = reward_of(sample.metadata["selector_prompt_id"], k)
            fed.append((sample.metadata["selector_prompt_id"], sample.reward))
    kept = [g for g in finished if len({s.reward for s in g}) > 1]
    all_samples = sorted(finished, key=lambda g: g[0].index)
    recipe.report_all_samples(args, all_samples, source)
    source.add_samples(aborted)
    return kept


def test_slime_recipe_reports_every_group_including_filtered_and_aborted(
    slime_modules: None, service: Any, dsname: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlvr_selector_client.integrations import slime as recipe

    monkeypatch.setenv("SELECTOR_URL", service.url)
    monkeypatch.setenv("SELECTOR_DATASET", dsname)
    monkeypatch.setenv("SELECTOR_MAX_LAG", "2")
    n, size, batch = 4, 12, 3
    args = args_for(tmp_path, n, size)
    source = recipe.SelectorDataSource(args)
    fed: list[tuple[int, float]] = []
    kept = rollout(args, source, batch, fed, abort=1)  # one group aborted: handed back, finished next time
    assert len(kept) < batch  # dynamic sampling dropped some groups; they were reported all the same
    rollout(args, source, batch, fed)
    source.save(2)

    # Resume in a fresh process: the step continues after the saved one.
    resumed = recipe.SelectorDataSource(args_for(tmp_path, n, size, load=str(tmp_path / "ckpt")))
    resumed.load(2)
    assert resumed.next_step == source.next_step == 2 and resumed.run_id == source.run_id
    rollout(args, resumed, batch, fed)

    trials: dict[int, int] = defaultdict(int)
    successes: dict[int, float] = defaultdict(float)
    for pid, reward in fed:
        trials[pid] += 1
        successes[pid] += reward
    with SelectorClient(service.url) as client:
        info = client.get_dataset(dsname)
        # Three rollouts of `batch` groups; the aborted one was finished (a step late) in the second.
        assert info.rollouts == len(fed) == (3 * batch - 1) * n
        beliefs = client.beliefs(dsname, sorted(trials)).beliefs
    for belief in beliefs:
        assert (belief.alpha, belief.beta) == pytest.approx(
            (1 + successes[belief.prompt_id], 1 + trials[belief.prompt_id] - successes[belief.prompt_id])
        )


def test_slime_recipe_refuses_what_it_cannot_report(
    slime_modules: None, service: Any, dsname: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlvr_selector_client.integrations import slime as recipe

    monkeypatch.setenv("SELECTOR_URL", service.url)
    monkeypatch.delenv("SELECTOR_DATASET", raising=False)
    with pytest.raises(ValueError, match="SELECTOR_DATASET"):
        recipe.SelectorDataSource(args_for(tmp_path, 2, 4))
    monkeypatch.setenv("SELECTOR_DATASET", dsname)
    args = args_for(tmp_path, 2, 4)
    args.prompt_rows[0]["metadata"]["prompt_id"] = 9
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        recipe.SelectorDataSource(args)
    source = recipe.SelectorDataSource(args_for(tmp_path, 2, 4))
    with pytest.raises(TypeError, match="data-source-path"):
        recipe.report_all_samples(args, [], object())
    stray = StandInSample(reward=1.0)
    with pytest.raises(KeyError, match="selector step"):
        recipe.report_all_samples(args, [[stray]], source)
    group = source.get_samples(1)[0]
    for sample in group:
        sample.reward = {"acc": 1.0, "format": 0.1}
    with pytest.raises(KeyError, match="--reward-key"):
        recipe.report_all_samples(args, [group], source)
    args.reward_key = "acc"
    recipe.report_all_samples(args, [group], source)
