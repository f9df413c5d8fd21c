"""Rewards -> (successes, trials, state) and state pooling (core/outcomes.py, docs/methods.md §0 and 2)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selector_service.core import (
    PARTIAL,
    SOLVED,
    UNOBSERVED,
    UNSOLVED,
    combine_state,
    outcomes_from_counts,
    outcomes_from_flat,
    outcomes_from_rewards,
)
from tests.core import naive

reward = st.sampled_from([0.0, 0.1, 0.5, 0.99, 1.0]) | st.floats(min_value=-2.0, max_value=3.0)
reward_lists = st.lists(st.lists(reward, min_size=1, max_size=12), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None, database=None)
@given(
    rows=reward_lists, mode=st.sampled_from(["binary", "fractional"]), threshold=st.sampled_from([1.0, 0.5])
)
def test_matches_the_python_loop(rows, mode, threshold):
    s, t, states = outcomes_from_rewards(rows, mode, threshold)
    ref_s, ref_t, ref_states = naive.outcomes(rows, mode, threshold)
    np.testing.assert_allclose(s, ref_s, rtol=1e-15, atol=1e-15)
    np.testing.assert_array_equal(t, ref_t)
    np.testing.assert_array_equal(states, ref_states)
    assert s.dtype == np.float64 and t.dtype == np.float64 and states.dtype == np.int8


def test_binary_countdown_rewards_count_only_exact_answers():
    """docs/methods.md §0: with threshold 1.0 a 0.1 format bonus is a failure."""
    s, t, states = outcomes_from_rewards([[1, 0.1, 0, 1], [0.1, 0.1], [1, 1, 1]], "binary", 1.0)
    assert s.tolist() == [2.0, 0.0, 3.0]
    assert t.tolist() == [4.0, 2.0, 3.0]
    assert states.tolist() == [PARTIAL, UNSOLVED, SOLVED]


def test_fractional_mode_clips_sums_and_uses_the_spread():
    rows = [[0.3, 0.3, 0.3], [0.7, 0.7], [1.5, 1.0], [0.2, 0.9], [-1.0, 0.0], [0.5]]
    s, t, states = outcomes_from_rewards(rows, "fractional", 1.0)
    np.testing.assert_allclose(s, [0.9, 1.4, 2.0, 1.1, 0.0, 0.5])
    assert t.tolist() == [3.0, 2.0, 2.0, 2.0, 2.0, 1.0]
    # all equal and < 0.5 -> unsolved; all equal >= 0.5 -> solved; clipped 1.5 equals 1.0 (no spread)
    assert states.tolist() == [UNSOLVED, SOLVED, SOLVED, PARTIAL, UNSOLVED, SOLVED]


def test_two_d_and_flat_forms_agree():
    rng = np.random.default_rng(1)
    rewards = rng.choice([0.0, 0.1, 1.0], size=(50, 8))
    two_d = outcomes_from_rewards(rewards, "binary", 1.0)
    flat = outcomes_from_flat(rewards.ravel(), np.arange(51) * 8, "binary", 1.0)
    listed = outcomes_from_rewards([list(r) for r in rewards], "binary", 1.0)
    for x, y, z in zip(two_d, flat, listed, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)


@pytest.mark.parametrize(
    ("values", "offsets", "message"),
    [
        ([1.0, 0.0], [0, 1], "end at len"),
        ([1.0, 0.0], [1, 2], "start at 0"),
        ([1.0, 0.0], [0, 0, 2], "at least one reward"),
        ([1.0, np.nan], [0, 2], "finite"),
        ([1.0, np.inf], [0, 2], "finite"),
    ],
)
def test_flat_form_rejects_malformed_input(values, offsets, message):
    with pytest.raises(ValueError, match=message):
        outcomes_from_flat(np.array(values), np.array(offsets), "binary", 1.0)


def test_unknown_mode_and_bad_threshold_are_rejected():
    with pytest.raises(ValueError, match="reward mode"):
        outcomes_from_rewards([[1.0]], "graded", 1.0)
    with pytest.raises(ValueError, match="threshold"):
        outcomes_from_rewards([[1.0]], "binary", float("nan"))


def test_counts_give_states():
    s = np.array([0.0, 3.0, 8.0, 2.5, 0.0, 1.0])
    t = np.array([8.0, 8.0, 8.0, 4.0, 1.0, 1.0])
    assert outcomes_from_counts(s, t).tolist() == [UNSOLVED, PARTIAL, SOLVED, PARTIAL, UNSOLVED, SOLVED]


@pytest.mark.parametrize(("s", "t"), [([3.0], [2.0]), ([-1.0], [2.0]), ([0.0], [0.0]), ([np.nan], [2.0])])
def test_counts_reject_impossible_results(s, t):
    with pytest.raises(ValueError):
        outcomes_from_counts(np.array(s), np.array(t))


def test_combine_state_is_pooling():
    """Every pair of states against the twin, and against pooling two binary results' S / trials."""
    for old, new in itertools.product([UNOBSERVED, UNSOLVED, PARTIAL, SOLVED], [UNSOLVED, PARTIAL, SOLVED]):
        assert combine_state(old, new) == naive.combine_state(old, new)
    # pooled counts: unsolved (0/4) + solved (4/4) = 4/8 -> partial; solved + solved -> solved
    representative = {UNSOLVED: (0, 4), PARTIAL: (2, 4), SOLVED: (4, 4)}
    for x, y in itertools.product(representative, repeat=2):
        pooled = outcomes_from_counts(
            np.array([representative[x][0] + representative[y][0]], dtype=float),
            np.array([representative[x][1] + representative[y][1]], dtype=float),
        )[0]
        assert combine_state(x, y) == pooled
