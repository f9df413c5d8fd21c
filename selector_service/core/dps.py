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
written back only where it was set). The arrays are column-major (beliefs.COLUMN_FIELDS) and the
unobserved update, the bulk of the work, runs as one vectorized loop per block (_close_range), so the
pass runs near that floor instead of being bound by its divisions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numba
import numpy as np
import numpy.typing as npt
from numba import prange

from ._parallel import CHUNK, PARALLEL_LOCK, PARALLEL_MIN

if TYPE_CHECKING:
    from .beliefs import BeliefArrays

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
def _argmax3(
    x0: float | np.floating[Any], x1: float | np.floating[Any], x2: float | np.floating[Any]
) -> np.int64:
    """Index of the largest of three values; ties go to the lowest index. Branch-free: the priors are
    data, and a mispredicted branch per prompt costs more than the rest of its update."""
    b1 = np.int64(x1 > x0)
    top = x1 if x1 > x0 else x0
    b2 = np.int64(x2 > top)
    return b1 + b2 * (2 - b1)


#: Rows per block of the close kernel (see _close_range); a block's rows and its buffer of observed rows
#: stay in the L2 cache between the passes over it.
BLOCK = 2048


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _close_range(
    d: npt.NDArray[np.float32],
    prior: npt.NDArray[np.float32],
    prev: npt.NDArray[np.float32],
    step_state: npt.NDArray[np.int8],
    lam: float,
    d0: float,
    lo: int,
    hi: int,
    counts: npt.NDArray[np.int64],
) -> None:
    """Closes rows lo..hi-1; adds their statistics into counts[0..5] (CloseStats order).

    d: f32[9, M] (row q = 3*i + j of D), prior, prev: f32[3, M], the columns of the observed set
    (beliefs.py stores them column-major, so a row is contiguous over prompts). Block by block: the
    prompts observed at the step (few) are updated first into a buffer, from the old D and prev; then
    every prompt of the block takes the unobserved update in one branch-free loop that LLVM vectorizes
    (the division-bound part: 4 divisions per prompt, 4 at a time); then the buffered rows are written
    over it. Per element the float64 operations and their order are those of the one-row-at-a-time
    update, so results are identical bit for bit (tests/core/test_close_bitwise.py). error_model="numpy":
    no zero-division check (a branch that would stop the vectorizer; divisors are sums of positive
    counts and probabilities here, core/belief_domain.py)."""
    keep = (1.0 - lam) * d0
    e = np.empty(9)  # D' of one observed prompt in float64, e[3*i + j] = D'(i, j)
    rows = np.empty(BLOCK, dtype=np.int64)
    buf = np.empty((15, BLOCK), dtype=np.float32)  # D' (9), prior (3), prev (3) of the observed rows
    observed = 0
    partial = 0
    correct = 0
    pred1: int | np.int64 = 0
    pred2: int | np.int64 = 0
    p: int | np.integer[Any]  # a range index, an int64 row, a uint64 index
    for b_lo in range(lo, hi, BLOCK):
        b_hi = min(hi, b_lo + BLOCK)
        nb = 0
        for p in range(b_lo, b_hi):
            o = step_state[p]
            if o >= 1 and o <= 3:
                rows[nb] = p
                nb += 1
        # 1. The observed prompts, from the state before the close.
        for j in range(nb):
            p = rows[j]
            oi = step_state[p] - 1
            step_state[p] = 0
            observed += 1
            if oi == 1:
                partial += 1
            if _argmax3(np.float64(prior[0, p]), np.float64(prior[1, p]), np.float64(prior[2, p])) == oi:
                correct += 1
            for q in range(9):
                e[q] = lam * d[q, p] + keep
            # xi has one non-zero row: xi(oi, j) = P(oi, j) prev(j) / z, with P from the old D
            x0 = d[3 * oi, p] / (np.float64(d[0, p]) + d[3, p] + d[6, p]) * prev[0, p]
            x1 = d[3 * oi + 1, p] / (np.float64(d[1, p]) + d[4, p] + d[7, p]) * prev[1, p]
            x2 = d[3 * oi + 2, p] / (np.float64(d[2, p]) + d[5, p] + d[8, p]) * prev[2, p]
            inv_z = 1.0 / (x0 + x1 + x2)
            e[3 * oi] += x0 * inv_z
            e[3 * oi + 1] += x1 * inv_z
            e[3 * oi + 2] += x2 * inv_z
            # normalise(P' @ onehot(o)) = column oi of P' = D'(., oi) / its sum
            n0 = e[oi]
            n1 = e[3 + oi]
            n2 = e[6 + oi]
            inv_total = 1.0 / (n0 + n1 + n2)
            for q in range(9):
                buf[q, j] = e[q]
            buf[9, j] = n0 * inv_total
            buf[10, j] = n1 * inv_total
            buf[11, j] = n2 * inv_total
            buf[12, j] = 0.0
            buf[13, j] = 0.0
            buf[14, j] = 0.0
            buf[12 + oi, j] = 1.0
        # 2. Every prompt of the block as unobserved (branch-free, vectorized).
        c1: int | np.int64 = 0
        c2: int | np.int64 = 0
        for i in range(b_hi - b_lo):
            p = np.uint64(b_lo + i)  # unsigned: no negative-index wraparound, which stops the vectorizer
            r0 = np.float64(prior[0, p])
            r1 = np.float64(prior[1, p])
            r2 = np.float64(prior[2, p])
            e0 = lam * d[0, p] + keep
            e1 = lam * d[1, p] + keep
            e2 = lam * d[2, p] + keep
            e3 = lam * d[3, p] + keep
            e4 = lam * d[4, p] + keep
            e5 = lam * d[5, p] + keep
            e6 = lam * d[6, p] + keep
            e7 = lam * d[7, p] + keep
            e8 = lam * d[8, p] + keep
            w0 = r0 / (e0 + e3 + e6)
            w1 = r1 / (e1 + e4 + e7)
            w2 = r2 / (e2 + e5 + e8)
            n0 = e0 * w0 + e1 * w1 + e2 * w2
            n1 = e3 * w0 + e4 * w1 + e5 * w2
            n2 = e6 * w0 + e7 * w1 + e8 * w2
            prev[0, p] = r0
            prev[1, p] = r1
            prev[2, p] = r2
            d[0, p] = e0
            d[1, p] = e1
            d[2, p] = e2
            d[3, p] = e3
            d[4, p] = e4
            d[5, p] = e5
            d[6, p] = e6
            d[7, p] = e7
            d[8, p] = e8
            inv_total = 1.0 / (n0 + n1 + n2)
            f0 = np.float32(n0 * inv_total)
            f1 = np.float32(n1 * inv_total)
            f2 = np.float32(n2 * inv_total)
            prior[0, p] = f0
            prior[1, p] = f1
            prior[2, p] = f2
            top = _argmax3(f0, f1, f2)  # counted without a branch or an indexed add
            c1 += np.int64(top == 1)
            c2 += np.int64(top == 2)
        # 3. The observed prompts' rows over their unobserved ones (and their predictions swapped).
        for j in range(nb):
            p = rows[j]
            top = _argmax3(prior[0, p], prior[1, p], prior[2, p])
            c1 -= np.int64(top == 1)
            c2 -= np.int64(top == 2)
            for q in range(9):
                d[q, p] = buf[q, j]
            for q in range(3):
                prior[q, p] = buf[9 + q, j]
                prev[q, p] = buf[12 + q, j]
            top = _argmax3(buf[9, j], buf[10, j], buf[11, j])
            c1 += np.int64(top == 1)
            c2 += np.int64(top == 2)
        pred1 += c1
        pred2 += c2
    counts[0] += observed
    counts[1] += partial
    counts[2] += correct
    counts[3] += (hi - lo) - pred1 - pred2
    counts[4] += pred1
    counts[5] += pred2


@numba.njit(nogil=True, cache=True)
def _close_serial(
    d: npt.NDArray[np.float32],
    prior: npt.NDArray[np.float32],
    prev: npt.NDArray[np.float32],
    step_state: npt.NDArray[np.int8],
    lam: float,
    d0: float,
    m: int,
    counts: npt.NDArray[np.int64],
) -> None:
    _close_range(d, prior, prev, step_state, lam, d0, 0, m, counts[0])


@numba.njit(nogil=True, cache=True, parallel=True)
def _close_parallel(
    d: npt.NDArray[np.float32],
    prior: npt.NDArray[np.float32],
    prev: npt.NDArray[np.float32],
    step_state: npt.NDArray[np.int8],
    lam: float,
    d0: float,
    m: int,
    counts: npt.NDArray[np.int64],
) -> None:
    for c in prange(counts.shape[0]):
        lo = c * CHUNK
        _close_range(d, prior, prev, step_state, lam, d0, lo, min(m, lo + CHUNK), counts[c])


def close_step(ba: BeliefArrays, lam: float, d0: float | None = None) -> CloseStats:
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
    # The columns of the observed set at its capacity (C-contiguous f32[9 or 3, capacity]); rows < m live.
    cols = ba.observed_columns()
    args = (*cols, ba.obs_state, float(lam), float(d0), m)
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
