"""The rollout budget in the benchmarks: the toy world run with a rollout policy (name@policy) spends
exactly its budget and credits a group of n rollouts by its own size, and bench/rollout_trace.py replays a
tiny synthetic trace (and the real one when a shared/data folder beside the checkout holds it)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.toy.strategies import run_strategy, variant_of
from bench.toy.world import PromptSet, ToyRunConfig, ToyWorld, WorldConfig
from tests.replay import one_shot_trace

ROOT = Path(__file__).resolve().parents[2]
REAL_TRACE = one_shot_trace() or ROOT.parent / "shared" / "data" / "one-shot-rlvr" / "acc_step_500.json"

WORLD = WorldConfig(n_prompts=150, n_skills=3)
TRAIN = ToyRunConfig(batch_size=10, rollouts_per_prompt=6, steps=12, rollouts_min=1, rollouts_max=20)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


rollout_trace = _load("rollout_trace")


@pytest.mark.parametrize(
    "strategy", ["uniform@posterior", "insight@knapsack", "insight@variance", "dps@uniform", "uniform@oracle"]
)
def test_a_policy_spends_exactly_the_budget_within_the_bounds(strategy):
    trace = []
    run = run_strategy(WORLD, TRAIN, strategy, seed=1, trace=trace)
    budget = TRAIN.batch_size * TRAIN.rollouts_per_prompt
    assert np.array_equal(np.diff(run.rollouts), np.full(TRAIN.steps, budget))
    for record in trace:
        counts = record.counts
        assert counts.sum() == budget and counts.size == TRAIN.batch_size
        assert counts.min() >= TRAIN.rollouts_min and counts.max() <= TRAIN.rollouts_max
        assert np.all((record.successes >= 0) & (record.successes <= counts))
    hist = run.count_hist
    assert hist.sum() == TRAIN.batch_size * TRAIN.steps
    assert hist[: TRAIN.rollouts_min].sum() == 0
    assert (np.arange(hist.size) * hist).sum() == budget * TRAIN.steps


def test_a_group_is_credited_by_its_own_size():
    """Mixed means 0 < S < n for the group's own n; the world learns from exactly those groups."""
    trace = []
    run = run_strategy(WORLD, TRAIN, "dps@posterior", seed=2, trace=trace)  # re-picks seen prompts
    for t, record in enumerate(trace):
        expected = (record.successes > 0) & (record.successes < record.counts)
        assert run.mixed[t] == expected.sum() == run.trained_mixed[t]
        assert not np.any(expected & (record.counts == 1))  # a group of one is never mixed
    assert any((r.counts != TRAIN.rollouts_per_prompt).any() for r in trace)  # the counts do vary


def _exact_world() -> ToyWorld:
    """Prompts 0-9 always solved, 10-19 never, 20-29 succeed half the time."""
    difficulty = np.r_[np.full(10, -100.0), np.zeros(20)]
    solvable = np.r_[np.ones(10, bool), np.zeros(10, bool), np.ones(10, bool)]
    pool = PromptSet(skill_of=np.zeros(30, dtype=np.int64), difficulty=difficulty, solvable=solvable)
    return ToyWorld(pool=pool, skill=np.zeros(1), learning_rate=0.0, transfer=0.0)


def test_the_oracle_gives_the_coin_prompts_what_the_certain_ones_cannot_use():
    train = ToyRunConfig(batch_size=30, rollouts_per_prompt=8, steps=3, rollouts_min=2, rollouts_max=30)
    trace = []
    run = run_strategy(
        WorldConfig(n_prompts=30), train, "uniform@oracle", seed=0, trace=trace, world=_exact_world()
    )
    for record in trace:
        coin = record.rolled_out >= 20
        assert np.all(record.counts[~coin] == 2)  # certain outcomes: the minimum
        assert record.counts[coin].sum() == 30 * 8 - 20 * 2
        assert not np.any((record.successes > 0) & (record.successes < record.counts) & ~coin)
    assert run.mixed.sum() > 0


def test_the_even_split_is_k_each():
    trace = []
    run_strategy(WORLD, TRAIN, "insight@uniform", seed=0, trace=trace)
    assert all(np.all(r.counts == TRAIN.rollouts_per_prompt) for r in trace)


@pytest.mark.parametrize("name", ["insight@bogus", "dynamic_sampling@posterior", "nosuch@posterior"])
def test_bad_names_are_refused(name):
    with pytest.raises(ValueError):
        variant_of(name)


def test_bounds_that_cannot_hold_the_budget_are_refused():
    with pytest.raises(ValueError, match="rollouts_min"):
        ToyRunConfig(rollouts_per_prompt=8, rollouts_max=4)


# ---- bench/rollout_trace.py -----------------------------------------------------------------------------
def _tiny_trace(path: Path, n: int = 12, epochs: int = 6, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    data = {str(i): (rng.integers(0, 9, size=epochs + i % 3) / 8).tolist() for i in range(n)}
    data["0"] = [1.0] * epochs  # always solved
    data["1"] = [0.0] * epochs  # never
    path.write_text(json.dumps(data))
    return path


def test_mixed_probability_without_replacement_matches_enumeration():
    total = 8
    for s, n in itertools.product(range(total + 1), range(1, total + 1)):
        outcomes = [1] * s + [0] * (total - s)
        draws = list(itertools.combinations(outcomes, n))
        exact = sum(0 < sum(d) < n for d in draws) / len(draws)
        got = rollout_trace.mixed_probability_without_replacement(np.array([s]), total, np.array([n]))[0]
        assert math.isclose(got, exact, abs_tol=1e-12), (s, n)


def test_rollout_trace_replays_a_tiny_trace(tmp_path, capsys):
    path = _tiny_trace(tmp_path / "trace.json")
    report = rollout_trace.main(
        [str(path), "--k", "3,4", "--seeds", "2", "--no-plot", "--out", str(tmp_path)]
    )
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["benchmark"] == "rollout_trace" and line["epochs"] == 6 and line["prompts"] == 12
    assert set(line["results"]) == {"K=3", "K=4"}
    assert line["filter_batch_size"] == 12  # no --batch-size: 128, at most the pool
    for name, k in (("K=3", 3), ("K=4", 4)):
        summary = report["results"][name]["summary"]
        assert set(summary) == {*rollout_trace.ROWS, *rollout_trace.FILTER_ROWS}
        for row in rollout_trace.ROWS:  # every row spends exactly the budget, all prompts every epoch
            assert summary[row]["rollouts"]["mean"] == 12 * k * 6
            assert summary[row]["profiling_rollouts"]["mean"] == 0  # no profile: the same quantity
            assert summary[row]["effective_per_rollout"] == summary[row]["mixed_per_rollout"]
        for row in (*rollout_trace.ROWS, *rollout_trace.FILTER_ROWS):
            assert "effective_per_rollout" in line["results"][name][row]
        # the even split is K each, and the draws are paired across rows: the same groups
        assert summary["uniform"]["mixed_per_epoch"] == summary["fixed"]["mixed_per_epoch"]
        assert summary["oracle"]["mixed_per_epoch"]["mean"] >= summary["fixed"]["mixed_per_epoch"]["mean"]
    assert json.loads((tmp_path / "rollout_trace.json").read_text())["seeds"] == 2


def test_rollout_trace_picks_a_smaller_batch_with_a_strategy(tmp_path):
    path = _tiny_trace(tmp_path / "trace.json")
    report = rollout_trace.main(
        [
            str(path),
            "--batch-size",
            "5",
            "--strategy",
            "insight",
            "--seeds",
            "1",
            "--no-plot",
            "--no-filter-arms",
            "--out",
            str(tmp_path),
        ]
    )
    summary = report["results"]["K=4"]["summary"]
    assert set(summary) == set(rollout_trace.ROWS) and report["filter_batch_size"] is None
    assert summary["posterior"]["rollouts"]["mean"] == 5 * 4 * 6
    assert sum(summary["posterior"]["count_hist"]) == 5 * 6


def test_rollout_trace_filter_rows_count_the_profile_and_the_static_filter_keeps_epoch_0s_mixed(
    tmp_path, capsys
):
    """Prompts 0-5 are mixed at every epoch, 6-11 never (all solved or all failed): a static-filter group
    is mixed exactly when it picked a prompt mixed at epoch 0."""
    n, epochs, batch = 12, 5, 3
    data = {str(i): [0.5] * epochs if i < 6 else [float(i % 2)] * epochs for i in range(n)}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(data))
    report = rollout_trace.main(
        [str(path), "--batch-size", str(batch), "--seeds", "2", "--no-plot", "--out", str(tmp_path)]
    )
    stdout = capsys.readouterr().out
    assert f"B = {batch} (--batch-size)" in stdout and "| filter_reprofile |" in stdout
    summary = report["results"]["K=4"]["summary"]
    replayed, profile = batch * 8 * (epochs - 1), n * 8  # epochs 1..4, B groups of 8; epoch 0 whole
    for row in rollout_trace.FILTER_ROWS:
        s = summary[row]
        assert s["rollouts"]["mean"] == replayed and s["profiling_rollouts"]["mean"] == profile
        mixed = s["mixed_per_epoch"]["mean"] * (epochs - 1)
        assert math.isclose(s["effective_per_rollout"]["mean"], mixed / (replayed + profile))
    # The static filter picks only prompts 0-5, so every group it picks is mixed: B per epoch.
    static = summary["filter"]
    assert static["effective_ratio"]["mean"] == 1 and static["mixed_per_epoch"]["mean"] == batch
    assert math.isclose(static["effective_per_rollout"]["mean"], batch * (epochs - 1) / (replayed + profile))
    assert math.isclose(static["mixed_per_rollout"]["mean"], 1 / 8)  # without the profile


def test_rollout_trace_says_where_the_trace_comes_from(tmp_path):
    with pytest.raises(SystemExit, match="One-Shot-RLVR"):
        rollout_trace.main([str(tmp_path / "absent.json"), "--no-plot", "--out", str(tmp_path)])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"0": [0.3]}))
    with pytest.raises(SystemExit, match="multiple of 1/8"):
        rollout_trace.main([str(bad), "--no-plot", "--out", str(tmp_path)])


@pytest.mark.skipif(not REAL_TRACE.is_file(), reason="the One-Shot-RLVR trace is not in ../shared")
def test_rollout_trace_on_the_real_trace(tmp_path):
    report = rollout_trace.main(
        [str(REAL_TRACE), "--epochs", "3", "--seeds", "1", "--no-plot", "--out", str(tmp_path)]
    )
    assert report["prompts"] == 1209 and report["epochs"] == 3
    summary = report["results"]["K=4"]["summary"]
    assert summary["posterior"]["rollouts"]["mean"] == 1209 * 4 * 3
