"""The filter (core/filter.py, docs/methods.md §9) and the sample counts behind pass rates (docs/methods.md §6):
the kernel against its slow twin (tests/core/naive.py) over the whole belief domain and at its edges, the
judgment of each prompt's belief, the random draws, and what a filtered select hands out for every
strategy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selector_service.core import BeliefArrays, apply_results, close_open_step, outcomes_from_counts
from selector_service.core.coldstart import apply_metadata, beta_for
from selector_service.core.domain import BELIEF_MAX, K_MAX, PASS_SAMPLES_MAX, PRIOR_MIN
from selector_service.core.filter import (
    DRAWS_MIN,
    DRAWS_PER_PROMPT,
    KEEP,
    Filter,
    draw,
    judge,
    zero_advantage_probabilities,
)
from selector_service.core.rng import stream
from selector_service.core.strategies import STRATEGIES, ParamError, score, select, validate_filter
from tests.core import naive

N = 400


def make_filter(**settings) -> Filter:
    return Filter.of(validate_filter(settings), 8)


def busy_beliefs(seed: int, n: int = N, decay: float = 1.0) -> BeliefArrays:
    """Beliefs with profiled rates (0, 1 and between, some without a count, some unknown), groups, and
    results of a few steps."""
    rng = np.random.default_rng(seed)
    ba = BeliefArrays.new(n, prior_strength=2.0)
    rates = rng.choice([0.0, 0.125, 0.5, 0.875, 1.0, np.nan], n)
    samples = rng.choice([-1, 1, 4, 8, 16, 64], n).astype(np.int32)
    apply_metadata(ba, 0, rates, rng.integers(-1, 4, n).astype(np.int32), samples, True)
    for _ in range(3):
        ids = rng.choice(n, n // 4, replace=False)
        trials = np.full(ids.size, 8.0)
        succ = rng.choice([0.0, 8.0, 3.0], ids.size)
        apply_results(ba, ids, succ, trials, outcomes_from_counts(succ, trials), decay, 1.0, 1.0)
        close_open_step(ba, hmm_decay=0.7, key="f")
    return ba


# ---------------------------------------------------------------- the kernel against its twin


def _near(p: float, bound: float) -> bool:
    return abs(p - bound) <= 1e-9 * max(bound, 1e-300)


@settings(max_examples=200, deadline=None, database=None)
@given(
    log_a=st.floats(math.log10(PRIOR_MIN), math.log10(BELIEF_MAX)),
    log_b=st.floats(math.log10(PRIOR_MIN), math.log10(BELIEF_MAX)),
    k=st.sampled_from([1, 2, 8, 64, K_MAX]) | st.integers(1, K_MAX),
)
def test_probabilities_match_the_beta_function_over_the_whole_domain(log_a, log_b, k):
    """E[p^k] and E[(1 - p)^k] as products of ratios <= 1, against B(a + k, b) / B(a, b) in mpmath: a few
    ulps per factor wherever the value is a normal float, from a, b = 1e-3 to 1e300."""
    a, b = 10.0**log_a, 10.0**log_b
    solved, unsolved = zero_advantage_probabilities(np.array([a]), np.array([b]), k)
    for got, want in ((solved[0], naive.all_of_group(a, b, k)), (unsolved[0], naive.all_of_group(b, a, k))):
        assert 0.0 <= got <= 1.0
        if want > 1e-300:
            assert got == pytest.approx(want, rel=4e-16 * (k + 2)), (a, b, k)
        else:
            assert got <= 1e-290


@pytest.mark.parametrize("n", [1, 2, 8, 80, PASS_SAMPLES_MAX])
@pytest.mark.parametrize("rate", [0.0, 1.0, 0.375])
def test_a_rate_from_n_samples_is_a_beta_prior_of_n_samples(n, rate):
    """docs/methods.md §6: r from n samples is Beta(alpha0 + n r, beta0 + n (1 - r)), so 3/8 and 30/80
    share a mean and not a weight; at the edges r = 0 and 1 and n = 1 .. 1e6 the filter's probabilities
    are the closed forms of the Beta-binomial."""
    ba = BeliefArrays.new(3, prior_strength=2.0)
    apply_metadata(ba, 0, np.array([rate, rate, np.nan]), None, np.array([n, -1, n]))
    a, b, _ = beta_for(ba, np.arange(3))
    assert (a[0], b[0]) == (1.0 + n * rate, 1.0 + n * (1 - rate))
    assert (a[1], b[1]) == (1.0 + 2.0 * rate, 1.0 + 2.0 * (1 - rate))  # no count: prior_strength
    assert (a[2], b[2]) == (1.0, 1.0)  # a count without a rate waits for its rate
    solved, unsolved = zero_advantage_probabilities(a[:1], b[:1], 8)
    if rate == 0.0:  # Beta(1, 1 + n): P(all 8 fail) = (n + 1) / (n + 9)
        assert unsolved[0] == pytest.approx((n + 1) / (n + 9), rel=1e-14)
    if rate == 1.0:
        assert solved[0] == pytest.approx((n + 1) / (n + 9), rel=1e-14)
    # A bound of 1/2 drops 0/n and n/n exactly from n = 7 (K - 1) samples on: the offline filter.
    code = judge(ba, np.array([0]), make_filter())[0]
    assert (code != KEEP) == (rate in (0.0, 1.0) and n >= 7)


def test_three_of_eight_and_thirty_of_eighty_differ():
    ba = BeliefArrays.new(4, prior_strength=2.0)
    apply_metadata(ba, 0, np.array([0.375, 0.375, 0.0, 0.0]), None, np.array([8, 80, 2, 20]))
    a, b, _ = beta_for(ba, np.arange(4))
    assert (a[:2] / (a[:2] + b[:2])).round(3).tolist() == [0.4, 0.378] and (a + b)[:2].tolist() == [10, 82]
    # 0/2 is no evidence that a group of 8 fails (P = 3/11); 0/20 is (P = 21/29).
    assert judge(ba, np.arange(2, 4), make_filter()).tolist() == [KEEP, 2]


def test_a_frozen_count_weighs_the_prior_that_forgetting_pulls_toward():
    """At the first observation the prior's count freezes with its rate: later uploads leave it."""
    ba = BeliefArrays.new(2, prior_strength=2.0)
    apply_metadata(ba, 0, np.array([0.25, 0.25]), None, np.array([40, -1]))
    apply_results(ba, np.array([0, 1]), np.array([4.0, 4.0]), np.array([8.0, 8.0]),
                  np.array([2, 2], np.int8), 0.5, 1.0, 1.0)  # fmt: skip
    # alpha <- 0.5 alpha0_i + 0.5 alpha0_i + S: the prior itself, then the result.
    assert (ba.alpha[0], ba.beta[0]) == (1 + 10 + 4, 1 + 30 + 4) and ba.prior_n.tolist() == [40, -1]
    assert (ba.alpha[1], ba.beta[1]) == (1 + 0.5 + 4, 1 + 1.5 + 4)
    apply_metadata(ba, 0, None, None, np.array([1, 1]))
    apply_results(ba, np.array([0]), np.array([0.0]), np.array([8.0]), np.array([1], np.int8), 0.5, 1.0, 1.0)
    assert (ba.alpha[0], ba.beta[0]) == (0.5 * 15 + 0.5 * 11, 0.5 * 35 + 0.5 * 31 + 8)


@pytest.mark.parametrize("reprofile", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_judge_matches_the_twin(seed, reprofile):
    ba = busy_beliefs(seed)
    rng = np.random.default_rng(seed)
    solved, unsolved, k = [(0.3, 0.3, 8), (0.05, 0.5, 4), (0.5, 0.05, 32), (0.9, 0.6, 1)][seed]
    f = make_filter(solved=solved, unsolved=unsolved, k=k, reprofile=reprofile)
    ids = rng.integers(0, N, 300)
    r = ba.shared.rules
    if reprofile:
        sh = ba.shared
        a, b, _ = naive.cold_beta(ba.n_obs, ba.alpha, ba.beta, ba.prior_p0, ba.pass_rate, ba.group,
                                  sh.group_successes, sh.group_trials, ids, r.alpha0, r.beta0,
                                  r.prior_strength, ba.pass_samples)  # fmt: skip
    else:
        a, b = naive.profile_beta(ba.pass_rate, ba.pass_samples, ids, r.alpha0, r.beta0, r.prior_strength)
    want = naive.filter_codes(a, b, f.k, f.solved, f.unsolved)
    got = judge(ba, ids, f)
    far = np.array(
        [
            not (
                _near(naive.all_of_group(x, y, f.k), f.solved)
                or _near(naive.all_of_group(y, x, f.k), f.unsolved)
            )
            for x, y in zip(a, b, strict=True)
        ]
    )
    assert far.sum() > 250 and len(set(got.tolist())) >= 2  # the judgments differ: the test can tell
    np.testing.assert_array_equal(got[far], want[far])


def test_without_reprofile_the_run_changes_no_judgment():
    ba = busy_beliefs(7)
    f = make_filter(reprofile=False)
    before = judge(ba, np.arange(N), f)
    ids = np.arange(N)
    apply_results(ba, ids, np.full(N, 8.0), np.full(N, 8.0), np.full(N, 3, np.int8), 1.0, 1.0, 1.0)
    assert np.array_equal(judge(ba, ids, f), before)
    assert not np.array_equal(judge(ba, ids, make_filter()), before)


# ---------------------------------------------------------------- draws


def _draw_twin(ba, f, count, kept, exclude, rng):
    """core/filter.draw literally: the stream's ids in order, the first `count` distinct ones of the wanted
    class outside `exclude`, within DRAWS_PER_PROMPT x count + DRAWS_MIN draws."""
    limit = DRAWS_PER_PROMPT * count + DRAWS_MIN
    taken, out = set(int(x) for x in exclude), []
    for p in rng.integers(ba.n, limit).tolist():
        if len(out) == count:
            break
        if p in taken or (judge(ba, np.array([p]), f)[0] == KEEP) != kept:
            continue
        taken.add(p)
        out.append(p)
    return out


@pytest.mark.parametrize(("count", "kept"), [(0, True), (1, False), (30, True), (30, False), (500, True)])
def test_draw_matches_its_twin(count, kept):
    ba = busy_beliefs(3)
    f = make_filter()
    exclude = np.arange(0, N, 3)
    rng = stream("d", 5, 1, "filter-fill")
    got = draw(ba, f, count, kept=kept, exclude=exclude, rng=rng)
    assert got.tolist() == _draw_twin(ba, f, count, kept, exclude, rng)
    assert not np.isin(got, exclude).any() and np.unique(got).size == got.size


# ---------------------------------------------------------------- selects


FILTERED = [name for name, spec in STRATEGIES.items() if spec.unfiltered is None]


def _select(ba, strategy, batch, filt, params=None, step=4, seed=2, full_scores=None):
    return select(ba, strategy=strategy, params=params, batch_size=batch, step=step, seed=seed, key="f",
                  dataset_k=8, filter=filt, full_scores=full_scores)  # fmt: skip


@pytest.mark.parametrize("strategy", FILTERED)
@pytest.mark.parametrize("recheck", [0.0, 0.25])
def test_a_filtered_batch_is_the_strategys_kept_prompts_then_the_rechecks(strategy, recheck):
    ba = busy_beliefs(11)
    settings_ = {"recheck": recheck}
    f = make_filter(**settings_)
    codes = judge(ba, np.arange(N), f)
    assert 50 < int((codes != KEEP).sum()) < N - 100  # some dropped, enough kept
    batch = 40
    ids, scores = _select(ba, strategy, batch, settings_)
    again, _ = _select(ba, strategy, batch, settings_)
    assert np.array_equal(ids, again)  # the same request gives the same batch
    assert np.unique(ids).size == ids.size == batch
    r = math.floor(recheck * batch)
    assert (codes[ids[: batch - r]] == KEEP).all() and (codes[ids[batch - r :]] != KEEP).all()
    if STRATEGIES[strategy].scored:
        assert scores is not None and scores.shape == (batch,)
        if STRATEGIES[strategy].deterministic:  # the scores returned are the prompts' own
            own = score(ba, strategy=strategy, params=None, ids=ids, step=4, seed=2, key="f", dataset_k=8)
            np.testing.assert_array_equal(scores, own)
    unfiltered, _ = _select(ba, strategy, batch, None)
    if not recheck and not STRATEGIES[strategy].scored:  # a walk: its own batch when it drops none of it
        assert np.array_equal(ids, unfiltered) == bool((codes[unfiltered] == KEEP).all())
    elif not recheck and (codes[unfiltered] != KEEP).any():
        assert not np.array_equal(ids, unfiltered)


@pytest.mark.parametrize("strategy", ["dps", "adarft", "insight"])
def test_a_ranking_of_the_whole_dataset_gives_its_best_kept_prompts(strategy):
    ba = busy_beliefs(5)
    params = {"candidate_ratio": None} if strategy == "insight" else None
    f = make_filter()
    kept = judge(ba, np.arange(N), f) == KEEP
    ids, scores = _select(ba, strategy, 30, {}, params=params)
    all_scores = score(ba, strategy=strategy, params=params, ids=None, step=4, seed=2, key="f", dataset_k=8)
    outside = np.setdiff1d(np.flatnonzero(kept), ids)
    assert scores.min() >= all_scores[outside].max()
    if strategy == "insight":  # the service's cached whole-dataset scores give the same batch
        same, _ = _select(ba, strategy, 30, {}, params=params, full_scores=all_scores)
        assert np.array_equal(same, ids)


@pytest.mark.parametrize("strategy", ["insight", "expected_difficulty", "learnability"])
def test_a_pool_is_filtered_before_it_is_ranked(strategy):
    """The pool is the one the unfiltered select draws; the batch is the best of what the filter keeps."""
    ba = busy_beliefs(6)
    f = make_filter()
    from selector_service.core.select import candidate_pool

    pool = candidate_pool(N, min(16 * 10, N), stream("f", 4, 2, "candidates"))
    kept = pool[judge(ba, pool, f) == KEEP]
    ids, scores = _select(ba, strategy, 10, {})
    assert np.isin(ids, kept).all()
    rest = np.setdiff1d(kept, ids)
    assert scores.min() >= score(ba, strategy=strategy, params=None, ids=rest, step=4, seed=2, key="f",
                                 dataset_k=8).max()  # fmt: skip


def test_too_few_kept_prompts_are_completed_with_dropped_ones():
    ba = BeliefArrays.new(50)
    apply_metadata(ba, 0, np.r_[np.zeros(45), np.full(5, 0.5)], None, np.full(50, 64), True)
    for strategy in FILTERED:
        ids, _ = _select(ba, strategy, 20, {})
        assert np.unique(ids).size == 20 and set(range(45, 50)) <= set(ids.tolist()), strategy


def test_greso_sec_and_filter_refuse_a_filter_object():
    ba = busy_beliefs(1)
    for strategy, words in (
        ("greso", "advances its walk"),
        ("sec", "advances its walk"),
        ("filter", "params"),
    ):
        with pytest.raises(ParamError, match=words):
            _select(ba, strategy, 5, {})
    with pytest.raises(ParamError, match="unknown filter setting"):
        _select(ba, "uniform", 5, {"bound": 0.5})
    with pytest.raises(ParamError, match=r"recheck .* \[0, 1\)"):
        _select(ba, "uniform", 5, {"recheck": 1.0})


def test_strategy_filter_is_uniform_over_the_kept_prompts_and_reprofiles_from_the_run():
    """Over an epoch of steps every kept prompt is handed out, no dropped one is; a prompt the run keeps
    solving is dropped with reprofile and stays in without."""
    n, batch = 200, 20
    ba = BeliefArrays.new(n)
    apply_metadata(
        ba, 0, np.r_[np.zeros(100), np.full(100, 0.5)], None, np.r_[np.full(100, 16), np.full(100, 2)]
    )
    seen = set()
    for step in range(10):
        ids, scores = _select(ba, "filter", batch, None, step=step)
        assert scores is None and (ids >= 100).all()
        seen |= set(ids.tolist())
    assert seen == set(range(100, 200))
    solved = np.arange(100, 110)
    for _ in range(4):
        apply_results(ba, solved, np.full(10, 8.0), np.full(10, 8.0), np.full(10, 3, np.int8), 1.0, 1.0, 1.0)
    again = set()
    static = set()
    for step in range(10, 30):
        again |= set(_select(ba, "filter", batch, None, step=step)[0].tolist())
        static |= set(_select(ba, "filter", batch, None, params={"reprofile": False}, step=step)[0].tolist())
    assert not again & set(solved.tolist()) and set(solved.tolist()) <= static


def test_rechecks_let_a_dropped_prompt_come_back():
    """A prompt dropped as unsolved is re-checked, comes out mixed, and with forgetting is kept again."""
    ba = BeliefArrays.new(100)
    apply_metadata(ba, 0, np.r_[np.zeros(10), np.full(90, 0.5)], None, np.full(100, 16), True)
    f = make_filter(recheck=0.1)
    assert (judge(ba, np.arange(10), f) != KEEP).all()
    ids, _ = _select(ba, "filter", 20, None, params={"recheck": 0.1})
    rechecked = ids[-2:]
    assert (rechecked < 10).all()
    for _ in range(2):
        apply_results(ba, rechecked, np.full(2, 4.0), np.full(2, 8.0), np.full(2, 2, np.int8), 0.3, 1.0, 1.0)
    assert (judge(ba, rechecked, f) == KEEP).all()
    assert (judge(ba, np.setdiff1d(np.arange(10), rechecked), f) != KEEP).all()
