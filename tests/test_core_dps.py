"""The DPS step close (core/dps.py, METHODS 2) against a literal per-prompt loop."""

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
)
from selector_service.core._parallel import PARALLEL_MIN
from tests import naive


def observe(ba, ids, states):
    ids = np.asarray(ids, dtype=np.int64)
    states = np.asarray(states, dtype=np.int8)
    trials = np.full(ids.size, 8.0)
    successes = np.where(states == UNSOLVED, 0.0, np.where(states == SOLVED, 8.0, 3.0))
    apply_results(ba, ids, successes, trials, states, 1.0, 1.0, 1.0)


def test_methods_worked_values():
    """METHODS 2, D0 = ones, lam = 0.5: 1/3 stays; one obs in state 2 -> 0.40, in 1 or 3 -> 0.30;
    then 0.40 relaxes to 0.368, 0.351, ..."""
    ba = BeliefArrays.new(4)
    observe(ba, [1, 2, 3], [PARTIAL, UNSOLVED, SOLVED])
    close_step(ba, 0.5)
    assert ba.hmm_prior[0, 1] == np.float32(1 / 3)
    assert ba.hmm_prior[1, 1] == pytest.approx(0.40, abs=1e-7)
    assert ba.hmm_prior[2, 1] == pytest.approx(0.30, abs=1e-7)
    assert ba.hmm_prior[3, 1] == pytest.approx(0.30, abs=1e-7)
    relaxed = []
    for _ in range(3):
        close_step(ba, 0.5)
        relaxed.append(float(ba.hmm_prior[1, 1]))
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
    assert not ba.step_state.any()
    observe(ba, [0, 1, 1, 2], [PARTIAL, SOLVED, SOLVED, UNSOLVED])  # prompt 1 twice: pooled SOLVED
    stats = close_step(ba, 0.5)
    # prompt 0 predicted partial and was partial; prompt 1 predicted partial, was solved; prompt 2 (uniform
    # prior -> predicted unsolved) was unsolved
    assert (stats.observed, stats.partial, stats.correct) == (3, 1, 2)
    assert sum(stats[3:]) == 6


def run_random_steps(n, lam, steps, seed):
    """Random observation patterns: each step a random subset, several results for some prompts."""
    rng = np.random.default_rng(seed)
    ba = BeliefArrays.new(n)
    ref = {k: v.copy() for k, v in ba.arrays().items()}
    all_stats = []
    for _ in range(steps):
        m = int(rng.integers(0, n))
        ids = rng.integers(0, n, m)  # repeats: several results per prompt per step
        states = rng.choice([UNSOLVED, PARTIAL, SOLVED], m, p=[0.3, 0.4, 0.3]).astype(np.int8)
        observe(ba, ids, states)
        for p, s in zip(ids, states, strict=True):
            ref["step_state"][p] = naive.combine_state(int(ref["step_state"][p]), int(s))
        stats = close_step(ba, lam)
        ref_stats = naive.close_step(ref["hmm_d"], ref["hmm_prior"], ref["hmm_prev"], ref["step_state"], lam)
        all_stats.append((tuple(stats), ref_stats))
    return ba, ref, all_stats


@pytest.mark.parametrize("lam", [0.5, 0.7, 1.0])
def test_fifty_random_steps_match_the_literal_loop(lam):
    """Float64 inside, float32 stored: the kernel and the twin do the same operations up to summation
    order, so after each float32 rounding they agree to ~1 ulp of float32 (rtol 1e-6 over 50 steps
    allows a few ulp of drift); the integer statistics must match exactly."""
    ba, ref, all_stats = run_random_steps(60, lam, 50, seed=int(lam * 100))
    for ours, theirs in all_stats:
        assert ours == theirs
    np.testing.assert_allclose(ba.hmm_d, ref["hmm_d"], rtol=1e-6, atol=0)
    np.testing.assert_allclose(ba.hmm_prior, ref["hmm_prior"], rtol=1e-6, atol=0)
    np.testing.assert_array_equal(ba.hmm_prev, ref["hmm_prev"])
    np.testing.assert_array_equal(ba.step_state, ref["step_state"])
    np.testing.assert_allclose(ba.hmm_prior.sum(axis=1), 1.0, rtol=1e-6)


def test_d0_other_than_one_matches_the_twin():
    rng = np.random.default_rng(9)
    ba = BeliefArrays.new(30, d0=0.5)
    ref = {k: v.copy() for k, v in ba.arrays().items()}
    for _ in range(10):
        ids = rng.choice(30, 10, replace=False)
        states = rng.choice([1, 2, 3], 10).astype(np.int8)
        observe(ba, ids, states)
        ref["step_state"][ids] = states
        assert tuple(close_step(ba, 0.7, d0=0.5)) == naive.close_step(
            ref["hmm_d"], ref["hmm_prior"], ref["hmm_prev"], ref["step_state"], 0.7, d0=0.5
        )
    np.testing.assert_allclose(ba.hmm_prior, ref["hmm_prior"], rtol=1e-6)


def test_parallel_path_equals_serial_path_bitwise():
    """N above PARALLEL_MIN runs the prange kernel; each prompt's update is independent of the others,
    so closing the whole array equals closing it in serial slices, bit for bit."""
    n = PARALLEL_MIN * 2 + 77
    rng = np.random.default_rng(2)
    big = BeliefArrays.new(n)
    for _ in range(3):
        ids = rng.integers(0, n, n // 3)
        observe(big, ids, rng.choice([1, 2, 3], ids.size).astype(np.int8))
        sliced = big.copy()
        stats = close_step(big, 0.7)
        totals = np.zeros(6, dtype=np.int64)
        for lo in range(0, n, 10_000):
            part = BeliefArrays.from_arrays(
                {k: v[lo : lo + 10_000].copy() for k, v in sliced.arrays().items()}
            )
            totals += np.array(close_step(part, 0.7))
            for name, arr in part.arrays().items():
                np.testing.assert_array_equal(getattr(big, name)[lo : lo + 10_000], arr, err_msg=name)
        assert tuple(stats) == tuple(totals)


@pytest.mark.parametrize(("lam", "d0"), [(1.5, 1.0), (-0.1, 1.0), (0.5, 0.0), (0.5, float("nan"))])
def test_rejects_bad_decay_or_prior(lam, d0):
    with pytest.raises(ValueError):
        close_step(BeliefArrays.new(2), lam, d0)
