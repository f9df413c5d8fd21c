"""INSIGHT's weighted mutual information (METHODS 1.1): I_K, the weight w(m) and the score A = w * I_K.

For Beta(a, b), n = a + b, m = a / n and K rollouts (METHODS 1.1):

    H(a, b)  = ln B(a, b) - (a-1) psi(a) - (b-1) psi(b) + (n-2) psi(n)           (Beta entropy, nats)
    P(s)     = C(K, s) B(a+s, b+K-s) / B(a, b),  s = 0..K                         (beta-binomial)
    I_K      = H(a, b) - sum_s P(s) H(a+s, b+K-s)
    w(m)     = m (1 - m) exp(-eta (m - mu)^2),   A = w(m) * I_K

How the kernel evaluates I_K (ours; algebraically identical, no special function inside the sum):

    lnB(a,b) - E[lnB(a+s, b+K-s)]  = E[ln C(K,s)] - E[ln P(s)]                    (definition of P)
    psi(a+s) = psi(a) + Da(s),  Da(s) = sum_{j<s} 1/(a+j);  likewise Db, Dn
    I_K = E[ln C] - E[ln P] + E[(a-1+s) Da(s) + (b-1+K-s) Db(K-s)] - (n-2) Dn(K)
          + K [m psi(a) + (1-m) psi(b) - psi(n+K)]

and, with r(x) = psi(x) - ln x (special.psi_minus_log), the last bracket is rebuilt as

    m r(a) + (1-m) r(b) - r(n+K) + m ln m + (1-m) ln(1-m) - log1p(K/n),   1 - m computed as b / n

so two ~ln(n) terms never cancel; r(a) for a < 10 reuses Da(K) (psi's recurrence) instead of new
divisions. P(s) comes from the ratio P(s+1)/P(s) = (K-s)/(s+1) (a+s)/(b+K-s-1), started at the end
that cannot underflow: P(K) = prod_j (a+j)/(n+j) when a >= b, else P(0) = prod_j (b+j)/(n+j) (each
factor >= 1/2, so the start is >= 2^-K; the recurrence runs on P * 2^(K//2), an exact power-of-two
scaling, so K up to 1024 neither underflows nor overflows). The reciprocals 1/(a+j), 1/(b+j) serve
both the ratios and the D sums: 3K divisions and K+1 logarithms per prompt, plus a few for r.
`(b + (K-s))` is always grouped so, never `(b + K) - s`, which rounds a tiny b away.

Accuracy (tests/test_core_mi.py, against 40-digit mpmath): the O(1)-sized terms above cancel to
I_K ~ K / (2n) for large n, so the absolute error is ~1e-15 K and the relative error grows like
n * 1e-16 (~1e-9 at n = 2e6); for tiny a or b the 1/a terms cancel (absolute error ~1e-16 K / min(a, b)).
Tested for a, b in [1e-3, 1e6] and K in [1, 64] (and K = 1024 at two points); K_MAX = 1024.

Large-n limit (checked in tests): I_K -> 0.5 ln(1 + K/n).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from ._parallel import CHUNK, PARALLEL_LOCK, PARALLEL_MIN
from .special import log_binomial_table, psi_minus_log, psi_minus_log_shifted

__all__ = ["K_MAX", "mutual_information", "wmi_scores", "wmi_weight"]

#: Largest rollout count K accepted by the kernels (the scaled P(s) start value stays a normal float).
K_MAX = 1024


@numba.njit(nogil=True, cache=True)
def _mi_one(a, b, k, lnc, up, down, scale, inv_a, inv_b, db, p):
    """I_K(a, b) for one prompt; `inv_a`, `inv_b` (size k), `db`, `p` (size k+1) are caller-owned scratch.

    `scale` = 2^(k//2): the ratio recurrence runs on P(s) * scale (its start, >= 2^-k * scale, stays a
    normal float for k <= 1024, and nothing exceeds 2^512) and is scaled back exactly before use.
    """
    n = a + b
    dn = 0.0
    start = scale
    db[0] = 0.0
    a_first = a >= b
    for j in range(k):
        inv_n = 1.0 / (n + j)
        inv_a[j] = 1.0 / (a + j)
        inv_b[j] = 1.0 / (b + j)
        db[j + 1] = db[j] + inv_b[j]
        dn += inv_n
        if a_first:
            start *= (a + j) * inv_n
        else:
            start *= (b + j) * inv_n
    # Beta-binomial P(s) by ratios, from the end that cannot underflow.
    if a_first:
        p[k] = start
        for s in range(k, 0, -1):
            p[s - 1] = p[s] * down[s] * (b + (k - s)) * inv_a[s - 1]
    else:
        p[0] = start
        for s in range(k):
            p[s + 1] = p[s] * up[s] * (a + s) * inv_b[k - s - 1]
    unscale = 1.0 / scale
    entropy = 0.0
    evidence = 0.0
    da = 0.0
    for s in range(k + 1):
        ps = p[s] * unscale
        if ps > 0.0:
            entropy += ps * (lnc[s] - math.log(ps))
            evidence += ps * ((a - 1.0 + s) * da + (b - 1.0 + (k - s)) * db[k - s])
        if s < k:
            da += inv_a[s]
    m = a / n
    m_b = b / n  # 1 - m, without the cancellation of 1.0 - m when b << a
    digammas = (
        m * psi_minus_log_shifted(a, k, da)  # da = Da(K) after the loop above
        + m_b * psi_minus_log_shifted(b, k, db[k])
        - psi_minus_log(n + k)
        + m * math.log(m)
        + m_b * math.log(m_b)
        - math.log1p(k / n)
    )
    return entropy + evidence - (n - 2.0) * dn + k * digammas


@numba.njit(nogil=True, cache=True)
def _wmi_weight_one(m, m_b, eta, mu):
    """w(m) with 1 - m passed in as b / n (exact where 1.0 - m would cancel)."""
    d = m - mu
    return m * m_b * math.exp(-eta * d * d)


@numba.njit(nogil=True, cache=True)
def _score_range(alpha, beta, ids, use_all, k, weighted, eta, mu, lnc, up, down, scale, out, lo, hi):
    inv_a = np.empty(k)
    inv_b = np.empty(k)
    db = np.empty(k + 1)
    p = np.empty(k + 1)
    for i in range(lo, hi):
        q = i if use_all else ids[i]
        a = alpha[q]
        b = beta[q]
        v = _mi_one(a, b, k, lnc, up, down, scale, inv_a, inv_b, db, p)
        if weighted:
            v *= _wmi_weight_one(a / (a + b), b / (a + b), eta, mu)
        out[i] = v


@numba.njit(nogil=True, cache=True)
def _scores_serial(alpha, beta, ids, use_all, k, weighted, eta, mu, lnc, up, down, scale, out):
    _score_range(alpha, beta, ids, use_all, k, weighted, eta, mu, lnc, up, down, scale, out, 0, out.size)


@numba.njit(nogil=True, cache=True, parallel=True)
def _scores_parallel(alpha, beta, ids, use_all, k, weighted, eta, mu, lnc, up, down, scale, out):
    m = out.size
    n_chunks = (m + CHUNK - 1) // CHUNK
    for c in prange(n_chunks):
        lo = c * CHUNK
        hi = min(m, lo + CHUNK)
        _score_range(alpha, beta, ids, use_all, k, weighted, eta, mu, lnc, up, down, scale, out, lo, hi)


def _ratio_tables(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ln C(k, s); up[s] = (k-s)/(s+1) for s < k; down[s] = s/(k-s+1) for s >= 1 (float64)."""
    up = np.zeros(k + 1)
    down = np.zeros(k + 1)
    for s in range(k):
        up[s] = (k - s) / (s + 1)
    for s in range(1, k + 1):
        down[s] = s / (k - s + 1)
    return log_binomial_table(k), up, down


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


def _run_scores(alpha, beta, ids, k, weighted, eta, mu) -> np.ndarray:
    use_all = ids is None
    ids = _check_ids(ids, alpha.size)
    m = alpha.size if use_all else ids.size
    if m and use_all:
        bad = ~((alpha > 0) & (beta > 0) & np.isfinite(alpha) & np.isfinite(beta))
    elif m:
        sub_a, sub_b = alpha[ids], beta[ids]
        bad = ~((sub_a > 0) & (sub_b > 0) & np.isfinite(sub_a) & np.isfinite(sub_b))
    if m and bad.any():
        raise ValueError("alpha and beta must be finite and > 0 for every scored prompt")
    lnc, up, down = _ratio_tables(k)
    out = np.empty(m, dtype=np.float64)
    scale = 2.0 ** (k // 2)
    args = (alpha, beta, ids, use_all, k, weighted, float(eta), float(mu), lnc, up, down, scale, out)
    if m < PARALLEL_MIN:
        _scores_serial(*args)
    else:
        with PARALLEL_LOCK:
            _scores_parallel(*args)
    return out


def mutual_information(alpha: np.ndarray, beta: np.ndarray, k: int) -> np.ndarray:
    """I_K(alpha[i], beta[i]) in nats for every i (float64[m]); see the module docstring."""
    alpha, beta = _beta_params(alpha, beta)
    return _run_scores(alpha, beta, None, _check_k(k), False, 0.0, 0.0)


def wmi_weight(mean: np.ndarray | float, eta: float, mu: float) -> np.ndarray | float:
    """w(m) = m (1 - m) exp(-eta (m - mu)^2) (METHODS 1.1); numpy, elementwise."""
    m = np.asarray(mean, dtype=np.float64)
    w = m * (1.0 - m) * np.exp(-eta * (m - mu) ** 2)
    return float(w) if w.ndim == 0 else w


def wmi_scores(
    alpha: np.ndarray, beta: np.ndarray, ids: np.ndarray | None, k: int, eta: float, mu: float
) -> np.ndarray:
    """A = w(m) * I_K for the prompts `ids` (None: every prompt), float64 in the order of `ids`."""
    alpha, beta = _beta_params(alpha, beta)
    if not (math.isfinite(eta) and eta >= 0):
        raise ValueError(f"eta must be finite and >= 0, got {eta!r}")
    if not (math.isfinite(mu) and 0 <= mu <= 1):
        raise ValueError(f"mu must lie in [0, 1], got {mu!r}")
    return _run_scores(alpha, beta, ids, _check_k(k), True, eta, mu)
