"""Cold start (core/coldstart.py, docs/methods.md §6): metadata, group rates, cold and frozen priors, and their
use by every Beta-family score; the shared state's step close (core/step_close.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from selector_service.core import (
    PARTIAL,
    SOLVED,
    UNSOLVED,
    BeliefArrays,
    apply_results,
    close_step,
    score,
    select,
    thompson_scores,
    wmi_scores,
)
from selector_service.core._parallel import PARALLEL_MIN
from selector_service.core.coldstart import (
    MAX_GROUPS,
    SharedState,
    apply_metadata,
    beta_for,
    group_rates,
    live_pass_rates,
    prior_pass_rates,
)
from selector_service.core.curricula import adarft_scores, learnability_scores
from selector_service.core.rng import stream
from selector_service.core.step_close import close_shared
from tests.core import naive

PER_PROMPT = (
    "alpha",
    "beta",
    "step_state",
    "last_state",
    "n_obs",
    "pass_rate",
    "group",
    "prior_p0",
    "streak",
    "pass_samples",
    "prior_n",
)
SHARED = ("group_successes", "group_trials", "step_adv", "step_adv_n")


def random_metadata(rng, n, groups, known_share, grouped_share):
    """Pass rates (NaN where unknown) and groups (-1 where none) for n prompts."""
    rates = rng.uniform(0, 1, n).astype(np.float32)
    rates[rng.random(n) >= known_share] = np.nan
    group = rng.integers(0, max(groups, 1), n).astype(np.int32)
    group[rng.random(n) >= grouped_share] = -1
    return rates, group


def random_results(rng, n, m, k_choices=(1.0, 4.0, 8.0)):
    ids = rng.integers(0, n, m)  # repeats on purpose: a prompt's first result freezes its prior
    trials = rng.choice(k_choices, m)
    successes = np.minimum(np.floor(rng.uniform(0, 1, m) * (trials + 1)), trials)
    states = np.where(successes == 0, UNSOLVED, np.where(successes == trials, SOLVED, PARTIAL)).astype(
        np.int8
    )
    return ids, successes, trials, states


def per_prompt(ba, name):
    """A per-prompt array of the beliefs; the pooled step state in the dense layout."""
    return ba.dense_hmm()["step_state"] if name == "step_state" else getattr(ba, name)


def twin_state(ba):
    arr = {name: per_prompt(ba, name).copy() for name in PER_PROMPT}
    for name in ("alpha", "beta", "prior_p0"):
        arr[name] = arr[name].astype(np.float64)
    sh = ba.shared
    twin = {name: getattr(sh, name).copy() for name in (*SHARED, "sec_q", "step_counts")}
    twin.update(p_easy=sh.p_easy, p_hard=sh.p_hard, adarft_t=sh.adarft_t)
    return arr, twin


def rules_doc(ba):
    r = ba.shared.rules
    return {
        "sec_lr": r.sec_lr,
        "adarft_eta": r.adarft_eta,
        "adarft_alpha": r.adarft_alpha,
        "adarft_beta": r.adarft_beta,
        "group_decay": r.group_decay,
    }


def assert_matches_twin(ba, arr, sh):
    for name in PER_PROMPT:
        np.testing.assert_array_equal(per_prompt(ba, name), arr[name], err_msg=name)
    for name in ("group_successes", "group_trials", "step_adv_n", "sec_q"):
        np.testing.assert_allclose(getattr(ba.shared, name), sh[name], rtol=1e-12, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(ba.shared.step_adv, sh["step_adv"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ba.shared.step_counts, sh["step_counts"], rtol=1e-12)
    for name in ("p_easy", "p_hard", "adarft_t"):
        assert getattr(ba.shared, name) == pytest.approx(sh[name], rel=1e-12, abs=1e-12), name


# ---------------------------------------------------------------- the update against its twin


def random_samples(rng, n, counted_share):
    """Sample counts behind pass rates (-1 where unknown), from 1 to the largest accepted."""
    samples = rng.choice([1, 2, 8, 16, 80, 10**6], n).astype(np.int32)
    samples[rng.random(n) >= counted_share] = -1
    return samples


@pytest.mark.parametrize(
    ("groups", "known", "grouped", "lam", "gamma", "counted"),
    [
        (0, 0.0, 0.0, 1.0, 0.9, 0.0),  # no metadata: docs/methods.md §1 exactly
        (5, 0.0, 1.0, 1.0, 0.9, 0.0),  # groups only
        (5, 0.5, 0.7, 0.7, 0.9, 0.0),  # both, some prompts with neither
        (3, 1.0, 0.0, 0.5, 1.0, 0.0),  # pass rates only, no group decay
        (40, 0.3, 0.9, 0.9, 0.5, 0.0),  # many groups, strong decay
        (3, 1.0, 0.0, 0.5, 1.0, 1.0),  # every rate with its sample count, forgetting pulls to it
        (5, 0.6, 0.7, 0.7, 0.9, 0.5),  # counts for some rates, counts beside unknown rates, groups
    ],
)
def test_apply_and_close_match_the_sequential_twin(groups, known, grouped, lam, gamma, counted):
    rng = np.random.default_rng(groups * 7 + int(known * 10) + int(counted * 100))
    n, a0, b0, strength = 60, 1.0, 2.0, 3.0
    ba = BeliefArrays.new(n, a0, b0, prior_strength=strength, group_decay=gamma, sec_lr=0.3)
    rates, group = random_metadata(rng, n, groups, known, grouped)
    apply_metadata(ba, 0, rates, group, random_samples(rng, n, counted) if counted else None)
    arr, sh = twin_state(ba)
    for _ in range(6):
        for _ in range(3):
            ids, s, t, states = random_results(rng, n, 25)
            apply_results(ba, ids, s, t, states, lam, a0, b0)
            naive.apply_results_cold(arr, sh, ids, s, t, states, lam, a0, b0, strength)
        assert_matches_twin(ba, arr, sh)
        close_shared(ba)
        close_step(ba, 0.7)
        naive.close_shared(sh, rules_doc(ba))
        arr["step_state"][:] = 0
        assert_matches_twin(ba, arr, sh)


def test_without_metadata_the_update_is_unchanged():
    """No metadata: bit for bit the docs/methods.md §1 update, and every score reads the stored arrays."""
    rng = np.random.default_rng(1)
    ba = BeliefArrays.new(50)
    ref = {k: v.copy() for k, v in ba.arrays().items()}
    ref["step_state"] = np.zeros(50, dtype=np.int8)
    for _ in range(3):
        ids, s, t, states = random_results(rng, 50, 40)
        apply_results(ba, ids, s, t, states, 0.7, 1.0, 1.0)
        naive.apply_results(ref["alpha"], ref["beta"], ref["step_state"], ref["last_state"], ref["n_obs"],
                            ids, s, t, states, 0.7, 1.0, 1.0)  # fmt: skip
    np.testing.assert_array_equal(ba.alpha, ref["alpha"])
    np.testing.assert_array_equal(ba.beta, ref["beta"])
    a, b, ids = beta_for(ba, np.arange(5))
    assert a is ba.alpha and b is ba.beta and ids.tolist() == [0, 1, 2, 3, 4]


def test_frozen_prior_sees_earlier_results_of_the_same_request():
    """docs/methods.md §6 by hand: prompts 0 and 1 in group 2, no pass rates, alpha0 = beta0 = 1, s = 2."""
    ba = BeliefArrays.new(4, prior_strength=2.0, group_decay=0.5)
    apply_metadata(ba, 0, None, np.array([2, 2, -1, 0], np.int32))
    # One request: prompt 0 with 8/8, then prompt 1 with 0/8, then prompt 0 again with 4/8.
    apply_results(
        ba, np.array([0, 1, 0]), np.array([8.0, 0.0, 4.0]), np.full(3, 8.0),
        np.array([SOLVED, UNSOLVED, PARTIAL], np.int8), 1.0, 1.0, 1.0,
    )  # fmt: skip
    # Prompt 0 froze m_2 = 1/2 (no results yet): prior (2, 2) -> (2 + 8 + 4, 2 + 0 + 4) = (14, 6).
    assert ba.prior_p0[0] == 0.5 and ba.alpha[0] == 14.0 and ba.beta[0] == 6.0
    # Prompt 1 saw prompt 0's first result: m_2 = (1 + 8) / (2 + 8) = 0.9 -> prior (2.8, 1.2) + (0, 8).
    assert ba.prior_p0[1] == pytest.approx(0.9)
    assert (ba.alpha[1], ba.beta[1]) == pytest.approx((2.8, 9.2))
    assert ba.shared.group_successes.tolist() == [0.0, 0.0, 12.0]
    assert ba.shared.group_trials.tolist() == [0.0, 0.0, 24.0]
    # A never-observed prompt of group 0 keeps Beta(1, 1) (m_0 = 1/2 -> (2, 2)); without group: (1, 1).
    a, b, _ = beta_for(ba, np.array([3, 2]))
    assert a.tolist() == [2.0, 1.0] and b.tolist() == [2.0, 1.0]
    # Step close: the group sums decay by gamma = 0.5.
    close_shared(ba)
    assert ba.shared.group_successes.tolist() == [0.0, 0.0, 6.0]
    assert ba.shared.group_trials.tolist() == [0.0, 0.0, 12.0]


def test_a_known_pass_rate_beats_the_group_rate_and_later_metadata_leaves_frozen_priors():
    ba = BeliefArrays.new(3, prior_strength=4.0)
    apply_metadata(ba, 0, np.array([0.25, np.nan, np.nan]), np.array([0, 0, -1]))
    apply_results(
        ba, np.array([0]), np.array([1.0]), np.array([4.0]), np.array([PARTIAL], np.int8), 1.0, 1.0, 1.0
    )
    assert (ba.alpha[0], ba.beta[0]) == (1.0 + 1.0 + 1.0, 1.0 + 3.0 + 3.0)
    apply_metadata(ba, 0, np.array([0.9, 0.1], np.float32), None)  # prompts 0 and 1
    assert ba.prior_p0[0] == 0.25 and (ba.alpha[0], ba.beta[0]) == (3.0, 7.0)
    assert prior_pass_rates(ba, np.array([0, 1, 2])).tolist()[:2] == [0.25, float(np.float32(0.1))]
    assert math.isnan(prior_pass_rates(ba, np.array([2]))[0])


@pytest.mark.parametrize("n", [97, PARALLEL_MIN + 5])  # serial and parallel kernels
def test_cold_betas_and_prior_pass_rates_match_the_twin(n):
    rng = np.random.default_rng(n)
    ba = BeliefArrays.new(n, 0.5, 1.5, prior_strength=2.5)
    apply_metadata(ba, 0, *random_metadata(rng, n, 9, 0.4, 0.8), random_samples(rng, n, 0.6))
    for _ in range(3):
        apply_results(ba, *random_results(rng, n, n // 3), 0.8, 0.5, 1.5)
        close_shared(ba)
    sh = ba.shared
    for ids in (np.arange(n), rng.integers(0, n, 300)):
        ref = naive.cold_beta(ba.n_obs, ba.alpha, ba.beta, ba.prior_p0, ba.pass_rate, ba.group,
                              sh.group_successes, sh.group_trials, ids, 0.5, 1.5, 2.5,
                              ba.pass_samples)  # fmt: skip
        a, b, sub = beta_for(ba, None if ids.size == n else ids)
        assert sub is None
        np.testing.assert_array_equal(a, ref[0])
        np.testing.assert_array_equal(b, ref[1])
        np.testing.assert_array_equal(prior_pass_rates(ba, ids), ref[2])
    np.testing.assert_allclose(
        group_rates(sh),
        [naive.group_rate(0.5, 1.5, s, t) for s, t in zip(sh.group_successes, sh.group_trials, strict=True)],
    )


def test_every_beta_family_score_reads_cold_priors():
    rng = np.random.default_rng(3)
    n = 400
    ba = BeliefArrays.new(n)
    apply_metadata(ba, 0, *random_metadata(rng, n, 6, 0.5, 0.8))
    apply_results(ba, *random_results(rng, n, 150), 1.0, 1.0, 1.0)
    ids = rng.choice(n, 120, replace=False)
    sh = ba.shared
    a, b, _ = naive.cold_beta(ba.n_obs, ba.alpha, ba.beta, ba.prior_p0, ba.pass_rate, ba.group,
                              sh.group_successes, sh.group_trials, ids, 1.0, 1.0, 2.0)  # fmt: skip
    assert len(set(np.round(a / (a + b), 6))) > 20  # the priors differ: the test can tell them apart
    kw = dict(ids=ids, step=4, seed=1, key="cold", dataset_k=8)
    np.testing.assert_allclose(
        score(ba, strategy="insight", params={}, **kw), naive.wmi_scores(a, b, None, 8, 3.0, 0.3), rtol=1e-9
    )
    np.testing.assert_allclose(
        score(ba, strategy="expected_difficulty", params={}, **kw),
        naive.expected_difficulty(a, b, slice(None), 0.5),
    )
    np.testing.assert_allclose(
        score(ba, strategy="inverse_evidence", params={}, **kw), naive.inverse_evidence(a, b, slice(None))
    )
    np.testing.assert_allclose(
        score(ba, strategy="learnability", params={}, **kw), naive.learnability(a, b), rtol=1e-12
    )
    mopps = score(ba, strategy="mopps", params={}, **kw)
    ref, _ = thompson_scores(a, b, None, 0.5, stream("cold", 4, 1, "thompson"), items=ids)  # keyed by prompt
    np.testing.assert_array_equal(mopps, ref)
    np.testing.assert_allclose(
        wmi_scores(a, b, None, 8, 3.0, 0.3), score(ba, strategy="insight", params={}, **kw)
    )


def test_learnability_against_the_beta_moments():
    rng = np.random.default_rng(4)
    a = np.concatenate([10 ** rng.uniform(-3, 6, 500), [1.0, 1e-3, 1e6]])
    b = np.concatenate([10 ** rng.uniform(-3, 6, 500), [1.0, 1e6, 1e-3]])
    np.testing.assert_allclose(
        learnability_scores(a, b, None), naive.learnability(a, b), rtol=1e-9, atol=1e-300
    )
    assert learnability_scores(np.array([1.0]), np.array([1.0]), None)[0] == pytest.approx(1 / 6)


def test_adarft_difficulty_uses_pass_rate_then_group_rate_then_posterior_mean():
    ba = BeliefArrays.new(4)
    apply_metadata(ba, 0, np.array([0.8, np.nan, np.nan, np.nan]), np.array([-1, 1, -1, -1]))
    apply_results(ba, np.array([1, 2]), np.array([2.0, 0.0]), np.array([8.0, 2.0]),
                  np.array([PARTIAL, UNSOLVED], np.int8), 1.0, 1.0, 1.0)  # fmt: skip
    # p: the pass rate; group 1's rate (1 + 2) / (2 + 8); prompt 2's posterior mean 1 / 4; the prior mean.
    expected = np.array([np.float32(0.8), 0.3, 0.25, 0.5])
    np.testing.assert_allclose(live_pass_rates(ba, None), expected, rtol=1e-15)
    ba.shared.adarft_t = 62.5
    np.testing.assert_allclose(adarft_scores(ba, None), -np.abs(100 * (1 - expected) - 62.5), rtol=1e-12)
    # d = (20, 70, 75, 50): |d - T| = (42.5, 7.5, 12.5, 12.5): prompt 1, then 2 and 3 tied in random order.
    orders = set()
    for seed in range(8):
        ids, scores = select(
            ba, strategy="adarft", params={}, batch_size=3, step=0, seed=seed, key="a", dataset_k=8
        )
        assert ids[0] == 1 and sorted(ids[1:].tolist()) == [2, 3]
        np.testing.assert_allclose(scores, [-7.5, -12.5, -12.5])
        orders.add(tuple(ids))
    assert len(orders) == 2


# ---------------------------------------------------------------- metadata


def test_metadata_counts_stay_consistent_over_overlapping_uploads():
    rng = np.random.default_rng(5)
    n = 300
    ba = BeliefArrays.new(n)
    for _ in range(20):
        off = int(rng.integers(0, n - 1))
        length = int(rng.integers(1, n - off + 1))
        rates, group = random_metadata(rng, length, int(rng.integers(1, 12)), 0.5, 0.5)
        choice = rng.integers(0, 3)
        apply_metadata(ba, off, rates if choice != 1 else None, group if choice != 2 else None)
        sh = ba.shared
        assert sh.pass_rate_known == np.count_nonzero(~np.isnan(ba.pass_rate))
        assert sh.grouped == np.count_nonzero(ba.group >= 0)
        sizes = np.bincount(ba.group[ba.group >= 0], minlength=sh.n_groups)
        np.testing.assert_array_equal(sh.group_size, sizes)
        assert sh.n_groups >= (ba.group.max() + 1)


@pytest.mark.parametrize(
    ("offset", "rates", "groups", "message"),
    [
        (0, [1.5], None, "pass_rate"),
        (0, [-0.1], None, "pass_rate"),
        (0, [np.inf], None, "pass_rate"),
        (0, [1e300], None, "pass_rate"),  # overflows float32
        (0, None, [MAX_GROUPS], "group"),
        (0, None, [-2], "group"),
        (0, [0.5, 0.5], [1], "one per prompt"),
        (2, [0.5, 0.5], None, "past"),
        (-1, [0.5], None, "offset"),
        (0, None, None, "needs"),
        (0, [], None, "empty"),
        (0, None, [0.5], "integer"),
    ],
)
def test_bad_metadata_is_refused_and_changes_nothing(offset, rates, groups, message):
    ba = BeliefArrays.new(3)
    apply_metadata(ba, 0, np.array([0.2, np.nan, 0.4]), np.array([0, 1, -1]))
    before = ba.copy()
    with pytest.raises(ValueError, match=message):
        apply_metadata(
            ba, offset, None if rates is None else np.array(rates, dtype=np.float64),
            None if groups is None else np.array(groups),
        )  # fmt: skip
    now = ba.arrays()
    for name, arr in before.arrays().items():
        np.testing.assert_array_equal(now[name], arr, err_msg=name)
    assert ba.shared.header() == before.shared.header()
    np.testing.assert_array_equal(ba.shared.group_size, before.shared.group_size)


def test_shared_state_round_trips_through_header_and_arrays():
    rng = np.random.default_rng(6)
    ba = BeliefArrays.new(80, group_decay=0.7)
    apply_metadata(ba, 0, *random_metadata(rng, 80, 5, 0.5, 0.9))
    apply_results(ba, *random_results(rng, 80, 50), 1.0, 1.0, 1.0)
    close_shared(ba)
    apply_results(ba, *random_results(rng, 80, 10), 1.0, 1.0, 1.0)  # mid-step statistics too
    sh = ba.shared
    back = SharedState.from_parts(sh.rules, sh.header(), {k: v.copy() for k, v in sh.group_arrays().items()})
    assert back.header() == sh.header()
    for name, arr in sh.group_arrays().items():
        np.testing.assert_array_equal(getattr(back, name), arr)
    with pytest.raises(ValueError):
        SharedState.from_parts(sh.rules, {}, sh.group_arrays())
    with pytest.raises(ValueError, match="one length"):
        SharedState.from_parts(sh.rules, sh.header(), dict(sh.group_arrays(), sec_q=np.zeros(2)))


@pytest.mark.parametrize("strategy", ["insight", "expected_difficulty", "inverse_evidence", "learnability"])
def test_whole_dataset_scores_in_chunks_equal_scores_in_one_piece(monkeypatch, strategy):
    from selector_service.core import coldstart

    rng = np.random.default_rng(8)
    n = 5000
    ba = BeliefArrays.new(n)
    apply_metadata(ba, 0, *random_metadata(rng, n, 4, 0.5, 0.8))
    apply_results(ba, *random_results(rng, n, 800), 1.0, 1.0, 1.0)
    kw = dict(strategy=strategy, params={}, ids=None, step=0, seed=0, key="c", dataset_k=8)
    whole = score(ba, **kw)
    monkeypatch.setattr(coldstart, "SCORE_CHUNK", 777)
    np.testing.assert_array_equal(score(ba, **kw), whole)
    np.testing.assert_array_equal(score(ba, **dict(kw, ids=np.arange(n))), whole)


@pytest.mark.parametrize("strategy", ["insight", "expected_difficulty", "inverse_evidence", "learnability"])
@pytest.mark.parametrize(("n", "observed"), [(3000, 0), (3000, 40), (3000, 2900), (80_000, 500)])
def test_whole_dataset_scores_around_the_prior_equal_scores_of_every_prompt(strategy, n, observed):
    """Without cold priors the prior's score is computed once and the other prompts' one by one
    (coldstart._scores_around_the_prior); every value must be the one scoring each prompt gives, also
    for prompts whose decayed posterior is back at exactly the prior, and when most prompts differ."""
    rng = np.random.default_rng(n + observed)
    ba = BeliefArrays.new(n, 0.5, 2.0)
    if observed:
        apply_results(ba, *random_results(rng, n, observed), 0.9, 0.5, 2.0)
        back = rng.choice(np.flatnonzero(ba.alpha != 0.5), 3, replace=False)
        ba.alpha[back], ba.beta[back] = 0.5, 2.0  # observed, yet holding the prior exactly
    kw = dict(strategy=strategy, params={}, step=0, seed=0, key="c", dataset_k=8)
    whole = score(ba, ids=None, **kw)
    np.testing.assert_array_equal(whole, score(ba, ids=np.arange(n), **kw))
    out = np.full(n, np.nan)
    assert score(ba, ids=None, out=out, **kw) is out
    np.testing.assert_array_equal(out, whole)


def test_group_statistics_by_hand():
    from selector_service.core.coldstart import group_statistics

    ba = BeliefArrays.new(6, prior_strength=2.0)
    assert group_statistics(ba)["group"].size == 0
    apply_metadata(
        ba, 0, np.array([0.5, np.nan, np.nan, np.nan, np.nan, np.nan]), np.array([4, 4, 4, 1, -1, 1])
    )
    apply_results(
        ba, np.array([1]), np.array([6.0]), np.array([8.0]), np.array([PARTIAL], np.int8), 1.0, 1.0, 1.0
    )
    stats = group_statistics(ba)
    assert stats["group"].tolist() == [1, 4] and stats["size"].tolist() == [2, 3]
    np.testing.assert_allclose(stats["observed_share"], [0.0, 1 / 3])
    m4 = (1 + 6) / (2 + 8)
    # Group 4: prompt 0 (pass rate 0.5: mean 0.5), prompt 1 (observed: prior m_4 before = 0.5 -> (2, 2) +
    # (6, 2) = 8/12), prompt 2 (cold: Beta(1 + 2 m4, 1 + 2 (1 - m4)), mean (1 + 2 m4) / 4).
    expected_4 = (0.5 + 8 / 12 + (1 + 2 * m4) / 4) / 3
    np.testing.assert_allclose(stats["posterior_mean"], [0.5, expected_4])
    np.testing.assert_allclose(stats["rate"], [0.5, m4])


def test_the_states_score_cache_follows_moving_group_rates():
    """INSIGHT over the whole dataset is cached by the state; an observation of a grouped prompt moves
    the cold priors of every never-observed prompt of its group, so the cache must not serve old scores."""
    from selector_service.dataset.state import DatasetSpec, DatasetState

    st = DatasetState(DatasetSpec(name="cache", size=300, group_decay=0.5))
    apply_metadata(st.arrays, 0, None, (np.arange(300) % 3).astype(np.int32))
    params = {"eta": 3.0, "mu": 0.3, "k": None, "candidate_ratio": None}

    def fresh():
        return score(st.arrays, strategy="insight", params=params, ids=None, step=st.open_step, seed=0,
                     key="cache", dataset_k=8)  # fmt: skip

    for step in range(3):
        ids, scores = st.select("insight", params, 20, seed=step)
        full = fresh()
        np.testing.assert_array_equal(scores, full[ids])
        st.apply_outcomes(np.array([step, 100 + step]), np.array([8.0, 0.0]), np.full(2, 8.0),
                          np.array([SOLVED, UNSOLVED], np.int8))  # fmt: skip
        ids, scores = st.select("insight", params, 20, seed=step)
        np.testing.assert_array_equal(scores, fresh()[ids])
        assert not np.array_equal(fresh(), full)  # the rates did move
        st.close_until(step + 1)
