"""From rollout rewards to outcomes: successes S, trials and the DPS solving state (docs/methods.md §0 and 2).

State codes (docs/methods.md §2): UNOBSERVED = 0 (no result at the open step), UNSOLVED = 1 (S = 0),
PARTIAL = 2 (0 < S < trials), SOLVED = 3 (S = trials).

Reward modes (docs/methods.md §0):

- ``"binary"``: a rollout succeeds when reward >= threshold; S = number of successes, trials = K.
- ``"fractional"`` (ours, beyond both papers): rewards are clipped to [0, 1] and summed as fractional
  successes, S = sum(clip(r, 0, 1)); the state comes from the spread of the clipped rewards: all equal
  -> SOLVED if the common value >= 0.5 else UNSOLVED; any spread -> PARTIAL.

A result given as counts (S, trials) has state UNSOLVED when S == 0, SOLVED when S == trials, PARTIAL
otherwise, in both modes.

Several results of one prompt within one step pool into one state with `combine_state` (ours, written
so it equals what pooling S / trials gives in binary mode): UNOBSERVED + x -> x; x + x -> x; any two
different observed states -> PARTIAL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

__all__ = [
    "PARTIAL",
    "REWARD_MODES",
    "SOLVED",
    "UNOBSERVED",
    "UNSOLVED",
    "combine_state",
    "outcomes_from_counts",
    "outcomes_from_flat",
    "outcomes_from_rewards",
]

UNOBSERVED = 0
UNSOLVED = 1
PARTIAL = 2
SOLVED = 3

#: Accepted reward modes.
REWARD_MODES = ("binary", "fractional")


@numba.njit(nogil=True, cache=True)
def combine_state(old: int | np.integer[Any], new: int | np.integer[Any]) -> int | np.integer[Any]:
    """Pooled state of two results of one prompt at one step (0 = nothing observed yet)."""
    if old == UNOBSERVED:
        return new
    if old == new:
        return old
    return PARTIAL


@numba.njit(nogil=True, cache=True)
def _flat_kernel(
    values: npt.NDArray[np.float64],
    offsets: npt.NDArray[np.int64],
    fractional: bool,
    threshold: float,
    successes: npt.NDArray[np.float64],
    trials: npt.NDArray[np.float64],
    states: npt.NDArray[np.int8],
) -> None:
    for i in range(offsets.size - 1):
        lo = offsets[i]
        hi = offsets[i + 1]
        total = 0.0
        if fractional:
            first = min(max(values[lo], 0.0), 1.0)
            spread = False
            for j in range(lo, hi):
                r = min(max(values[j], 0.0), 1.0)
                total += r
                if r != first:
                    spread = True
            if spread:
                states[i] = PARTIAL
            elif first >= 0.5:
                states[i] = SOLVED
            else:
                states[i] = UNSOLVED
        else:
            for j in range(lo, hi):
                if values[j] >= threshold:
                    total += 1.0
            if total == 0.0:
                states[i] = UNSOLVED
            elif total == hi - lo:
                states[i] = SOLVED
            else:
                states[i] = PARTIAL
        successes[i] = total
        trials[i] = hi - lo


def _check_mode(mode: str, threshold: float) -> None:
    if mode not in REWARD_MODES:
        raise ValueError(f"reward mode must be one of {REWARD_MODES}, got {mode!r}")
    if not np.isfinite(threshold):
        raise ValueError(f"success threshold must be finite, got {threshold!r}")


def outcomes_from_flat(
    values: np.ndarray, offsets: np.ndarray, mode: str = "binary", threshold: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Outcomes of m results whose rewards are `values[offsets[i]:offsets[i+1]]`.

    `values` is float64 (all rewards concatenated), `offsets` int64[m+1] with offsets[0] == 0,
    offsets[-1] == len(values) and every result non-empty. Returns (successes f64[m], trials f64[m],
    states i8[m]).
    """
    _check_mode(mode, threshold)
    values = np.ascontiguousarray(values, dtype=np.float64)
    offsets = np.ascontiguousarray(offsets)
    if values.ndim != 1 or offsets.ndim != 1 or not np.issubdtype(offsets.dtype, np.integer):
        raise ValueError("values must be a 1-d float array and offsets a 1-d integer array")
    offsets = offsets.astype(np.int64, copy=False)
    if offsets.size < 1 or offsets[0] != 0 or offsets[-1] != values.size:
        raise ValueError(f"offsets must start at 0 and end at len(values) = {values.size}")
    if np.any(np.diff(offsets) <= 0):
        raise ValueError("every result needs at least one reward (offsets must be strictly increasing)")
    if not np.all(np.isfinite(values)):
        raise ValueError("rewards must be finite numbers (no NaN or inf)")
    m = offsets.size - 1
    successes = np.empty(m, dtype=np.float64)
    trials = np.empty(m, dtype=np.float64)
    states = np.empty(m, dtype=np.int8)
    _flat_kernel(values, offsets, mode == "fractional", float(threshold), successes, trials, states)
    return successes, trials, states


def outcomes_from_rewards(
    rewards: np.ndarray | Sequence[Sequence[float] | np.ndarray], mode: str = "binary", threshold: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Outcomes of a 2-d reward array (one row per result) or a list of variable-length reward lists."""
    if isinstance(rewards, np.ndarray) and rewards.ndim == 2:
        m, k = rewards.shape
        return outcomes_from_flat(rewards.ravel(), np.arange(m + 1, dtype=np.int64) * k, mode, threshold)
    rows = [np.asarray(r, dtype=np.float64).ravel() for r in rewards]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([r.size for r in rows], out=offsets[1:])
    values = np.concatenate(rows) if rows else np.empty(0, dtype=np.float64)
    return outcomes_from_flat(values, offsets, mode, threshold)


def outcomes_from_counts(successes: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """States i8[m] of results given as counts: S == 0 -> UNSOLVED, S == trials -> SOLVED, else PARTIAL."""
    s = np.asarray(successes, dtype=np.float64)
    t = np.asarray(trials, dtype=np.float64)
    if s.shape != t.shape:
        raise ValueError(f"successes and trials must have one shape, got {s.shape} and {t.shape}")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
        raise ValueError("successes and trials must be finite")
    if np.any(t <= 0) or np.any(s < 0) or np.any(s > t):
        raise ValueError("each result needs trials > 0 and 0 <= successes <= trials")
    states = np.full(s.shape, PARTIAL, dtype=np.int8)
    states[s == 0] = UNSOLVED
    states[s == t] = SOLVED
    return states
