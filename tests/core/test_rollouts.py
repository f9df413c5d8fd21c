"""Rollout allocation (core/rollouts.py, docs/methods.md §8) against its slow twins: the gains against their
definitions (mpmath), the counts against one-rollout-at-a-time greedy allocation (exactly, tie rule
included) and their value against a dynamic program over every feasible allocation (optimality)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from selector_service.core.domain import K_MAX
from selector_service.core.rng import stream
from selector_service.core.rollouts import (
    ROLLOUT_POLICIES,
    ROLLOUT_POLICY_HELP,
    TABLE_MAX,
    RolloutError,
    allocate_gains,
    allocate_rollouts,
    check_rollouts,
    gain_table,
    knapsack_value,
    mixed_probability,
    vip_objective,
)
from tests.core import naive

SCORED = [p for p in ROLLOUT_POLICIES if p != "uniform"]
CASES = [(p, "mixed") for p in ROLLOUT_POLICIES] + [("posterior", "knapsack")]
RNG = stream("rollouts-test", 3, 0, "rollouts")

# Beta parameters from the accepted domain's edges (core/domain.py) to the ordinary.
param = st.one_of(
    st.floats(1e-3, 50.0),
    st.sampled_from([1e-3, 0.5, 1.0, 2.0, 1e3, 1e6, 1e12, 1e300]),
)


def betas(rng, batch, low=0.2, high=30.0):
    return rng.uniform(low, high, batch), rng.uniform(low, high, batch)


def objective(gains, counts, lo):
    """Sum of the gains the counts take (VIP's infinite first gain as a large finite one)."""
    finite = np.where(np.isinf(gains), 1e12, gains)
    return float(sum(finite[i, : c - lo].sum() for i, c in enumerate(counts)))


# ---------------------------------------------------------------- the gains


@pytest.mark.parametrize(("policy", "value"), CASES)
@settings(max_examples=25, deadline=None)
@given(a=param, b=param, lo=st.integers(1, 6), levels=st.integers(1, 12))
def test_gains_match_their_definitions(policy, value, a, b, lo, levels):
    assume(math.isfinite(a + b))
    ours = gain_table(
        np.array([a]), np.array([b]), min_rollouts=lo, levels=levels, policy=policy, value=value
    )
    exact = naive.rollout_gains([a], [b], lo, levels, policy, value)
    # The definitions' gains never increase (docs/methods.md §8): the running minimum only absorbs rounding.
    finite = exact[0][np.isfinite(exact[0])]
    assert np.all(np.diff(finite) <= 1e-300 + 1e-12 * np.abs(finite[:-1]))
    np.testing.assert_allclose(ours, exact, rtol=1e-11, atol=1e-300)


@pytest.mark.parametrize("value", ["mixed", "knapsack"])
def test_posterior_gains_tend_to_the_point_estimate_with_evidence(value):
    """With a + b -> infinity the posterior value converges to its value at the mean."""
    lo, levels = 1, 40
    for p in (0.05, 0.3, 0.5, 0.9):
        a, b = np.array([p * 1e9]), np.array([(1 - p) * 1e9])
        ours = gain_table(a, b, min_rollouts=lo, levels=levels, policy="posterior", value=value)[0]
        n = np.arange(lo, lo + levels + 1)
        point = 1 - p**n - (1 - p) ** n
        if value == "knapsack":
            point = point * p * (1 - p) ** 2
        np.testing.assert_allclose(ours, np.diff(point), rtol=1e-6, atol=1e-15)


def test_mixed_probability_sums_the_gains_and_matches_the_beta_binomial():
    rng = np.random.default_rng(5)
    a, b = betas(rng, 30)
    n = rng.integers(1, 70, 30)
    ours = mixed_probability(a, b, n)
    exact = np.array(
        [float(naive.rollout_value(x, y, int(k), "posterior")) for x, y, k in zip(a, b, n, strict=True)]
    )
    np.testing.assert_allclose(ours, exact, rtol=1e-12, atol=1e-15)
    assert mixed_probability(a, b, np.ones(30, dtype=np.int64)).tolist() == [0.0] * 30
    point = knapsack_value(np.array([0.25]), np.array([4]))[0]
    assert point == pytest.approx((1 - 0.25**4 - 0.75**4) * 0.25 * 0.75**2)
    assert vip_objective(np.array([0.0, 0.5]), np.array([1, 3])).tolist()[0] == math.inf
    assert vip_objective(np.array([0.5]), np.array([3]))[0] == pytest.approx(
        0.25 / 2 + 7e-4 * 3 * math.log(0.5)
    )


# ---------------------------------------------------------------- the counts against the twins


@pytest.mark.parametrize(("policy", "value"), CASES)
@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 9),
    lo=st.integers(1, 4),
    width=st.integers(0, 8),
    seed=st.integers(0, 2**32),
)
def test_counts_equal_greedy_one_rollout_at_a_time_and_are_optimal(
    policy, value, data, batch, lo, width, seed
):
    hi = lo + width
    budget = data.draw(st.integers(batch * lo, batch * hi), label="budget")
    rng = np.random.default_rng(seed)
    a, b = betas(rng, batch)
    if data.draw(st.booleans(), label="ties"):  # repeated beliefs: equal gains across prompts
        a[: batch // 2 + 1], b[: batch // 2 + 1] = a[0], b[0]
    ids = rng.permutation(1000)[:batch]
    counts = allocate_rollouts(
        a, b, ids, budget=budget, min_rollouts=lo, max_rollouts=hi, policy=policy, rng=RNG, value=value
    )
    assert counts.sum() == budget and counts.min() >= lo and counts.max() <= hi and counts.dtype == np.int64
    gains = gain_table(a, b, min_rollouts=lo, levels=width, policy=policy, value=value)
    keys = RNG.bits_at(ids)
    assert counts.tolist() == naive.allocate_greedy(gains, budget, lo, keys, ids)
    exact = naive.rollout_gains(a, b, lo, width, policy, value) if batch * width <= 40 else gains
    best = naive.allocate_dp(np.where(np.isinf(exact), 1e12, exact), budget, lo)
    assert objective(exact, counts, lo) == pytest.approx(best, rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 12),
    width=st.integers(1, 6),
    levels=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_allocate_gains_breaks_ties_like_the_greedy_twin(batch, width, levels, seed, data):
    """Gains drawn from a few values, so that ties across prompts and within rows are the rule."""
    rng = np.random.default_rng(seed)
    gains = -np.sort(-rng.integers(0, levels, (batch, width)).astype(np.float64), axis=1)
    lo = data.draw(st.integers(1, 3), label="lo")
    budget = data.draw(st.integers(batch * lo, batch * (lo + width)), label="budget")
    ids = rng.integers(0, 5, batch)  # repeated ids too: the position decides last
    keys = rng.integers(0, 3, batch).astype(np.uint64)  # and repeated keys
    counts = allocate_gains(gains, budget=budget, min_rollouts=lo, tie_keys=keys, ids=ids)
    assert counts.tolist() == naive.allocate_greedy(gains, budget, lo, keys, ids)


def test_uniform_is_the_even_split_with_the_remainder_drawn():
    ids = np.arange(100, 110)
    counts = allocate_rollouts(
        np.ones(10), np.ones(10), ids, budget=57, min_rollouts=1, max_rollouts=64, policy="uniform", rng=RNG
    )
    assert sorted(counts.tolist()) == [5] * 3 + [6] * 7 and counts.sum() == 57
    # the same as the greedy engine with every gain equal (the tie order alone decides)
    same = allocate_gains(np.zeros((10, 63)), budget=57, min_rollouts=1, tie_keys=RNG.bits_at(ids), ids=ids)
    assert counts.tolist() == same.tolist()
    other = allocate_rollouts(
        np.ones(10),
        np.ones(10),
        ids,
        budget=57,
        min_rollouts=1,
        max_rollouts=64,
        policy="uniform",
        rng=stream("rollouts-test", 3, 1, "rollouts"),
    )
    assert other.tolist() != counts.tolist()  # another seed draws another remainder


@pytest.mark.parametrize(("policy", "value"), CASES)
def test_counts_follow_the_prompt_not_its_position(policy, value):
    """A prompt's count depends on its belief and id, not on where it sits in the batch."""
    rng = np.random.default_rng(11)
    a, b = betas(rng, 40)
    a[:20], b[:20] = 3.0, 5.0  # many equal beliefs: ties decided by the keys of the ids
    ids = rng.permutation(10_000)[:40]
    kw = dict(budget=700, min_rollouts=2, max_rollouts=48, policy=policy, rng=RNG, value=value)
    counts = allocate_rollouts(a, b, ids, **kw)
    order = rng.permutation(40)
    np.testing.assert_array_equal(allocate_rollouts(a[order], b[order], ids[order], **kw), counts[order])
    np.testing.assert_array_equal(allocate_rollouts(a, b, ids, **kw), counts)  # and again: the same


# ---------------------------------------------------------------- the edges of the domain


@pytest.mark.parametrize(("policy", "value"), CASES)
def test_edges_of_the_request(policy, value):
    rng = np.random.default_rng(2)
    a, b = betas(rng, 16)
    ids = np.arange(16)

    def run(budget, lo, hi, alpha=a, beta=b, which=ids):
        out = allocate_rollouts(
            alpha,
            beta,
            which,
            budget=budget,
            min_rollouts=lo,
            max_rollouts=hi,
            policy=policy,
            rng=RNG,
            value=value,
        )
        assert out.sum() == budget and out.min() >= lo and out.max() <= hi
        return out

    assert run(16 * 3, 3, 40).tolist() == [3] * 16  # budget = batch x min
    assert run(16 * 40, 3, 40).tolist() == [40] * 16  # budget = batch x max
    assert run(16 * 7, 7, 7).tolist() == [7] * 16  # min = max
    assert run(5, 1, 64, a[:1], b[:1], ids[:1]).tolist() == [5]  # one prompt
    run(16 * K_MAX - 3, 1, K_MAX)  # the K limit
    run(3000, 1, K_MAX)


@pytest.mark.parametrize(("policy", "value"), CASES)
@settings(max_examples=30, deadline=None)
@given(a=param, b=param, budget=st.integers(8, 8 * 96), seed=st.integers(0, 100))
def test_extreme_beliefs_give_valid_counts(policy, value, a, b, budget, seed):
    """Huge and tiny alpha, beta (p ~ 0 or 1, evidence up to 1e300) mixed with ordinary ones."""
    assume(math.isfinite(a + b))
    rng = np.random.default_rng(seed)
    alpha, beta = betas(rng, 8)
    alpha[::2], beta[::2] = a, b
    counts = allocate_rollouts(
        alpha,
        beta,
        np.arange(8),
        budget=budget,
        min_rollouts=1,
        max_rollouts=96,
        policy=policy,
        rng=RNG,
        value=value,
    )
    assert counts.sum() == budget and counts.min() >= 1 and counts.max() <= 96
    gains = gain_table(alpha, beta, min_rollouts=1, levels=95, policy=policy, value=value)
    assert not np.isnan(gains).any() and np.all(np.diff(gains, axis=1) <= 0)


def test_what_the_policies_do_with_easy_hard_and_unknown_prompts():
    """The allocations the methods describe, on a never-observed prompt (Beta(1, 1)), a well-known
    p = 0.5, a very hard, a very easy and a hard prompt: the posterior counts uncertainty (the unknown
    prompt gets more than the known one of the same mean) and is symmetric in p and 1 - p (a mixed group
    is as unlikely at p = 0.01 as at 0.99); Knapsack RL's p q^2 leaves the easy prompt at the minimum;
    VIP's ln p term feeds the hardest."""
    a = np.array([1.0, 50.0, 1.0, 99.0, 2.0])
    b = np.array([1.0, 50.0, 99.0, 1.0, 18.0])
    ids = np.arange(5)
    kw = dict(budget=100, min_rollouts=2, max_rollouts=64, rng=RNG)
    post = allocate_rollouts(a, b, ids, policy="posterior", **kw)
    assert post[0] > post[1] and post[2] == post[3] > post[1] and post[4] > post[1]
    knap = allocate_rollouts(a, b, ids, policy="knapsack", **kw)
    assert knap[0] == knap[1]  # the point estimate cannot tell the unknown and the known prompt apart
    assert knap[3] == 2 and knap[2] > knap[3]
    post_knap = allocate_rollouts(a, b, ids, policy="posterior", value="knapsack", **kw)
    assert post_knap[0] > post_knap[1] and post_knap[3] == 2
    var = allocate_rollouts(a, b, ids, policy="variance", **kw)
    assert var.argmax() == 2 and var[3] == var.min()
    assert allocate_rollouts(a, b, ids, policy="uniform", **kw).tolist() == [20] * 5


# ---------------------------------------------------------------- the request check


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((4, 3, 1, 8, "posterior"), "below batch_size x min = 4 x 1 = 4: raise the budget to at least 4"),
        ((4, 40, 1, 8, "posterior"), "above batch_size x max = 4 x 8 = 32: lower the budget to at most 32"),
        ((4, 8, 0, 8, "posterior"), "at least 1 rollout"),
        ((4, 8, 3, 2, "posterior"), "rollouts.min (3) is above rollouts.max (2)"),
        ((4, 8, 1, K_MAX + 1, "posterior"), f"at most the K limit {K_MAX}"),
        ((4, 8, 1, 8, "best"), "unknown rollout policy 'best'; choose one of posterior, knapsack"),
        ((4, 8.0, 1, 8, "posterior"), "rollouts.budget must be an integer"),
        ((5000, 5000 * 900, 1, 1000, "posterior"), f"over the {TABLE_MAX} one allocation holds"),
    ],
)
def test_check_request_names_the_fix(args, message):
    with pytest.raises(RolloutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_rollouts(*args)


def test_every_policy_of_the_contract_is_described_in_its_order():
    assert tuple(ROLLOUT_POLICY_HELP) == ROLLOUT_POLICIES


def test_check_request_fills_the_k_limit_and_lets_uniform_skip_the_table():
    r = check_rollouts(8, 20)
    assert (r.budget, r.min_rollouts, r.max_rollouts, r.policy) == (20, 1, K_MAX, "posterior")
    assert r.levels(8) == 12  # min(max - min, budget - batch x min)
    assert check_rollouts(5000, 5000 * 900, 1, 1000, "uniform").policy == "uniform"
