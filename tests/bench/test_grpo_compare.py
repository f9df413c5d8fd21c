"""bench/grpo_compare.py's analysis: runs cut short by the deadline are compared at a budget all reached,
and the per-seed differences to uniform are paired by seed."""

from __future__ import annotations

import pytest

from bench import grpo_compare as gc


def _run(
    strategy: str, seed: int, evals: dict[int, float], per_step: int = 10, steps: int | None = None
) -> dict:
    """A run of `steps` steps of `per_step` rollouts with greedy evaluations at the given steps (0: before)."""
    last = steps if steps is not None else max(evals)
    records = []
    for index in range(1, last + 1):
        record = {
            "total_rollouts": index * per_step,
            "mean_reward": 0.5,
            "effective_ratio": 0.25,
            "step_s": 1.0,
        }
        if index == 1 and 0 in evals:
            record["eval_accuracy_initial"] = evals[0]
        if index in evals:
            record["eval_accuracy"] = evals[index]
        records.append(record)
    return {"strategy": strategy, "seed": seed, "outcome": "ok", "wall_s": 1.0, "records": records}


def test_common_budget_is_the_shortest_runs_last_evaluation() -> None:
    runs = [
        _run("uniform", 0, {0: 0.5, 5: 0.6, 10: 0.7}),
        _run("insight", 0, {0: 0.5, 5: 0.65}, steps=8),  # stopped at step 8 by the deadline
    ]
    assert gc.common_budget(runs, budget=100) == 50
    assert gc.common_budget(runs, budget=40) == 0  # nobody evaluated at or below 40 rollouts after step 0
    summary = gc.summarize(runs[0], budget=50)
    assert summary["eval_at_budget"] == 0.6 and summary["rollouts_at_budget_eval"] == 50
    assert summary["gain_at_budget"] == pytest.approx(0.1)
    assert gc.summarize(runs[0], budget=0)["eval_at_budget"] is None  # the initial evaluation is not a result


def test_aggregate_pairs_gains_by_seed() -> None:
    runs = [
        _run("uniform", 0, {0: 0.5, 5: 0.6}),
        _run("uniform", 1, {0: 0.4, 5: 0.4}),
        _run("dps", 0, {0: 0.5, 5: 0.7}),
        _run("dps", 1, {0: 0.4, 5: 0.45}),
    ]
    summaries = [gc.summarize(run, 50) for run in runs]
    rows = {row["strategy"]: row for row in gc.aggregate(summaries, ["uniform", "dps"])}
    assert rows["uniform"]["gain_vs_uniform"] is None
    assert rows["dps"]["gain_at_budget"] == pytest.approx((0.2 + 0.05) / 2)
    assert rows["dps"]["gain_vs_uniform"] == pytest.approx((0.1 + 0.05) / 2)
    assert rows["dps"]["gain_vs_uniform_se"] == pytest.approx(0.025)
    assert rows["dps"]["gain_vs_uniform_wins"] == "2/2"
    table = gc.markdown_tables(list(rows.values()), summaries, 50)
    assert "| dps | 2 |" in table and "0.075 ± 0.025 (2/2)" in table


def test_seeds_are_parsed_and_checked() -> None:
    assert gc.parse_args(["--seeds", "0,1,2"]).seeds == [0, 1, 2]
    for bad in ("0,0", "a", ""):
        with pytest.raises(SystemExit):
            gc.parse_args(["--seeds", bad])
    with pytest.raises(SystemExit):
        gc.parse_args(["--parallel", "0"])
