"""INSIGHT's I_K, w(m) and A = w * I_K (core/mi.py) against the scipy twin, mpmath and docs/methods.md §1.1.

Tolerances. The twin (tests/core/naive.py) evaluates the docs/methods.md formula literally: terms like (a-1) psi(a)
reach ~1.4e7 at a = 1e6 while I_K is ~K / (2n) ~ 4e-6 at n = 2e6, so the twin's own error scales with
eps * (largest term) (naive.mutual_information_rounding_scale, "scale"), and scipy's betaln adds
~1e-11 relative error for very unequal arguments (betaln(1e4, 1e-3)): measured against mpmath on GRID,
the twin is off by up to ~480 eps * scale, hence TWIN_ULPS = 1024. That makes the twin useless where
I_K comes from cancelling O(1) terms (huge a and b), so those points are checked against 40-digit
mpmath instead. The fast kernel regroups the formula so its terms are O(K) (O(K / min(a, b)) for tiny a
or b): its error is below FAST_ULPS * eps * K * (1 + 1 / min(a, b)) (measured worst: 14 of the 64).
Where scipy is accurate (a, b in [0.5, 300]) they agree to 32 eps * scale.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selector_service.core import K_MAX, mutual_information, wmi_scores, wmi_weight
from selector_service.core._parallel import PARALLEL_MIN
from tests.core import naive

EPS = np.finfo(np.float64).eps
FAST_ULPS = 64
TWIN_ULPS = 1024
GRID = [1e-3, 3e-2, 0.5, 1.0, 2.5, 17.0, 300.0, 1e4, 2e5, 1e6]
KS = [1, 2, 3, 8, 13, 32, 64]


def fast_bound(a, b, k):
    return FAST_ULPS * EPS * k * (1.0 + 1.0 / np.minimum(a, b))


def assert_close_to_twin(a, b, k):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    ours = mutual_information(a, b, k)
    ref = naive.mutual_information(a, b, k)
    tol = TWIN_ULPS * EPS * naive.mutual_information_rounding_scale(a, b, k) + fast_bound(a, b, k)
    bad = np.abs(ours - ref) > tol
    assert not bad.any(), list(zip(a[bad], b[bad], ours[bad], ref[bad], tol[bad], strict=True))[:5]


def mp_mutual_information(a: float, b: float, k: int, digits: int = 40) -> float:
    """I_K by the docs/methods.md formula in `digits`-digit arithmetic (mpmath)."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(digits):
        a, b = mp.mpf(a), mp.mpf(b)

        def entropy(x, y):
            return (
                mp.log(mp.beta(x, y))
                - (x - 1) * mp.digamma(x)
                - (y - 1) * mp.digamma(y)
                + (x + y - 2) * mp.digamma(x + y)
            )

        total = entropy(a, b)
        log_b = mp.log(mp.beta(a, b))
        for s in range(k + 1):
            p = mp.binomial(k, s) * mp.exp(mp.log(mp.beta(a + s, b + k - s)) - log_b)
            total -= p * entropy(a + s, b + k - s)
        return float(total)


# ---------------------------------------------------------------- docs/methods.md sanity values


def test_methods_sanity_values():
    one = np.array([1.0])
    i_11 = mutual_information(one, one, 8)[0]
    assert round(i_11, 3) == 0.766
    assert round(wmi_weight(0.5, 3.0, 0.3), 3) == 0.222
    assert round(wmi_scores(one, one, None, 8, 3.0, 0.3)[0], 3) == 0.170
    assert round(mutual_information(np.array([50.0]), np.array([50.0]), 8)[0], 3) == 0.038


def test_weight_peaks_near_0_416():
    m = np.linspace(0, 1, 100_001)
    w = wmi_weight(m, 3.0, 0.3)
    assert abs(m[np.argmax(w)] - 0.416) < 1e-3
    assert wmi_weight(0.0, 3.0, 0.3) == 0.0 and wmi_weight(1.0, 3.0, 0.3) == 0.0


# ---------------------------------------------------------------- against the twin and mpmath


@pytest.mark.parametrize("k", KS)
def test_grid_of_extremes_matches_twin(k):
    a, b = np.array(list(itertools.product(GRID, GRID))).T
    assert_close_to_twin(a, b, k)


@pytest.mark.parametrize("k", KS)
def test_well_conditioned_grid_matches_twin_tightly(k):
    """Where scipy's betaln is accurate (a, b in [0.5, 300]) the twin is within a few eps * scale."""
    a, b = np.array(list(itertools.product(np.geomspace(0.5, 300, 12), repeat=2))).T
    diff = np.abs(mutual_information(a, b, k) - naive.mutual_information(a, b, k))
    assert np.all(diff <= 32 * EPS * naive.mutual_information_rounding_scale(a, b, k))


@pytest.mark.parametrize(
    ("a", "b", "k"),
    [
        (1.0, 1.0, 8),
        (50.0, 50.0, 8),
        (1e-3, 1e-3, 8),
        (1e-3, 1e-3, 64),
        (1e6, 1e6, 8),  # I ~ 2e-6 from O(1) terms: the regime where the twin loses 4 digits
        (1e6, 1e6, 64),
        (1e-3, 1e6, 8),
        (1e6, 1e-3, 1),
        (0.7, 1e6, 64),
        (3.5, 0.2, 64),
        (2.0, 3.0, 1),
    ],
)
def test_kernel_is_accurate_against_mpmath(a, b, k):
    exact = mp_mutual_information(a, b, k)
    ours = mutual_information(np.array([a]), np.array([b]), k)[0]
    assert abs(ours - exact) <= fast_bound(a, b, k)


@pytest.mark.slow
@pytest.mark.parametrize(("a", "b"), [(1e6, 1e6), (3.0, 2.0)])
def test_k_1024_against_mpmath(a, b):
    """K up to K_MAX: the scaled recurrence neither underflows (P(K) ~ 2^-1024 at a = b = 1e6) nor loses
    accuracy."""
    exact = mp_mutual_information(a, b, K_MAX, digits=30)
    ours = mutual_information(np.array([a]), np.array([b]), K_MAX)[0]
    assert abs(ours - exact) <= fast_bound(a, b, K_MAX)


log_param = st.floats(min_value=math.log(1e-3), max_value=math.log(1e6))


@settings(max_examples=300, deadline=None, database=None)
@given(log_a=log_param, log_b=log_param, k=st.integers(min_value=1, max_value=64))
def test_random_parameters_match_twin(log_a, log_b, k):
    assert_close_to_twin([math.exp(log_a)], [math.exp(log_b)], k)


def test_random_fractional_posteriors_match_twin():
    """Posteriors as the service makes them: decayed (lam < 1) with fractional counts."""
    rng = np.random.default_rng(7)
    a = 1.0 + rng.gamma(0.5, 20.0, 5000)
    b = 1.0 + rng.gamma(0.5, 20.0, 5000)
    for k in (4, 8, 16):
        assert_close_to_twin(a, b, k)


# ---------------------------------------------------------------- properties


@settings(max_examples=200, deadline=None, database=None)
@given(log_a=log_param, log_b=log_param, k=st.integers(min_value=1, max_value=63))
def test_information_is_bounded_and_grows_with_k(log_a, log_b, k):
    """0 <= I_K <= H(S) <= ln(K+1), and I_K <= I_{K+1} (the first K rollouts are a function of K+1)."""
    a, b = np.array([math.exp(log_a)]), np.array([math.exp(log_b)])
    i_k = mutual_information(a, b, k)[0]
    i_next = mutual_information(a, b, k + 1)[0]
    slack = fast_bound(a[0], b[0], k + 1)
    assert -slack <= i_k <= math.log(k + 1) + slack
    assert i_k <= i_next + slack


@pytest.mark.parametrize("k", [1, 8, 64])
@pytest.mark.parametrize("m", [0.02, 0.5, 0.9])
def test_large_n_limit(k, m):
    """I_K -> 0.5 ln(1 + K/n); the relative gap is (1-2m)^2 / (6 m (1-m) n) + O(n^-2) (fitted from the
    kernel, consistent across K), so allow twice that plus the kernel's ~n * 1e-15 relative rounding."""
    for n in (1e3, 1e4, 1e5, 1e6, 2e6):
        ours = mutual_information(np.array([m * n]), np.array([(1 - m) * n]), k)[0]
        limit = naive.large_n_limit(n, k)
        gap = 2 * (1 - 2 * m) ** 2 / (6 * m * (1 - m) * n) + 4 * k / n**2 + 1e-14 * n
        assert abs(ours / limit - 1) <= gap, (n, ours, limit)


def test_symmetry():
    """I_K(a, b) = I_K(b, a): the number of failures carries the same information."""
    rng = np.random.default_rng(3)
    a = np.exp(rng.uniform(-6, 13, 2000))
    b = np.exp(rng.uniform(-6, 13, 2000))
    for k in (1, 8, 33):
        x, y = mutual_information(a, b, k), mutual_information(b, a, k)
        assert np.all(np.abs(x - y) <= fast_bound(a, b, k))


# ---------------------------------------------------------------- the score wrapper


def test_wmi_scores_match_twin_and_follow_ids():
    rng = np.random.default_rng(11)
    n = 3000
    alpha = 1.0 + rng.gamma(0.7, 10.0, n)
    beta = 1.0 + rng.gamma(0.7, 10.0, n)
    ids = rng.integers(0, n, 500)  # any order, repeats allowed
    ours = wmi_scores(alpha, beta, ids, 8, 2.0, 0.4)
    a, b = alpha[ids], beta[ids]
    assert_close_to_twin(a, b, 8)  # the I_K factor
    # the weight factor: w(m) from the formula (1 - m is computed as b / n inside the kernel)
    expected = naive.wmi_weight(a / (a + b), 2.0, 0.4) * mutual_information(a, b, 8)
    np.testing.assert_allclose(ours, expected, rtol=1e-13, atol=0)
    full = wmi_scores(alpha, beta, None, 8, 2.0, 0.4)
    np.testing.assert_array_equal(full[ids], ours)


def test_parallel_kernel_equals_serial_bitwise():
    """The same bits whichever path (and thread count) computes a prompt's score."""
    rng = np.random.default_rng(5)
    n = 2 * PARALLEL_MIN + 123
    alpha = np.exp(rng.uniform(-6, 13, n))
    beta = np.exp(rng.uniform(-6, 13, n))
    full = wmi_scores(alpha, beta, None, 8, 3.0, 0.3)  # parallel path
    pieces = [
        wmi_scores(alpha[i : i + 10_000], beta[i : i + 10_000], None, 8, 3.0, 0.3)
        for i in range(0, n, 10_000)
    ]
    np.testing.assert_array_equal(full, np.concatenate(pieces))
    ids = rng.integers(0, n, PARALLEL_MIN + 7)
    np.testing.assert_array_equal(wmi_scores(alpha, beta, ids, 8, 3.0, 0.3), full[ids])


@pytest.mark.parametrize(
    ("alpha", "beta", "k", "message"),
    [
        ([1.0], [1.0], 0, "k"),
        ([1.0], [1.0], K_MAX + 1, "k"),
        ([1.0], [1.0], 2.0, "k"),
        ([0.0], [1.0], 8, "> 0"),
        ([float("nan")], [1.0], 8, "finite"),
        ([1.0, 2.0], [1.0], 8, "one length"),
    ],
)
def test_bad_inputs_are_rejected(alpha, beta, k, message):
    with pytest.raises(ValueError, match=message):
        mutual_information(np.array(alpha), np.array(beta), k)


def test_bad_ids_and_weights_are_rejected():
    a = np.ones(4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        wmi_scores(a, a, np.array([0, 4]), 8, 3.0, 0.3)
    with pytest.raises(ValueError, match="eta"):
        wmi_scores(a, a, None, 8, -1.0, 0.3)
    with pytest.raises(ValueError, match="mu"):
        wmi_scores(a, a, None, 8, 3.0, 1.5)
