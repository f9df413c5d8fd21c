"""The step close (core/dps.py) against a frozen copy of its row-by-row kernel, bit for bit.

`row_close` below is the close as one branchy loop over rows, D stored row-major (f32[M, 9]), as it was
first written. The production kernel computes the same float64 operations in the same order for every
element but is laid out to vectorize (columns, and the few prompts observed at a step apart from the
rest); IEEE arithmetic is exact per operation, so every stored float32 and every count must be equal,
not merely close. (tests/core/test_dps.py checks both against the literal 3x3 matrix twin.)
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from selector_service.core import BeliefArrays, CloseStats, close_step, dps


@numba.njit(cache=True, inline="always")
def _argmax3(x0, x1, x2):
    b1 = np.int64(x1 > x0)
    top = x1 if x1 > x0 else x0
    b2 = np.int64(x2 > top)
    return b1 + b2 * (2 - b1)


@numba.njit(cache=True)
def row_close(d, prior, prev, step_state, lam, d0, counts):
    keep = (1.0 - lam) * d0
    e = np.empty(9)
    observed = 0
    partial = 0
    correct = 0
    pred = np.zeros(3, dtype=np.int64)
    for p in range(step_state.size):
        r0 = np.float64(prior[p, 0])
        r1 = np.float64(prior[p, 1])
        r2 = np.float64(prior[p, 2])
        for q in range(9):
            e[q] = lam * d[p, q] + keep
        o = step_state[p]
        if o >= 1 and o <= 3:
            oi = o - 1
            observed += 1
            if oi == 1:
                partial += 1
            if _argmax3(r0, r1, r2) == oi:
                correct += 1
            x0 = d[p, 3 * oi] / (np.float64(d[p, 0]) + d[p, 3] + d[p, 6]) * prev[p, 0]
            x1 = d[p, 3 * oi + 1] / (np.float64(d[p, 1]) + d[p, 4] + d[p, 7]) * prev[p, 1]
            x2 = d[p, 3 * oi + 2] / (np.float64(d[p, 2]) + d[p, 5] + d[p, 8]) * prev[p, 2]
            inv_z = 1.0 / (x0 + x1 + x2)
            e[3 * oi] += x0 * inv_z
            e[3 * oi + 1] += x1 * inv_z
            e[3 * oi + 2] += x2 * inv_z
            n0 = e[oi]
            n1 = e[3 + oi]
            n2 = e[6 + oi]
            prev[p, 0] = 0.0
            prev[p, 1] = 0.0
            prev[p, 2] = 0.0
            prev[p, oi] = 1.0
            step_state[p] = 0
        else:
            w0 = r0 / (e[0] + e[3] + e[6])
            w1 = r1 / (e[1] + e[4] + e[7])
            w2 = r2 / (e[2] + e[5] + e[8])
            n0 = e[0] * w0 + e[1] * w1 + e[2] * w2
            n1 = e[3] * w0 + e[4] * w1 + e[5] * w2
            n2 = e[6] * w0 + e[7] * w1 + e[8] * w2
            prev[p, 0] = r0
            prev[p, 1] = r1
            prev[p, 2] = r2
        for q in range(9):
            d[p, q] = e[q]
        inv_total = 1.0 / (n0 + n1 + n2)
        f0 = np.float32(n0 * inv_total)
        f1 = np.float32(n1 * inv_total)
        f2 = np.float32(n2 * inv_total)
        prior[p, 0] = f0
        prior[p, 1] = f1
        prior[p, 2] = f2
        pred[_argmax3(f0, f1, f2)] += 1
    counts[0] += observed
    counts[1] += partial
    counts[2] += correct
    counts[3] += pred[0]
    counts[4] += pred[1]
    counts[5] += pred[2]


def random_beliefs(n: int, m: int, share: float, seed: int, d0: float = 1.0) -> BeliefArrays:
    """n prompts, m observed with random DPS states: D over several magnitudes, random priors and prevs
    (some one-hot, some with exact ties), a `share` of them observed at the open step."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(n, m, replace=False).astype(np.int32)
    d = (d0 * np.exp(rng.normal(0.0, 2.0, (m, 9)))).astype(np.float32)
    prior = rng.random((m, 3), dtype=np.float32) + np.float32(0.01)
    prior /= prior.sum(axis=1, keepdims=True)
    prev = rng.random((m, 3), dtype=np.float32)
    prev /= prev.sum(axis=1, keepdims=True)
    onehot = rng.random(m) < 0.3
    prev[onehot] = np.eye(3, dtype=np.float32)[rng.integers(0, 3, onehot.sum())]
    ties = rng.random(m) < 0.05
    prior[ties] = np.float32(1 / 3)
    prior[rng.random(m) < 0.05, :2] = np.float32(0.4)  # a tie between the first two states
    state = np.where(rng.random(m) < share, rng.integers(1, 4, m), 0).astype(np.int8)
    slot = np.full(n, -1, dtype=np.int32)
    slot[ids] = np.arange(m, dtype=np.int32)
    arrays = {**BeliefArrays.new(n, d0=d0).arrays(), "hmm_slot": slot}
    arrays.update(obs_ids=ids, obs_d=d, obs_prior=prior, obs_prev=prev, obs_state=state)
    arrays["n_obs"] = np.zeros(n, dtype=np.int32)
    arrays["n_obs"][ids] = 1
    return BeliefArrays.from_arrays(arrays, d0=d0)


def reference_close(ba: BeliefArrays, lam: float) -> tuple[dict[str, np.ndarray], CloseStats]:
    m = ba.observed
    d, prior, prev = (np.array(getattr(ba, f)[:m], order="C") for f in ("obs_d", "obs_prior", "obs_prev"))
    state = ba.obs_state[:m].copy()
    counts = np.zeros(6, dtype=np.int64)
    row_close(d, prior, prev, state, float(lam), float(ba.d0), counts)
    counts[3] += ba.n - m
    return {"obs_d": d, "obs_prior": prior, "obs_prev": prev, "obs_state": state}, CloseStats(
        *counts.tolist()
    )


def assert_close_equals_reference(ba: BeliefArrays, lam: float, steps: int = 3) -> None:
    rng = np.random.default_rng(int(lam * 1000) + ba.observed)
    for _ in range(steps):
        want, want_stats = reference_close(ba, lam)
        stats = close_step(ba, lam)
        assert stats == want_stats
        for name, arr in want.items():
            got = getattr(ba, name)[: ba.observed]
            np.testing.assert_array_equal(
                np.ascontiguousarray(got).view(np.uint8), arr.view(np.uint8), err_msg=name
            )
        # observe a random part again for the next close
        m = ba.observed
        ba.obs_state[:m] = np.where(rng.random(m) < 0.2, rng.integers(1, 4, m), 0).astype(np.int8)


@pytest.mark.parametrize("share", [0.0, 0.003, 0.2, 0.9, 1.0])
@pytest.mark.parametrize(("lam", "d0"), [(0.7, 1.0), (0.5, 0.3), (1.0, 1.0), (0.0, 2.0), (0.93, 1.0)])
def test_close_is_bitwise_the_row_kernel(share, lam, d0):
    ba = random_beliefs(5000, 4321, share, seed=int(share * 100 + lam * 10), d0=d0)
    assert_close_equals_reference(ba, lam)


@pytest.mark.parametrize("m", [0, 1, 2, 3, 7, 31, 2047, 2048, 2049, 9000])
def test_close_sizes_around_the_blocks(m):
    """Observed sets of every size class the kernel treats apart: empty, below and around one block."""
    n = max(m, 1) + 5
    if m == 0:
        ba = BeliefArrays.new(n)
        assert close_step(ba, 0.7) == CloseStats(0, 0, 0, n, 0, 0)
        return
    assert_close_equals_reference(random_beliefs(n, m, 0.4, seed=m), 0.7)


def test_parallel_close_is_bitwise_the_row_kernel(monkeypatch):
    """The prange kernel (large observed sets) splits the rows in chunks; each is the same computation."""
    monkeypatch.setattr(dps, "CLOSE_PARALLEL_MIN", 0)
    monkeypatch.setattr(dps, "PARALLEL_MIN", 0)
    ba = random_beliefs(70_000, 66_001, 0.1, seed=3)
    assert_close_equals_reference(ba, 0.7)


def test_reference_is_what_the_close_computed_before():
    """A fixed point of the reference itself (two prompts, by hand from docs/methods.md §2 with D0 = ones,
    lam = 0.5): observed PARTIAL gives prior (0.3, 0.4, 0.3); unobserved stays at 1/3."""
    d = np.ones((2, 9), np.float32)
    prior = np.full((2, 3), np.float32(1 / 3))
    prev = prior.copy()
    state = np.array([2, 0], np.int8)
    counts = np.zeros(6, np.int64)
    row_close(d, prior, prev, state, 0.5, 1.0, counts)
    assert prior[0].tolist() == pytest.approx([0.3, 0.4, 0.3], abs=1e-7)
    assert prior[1].tolist() == [np.float32(1 / 3)] * 3
    assert counts.tolist() == [1, 1, 0, 1, 1, 0]
