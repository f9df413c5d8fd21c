"""Strategies from the field (docs/methods.md §7): learnability, GRESO, SEC, AdaRFT.

    learnability   E[phi (1 - phi)] = a b / ((a + b)(a + b + 1)) under the prompt's Beta (cold prior
                   included); a candidate pool as INSIGHT
    adarft         d_i = 100 (1 - p_i), p_i the prompt's pass rate, else its group's rate, else its
                   posterior mean (coldstart.live_pass_rates); the B prompts with the smallest
                   |d_i - T| over the whole dataset, ties at random
    greso, sec     walks (walks module)

The step close of the dataset's shared state these strategies adapt lives in step_close.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .coldstart import live_pass_rates
from .mi import _beta_params, _check_ids

if TYPE_CHECKING:
    from .beliefs import BeliefArrays

__all__ = [
    "GRESO_EASY_TARGET",
    "GRESO_HARD_TARGET",
    "adarft_scores",
    "learnability_scores",
]

#: GRESO's targets for the shares of all-solved and all-failed groups (total 0.25, split 1:2).
GRESO_EASY_TARGET = 0.25 / 3.0
GRESO_HARD_TARGET = 0.25 * 2.0 / 3.0
GRESO_STEP = 0.01
GRESO_P_MIN, GRESO_P_MAX = 0.05, 0.95


def learnability_scores(
    alpha: np.ndarray, beta: np.ndarray, ids: np.ndarray | None, out: np.ndarray | None = None
) -> np.ndarray:
    """E[phi (1 - phi)] under Beta(alpha, beta): a b / ((a + b)(a + b + 1)) (float64, order of `ids`;
    written into `out` when given)."""
    alpha, beta = _beta_params(alpha, beta)
    if ids is not None:
        ids = _check_ids(ids, alpha.size)
        alpha, beta = alpha[ids], beta[ids]
    n = alpha + beta
    # As a product of two ratios <= 1: alpha * beta and n * (n + 1) overflow at reachable n ~ 1e300.
    scores: np.ndarray = (alpha / n) * (beta / (n + 1.0))
    if out is None:
        return scores
    out[:] = scores
    return out


def adarft_scores(ba: BeliefArrays, ids: np.ndarray | None) -> np.ndarray:
    """-|d_i - T| with d_i = 100 (1 - p_i) (module docstring), larger is better (float64)."""
    return live_pass_rates(ba, ids, target=ba.shared.adarft_t)
