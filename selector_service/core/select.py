"""Seeded selection primitives: candidate pools, top-k with random ties, epoch walks.

Every random choice comes from the project's counter-based generator (rng.py): `stream(key, step, seed,
purpose)` gives the same values in every process, replica and numpy version.

- `candidate_pool`: distinct ids uniformly at random (METHODS 1.1: the pool of min(ratio * B, N)).
- `topk_random_ties`: the k largest scores; every order among equal scores is uniformly random
  (METHODS 1.1 and 2 require random tie-breaking: DPS has thousands of prompts tied at 1/3).
- `uniform_batch` (METHODS 4): a seeded permutation per epoch, walked B at a time.
- `history_batch` (METHODS 4, SRPO): the same walk skipping prompts whose latest result was solved.
- `mopps_threshold_select` (METHODS 1.2, variant `threshold`).

The tie rule (defined once, here; tests/naive.topk_random_ties is its literal twin): with b the k-th
largest score, every score > b is taken; of the t positions whose score equals b (in ascending
position order) the `need` = k - #above ones at `stream.child(0).sample(t, need)` are taken (all of
them when need = t); the result is sorted by descending score, equal scores by the random key
`stream.child(1).bits_at(position)` (then by position, which two distinct 64-bit keys never need).
So which tied positions get in is a uniformly random subset and their order a uniformly random order.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numba
import numpy as np

from .outcomes import SOLVED
from .rng import Stream, stream

__all__ = [
    "candidate_pool",
    "epoch_permutation",
    "history_batch",
    "kth_largest",
    "mopps_threshold_select",
    "order_by_score",
    "topk_random_ties",
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
_DIGIT = np.uint64(0xFFFF)


@numba.njit(nogil=True, cache=True, inline="always")
def _order_key(x, bits):
    """uint64 that sorts like the float x (bits = x's bit pattern); -0.0 is keyed as +0.0.

    Branch-free (negatives flip every bit, the rest only the sign bit): a data-dependent branch on the
    sign costs ~3x on scores of mixed sign.
    """
    flip = (np.uint64(0) - (bits >> np.uint64(63))) | _SIGN
    key = bits ^ flip
    return _SIGN if x == 0.0 else key


@numba.njit(nogil=True, cache=True)
def _kth_largest_key(scores, bits, k):
    """Order-preserving uint64 key of the k-th largest of `scores` (1 <= k <= n, no NaN).

    Radix select on 16-bit digits, most significant first: a histogram of the candidates' current
    digit finds the digit of the k-th largest, the candidates are narrowed to it, and the search stops
    as soon as all candidates are equal. At most four passes over shrinking candidate sets and no
    pivots, so it is O(n) whatever the input; a block of equal scores (DPS: most prompts at exactly
    1/3) costs two passes over the scores. `bits` is `scores` viewed as uint64. The key of x is
    bits | sign for x >= 0 and ~bits for x < 0, so keys sort like the values.
    """
    n = scores.size
    hist = np.zeros(65536, dtype=np.int64)
    for i in range(n):
        hist[_order_key(scores[i], bits[i]) >> np.uint64(48)] += 1
    cand = np.empty(0, dtype=np.uint64)
    count = n
    remaining = k
    for level in range(4):
        shift = np.uint64(48 - 16 * level)
        if level > 0:
            hist[:] = 0
            for i in range(count):
                hist[(cand[i] >> shift) & _DIGIT] += 1
        above = 0
        digit = 65535
        while above + hist[digit] < remaining:
            above += hist[digit]
            digit -= 1
        remaining -= above
        wanted = np.uint64(digit)  # compare uint64 with uint64 (numba would mix uint64/int64 via float64)
        # narrow the candidates to those with this digit (level 0 reads the scores themselves)
        kept = 0
        if level == 0:
            cand = np.empty(hist[digit], dtype=np.uint64)
            for i in range(n):
                c = _order_key(scores[i], bits[i])
                if (c >> shift) == wanted:
                    cand[kept] = c
                    kept += 1
        else:
            for i in range(count):
                c = cand[i]
                if ((c >> shift) & _DIGIT) == wanted:
                    cand[kept] = c
                    kept += 1
        count = kept
        low = cand[0]
        high = cand[0]
        for i in range(1, count):
            low = min(low, cand[i])
            high = max(high, cand[i])
        if low == high:
            break
    return cand[0]


def _key_to_value(key) -> float:
    bits = np.uint64(key)
    bits = bits ^ _SIGN if bits & _SIGN else ~bits
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


def kth_largest(scores: np.ndarray, k: int) -> float:
    """The k-th largest value of a float64 array without NaN (1 <= k <= n), in O(n) for any input."""
    scores = np.ascontiguousarray(scores, dtype=np.float64)
    return _key_to_value(_kth_largest_key(scores, scores.view(np.uint64), int(k)))


def order_by_score(scores: np.ndarray, positions: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """`positions` sorted by descending scores[positions], equal scores by ascending `keys` (uint64),
    then by position: a total order, so any correct sort gives the same result."""
    return positions[np.lexsort((positions, keys, -scores[positions]))]


def topk_random_ties(scores: np.ndarray, k: int, rng: Stream) -> np.ndarray:
    """Positions (int64) of the k largest `scores`, ordered by score descending; the tie rule of the
    module docstring (uniformly random among equal scores, at the boundary and inside the result).

    O(n) for any input: a radix select for the k-th largest value (numpy's introselect slows down
    10-30x on some arrangements of a large block of equal scores), one pass each for the positions
    above it and tied with it; only the (at most k) chosen ones are sorted. NaN scores are rejected.
    """
    scores = np.ascontiguousarray(scores, dtype=np.float64)
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-d, got shape {scores.shape}")
    n = scores.size
    if not 0 <= k <= n:
        raise ValueError(f"k must lie in [0, {n}] (the number of scores), got {k}")
    if k == 0:
        return np.empty(0, dtype=np.int64)
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN; every candidate needs a comparable score")
    if k == n:
        chosen = np.arange(n, dtype=np.int64)
    else:
        boundary = kth_largest(scores, k)
        above = np.flatnonzero(scores > boundary)
        tied = np.flatnonzero(scores == boundary)
        need = k - above.size
        if need < tied.size:
            tied = tied[rng.child(0).sample(tied.size, need)]
        chosen = np.concatenate([above, tied])
    return order_by_score(scores, chosen, rng.child(1).bits_at(chosen))


class _PermutationCache:
    """LRU of a few epoch permutations (an epoch permutation of 1e7 ids is 40-80 MB; a walk needs two)."""

    def __init__(self, max_items: int = 4) -> None:
        self._items: OrderedDict[tuple, np.ndarray] = OrderedDict()
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
    """METHODS 4 `uniform`: global positions step*batch .. step*batch + batch - 1 of the concatenated
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
    """METHODS 4 `history_resampling` (SRPO): the `uniform_batch` walk from position step*batch,
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
    candidates: np.ndarray,
    k: int,
    rng: Stream,
    low: float = 0.3,
    high: float = 0.7,
) -> np.ndarray:
    """MoPPS `threshold` variant (METHODS 1.2): k ids from `candidates`, chosen uniformly at random among
    those whose draw lies in [low, high]; if fewer than k do, the rest are the candidates closest to the
    band (distance to the nearer edge; ties at random). In-band ids come first, in random order."""
    draws = np.asarray(draws, dtype=np.float64)
    candidates = np.asarray(candidates, dtype=np.int64)
    if draws.shape != candidates.shape or draws.ndim != 1:
        raise ValueError("draws and candidates must be 1-d arrays of one length")
    if not low <= high:
        raise ValueError(f"the band needs low <= high, got [{low}, {high}]")
    distance = np.maximum(low - draws, 0.0) + np.maximum(draws - high, 0.0)
    return candidates[topk_random_ties(-distance, k, rng)]
