"""Special functions for numba kernels: digamma and its smooth part psi(x) - ln(x).

`digamma(x)` for x > 0: the recurrence psi(x) = psi(x + 1) - 1/x lifts x to >= 10, where the asymptotic
series

    psi(x) = ln x - 1/(2x) - sum_{k>=1} B_2k / (2k x^2k)
           = ln x - 1/(2x) - 1/(12x^2) + 1/(120x^4) - 1/(252x^6) + 1/(240x^8) - 1/(132x^10)
             + 691/(32760x^12) - 1/(12x^14) + ...

truncated after the x^-14 term has a remainder below 3617/(8160 x^16) < 5e-17 at x >= 10 (ours: the
threshold 10 trades a few divisions for full double accuracy; at 6 the remainder would be ~1e-13).

`psi_minus_log(x)` = psi(x) - ln(x) is what the mutual-information kernel needs: for large x it is
-1/(2x) + O(x^-2), computed without forming ln x, so sums like m psi(a) + (1-m) psi(b) - psi(n+K) can be
rebuilt from logarithms of ratios without cancelling two ~ln(1e6) terms (ours). For x < 10 it uses
psi(x) - ln x = [psi(x+j) - ln(x+j)] + ln((x+j)/x) - sum_{i<j} 1/(x+i): one logarithm either way.

Accuracy (tests/core/test_special.py, against scipy.special.digamma): ~1e-15 relative away from the
positive root of psi (x0 ~ 1.4616, where only the absolute error ~1e-16 is meaningful).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import numpy.typing as npt

__all__ = [
    "SERIES_FROM",
    "asymptotic_tail_inv",
    "digamma",
    "digamma_array",
    "log_binomial_table",
    "psi_minus_log",
]

#: psi(x) - ln x comes from the asymptotic series for x >= SERIES_FROM, from the recurrence below it.
SERIES_FROM = 10.0
_SERIES_FROM = SERIES_FROM


@numba.njit(nogil=True, cache=True)
def asymptotic_tail_inv(r: float) -> float:
    """psi(x) - ln(x) for x >= 10 from the asymptotic series, given r = 1/x (Horner in 1/x^2)."""
    r2 = r * r
    poly = r2 * (
        1.0 / 12.0
        - r2
        * (
            1.0 / 120.0
            - r2
            * (1.0 / 252.0 - r2 * (1.0 / 240.0 - r2 * (1.0 / 132.0 - r2 * (691.0 / 32760.0 - r2 / 12.0))))
        )
    )
    return -0.5 * r - poly


@numba.njit(nogil=True, cache=True)
def _asymptotic_tail(x: float) -> float:
    """psi(x) - ln(x) for x >= 10 from the asymptotic series."""
    return asymptotic_tail_inv(1.0 / x)


@numba.njit(nogil=True, cache=True)
def psi_minus_log(x: float) -> float:
    """psi(x) - ln(x) for x > 0 (float64)."""
    if x >= _SERIES_FROM:
        return _asymptotic_tail(x)
    shift = 0.0
    y = x
    while y < _SERIES_FROM:
        shift += 1.0 / y
        y += 1.0
    return _asymptotic_tail(y) + math.log(y / x) - shift


@numba.njit(nogil=True, cache=True)
def digamma(x: float) -> float:
    """psi(x) = d/dx ln Gamma(x) for x > 0 (float64); nan for x <= 0 or nan."""
    if not x > 0.0:
        return np.nan
    if x >= _SERIES_FROM:
        return math.log(x) + _asymptotic_tail(x)
    shift = 0.0
    y = x
    while y < _SERIES_FROM:
        shift += 1.0 / y
        y += 1.0
    return math.log(y) + _asymptotic_tail(y) - shift


@numba.njit(nogil=True, cache=True)
def _digamma_loop(x: npt.NDArray[np.float64], out: npt.NDArray[np.float64]) -> None:
    for i in range(x.size):
        out[i] = digamma(x[i])


def digamma_array(x: np.ndarray) -> np.ndarray:
    """Elementwise `digamma` over a float64 array (a thin wrapper, mainly for tests and benchmarks)."""
    x = np.ascontiguousarray(x, dtype=np.float64).ravel()
    out = np.empty_like(x)
    _digamma_loop(x, out)
    return out


def log_binomial_table(k: int) -> np.ndarray:
    """ln C(k, s) for s = 0..k as float64 (exact to rounding: C(k, s) < 2^63 for k <= 64)."""
    return np.array([math.log(math.comb(k, s)) for s in range(k + 1)], dtype=np.float64)
