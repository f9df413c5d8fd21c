"""The replay protocol: epochs found where the run started over its pool, and the loop's invariants for
any arm (at most B picks, each observed in the epoch, outcomes of the picks only, the profile charged),
checked over random runs; the latest-outcome filter's definition."""

from __future__ import annotations

import numpy as np
import pytest

from selector_service.replay.logs import LogError, RunLog
from selector_service.replay.protocol import (
    ArmResult,
    ArmSkipped,
    EpochTable,
    LatestOutcomeFilterArm,
    epochs_of,
    is_mixed,
    replay,
)


def make_log(steps, prompts, successes, trials, n: int | None = None) -> RunLog:
    steps, prompts = np.asarray(steps, np.int64), np.asarray(prompts, np.int64)
    order = np.lexsort((prompts, steps))
    n = n if n is not None else int(prompts.max()) + 1
    return RunLog(
        steps=steps[order],
        prompts=prompts[order],
        successes=np.asarray(successes, np.int64)[order],
        trials=np.asarray(trials, np.int64)[order],
        keys=np.arange(n, dtype=np.int64),
        hashed=False,
        rows=int(steps.size),
        format="rows",
        source="test",
    )


def shuffled_run(seed: int, n: int = 10, batch: int = 3, epochs: int = 4, k: int = 4):
    """A run over n prompts, batch per step, a new order each epoch, the last partial step dropped."""
    rng = np.random.default_rng(seed)
    per_epoch = (n // batch) * batch
    steps, prompts, orders = [], [], []
    for e in range(epochs):
        order = rng.permutation(n)[:per_epoch]
        orders.append(np.sort(order))
        prompts.append(order)
        steps.append(e * (per_epoch // batch) + np.arange(per_epoch) // batch)
    steps, prompts = np.concatenate(steps), np.concatenate(prompts)
    trials = np.full(steps.size, k)
    successes = rng.integers(0, k + 1, size=steps.size)
    return make_log(steps, prompts, successes, trials, n), orders


@pytest.mark.parametrize("seed", range(5))
def test_epochs_start_where_the_run_starts_over_its_pool(seed):
    log, orders = shuffled_run(seed)
    table = epochs_of(log)
    assert table.n_epochs == 4 and table.run_batch_size == 3 and table.n_prompts == 10
    for e, (epoch, seen) in enumerate(zip(table.epochs, orders, strict=True)):
        assert np.array_equal(epoch.ids, seen)  # each epoch: the 9 prompts that epoch rolled out
        assert (epoch.first_step, epoch.last_step) == (3 * e, 3 * e + 2)
    assert table.epochs[0].size == 9 and table.profile_samples == 4.0
    rates = table.profile_rates()
    assert np.isnan(rates[np.setdiff1d(np.arange(10), orders[0])]).all()


def test_epochs_given_in_steps_keep_a_prompt_first_group():
    # Steps 0..3, two steps an epoch; prompt 0 comes twice in the first epoch.
    log = make_log([0, 0, 1, 1, 2, 2, 3], [0, 1, 0, 2, 1, 2, 0], [1, 1, 0, 1, 1, 1, 1], [2] * 7)
    table = epochs_of(log, epoch_steps=2)
    assert table.n_epochs == 2 and table.repeats_left_out == 1
    first = table.epochs[0]
    assert first.ids.tolist() == [0, 1, 2] and first.successes.tolist() == [1, 1, 1]  # step 0's group of 0
    assert epochs_of(log, epoch_steps=2, epochs=2).n_epochs == 2


def test_fewer_than_two_epochs_is_refused():
    log = make_log([0, 1], [0, 1], [1, 0], [2, 2])  # each prompt once: one epoch
    with pytest.raises(LogError, match=r"holds 1 epoch.*at least two.*--epoch-steps"):
        epochs_of(log)
    with pytest.raises(LogError, match="--epochs must be >= 2"):
        epochs_of(log, epochs=1)


class RandomArm:
    """Picks at random (at most B, sometimes fewer) and records what it was shown."""

    def __init__(self, name: str, profile: bool, seed: int) -> None:
        self.name, self.profile = name, profile
        self.rng = np.random.default_rng(seed)
        self.picked: dict[int, np.ndarray] = {}
        self.seen: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.began = self.ended = False
        self.profile_rollouts = 0

    def begin(self, table: EpochTable) -> None:
        self.began = True
        if self.profile:  # what the arm says its profile cost, which the replay reports
            self.profile_rollouts = 1000 + int(table.epochs[0].trials.sum())

    def pick(self, epoch, candidates, batch_size):
        k = int(self.rng.integers(0, batch_size + 1))
        picks = self.rng.choice(candidates, size=k, replace=False)
        self.picked[epoch] = picks
        return picks

    def see(self, epoch, ids, successes, trials):
        self.seen[epoch] = (ids.copy(), successes.copy(), trials.copy())

    def end(self) -> None:
        self.ended = True


@pytest.mark.parametrize("seed", range(20))
def test_every_arm_sees_only_its_picks_and_the_profile_is_charged(seed):
    log, _ = shuffled_run(seed, n=int(np.random.default_rng(seed).integers(4, 30)), epochs=3 + seed % 3)
    table = epochs_of(log)
    batch = 1 + seed % 5
    cold, profiled = RandomArm("cold", False, seed), RandomArm("profiled", True, seed)
    results = replay(table, [cold, profiled, LatestOutcomeFilterArm(seed)], batch)
    assert cold.began and cold.ended and profiled.ended
    assert sorted(cold.picked) == list(range(table.n_epochs))
    assert sorted(profiled.picked) == list(range(1, table.n_epochs))  # the profile is not picked from
    for arm, result in zip((cold, profiled), results, strict=False):
        for e, picks in arm.picked.items():
            epoch = table.epochs[e]
            ids, successes, trials = arm.seen[e]
            assert np.array_equal(ids, picks)
            pos = np.searchsorted(epoch.ids, picks)
            assert np.array_equal(successes, epoch.successes[pos]) and np.array_equal(
                trials, epoch.trials[pos]
            )
            assert result.groups[e] == picks.size <= batch
            assert result.mixed[e] == int(is_mixed(successes, trials).sum())
            assert result.rollouts[e] == int(trials.sum())
    profile = int(table.epochs[0].trials.sum())
    assert results[0].profile_rollouts == 0
    assert results[1].profile_rollouts == 1000 + profile and results[1].groups[0] == 0
    assert results[2].profile_rollouts == profile and results[2].groups[0] == 0


def test_an_arm_that_breaks_the_protocol_is_stopped():
    log, _ = shuffled_run(0)
    table = epochs_of(log)

    class Cheat(RandomArm):
        def __init__(self, picks):
            super().__init__("cheat", False, 0)
            self.fixed = picks

        def pick(self, epoch, candidates, batch_size):
            unseen = np.setdiff1d(np.arange(10), candidates)
            return {"unseen": unseen[:1], "many": candidates[: batch_size + 1], "twice": candidates[[0, 0]]}[
                self.fixed
            ]

    for how, words in (("unseen", "did not observe"), ("many", "at most 3"), ("twice", "twice")):
        arm = Cheat(how)
        with pytest.raises(ValueError, match=words):
            replay(table, [arm], 3)
        assert arm.ended


def test_a_skipped_arm_is_reported_and_the_others_run():
    log, _ = shuffled_run(1)
    table = epochs_of(log)

    class Refused(RandomArm):
        def pick(self, epoch, candidates, batch_size):
            raise ArmSkipped("the service refused it")

    refused, ok = Refused("refused", False, 0), RandomArm("ok", False, 0)
    calls = []
    results = replay(table, [refused, ok], 3, progress=calls.append)
    assert results[0].skipped == "the service refused it" and refused.ended
    assert results[1].skipped is None and len(ok.picked) == table.n_epochs
    assert len(calls) == 2 * table.n_epochs  # the bar reaches its total


def test_the_latest_outcome_filter_keeps_what_the_latest_group_says():
    # Prompts 0..5 in groups of 2; epoch 0: 0 and 1 mixed, 2 solved, 3..5 failed; epoch 1: 0 solved;
    # epoch 2: every prompt mixed.
    steps = [0] * 6 + [1] * 6 + [2] * 6
    prompts = list(range(6)) * 3
    successes = [1, 1, 2, 0, 0, 0] + [2, 1, 1, 0, 0, 0] + [1] * 6
    table = epochs_of(make_log(steps, prompts, successes, [2] * 18))

    class Recorded(LatestOutcomeFilterArm):
        def __init__(self) -> None:
            super().__init__(0)
            self.picks: list[list[int]] = []
            self.kept: list[list[int]] = []

        def see(self, epoch, ids, successes, trials):
            super().see(epoch, ids, successes, trials)
            self.picks.append(sorted(ids.tolist()))
            self.kept.append(np.flatnonzero(self.keep).tolist())

    arm = Recorded()
    (result,) = replay(table, [arm], 2)
    assert result.profile_rollouts == 12  # epoch 0: six groups of 2
    # Epoch 1: picks its two kept prompts (mixed in the profile) and drops 0 (solved). Epoch 2: one kept
    # prompt left (1); a dropped one fills the batch, comes out mixed and is readmitted.
    assert arm.picks[0] == [0, 1] and arm.kept[0] == [1]
    (refill,) = set(arm.picks[1]) - {1}
    assert 1 in arm.picks[1] and arm.kept[1] == sorted([1, refill])
    assert result.groups.tolist() == [0, 2, 2] and result.mixed.tolist() == [0, 1, 2]


def test_the_profile_is_charged_its_share_of_the_run():
    result = ArmResult("x", True, np.array([0, 5]), np.array([0, 2]), np.array([0, 10]), profile_rollouts=10)
    # A run of 20 rollouts that profiles with 10 trains on 10: 2 mixed of 10 rollouts, at half the run.
    assert result.effective_per_rollout(20) == pytest.approx(0.2 * 0.5)
    assert result.esr(slice(1, 2)) == 0.4 and result.esr(slice(0, 1)) is None
