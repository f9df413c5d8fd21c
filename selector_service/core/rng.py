"""Counter-based random numbers: every random choice of selection comes from here (ours).

Batches must be a function of the project's code and the log alone: two replicas on different numpy
versions (a rolling upgrade) must hand two ranks of one trainer the same batch. numpy does not promise
that `Generator.beta`, `choice` or `permutation` draw the same values across versions, so selection uses
none of them. Everything here is integer arithmetic we define, plus log, log1p, exp and sqrt (IEEE sqrt
is exact; the others come from the platform's C math library, which the Python twin in tests/core/naive.py
calls too).

How to use it (the API)
-----------------------
    s = stream(key, step, seed, "my-purpose")   # a Stream: 64-bit id from (key, step, seed, purpose)
    s.uniforms(count, start=0)                  # float64 in [0, 1), outputs start .. start+count-1
    s.uniforms_at(indices)                      # the same values, for any indices (any order)
    s.integers(bound, count, start=0)           # int64, exactly uniform in [0, bound)
    s.beta(alpha, beta, items)                  # one Beta(alpha[i], beta[i]) draw per item id items[i]
    s.sample(n, k)                              # k distinct ids of 0..n-1, uniform, in random order
    s.permutation(n)                            # a uniformly random permutation of 0..n-1
    s.child(j)                                  # an independent Stream for sub-task j

Pick one purpose string per kind of choice (the selection code uses "candidates", "ties", "thompson"
and "uniform-epoch"); a new strategy takes its own purposes, e.g. "sec-categories". Values are pure
functions of (stream, index): no state is kept, values can be computed in any order and in parallel,
and the same call gives the same values in every process. Draws that belong to an item (a prompt) are
keyed by the item's id (`beta`), so a prompt's draw does not depend on which other prompts are asked
for. From numba code, use the kernels directly: `bits`, `uniform`, `uniform_open`, `bounded`, `child`,
`beta_draw`.

The construction
----------------
Stream id: the first 8 bytes (little-endian) of blake2b-128 over len(key) (8 bytes LE), key (UTF-8),
len(purpose), purpose, step (8 bytes LE) and seed mod 2^64 (8 bytes LE); Python's `hash` is salted per
process, blake2b is not.

Output i of stream s is output i of SplitMix64 (Steele, Lea and Flood, 2014) seeded with s:

    bits(s, i) = mix64(s + (i + 1) * 0x9E3779B97F4A7C15 mod 2^64)
    mix64(z):  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
               return z ^ (z >> 31)                                     (all mod 2^64)

SplitMix64 passes BigCrush; two streams with random ids overlap within L outputs with probability
~2L / 2^64 (Weyl sequences with one increment), negligible here.

- child(s, j) = bits(s ^ 0x5851F42D4C957F2D, j): the stream of item j.
- uniform(s, i) = (bits(s, i) >> 11) * 2^-53 in [0, 1); uniform_open adds 2^-54: in (0, 1).
- bounded(s, i, m), exactly uniform in [0, m): Lemire's multiply-shift, hi64(x * m), rejecting the
  (rare: probability < m / 2^64) x whose low word lo64(x * m) < (2^64 - m) mod m; attempt 0 uses
  x = bits(s, i), attempt r >= 1 uses bits(child(s, i), r - 1).
- sample(s, n, k): when 4k < n, Floyd's algorithm (iteration j = n-k .. n-1 draws
  t = bounded(child(s, 0), j, j + 1) and takes t, or j when t is taken; an open-addressing hash set, O(k)
  time and memory whatever n), then a Fisher-Yates shuffle of the k ids in the order taken
  (for i = k-1 .. 1 swap i with bounded(child(s, 1), i, i + 1)). When 4k >= n, a partial Fisher-Yates
  over 0..n-1 (for i = 0 .. k-1 swap i with i + bounded(child(s, 2), i, n - i)), O(n) = O(k).
  Both give every ordered k-subset the same probability.
- permutation(s, n): Fisher-Yates over 0..n-1, for i = n-1 .. 1 swap i with bounded(s, i, i + 1).
- beta_draw(s, a, b, item): X ~ Gamma(a), then Y ~ Gamma(b), both from the outputs 0, 1, 2, ... of
  child(s, item) in that order, and B = X / (X + Y) computed as 1 / (1 + exp(ln Y - ln X)), so no
  parameter in the accepted domain (domain.py) overflows or underflows it into NaN. Gamma(a) for a >= 1
  is Marsaglia and Tsang's method (ACM TOMS 26(3), 2000): d = a - 1/3, c = 1 / sqrt(9d); repeat
  x ~ N(0, 1), t = 1 + c x (t > 0), v = t^3, u ~ U(0, 1) until u < 1 - 0.0331 x^4 or
  ln u < x^2 / 2 + d (1 - v + ln v); return ln d + 3 log1p(c x). For a < 1: Gamma(a + 1) U^(1/a), i.e.
  ln X = ln Gamma(a + 1) + ln(U) / a. The normal is Marsaglia's polar method (u1, u2 = 2U - 1 from two
  consecutive outputs, rejected unless 0 < q = u1^2 + u2^2 < 1; x = u1 sqrt(-2 ln q / q); u2's twin is
  not used). 1 - v + ln v is evaluated as 3 (log1p(y) - y) - 3 y^2 - y^3 with y = c x and a series for
  log1p(y) - y at |y| < 1/64, so that d (1 - v + ln v) keeps its digits when d is huge.
  tests/core/test_rng.py checks the draws against scipy's Beta CDF (Kolmogorov-Smirnov) at a fixed seed.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

__all__ = [
    "Stream",
    "beta_draw",
    "bits",
    "bounded",
    "child",
    "stream",
    "stream_id",
    "uniform",
    "uniform_open",
]

_U64_MASK = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_CHILD = np.uint64(0x5851F42D4C957F2D)
_ONE = np.uint64(1)
_M32 = np.uint64(0xFFFFFFFF)
_S11 = np.uint64(11)
_S27 = np.uint64(27)
_S30 = np.uint64(30)
_S31 = np.uint64(31)
_S32 = np.uint64(32)
_TWO_M53 = 1.0 / 9007199254740992.0  # 2^-53
_HALF_ULP = 0.5 / 9007199254740992.0  # 2^-54
_NO_ID = -1


# ---------------------------------------------------------------- scalar kernels (numba)


@numba.njit(nogil=True, cache=True, inline="always")
def _mix64(z: np.uint64) -> np.uint64:
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@numba.njit(nogil=True, cache=True, inline="always")
def bits(s: int | np.uint64, i: int | np.integer[Any]) -> np.uint64:
    """Output i (uint64) of stream s: SplitMix64 seeded with s."""
    return _mix64(np.uint64(s) + (np.uint64(i) + _ONE) * _GOLDEN)


@numba.njit(nogil=True, cache=True, inline="always")
def child(s: int | np.uint64, j: int | np.integer[Any]) -> np.uint64:
    """The stream id of item j of stream s."""
    return bits(np.uint64(s) ^ _CHILD, j)


@numba.njit(nogil=True, cache=True, inline="always")
def uniform(s: int | np.uint64, i: int | np.integer[Any]) -> float:
    """float64 in [0, 1) from output i of stream s (53 random bits)."""
    return np.float64(bits(s, i) >> _S11) * _TWO_M53


@numba.njit(nogil=True, cache=True, inline="always")
def uniform_open(s: int | np.uint64, i: int | np.integer[Any]) -> float:
    """float64 in (0, 1) from output i of stream s (53 random bits, centred: never 0 or 1)."""
    return np.float64(bits(s, i) >> _S11) * _TWO_M53 + _HALF_ULP


@numba.njit(nogil=True, cache=True, inline="always")
def _mulhi(a: np.uint64, b: np.uint64) -> np.uint64:
    """High 64 bits of the 128-bit product a * b (uint64)."""
    a_lo = a & _M32
    a_hi = a >> _S32
    b_lo = b & _M32
    b_hi = b >> _S32
    p0 = a_lo * b_lo
    p1 = a_lo * b_hi
    p2 = a_hi * b_lo
    p3 = a_hi * b_hi
    mid = (p0 >> _S32) + (p1 & _M32) + (p2 & _M32)
    return p3 + (p1 >> _S32) + (p2 >> _S32) + (mid >> _S32)


@numba.njit(nogil=True, cache=True)
def bounded(s: int | np.uint64, i: int | np.integer[Any], m: int | np.integer[Any]) -> np.int64:
    """int64 exactly uniform in [0, m) (1 <= m < 2^63) for index i of stream s (Lemire, with rejection)."""
    mm = np.uint64(m)
    x = bits(s, i)
    lo = x * mm
    if lo < mm:
        threshold = (np.uint64(0) - mm) % mm
        sub = child(s, i)
        r = 0
        while lo < threshold:
            x = bits(sub, r)
            lo = x * mm
            r += 1
    return np.int64(_mulhi(x, mm))


@numba.njit(nogil=True, cache=True, inline="always")
def _log1p_minus_x(y: float) -> float:
    """log1p(y) - y, accurate also for tiny |y| (series below 1/64)."""
    if abs(y) >= 0.015625:
        return math.log1p(y) - y
    # -y^2/2 + y^3/3 - ... - y^10/10 (the next term is < 2^-60 y^2)
    return (
        y
        * y
        * (
            -0.5
            + y
            * (
                1.0 / 3.0
                + y
                * (
                    -0.25
                    + y
                    * (0.2 + y * (-1.0 / 6.0 + y * (1.0 / 7.0 + y * (-0.125 + y * (1.0 / 9.0 + y * -0.1)))))
                )
            )
        )
    )


@numba.njit(nogil=True, cache=True)
def _log_gamma_draw(s: np.uint64, c: int, a: float) -> tuple[float, int]:
    """ln X for X ~ Gamma(a, 1), from outputs c, c+1, ... of stream s; returns (ln X, next output)."""
    boost = a < 1.0
    shape = a + 1.0 if boost else a
    d = shape - 1.0 / 3.0
    cc = 1.0 / math.sqrt(9.0 * d)
    while True:
        while True:  # Marsaglia's polar method: one standard normal x
            u1 = 2.0 * uniform(s, c) - 1.0
            u2 = 2.0 * uniform(s, c + 1) - 1.0
            c += 2
            q = u1 * u1 + u2 * u2
            if q > 0.0 and q < 1.0:
                break
        x = u1 * math.sqrt(-2.0 * math.log(q) / q)
        y = cc * x
        if y <= -1.0:
            continue
        u = uniform_open(s, c)
        c += 1
        x2 = x * x
        if u < 1.0 - 0.0331 * (x2 * x2):
            break
        # 1 - v + ln v with v = (1 + y)^3, without cancelling two ~1 terms when d is huge
        if math.log(u) < 0.5 * x2 + d * (3.0 * _log1p_minus_x(y) - y * y * (3.0 + y)):
            break
    log_x = math.log(d) + 3.0 * math.log1p(y)
    if boost:
        log_x += math.log(uniform_open(s, c)) / a
        c += 1
    return log_x, c


@numba.njit(nogil=True, cache=True)
def beta_draw(s: int | np.uint64, a: float, b: float, item: int | np.integer[Any]) -> float:
    """One Beta(a, b) draw for `item` of stream s (a, b > 0 finite), from child(s, item)'s outputs."""
    sub = child(s, item)
    log_x, c = _log_gamma_draw(sub, 0, a)
    log_y, _ = _log_gamma_draw(sub, c, b)
    return 1.0 / (1.0 + math.exp(log_y - log_x))


# ---------------------------------------------------------------- array kernels (numba)


@numba.njit(nogil=True, cache=True)
def _bits_at(s: np.uint64, index: npt.NDArray[np.uint64], out: npt.NDArray[np.uint64]) -> None:
    for i in range(index.size):
        out[i] = bits(s, index[i])


@numba.njit(nogil=True, cache=True)
def _uniforms_at(s: np.uint64, index: npt.NDArray[np.uint64], out: npt.NDArray[np.float64]) -> None:
    for i in range(index.size):
        out[i] = uniform(s, np.uint64(index[i]))


@numba.njit(nogil=True, cache=True)
def _integers_at(s: np.uint64, index: npt.NDArray[np.uint64], bound: int, out: npt.NDArray[np.int64]) -> None:
    for i in range(index.size):
        out[i] = bounded(s, index[i], bound)


@numba.njit(nogil=True, cache=True)
def _beta_many(
    s: np.uint64,
    alpha: npt.NDArray[np.float64],
    beta: npt.NDArray[np.float64],
    items: npt.NDArray[np.uint64],
    out: npt.NDArray[np.float64],
) -> None:
    for i in range(out.size):
        out[i] = beta_draw(s, alpha[i], beta[i], np.uint64(items[i]))


@numba.njit(nogil=True, cache=True)
def _hash_slot(x: int | np.integer[Any], shift: np.uint64) -> np.int64:
    return np.int64((np.uint64(x) * _GOLDEN) >> shift)


@numba.njit(nogil=True, cache=True)
def _sample_floyd(s: np.uint64, n: int, k: int, out: npt.NDArray[np.int64]) -> None:
    """Floyd's k distinct ids of [0, n) (in the order taken), then a Fisher-Yates shuffle."""
    cap = 16
    log2 = 4
    while cap < 2 * k:
        cap *= 2
        log2 += 1
    shift = np.uint64(64 - log2)
    mask = cap - 1
    table = np.full(cap, _NO_ID, dtype=np.int64)
    pick = child(s, 0)
    for idx in range(k):
        j: int | np.int64 = n - k + idx
        t: int | np.int64 = bounded(pick, np.uint64(j), j + 1)
        # insert t; if present, insert j instead (j is never present: every id taken so far is < j)
        slot = _hash_slot(t, shift)
        while table[slot] != _NO_ID and table[slot] != t:
            slot = (slot + 1) & mask
        if table[slot] == t:
            t = j
            slot = _hash_slot(t, shift)
            while table[slot] != _NO_ID:
                slot = (slot + 1) & mask
        table[slot] = t
        out[idx] = t
    shuffle = child(s, 1)
    for i in range(k - 1, 0, -1):
        j = bounded(shuffle, np.uint64(i), i + 1)
        tmp = out[i]
        out[i] = out[j]
        out[j] = tmp


@numba.njit(nogil=True, cache=True)
def _sample_partial_fisher_yates(s: np.uint64, n: int, k: int, out: npt.NDArray[np.int64]) -> None:
    ids = np.arange(n, dtype=np.int64)
    swap = child(s, 2)
    for i in range(k):
        j = i + bounded(swap, np.uint64(i), n - i)
        tmp = ids[i]
        ids[i] = ids[j]
        ids[j] = tmp
        out[i] = ids[i]


@numba.njit(nogil=True, cache=True)
def _permute(s: np.uint64, perm: npt.NDArray[np.int32] | npt.NDArray[np.int64]) -> None:
    n = perm.size
    for i in range(n):
        perm[i] = i
    for i in range(n - 1, 0, -1):
        j = bounded(s, np.uint64(i), i + 1)
        tmp = perm[i]
        perm[i] = perm[j]
        perm[j] = tmp


# ---------------------------------------------------------------- the Python API


def _check_u64(name: str, value: object, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if not low <= value <= _U64_MASK:
        raise ValueError(f"{name} must be an integer in [{low}, 2^64), got {value!r}")
    return value


def stream_id(key: str, step: int, seed: int, purpose: str) -> int:
    """The 64-bit stream id of (key, step, seed, purpose); see the module docstring.

    `step` must lie in [0, 2^64); `seed` may be any integer (taken modulo 2^64).
    """
    if not isinstance(key, str) or not isinstance(purpose, str):
        raise TypeError("key and purpose must be strings")
    step = _check_u64("step", step)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    h = hashlib.blake2b(digest_size=16)
    for part in (key, purpose):
        raw = part.encode("utf-8")
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    h.update(step.to_bytes(8, "little"))
    h.update((int(seed) & _U64_MASK).to_bytes(8, "little"))
    return int.from_bytes(h.digest()[:8], "little")


class Stream:
    """A stream of random values, a pure function of its 64-bit id (see the module docstring)."""

    __slots__ = ("id",)

    def __init__(self, stream_id: int) -> None:
        self.id = _check_u64("stream id", stream_id)

    def __repr__(self) -> str:
        return f"Stream(0x{self.id:016x})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def _u64(self) -> np.uint64:
        return np.uint64(self.id)

    def child(self, j: int) -> Stream:
        """An independent stream for item or sub-task j (j in [0, 2^64))."""
        return Stream(int(child(self._u64, np.uint64(_check_u64("j", j)))))

    def bits(self, count: int, start: int = 0) -> np.ndarray:
        """uint64 outputs start .. start+count-1."""
        return self.bits_at(_index_range(start, count))

    def bits_at(self, index: np.ndarray) -> np.ndarray:
        """uint64 outputs at `index` (any non-negative integers, any order)."""
        index = _index(index)
        out = np.empty(index.size, dtype=np.uint64)
        _bits_at(self._u64, index, out)
        return out

    def uniforms(self, count: int, start: int = 0) -> np.ndarray:
        """float64 in [0, 1) from outputs start .. start+count-1."""
        return self.uniforms_at(_index_range(start, count))

    def uniforms_at(self, index: np.ndarray) -> np.ndarray:
        """float64 in [0, 1) from the outputs at `index` (any non-negative integers, any order)."""
        index = _index(index)
        out = np.empty(index.size, dtype=np.float64)
        _uniforms_at(self._u64, index, out)
        return out

    def integers(self, bound: int, count: int, start: int = 0) -> np.ndarray:
        """int64 exactly uniform in [0, bound), from indices start .. start+count-1."""
        if isinstance(bound, bool) or not isinstance(bound, int | np.integer) or not 1 <= bound < 2**63:
            raise ValueError(f"bound must be an integer in [1, 2^63), got {bound!r}")
        out = np.empty(_count(count), dtype=np.int64)
        _integers_at(self._u64, _index_range(start, count), int(bound), out)
        return out

    def beta(self, alpha: np.ndarray, beta: np.ndarray, items: np.ndarray) -> np.ndarray:
        """One Beta(alpha[i], beta[i]) draw per item id items[i] (float64 in [0, 1]); the draw of an item
        depends only on (stream, item, alpha, beta), not on the other items asked for."""
        alpha = np.ascontiguousarray(alpha, dtype=np.float64)
        beta = np.ascontiguousarray(beta, dtype=np.float64)
        items = np.asarray(items)
        if alpha.ndim != 1 or alpha.shape != beta.shape or items.shape != alpha.shape:
            raise ValueError("alpha, beta and items must be 1-d arrays of one length")
        if items.size and (not np.issubdtype(items.dtype, np.integer) or int(items.min()) < 0):
            raise ValueError("items must be non-negative integers")
        with np.errstate(over="ignore"):
            if alpha.size and not (
                np.all(alpha > 0) and np.all(beta > 0) and np.all(np.isfinite(alpha + beta))
            ):
                raise ValueError("Beta parameters must be > 0 with a finite sum")
        out = np.empty(alpha.size, dtype=np.float64)
        _beta_many(self._u64, alpha, beta, np.ascontiguousarray(items, dtype=np.uint64), out)
        return out

    def sample(self, n: int, k: int) -> np.ndarray:
        """k distinct ids of 0..n-1 (int64), uniformly at random, in uniformly random order."""
        n, k = _count(n), _count(k)
        if k > n:
            raise ValueError(f"cannot draw {k} distinct ids from {n}")
        out = np.empty(k, dtype=np.int64)
        if k == 0:
            return out
        if 4 * k < n:
            _sample_floyd(self._u64, n, k, out)
        else:
            _sample_partial_fisher_yates(self._u64, n, k, out)
        return out

    def permutation(self, n: int) -> np.ndarray:
        """A uniformly random permutation of 0..n-1 (int32 when n < 2^31, else int64)."""
        n = _count(n)
        perm = np.empty(n, dtype=np.int32) if n < 2**31 else np.empty(n, dtype=np.int64)
        _permute(self._u64, perm)
        return perm


def _index(index: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    index = np.asarray(index)
    if index.ndim != 1 or not (np.issubdtype(index.dtype, np.integer) or index.size == 0):
        raise ValueError("index must be a 1-d array of integers")
    if index.size and np.issubdtype(index.dtype, np.signedinteger) and int(index.min()) < 0:
        raise ValueError("index must be >= 0")
    return np.ascontiguousarray(index, dtype=np.uint64)


def _index_range(start: int, count: int) -> npt.NDArray[np.uint64]:
    start, count = _check_u64("start", start), _count(count)
    if start + count > _U64_MASK + 1:
        raise ValueError("start + count must not exceed 2^64")
    return np.arange(start, start + count, dtype=np.uint64)


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"expected an integer >= 0, got {value!r}")
    return int(value)


def stream(key: str, step: int, seed: int, purpose: str) -> Stream:
    """The Stream of (key, step, seed, purpose): the same values in every process and version."""
    return Stream(stream_id(key, step, seed, purpose))
