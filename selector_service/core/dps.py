"""DPS step close: the per-prompt hidden-Markov update of docs/methods.md §2, one fused pass over the observed set.

Each prompt has its own 3x3 Dirichlet matrix D (stored at obs_d[s, 3*i + j] for its slot s),
column-stochastic: P(i, j) = D(i, j) / sum_i D(i, j), the probability of moving from state j to state i.
With prior D0 = d0 * ones and decay lam, closing a step does, for every prompt:

- observed at the step in state o (obs_state != 0; several results already pooled):
      post = onehot(o)
      xi(i, j) = post(i) P(i, j) prev(j) / sum_{i,j} (...)      (P from D before this update)
      D <- lam D + (1 - lam) D0 + xi
      prior <- normalise(P' @ post)   (P' from the new D),   prev <- post
- not observed:
      D <- lam D + (1 - lam) D0
      prior <- normalise(P' @ prior),  prev <- prior (the old prior)

and resets the step state to 0. The arithmetic is float64; the stored arrays are float32 (memory
budget), so each step rounds its results once to float32 (ours). Since post = onehot(o),
normalise(P' @ post) is column o of D' divided by its sum, which is how the kernel computes it; it
multiplies by reciprocals of the column sums and of the total (4 divisions per unobserved prompt, 6
per observed one, instead of 12), which changes results only at the level of float64 rounding.

Only prompts that have ever been observed are walked (the observed set of beliefs.py, in slot order).
A never-observed prompt does not change at a close, bit for bit: its D is D0 and its prior (1/3, 1/3,
1/3); lam * d0 + (1 - lam) * d0 rounds to within one float64 ulp of d0, which rounds back to the stored
float32 d0, and with all columns equal every row of P' @ prior is the same sum, so the normalised prior
rounds back to float32(1/3) (tests/test_core_dps.py checks the whole dense state against the literal
twin, which walks every prompt). So a close costs O(prompts ever observed), not O(N).

`CloseStats` (ours, for monitoring DPS): `correct` counts observed prompts whose predicted state (argmax
of the prior before the update) equals the observed state; `predicted_*` count the argmax of the new
prior over all prompts (never-observed ones included). Argmax ties go to the lowest state index
(UNSOLVED < PARTIAL < SOLVED): a never-seen prompt, whose prior is exactly uniform, is predicted UNSOLVED.

Memory traffic is the floor: per observed prompt 61 bytes are read and 60 written (the step state is
written back only where it was set), so the pass is bandwidth-bound at large N.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
from numba import prange

from ._parallel import CHUNK, PARALLEL_LOCK, PARALLEL_MIN

__all__ = ["CLOSE_PARALLEL_MIN", "CloseStats", "close_step"]

#: Observed sets smaller than this close on one thread. The pass is memory-bound: on the 2-core shared
#: machine the parallel kernel gained nothing at 10^6-10^7 rows and was 3x slower at 10^5 (each parallel
#: region waits for every worker thread to be scheduled), so only sets of millions of rows, where more
#: cores can add bandwidth, take the parallel kernel.
CLOSE_PARALLEL_MIN = 1 << 22


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
    """Index of the largest of three values; ties go to the lowest index. Branch-free: the priors are
    data, and a mispredicted branch per prompt costs more than the rest of its update."""
    b1 = np.int64(x1 > x0)
    top = x1 if x1 > x0 else x0
    b2 = np.int64(x2 > top)
    return b1 + b2 * (2 - b1)


@numba.njit(nogil=True, cache=True)
def _close_range(d, prior, prev, step_state, lam, d0, lo, hi, counts):
    """Closes rows lo..hi-1; adds their statistics into counts[0..5] (CloseStats order)."""
    keep = (1.0 - lam) * d0
    e = np.empty(9)  # D' of the current prompt in float64, e[3*i + j] = D'(i, j)
    observed = 0
    partial = 0
    correct = 0
    pred = np.zeros(3, dtype=np.int64)
    for p in range(lo, hi):
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
            # xi has one non-zero row: xi(oi, j) = P(oi, j) prev(j) / z, with P from the old D
            x0 = d[p, 3 * oi] / (np.float64(d[p, 0]) + d[p, 3] + d[p, 6]) * prev[p, 0]
            x1 = d[p, 3 * oi + 1] / (np.float64(d[p, 1]) + d[p, 4] + d[p, 7]) * prev[p, 1]
            x2 = d[p, 3 * oi + 2] / (np.float64(d[p, 2]) + d[p, 5] + d[p, 8]) * prev[p, 2]
            inv_z = 1.0 / (x0 + x1 + x2)
            e[3 * oi] += x0 * inv_z
            e[3 * oi + 1] += x1 * inv_z
            e[3 * oi + 2] += x2 * inv_z
            # normalise(P' @ onehot(o)) = column oi of P' = D'(., oi) / its sum
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
        pred[_argmax3(f0, f1, f2)] += 1  # an indexed add, not a branch on the data
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


def close_step(ba, lam: float, d0: float | None = None) -> CloseStats:
    """Closes the open step for every prompt of `ba` (a BeliefArrays) in place, walking only its observed
    set; see the module docstring. `d0` defaults to the beliefs' own (ba.d0) and must equal it."""
    if not (math.isfinite(lam) and 0.0 <= lam <= 1.0):
        raise ValueError(f"hmm_decay (lam) must lie in [0, 1], got {lam!r}")
    if d0 is None:
        d0 = ba.d0
    if not (math.isfinite(d0) and d0 > 0):
        raise ValueError(f"d0 (Dirichlet prior count) must be finite and > 0, got {d0!r}")
    if float(d0) != ba.d0:
        raise ValueError(f"d0 {d0!r} differs from the beliefs' Dirichlet prior count {ba.d0!r}")
    m = ba.observed
    args = (ba.obs_d[:m], ba.obs_prior[:m], ba.obs_prev[:m], ba.obs_state[:m], float(lam), float(d0))
    if m < max(PARALLEL_MIN, CLOSE_PARALLEL_MIN):
        counts = np.zeros((1, 6), dtype=np.int64)
        _close_serial(*args, counts)
    else:
        counts = np.zeros(((m + CHUNK - 1) // CHUNK, 6), dtype=np.int64)
        with PARALLEL_LOCK:
            _close_parallel(*args, counts)
    total = counts.sum(axis=0)
    total[3] += ba.n - m  # never-observed prompts: uniform prior, predicted UNSOLVED
    return CloseStats(*(int(v) for v in total))
