"""Per-prompt scores of the Beta baselines, MoPPS and DPS (docs/methods.md §1.2, 1.3, 2). Larger is better.

    expected_difficulty   -(m - target)^2,          m = alpha / (alpha + beta)           (docs/methods.md §1.3)
    inverse_evidence      1 / n,                     n = alpha + beta                     (docs/methods.md §1.3)
    thompson (MoPPS)      -(g - target)^2,           g ~ Beta(alpha, beta), one draw each (docs/methods.md §1.2)
    dps                   prior(2) + w_H * H(prior), H(p) = -sum_i p_i ln p_i (nats)      (docs/methods.md §2)

INSIGHT's score lives in mi.py. `ids` selects prompts (int64, any order, repeats allowed) and the result
follows its order; `ids=None` scores every prompt. Thompson draws come from the project's generator
(rng.Stream.beta): prompt p's draw is a function of (stream, p, alpha[p], beta[p]) alone, the same in
every process and numpy version, and the same whichever other prompts are drawn with it.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
from numba import prange

from ._parallel import CHUNK, PARALLEL_MIN, launch
from .mi import _beta_params, _check_ids
from .rng import Stream

__all__ = [
    "dps_score3",
    "dps_score_of_row",
    "dps_scores",
    "expected_difficulty_scores",
    "inverse_evidence_scores",
    "thompson_scores",
]


def _check_target(target: float) -> float:
    if not (math.isfinite(target) and 0.0 <= target <= 1.0):
        raise ValueError(f"target must lie in [0, 1], got {target!r}")
    return float(target)


def _gather(alpha: np.ndarray, beta: np.ndarray, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    alpha, beta = _beta_params(alpha, beta)
    if ids is None:
        return alpha, beta
    ids = _check_ids(ids, alpha.size)
    return alpha[ids], beta[ids]


@numba.njit(nogil=True, cache=True)
def _beta_score_kernel(
    alpha: npt.NDArray[np.float64],
    beta: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    kind: int,
    target: float,
    out: npt.NDArray[np.float64],
) -> None:
    """kind 0: -(a / (a + b) - target)^2; kind 1: 1 / (a + b); into out (the order of ids)."""
    for i in range(out.size):
        q = i if use_all else ids[i]
        a = alpha[q]
        b = beta[q]
        if kind == 0:
            d = a / (a + b) - target
            out[i] = -(d * d)
        else:
            out[i] = 1.0 / (a + b)


def _beta_scores(
    alpha: np.ndarray,
    beta: np.ndarray,
    ids: np.ndarray | None,
    kind: int,
    target: float,
    out: np.ndarray | None,
) -> np.ndarray:
    alpha, beta = _beta_params(alpha, beta)
    use_all = ids is None
    ids = _check_ids(ids, alpha.size)
    m = alpha.size if use_all else ids.size
    if out is None:
        out = np.empty(m, dtype=np.float64)
    elif out.shape != (m,) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous float64 array of shape ({m},)")
    _beta_score_kernel(alpha, beta, ids, use_all, kind, target, out)
    return out


def expected_difficulty_scores(
    alpha: np.ndarray,
    beta: np.ndarray,
    ids: np.ndarray | None,
    target: float = 0.5,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """-(m - target)^2 with m the Beta mean (float64, in the order of `ids`; written into `out` if
    given, e.g. a dataset's whole-set score buffer)."""
    return _beta_scores(alpha, beta, ids, 0, _check_target(target), out)


def inverse_evidence_scores(
    alpha: np.ndarray, beta: np.ndarray, ids: np.ndarray | None, out: np.ndarray | None = None
) -> np.ndarray:
    """1 / (alpha + beta): prompts with the least evidence first (float64, in the order of `ids`;
    written into `out` if given)."""
    return _beta_scores(alpha, beta, ids, 1, 0.0, out)


def thompson_scores(
    alpha: np.ndarray,
    beta: np.ndarray,
    ids: np.ndarray | None,
    target: float,
    rng: Stream,
    items: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """MoPPS: one draw g ~ Beta(alpha, beta) per prompt (in the order of `ids`, keyed by prompt id) and
    its score -(g - target)^2. Returns (scores, draws), both float64. `items` (with ids=None) names the
    prompt id of each entry of alpha / beta when they were gathered already (cold priors)."""
    target = _check_target(target)
    a, b = _gather(alpha, beta, ids)
    if items is not None:
        items = np.asarray(items, dtype=np.int64)
        if ids is not None or items.shape != a.shape:
            raise ValueError("items names the prompts of gathered alpha / beta: pass it with ids=None")
    elif ids is None:
        items = np.arange(a.size, dtype=np.int64)
    else:
        items = np.asarray(ids, dtype=np.int64)
    draws = rng.beta(a, b, items)
    d = draws - target
    return -(d * d), draws


@numba.njit(nogil=True, cache=True, inline="always")
def dps_score3(
    r0: float | np.floating[Any], r1: float | np.floating[Any], r2: float | np.floating[Any], weight: float
) -> float:
    """r1 + weight * H(r0, r1, r2) in float64, from one prompt's float32 prior (the one definition of
    the DPS score)."""
    s = np.float64(r1)
    if weight != 0.0:
        h = 0.0
        v = np.float64(r0)
        if v > 0.0:
            h -= v * math.log(v)
        v = np.float64(r1)
        if v > 0.0:
            h -= v * math.log(v)
        v = np.float64(r2)
        if v > 0.0:
            h -= v * math.log(v)
        s += weight * h
    return s


@numba.njit(nogil=True, cache=True, inline="always")
def dps_score_of_row(prior: npt.NDArray[np.float32], q: int | np.integer[Any], weight: float) -> float:
    """The DPS score of row q of a prior array f32[M, 3]."""
    return dps_score3(prior[q, 0], prior[q, 1], prior[q, 2], weight)


@numba.njit(nogil=True, cache=True)
def _dps_range(
    prior: npt.NDArray[np.float32],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    weight: float,
    out: npt.NDArray[np.float64],
    lo: int,
    hi: int,
) -> None:
    for i in range(lo, hi):
        out[i] = dps_score_of_row(prior, i if use_all else ids[i], weight)


@numba.njit(nogil=True, cache=True)
def _dps_serial(
    prior: npt.NDArray[np.float32],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    weight: float,
    out: npt.NDArray[np.float64],
) -> None:
    _dps_range(prior, ids, use_all, weight, out, 0, out.size)


@numba.njit(nogil=True, cache=True, parallel=True)
def _dps_parallel(
    prior: npt.NDArray[np.float32],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    weight: float,
    out: npt.NDArray[np.float64],
) -> None:
    m = out.size
    for c in prange((m + CHUNK - 1) // CHUNK):
        lo = c * CHUNK
        _dps_range(prior, ids, use_all, weight, out, lo, min(m, lo + CHUNK))


def dps_scores(hmm_prior: np.ndarray, ids: np.ndarray | None, entropy_weight: float = 0.0) -> np.ndarray:
    """prior(2) + entropy_weight * H(prior) in nats for `ids` (None: every prompt), float64."""
    if not math.isfinite(entropy_weight):
        raise ValueError(f"entropy_weight must be finite, got {entropy_weight!r}")
    prior = np.asarray(hmm_prior, dtype=np.float32)  # any strides (the observed set is column-major)
    if prior.ndim != 2 or prior.shape[1] != 3:
        raise ValueError(f"hmm_prior must have shape (N, 3), got {prior.shape}")
    use_all = ids is None
    ids = _check_ids(ids, prior.shape[0])
    out = np.empty(prior.shape[0] if use_all else ids.size, dtype=np.float64)
    args = (prior, ids, use_all, float(entropy_weight), out)
    launch(_dps_serial, _dps_parallel, out.size, *args, threshold=PARALLEL_MIN)
    return out
