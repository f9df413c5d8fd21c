"""bench/grpo_budget.py without training: its runs' command lines are valid trainer configurations with
equal rollouts per step, and the paired differences are computed per seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import grpo_budget as gb
from trainer_client import cli


def _config(command: list[str]):
    assert command[1:4] == ["-m", "trainer_client.cli", "train"]
    return cli._build_configs(cli._parser().parse_args(command[3:]))


@pytest.mark.parametrize("extra", [[], ["--smoke"]])
def test_every_arm_is_a_valid_run_at_the_same_rollouts_per_step(extra) -> None:
    args = gb.parse_args(extra)
    configs = {arm: _config(gb.arm_command(args, "http://x", arm, 0, Path("m.jsonl"))) for arm in gb.ARMS}
    assert [configs[a].strategy for a in gb.ARMS] == ["uniform", "insight", "insight"]
    assert configs["uniform"].rollout_budget is None and configs["insight"].rollout_budget is None
    budget = configs["insight_budget"]
    assert budget.rollout_budget == budget.batch_size * budget.rollouts  # equal rollouts per step
    assert (budget.rollouts_min, budget.rollouts_max) == (args.rollouts_min, args.rollouts_max)
    assert len({(c.batch_size, c.rollouts, c.steps, c.seed) for c in configs.values()}) == 1
    if not extra:  # the GPU defaults: B >= 64, three seeds, a deadline that fits 9 minutes
        assert args.batch_size >= 64 and args.seeds == [0, 1, 2] and args.deadline <= 480
        assert (
            "--backend" in (command := gb.arm_command(args, "u", "uniform", 0, Path("m"))) and "hf" in command
        )


def test_bad_options_are_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        gb.parse_args(["--arms", "insight,dps"])
    assert "--arms must be a non-empty subset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gb.parse_args(["--rollouts-max", "4", "--rollouts", "8"])
    assert "must lie in" in capsys.readouterr().err


def test_paired_differences_are_by_seed() -> None:
    accuracy = {"uniform": [0.5, 0.4, 0.3], "insight": [0.55, 0.4, 0.35], "insight_budget": [0.6, 0.5, None]}
    summaries = [
        {"strategy": arm, "seed": seed, "eval_at_budget": value}
        for arm, values in accuracy.items()
        for seed, value in enumerate(values)
    ]
    rows = {(r["arm"], r["baseline"]): r for r in gb.paired(summaries)}
    assert rows["insight", "uniform"]["diff"] == pytest.approx(0.1 / 3)
    assert rows["insight", "uniform"]["wins"] == "2/3"
    both = rows["insight_budget", "uniform"]  # seed 2 has no evaluation at the budget: left out
    assert both["seeds"] == 2 and both["diff"] == pytest.approx(0.1) and both["diff_se"] == pytest.approx(0.0)
    assert rows["insight_budget", "insight"]["diff"] == pytest.approx((0.05 + 0.1) / 2)
    assert len(gb.paired([s for s in summaries if s["strategy"] != "insight_budget"])) == 1


def test_group_stats_count_mixed_groups_per_rollout() -> None:
    records = [
        {"rollouts": 48, "mixed_by_size": {"2": 1, "16": 2}, "group_size_min": 2, "group_size_max": 16},
        {"rollouts": 52, "mixed_by_size": {"6": 2}, "group_size_min": 6, "group_size_max": 6},
    ]
    assert gb.group_stats(records) == {
        "mixed_per_1k_rollouts": 50.0,
        "group_size_min": 2,
        "group_size_max": 16,
    }
