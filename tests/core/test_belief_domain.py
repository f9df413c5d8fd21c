"""The domain checks' numba kernels (selector_service/core/belief_domain.py) against plain numpy twins,
over random arrays with bad values planted at random places, block edges included."""

from __future__ import annotations

import numpy as np
import pytest

from selector_service.core import belief_domain as bd


def first_outside_twin(values: np.ndarray, lo: float, hi: float, allow_nan: bool) -> int:
    v = values.astype(np.float64)
    ok = (v >= lo) & (v <= hi)
    if allow_nan:
        ok |= np.isnan(v)
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else -1


def first_bad_row_twin(rows: np.ndarray, tolerance: float) -> int:
    r = rows.astype(np.float64)
    inside = ((r >= 0) & (r <= 1)).all(axis=1)
    ok = inside & (np.abs(r.sum(axis=1) - 1.0) <= tolerance)
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else -1


def first_unpaired_twin(n_obs, last_state, streak, slot) -> int:
    seen = n_obs > 0
    bad = ((last_state != 0) != seen) | ((slot >= 0) != seen) | (~seen & (streak != 0))
    idx = np.flatnonzero(bad)
    return int(idx[0]) if idx.size else -1


SIZES = [0, 1, 7, bd._BLOCK - 1, bd._BLOCK, bd._BLOCK + 1, 3 * bd._BLOCK + 5]
PLANTED = [np.nan, np.inf, -np.inf, -1e-300, 1.0000001, -0.0, 0.0, 1.0]


@pytest.mark.parametrize("seed", range(40))
def test_first_outside_matches_its_twin(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.choice(SIZES))
    dtype = rng.choice([np.float32, np.float64])
    values = rng.random(n).astype(dtype)
    for _ in range(int(rng.integers(0, 4))):
        if n:
            values[rng.integers(0, n)] = rng.choice(PLANTED)
    for allow_nan in (False, True):
        assert bd._first_outside(values, 0.0, 1.0, allow_nan) == first_outside_twin(
            values, 0.0, 1.0, allow_nan
        )


@pytest.mark.parametrize("seed", range(40))
def test_first_bad_row_matches_its_twin(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.choice(SIZES))
    rows = rng.dirichlet(np.ones(3), size=m).astype(np.float32)
    for _ in range(int(rng.integers(0, 4))):
        if m:
            i, j = rng.integers(0, m), rng.integers(0, 3)
            rows[i, j] = rng.choice([*PLANTED, rows[i, j] + 2e-4, rows[i, j] - 2e-4])
    tolerance = float(rng.choice([1e-4, 1e-6]))
    assert bd._first_bad_row(rows, tolerance) == first_bad_row_twin(rows, tolerance)


@pytest.mark.parametrize("seed", range(20))
def test_group_counts_and_pairing_match_their_twins(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.choice(SIZES))
    n_groups = int(rng.integers(1, 300))
    group = rng.integers(-1, n_groups, size=n).astype(np.int32)
    want = np.bincount(group[group >= 0], minlength=n_groups)
    assert (bd._group_counts(group, n_groups) == want).all()

    seen = rng.random(n) < 0.5
    n_obs = np.where(seen, rng.integers(1, 9, size=n), 0).astype(np.int64)
    last_state = np.where(seen, rng.integers(1, 4, size=n), 0).astype(np.int8)
    slot = np.where(seen, np.arange(n), -1).astype(np.int64)
    streak = np.where(seen, rng.integers(-3, 4, size=n), 0).astype(np.int16)
    for _ in range(int(rng.integers(0, 3))):  # break the pairing of a random prompt
        if n:
            i = rng.integers(0, n)
            which = rng.integers(0, 4)
            if which == 0:
                n_obs[i] = 0 if n_obs[i] else 1
            elif which == 1:
                last_state[i] = 0 if last_state[i] else 2
            elif which == 2:
                slot[i] = -1 if slot[i] >= 0 else i
            else:
                streak[i] = 5
    args = (n_obs, last_state, streak, slot)
    assert bd._first_unpaired(*args) == first_unpaired_twin(*args)
