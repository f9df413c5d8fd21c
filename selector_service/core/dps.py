"""DPS step close: the per-prompt hidden-Markov update of docs/methods.md §2, one fused pass over the observed set.

Each prompt has its own 3x3 Dirichlet matrix D (stored at obs_d[s, 3*i + j] for its slot s),
column-stochastic: P(i, j) = D(i, j) / sum_i D(i, j), the probability of moving from state j to state i.
With prior D0 = d0 * ones and the dataset's hmm_decay (shared.DatasetRules), closing a step does, for
every prompt:

- observed at the step in state o (obs_state != 0; several results already pooled):
      post = onehot(o)
      xi(i, j) = post(i) P(i, j) prev(j) / sum_{i,j} (...)      (P from D before this update)
      D <- hmm_decay D + (1 - hmm_decay) D0 + xi
      prior <- normalise(P' @ post)   (P' from the new D),   prev <- post
- not observed:
      D <- hmm_decay D + (1 - hmm_decay) D0
      prior <- normalise(P' @ prior),  prev <- prior (the old prior)

and resets the step state to 0. The arithmetic is float64; the stored arrays are float32 (memory
budget), so each step rounds its results once to float32 (ours). Since post = onehot(o),
normalise(P' @ post) is column o of D' divided by its sum, which is how the kernel computes it; it
multiplies by reciprocals of the column sums and of the total (4 divisions per unobserved prompt, 6
per observed one, instead of 12), which changes results only at the level of float64 rounding.

Only prompts that have ever been observed are walked (the observed set of beliefs.py, in slot order).
A never-observed prompt does not change at a close, bit for bit: its D is D0 and its prior (1/3, 1/3,
1/3); hmm_decay * d0 + (1 - hmm_decay) * d0 rounds to within one float64 ulp of d0, which rounds back to
the stored float32 d0, and with all columns equal every row of P' @ prior is the same sum, so the
normalised prior rounds back to float32(1/3) (tests/core/test_dps.py checks the whole dense state
against the literal twin, which walks every prompt). So a close costs O(prompts ever observed), not O(N).

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

from ._parallel import CHUNK, PARALLEL_MIN, launch

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


@numba.njit(nogil=True, cache=True, inline="always")
def _observed_d(
    d: npt.NDArray[np.float32],
    prev: npt.NDArray[np.float32],
    p: int | np.integer[Any],
    oi: int | np.integer[Any],
    hmm_decay: float,
    keep: float,
    e: npt.NDArray[np.float64],
) -> None:
    """e <- D' of prompt p observed in state oi at the closing step: hmm_decay D + (1 - hmm_decay) D0 + xi
    (float64)."""
    for q in range(9):
        e[q] = hmm_decay * d[q, p] + keep
    # xi has one non-zero row: xi(oi, j) = P(oi, j) prev(j) / z, with P from the old D
    x0 = d[3 * oi, p] / (np.float64(d[0, p]) + d[3, p] + d[6, p]) * prev[0, p]
    x1 = d[3 * oi + 1, p] / (np.float64(d[1, p]) + d[4, p] + d[7, p]) * prev[1, p]
    x2 = d[3 * oi + 2, p] / (np.float64(d[2, p]) + d[5, p] + d[8, p]) * prev[2, p]
    inv_z = 1.0 / (x0 + x1 + x2)
    e[3 * oi] += x0 * inv_z
    e[3 * oi + 1] += x1 * inv_z
    e[3 * oi + 2] += x2 * inv_z


#: Rows per block of the close kernel (see _close_range); a block's rows and its buffer of observed rows
#: stay in the L2 cache between the passes over it.
BLOCK = 2048


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _close_range(
    d: npt.NDArray[np.float32],
    prior: npt.NDArray[np.float32],
    prev: npt.NDArray[np.float32],
    step_state: npt.NDArray[np.int8],
    hmm_decay: float,
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
    keep = (1.0 - hmm_decay) * d0
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
            _observed_d(d, prev, p, oi, hmm_decay, keep, e)
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
            e0 = hmm_decay * d[0, p] + keep
            e1 = hmm_decay * d[1, p] + keep
            e2 = hmm_decay * d[2, p] + keep
            e3 = hmm_decay * d[3, p] + keep
            e4 = hmm_decay * d[4, p] + keep
            e5 = hmm_decay * d[5, p] + keep
            e6 = hmm_decay * d[6, p] + keep
            e7 = hmm_decay * d[7, p] + keep
            e8 = hmm_decay * d[8, p] + keep
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


#: A close over a gap (_close_gap_range) starts the walk through its empty steps from the uniform belief
#: where what came before can move the result by at most this much in total variation: far below
#: float32's rounding of a probability (2^-25 at 1/3), so the stored result is that of the full walk.
GAP_EPS = 2.0**-34

#: Rows per block of the gap kernel: its float64 buffers of a block stay in the L2 cache.
GAP_BLOCK = 512


@numba.njit(nogil=True, cache=True)
def _gap_start(hmm_decay: float, bound: float, k: int) -> int:
    """Where a walk through ``k`` empty steps starts from the uniform belief, given `bound` >= every
    prompt's A (_close_gap_range): the latest s with 2 prod_{i=s+1}^{k-1} min(1, hmm_decay^i A) <= GAP_EPS
    (Dobrushin's coefficient of step i is at most hmm_decay^i A, and two beliefs differ by at most 2 in total
    variation); 0: from the prompts' own beliefs. ``k`` when both the last two steps map every belief to
    within GAP_EPS of uniform (P_i x - u = (P_i - U) x, at most hmm_decay^i A in total variation): the walk is
    not needed at all."""
    if hmm_decay == 1.0:
        return 0
    li = hmm_decay ** (k - 1)
    if k >= 2 and li * bound <= GAP_EPS:
        return k
    prod = 2.0
    for i in range(k - 1, 0, -1):
        prod *= min(1.0, li * bound)
        if prod <= GAP_EPS:
            return i - 1
        li /= hmm_decay
    return 0


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _close_gap_range(
    d: npt.NDArray[np.float32],
    prior: npt.NDArray[np.float32],
    prev: npt.NDArray[np.float32],
    step_state: npt.NDArray[np.int8],
    hmm_decay: float,
    d0: float,
    steps: int,
    lo: int,
    hi: int,
    counts: npt.NDArray[np.int64],
) -> None:
    """Closes ``steps >= 2`` steps for rows lo..hi-1 in one pass (close_step): the open step's update of
    _close_range, then ``k = steps - 1`` steps without evidence, all in float64 and rounded to float32
    once; adds the statistics into counts[0..5] (the open step's observed, partial and correct, the
    predictions of the final prior).

    An empty step does D <- hmm_decay D + (1 - hmm_decay) D0 and prior <- normalise(P' @ prior) (module
    docstring), so i steps after the open one D = d0 + hmm_decay^i E, E = D' - d0 (D' after the open
    step): D in closed form. The prior walks through k matrices that do not commute, but that approach the
    matrix of equal columns (which maps every belief to uniform) as fast as hmm_decay^i: Dobrushin's
    coefficient of step i is at most hmm_decay^i A, A = max_j sum_l |E(l, j) - s_j / 3| / min(3 d0,
    sum_l D'(l, j)), s_j the column sums of E. Block by block, the walk starts at _gap_start for a bound
    on the block's A, from the uniform belief: a few steps instead of k when hmm_decay < 1. With
    hmm_decay = 1, D does not move and the walk is P^(k-1), by squaring, then P once more (the previous
    prior is kept). Each loop over the block is
    branch-free over prompts, so LLVM vectorizes it."""
    keep = (1.0 - hmm_decay) * d0
    third = 1.0 / 3.0
    k = steps - 1
    e = np.empty((9, GAP_BLOCK))  # E = D' - d0, D' after the open step
    x = np.empty((3, GAP_BLOCK))  # the prior through the walk
    v = np.empty((3, GAP_BLOCK))  # the previous prior
    t = np.empty((9, GAP_BLOCK))  # powers of P (hmm_decay = 1)
    mp = np.empty((9, GAP_BLOCK))  # P^(k-1) (hmm_decay = 1)
    one = np.empty(9)
    obs = np.empty((12, GAP_BLOCK))  # E (9) and prior (3) of the rows observed at the open step
    spreads = np.empty(GAP_BLOCK)
    lows = np.empty(GAP_BLOCK)
    rows = np.empty(GAP_BLOCK, dtype=np.int64)
    observed = 0
    partial = 0
    correct = 0
    pred1: int | np.int64 = 0
    pred2: int | np.int64 = 0
    p: int | np.integer[Any]
    for b_lo in range(lo, hi, GAP_BLOCK):
        nb = min(hi, b_lo + GAP_BLOCK) - b_lo
        # 1. The open step's D' for every prompt as unobserved, held as E = D' - d0, with a bound on A
        # over the block: the largest spread over the smallest min(3 d0, column sum).
        for i in range(nb):
            p = np.uint64(b_lo + i)
            e0 = hmm_decay * d[0, p] + keep
            e1 = hmm_decay * d[1, p] + keep
            e2 = hmm_decay * d[2, p] + keep
            e3 = hmm_decay * d[3, p] + keep
            e4 = hmm_decay * d[4, p] + keep
            e5 = hmm_decay * d[5, p] + keep
            e6 = hmm_decay * d[6, p] + keep
            e7 = hmm_decay * d[7, p] + keep
            e8 = hmm_decay * d[8, p] + keep
            s0 = e0 + e3 + e6
            s1 = e1 + e4 + e7
            s2 = e2 + e5 + e8
            e[0, i] = e0 - d0
            e[1, i] = e1 - d0
            e[2, i] = e2 - d0
            e[3, i] = e3 - d0
            e[4, i] = e4 - d0
            e[5, i] = e5 - d0
            e[6, i] = e6 - d0
            e[7, i] = e7 - d0
            e[8, i] = e8 - d0
            a = _column_spread(e0, e3, e6, s0)
            a1 = _column_spread(e1, e4, e7, s1)
            a2 = _column_spread(e2, e5, e8, s2)
            a = a if a > a1 else a1
            a = a if a > a2 else a2
            b = s0 if s0 < s1 else s1
            spreads[i] = a
            lows[i] = b if b < s2 else s2
        spread = 0.0
        low = 3.0 * d0
        for i in range(nb):  # reduced apart: a reduction in the loop above would keep it from vectorizing
            spread = max(spread, spreads[i])
            low = min(low, lows[i])
        # The prompts observed at the open step: their D' and prior (column oi of P'), aside in obs.
        no = 0
        for i in range(nb):
            o = step_state[b_lo + i]
            if o >= 1 and o <= 3:
                rows[no] = i
                no += 1
        for j in range(no):
            p = b_lo + rows[j]
            oi = step_state[p] - 1
            step_state[p] = 0
            observed += 1
            if oi == 1:
                partial += 1
            if _argmax3(np.float64(prior[0, p]), np.float64(prior[1, p]), np.float64(prior[2, p])) == oi:
                correct += 1
            _observed_d(d, prev, p, oi, hmm_decay, keep, one)
            inv_total = 1.0 / (one[oi] + one[3 + oi] + one[6 + oi])
            for q in range(9):
                obs[q, j] = one[q] - d0
            for r in range(3):
                obs[9 + r, j] = one[3 * r + oi] * inv_total
            for c in range(3):
                total = one[c] + one[3 + c] + one[6 + c]
                spread = max(spread, _column_spread(one[c], one[3 + c], one[6 + c], total))
                low = min(low, total)
        start = _gap_start(hmm_decay, spread / low, k)
        if start == 0:  # the walk starts from the open step's prior (_close_range's update)
            for r in range(3):
                for i in range(nb):
                    x[r, i] = prior[r, np.uint64(b_lo + i)]
            _decayed_step(e, 1.0, d0, x, x, nb)
        for j in range(no):
            i = rows[j]
            for q in range(9):
                e[q, i] = obs[q, j]
            for r in range(3):
                x[r, i] = obs[9 + r, j]
        # 2. The walk through the k empty steps.
        if hmm_decay == 1.0:
            for i in range(nb):  # t <- P, mp <- identity
                for c in range(3):
                    inv = 1.0 / ((e[c, i] + d0) + (e[3 + c, i] + d0) + (e[6 + c, i] + d0))
                    for r in range(3):
                        t[3 * r + c, i] = (e[3 * r + c, i] + d0) * inv
                for q in range(9):
                    mp[q, i] = 1.0 if q % 4 == 0 else 0.0
            power = k - 1
            while power > 0:
                if power & 1:
                    _matmul3_block(mp, t, nb)
                power >>= 1
                if power:
                    _matmul3_block(t, t, nb)
            for i in range(nb):  # v <- normalise(P^(k-1) x); x <- normalise(P v)
                v0 = mp[0, i] * x[0, i] + mp[1, i] * x[1, i] + mp[2, i] * x[2, i]
                v1 = mp[3, i] * x[0, i] + mp[4, i] * x[1, i] + mp[5, i] * x[2, i]
                v2 = mp[6, i] * x[0, i] + mp[7, i] * x[1, i] + mp[8, i] * x[2, i]
                inv = 1.0 / (v0 + v1 + v2)
                v[0, i] = v0 * inv
                v[1, i] = v1 * inv
                v[2, i] = v2 * inv
            _decayed_step(e, 1.0, d0, v, x, nb)
        elif start == k:
            x[:, :nb] = third
            v[:, :nb] = third
        else:
            if start > 0:
                x[:, :nb] = third
            li = hmm_decay ** (start + 1)
            for _ in range(start + 1, k):
                _decayed_step(e, li, d0, x, v, nb)
                x, v = v, x
                li *= hmm_decay
            _decayed_step(e, li, d0, x, v, nb)  # the last step: v holds the prior, x the previous one
            x, v = v, x
        # 3. Stored once, as float32 (D = d0 + hmm_decay^k E).
        lk = hmm_decay**k
        c1: int | np.int64 = 0
        c2: int | np.int64 = 0
        for i in range(nb):
            p = np.uint64(b_lo + i)
            d[0, p] = d0 + lk * e[0, i]
            d[1, p] = d0 + lk * e[1, i]
            d[2, p] = d0 + lk * e[2, i]
            d[3, p] = d0 + lk * e[3, i]
            d[4, p] = d0 + lk * e[4, i]
            d[5, p] = d0 + lk * e[5, i]
            d[6, p] = d0 + lk * e[6, i]
            d[7, p] = d0 + lk * e[7, i]
            d[8, p] = d0 + lk * e[8, i]
            f0 = np.float32(x[0, i])
            f1 = np.float32(x[1, i])
            f2 = np.float32(x[2, i])
            prior[0, p] = f0
            prior[1, p] = f1
            prior[2, p] = f2
            prev[0, p] = v[0, i]
            prev[1, p] = v[1, i]
            prev[2, p] = v[2, i]
            top = _argmax3(f0, f1, f2)
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


@numba.njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _column_spread(c0: float, c1: float, c2: float, total: float) -> float:
    """sum_l |E(l, j) - s_j / 3| for one column (c0, c1, c2) of D (E = D - d0, s_j = total - 3 d0), total
    its sum."""
    mean = total * (1.0 / 3.0)
    return abs(c0 - mean) + abs(c1 - mean) + abs(c2 - mean)


@numba.njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _decayed_step(
    e: npt.NDArray[np.float64],
    li: float,
    d0: float,
    r: npt.NDArray[np.float64],
    out: npt.NDArray[np.float64],
    nb: int,
) -> None:
    """out[:, i] <- normalise(P @ r[:, i]) for the first nb prompts of a block, P the column-normalised
    D = d0 + li E, E = e[:, i] (row-major 3x3): an empty step of the walk, D formed in registers."""
    for i in range(nb):
        m0 = d0 + li * e[0, i]
        m1 = d0 + li * e[1, i]
        m2 = d0 + li * e[2, i]
        m3 = d0 + li * e[3, i]
        m4 = d0 + li * e[4, i]
        m5 = d0 + li * e[5, i]
        m6 = d0 + li * e[6, i]
        m7 = d0 + li * e[7, i]
        m8 = d0 + li * e[8, i]
        w0 = r[0, i] / (m0 + m3 + m6)
        w1 = r[1, i] / (m1 + m4 + m7)
        w2 = r[2, i] / (m2 + m5 + m8)
        n0 = m0 * w0 + m1 * w1 + m2 * w2
        n1 = m3 * w0 + m4 * w1 + m5 * w2
        n2 = m6 * w0 + m7 * w1 + m8 * w2
        inv = 1.0 / (n0 + n1 + n2)
        out[0, i] = n0 * inv
        out[1, i] = n1 * inv
        out[2, i] = n2 * inv


@numba.njit(nogil=True, cache=True, inline="always")
def _matmul3_block(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64], nb: int) -> None:
    """a[:, i] <- a[:, i] @ b[:, i] for the first nb 3x3 matrices of a block (row-major, f64[9, BLOCK]);
    b may be a."""
    for i in range(nb):
        c0 = a[0, i] * b[0, i] + a[1, i] * b[3, i] + a[2, i] * b[6, i]
        c1 = a[0, i] * b[1, i] + a[1, i] * b[4, i] + a[2, i] * b[7, i]
        c2 = a[0, i] * b[2, i] + a[1, i] * b[5, i] + a[2, i] * b[8, i]
        c3 = a[3, i] * b[0, i] + a[4, i] * b[3, i] + a[5, i] * b[6, i]
        c4 = a[3, i] * b[1, i] + a[4, i] * b[4, i] + a[5, i] * b[7, i]
        c5 = a[3, i] * b[2, i] + a[4, i] * b[5, i] + a[5, i] * b[8, i]
        c6 = a[6, i] * b[0, i] + a[7, i] * b[3, i] + a[8, i] * b[6, i]
        c7 = a[6, i] * b[1, i] + a[7, i] * b[4, i] + a[8, i] * b[7, i]
        c8 = a[6, i] * b[2, i] + a[7, i] * b[5, i] + a[8, i] * b[8, i]
        a[0, i] = c0
        a[1, i] = c1
        a[2, i] = c2
        a[3, i] = c3
        a[4, i] = c4
        a[5, i] = c5
        a[6, i] = c6
        a[7, i] = c7
        a[8, i] = c8


@numba.njit(nogil=True, cache=True)
def _close_gap_serial(
    d: npt.NDArray[np.float32],
    prior: npt.NDArray[np.float32],
    prev: npt.NDArray[np.float32],
    step_state: npt.NDArray[np.int8],
    hmm_decay: float,
    d0: float,
    m: int,
    counts: npt.NDArray[np.int64],
    steps: int,
) -> None:
    _close_gap_range(d, prior, prev, step_state, hmm_decay, d0, steps, 0, m, counts[0])


@numba.njit(nogil=True, cache=True, parallel=True)
def _close_gap_parallel(
    d: npt.NDArray[np.float32],
    prior: npt.NDArray[np.float32],
    prev: npt.NDArray[np.float32],
    step_state: npt.NDArray[np.int8],
    hmm_decay: float,
    d0: float,
    m: int,
    counts: npt.NDArray[np.int64],
    steps: int,
) -> None:
    for c in prange(counts.shape[0]):
        lo = c * CHUNK
        _close_gap_range(d, prior, prev, step_state, hmm_decay, d0, steps, lo, min(m, lo + CHUNK), counts[c])


@numba.njit(nogil=True, cache=True)
def _close_serial(
    d: npt.NDArray[np.float32],
    prior: npt.NDArray[np.float32],
    prev: npt.NDArray[np.float32],
    step_state: npt.NDArray[np.int8],
    hmm_decay: float,
    d0: float,
    m: int,
    counts: npt.NDArray[np.int64],
) -> None:
    _close_range(d, prior, prev, step_state, hmm_decay, d0, 0, m, counts[0])


@numba.njit(nogil=True, cache=True, parallel=True)
def _close_parallel(
    d: npt.NDArray[np.float32],
    prior: npt.NDArray[np.float32],
    prev: npt.NDArray[np.float32],
    step_state: npt.NDArray[np.int8],
    hmm_decay: float,
    d0: float,
    m: int,
    counts: npt.NDArray[np.int64],
) -> None:
    for c in prange(counts.shape[0]):
        lo = c * CHUNK
        _close_range(d, prior, prev, step_state, hmm_decay, d0, lo, min(m, lo + CHUNK), counts[c])


def close_step(
    ba: BeliefArrays, hmm_decay: float | None = None, d0: float | None = None, steps: int = 1
) -> CloseStats:
    """Closes the open step for every prompt of `ba` (a BeliefArrays) in place, walking only its observed
    set; see the module docstring. The decay is the dataset's (ba.shared.rules.hmm_decay): `hmm_decay`
    names it where the rules leave it open, and may repeat the dataset's (DatasetRules.decay). `d0`
    defaults to the beliefs' own (ba.d0) and must equal it.

    ``steps > 1`` closes the open step and the ``steps - 1`` steps after it, which hold no evidence, in
    one pass over the observed set (_close_gap_range): each prompt's update through all of them is
    computed in float64 and rounded to float32 once, at a cost that does not grow with the gap where
    hmm_decay < 1 (and with log2 of it where hmm_decay = 1). The statistics are those of the open step,
    but for the predictions, which count the final prior."""
    hmm_decay = ba.shared.rules.decay("hmm_decay", hmm_decay)
    if d0 is None:
        d0 = ba.d0
    if not (math.isfinite(d0) and d0 > 0):
        raise ValueError(f"d0 (Dirichlet prior count) must be finite and > 0, got {d0!r}")
    if float(d0) != ba.d0:
        raise ValueError(f"d0 {d0!r} differs from the beliefs' Dirichlet prior count {ba.d0!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    m = ba.observed
    # The columns of the observed set at its capacity (C-contiguous f32[9 or 3, capacity]); rows < m live.
    cols = ba.observed_columns()
    args = (*cols, ba.obs_state, hmm_decay, float(d0), m)
    serial, parallel = (
        (_close_serial, _close_parallel) if steps == 1 else (_close_gap_serial, _close_gap_parallel)
    )
    extra = () if steps == 1 else (int(steps),)
    threshold = max(PARALLEL_MIN, CLOSE_PARALLEL_MIN)
    # One row of counts per work item: one for the serial kernel, one per chunk for the parallel one.
    counts = np.zeros((1 if m < threshold else (m + CHUNK - 1) // CHUNK, 6), dtype=np.int64)
    launch(serial, parallel, m, *args, counts, *extra, threshold=threshold)
    total = counts.sum(axis=0)
    total[3] += ba.n - m  # never-observed prompts: uniform prior, predicted UNSOLVED
    return CloseStats(*(int(v) for v in total))
