"""INSIGHT's weighted mutual information (docs/methods.md §1.1): I_K, the weight w(m) and the score A = w * I_K.

For Beta(a, b), n = a + b, m = a / n and K rollouts (docs/methods.md §1.1):

    H(a, b)  = ln B(a, b) - (a-1) psi(a) - (b-1) psi(b) + (n-2) psi(n)           (Beta entropy, nats)
    P(s)     = C(K, s) B(a+s, b+K-s) / B(a, b),  s = 0..K                         (beta-binomial)
    I_K      = H(a, b) - sum_s P(s) H(a+s, b+K-s)
    w(m)     = m (1 - m) exp(-eta (m - mu)^2),   A = w(m) * I_K

How the kernel evaluates I_K (ours; algebraically identical). The mutual information is the expected
divergence of the posterior from the prior, I_K = sum_s P(s) KL(Beta(a+s, b+K-s) || Beta(a, b)), and
with r(x) = psi(x) - ln x (special.psi_minus_log) each divergence regroups exactly into

    KL_s = G(a, s) + G(b, K-s) - G(n, K),
    G(x, t) = sum_{j<t} [psi(x+t) - ln(x+j)] = sum_{s<t} [(s+1) / (x+s) + r(x+s)]

(the second form of G follows from psi(y+1) = psi(y) + 1/y; every ln n of the textbook formula has
cancelled symbolically). So

    I_K = sum_s P(s) [G(a, s) + G(b, K-s)] - G(n, K).

Every G term is a sum of terms of one size (G(x, t) ~ t^2 / (2x) for large x, ~ ln(t / x) for tiny x),
so nothing of size ln n or 1/min(a, b) cancels: the only cancellation left is the final difference, of
terms ~K^2 / (2n) into a result ~K / (2n), which costs a factor ~K, not n. r(y) for y >= 10 is the
asymptotic series evaluated from 1/y (no division), below 10 it is stepped up from r(x+1) with
r(y+1) = r(y) + 1/y - log1p(1/y); for small x the first term 1/x + r(x) is formed as
r(x+1) + log1p(1/x), so the two ~1/x parts never meet. P(s) comes from the ratio P(s+1)/P(s) = (K-s)/(s+1) (a+s)/(b+K-s-1),
started at the end that cannot underflow: P(K) = prod_j (a+j)/(n+j) when a >= b, else
P(0) = prod_j (b+j)/(n+j) (each factor >= 1/2, so the start is >= 2^-K; the recurrence runs on
P * 2^(K//2), an exact power-of-two scaling, so K up to 1024 neither underflows nor overflows; each
ratio is formed before it multiplies P, so a or b up to ~1e307 cannot overflow it). The reciprocals
1/(a+j), 1/(b+j), 1/(n+j) serve the ratios, the G sums and the series: 3K divisions, no logarithm for
arguments >= 10, one log1p per step below.

Accuracy (tests/core/test_numeric_domain.py, against mpmath at 40 + 2 log10(n) digits): relative error
below 5e-14 K (1 + 1 / min(a, b)) over the whole accepted domain (a, b from 1e-3 up to 1e300 and beyond,
as long as a + b is finite; the 1 / min(a, b) comes from G(b, K) - G(a + b, K) when a is tiny),
including large n, where I_K ~ K / (2n) would be lost entirely by the textbook regrouping
(whose relative error grows like n * 1e-16). Large-n limit (checked in tests): I_K -> 0.5 ln(1 + K/n).
K_MAX = 1024.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import numpy.typing as npt
from numba import prange

from ._parallel import CHUNK, PARALLEL_MIN, launch
from .domain import K_MAX as DOMAIN_K_MAX
from .special import SERIES_FROM, asymptotic_tail_inv, psi_minus_log

__all__ = ["K_MAX", "mutual_information", "wmi_scores", "wmi_weight"]

#: Largest rollout count K accepted by the kernels (the scaled P(s) start value stays a normal float).
K_MAX = DOMAIN_K_MAX


@numba.njit(nogil=True, cache=True, inline="always")
def _g_table(x: float, k: int, inv: npt.NDArray[np.float64], g: npt.NDArray[np.float64]) -> None:
    """g[t] = G(x, t) = sum_{s<t} [(s+1) / (x+s) + r(x+s)] for t = 0..k, given inv[s] = 1 / (x+s).

    For small x the s = 0 term 1/x + r(x) would cancel two ~1/x terms; it is formed as
    r(x+1) + log1p(1/x) instead (psi(x+1) = psi(x) + 1/x), which has no cancellation.
    """
    g[0] = 0.0
    small = x < SERIES_FROM
    if small:
        r = psi_minus_log(x + 1.0)  # r(x + 1), the r of the step s = 1
        acc = r + math.log1p(inv[0])
    else:
        r = 0.0
        acc = inv[0] + asymptotic_tail_inv(inv[0])
    g[1] = acc
    for s in range(1, k):
        y = x + s
        q = inv[s]
        if y >= SERIES_FROM:
            r = asymptotic_tail_inv(q)
        acc += (s + 1) * q + r
        g[s + 1] = acc
        if y + 1.0 < SERIES_FROM:
            r = r + q - math.log1p(q)  # r(y + 1)


@numba.njit(nogil=True, cache=True)
def _mi_one(
    a: float,
    b: float,
    k: int,
    up: npt.NDArray[np.float64],
    down: npt.NDArray[np.float64],
    scale: float,
    inv_a: npt.NDArray[np.float64],
    inv_b: npt.NDArray[np.float64],
    inv_n: npt.NDArray[np.float64],
    ga: npt.NDArray[np.float64],
    gb: npt.NDArray[np.float64],
    gn: npt.NDArray[np.float64],
    p: npt.NDArray[np.float64],
) -> float:
    """I_K(a, b) for one prompt; inv_* (size k), g* and p (size k+1) are caller-owned scratch.

    `scale` = 2^(k//2): the ratio recurrence runs on P(s) * scale (its start, >= 2^-k * scale, stays a
    normal float for k <= 1024, and nothing exceeds 2^512) and is scaled back exactly at the end.
    """
    n = a + b
    start = scale
    a_first = a >= b
    for j in range(k):
        inv_n[j] = 1.0 / (n + j)
        inv_a[j] = 1.0 / (a + j)
        inv_b[j] = 1.0 / (b + j)
        if a_first:
            start *= (a + j) * inv_n[j]
        else:
            start *= (b + j) * inv_n[j]
    # Beta-binomial P(s) by ratios, from the end that cannot underflow.
    if a_first:
        p[k] = start
        for s in range(k, 0, -1):
            p[s - 1] = p[s] * down[s] * ((b + (k - s)) * inv_a[s - 1])
    else:
        p[0] = start
        for s in range(k):
            p[s + 1] = p[s] * up[s] * ((a + s) * inv_b[k - s - 1])
    _g_table(a, k, inv_a, ga)
    _g_table(b, k, inv_b, gb)
    _g_table(n, k, inv_n, gn)
    total = 0.0
    for s in range(k + 1):
        total += p[s] * (ga[s] + gb[k - s])
    mi: float = total / scale - gn[k]
    return mi


@numba.njit(nogil=True, cache=True)
def _wmi_weight_one(m: float, m_b: float, eta: float, mu: float) -> float:
    """w(m) with 1 - m passed in as b / n (exact where 1.0 - m would cancel)."""
    d = m - mu
    return m * m_b * math.exp(-eta * d * d)


@numba.njit(nogil=True, cache=True)
def _score_range(
    alpha: npt.NDArray[np.float64],
    beta: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    k: int,
    weighted: bool,
    eta: float,
    mu: float,
    up: npt.NDArray[np.float64],
    down: npt.NDArray[np.float64],
    scale: float,
    out: npt.NDArray[np.float64],
    lo: int,
    hi: int,
) -> None:
    inv_a = np.empty(k)
    inv_b = np.empty(k)
    inv_n = np.empty(k)
    ga = np.empty(k + 1)
    gb = np.empty(k + 1)
    gn = np.empty(k + 1)
    p = np.empty(k + 1)
    for i in range(lo, hi):
        q = i if use_all else ids[i]
        a = alpha[q]
        b = beta[q]
        v = _mi_one(a, b, k, up, down, scale, inv_a, inv_b, inv_n, ga, gb, gn, p)
        if weighted:
            v *= _wmi_weight_one(a / (a + b), b / (a + b), eta, mu)
        out[i] = v


@numba.njit(nogil=True, cache=True)
def _scores_serial(
    alpha: npt.NDArray[np.float64],
    beta: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    k: int,
    weighted: bool,
    eta: float,
    mu: float,
    up: npt.NDArray[np.float64],
    down: npt.NDArray[np.float64],
    scale: float,
    out: npt.NDArray[np.float64],
) -> None:
    _score_range(alpha, beta, ids, use_all, k, weighted, eta, mu, up, down, scale, out, 0, out.size)


@numba.njit(nogil=True, cache=True, parallel=True)
def _scores_parallel(
    alpha: npt.NDArray[np.float64],
    beta: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    k: int,
    weighted: bool,
    eta: float,
    mu: float,
    up: npt.NDArray[np.float64],
    down: npt.NDArray[np.float64],
    scale: float,
    out: npt.NDArray[np.float64],
) -> None:
    m = out.size
    n_chunks = (m + CHUNK - 1) // CHUNK
    for c in prange(n_chunks):
        lo = c * CHUNK
        hi = min(m, lo + CHUNK)
        _score_range(alpha, beta, ids, use_all, k, weighted, eta, mu, up, down, scale, out, lo, hi)


def _ratio_tables(k: int) -> tuple[np.ndarray, np.ndarray]:
    """up[s] = (k-s)/(s+1) for s < k; down[s] = s/(k-s+1) for s >= 1 (float64)."""
    up = np.zeros(k + 1)
    down = np.zeros(k + 1)
    for s in range(k):
        up[s] = (k - s) / (s + 1)
    for s in range(1, k + 1):
        down[s] = s / (k - s + 1)
    return up, down


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= K_MAX:
        raise ValueError(f"k (rollouts per prompt) must be an integer in [1, {K_MAX}], got {k!r}")
    return int(k)


def _beta_params(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    alpha = np.ascontiguousarray(alpha, dtype=np.float64)
    beta = np.ascontiguousarray(beta, dtype=np.float64)
    if alpha.ndim != 1 or alpha.shape != beta.shape:
        raise ValueError(
            f"alpha and beta must be 1-d arrays of one length, got {alpha.shape} and {beta.shape}"
        )
    return alpha, beta


def _check_ids(ids: np.ndarray | None, n: int) -> np.ndarray:
    """int64 ids, contiguous, each in [0, n); None -> empty (the kernels then score all prompts)."""
    if ids is None:
        return np.empty(0, dtype=np.int64)
    ids = np.ascontiguousarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be a 1-d integer array, got dtype {ids.dtype} and shape {ids.shape}")
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise ValueError(f"ids must lie in [0, {n}); got values in [{int(ids.min())}, {int(ids.max())}]")
    return ids


def _run_scores(
    alpha: npt.NDArray[np.float64],
    beta: npt.NDArray[np.float64],
    ids: np.ndarray | None,
    k: int,
    weighted: bool,
    eta: float,
    mu: float,
    out: np.ndarray | None = None,
) -> np.ndarray:
    use_all = ids is None
    ids = _check_ids(ids, alpha.size)
    m = alpha.size if use_all else ids.size
    if m:
        sub_a, sub_b = (alpha, beta) if use_all else (alpha[ids], beta[ids])
        with np.errstate(over="ignore"):
            bad = ~((sub_a > 0) & (sub_b > 0) & np.isfinite(sub_a + sub_b))
        if bad.any():
            raise ValueError(
                "alpha and beta must be > 0 with a finite sum alpha + beta for every scored prompt"
            )
    up, down = _ratio_tables(k)
    if out is None:
        out = np.empty(m, dtype=np.float64)
    elif out.shape != (m,) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous float64 array of shape ({m},)")
    scale = 2.0 ** (k // 2)
    args = (alpha, beta, ids, use_all, k, weighted, float(eta), float(mu), up, down, scale, out)
    launch(_scores_serial, _scores_parallel, m, *args, threshold=PARALLEL_MIN)
    return out


def mutual_information(alpha: np.ndarray, beta: np.ndarray, k: int) -> np.ndarray:
    """I_K(alpha[i], beta[i]) in nats for every i (float64[m]); see the module docstring."""
    alpha, beta = _beta_params(alpha, beta)
    return _run_scores(alpha, beta, None, _check_k(k), False, 0.0, 0.0)


def wmi_weight(mean: np.ndarray | float, eta: float, mu: float) -> np.ndarray | float:
    """w(m) = m (1 - m) exp(-eta (m - mu)^2) (docs/methods.md §1.1); numpy, elementwise."""
    m = np.asarray(mean, dtype=np.float64)
    w: npt.NDArray[np.float64] = m * (1.0 - m) * np.exp(-eta * (m - mu) ** 2)
    return float(w) if w.ndim == 0 else w


def wmi_scores(
    alpha: np.ndarray,
    beta: np.ndarray,
    ids: np.ndarray | None,
    k: int,
    eta: float,
    mu: float,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """A = w(m) * I_K for the prompts `ids` (None: every prompt), float64 in the order of `ids`; written
    into `out` if given (e.g. a dataset's whole-set score buffer)."""
    alpha, beta = _beta_params(alpha, beta)
    if not (math.isfinite(eta) and eta >= 0):
        raise ValueError(f"eta must be finite and >= 0, got {eta!r}")
    if not (math.isfinite(mu) and 0 <= mu <= 1):
        raise ValueError(f"mu must lie in [0, 1], got {mu!r}")
    return _run_scores(alpha, beta, ids, _check_k(k), True, eta, mu, out)
