"""DPS step close: the per-prompt hidden-Markov update of METHODS 2, one fused pass over every prompt.

Each prompt has its own 3x3 Dirichlet matrix D (stored at hmm_d[p, 3*i + j]), column-stochastic:
P(i, j) = D(i, j) / sum_i D(i, j), the probability of moving from state j to state i. With prior
D0 = d0 * ones and decay lam, closing a step does, for every prompt:

- observed at the step in state o (step_state != 0; several results already pooled):
      post = onehot(o)
      xi(i, j) = post(i) P(i, j) prev(j) / sum_{i,j} (...)      (P from D before this update)
      D <- lam D + (1 - lam) D0 + xi
      prior <- normalise(P' @ post)   (P' from the new D),   prev <- post
- not observed:
      D <- lam D + (1 - lam) D0
      prior <- normalise(P' @ prior),  prev <- prior (the old prior)

and resets step_state to 0. The arithmetic is float64; the stored arrays are float32 (memory budget),
so each step rounds its results once to float32 (ours). Since post = onehot(o), normalise(P' @ post)
is column o of D' divided by its sum, which is how the kernel computes it.

`CloseStats` (ours, for monitoring DPS): `correct` counts observed prompts whose predicted state (argmax
of the prior before the update) equals the observed state; `predicted_*` count the argmax of the new
prior over all prompts. Argmax ties go to the lowest state index (UNSOLVED < PARTIAL < SOLVED): a
never-seen prompt, whose prior is exactly uniform, is predicted UNSOLVED.

Memory traffic is the floor: per prompt 61 bytes are read and 60 written (step_state is written back
only where it was set), so the pass is bandwidth-bound at large N.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
from numba import prange

from ._parallel import CHUNK, PARALLEL_LOCK, PARALLEL_MIN

__all__ = ["CloseStats", "close_step"]


class CloseStats(NamedTuple):
    """Counts from one step close (all over the prompts of one dataset)."""

    observed: int  # prompts observed at the step
    partial: int  # observed in state PARTIAL (numerator of the effective-sample ratio)
    correct: int  # observed prompts whose predicted state (argmax of the prior before) was right
    predicted_unsolved: int  # argmax of the new prior == UNSOLVED, over all prompts
    predicted_partial: int  # ... == PARTIAL
    predicted_solved: int  # ... == SOLVED


@numba.njit(nogil=True, cache=True, inline="always")
def _argmax3(x0, x1, x2):
    """Index of the largest of three values; ties go to the lowest index."""
    best = 0
    top = x0
    if x1 > top:
        best = 1
        top = x1
    if x2 > top:
        best = 2
    return best


@numba.njit(nogil=True, cache=True)
def _close_range(d, prior, prev, step_state, lam, d0, lo, hi, counts):
    """Closes prompts lo..hi-1; adds their statistics into counts[0..5] (CloseStats order)."""
    keep = (1.0 - lam) * d0
    e = np.empty(9)  # D' of the current prompt in float64, e[3*i + j] = D'(i, j)
    x = np.empty(3)
    observed = 0
    partial = 0
    correct = 0
    pred = np.zeros(3, dtype=np.int64)
    for p in range(lo, hi):
        r0 = np.float64(prior[p, 0])
        r1 = np.float64(prior[p, 1])
        r2 = np.float64(prior[p, 2])
        o = step_state[p]
        is_observed = o >= 1 and o <= 3
        if is_observed:
            oi = o - 1
            observed += 1
            if oi == 1:
                partial += 1
            if _argmax3(r0, r1, r2) == oi:
                correct += 1
            # xi has one non-zero row: xi(oi, j) = P(oi, j) prev(j) / z, with P from the old D
            z = 0.0
            for j in range(3):
                col = np.float64(d[p, j]) + d[p, 3 + j] + d[p, 6 + j]
                x[j] = d[p, 3 * oi + j] / col * prev[p, j]
                z += x[j]
        for q in range(9):
            e[q] = lam * d[p, q] + keep
        if is_observed:
            for j in range(3):
                e[3 * oi + j] += x[j] / z
            # normalise(P' @ onehot(o)) = column oi of P' = D'(., oi) / its sum
            c = e[oi] + e[3 + oi] + e[6 + oi]
            n0 = e[oi] / c
            n1 = e[3 + oi] / c
            n2 = e[6 + oi] / c
            prev[p, 0] = 0.0
            prev[p, 1] = 0.0
            prev[p, 2] = 0.0
            prev[p, oi] = 1.0
            step_state[p] = 0
        else:
            c0 = e[0] + e[3] + e[6]
            c1 = e[1] + e[4] + e[7]
            c2 = e[2] + e[5] + e[8]
            n0 = e[0] / c0 * r0 + e[1] / c1 * r1 + e[2] / c2 * r2
            n1 = e[3] / c0 * r0 + e[4] / c1 * r1 + e[5] / c2 * r2
            n2 = e[6] / c0 * r0 + e[7] / c1 * r1 + e[8] / c2 * r2
            prev[p, 0] = r0
            prev[p, 1] = r1
            prev[p, 2] = r2
        for q in range(9):
            d[p, q] = e[q]
        total = n0 + n1 + n2
        prior[p, 0] = n0 / total
        prior[p, 1] = n1 / total
        prior[p, 2] = n2 / total
        pred[_argmax3(prior[p, 0], prior[p, 1], prior[p, 2])] += 1
    counts[0] += observed
    counts[1] += partial
    counts[2] += correct
    counts[3] += pred[0]
    counts[4] += pred[1]
    counts[5] += pred[2]


@numba.njit(nogil=True, cache=True)
def _close_serial(d, prior, prev, step_state, lam, d0, counts):
    _close_range(d, prior, prev, step_state, lam, d0, 0, step_state.size, counts[0])


@numba.njit(nogil=True, cache=True, parallel=True)
def _close_parallel(d, prior, prev, step_state, lam, d0, counts):
    n = step_state.size
    for c in prange(counts.shape[0]):
        lo = c * CHUNK
        _close_range(d, prior, prev, step_state, lam, d0, lo, min(n, lo + CHUNK), counts[c])


def close_step(ba, lam: float, d0: float = 1.0) -> CloseStats:
    """Closes the open step for every prompt of `ba` (a BeliefArrays) in place; see the module docstring."""
    if not (math.isfinite(lam) and 0.0 <= lam <= 1.0):
        raise ValueError(f"hmm_decay (lam) must lie in [0, 1], got {lam!r}")
    if not (math.isfinite(d0) and d0 > 0):
        raise ValueError(f"d0 (Dirichlet prior count) must be finite and > 0, got {d0!r}")
    n = ba.step_state.size
    args = (ba.hmm_d, ba.hmm_prior, ba.hmm_prev, ba.step_state, float(lam), float(d0))
    if n < PARALLEL_MIN:
        counts = np.zeros((1, 6), dtype=np.int64)
        _close_serial(*args, counts)
    else:
        counts = np.zeros(((n + CHUNK - 1) // CHUNK, 6), dtype=np.int64)
        with PARALLEL_LOCK:
            _close_parallel(*args, counts)
    return CloseStats(*(int(v) for v in counts.sum(axis=0)))
