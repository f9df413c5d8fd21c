"""The counter-based generator (core/rng.py): bit-for-bit agreement with the pure-Python twin
(tests/core/naive.py), exact uniformity of bounded ints, subsets and permutations, and the Beta sampler's
distribution against scipy at fixed seeds."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from selector_service.core import Stream, stream, topk_random_ties
from selector_service.core.rng import stream_id
from tests.core import naive

U64 = st.integers(0, 2**64 - 1)

# ---------------------------------------------------------------- stream ids


def test_stream_id_matches_twin_and_every_argument_matters():
    base = stream_id("ds", 7, 0, "ties")
    assert base == naive.rng_stream_id("ds", 7, 0, "ties")
    for other in (("dt", 7, 0, "ties"), ("ds", 8, 0, "ties"), ("ds", 7, 1, "ties"), ("ds", 7, 0, "pool")):
        assert stream_id(*other) != base, other
        assert stream_id(*other) == naive.rng_stream_id(*other)


def test_stream_id_encoding_is_unambiguous():
    assert stream_id("ab", 0, 0, "c") != stream_id("a", 0, 0, "bc")
    assert stream_id("k", 2**32, 0, "p") != stream_id("k", 0, 1, "p")
    assert stream_id("k", 0, -1, "p") == stream_id("k", 0, 2**64 - 1, "p")  # seeds are taken mod 2^64


def test_streams_are_stable_across_processes():
    """blake2b, not Python's salted hash: another interpreter with another hash seed draws the same."""
    code = (
        "from selector_service.core import stream; s = stream('ds-é', 12, 34, 'ties');"
        "print(s.id, s.bits(3).tolist(), s.sample(10**6, 3).tolist())"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=300
    )
    s = stream("ds-é", 12, 34, "ties")
    assert out.stdout.strip() == f"{s.id} {s.bits(3).tolist()} {s.sample(10**6, 3).tolist()}"


@pytest.mark.parametrize(("step", "seed"), [(-1, 0), (1.5, 0), (0, 1.5), (True, 0), (2**64, 0)])
def test_bad_step_or_seed_is_rejected(step, seed):
    with pytest.raises(ValueError):
        stream("k", step, seed, "p")


# ---------------------------------------------------------------- bits, uniforms, bounded ints


@settings(max_examples=200, deadline=None, database=None)
@given(s=U64, start=st.integers(0, 2**62), j=U64)
def test_bits_uniforms_and_children_match_twin(s, start, j):
    r = Stream(s)
    assert r.bits(4, start).tolist() == [naive.rng_bits(s, i) for i in range(start, start + 4)]
    assert r.uniforms(4, start).tolist() == [naive.rng_uniform(s, i) for i in range(start, start + 4)]
    assert r.child(j).id == naive.rng_child(s, j)
    idx = np.array([start + 9, start, 2**63 + 5], dtype=np.uint64)
    assert r.uniforms_at(idx).tolist() == [naive.rng_uniform(s, int(i)) for i in idx]


@pytest.mark.parametrize("bound", [1, 2, 3, 7, 1000, 2**32 + 1, 3 * 2**61 + 1, 2**62 + 1, 2**63 - 1])
def test_bounded_ints_match_twin_including_rejections(bound):
    """Bounds near 2^63 reject up to half of the 64-bit words: the redraw path is exercised."""
    for s in (0, 1, 2**64 - 1, stream_id("k", 3, 4, "ints")):
        ours = Stream(s).integers(bound, 300, start=17)
        assert ours.tolist() == [naive.rng_bounded(s, i, bound) for i in range(17, 317)]
        assert ours.min() >= 0 and ours.max() < bound


def test_bounded_ints_are_uniform():
    draws = stream("k", 0, 0, "ints").integers(7, 70_000)
    counts = np.bincount(draws, minlength=7)
    assert stats.chisquare(counts).pvalue > 1e-4


# ---------------------------------------------------------------- subsets and permutations


@pytest.mark.parametrize(
    ("n", "k"), [(1, 1), (5, 0), (10, 1), (10, 2), (10, 3), (10, 10), (100, 24), (100, 25), (10**9, 7)]
)
def test_sample_matches_twin_in_both_regimes(n, k):
    for seed in range(3):
        s = stream("k", 1, seed, "sample")
        ours = s.sample(n, k)
        assert ours.dtype == np.int64 and ours.size == k and np.unique(ours).size == k
        assert ours.tolist() == naive.rng_sample(s.id, n, k)


@pytest.mark.parametrize(("n", "k"), [(12, 2), (6, 4)])  # Floyd (4k < n) and partial Fisher-Yates
def test_every_ordered_subset_is_equally_likely(n, k):
    counts: dict[tuple, int] = {}
    draws = 30 * math.perm(n, k)
    for seed in range(draws):
        key = tuple(stream("k", 0, seed, "sample").sample(n, k).tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == math.perm(n, k)
    assert stats.chisquare(list(counts.values())).pvalue > 1e-4


def test_sample_refuses_more_than_n():
    with pytest.raises(ValueError, match="distinct"):
        stream("k", 0, 0, "p").sample(3, 4)


def test_permutation_matches_twin_and_is_uniform():
    for n in (1, 2, 17, 1000):
        s = stream("k", 2, n, "perm")
        perm = s.permutation(n)
        assert perm.dtype == np.int32
        assert perm.tolist() == naive.rng_permutation(s.id, n)
    counts: dict[tuple, int] = {}
    for seed in range(24 * 200):
        key = tuple(stream("k", 0, seed, "perm").permutation(4).tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 24 and stats.chisquare(list(counts.values())).pvalue > 1e-4


# ---------------------------------------------------------------- Beta draws

EDGE_PARAMS = [1e-3, 2e-3, 0.05, 0.5, 0.999, 1.0, 1.001, 2.0, 37.5, 1e6, 1e9, 1e12, 1e300]


def test_beta_draws_match_twin_bit_for_bit():
    s = stream("ds", 4, 9, "thompson")
    pairs = list(itertools.product(EDGE_PARAMS, EDGE_PARAMS))
    a = np.array([p[0] for p in pairs])
    b = np.array([p[1] for p in pairs])
    items = np.arange(len(pairs)) * 7919
    ours = s.beta(a, b, items)
    twin = [naive.rng_beta(s.id, x, y, int(i)) for x, y, i in zip(a, b, items, strict=True)]
    assert ours.tolist() == twin
    assert np.all((ours >= 0) & (ours <= 1)) and not np.isnan(ours).any()


@settings(max_examples=200, deadline=None, database=None)
@given(
    log_a=st.floats(math.log(1e-3), math.log(1e300)),
    log_b=st.floats(math.log(1e-3), math.log(1e300)),
    item=st.integers(0, 2**63),
    s=U64,
)
def test_beta_draws_match_twin_on_random_parameters(log_a, log_b, item, s):
    a, b = math.exp(log_a), math.exp(log_b)
    ours = Stream(s).beta(np.array([a]), np.array([b]), np.array([item], dtype=np.uint64))[0]
    assert ours == naive.rng_beta(s, a, b, item)
    assert 0.0 <= ours <= 1.0


@pytest.mark.parametrize(
    ("a", "b"),
    [(1.0, 1.0), (0.5, 0.5), (3.0, 7.0), (0.01, 2.0), (50.0, 50.0), (0.3, 40.0), (2e4, 6e4), (1e6, 2.5)],
)
def test_beta_draws_follow_scipy_beta(a, b):
    """Kolmogorov-Smirnov against scipy's Beta CDF, 20000 draws at a fixed stream."""
    n = 20_000
    draws = stream("ks", 0, 0, f"beta-{a}-{b}").beta(np.full(n, a), np.full(n, b), np.arange(n))
    assert stats.kstest(draws, stats.beta(a, b).cdf).pvalue > 1e-3


def test_tiny_shapes_put_the_right_mass_at_tiny_values():
    """Beta(1e-3, 1) has half its mass below 1e-300 (CDF x^0.001): draws there underflow to 0 or a
    subnormal, which a KS test cannot see, so count draws per decade band against the exact CDF."""
    n, a = 20_000, 1e-3
    draws = stream("ks", 0, 0, "tiny").beta(np.full(n, a), np.ones(n), np.arange(n))
    edges = [0.0, 1e-300, 1e-100, 1e-10, 1e-2, 1.0]
    observed = np.histogram(draws, bins=edges)[0]
    expected = n * np.diff([x**a for x in edges])
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_huge_parameters_give_the_normal_limit():
    """Beta(a, b) with a, b ~ 1e12: mean a/n, sd sqrt(m(1-m)/n); the log-space sampler keeps the digits."""
    n = 20_000
    a, b = 3e12, 1e12
    draws = stream("ks", 0, 0, "huge").beta(np.full(n, a), np.full(n, b), np.arange(n))
    m, sd = a / (a + b), math.sqrt(0.75 * 0.25 / (a + b))
    z = (draws - m) / sd
    assert stats.kstest(z, "norm").pvalue > 1e-3


def test_a_draw_depends_on_its_item_only():
    s = stream("k", 0, 0, "thompson")
    a, b = np.full(50, 2.0), np.full(50, 5.0)
    full = s.beta(a, b, np.arange(50))
    part = s.beta(a[:5], b[:5], np.array([40, 3, 17, 3, 0]))
    np.testing.assert_array_equal(part, full[[40, 3, 17, 3, 0]])


def test_beta_refuses_bad_parameters():
    s = stream("k", 0, 0, "t")
    with pytest.raises(ValueError, match="finite sum"):
        s.beta(np.array([1e308]), np.array([1e308]), np.array([0]))
    with pytest.raises(ValueError, match="> 0"):
        s.beta(np.array([0.0]), np.array([1.0]), np.array([0]))


# ---------------------------------------------------------------- the tie rule


@settings(max_examples=300, deadline=None, database=None)
@given(values=st.lists(st.integers(-2, 2), min_size=1, max_size=60), data=st.data())
def test_topk_random_ties_equals_its_literal_twin(values, data):
    scores = np.array(values, dtype=np.float64) / 3.0
    k = data.draw(st.integers(0, scores.size))
    s = stream("k", 0, data.draw(st.integers(0, 50)), "ties")
    assert topk_random_ties(scores, k, s).tolist() == naive.topk_random_ties(scores, k, s.id)
