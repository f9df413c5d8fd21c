"""Groups of different sizes (docs/methods.md §0, "A group of n rollouts"): with a rollout budget each
prompt's group has its own size n, from 1 to the K limit, whatever the dataset's K. Every belief family is
fed such groups through the whole path (rewards -> outcomes -> the update -> the step close) and compared
with its slow twin: the Beta counts, the DPS states and the HMM close, group rates, GRESO's streaks,
p_easy / p_hard and walk position, SEC's advantages and Q, AdaRFT's T, the step statistics."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from selector_service.core import BeliefArrays, apply_results, outcomes_from_rewards
from selector_service.core.coldstart import apply_metadata
from selector_service.core.step_close import close_open_step
from tests.core import naive
from tests.core.test_coldstart import assert_matches_twin, rules_doc, twin_state
from tests.core.test_walks import twin_greso_position

SIZES = [1, 2, 3, 4, 7, 8, 16, 33, 64, 1024]
KEY = "group-sizes"


def group_rewards(rng, n):
    """A group of n Countdown-style rewards (1 exact, 0.1 format only, 0), often all equal."""
    kind = rng.integers(0, 4)
    if kind == 0:
        return [1.0] * n
    if kind == 1:
        return rng.choice([0.0, 0.1], n).tolist()
    return rng.choice([0.0, 0.1, 1.0], n, p=[0.4, 0.2, 0.4]).tolist()


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    steps=st.integers(1, 4),
    results=st.integers(1, 40),
    lam=st.sampled_from([1.0, 0.7]),
)
def test_every_family_matches_its_twin_on_groups_of_mixed_sizes(seed, steps, results, lam):
    rng = np.random.default_rng(seed)
    n, a0, b0, strength = 30, 1.0, 1.0, 2.0
    ba = BeliefArrays.new(n, a0, b0, prior_strength=strength, group_decay=0.9, sec_lr=0.4)
    rates = np.where(rng.random(n) < 0.3, rng.uniform(0, 1, n), np.nan).astype(np.float32)
    groups = np.where(rng.random(n) < 0.8, rng.integers(0, 4, n), -1).astype(np.int32)
    apply_metadata(ba, 0, rates, groups)
    arr, sh = twin_state(ba)
    dense = ba.dense_hmm()
    d, prior, prev = dense["hmm_d"].copy(), dense["hmm_prior"].copy(), dense["hmm_prev"].copy()
    sh.update(greso_pos=ba.shared.greso_pos)
    for _ in range(steps):
        ids = rng.integers(0, n, results)  # a prompt may get several groups in one step
        rewards = [group_rewards(rng, int(rng.choice(SIZES))) for _ in ids]
        s, t, states = outcomes_from_rewards(rewards, "binary", 1.0)
        ref_s, ref_t, ref_states = naive.outcomes(rewards, "binary", 1.0)
        np.testing.assert_array_equal(s, ref_s)
        np.testing.assert_array_equal(t, ref_t)
        np.testing.assert_array_equal(states, ref_states)
        # a group of n is all solved iff its n rewards are, whatever n: one rollout is never partial
        assert all(st_ != 2 for st_, k in zip(states, t, strict=True) if k == 1)
        apply_results(ba, ids, s, t, states, lam, a0, b0)
        naive.apply_results_cold(arr, sh, ids, ref_s, ref_t, ref_states, lam, a0, b0, strength)
        assert_matches_twin(ba, arr, sh)
        observed = arr["step_state"] != 0
        position = twin_greso_position(ba, KEY, observed)
        stats = close_open_step(ba, hmm_decay=0.7, key=KEY)
        naive.close_shared(sh, rules_doc(ba))
        expected = naive.close_step(d, prior, prev, arr["step_state"], 0.7)
        assert tuple(stats) == expected
        assert ba.shared.greso_pos == position
        assert_matches_twin(ba, arr, sh)
        dense = ba.dense_hmm()
        np.testing.assert_allclose(dense["hmm_d"], d, rtol=1e-6)
        np.testing.assert_allclose(dense["hmm_prior"], prior, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(dense["hmm_prev"], prev, rtol=1e-5, atol=1e-7)
        d, prior, prev = dense["hmm_d"].copy(), dense["hmm_prior"].copy(), dense["hmm_prev"].copy()


def test_a_single_rollout_has_no_advantage_and_pools_by_counts():
    """SEC's |advantage| of a group of one is 0 (GRPO's advantage of a lone rollout is 0); two groups of
    one rollout of a prompt at one step, a success and a failure, pool into a partially solved state,
    exactly as pooling their counts (1 of 2) would."""
    ba = BeliefArrays.new(3, prior_strength=0.0)  # groups without weight in the prior: plain Beta(1, 1)
    apply_metadata(ba, 0, None, np.array([0, 0, 1], dtype=np.int32))
    s, t, states = outcomes_from_rewards([[1.0], [0.0], [1.0, 0.0, 1.0]], "binary", 1.0)
    apply_results(ba, np.array([0, 0, 2]), s, t, states, 1.0, 1.0, 1.0)
    assert ba.dense_hmm()["step_state"].tolist() == [2, 0, 2]
    assert ba.shared.step_adv[0] == 0.0 and ba.shared.step_adv_n[0] == 2
    assert ba.shared.step_adv[1] == naive.mean_abs_advantage(2.0, 3.0)
    assert (ba.alpha[0], ba.beta[0]) == (2.0, 2.0)  # Beta(1, 1) + 1 success + 1 failure
    assert ba.shared.step_counts.tolist() == [3.0, 1.0, 1.0, 3.0, 5.0]  # results, solved, failed, S, T
