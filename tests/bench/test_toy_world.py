"""Tests of the toy-world simulator (bench/toy_world.py): seeded determinism, the learning rule, and the
effective-sample / Dynamic Sampling rollout accounting on tiny worlds whose outcomes are known exactly."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_toy_world():
    spec = importlib.util.spec_from_file_location("toy_world", ROOT / "bench" / "toy_world.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["toy_world"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


tw = _load_toy_world()

TINY_WORLD = tw.WorldConfig(n_prompts=120, n_skills=3)
TINY_TRAIN = tw.ToyRunConfig(batch_size=12, rollouts_per_prompt=8, steps=15)
SERIES = ("accuracy", "rollouts", "groups", "mixed", "trained", "trained_mixed", "observed", "correct")


def _exact_world(n_solved: int, n_never: int, n_coin: int, *, learning_rate: float = 0.0) -> tw.ToyWorld:
    """Prompts [0, n_solved) succeed with rate exactly 1, the next n_never are unsolvable (rate 0) and the
    last n_coin succeed with rate 1/2 (skill 0 - difficulty 0)."""
    n = n_solved + n_never + n_coin
    difficulty = np.zeros(n)
    difficulty[:n_solved] = -100.0  # sigmoid(100) rounds to exactly 1.0
    solvable = np.ones(n, dtype=bool)
    solvable[n_solved : n_solved + n_never] = False
    return tw.ToyWorld(
        pool=tw.PromptSet(skill_of=np.zeros(n, dtype=np.int64), difficulty=difficulty, solvable=solvable),
        skill=np.zeros(1),
        learning_rate=learning_rate,
        transfer=0.0,
    )


@pytest.mark.parametrize(
    "strategy", ["uniform", "dynamic_sampling", "history_resampling", "mopps", "insight", "dps"]
)
def test_same_seed_gives_the_same_run_and_another_seed_does_not(strategy):
    first = tw.run_strategy(TINY_WORLD, TINY_TRAIN, strategy, seed=3)
    again = tw.run_strategy(TINY_WORLD, TINY_TRAIN, strategy, seed=3)
    other = tw.run_strategy(TINY_WORLD, TINY_TRAIN, strategy, seed=4)
    for name in SERIES:
        assert np.array_equal(getattr(first, name), getattr(again, name)), name
    assert not np.array_equal(first.accuracy, other.accuracy)


def test_the_world_of_a_seed_is_shared_by_all_strategies_and_training_changes_only_skills():
    world = tw.ToyWorld.sample(TINY_WORLD, seed=5)
    uniform = tw.run_strategy(TINY_WORLD, TINY_TRAIN, "uniform", seed=5)
    dps = tw.run_strategy(TINY_WORLD, TINY_TRAIN, "dps", seed=5)
    assert uniform.accuracy[0] == dps.accuracy[0] == world.accuracy()
    assert uniform.accuracy[-1] > uniform.accuracy[0]
    # run_strategy trains a copy: the passed-in world is left as it was.
    tw.run_strategy(TINY_WORLD, TINY_TRAIN, "uniform", seed=5, world=world)
    assert world.accuracy() == uniform.accuracy[0]


def test_learning_rule_gains_per_skill_with_transfer_and_memorization():
    pool = tw.PromptSet(
        skill_of=np.array([0, 0, 1, 1, 2]), difficulty=np.zeros(5), solvable=np.ones(5, dtype=bool)
    )
    heldout = tw.PromptSet(skill_of=np.array([2]), difficulty=np.zeros(1), solvable=np.ones(1, dtype=bool))
    world = tw.ToyWorld(
        pool=pool, skill=np.zeros(3), learning_rate=0.1, transfer=0.25, memorization=10.0, heldout=heldout
    )
    gain = world.learn(np.array([0, 1, 2, 2]), trained_groups=5)
    # Each mixed group: its own skill += 0.1/5, every other skill += 0.25 * 0.1/5, its prompt += 10 * 0.1/5.
    step = 0.1 / 5
    expected = [step * (2 + 0.25 * 2), step * (2 + 0.25 * 2), step * (0.25 * 4)]
    np.testing.assert_allclose(gain, expected, rtol=1e-15)
    np.testing.assert_allclose(world.skill, gain, rtol=0)
    np.testing.assert_allclose(world.memorized, [10 * step, 10 * step, 20 * step, 0, 0], rtol=1e-15)
    # Held-out accuracy sees the skills only; the pool's rates include what was memorized.
    assert world.accuracy() == pytest.approx(1 / (1 + np.exp(-gain[2])), rel=1e-12)
    np.testing.assert_allclose(world.success_rates(np.array([2])), 1 / (1 + np.exp(-(gain[1] + 20 * step))))
    assert world.train_accuracy() > world.success_rates(np.array([4]))[0]
    assert not world.learn(np.array([], dtype=np.int64), trained_groups=4).any()


def test_effective_ratio_of_uniform_over_one_epoch_is_exactly_the_mixed_share():
    # 48 prompts, B = 16: three steps walk one epoch, every prompt once; 16 prompts are coin flips with
    # K = 64 (all-equal with probability 2^-63), the others never mixed.
    world = _exact_world(16, 16, 16)
    train = tw.ToyRunConfig(batch_size=16, rollouts_per_prompt=64, steps=3)
    trace: list = []
    run = tw.run_strategy(TINY_WORLD, train, "uniform", seed=0, world=world, trace=trace)
    assert run.effective_ratio == pytest.approx(1 / 3, abs=0)
    assert run.trained_effective_ratio == run.effective_ratio
    assert sorted(np.concatenate([r.rolled_out for r in trace]).tolist()) == list(range(48))
    assert run.rollouts.tolist() == [0, 16 * 64, 32 * 64, 48 * 64]
    assert run.coverage == 1.0 and np.all(run.times_observed == 1)
    for record, mixed in zip(trace, run.mixed, strict=True):
        # The simulator's count and the core's CloseStats agree (distinct prompts in a uniform batch).
        assert record.stats.observed == 16
        assert record.stats.partial == mixed == int(np.sum(record.rolled_out >= 32))


def test_dynamic_sampling_counts_every_rollout_and_trains_on_the_first_b_mixed_groups():
    world = _exact_world(20, 20, 20)
    k, batch, oversample = 64, 8, 2
    train = tw.ToyRunConfig(batch_size=batch, rollouts_per_prompt=k, steps=12, ds_oversample=oversample)
    trace: list = []
    run = tw.run_strategy(TINY_WORLD, train, "dynamic_sampling", seed=1, world=world, trace=trace)
    draw = batch * oversample
    for t, record in enumerate(trace):
        rolled, successes = record.rolled_out, record.successes
        mixed = (successes > 0) & (successes < k)
        np.testing.assert_array_equal(mixed, rolled >= 40)  # only the coin-flip prompts mix
        rounds = len(rolled) // draw
        assert len(rolled) == rounds * draw and 1 <= rounds <= train.ds_max_rounds
        # It stops at the first round that completes the batch, and keeps the first B mixed in order.
        mixed_before_last = int(mixed[: (rounds - 1) * draw].sum())
        assert mixed_before_last < batch <= int(mixed.sum())
        np.testing.assert_array_equal(record.trained, rolled[mixed][:batch])
        assert run.rollouts[t + 1] - run.rollouts[t] == len(rolled) * k
        assert run.groups[t] == len(rolled) and run.mixed[t] == mixed.sum() and run.trained_mixed[t] == batch
    assert run.trained_effective_ratio == 1.0
    assert run.effective_ratio == pytest.approx(run.mixed.sum() / run.groups.sum(), abs=0)
    assert run.effective_ratio < 0.6  # a third of the pool mixes: DS pays for the rest


def test_dynamic_sampling_without_any_mixed_group_spends_every_round_and_learns_nothing():
    world = _exact_world(30, 30, 0, learning_rate=1.0)
    train = tw.ToyRunConfig(batch_size=6, rollouts_per_prompt=4, steps=5, ds_oversample=2, ds_max_rounds=3)
    run = tw.run_strategy(TINY_WORLD, train, "dynamic_sampling", seed=0, world=world)
    assert run.rollouts.tolist() == [i * 3 * 12 * 4 for i in range(6)]
    assert run.mixed.sum() == run.trained.sum() == 0
    assert run.effective_ratio == 0.0
    assert np.all(run.accuracy == run.accuracy[0])


def test_summary_measures_steps_and_rollouts_to_uniforms_final_accuracy():
    def fake(strategy, accuracy, rollouts_per_step):
        steps = len(accuracy) - 1
        zeros = np.zeros(steps, dtype=np.int64)
        return tw.RunResult(
            strategy=strategy,
            seed=0,
            n_prompts=10,
            accuracy=np.array(accuracy),
            train_accuracy=np.array(accuracy) + 0.01,
            rollouts=np.arange(steps + 1) * rollouts_per_step,
            groups=np.full(steps, 4),
            mixed=np.array([1, 2, 3, 4][:steps]),
            trained=np.full(steps, 4),
            trained_mixed=np.array([1, 2, 3, 4][:steps]),
            observed=np.full(steps, 4),
            correct=np.full(steps, 3),
            predicted_partial=zeros + 5,
            times_observed=np.array([0, 3, 1, 0, 0, 2, 0, 0, 0, 4]),
            seconds=0.0,
        )

    runs = {
        "uniform": [fake("uniform", [0.1, 0.2, 0.3, 0.4, 0.5], 32)],
        "fast": [fake("fast", [0.1, 0.3, 0.5, 0.6, 0.7], 96)],
        "slow": [fake("slow", [0.1, 0.1, 0.2, 0.3, 0.4], 32)],
    }
    summary = tw.summarize(runs)
    uniform, fast, slow = (summary[name]["per_seed"][0] for name in ("uniform", "fast", "slow"))
    assert uniform["steps_to_target"] == 4 and uniform["step_speedup"] == 1.0
    assert fast["steps_to_target"] == 2 and fast["rollouts_to_target"] == 192
    assert fast["accuracy_at_uniform_rollouts"] == 0.3 and slow["accuracy_at_uniform_rollouts"] == 0.4
    assert fast["step_speedup"] == 2.0 and fast["rollout_speedup"] == pytest.approx(128 / 192)
    assert slow["steps_to_target"] is None and summary["slow"]["aggregate"]["reached_target"] == 0
    assert uniform["effective_ratio"] == pytest.approx(10 / 16) and uniform["state_accuracy"] == 0.75
    assert uniform["predicted_partial_share"] == 0.5
    assert uniform["coverage"] == 0.4 and uniform["max_times_observed"] == 4
    assert tw.first_reach(np.array([0.1, 0.2]), 0.25) is None
    table = tw.format_table(summary).splitlines()
    assert len(table) == 2 + 3 and table[2].startswith("| uniform | 0.625 ± 0.000 |")
    assert "- (0/1 seeds)" in table[4]


def test_default_world_matches_its_documented_shape():
    """The WorldConfig docstring promises ~35% accuracy and ~41% mixed groups at K = 8 at the start."""
    shares, accuracies = [], []
    for seed in range(5):
        world = tw.ToyWorld.sample(tw.WorldConfig(), seed)
        p = world.success_rates()
        shares.append(np.mean(1 - p**8 - (1 - p) ** 8))
        accuracies.append(p.mean())
    assert 0.30 <= np.mean(accuracies) <= 0.40
    assert 0.36 <= np.mean(shares) <= 0.46


LEVEL_WORLD = tw.WorldConfig(n_prompts=4000, n_levels=10, n_heldout=500)


def test_level_world_has_ordered_levels_and_a_noisy_reference_pass_rate():
    world = tw.ToyWorld.sample(LEVEL_WORLD, seed=2)
    pool = world.pool
    assert pool.level is not None and set(np.unique(pool.level)) == set(range(10))
    np.testing.assert_array_equal(pool.groups, pool.level)
    means = [pool.difficulty[pool.level == level].mean() for level in range(10)]
    assert np.all(np.diff(means) > 0)  # level 0 is the easiest
    error = world.reference_pass_rate - world.success_rates()
    assert np.all(np.abs(error) <= 0.15 + 1e-12) and np.abs(error).max() > 0.1
    assert np.all((world.reference_pass_rate >= 0) & (world.reference_pass_rate <= 1))
    # Without levels the groups are the skills, and the default world's draws are unchanged by levels.
    plain = tw.ToyWorld.sample(tw.WorldConfig(n_prompts=300), seed=2)
    np.testing.assert_array_equal(plain.pool.groups, plain.pool.skill_of)


def test_metadata_lifts_insight_out_of_cold_start():
    """N >> B * steps: without metadata INSIGHT ranks almost only Beta(1, 1) priors (uniform's mixed
    share); with exact pass rates or levels its batches are mostly mixed from the first step."""
    train = tw.ToyRunConfig(batch_size=16, steps=12)
    exact = tw.WorldConfig(n_prompts=4000, n_levels=10, n_heldout=500, pass_rate_noise=0.0)
    runs = {
        name: tw.run_strategy(exact, train, name, seed=0)
        for name in ("uniform", "insight", "insight+groups", "insight+pass_rate")
    }
    assert abs(runs["insight"].effective_ratio - runs["uniform"].effective_ratio) < 0.15
    assert runs["insight+pass_rate"].effective_ratio > runs["uniform"].effective_ratio + 0.25
    assert runs["insight+groups"].effective_ratio > runs["uniform"].effective_ratio + 0.2


def test_speed_rl_screens_continues_mixed_prompts_and_pays_for_every_rollout():
    world = _exact_world(20, 20, 20)
    batch, oversample = 8, 2
    train = tw.ToyRunConfig(batch_size=batch, steps=6, ds_oversample=oversample, speed_init=24, speed_cont=40)
    trace: list = []
    run = tw.run_strategy(TINY_WORLD, train, "speed_rl", seed=1, world=world, trace=trace)
    draw = batch * oversample
    for t, record in enumerate(trace):
        rolled = record.rolled_out
        go_on = rolled >= 40  # only the coin-flip prompts mix in the screen (24 rollouts: all-equal ~1e-7)
        rounds = len(rolled) // draw
        assert len(rolled) == rounds * draw and int(go_on[: (rounds - 1) * draw].sum()) < batch
        np.testing.assert_array_equal(record.trained, rolled[go_on][:batch])  # first in, first out
        spent = 24 * len(rolled) + 40 * int(go_on.sum())
        assert run.rollouts[t + 1] - run.rollouts[t] == spent
        assert np.all(record.successes[~go_on] % 24 == 0) and np.all(record.successes <= 64)
    assert run.trained_effective_ratio == 1.0
    # Every screened prompt was reported (one result per prompt per step).
    assert run.times_observed.sum() == sum(len(r.rolled_out) for r in trace)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tw.WorldConfig(transfer=1.5), "transfer"),
        (lambda: tw.ToyRunConfig(rollouts_per_prompt=1), "rollouts_per_prompt"),
        (lambda: tw.ToyRunConfig(beta_decay=1.5), "beta_decay"),
        (
            lambda: tw.run_strategy(
                tw.WorldConfig(n_prompts=100),
                tw.ToyRunConfig(batch_size=40, steps=1),
                "dynamic_sampling",
                seed=0,
            ),
            "draws 120 prompts",
        ),
        (lambda: tw.run_strategy(TINY_WORLD, TINY_TRAIN, "random", seed=0), "unknown strategy"),
        (lambda: tw.WorldConfig(pass_rate_noise=2.0), "pass_rate_noise"),
        (lambda: tw.ToyRunConfig(group_decay=0.0), "group_decay"),
    ],
)
def test_bad_settings_are_refused_with_a_message_that_names_them(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_command_line_run_writes_its_outputs_and_matches_an_in_process_run(tmp_path):
    """A separate process gives the same numbers as this one (seeded end to end), writes the JSON and the
    PNG, and ends stdout with one JSON line."""
    args = ["--n-prompts", "120", "--skills", "3", "--batch-size", "12", "--steps", "15", "--seeds", "2"]
    args += ["--strategies", "uniform,dps,dynamic_sampling", "--out", str(tmp_path), "--no-progress"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "toy_world.py"), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        cwd=ROOT,
    )
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(last["strategies"]) == {"uniform", "dps", "dynamic_sampling"}
    assert (tmp_path / "toy_world.png").stat().st_size > 10_000
    report = json.loads((tmp_path / "toy_world.json").read_text())
    for strategy in ("uniform", "dps", "dynamic_sampling"):
        here = tw.run_strategy(TINY_WORLD, TINY_TRAIN, strategy, seed=1)
        there = report["summary"][strategy]["per_seed"][1]
        assert there["final_accuracy"] == float(here.accuracy[-1])
        assert there["total_rollouts"] == int(here.rollouts[-1])
        assert there["effective_ratio"] == here.effective_ratio
        assert there["state_accuracy"] == here.state_accuracy


def test_large_scenario_command_line_writes_its_own_outputs(tmp_path):
    args = [
        "--scenario",
        "large",
        "--n-prompts",
        "3000",
        "--steps",
        "6",
        "--seeds",
        "1",
        "--batch-size",
        "16",
    ]
    args += ["--strategies", "uniform,insight+groups,sec,adarft", "--out", str(tmp_path), "--no-progress"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "toy_world.py"), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        cwd=ROOT,
    )
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(last["strategies"]) == {"uniform", "insight+groups", "sec", "adarft"}
    report = json.loads((tmp_path / "toy_world_large.json").read_text())
    assert report["scenario"] == "large" and report["world"]["n_levels"] == 10
    assert report["world"]["n_prompts"] == 3000 and (tmp_path / "toy_world_large.png").exists()
