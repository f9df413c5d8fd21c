"""The numba digamma against scipy.special.digamma (core/special.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import digamma as scipy_digamma

from selector_service.core.special import digamma, digamma_array, log_binomial_table, psi_minus_log

ROOT = 1.4616321449683623  # the positive zero of psi


def test_matches_scipy_to_full_precision_on_a_log_grid():
    x = np.geomspace(1e-6, 1e12, 20_001)
    ours = digamma_array(x)
    ref = scipy_digamma(x)
    # ~1e-15 relative where |psi| >= 0.5. Below 10 the value is ln(y) + tail - sum 1/(x+i) with terms
    # of size ~2.3 (x near the root 1.46 makes psi -> 0), so there the error is absolute: a few ulp of 2.3.
    small = np.abs(ref) < 0.5
    rel = np.abs(ours - ref) / np.abs(ref)
    assert rel[~small].max() < 4e-15
    assert np.abs(ours - ref)[small].max() < 4e-15


def test_near_the_root_and_at_integers():
    assert abs(digamma(ROOT)) < 1e-15
    # psi(n) = -gamma + sum_{j<n} 1/j, exactly known values
    euler_gamma = 0.5772156649015329
    for n in (1, 2, 5, 10, 11, 50):
        expected = -euler_gamma + sum(1.0 / j for j in range(1, n))
        assert digamma(float(n)) == pytest.approx(expected, rel=2e-15, abs=1e-16)


@pytest.mark.parametrize("x", [0.0, -1.0, -0.5, float("nan")])
def test_outside_the_domain_is_nan(x):
    assert math.isnan(digamma(x))


def test_psi_minus_log_equals_the_difference_and_is_accurate_for_large_x():
    x = np.geomspace(1e-3, 1e9, 2001)
    ours = np.array([psi_minus_log(v) for v in x])
    ref = scipy_digamma(x) - np.log(x)
    # The reference itself cancels two ~ln(x) terms, ours sums terms of size ~2.3 below x = 10: allow a
    # few ulp of the larger of those magnitudes.
    magnitude = np.maximum(np.abs(scipy_digamma(x)) + np.abs(np.log(x)), 2.5)
    assert np.all(np.abs(ours - ref) <= 4 * np.finfo(float).eps * magnitude)
    # Large x: psi(x) - ln x = -1/(2x) - 1/(12x^2) + O(x^-4), known to full relative precision.
    big = np.geomspace(1e4, 1e12, 50)
    series = -1 / (2 * big) - 1 / (12 * big**2) + 1 / (120 * big**4)
    assert np.allclose([psi_minus_log(v) for v in big], series, rtol=1e-14, atol=0)


def test_log_binomial_table():
    for k in (1, 8, 64, 1024):
        table = log_binomial_table(k)
        assert table.shape == (k + 1,)
        assert table[0] == 0.0 and table[k] == 0.0
        s = k // 3
        assert table[s] == pytest.approx(
            math.lgamma(k + 1) - math.lgamma(s + 1) - math.lgamma(k - s + 1), rel=1e-13
        )
