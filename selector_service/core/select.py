"""Seeded selection primitives: candidate pools, top-k with random ties, epoch walks.

Every random choice comes from the project's counter-based generator (rng.py): `stream(key, step, seed,
purpose)` gives the same values in every process, replica and numpy version.

- `candidate_pool`: distinct ids uniformly at random (docs/methods.md §1.1: the pool of min(ratio * B, N)).
- `topk_random_ties`: the k largest scores; every order among equal scores is uniformly random
  (docs/methods.md §1.1 and 2 require random tie-breaking: DPS has thousands of prompts tied at 1/3).
- `topk_tied`: the same result from a `TiedScores` index (the positions whose score differs from the
  one most prompts share), reading only those: a whole-dataset Beta select in a cold start.
- `uniform_batch` (docs/methods.md §4): a seeded permutation per epoch, walked B at a time.
- `history_batch` (docs/methods.md §4, SRPO): the same walk skipping prompts whose latest result was solved.
- `mopps_threshold_select` (docs/methods.md §1.2, variant `threshold`).
- `dps_select` (docs/methods.md §2): DPS over the whole dataset from the observed set alone (beliefs.py), the
  never-observed prompts drawn from their implicit block (O(prompts ever observed + B)).

The tie rule (defined once, here; tests/naive.topk_random_ties is its literal twin): with b the k-th
largest score, every score > b is taken; of the t positions whose score equals b (in ascending
position order) the `need` = k - #above ones at `stream.child(0).sample(t, need)` are taken (all of
them when need = t); the result is sorted by descending score, equal scores by the random key
`stream.child(1).bits_at(position)` (then by position, which two distinct 64-bit keys never need).
So which tied positions get in is a uniformly random subset and their order a uniformly random order.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple

import numba
import numpy as np
import numpy.typing as npt

from .outcomes import SOLVED
from .rng import Stream, bounded, stream
from .scores import dps_score3, dps_score_of_row

if TYPE_CHECKING:
    from .beliefs import BeliefArrays

#: A count a kernel returns: an int64 inside numba (a Python int once returned from compiled code).
_Count = int | np.int64

__all__ = [
    "TiedScores",
    "candidate_pool",
    "choose_tied",
    "dps_select",
    "epoch_permutation",
    "history_batch",
    "kth_largest",
    "mopps_threshold_select",
    "order_by_score",
    "order_key",
    "retie",
    "tie_index",
    "topk_random_ties",
    "topk_tied",
    "uniform_batch",
]


def candidate_pool(n: int, size: int, rng: Stream) -> np.ndarray:
    """`size` distinct ids from 0..n-1 uniformly at random, in random order (int64; `rng.sample`);
    size == n gives all ids in order 0..n-1 (no randomness needed: the scores decide). O(size)."""
    if not 0 <= size <= n:
        raise ValueError(f"candidate pool size must lie in [0, n={n}], got {size}")
    if size == n:
        return np.arange(n, dtype=np.int64)
    return rng.sample(n, size)


_SIGN = np.uint64(1 << 63)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_DIGIT = np.uint64(0xFFFF)
_TOP = np.uint64(48)
#: Key of +inf: nothing is above it.
_KEY_MAX = 0xFFF0000000000000


@numba.njit(nogil=True, cache=True, inline="always")
def _order_key(x: float, bits: np.uint64) -> np.uint64:
    """uint64 that sorts like the float x (bits = x's bit pattern); -0.0 is keyed as +0.0.

    Branch-free (negatives flip every bit, the rest only the sign bit): a data-dependent branch on the
    sign costs ~3x on scores of mixed sign.
    """
    flip = (np.uint64(0) - (bits >> np.uint64(63))) | _SIGN
    key = bits ^ flip
    return _SIGN if x == 0.0 else key


# Pass 1 over the scores: histogram of the keys' top 16 bits and counts (NaN scores, keys > ref_key,
# keys == ref_key). Pass 2: positions whose top digit is above `digit` (ascending), and the keys and
# positions of those whose top digit equals it (ascending). Each comes for two sources, a float64 array
# or DPS prior rows scored on the fly; the loops keep their counters in locals and test the data without
# unpredictable branches (an if/elif on the top digit, or counting with branches near ref_key, measured
# 5-20x slower on 10^7 scores).


@numba.njit(nogil=True, cache=True)
def _histogram_array(
    scores: npt.NDArray[np.float64],
    bits: npt.NDArray[np.uint64],
    ref_key: np.uint64,
    hist: npt.NDArray[np.int64],
) -> tuple[int, _Count, _Count]:
    nan = 0
    gt = 0
    eq = 0
    for q in range(scores.size):
        s = scores[q]
        if s != s:
            nan += 1
            continue
        key = _order_key(s, bits[q])
        hist[key >> _TOP] += 1
        gt += np.int64(key > ref_key)
        eq += np.int64(key == ref_key)
    return nan, gt, eq


@numba.njit(nogil=True, cache=True)
def _histogram_prior(
    prior: npt.NDArray[np.float32], weight: float, ref_key: np.uint64, hist: npt.NDArray[np.int64]
) -> tuple[int, _Count, _Count]:
    buf = np.empty(1, dtype=np.float64)
    ubuf = buf.view(np.uint64)
    nan = 0
    gt = 0
    eq = 0
    for q in range(prior.shape[0]):
        s = dps_score_of_row(prior, q, weight)
        if s != s:
            nan += 1
            continue
        buf[0] = s
        key = _order_key(s, ubuf[0])
        hist[key >> _TOP] += 1
        gt += np.int64(key > ref_key)
        eq += np.int64(key == ref_key)
    return nan, gt, eq


@numba.njit(nogil=True, cache=True)
def _collect_array(
    scores: npt.NDArray[np.float64],
    bits: npt.NDArray[np.uint64],
    digit: int,
    above: npt.NDArray[np.int64],
    cand_keys: npt.NDArray[np.uint64],
    cand_pos: npt.NDArray[np.int64],
) -> tuple[int, int]:
    wanted = np.uint64(digit)
    na = 0
    nc = 0
    for q in range(scores.size):
        key = _order_key(scores[q], bits[q])
        top = key >> _TOP
        if top >= wanted:
            if top > wanted:
                above[na] = q
                na += 1
            else:
                cand_keys[nc] = key
                cand_pos[nc] = q
                nc += 1
    return na, nc


@numba.njit(nogil=True, cache=True)
def _collect_prior(
    prior: npt.NDArray[np.float32],
    weight: float,
    digit: int,
    above: npt.NDArray[np.int64],
    cand_keys: npt.NDArray[np.uint64],
    cand_pos: npt.NDArray[np.int64],
) -> tuple[int, int]:
    buf = np.empty(1, dtype=np.float64)
    ubuf = buf.view(np.uint64)
    wanted = np.uint64(digit)
    na = 0
    nc = 0
    for q in range(prior.shape[0]):
        s = dps_score_of_row(prior, q, weight)
        buf[0] = s
        key = _order_key(s, ubuf[0])
        top = key >> _TOP
        if top >= wanted:
            if top > wanted:
                above[na] = q
                na += 1
            else:
                cand_keys[nc] = key
                cand_pos[nc] = q
                nc += 1
    return na, nc


#: Rows per block of the array passes: each block is first counted in a branch-free loop that LLVM
#: vectorizes; only a block that holds what is looked for is walked row by row.
_ROW_BLOCK = 1024


@numba.njit(nogil=True, cache=True)
def _tied_at_ranks(
    scores: npt.NDArray[np.float64], value: float, ranks: npt.NDArray[np.int64], out: npt.NDArray[np.int64]
) -> None:
    """out[j] = the position of the ranks[j]-th score (0-based, ranks ascending) among the scores equal
    to `value`, in ascending position order. Compares values: equal values have equal keys (-0.0 and
    +0.0 included), and NaN equals nothing."""
    j = 0
    seen = 0
    m = scores.size
    for lo in range(0, m, _ROW_BLOCK):
        hi = min(lo + _ROW_BLOCK, m)
        count = 0
        for q in range(lo, hi):
            count += np.int64(scores[q] == value)
        if seen + count <= ranks[j]:  # the next rank lies beyond this block
            seen += count
            continue
        for q in range(lo, hi):
            if scores[q] == value:
                if seen == ranks[j]:
                    out[j] = q
                    j += 1
                    if j == ranks.size:
                        return
                seen += 1


@numba.njit(nogil=True, cache=True)
def _scan_array(
    scores: npt.NDArray[np.float64],
    bits: npt.NDArray[np.uint64],
    thr: float,
    ref: float,
    keys_out: npt.NDArray[np.uint64],
    pos_out: npt.NDArray[np.int64],
) -> tuple[_Count, _Count, _Count, _Count]:
    """One pass: counts (NaN, scores > ref, scores == ref) and the keys and positions (ascending) of
    every score >= thr; returns (kept, nan, gt, eq), or (size + 1, partial counts) as soon as more than
    keys_out.size would have to be kept. Compares values, not keys (the same order: keys sort like the
    values, -0.0 like +0.0), and forms a key only for a kept score. Each block of rows is counted
    first (_block_counts, branch-free) and walked only when it holds a row to keep."""
    cap = keys_out.size
    n = 0
    nan = 0
    gt = 0
    eq = 0
    m = scores.size
    for lo in range(0, m, _ROW_BLOCK):
        hi = min(lo + _ROW_BLOCK, m)
        c_nan, c_gt, c_eq, kept = _block_counts(scores[lo:hi], hi - lo, thr, ref)
        nan += c_nan
        gt += c_gt
        eq += c_eq
        if kept == 0:
            continue
        for q in range(lo, hi):
            s = scores[q]
            if s >= thr:
                if n == cap:  # the sample misled: give up at once, the exact passes decide
                    return n + 1, nan, gt, eq
                keys_out[n] = _order_key(s, bits[q])
                pos_out[n] = q
                n += 1
    return n, nan, gt, eq


@numba.njit(nogil=True, cache=True)
def _scan_prior(
    prior: npt.NDArray[np.float32],
    weight: float,
    thr: float,
    ref: float,
    keys_out: npt.NDArray[np.uint64],
    pos_out: npt.NDArray[np.int64],
) -> tuple[_Count, _Count, _Count, _Count]:
    """_scan_array for DPS prior rows scored on the fly (no key and no score array for the rows below
    the threshold: a float32 load and three comparisons when weight is 0)."""
    buf = np.empty(1, dtype=np.float64)
    ubuf = buf.view(np.uint64)
    cap = keys_out.size
    n = 0
    nan = 0
    gt = 0
    eq = 0
    for q in range(prior.shape[0]):
        s = dps_score_of_row(prior, q, weight)
        if s != s:
            nan += 1
            continue
        gt += np.int64(s > ref)
        eq += np.int64(s == ref)
        if s >= thr:
            if n == cap:
                return n + 1, nan, gt, eq
            buf[0] = s
            keys_out[n] = _order_key(s, ubuf[0])
            pos_out[n] = q
            n += 1
    return n, nan, gt, eq


@numba.njit(nogil=True, cache=True)
def _sample_keys(
    scores: npt.NDArray[np.float64],
    bits: npt.NDArray[np.uint64],
    prior: npt.NDArray[np.float32],
    weight: float,
    use_prior: bool,
    m: int,
    out: npt.NDArray[np.uint64],
) -> None:
    """Keys of out.size rows spread evenly over 0..m-1 (row (i * m) // size), NaN keyed as 0."""
    buf = np.empty(1, dtype=np.float64)
    ubuf = buf.view(np.uint64)
    count = out.size
    for i in range(count):
        q = (i * m) // count
        if use_prior:
            s = dps_score_of_row(prior, q, weight)
            buf[0] = s
            b = ubuf[0]
        else:
            s = scores[q]
            b = bits[q]
        out[i] = np.uint64(0) if s != s else _order_key(s, b)


@numba.njit(nogil=True, cache=True)
def _kth_key_any(keys: npt.NDArray[np.uint64], r: int) -> np.uint64:
    """Key of the r-th largest of `keys` (1 <= r <= size), any top digits: a histogram of the top 16
    bits picks the digit, then _kth_key_among narrows within it."""
    hist = np.zeros(65536, dtype=np.int64)
    for i in range(keys.size):
        hist[keys[i] >> _TOP] += 1
    above = 0
    digit = 65535
    while above + hist[digit] < r:
        above += hist[digit]
        digit -= 1
    wanted = np.uint64(digit)
    sub = np.empty(hist[digit], dtype=np.uint64)
    kept = 0
    for i in range(keys.size):
        if (keys[i] >> _TOP) == wanted:
            sub[kept] = keys[i]
            kept += 1
    return _kth_key_among(sub, r - above)


@numba.njit(nogil=True, cache=True)
def _kth_key_among(cand: npt.NDArray[np.uint64], r: int) -> np.uint64:
    """Key of the r-th largest of `cand` (uint64 keys sharing their top 16 bits; 1 <= r <= size).

    Radix select on the remaining 16-bit digits, most significant first: a histogram of the current
    digit finds the digit of the r-th largest, the candidates are narrowed to it, and the search stops
    as soon as all are equal. No pivots, so O(size) whatever the input (numpy's introselect slows down
    10-30x on some arrangements of a large block of equal values).
    """
    low: np.uint64 = cand[0]
    high = cand[0]
    for i in range(1, cand.size):
        low = min(low, cand[i])
        high = max(high, cand[i])
    if low == high:  # one block of equal values (a tie at the top, as in a cold start): done
        return low
    work = cand.copy()
    count = work.size
    remaining = r
    hist = np.zeros(65536, dtype=np.int64)
    for level in range(1, 4):
        low = work[0]
        high = work[0]
        for i in range(1, count):
            low = min(low, work[i])
            high = max(high, work[i])
        if low == high:
            break
        shift = np.uint64(48 - 16 * level)
        hist[:] = 0
        for i in range(count):
            hist[(work[i] >> shift) & _DIGIT] += 1
        above = 0
        digit = 65535
        while above + hist[digit] < remaining:
            above += hist[digit]
            digit -= 1
        remaining -= above
        wanted = np.uint64(digit)  # compare uint64 with uint64 (numba would mix uint64/int64 via float64)
        kept = 0
        for i in range(count):
            c = work[i]
            if ((c >> shift) & _DIGIT) == wanted:
                work[kept] = c
                kept += 1
        count = kept
    key: np.uint64 = work[0]
    return key


#: Rows sampled to place the scan's threshold, and how many sampled keys above it are asked for per
#: sampled rank of the k-th largest (x2) plus a margin: the scan keeps about 2k + 16 m / SAMPLE rows.
_SAMPLE = 4096
_SAMPLE_MARGIN = 16


class _Scan(NamedTuple):
    nan: int
    gt: int  # keys > the reference key
    eq: int  # keys == the reference key
    ref_key: int  # the reference key: the caller's, or (when it gave none) a big sampled tie block's value
    thr_key: int  # every key >= thr_key was kept ...
    keys: np.ndarray  # ... here (uint64), with its position (ascending) ...
    pos: np.ndarray
    complete: bool  # ... unless there were more than the buffer held; then:
    hist: np.ndarray | None  # the exact histogram (and nan, gt, eq come from it)


class _Source:
    """The first m scores of one of two sources, as the passes read them: a float64 array, or DPS prior
    rows (float32[m, 3]) scored on the fly as prior(2) + weight * entropy (no score array is written).

    The usual path reads the scores once: `scan` samples 4096 evenly spread rows to place a threshold a
    little below the k-th largest, then one pass keeps every row at or above it (about 2k + 16 m / 4096
    rows) and counts rows against a reference key; `top` finishes among the kept rows. When the
    kept rows would not fit (the scan then stops at once) or do not suffice (the threshold landed too
    high), two exact passes decide (`histogram`, then `split`). Either way the result is the
    same.
    """

    def __init__(
        self, m: int, scores: np.ndarray | None = None, prior: np.ndarray | None = None, weight: float = 0.0
    ) -> None:
        self.m = m
        self.prior = None if prior is None else prior[:m]
        self.scores = None if scores is None else scores[:m]
        self.weight = float(weight)

    def _bits(self) -> npt.NDArray[np.uint64]:
        return self.scores.view(np.uint64) if self.scores is not None else np.empty(0, dtype=np.uint64)

    def scan(self, k: int, ref_key: int = 0) -> _Scan:
        """One pass keeping the rows at or above a sampled threshold for rank k; see the class."""
        m = self.m
        if m <= 4 * _SAMPLE:
            thr, cap = 0, m
        else:
            sample = np.empty(_SAMPLE, dtype=np.uint64)
            scores = self.scores if self.scores is not None else np.empty(0, dtype=np.float64)
            prior = self.prior if self.prior is not None else np.empty((0, 3), dtype=np.float32)
            _sample_keys(scores, self._bits(), prior, self.weight, self.prior is not None, m, sample)
            rank = min(_SAMPLE, -(-2 * k * _SAMPLE // m) + _SAMPLE_MARGIN)
            ordered = np.sort(sample)
            sampled = ordered[_SAMPLE - rank]
            thr = int(sampled) if rank < _SAMPLE else 0
            # A value that many sampled rows share is a big block of ties: keep only the rows above it
            # (if they do not reach rank k, the block holds the boundary: `top_in_tie_block` finishes
            # when the counts are against the block, else the exact passes list it).
            tie = int(sampled)
            if rank < _SAMPLE and np.count_nonzero(ordered == sampled) > rank and tie < _KEY_MAX:
                thr = tie + 1  # the next key: every row above the block, none of it
                if not ref_key:
                    ref_key = tie
            cap = min(m, 2 * (rank * m // _SAMPLE) + 4096)
        keys = np.empty(cap, dtype=np.uint64)
        pos = np.empty(cap, dtype=np.int64)
        thr_value = _key_to_value(thr) if thr else -math.inf  # key 0: keep everything
        ref_value = _key_to_value(ref_key) if ref_key else -math.inf
        if self.prior is not None:
            n, nan, gt, eq = _scan_prior(self.prior, self.weight, thr_value, ref_value, keys, pos)
        else:
            n, nan, gt, eq = _scan_array(self.scores, self._bits(), thr_value, ref_value, keys, pos)  # type: ignore[arg-type]  # scores is set where prior is not
        if n <= cap:
            return _Scan(int(nan), int(gt), int(eq), ref_key, thr, keys[:n], pos[:n], True, None)
        hist, nan, gt, eq = self.histogram(ref_key)
        return _Scan(nan, gt, eq, ref_key, thr, keys[:0], pos[:0], False, hist)

    def top_in_tie_block(self, scan: _Scan, k: int) -> tuple[np.ndarray, int, int] | None:
        """When the k-th largest score is the value of the big tie block the scan counted against and
        the scan kept every row above it: (positions above it, ascending; size of the block; its key).
        Else None. Then the block's positions need not be listed: `tied_at_ranks` finds the few drawn."""
        if not (scan.complete and scan.ref_key and scan.thr_key > scan.ref_key):
            return None
        if scan.keys.size != scan.gt or not scan.gt < k <= scan.gt + scan.eq:
            return None
        return np.sort(scan.pos), scan.eq, scan.ref_key

    def tied_at_ranks(self, key: int, ranks: np.ndarray) -> np.ndarray:
        """Positions of the rows whose key is `key`, at the given ranks (sorted ascending) among all
        such rows in ascending position order: one read-only pass."""
        out = np.empty(ranks.size, dtype=np.int64)
        if ranks.size:
            _tied_at_ranks(self.scores, _key_to_value(key), ranks, out)  # type: ignore[arg-type]  # array sources only (_topk_set)
        return out

    def top(self, scan: _Scan, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Positions above the k-th largest score, positions equal to it (ascending), and its key."""
        if scan.complete and scan.keys.size >= k:
            key = int(_kth_key_any(scan.keys, k))
            ukey = np.uint64(key)
            return scan.pos[scan.keys > ukey], scan.pos[scan.keys == ukey], key
        return self.split(scan.hist if scan.hist is not None else self.histogram()[0], k)

    def histogram(self, ref_key: int = 0) -> tuple[np.ndarray, int, int, int]:
        """(histogram of top digits, NaN count, count of keys > ref_key, count == ref_key)."""
        hist = np.zeros(65536, dtype=np.int64)
        if self.prior is not None:
            nan, gt, eq = _histogram_prior(self.prior, self.weight, np.uint64(ref_key), hist)
        else:
            nan, gt, eq = _histogram_array(self.scores, self.scores.view(np.uint64), np.uint64(ref_key), hist)  # type: ignore[arg-type,union-attr]  # scores is set where prior is not
        return hist, int(nan), int(gt), int(eq)

    def split(self, hist: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Positions above the k-th largest score, positions equal to it (both ascending), and its key
        (1 <= k <= m, no NaN)."""
        cum = np.cumsum(hist[::-1])
        digit = 65535 - int(np.searchsorted(cum, k))  # the top digit of the k-th largest
        ahead = int(cum[65535 - digit - 1]) if digit < 65535 else 0
        above, cand_keys, cand_pos = self._collect(hist, digit)
        key = int(_kth_key_among(cand_keys, k - ahead))
        return self._finish(above, cand_keys, cand_pos, key)

    def _collect(self, hist: np.ndarray, digit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        above = np.empty(int(hist[digit + 1 :].sum()), dtype=np.int64)
        cand_keys = np.empty(int(hist[digit]), dtype=np.uint64)
        cand_pos = np.empty(int(hist[digit]), dtype=np.int64)
        if self.prior is not None:
            _collect_prior(self.prior, self.weight, digit, above, cand_keys, cand_pos)
        else:
            _collect_array(self.scores, self.scores.view(np.uint64), digit, above, cand_keys, cand_pos)  # type: ignore[arg-type,union-attr]  # scores is set where prior is not
        return above, cand_keys, cand_pos

    @staticmethod
    def _finish(
        above: np.ndarray, cand_keys: np.ndarray, cand_pos: np.ndarray, key: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        ukey = np.uint64(key)
        if cand_keys.size and cand_keys.min() == ukey == cand_keys.max():
            return np.sort(above), cand_pos, key  # all candidates tie (no filtering copies)
        above = np.concatenate([above, cand_pos[cand_keys > ukey]])
        return np.sort(above), cand_pos[cand_keys == ukey], key


def order_key(x: float) -> int:
    """The uint64 key (as int) that sorts like the float x (-0.0 keyed as +0.0)."""
    bits = int(np.array([x], dtype=np.float64).view(np.uint64)[0])
    if x == 0.0:
        return 1 << 63
    return bits ^ ((1 << 64) - 1) if bits >> 63 else bits | (1 << 63)


def _key_to_value(key: int) -> float:
    bits = np.uint64(key)
    bits = bits ^ _SIGN if bits & _SIGN else ~bits
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


def kth_largest(scores: np.ndarray, k: int) -> float:
    """The k-th largest value of a float64 array without NaN (1 <= k <= n), in O(n) for any input."""
    scores = np.ascontiguousarray(scores, dtype=np.float64)
    source = _Source(scores.size, scores=scores)
    hist, nan, _, _ = source.histogram()
    if nan:
        raise ValueError("scores contain NaN")
    if not 1 <= k <= scores.size:
        raise ValueError(f"k must lie in [1, {scores.size}], got {k}")
    return _key_to_value(source.split(hist, int(k))[2])


def order_by_score(scores: np.ndarray, ids: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Indices that sort by descending `scores`, equal scores by ascending `keys` (uint64), then by
    ascending `ids`: a total order, so any correct sort gives the same result."""
    order: np.ndarray = np.lexsort((ids, keys, -scores))
    return order


def choose_tied(tied: np.ndarray, need: int, rng: Stream) -> np.ndarray:
    """The tie rule's subset: `need` of the tied ids (listed in ascending order), the ones at
    rng.child(0).sample(len, need); all of them when need == len."""
    if need >= tied.size:
        return tied
    chosen: np.ndarray = tied[rng.child(0).sample(tied.size, need)]
    return chosen


def topk_random_ties(scores: np.ndarray, k: int, rng: Stream) -> np.ndarray:
    """Positions (int64) of the k largest `scores`, ordered by score descending; the tie rule of the
    module docstring (uniformly random among equal scores, at the boundary and inside the result).

    Usually one pass over the scores (see _Source: a sampled threshold, then the rows above it), two
    exact ones where the sample misleads, whatever the arrangement of the scores: no pivots, so a large
    block of equal scores costs no more than random ones (numpy's introselect slows down 10-30x on some
    such arrangements); only the (at most k) chosen positions are sorted. NaN scores are rejected.
    """
    scores = np.ascontiguousarray(scores, dtype=np.float64)
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-d, got shape {scores.shape}")
    n = scores.size
    if not 0 <= k <= n:
        raise ValueError(f"k must lie in [0, {n}] (the number of scores), got {k}")
    if k == 0:
        return np.empty(0, dtype=np.int64)
    chosen = _topk_set(scores, k, rng)
    order = order_by_score(scores[chosen], chosen, rng.child(1).bits_at(chosen))
    ranked: np.ndarray = chosen[order]
    return ranked


def _topk_set(scores: np.ndarray, k: int, rng: Stream) -> np.ndarray:
    """The positions topk_random_ties returns (1 <= k <= n), in no particular order: the k largest, the
    tied ones at the boundary drawn by the tie rule."""
    n = scores.size
    source = _Source(n, scores=scores)
    scan = source.scan(k)
    if scan.nan:
        raise ValueError("scores contain NaN; every candidate needs a comparable score")
    if k == n:
        return np.arange(n, dtype=np.int64)
    block = source.top_in_tie_block(scan, k)
    if block is not None and k - block[0].size < block[1]:
        # The boundary lies in a big block of equal scores (never-observed prompts in a cold start): draw
        # the block's members by rank, as choose_tied does, without listing the block.
        above, size, key = block
        ranks = np.sort(rng.child(0).sample(size, k - above.size))
        return np.concatenate([above, source.tied_at_ranks(key, ranks)])
    above, tied, _ = source.top(scan, k)
    return np.concatenate([above, choose_tied(tied, k - above.size, rng)])


class TiedScores(NamedTuple):
    """Whole-dataset scores (`dense`, float64[N]) with an index of where they differ from one common
    value: every position outside `odd` (int64, ascending, distinct) scores exactly `base` (compared as
    values, so -0.0 counts as +0.0 like everywhere in the tie rule). At real scale most prompts are
    never observed and share one score; `topk_tied` then reads only the odd positions. `tie_index` and
    `retie` build and maintain the index."""

    dense: np.ndarray
    base: float
    odd: np.ndarray


#: Positions `tie_index` samples to find the common value, and the share of them it must hold.
_TIE_SAMPLE = 1024
_TIE_MIN_SHARE = 0.5


def tie_index(dense: np.ndarray, max_odd: int) -> TiedScores | None:
    """The index of `dense` around its most common value (found on evenly spread positions), or None
    when no value is common enough or more than `max_odd` positions differ from it. O(N)."""
    n = dense.size
    if n == 0:
        return None
    sample = dense[np.linspace(0, n - 1, min(n, _TIE_SAMPLE)).astype(np.int64)]
    values, counts = np.unique(sample, return_counts=True)
    top = int(np.argmax(counts))
    base = float(values[top])
    if counts[top] < _TIE_MIN_SHARE * sample.size or math.isnan(base):
        return None
    odd = np.flatnonzero(dense != base)
    return TiedScores(dense, base, odd) if odd.size <= max_odd else None


@numba.njit(nogil=True, cache=True)
def _retie(
    odd: npt.NDArray[np.int64],
    ids: npt.NDArray[np.int64],
    differs: npt.NDArray[np.bool_],
    out: npt.NDArray[np.int64],
) -> int:
    """Merges two ascending id lists: the ids of `odd` not in `ids`, and the ids[j] with differs[j];
    returns how many were written to out (size >= odd.size + ids.size)."""
    i = 0
    j = 0
    w = 0
    while i < odd.size or j < ids.size:
        if j == ids.size or (i < odd.size and odd[i] < ids[j]):
            out[w] = odd[i]
            w += 1
            i += 1
            continue
        if i < odd.size and odd[i] == ids[j]:
            i += 1
        if differs[j]:
            out[w] = ids[j]
            w += 1
        j += 1
    return w


def retie(tied: TiedScores, ids: np.ndarray) -> TiedScores:
    """The index after `dense` changed at `ids` (ascending, distinct; any ids, changed or not): each of
    them is odd exactly when its score now differs from `base`. O(len(odd) + len(ids))."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    differs = tied.dense[ids] != tied.base
    out = np.empty(tied.odd.size + ids.size, dtype=np.int64)
    written = _retie(tied.odd, ids, differs, out)
    return TiedScores(tied.dense, tied.base, out[:written])


@numba.njit(nogil=True, cache=True)
def _block_at(odd: npt.NDArray[np.int64], ranks: npt.NDArray[np.int64], out: npt.NDArray[np.int64]) -> None:
    """out[j] = the ranks[j]-th (0-based; ranks ascending) of the ids not in `odd` (ascending): with t
    odd ids below it, the id of rank r is r + t, and t is the number of odd[i] - i <= r (a
    non-decreasing sequence, so one merge walk)."""
    t = 0
    for j in range(ranks.size):
        r = ranks[j]
        while t < odd.size and odd[t] - t <= r:
            t += 1
        out[j] = r + t


def block_at(odd: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """The ids at `ranks` (ascending) among the ids not in `odd` (ascending, distinct), in O(len(odd) +
    len(ranks))."""
    out = np.empty(ranks.size, dtype=np.int64)
    _block_at(np.ascontiguousarray(odd, dtype=np.int64), np.ascontiguousarray(ranks, dtype=np.int64), out)
    return out


def topk_tied(tied: TiedScores, k: int, rng: Stream) -> np.ndarray:
    """topk_random_ties(tied.dense, k, rng), the same positions in the same order, reading only the odd
    positions when the k-th largest score is above `base` or is `base` itself (the block's members at
    the ranks the tie rule draws are found from the odd ids alone: `block_at`). When the whole block
    is in the batch (k >= its N - len(odd) members + the odd scores above it), the dense rule runs."""
    dense, base, odd = tied
    n = dense.size
    if not 0 <= k <= n:
        raise ValueError(f"k must lie in [0, {n}] (the number of scores), got {k}")
    if k == 0:
        return np.empty(0, dtype=np.int64)
    vals = dense[odd]
    if math.isnan(base) or np.isnan(vals).any():
        raise ValueError("scores contain NaN; every candidate needs a comparable score")
    block = n - odd.size
    higher = vals > base
    gt = int(np.count_nonzero(higher))
    if gt >= k:
        # The boundary lies among the odd scores, and so do all its ties: the rule over them alone
        # draws the same tied positions (ascending in both); the order below is by prompt id.
        chosen = odd[_topk_set(vals, k, rng)]
    elif k - gt < block:
        ranks = np.sort(rng.child(0).sample(block, k - gt))
        chosen = np.concatenate([odd[higher], block_at(odd, ranks)])
    else:
        return topk_random_ties(dense, k, rng)
    order = order_by_score(dense[chosen], chosen, rng.child(1).bits_at(chosen))
    ranked: np.ndarray = chosen[order]
    return ranked


@numba.njit(nogil=True, cache=True)
def _draw_unobserved(
    s: np.uint64, slot_of: npt.NDArray[np.int32], count: int, out: npt.NDArray[np.int64]
) -> None:
    """`count` distinct never-observed prompt ids (slot_of[p] < 0), uniformly at random: the i-th draw
    of stream s is bounded(s, i, N); a draw is kept when never observed and not yet kept."""
    n = slot_of.size
    cap = 16
    log2 = 4
    while cap < 2 * count:
        cap *= 2
        log2 += 1
    shift = np.uint64(64 - log2)
    mask = cap - 1
    table = np.full(cap, -1, dtype=np.int64)
    kept = 0
    i = 0
    while kept < count:
        p = bounded(s, np.uint64(i), n)
        i += 1
        if slot_of[p] >= 0:
            continue
        slot = np.int64((np.uint64(p) * _GOLDEN) >> shift)
        while table[slot] != -1 and table[slot] != p:
            slot = (slot + 1) & mask
        if table[slot] == p:
            continue
        table[slot] = p
        out[kept] = p
        kept += 1


#: Draw from the never-observed block by rejection while it holds at least this share of the dataset;
#: below it, list the block with one pass over the slot map.
_REJECTION_MIN_SHARE = 1.0 / 64.0


def _unobserved(ba: BeliefArrays, count: int, rng: Stream) -> np.ndarray:
    """`count` distinct never-observed ids, uniformly at random (rng.child(2); see dps_select)."""
    out = np.empty(count, dtype=np.int64)
    if count == 0:
        return out
    block = ba.n - ba.observed
    if block >= _REJECTION_MIN_SHARE * ba.n:
        _draw_unobserved(np.uint64(rng.child(2).id), ba.hmm_slot, count, out)
        return out
    listed = np.flatnonzero(ba.hmm_slot < 0)
    drawn: np.ndarray = listed[rng.child(2).sample(listed.size, count)]
    return drawn


#: Rows per block of _scan_columns.
_TOP_BLOCK = 256


@numba.njit(nogil=True, cache=True)
def _block_scores(
    p0: npt.NDArray[np.float32],
    p1: npt.NDArray[np.float32],
    p2: npt.NDArray[np.float32],
    lo: int,
    width: int,
    weight: float,
    out: npt.NDArray[np.float64],
) -> None:
    """DPS scores of rows lo..lo+width-1 from the prior's columns (unsigned indices: no negative-index
    wraparound, so the weight-0 loop vectorizes)."""
    if weight == 0.0:
        for i in range(width):
            out[i] = np.float64(p1[np.uint64(lo + i)])
    else:
        for i in range(width):
            q = np.uint64(lo + i)
            out[i] = dps_score3(p0[q], p1[q], p2[q], weight)


@numba.njit(nogil=True, cache=True)
def _block_counts(
    sc: npt.NDArray[np.float64], width: int, thr: float, ref: float
) -> tuple[_Count, _Count, _Count, _Count]:
    """(NaN, > ref, == ref, >= thr) among sc[:width], without branches (vectorized)."""
    nan = 0
    gt = 0
    eq = 0
    hits = 0
    for i in range(width):
        v = sc[i]
        nan += np.int64(v != v)
        gt += np.int64(v > ref)
        eq += np.int64(v == ref)
        hits += np.int64(v >= thr)  # False for NaN
    return nan, gt, eq, hits


@numba.njit(nogil=True, cache=True)
def _scan_columns(
    prior: npt.NDArray[np.float32],
    m: int,
    weight: float,
    thr: float,
    ref: float,
    vals: npt.NDArray[np.float64],
    pos: npt.NDArray[np.int64],
) -> tuple[_Count, _Count, _Count, _Count, _Count]:
    """One pass over the DPS scores of observed rows 0..m-1 (prior f32[3, capacity], the observed set's
    columns): counts (NaN, scores > ref, scores == ref, scores >= thr) and every row scoring >= thr
    with its score, in vals / pos (ascending rows). Block by block: the scores of 256 rows are computed
    and counted in loops without branches (vectorized); a block with rows >= thr is then compacted
    without branches. Stops collecting (the counts go on) once the rows would not fit in
    vals.size - _TOP_BLOCK; returns (rows kept or -1 if they did not fit, NaN, gt, eq, >= thr)."""
    cap = vals.size - _TOP_BLOCK  # the branch-free compaction writes one slot past the last row kept
    n = 0
    nan = 0
    gt = 0
    eq = 0
    ge = 0
    sc = np.empty(_TOP_BLOCK, dtype=np.float64)
    p0 = prior[0]
    p1 = prior[1]
    p2 = prior[2]
    for b_lo in range(0, m, _TOP_BLOCK):
        width = min(_TOP_BLOCK, m - b_lo)
        _block_scores(p0, p1, p2, b_lo, width, weight, sc)
        c_nan, c_gt, c_eq, hits = _block_counts(sc, width, thr, ref)
        nan += c_nan
        gt += c_gt
        eq += c_eq
        ge += hits
        if hits == 0 or n < 0:
            continue
        if n + hits > cap:
            n = -1
            continue
        for i in range(width):
            v = sc[i]
            vals[n] = v
            pos[n] = b_lo + i
            n += np.int64(v >= thr)  # False for NaN
    return n, nan, gt, eq, ge


@numba.njit(nogil=True, cache=True)
def _column_scores(
    prior: npt.NDArray[np.float32], slots: npt.NDArray[np.int64], weight: float, out: npt.NDArray[np.float64]
) -> None:
    for i in range(slots.size):
        q = slots[i]
        out[i] = dps_score3(prior[0, q], prior[1, q], prior[2, q], weight)


#: Rows sampled (evenly spread) to place _scan_columns' threshold: m / _RANK_SAMPLE_EVERY, within these.
_RANK_SAMPLE_MIN = 1024
_RANK_SAMPLE_MAX = 16384
_RANK_SAMPLE_EVERY = 64
#: Sampled rows above the sampled rank of the k-th largest (x2) where the threshold is placed.
_RANK_SAMPLE_MARGIN = 4


@numba.njit(nogil=True, cache=True)
def _sample_columns(
    prior: npt.NDArray[np.float32], m: int, weight: float, out: npt.NDArray[np.float64]
) -> None:
    """Scores of out.size rows spread evenly over 0..m-1 (row (i * m) // size)."""
    count = out.size
    for i in range(count):
        q = (i * m) // count
        out[i] = dps_score3(prior[0, q], prior[1, q], prior[2, q], weight)


@numba.njit(nogil=True, cache=True)
def _rank_th_largest(values: npt.NDArray[np.float64], rank: int) -> float:
    """The rank-th largest of `values` (duplicates counted; NaN skipped; -inf if fewer than rank are
    not NaN), for a small rank: a sorted list of the rank largest so far, one compare per value. Not
    np.partition, which slows down ~10x on the many equal scores DPS priors reach (after many closes
    a million priors take a few hundred distinct values), nor a sort of the whole sample."""
    top = np.full(rank, -np.inf)  # ascending; top[0] is the smallest of the rank largest
    for i in range(values.size):
        v = values[i]
        if v > top[0]:  # False for NaN
            j = 1
            while j < rank and top[j] < v:
                top[j - 1] = top[j]
                j += 1
            top[j - 1] = v
    smallest: float = top[0]
    return smallest


class _Ranked(NamedTuple):
    """The observed rows scoring at or above the k-th largest score (ties included): their scores and
    positions (slots), and counts against the never-observed score."""

    vals: np.ndarray
    pos: np.ndarray
    nan: int
    gt: int
    eq: int
    floor: float  # every kept score is >= floor

    def top(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots above the r-th largest score and slots equal to it (r <= rows kept; slot order, which
        the callers do not depend on: they order tied prompts by id). The rows kept are often a few
        above the floor plus a large block tied at it, which np.partition handles 10x slower than
        distinct values: the block is set aside first (if fewer than r rows lie above the floor, the
        r-th largest is the floor itself)."""
        higher = self.vals > self.floor
        count = int(np.count_nonzero(higher))
        b = np.partition(self.vals[higher], count - r)[count - r] if count >= r else self.floor
        return self.pos[self.vals > b], self.pos[self.vals == b]

    def at(self, value: float) -> tuple[np.ndarray, np.ndarray]:
        """Slots scoring above `value` and slots equal to it."""
        return self.pos[self.vals > value], self.pos[self.vals == value]


def _rank_observed(ba: BeliefArrays, k: int, weight: float, ref: float) -> _Ranked:
    """The observed rows scoring at or above the k-th largest observed score (all of them when k >= M),
    and the counts against `ref`. Usually one pass (_scan_columns) at a threshold placed by a sample a
    little below the k-th largest, keeping about 2 k + 4 M / sample rows plus any block of ties at the
    threshold; where the sample misled (too few or too many rows at or above it), the exact passes of
    _Source over the same scores."""
    m = ba.observed
    prior = ba.observed_columns()[1]
    weight = float(weight)
    kk = min(k, m)
    if kk == m:
        thr, cap = -math.inf, m
    else:
        size = min(max(m // _RANK_SAMPLE_EVERY, _RANK_SAMPLE_MIN), _RANK_SAMPLE_MAX, m)
        sample = np.empty(size, dtype=np.float64)
        _sample_columns(prior, m, weight, sample)
        rank = min(size, -(-2 * kk * size // m) + _RANK_SAMPLE_MARGIN)
        thr = float(_rank_th_largest(sample, rank))  # NaN is skipped: the scan counts and reports it
        at_or_above = int(np.count_nonzero(sample >= thr))  # ties at thr included
        cap = min(m, 2 * (at_or_above * m // size) + 4096)
    vals = np.empty(cap + _TOP_BLOCK, dtype=np.float64)
    pos = np.empty(cap + _TOP_BLOCK, dtype=np.int64)
    n, nan, gt, eq, ge = _scan_columns(prior, m, weight, thr, ref, vals, pos)
    if nan:
        return _Ranked(vals[:0], pos[:0], int(nan), int(gt), int(eq), thr)
    if n >= 0 and ge >= kk:
        return _Ranked(vals[:n], pos[:n], 0, int(gt), int(eq), thr)
    source = _Source(m, prior=ba.obs_prior[:m], weight=weight)
    scan = source.scan(kk, order_key(ref))
    above, tied, _ = source.top(scan, kk)
    kept = np.concatenate([above, tied])
    return _Ranked(_observed_scores(ba, kept, weight), kept, scan.nan, scan.gt, scan.eq, -math.inf)


def _observed_scores(ba: BeliefArrays, slots: np.ndarray, weight: float) -> np.ndarray:
    out = np.empty(slots.size, dtype=np.float64)
    _column_scores(ba.observed_columns()[1], slots, float(weight), out)
    return out


def _top_observed(ba: BeliefArrays, ranked: _Ranked, r: int, rng: Stream) -> np.ndarray:
    """Slots of the r best observed prompts (r <= M), the tie rule over the tied ones in ascending id
    order."""
    if r == ba.observed:
        return np.arange(r, dtype=np.int64)
    above, tied = ranked.top(r)
    tied_ids = np.sort(ba.obs_ids[tied].astype(np.int64))
    chosen_tied = choose_tied(tied_ids, r - above.size, rng)
    return np.concatenate([above, ba.hmm_slot[chosen_tied].astype(np.int64)])


def dps_select(ba: BeliefArrays, k: int, entropy_weight: float, rng: Stream) -> tuple[np.ndarray, np.ndarray]:
    """docs/methods.md §2 over the whole dataset in O(prompts ever observed + k): the k prompts with the largest
    prior(2) + entropy_weight * H(prior), best first, and their scores (float64). `ba` is a
    BeliefArrays, `rng` the select's "ties" stream.

    Every never-observed prompt has the same score s0 (its prior is exactly uniform), so the dataset is
    the observed set (ranked by one pass over its prior column, no score array; _rank_observed) plus a
    block of N - M copies of s0. With gt / eq the observed prompts scoring above / exactly at s0:

    - gt >= k: the block is not reached; the top k of the observed set, the tie rule of the module
      docstring over its tied prompts in ascending id order.
    - gt + eq + (N - M) < k: the whole block is in; the observed set gives its top k - (N - M).
    - otherwise the boundary is s0: the gt prompts above it are in, and need = k - gt are drawn from the
      tied set, the eq observed ones (ascending id) followed by the block: positions
      rng.child(0).sample(eq + N - M, need); those < eq name observed prompts, and c = the number of
      the others are c never-observed ids drawn uniformly without replacement (rng.child(2): by
      rejection over 0..N-1 while the block holds >= 1/64 of the dataset, else from the listed block).

    The result is ordered as everywhere: descending score, equal scores by rng.child(1).bits_at(id).
    In the first two cases the batch equals the dense rule's (topk_random_ties over all N scores, where
    positions are ids) bit for bit; in the third the subset of the tied set is uniformly random as
    there, but drawn differently, so the batch differs while its distribution is the same.
    """
    n, m = ba.n, ba.observed
    block = n - m
    if not 1 <= k <= n:
        raise ValueError(f"k must lie in [1, {n}] (the number of prompts), got {k}")
    third = np.float32(1.0 / 3.0)
    s0 = float(dps_score3(third, third, third, float(entropy_weight)))  # every never-observed prompt's
    ranked = _rank_observed(ba, k, entropy_weight, s0)
    gt, eq = ranked.gt, ranked.eq
    if ranked.nan:
        raise ValueError("DPS scores contain NaN; the beliefs are corrupt")
    if block == 0 or gt >= k:
        slots = _top_observed(ba, ranked, k, rng)
        ids = ba.obs_ids[slots].astype(np.int64)
        scores = _observed_scores(ba, slots, entropy_weight)
    elif gt + eq + block < k:
        slots = _top_observed(ba, ranked, k - block, rng)
        never = np.flatnonzero(ba.hmm_slot < 0)
        ids = np.concatenate([ba.obs_ids[slots].astype(np.int64), never])
        scores = np.concatenate([_observed_scores(ba, slots, entropy_weight), np.full(block, s0)])
    else:
        above, tied = ranked.at(s0)
        tied_ids = np.sort(ba.obs_ids[tied].astype(np.int64))
        picks = rng.child(0).sample(tied_ids.size + block, k - above.size)
        from_observed = tied_ids[picks[picks < tied_ids.size]]
        from_block = _unobserved(ba, int(np.count_nonzero(picks >= tied_ids.size)), rng)
        slots = np.concatenate([above, ba.hmm_slot[from_observed].astype(np.int64)])
        ids = np.concatenate([ba.obs_ids[slots].astype(np.int64), from_block])
        scores = np.concatenate([_observed_scores(ba, slots, entropy_weight), np.full(from_block.size, s0)])
    order = order_by_score(scores, ids, rng.child(1).bits_at(ids))
    return ids[order], scores[order]


class _PermutationCache:
    """LRU of a few epoch permutations (an epoch permutation of 1e7 ids is 40-80 MB; a walk needs two)."""

    def __init__(self, max_items: int = 4) -> None:
        self._items: OrderedDict[tuple[int, str, int, int], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_items

    def get(self, n: int, key: str, epoch: int, seed: int) -> np.ndarray:
        k = (n, key, epoch, seed)
        with self._lock:
            perm = self._items.get(k)
            if perm is not None:
                self._items.move_to_end(k)
                return perm
        perm = stream(key, epoch, seed, "uniform-epoch").permutation(n)
        perm.setflags(write=False)
        with self._lock:
            self._items[k] = perm
            self._items.move_to_end(k)
            while len(self._items) > self._max:
                self._items.popitem(last=False)
        return perm


_PERMUTATIONS = _PermutationCache()


def epoch_permutation(n: int, key: str, epoch: int, seed: int) -> np.ndarray:
    """The read-only permutation of 0..n-1 for `epoch`: stream(key, epoch, seed, "uniform-epoch")'s
    Fisher-Yates permutation (int32 below 2^31 prompts)."""
    return _PERMUTATIONS.get(n, key, epoch, seed)


def _check_walk(n: int, batch: int, step: int) -> None:
    if n < 1 or not 1 <= batch <= n:
        raise ValueError(f"batch size must lie in [1, n={n}], got {batch}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")


def uniform_batch(n: int, batch: int, step: int, seed: int, key: str) -> np.ndarray:
    """docs/methods.md §4 `uniform`: global positions step*batch .. step*batch + batch - 1 of the concatenated
    per-epoch permutations (epoch e's from stream(key, e, seed, "uniform-epoch")).

    A batch that crosses an epoch boundary takes the tail of epoch e, then walks epoch e+1 from its
    start, skipping ids already in the tail, until it has `batch` distinct ids (ours). So a few ids at
    a boundary can be drawn in two consecutive batches and a few skipped in epoch e+1 (at most
    batch - 1 each); everywhere else every id appears exactly once per epoch.
    """
    _check_walk(n, batch, step)
    start = step * batch
    epoch, offset = divmod(start, n)
    perm = epoch_permutation(n, key, epoch, seed)
    if offset + batch <= n:
        return perm[offset : offset + batch].astype(np.int64)
    tail = perm[offset:].astype(np.int64)
    head = epoch_permutation(n, key, epoch + 1, seed)[:batch].astype(np.int64)
    head = head[~np.isin(head, tail)]  # at most tail.size repeats among the first `batch`
    return np.concatenate([tail, head[: batch - tail.size]])


def history_batch(n: int, batch: int, step: int, seed: int, key: str, last_state: np.ndarray) -> np.ndarray:
    """docs/methods.md §4 `history_resampling` (SRPO): the `uniform_batch` walk from position step*batch,
    skipping prompts whose latest result was SOLVED (last_state == 3), continuing into the following
    epoch's permutation when needed (ours: the walk covers epoch e's tail and all of epoch e+1, so it
    meets every id).

    If fewer than `batch` distinct prompts are eligible, the batch is completed with solved prompts in
    walk order (ours: a batch always has `batch` distinct ids). Skipping means consecutive batches can
    share a few prompts; the walk stays a pure function of its arguments.
    """
    _check_walk(n, batch, step)
    last_state = np.asarray(last_state)
    if last_state.shape != (n,):
        raise ValueError(f"last_state must have shape ({n},), got {last_state.shape}")
    epoch, offset = divmod(step * batch, n)
    eligible = last_state != SOLVED
    picked: list[np.ndarray] = []
    count = 0
    # Walk in growing slices: the tail of epoch e, then epoch e+1 (ids of the tail already seen removed).
    tail = epoch_permutation(n, key, epoch, seed)[offset:]
    nxt = epoch_permutation(n, key, epoch + 1, seed)
    segments = [tail, nxt]
    seen = None
    chunk = max(4 * batch, 4096)
    for seg_index, seg in enumerate(segments):
        pos = 0
        while pos < seg.size and count < batch:
            part = seg[pos : pos + chunk].astype(np.int64)
            pos += part.size
            chunk *= 2
            if seg_index == 1 and tail.size:
                if seen is None:
                    seen = np.zeros(n, dtype=bool)
                    seen[tail] = True
                part = part[~seen[part]]
            part = part[eligible[part]]
            picked.append(part[: batch - count])
            count += picked[-1].size
        if count >= batch:
            break
    ids = np.concatenate(picked) if picked else np.empty(0, dtype=np.int64)
    if ids.size < batch:  # fewer eligible prompts than the batch: fill with solved ones, in walk order
        walk = np.concatenate([tail, nxt[~np.isin(nxt, tail)]]).astype(np.int64)
        solved = walk[~eligible[walk]]
        ids = np.concatenate([ids, solved[: batch - ids.size]])
    return ids


def mopps_threshold_select(
    draws: np.ndarray,
    candidates: np.ndarray | None,
    k: int,
    rng: Stream,
    low: float = 0.3,
    high: float = 0.7,
) -> np.ndarray:
    """MoPPS `threshold` variant (docs/methods.md §1.2): k ids from `candidates` (None: positions in
    `draws`), chosen uniformly at random among those whose draw lies in [low, high]; if fewer than k do,
    the rest are the candidates closest to the band (distance to the nearer edge; ties at random).
    In-band ids come first, in random order."""
    draws = np.asarray(draws, dtype=np.float64)
    if candidates is not None:
        candidates = np.asarray(candidates, dtype=np.int64)
    if draws.ndim != 1 or (candidates is not None and draws.shape != candidates.shape):
        raise ValueError("draws and candidates must be 1-d arrays of one length")
    if not low <= high:
        raise ValueError(f"the band needs low <= high, got [{low}, {high}]")
    distance = np.maximum(low - draws, 0.0) + np.maximum(draws - high, 0.0)
    pos = topk_random_ties(-distance, k, rng)
    chosen: np.ndarray = pos if candidates is None else candidates[pos]
    return chosen
