"""The DPS step close (core/dps.py, docs/methods.md §2) against a literal per-prompt loop."""

from __future__ import annotations

import numpy as np
import pytest

from selector_service.core import (
    PARTIAL,
    SOLVED,
    UNSOLVED,
    BeliefArrays,
    CloseStats,
    apply_results,
    close_step,
    dps,
)
from selector_service.core._parallel import PARALLEL_MIN
from tests.core import naive


def observe(ba, ids, states):
    ids = np.asarray(ids, dtype=np.int64)
    states = np.asarray(states, dtype=np.int8)
    trials = np.full(ids.size, 8.0)
    successes = np.where(states == UNSOLVED, 0.0, np.where(states == SOLVED, 8.0, 3.0))
    apply_results(ba, ids, successes, trials, states, 1.0, 1.0, 1.0)


def test_methods_worked_values():
    """docs/methods.md §2, D0 = ones, lam = 0.5: 1/3 stays; one obs in state 2 -> 0.40, in 1 or 3 -> 0.30;
    then 0.40 relaxes to 0.368, 0.351, ..."""
    ba = BeliefArrays.new(4)
    observe(ba, [1, 2, 3], [PARTIAL, UNSOLVED, SOLVED])
    close_step(ba, 0.5)
    prior = ba.hmm_prior_of(np.arange(4))
    assert prior[0, 1] == np.float32(1 / 3)
    assert prior[1, 1] == pytest.approx(0.40, abs=1e-7)
    assert prior[2, 1] == pytest.approx(0.30, abs=1e-7)
    assert prior[3, 1] == pytest.approx(0.30, abs=1e-7)
    relaxed = []
    for _ in range(3):
        close_step(ba, 0.5)
        relaxed.append(float(ba.hmm_prior_of([1])[0, 1]))
    assert relaxed[0] == pytest.approx(7 / 19, abs=1e-7)  # 0.368
    assert relaxed[1] == pytest.approx(13 / 37, abs=1e-7)  # 0.351
    assert relaxed[0] > relaxed[1] > relaxed[2] > 1 / 3
    assert round(relaxed[0], 3) == 0.368 and round(relaxed[1], 3) == 0.351


def test_close_stats_and_reset():
    ba = BeliefArrays.new(6)
    observe(ba, [0, 1], [PARTIAL, PARTIAL])
    stats = close_step(ba, 0.5)
    # uniform priors predict UNSOLVED (ties -> lowest state): no correct prediction
    assert stats == CloseStats(observed=2, partial=2, correct=0, predicted_unsolved=4, predicted_partial=2,
                               predicted_solved=0)  # fmt: skip
    assert not ba.dense_hmm()["step_state"].any() and ba.observed == 2
    observe(ba, [0, 1, 1, 2], [PARTIAL, SOLVED, SOLVED, UNSOLVED])  # prompt 1 twice: pooled SOLVED
    stats = close_step(ba, 0.5)
    # prompt 0 predicted partial and was partial; prompt 1 predicted partial, was solved; prompt 2 (uniform
    # prior -> predicted unsolved) was unsolved
    assert (stats.observed, stats.partial, stats.correct) == (3, 1, 2)
    assert sum(stats[3:]) == 6


def dense_reference(ba):
    """The dense layout of `ba` (every prompt's DPS state) for the twin, which walks every prompt."""
    return {name: arr.copy() for name, arr in ba.dense_hmm().items()}


def run_random_steps(n, lam, steps, seed, d0=1.0):
    """Random observation patterns: each step a random subset, several results for some prompts."""
    rng = np.random.default_rng(seed)
    ba = BeliefArrays.new(n, d0=d0)
    ref = dense_reference(ba)
    all_stats = []
    for _ in range(steps):
        m = int(rng.integers(0, n // 3))
        ids = rng.integers(0, 2 * n // 3, m)  # repeats; the last third is never observed
        states = rng.choice([UNSOLVED, PARTIAL, SOLVED], m, p=[0.3, 0.4, 0.3]).astype(np.int8)
        observe(ba, ids, states)
        for p, s in zip(ids, states, strict=True):
            ref["step_state"][p] = naive.combine_state(int(ref["step_state"][p]), int(s))
        stats = close_step(ba, lam)
        ref_stats = naive.close_step(
            ref["hmm_d"], ref["hmm_prior"], ref["hmm_prev"], ref["step_state"], lam, d0=d0
        )
        all_stats.append((tuple(stats), ref_stats))
    return ba, ref, all_stats


@pytest.mark.parametrize(
    ("lam", "d0"), [(0.5, 1.0), (0.7, 1.0), (1.0, 1.0), (0.3, 1.0), (0.7, 0.3), (0.1, 0.5)]
)
def test_fifty_random_steps_match_the_literal_loop_on_every_prompt(lam, d0):
    """The kernel walks only the observed set; the twin walks every prompt. Float64 inside, float32
    stored: they do the same operations up to summation order and reciprocals, so after each float32
    rounding they agree to ~1 ulp of float32 (rtol 1e-6 over 50 steps allows a few ulp of drift); the
    integer statistics must match exactly, and the prompts the twin never saw observed must still be
    exactly at D0 and 1/3 there after 50 closes (what lets the kernel skip them)."""
    ba, ref, all_stats = run_random_steps(90, lam, 50, seed=int(lam * 100), d0=d0)
    for ours, theirs in all_stats:
        assert ours == theirs
    dense = ba.dense_hmm()
    np.testing.assert_allclose(dense["hmm_d"], ref["hmm_d"], rtol=1e-6, atol=0)
    np.testing.assert_allclose(dense["hmm_prior"], ref["hmm_prior"], rtol=1e-6, atol=0)
    np.testing.assert_array_equal(dense["hmm_prev"], ref["hmm_prev"])
    np.testing.assert_array_equal(dense["step_state"], ref["step_state"])
    np.testing.assert_allclose(dense["hmm_prior"].sum(axis=1), 1.0, rtol=1e-6)
    never = ba.hmm_slot < 0
    assert 0 < never.sum() < ba.n
    assert np.all(ref["hmm_d"][never] == np.float32(d0))
    assert np.all(ref["hmm_prior"][never] == np.float32(1 / 3)) and np.all(
        ref["hmm_prev"][never] == np.float32(1 / 3)
    )


def test_d0_must_match_the_beliefs():
    ba = BeliefArrays.new(30, d0=0.5)
    close_step(ba, 0.7, d0=0.5)
    with pytest.raises(ValueError, match="differs"):
        close_step(ba, 0.7, d0=1.0)


def test_parallel_path_equals_serial_path_bitwise(monkeypatch):
    """An observed set of PARALLEL_MIN prompts or more runs the prange kernel; each prompt's update is
    independent of the others, so it equals the serial kernel bit for bit."""
    n = PARALLEL_MIN * 2 + 77
    rng = np.random.default_rng(2)
    big = BeliefArrays.new(n)
    for _ in range(3):
        ids = rng.integers(0, n, n)
        observe(big, ids, rng.choice([1, 2, 3], ids.size).astype(np.int8))
        assert PARALLEL_MIN <= big.observed < n
        serial = big.copy()
        monkeypatch.setattr(dps, "CLOSE_PARALLEL_MIN", 0)  # the parallel kernel from PARALLEL_MIN rows
        stats = close_step(big, 0.7)
        monkeypatch.setattr(dps, "PARALLEL_MIN", n + 1)
        serial_stats = close_step(serial, 0.7)
        monkeypatch.undo()
        assert stats == serial_stats
        for name, arr in serial.arrays().items():
            np.testing.assert_array_equal(big.arrays()[name], arr, err_msg=name)


@pytest.mark.parametrize(("lam", "d0"), [(1.5, 1.0), (-0.1, 1.0), (0.5, 0.0), (0.5, float("nan"))])
def test_rejects_bad_decay_or_prior(lam, d0):
    with pytest.raises(ValueError):
        close_step(BeliefArrays.new(2), lam, d0)
