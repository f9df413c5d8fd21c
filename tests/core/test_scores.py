"""Baseline, MoPPS and DPS scores (core/scores.py, docs/methods.md §1.2, 1.3, 2)."""

from __future__ import annotations

import numpy as np
import pytest

from selector_service.core import (
    dps_scores,
    expected_difficulty_scores,
    inverse_evidence_scores,
    stream,
    thompson_scores,
)
from selector_service.core._parallel import PARALLEL_MIN
from tests.core import naive


@pytest.fixture
def posterior():
    rng = np.random.default_rng(4)
    n = 1000
    return np.exp(rng.uniform(-6, 13, n)), np.exp(rng.uniform(-6, 13, n)), rng.integers(0, n, 300)


def test_expected_difficulty_and_inverse_evidence_match_twins(posterior):
    alpha, beta, ids = posterior
    np.testing.assert_allclose(
        expected_difficulty_scores(alpha, beta, ids, 0.3),
        naive.expected_difficulty(alpha, beta, ids, 0.3),
        rtol=1e-15,
    )
    np.testing.assert_allclose(
        inverse_evidence_scores(alpha, beta, ids), naive.inverse_evidence(alpha, beta, ids), rtol=1e-15
    )
    every = np.arange(alpha.size)
    np.testing.assert_array_equal(
        expected_difficulty_scores(alpha, beta, None), expected_difficulty_scores(alpha, beta, every)
    )
    np.testing.assert_array_equal(
        inverse_evidence_scores(alpha, beta, None), inverse_evidence_scores(alpha, beta, every)
    )


def test_thompson_is_seeded_and_scores_its_draws(posterior):
    alpha, beta, ids = posterior
    s1, d1 = thompson_scores(alpha, beta, ids, 0.5, stream("ds", 3, 0, "thompson"))
    s2, d2 = thompson_scores(alpha, beta, ids, 0.5, stream("ds", 3, 0, "thompson"))
    _, d3 = thompson_scores(alpha, beta, ids, 0.5, stream("ds", 3, 1, "thompson"))
    np.testing.assert_array_equal(d1, d2)
    np.testing.assert_array_equal(s1, s2)
    assert not np.array_equal(d1, d3)
    np.testing.assert_array_equal(s1, -((d1 - 0.5) ** 2))
    assert np.all((d1 >= 0) & (d1 <= 1))


def test_thompson_draws_follow_the_posterior():
    """Many draws from one Beta(3, 7): sample mean 0.3 within 5 standard errors."""
    n = 20_000
    _, draws = thompson_scores(np.full(n, 3.0), np.full(n, 7.0), None, 0.5, stream("x", 0, 0, "t"))
    se = np.sqrt(3 * 7 / (10**2 * 11) / n)
    assert abs(draws.mean() - 0.3) < 5 * se


@pytest.mark.parametrize("weight", [0.0, 0.5, -1.0])
def test_dps_scores_match_twin(weight):
    rng = np.random.default_rng(8)
    prior = rng.dirichlet([1, 1, 1], 500).astype(np.float32)
    prior[:10] = np.float32(1 / 3)
    prior[10] = [0.0, 1.0, 0.0]  # 0 ln 0 = 0
    ids = rng.integers(0, 500, 200)
    ids[:2] = [10, 0]
    np.testing.assert_allclose(
        dps_scores(prior, ids, weight), naive.dps_scores(prior, ids, weight), rtol=1e-14, atol=1e-15
    )
    assert dps_scores(prior, np.array([10]), weight)[0] == 1.0


def test_dps_scores_parallel_path_equals_serial():
    rng = np.random.default_rng(1)
    n = PARALLEL_MIN + 999
    prior = rng.dirichlet([1, 2, 1], n).astype(np.float32)
    full = dps_scores(prior, None, 0.2)
    np.testing.assert_array_equal(full[:1000], dps_scores(prior[:1000], None, 0.2))
    np.testing.assert_array_equal(full[-1000:], dps_scores(prior, np.arange(n - 1000, n), 0.2))


def test_bad_arguments_are_rejected(posterior):
    alpha, beta, _ = posterior
    with pytest.raises(ValueError, match="target"):
        expected_difficulty_scores(alpha, beta, None, 1.5)
    with pytest.raises(ValueError, match="entropy_weight"):
        dps_scores(np.ones((3, 3), np.float32), None, float("inf"))
    with pytest.raises(ValueError, match="shape"):
        dps_scores(np.ones((3, 2), np.float32), None, 0.0)
    with pytest.raises(ValueError, match=r"\[0, 1000\)"):
        inverse_evidence_scores(alpha, beta, np.array([1000]))
